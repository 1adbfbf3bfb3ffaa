"""Chimera (Li & Hoefler, SC'21): two pipelines in opposite directions merged on one set of
devices.

The "down" replica puts stage s on device s, the "up" replica puts it on device p-1-s, so each
device holds two stages (2x the parameters of one pipeline, and the replicas' gradients are
all-reduced at the end). A basic unit schedules p microbatches, p/2 down and p/2 up; m > p
concatenates m/p units directly: the next unit's forwards fill the bubbles at the end of the
previous one. Microbatches 0..m/2-1 go down, m/2..m-1 go up. Backwards are full (B), as in
the paper's base scheme (its forward-doubling and backward-halving variants are not modelled).

The tables are the paper's picture with forward and backward drawn as equal cells: each
pipeline runs 1F1B with at most ``min(p - s, p/2)`` microbatches in flight on its stage s,
and the two pipelines are merged cell by cell: in each time unit a device starts a ready
backward if it has one, else a ready forward; among those, the oldest microbatch of its
direction first, then the one further along its pipeline, then down before up. With F = B
this gives the paper's (p/2-1)(F+B) idle time per device for every m multiple of p, and at
most p microbatches in flight per device.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.ops import B, F, Op
from pipesched.schedule import Placement, Schedule

DOWN, UP = 0, 1

# one device's two directions: (stage it holds, microbatches in order, in-flight cap)
Lane = list[tuple[int, range, int]]


def _check(p: int, m: int) -> None:
    check_sizes(p, m)
    require(
        p % 2 == 0,
        "p",
        p,
        "Chimera needs an even number of devices (p/2 microbatches each way per unit)",
    )
    require(
        m % p == 0,
        "m",
        m,
        f"Chimera concatenates basic units of p={p} microbatches; give m a multiple of {p}",
    )


def chimera(p: int, m: int) -> Schedule:
    """Chimera's tables for p devices (even) and m microbatches (a multiple of p).

    >>> s = chimera(2, 2)
    >>> [[str(op) for op in ops] for ops in s.device_ops]
    [['0F0', '1F1', '1B1', '0B0'], ['0F1', '1F0', '1B0', '0B1']]
    """
    _check(p, m)
    half = m // 2
    route = tuple(DOWN if mb < half else UP for mb in range(m))
    return Schedule(
        "chimera",
        Placement.bidirectional(p),
        m,
        _merged_tables(p, m),
        route=route,
        params={"p": p, "m": m},
    )


def _merged_tables(p: int, m: int) -> tuple[tuple[Op, ...], ...]:
    """Run both pipelines cell by cell (every op one time unit) and record each device's
    order. Per device and direction the forwards, and the backwards, go in microbatch order."""
    half = m // 2
    lanes: list[Lane] = []
    for d in range(p):
        lane: Lane = []
        for direction, stage in ((DOWN, d), (UP, p - 1 - d)):
            mbs = range(0, half) if direction == DOWN else range(half, m)
            lane.append((stage, mbs, min(p - stage, p // 2)))
        lanes.append(lane)
    next_forward = [[0, 0] for _ in range(p)]  # index into the lane's microbatches
    next_backward = [[0, 0] for _ in range(p)]
    finished: dict[Op, int] = {}  # op -> time unit at whose end it completed
    tables: list[list[Op]] = [[] for _ in range(p)]
    remaining = 2 * p * m
    t = 0
    while remaining:
        started = []
        for d in range(p):
            choice = _pick(lanes[d], next_forward[d], next_backward[d], finished, t, p)
            if choice is None:
                continue
            op, direction = choice
            if op.kind is F:
                next_forward[d][direction] += 1
            else:
                next_backward[d][direction] += 1
            tables[d].append(op)
            started.append(op)
        if not started:
            # every op lasts one unit, so all earlier ops have ended: nothing can ever start
            raise RuntimeError(f"chimera p={p} m={m}: the merge stalled at time {t}")
        for op in started:
            finished[op] = t + 1
        remaining -= len(started)
        t += 1
    return tuple(tuple(ops) for ops in tables)


def _pick(
    lane: Lane,
    next_forward: list[int],
    next_backward: list[int],
    finished: dict[Op, int],
    t: int,
    p: int,
) -> tuple[Op, int] | None:
    """The op a device starts at time t: a ready backward before a ready forward, the
    oldest microbatch of its direction first, then the further stage, then down before up."""

    def done(op: Op) -> bool:
        return finished.get(op, t + 1) <= t

    best = None
    for direction, (stage, mbs, cap) in enumerate(lane):
        b_index, f_index = next_backward[direction], next_forward[direction]
        if b_index < len(mbs):
            op = Op(stage, B, mbs[b_index])
            if done(Op(stage, F, op.microbatch)) and (
                stage == p - 1 or done(Op(stage + 1, B, op.microbatch))
            ):
                key = (0, b_index, stage, direction)
                if best is None or key < best[0]:
                    best = (key, op, direction)
        if f_index < len(mbs) and f_index - b_index < cap:
            op = Op(stage, F, mbs[f_index])
            if stage == 0 or done(Op(stage - 1, F, op.microbatch)):
                key = (1, f_index, -stage, direction)
                if best is None or key < best[0]:
                    best = (key, op, direction)
    return None if best is None else (best[1], best[2])


def chimera_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    # The paper: (p/2-1) forward and (p/2-1) backward bubbles per device, i.e. bubble ratio
    # (p-2)/(2m+p-2) when F = B; at most p microbatches in flight (device p/2-1 holds p/2
    # of each direction).
    return FormulaEstimate(
        idle=(p / 2 - 1) * (c.f + c.b),
        work=m * (c.f + c.b),  # two stages x m/2 microbatches per device
        peak_inflight=p,
        activation_units=p,
        exact=c.f == c.b,
        note=(
            "2x parameters (two replicas, gradients all-reduced); exact when F = B; "
            "with B > F the table idles more (2(p-2) slots at m = p with F=1, B=2) and "
            "direct concatenation leaves gaps between units"
        ),
    )


FAMILY = Family(
    name="chimera",
    summary="two opposite pipelines (model replicas) merged: about half of 1F1B's bubble",
    constraints="p even, m a multiple of p; 2x parameters",
    build=lambda p, m, *, v=None: chimera(p, m),
    formula=chimera_formula,
)
