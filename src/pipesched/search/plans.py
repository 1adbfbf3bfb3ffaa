"""Candidate answers to a synthesis problem, and their evaluation by the simulator.

A plan is a per-device op order (stage s on device s) plus the stages that recompute. The
simulator, with free channels (``contention=False``, what the solver models), gives its
makespan and its memory trace, which decides whether it fits the cap.

Microbatch order. The microbatches are identical (and every stage-microbatch of a stage has
the same op kinds), so the i-th F (or I, W, B) a stage runs may as well be microbatch i: relabelling every stage's ops of each kind in time order keeps
all op times and every device's memory trace, and every dependency still holds (the i-th F
of stage s starts after i + 1 forwards of stage s-1 have arrived, so after the i-th did;
the same for the gradients coming back and for the ops of one stage). So the solver and the
heuristics lose nothing by keeping each kind in microbatch order on every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipesched.ops import Op
from pipesched.schedule import SYNCHRONOUS, Execution, Placement, Schedule
from pipesched.search.problem import BYTES_TOLERANCE, SynthesisProblem
from pipesched.simulate import simulate
from pipesched.timeline import Timeline


@dataclass(frozen=True)
class Plan:
    """A candidate: ``device_ops[d]`` is device d's op order (with the offloads and
    reloads of the stages that offload, on the device's host link); ``recompute`` the
    stages that recompute their activations, ``offload`` those that offload them; ``source``
    says what made it."""

    device_ops: tuple[tuple[Op, ...], ...]
    recompute: frozenset[int] = field(default_factory=frozenset)
    source: str = ""
    offload: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True, eq=False)
class Evaluation:
    """A plan run by the simulator with free channels."""

    plan: Plan
    timeline: Timeline

    @property
    def makespan(self) -> float:
        return self.timeline.makespan

    @property
    def peak_memory(self) -> tuple[float, ...]:
        return self.timeline.memory.peak


def to_schedule(problem: SynthesisProblem, plan: Plan, *, name: str = "synthesized",
                params: dict[str, object] | None = None, execution: Execution = SYNCHRONOUS) -> Schedule:
    p = problem.num_stages
    return Schedule(name, Placement.one_per_device(p), problem.num_microbatches,
                    tuple(tuple(ops) for ops in plan.device_ops), params=params or {"p": p, "m": problem.num_microbatches},
                    execution=execution)


def evaluate(problem: SynthesisProblem, plan: Plan) -> Evaluation:
    """Simulate ``plan`` (raises PipeschedError when its tables deadlock)."""
    schedule = to_schedule(problem, plan)
    costs = problem.costs.checkpointed(sorted(plan.recompute))
    network = problem.network
    return Evaluation(plan, simulate(schedule, costs, network, contention=False))


def fits(problem: SynthesisProblem, evaluation: Evaluation) -> bool:
    """Whether every device's peak memory is within the cap (and its offloads within its
    host's memory)."""
    host = evaluation.timeline.host_memory
    if host is not None and host.capacity is not None and any(
            peak > capacity for peak, capacity in zip(host.peak, host.capacity, strict=True)):
        return False  # more offloaded activations at once than the host holds
    if problem.memory_limit is None:
        return True
    return all(peak <= limit * (1 + BYTES_TOLERANCE)
               for peak, limit in zip(evaluation.peak_memory, problem.memory_limit, strict=True))


def in_microbatch_order(device_ops: Sequence[Sequence[Op]]) -> tuple[tuple[Op, ...], ...]:
    """Each stage's ops of each kind relabelled 0, 1, 2, ... in table order (see the module
    docstring: for identical microbatches this changes no time and no memory).

    >>> from pipesched.ops import F
    >>> [str(op) for op in in_microbatch_order([[Op(0, F, 1), Op(0, F, 0)]])[0]]
    ['0F0', '0F1']
    """
    tables = []
    for ops in device_ops:
        seen: dict[tuple[int, object], int] = {}
        row = []
        for op in ops:
            key = (op.stage, op.kind)
            index = seen.get(key, 0)
            seen[key] = index + 1
            row.append(Op(op.stage, op.kind, index))
        tables.append(tuple(row))
    return tuple(tables)
