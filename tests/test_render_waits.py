"""What each op waited for: the cause whose end is the op's start."""

from __future__ import annotations

import numpy as np
import pytest

from pipesched.generators import generate
from pipesched.ops import Op
from pipesched.render.waits import wait_texts
from pipesched.slots import slot_table
from pipesched.waits import (
    WAIT_DEPENDENCY,
    WAIT_DEVICE,
    WAIT_NONE,
    WAIT_TRANSFER,
    row_dependencies,
    waited_for,
)
from render_timelines import simulated, split_backward, with_transfers


def row_of(timeline, text: str) -> int:
    op = Op.parse(text)
    return next(r for r in range(len(timeline)) if timeline.op(r) == op)


@pytest.mark.parametrize("make", [
    lambda: slot_table(generate("1f1b", 4, 8)),
    lambda: slot_table(generate("gpipe", 3, 5)),
    lambda: simulated(generate("1f1b", 4, 8)),
    lambda: simulated(split_backward(generate("gpipe", 4, 6))),
    lambda: with_transfers(split_backward(generate("1f1b", 3, 6))),
])
def test_every_op_starts_when_its_cause_ends(make) -> None:
    timeline = make()
    waits = waited_for(timeline)
    started = waits.cause != WAIT_NONE
    assert np.allclose(timeline.op_start[started], waits.ready[started])
    # only the very first op of the iteration waits for nothing
    assert np.count_nonzero(~started) == 1
    assert timeline.op_start[~started][0] == timeline.origin


def test_dependencies_follow_the_schedule() -> None:
    timeline = simulated(split_backward(generate("1f1b", 3, 4)))
    deps = row_dependencies(timeline)
    for row in range(len(timeline)):
        expected = {row_of(timeline, str(p)) for p in timeline.schedule.predecessors(timeline.op(row))}
        assert {int(deps.carried[row]), int(deps.local[row])} - {-1} == expected
    # every point-to-point transfer feeds exactly the op that needs it, on its destination
    table = timeline.transfers
    assert (deps.consumer >= 0).all()
    assert (timeline.op_device[deps.consumer] == table.dst_device).all()
    assert (timeline.op_microbatch[deps.consumer] == table.microbatch).all()


def test_causes_in_a_1f1b_table() -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    waits = waited_for(timeline)
    # d0's first backward waits for the gradient of 1B0 from device 1 (no transfers in a table)
    b0 = row_of(timeline, "0B0")
    assert (waits.cause[b0], waits.ref[b0]) == (WAIT_DEPENDENCY, row_of(timeline, "1B0"))
    # in the steady state the forward after a backward waits for the device
    f4 = row_of(timeline, "0F4")
    assert (waits.cause[f4], waits.ref[f4]) == (WAIT_DEVICE, row_of(timeline, "0B0"))
    texts = wait_texts(timeline, waits)
    assert texts[b0] == "dependency: 1B0 on device 1 ended at 10 slots"


def test_transfers_are_named_when_they_delivered_the_input() -> None:
    timeline = simulated(generate("1f1b", 4, 8))
    waits = waited_for(timeline)
    f0 = row_of(timeline, "1F0")
    assert waits.cause[f0] == WAIT_TRANSFER
    table = timeline.transfers
    t = int(waits.ref[f0])
    assert (table.src_device[t], table.dst_device[t], table.microbatch[t]) == (0, 1, 0)
    assert wait_texts(timeline, waits)[f0].startswith("transfer: activation of microbatch 0 d0->d1 arrived at ")
