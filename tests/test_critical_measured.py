"""The critical path of a measured timeline: measured ops start some time after the op they
waited for ends (input wait, launch), never exactly at its end, so the walk takes the
candidate that ended last before each op's start."""

from __future__ import annotations

import numpy as np
import pytest

from pipesched.generators import generate
from pipesched.ops import B, F, Op
from pipesched.rules import RULES
from pipesched.simulate.critical import critical_path
from pipesched.timeline import Timeline

P, M = 4, 8
# seconds: stages 0-2 run F in 1 ms and B in 2 ms; the last stage is slower, so it never
# waits for its input and bounds the iteration
DURATION = {(s, kind): (1.5e-3 if kind is F else 3e-3) if s == P - 1 else (1e-3 if kind is F else 2e-3)
            for s in range(P) for kind in (F, B)}


def _needs(op: Op) -> list[Op]:
    """The default rules, stated independently: F(s) needs F(s-1); B(s) needs F(s) and B(s+1)."""
    if op.kind is F:
        return [Op(op.stage - 1, F, op.microbatch)] if op.stage > 0 else []
    return [Op(op.stage, F, op.microbatch)] + ([Op(op.stage + 1, B, op.microbatch)] if op.stage < P - 1 else [])


def _measured_1f1b(seed: int, clock: float = 5000.0) -> tuple[Timeline, dict[Op, int]]:
    """1F1B run op by op in each device's table order: each op starts after its inputs and its
    device's previous op, plus a launch gap of 5-50 us (never 0), on a clock at ``clock``
    seconds; rows in the order the ops started, as a real run records them."""
    schedule = generate("1f1b", P, M)
    rng = np.random.default_rng(seed)
    end: dict[Op, float] = {}
    start: dict[Op, float] = {}
    device_of: dict[Op, int] = {}
    position = [0] * P
    free = [clock] * P
    while len(end) < sum(len(ops) for ops in schedule.device_ops):
        for device, ops in enumerate(schedule.device_ops):
            while position[device] < len(ops) and all(n in end for n in _needs(ops[position[device]])):
                op = ops[position[device]]
                ready = max([free[device], *(end[n] for n in _needs(op))])
                start[op] = ready + rng.uniform(5e-6, 5e-5)
                end[op] = free[device] = start[op] + DURATION[(op.stage, op.kind)] * rng.uniform(0.98, 1.02)
                device_of[op] = device
                position[device] += 1
    order = sorted(start, key=start.get)
    timeline = Timeline(
        schedule=schedule, source="measured", unit="s",
        op_device=np.array([device_of[op] for op in order], np.int32),
        op_stage=np.array([op.stage for op in order], np.int32),
        op_kind=np.array([RULES.index(op.kind) for op in order], np.int8),
        op_microbatch=np.array([op.microbatch for op in order], np.int32),
        op_start=np.array([start[op] for op in order]), op_end=np.array([end[op] for op in order]),
    )
    return timeline, {op: row for row, op in enumerate(order)}


def _known_path() -> list[Op]:
    """By hand: microbatch 0's forward down to the last stage, the last stage's own table
    (F0 B0 F1 B1 ... B7, never waiting for an input), microbatch 7's backward back up."""
    last = [Op(P - 1, kind, mb) for mb in range(M) for kind in (F, B)]
    return ([Op(s, F, 0) for s in range(P - 1)] + last + [Op(s, B, M - 1) for s in reversed(range(P - 1))])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_measured_1f1b_critical_path_spans_the_iteration(seed) -> None:
    timeline, row_of = _measured_1f1b(seed)
    path = critical_path(timeline)
    assert not path.is_transfer.any()
    assert path.row.tolist() == [row_of[op] for op in _known_path()]
    # from the first op to start to the last to end
    assert timeline.op_start[path.row[0]] == timeline.op_start.min()
    assert timeline.op_end[path.row[-1]] == timeline.op_end.max()


def test_a_slot_table_path_still_stops_at_a_gap() -> None:
    # the same times read as a slot table: no op starts exactly at a predecessor's end, so
    # the exact rule finds no binding op before the last one
    timeline, _ = _measured_1f1b(0)
    exact = Timeline(schedule=timeline.schedule, source="table", unit="s", op_device=timeline.op_device,
                     op_stage=timeline.op_stage, op_kind=timeline.op_kind, op_microbatch=timeline.op_microbatch,
                     op_start=timeline.op_start, op_end=timeline.op_end)
    assert len(critical_path(exact)) == 1
