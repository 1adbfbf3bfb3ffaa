"""The communication pass: messages and all-reduces from the rules, per-device actions equal
to PyTorch's own lowering, and the compute+comms CSV both ways."""

from __future__ import annotations

import csv
import io as _io

import pytest

from pipesched import io
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.io import torch_csv
from pipesched.ops import Op
from pipesched.passes.communication import (
    AllReduce,
    Recv,
    Send,
    allreduces,
    messages,
    with_communication,
)
from pipesched.schedule import Placement, Schedule

# families whose stages each live on one device: PyTorch's lowering can take them
ONE_REPLICA = [name for name in FAMILIES if generate(name, 4, 8).placement.num_replicas == 1]


def test_sends_pair_with_receives_in_the_same_order_and_compute_keeps_table_order():
    schedule = generate("interleaved-1f1b", 2, 4)
    plans = with_communication(schedule).actions
    for a in range(2):
        b = 1 - a
        sends = [action.message for action in plans[a] if isinstance(action, Send) and action.peer == b]
        receives = [action.message for action in plans[b] if isinstance(action, Recv) and action.peer == a]
        assert sends == receives and sends
    for device, plan in enumerate(plans):
        assert [action for action in plan if isinstance(action, Op)] == list(schedule.device_ops[device])


def test_same_device_handoffs_stay_local():
    # V shape: stages 1 and 2 share device 1, so their activation never leaves it
    schedule = generate("zb-v", 2, 2)
    assert schedule.placement.replicas == Placement.vshape(2).replicas
    sent = 0
    for plan in with_communication(schedule).actions:
        for action in plan:
            if isinstance(action, Send):
                sent += 1
                assert schedule.device_of(action.message.stage, action.message.microbatch) != action.peer
                assert schedule.device_of(action.message.to_stage, action.message.microbatch) == action.peer
    assert sent == len(messages(schedule)) > 0


def test_a_deadlock_is_reported():
    ops = ((Op.parse("0F0"), Op.parse("0B0")), (Op.parse("1B0"), Op.parse("1F0")))
    schedule = Schedule("stuck", Placement.one_per_device(2), 1, ops)
    with pytest.raises(PipeschedError, match=r"^schedule=stuck: the tables deadlock \(device 0 waits at 0B0; device 1 waits at 1B0\)"):
        with_communication(schedule)


@pytest.mark.parametrize("name", ["chimera", "dualpipe"])
def test_replicated_stages_all_reduce_after_their_last_weight_gradient(name: str):
    schedule = generate(name, 4, 8)
    reduces = allreduces(schedule)
    assert len(reduces) == schedule.num_stages  # every stage has two replicas on two devices
    plans = with_communication(schedule).actions
    for stage, a, b in zip(reduces.stage.tolist(), reduces.src.tolist(), reduces.dst.tolist(), strict=True):
        for device, peer in ((a, b), (b, a)):
            plan = plans[device]
            position = plan.index(AllReduce(stage, peer))
            last = max(k for k, action in enumerate(plan)
                       if isinstance(action, Op) and action.stage == stage and action.kind.value in "WB")
            # right after the op: only that op's own sends come between
            assert position > last
            assert all(isinstance(action, Send) for action in plan[last + 1:position])


torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


@pytest.mark.parametrize("name", ONE_REPLICA)
@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5)])
def test_our_lowering_equals_pytorchs_add_send_recv(name: str, p: int, m: int):
    family = FAMILIES[name]
    try:
        schedule = generate(name, p, m)
    except PipeschedError:
        assert family.constraints  # a size the family refuses (e.g. an even p), said in its constraints
        return
    compute = {rank: [torch_schedules._Action.from_str(str(op)) for op in ops]
               for rank, ops in enumerate(schedule.device_ops)}
    owner = schedule.placement.replicas[0]
    lowered = torch_schedules._add_send_recv(compute, stage_to_rank=lambda s: owner[s], num_stages=schedule.num_stages)
    ours = with_communication(schedule).text_rows()
    assert [[str(a) for a in lowered[rank]] for rank in range(schedule.num_devices)] == ours


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v", "dualpipev"])
def test_comms_csv_round_trips_and_parses_in_pytorch(name: str, tmp_path):
    schedule = generate(name, 4, 8)
    comms = with_communication(schedule)
    text = io.dumps(schedule, "csv-comms")
    assert torch_csv.loads_comms(text) == comms
    plain = io.loads(text, "csv")  # as a plain schedule, the comm actions drop
    assert (plain.device_ops, plain.placement) == (schedule.device_ops, schedule.placement)
    rows = [[torch_schedules._Action.from_str(cell) for cell in row] for row in csv.reader(_io.StringIO(text))]
    assert [[str(a) for a in row] for row in rows] == comms.text_rows()


def test_comms_csv_refuses_replicated_stages():
    with pytest.raises(PipeschedError, match="replicas"):
        io.dumps(generate("chimera", 4, 8), "csv-comms")
