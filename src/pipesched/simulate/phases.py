"""Ops made of phases: sequences of compute and communication that one device runs, so that
the time of an overlapped pair is computed from its parts' phases rather than a constant
factor (a mixture-of-experts forward is attention, the dispatch all-to-all, the experts and
the combine all-to-all; in DualPipe's F&B one microbatch's all-to-all runs while the other
computes).

A device has one compute stream and one link. Each part runs its phases in order, a phase
on its resource (``COMPUTE`` or ``LINK``) for its seconds; a resource runs one phase at a
time. ``overlapped`` (``pipesched.model.phases``, the one phase model) runs the parts of a
pair at once, greedily and deterministically: a free resource starts the next phase of the
part ready longest, ties to the part given first. A lone part takes the sum of its phases;
the pair takes no less than the busier resource's work and the longest part, and no more
than the sum of everything.

``phase_durations`` gives a compiled graph's op durations from phases: each op row whose
op has phases takes their sum, each fused entry the overlapped time of its parts (a part
without phases is one compute phase of its compiled time), the later parts none; run the
graph with them (``run(graph, op_durations=...)``).

>>> overlapped([Phase(COMPUTE, 2.0), Phase(LINK, 1.0)], [Phase(COMPUTE, 1.0)]).makespan
3.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pipesched.model.phases import COMPUTE, LINK, Phase, PhaseRun, Resource, overlapped, serial_time
from pipesched.ops import Op
from pipesched.simulate.graph import TaskGraph

# the phase model is ``pipesched.model.phases``' (one definition); these names are its
__all__ = ["COMPUTE", "LINK", "Phase", "PhaseRun", "Resource", "overlapped", "phase_durations", "serial_time"]


def phase_durations(graph: TaskGraph, phases_of: Callable[[Op], Sequence[Phase] | None]) -> np.ndarray:
    """Op durations of ``graph`` from the phases ``phases_of`` gives each plain op (None or
    empty: keep its compiled duration); see the module docstring."""
    duration = graph.op_duration.copy()
    row = 0
    for device_ops in graph.schedule.device_ops:
        for entry in device_ops:
            atoms = entry.atoms
            parts = [phases_of(op) or () for op in atoms]
            if entry.parts:
                own = [tuple(phases) or (Phase(COMPUTE, _part_time(graph, row + k)),) for k, phases in enumerate(parts)]
                duration[row] = overlapped(*own).makespan
                duration[row + 1:row + len(atoms)] = 0.0
            elif parts[0]:
                duration[row] = serial_time(parts[0])
            row += len(atoms)
    return duration


def _part_time(graph: TaskGraph, row: int) -> float:
    """A fused entry's part's own time: its kind's cost on its stage for the stage's role."""
    rules, stage = graph.schedule.rules, int(graph.ops.stage[row])
    name = rules.cost_for(rules.kinds[int(graph.ops.kind[row])].kind, graph.schedule.roles[stage])
    return float(graph.costs.times(name)[stage])
