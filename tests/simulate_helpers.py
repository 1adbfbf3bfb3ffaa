"""Helpers for the simulator tests: random valid schedules and an independent longest path.

Kept apart from the library on purpose: the longest path below follows the definitions in
docs/ARCHITECTURE.md (data dependencies from ``Schedule.predecessors``, each device runs its
table in order, a transfer between devices costs latency + bytes / bandwidth) without
using any of pipesched.simulate.
"""

from __future__ import annotations

import itertools
import random

from blocking_reference import blocking_run
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.ops import B, F, I, Op, W
from pipesched.schedule import Schedule
from pipesched.simulate import Network, simulate
from pipesched.timeline import Timeline


def random_valid_schedule(schedule: Schedule, seed: int) -> Schedule:
    """The same ops and placement in a random order that still runs: a random topological
    order of the data dependencies, split by device (any such order is deadlock-free)."""
    rng = random.Random(seed)
    device_of = {op: d for d, op in schedule.ops()}
    preds = {op: schedule.predecessors(op) for op in device_of}
    waiting = {op: len(p) for op, p in preds.items()}
    succs: dict[Op, list[Op]] = {op: [] for op in device_of}
    for op, p in preds.items():
        for q in p:
            succs[q].append(op)
    ready = sorted((op for op, n in waiting.items() if n == 0), key=str)
    per_device: list[list[Op]] = [[] for _ in range(schedule.num_devices)]
    while ready:
        op = ready.pop(rng.randrange(len(ready)))
        per_device[device_of[op]].append(op)
        for nxt in sorted(succs[op], key=str):
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    return schedule.with_ops(tuple(tuple(ops) for ops in per_device), name=f"{schedule.name}-shuffled")


def random_costs(num_stages: int, seed: int, *, split: bool = True) -> StageCosts:
    rng = random.Random(seed)

    def draw(lo: float, hi: float) -> tuple[float, ...]:
        return tuple(round(rng.uniform(lo, hi), 3) for _ in range(num_stages))

    return StageCosts(
        forward=draw(0.5, 2.0),
        backward_input=draw(0.5, 2.0),
        backward_weight=draw(0.2, 1.5),
        activation_bytes=draw(1.0, 4.0),
        output_bytes=draw(0.0, 3.0),
        static_bytes=draw(0.0, 9.0),
    )


def longest_path_makespan(schedule: Schedule, costs: StageCosts, latency: float, bandwidth: float) -> float:
    """End of the last op when nothing contends: earliest start of every op over the graph of
    device order (zero weight) and data dependencies (transfer time when the devices differ)."""
    device_of = {op: d for d, op in schedule.ops()}
    edges: dict[Op, list[tuple[Op, float]]] = {op: [] for op in device_of}
    indegree = {op: 0 for op in device_of}

    def transfer(producer: Op, consumer: Op) -> float:
        if device_of[producer] == device_of[consumer]:
            return 0.0
        if producer.kind is F:
            size = costs.output_bytes[producer.stage]
        else:
            assert producer.kind in (I, B)
            size = costs.output_bytes[producer.stage - 1]
        return latency + size / bandwidth

    for ops in schedule.device_ops:
        for before, after in itertools.pairwise(ops):
            edges[before].append((after, 0.0))
            indegree[after] += 1
    for op in device_of:
        for pred in schedule.predecessors(op):
            edges[pred].append((op, transfer(pred, op)))
            indegree[op] += 1
    start = {op: 0.0 for op in device_of}
    frontier = [op for op, n in indegree.items() if n == 0]
    end = 0.0
    while frontier:
        op = frontier.pop()
        finish = start[op] + costs.duration(op)
        end = max(end, finish)
        for nxt, delay in edges[op]:
            start[nxt] = max(start[nxt], finish + delay)
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                frontier.append(nxt)
    assert all(n == 0 for n in indegree.values()), "the test schedule has a cycle"
    # replicated stages: a two-rank all-reduce of the gradients after each replica's last
    # weight-gradient op of the stage (2 latencies + bytes / bandwidth)
    if schedule.placement.num_replicas > 1:
        for stage in range(schedule.num_stages):
            devices = {replica[stage] for replica in schedule.placement.replicas}
            if len(devices) < 2:
                continue
            last = [start[op] + costs.duration(op) for op in device_of
                    if op.stage == stage and op.kind in (W, B)]
            # default: the 4-byte fp32 gradient of each parameter's 18 bytes of static state
            grad = costs.grad_bytes[stage] if costs.grad_bytes else costs.static(stage) * 4 / 18
            end = max(end, max(last) + 2 * latency + grad / bandwidth)
    return end


def simulate_unless_blocked(schedule: Schedule, costs: StageCosts, network: Network, *, contention: bool = True,
                            overlap: bool = True) -> Timeline | None:
    """``simulate``; None when a blocking runtime (no overlap) deadlocks on the table, after
    checking that the independent reference deadlocks too, with one-op and with paired
    batches."""
    try:
        return simulate(schedule, costs, network, contention=contention, overlap=overlap)
    except PipeschedError as exc:
        if overlap or "blocking runtime" not in str(exc):
            raise
    for steps in ("op", "pair"):
        try:
            blocking_run(schedule, costs, network, steps=steps)
        except RuntimeError:
            continue
        raise AssertionError(f"the engine deadlocks where the reference runs {steps} steps")
    return None
