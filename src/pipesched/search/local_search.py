"""Local search over per-device op orders, judged by the simulator (free channels).

A move swaps two neighbouring ops of different kinds on one device (keeping each kind in
microbatch order and each stage-microbatch's own F -> I -> W order), or, with recompute
allowed, switches one stage's recompute on or off, or, with offload allowed, one stage's
offload (its O after each forward and its R one compute op ahead of each backward, as
``pipesched.passes.offload`` places them; a stage does not do both). A move is kept when the plan still runs
(no deadlock), fits the cap, and shortens the makespan, or keeps it and brings the ops'
end times forward in total. Moves that touch the critical path are tried first: only they
can shorten the makespan.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator

from pipesched.errors import PipeschedError
from pipesched.ops import B, F, I, O, R, W
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.schedule import Placement, Schedule
from pipesched.search.plans import Evaluation, Plan, evaluate, fits
from pipesched.search.problem import SynthesisProblem

# pairs (earlier kind, later kind) that a stage-microbatch must keep in this order
_OWN_ORDER = {(F, I), (I, W), (F, B)}

# (device, position) swaps position and position + 1; ("recompute" | "offload", stage) switches it
_RECOMPUTE, _OFFLOAD = "recompute", "offload"  # the switch moves' tags
Move = tuple[int, int] | tuple[str, int]


def _key(evaluation: Evaluation) -> tuple[float, float]:
    return evaluation.makespan, float(evaluation.timeline.op_end.sum())


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a beats b beyond float noise."""
    if a[0] < b[0] * (1 - 1e-12):
        return True
    return a[0] <= b[0] * (1 + 1e-12) and a[1] < b[1] * (1 - 1e-12)


def _moves(problem: SynthesisProblem, current: Evaluation, rng: random.Random) -> Iterator[Move]:
    timeline = current.timeline
    tables = current.plan.device_ops
    path = timeline.simulation.critical_path
    critical = set(path.row[~path.is_transfer].tolist())
    # timeline rows follow table order: device d's ops come after those of devices 0..d-1
    first_row = [0, *itertools.accumulate(len(ops) for ops in tables)]
    swaps = []
    for d, ops in enumerate(tables):
        for i in range(len(ops) - 1):
            a, b = ops[i], ops[i + 1]
            if a.kind is b.kind or (a.microbatch == b.microbatch and (a.kind, b.kind) in _OWN_ORDER):
                continue
            touches = first_row[d] + i in critical or first_row[d] + i + 1 in critical
            swaps.append((not touches, rng.random(), (d, i)))
    swaps.sort()
    plan = current.plan
    switches = []
    if problem.allow_recompute:  # a stage that offloads does not recompute as well
        switches += [(_RECOMPUTE, s) for s in range(problem.num_stages) if s not in plan.offload]
    if problem.allow_offload:
        switches += [(_OFFLOAD, s) for s in range(problem.num_stages) if s not in plan.recompute]
    rng.shuffle(switches)
    yield from switches
    for _, _, move in swaps:
        yield move


def _apply(problem: SynthesisProblem, plan: Plan, move: Move) -> Plan:
    if move[0] == _RECOMPUTE:
        return Plan(plan.device_ops, plan.recompute ^ {move[1]}, source="local search", offload=plan.offload)
    if move[0] == _OFFLOAD:
        return _switch_offload(problem, plan, move[1])
    d, i = move
    ops = list(plan.device_ops[d])
    ops[i], ops[i + 1] = ops[i + 1], ops[i]
    tables = (*plan.device_ops[:d], tuple(ops), *plan.device_ops[d + 1:])
    return Plan(tables, plan.recompute, source="local search", offload=plan.offload)


def improve(problem: SynthesisProblem, start: Evaluation, *, seconds: float, seed: int = 0) -> Evaluation:
    """The best plan hill climbing from ``start`` reaches within ``seconds`` (first
    improvement, moves in a seeded random order within their class)."""
    deadline = time.perf_counter() + seconds
    rng = random.Random(seed)
    current, best_key = start, _key(start)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for move in _moves(problem, current, rng):
            if time.perf_counter() >= deadline:
                break
            try:
                candidate = evaluate(problem, _apply(problem, current.plan, move))
            except PipeschedError:
                continue  # the swap deadlocks the tables
            key = _key(candidate)
            if fits(problem, candidate) and _better(key, best_key):
                current, best_key, improved = candidate, key, True
                break
    return current


def _switch_offload(problem: SynthesisProblem, plan: Plan, stage: int) -> Plan:
    """``plan`` with ``stage``'s offload switched: its O and R ops taken out, or placed."""
    if stage in plan.offload:
        tables = tuple(tuple(op for op in ops if not (op.stage == stage and op.kind in (O, R)))
                       for ops in plan.device_ops)
        return Plan(tables, plan.recompute, source="local search", offload=plan.offload - {stage})
    plain = tuple(tuple(op for op in ops if op.kind not in (O, R)) for ops in plan.device_ops)
    placed = offload(Schedule("plan", Placement.one_per_device(len(plain)), problem.num_microbatches, plain),
                     OffloadPolicy(stages=(stage,))).device_ops
    # the other stages keep their host-link ops where they were
    tables = tuple(ops if d != stage else placed[d] for d, ops in enumerate(plan.device_ops))
    return Plan(tables, plan.recompute, source="local search", offload=plan.offload | {stage})
