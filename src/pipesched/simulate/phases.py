"""Ops made of phases: sequences of compute and communication that one device runs, so that
the time of an overlapped pair is computed from its parts' phases rather than a constant
factor (a mixture-of-experts forward is attention, the dispatch all-to-all, the experts and
the combine all-to-all; in DualPipe's F&B one microbatch's all-to-all runs while the other
computes).

A device has one compute stream and one link. Each part runs its phases in order, a phase
on its resource (``COMPUTE`` or ``LINK``) for its seconds; a resource runs one phase at a
time. ``overlapped`` runs the parts of a pair at once, greedily and deterministically: the
next phase to start is the one that can start earliest (ready when its part's previous
phase has ended and its resource is free), ties to the part given first. A lone part takes
the sum of its phases; the pair takes no less than the busier resource's work and the
longest part, and no more than the sum of everything.

``phase_durations`` gives a compiled graph's op durations from phases: each op row whose
op has phases takes their sum, each fused entry the overlapped time of its parts (a part
without phases is one compute phase of its compiled time), the later parts none; run the
graph with them (``run(graph, op_durations=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from pipesched.errors import require
from pipesched.ops import Op
from pipesched.simulate.graph import TaskGraph


class Resource(StrEnum):
    """What a phase occupies on its device."""

    COMPUTE = "compute"  # the compute stream (attention, experts)
    LINK = "link"  # the device's network link (a dispatch or combine all-to-all)


COMPUTE, LINK = Resource.COMPUTE, Resource.LINK


class Phase(NamedTuple):
    """One phase of an op: ``seconds`` on ``resource``."""

    resource: Resource
    seconds: float
    name: str = ""


class PhaseRun(NamedTuple):
    """Start and end of each phase of each part (one tuple per part, phases in order)."""

    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]

    @property
    def makespan(self) -> float:
        return max((ends[-1] for ends in self.end if ends), default=0.0)


def overlapped(*parts: Sequence[Phase]) -> PhaseRun:
    """The phases of ``parts`` run at once on one device (see the module docstring).

    A forward that computes 2 then sends for 1, beside a backward computing 1: the send
    runs while the backward computes.

    >>> overlapped([Phase(COMPUTE, 2.0), Phase(LINK, 1.0)], [Phase(COMPUTE, 1.0)])
    PhaseRun(start=((0.0, 2.0), (2.0,)), end=((2.0, 3.0), (3.0,)))
    """
    for phases in parts:
        for phase in phases:
            require(phase.resource in tuple(Resource), "phase resource", phase.resource,
                    f"choose {' or '.join(Resource)}")
            require(bool(np.isfinite(phase.seconds)) and phase.seconds >= 0, "phase seconds", phase.seconds,
                    "a finite number of seconds >= 0")
    free = dict.fromkeys(Resource, 0.0)
    ready = [0.0] * len(parts)
    position = [0] * len(parts)
    start: list[list[float]] = [[] for _ in parts]
    end: list[list[float]] = [[] for _ in parts]
    while True:
        waiting = [k for k, phases in enumerate(parts) if position[k] < len(phases)]
        if not waiting:
            break
        # the phase that can start earliest, ties to the part given first
        k = min(waiting, key=lambda k: (max(ready[k], free[parts[k][position[k]].resource]), k))
        phase = parts[k][position[k]]
        begin = max(ready[k], free[phase.resource])
        finish = begin + phase.seconds
        start[k].append(begin)
        end[k].append(finish)
        free[phase.resource] = ready[k] = finish
        position[k] += 1
    return PhaseRun(tuple(map(tuple, start)), tuple(map(tuple, end)))


def serial_time(phases: Sequence[Phase]) -> float:
    """A lone op's time: its phases one after another."""
    return float(sum(phase.seconds for phase in phases))


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
