"""Interleaved 1F1B, looped BFS and the zero-bubble families (ZB-H1, ZB-H2, ZB-V, V-Half,
V-Min): published pictures, PyTorch's own tables, golden files, heuristics, bad input."""

from __future__ import annotations

import doctest
import importlib
from types import SimpleNamespace

import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import formula, generate
from pipesched.io.grid import dumps
from pipesched.ops import F, I, Op, W
from pipesched.schedule import Placement, Schedule
from pipesched.slots import inflight_per_device, slot_table, table_metrics
from pipesched.validation import validate

# --- the paper's figure 3 (p=4, m=8), in its own notation ----------------------------------
# "B" in the zero-bubble paper is the input-gradient pass, our I; microbatches count from 1.
ZB_H1_FIGURE = {
    0: "F1 F2 F3 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 F8 B5 W5 B6 W6 B7 W7 B8 W8",
    3: "F1 B1 F2 B2 F3 B3 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 F8 B8 W5 W6 W7 W8",
}
ZB_H2_FIGURE = {
    0: "F1 F2 F3 F4 F5 F6 F7 B1 W1 F8 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7 B8 W8",
    3: "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 W1 F8 B8 W2 W3 W4 W5 W6 W7 W8",
}


def from_figure(device: int, cells: str) -> list[Op]:
    kinds = {"F": F, "B": I, "W": W}
    return [Op(device, kinds[cell[0]], int(cell[1:]) - 1) for cell in cells.split()]


@pytest.mark.parametrize(("name", "figure"), [("zb-h1", ZB_H1_FIGURE), ("zb-h2", ZB_H2_FIGURE)])
def test_zero_bubble_handcrafted_matches_the_paper_figure(name, figure):
    schedule = generate(name, 4, 8)
    for device, cells in figure.items():
        assert list(schedule.device_ops[device]) == from_figure(device, cells)


def test_zb_h1_bubble_is_a_third_of_1f1b_and_zb_h2_fills_every_device_span():
    # F = I = W = 1: 1F1B (B = 2 slots) idles 3(p-1), ZB-H1 (p-1)
    one_f_one_b = table_metrics(generate("1f1b", 4, 8))
    h1 = table_metrics(generate("zb-h1", 4, 8))
    assert one_f_one_b.idle_per_device[0] == 9 and h1.idle_per_device[0] == 3
    assert h1.peak_inflight == (4, 4, 4, 4)  # every device holds p, like 1F1B's first
    h2 = generate("zb-h2", 4, 8)
    timeline = table_metrics(h2)
    assert max(timeline.peak_inflight) == 7  # 2p-1
    # zero bubble inside each device's span: it starts at d and works 3m slots without a gap
    table = slot_table(h2)
    for device in range(4):
        rows = table.op_device == device
        assert table.op_start[rows].min() == device
        assert table.op_end[rows].max() == device + 24


# --- PyTorch's own tables ----------------------------------------------------------------
def torch_tables(schedule_class, p: int, m: int, chunks: int) -> list[list[str]]:
    """pipeline_order of a PyTorch schedule built on stand-in stages (no process group):
    the constructor only reads these attributes. Idle (None) cells are dropped."""
    stages = [
        SimpleNamespace(num_stages=p * chunks, group_size=p, group_rank=0, submod=None,
                        stage_index_to_group_rank=None)
        for _ in range(chunks)
    ]
    order = schedule_class(stages, m).pipeline_order
    return [[str(action) for action in order[rank] if action is not None] for rank in range(p)]


def our_tables(schedule: Schedule) -> list[list[str]]:
    return [[str(op) for op in ops] for ops in schedule.device_ops]


def pytorch_accepts_rounds(p: int, m: int) -> bool:
    rounds = max(1, m // p)
    return m % rounds == 0


INTERLEAVED_SIZES = [(p, m, v) for p in (2, 3, 4, 6) for m in (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16) for v in (2, 3, 4)]


@pytest.mark.parametrize(("p", "m", "v"), INTERLEAVED_SIZES)
def test_interleaved_equals_pytorch_interleaved_1f1b(p, m, v):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = generate("interleaved-1f1b", p, m, v=v)
    assert validate(ours) == []
    if pytorch_accepts_rounds(p, m):
        assert our_tables(ours) == torch_tables(schedules.ScheduleInterleaved1F1B, p, m, v)
    else:
        # PyTorch needs m to be a multiple of its round count; we let the first rounds take
        # one microbatch more and still produce a valid table
        with pytest.raises(ValueError, match="multiple of the number of rounds"):
            torch_tables(schedules.ScheduleInterleaved1F1B, p, m, v)


@pytest.mark.parametrize(("p", "m", "v"), [(p, m, v) for p in (2, 4, 5) for m in (1, 3, 4, 8, 11) for v in (2, 3)])
def test_looped_bfs_equals_pytorch(p, m, v):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    assert our_tables(generate("looped-bfs", p, m, v=v)) == torch_tables(schedules.ScheduleLoopedBFS, p, m, v)


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (2, 3, 4, 6, 8) for m in (1, 2, 3, p, 2 * p - 1, 2 * p, 3 * p + 1)])
def test_zb_v_equals_pytorch_zbv_zero_bubble(p, m):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = generate("zb-v", p, m)
    reference = torch_tables(schedules.ScheduleZBVZeroBubble, p, m, 2)
    assert our_tables(ours) == reference
    # PyTorch's table, read as a schedule, validates and runs in the same slots
    theirs = Schedule("torch-zbv", Placement.vshape(p), m,
                      tuple(tuple(Op.parse(cell) for cell in row) for row in reference))
    assert validate(theirs) == []
    assert table_metrics(theirs).makespan == table_metrics(ours).makespan


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (2, 3, 4, 7) for m in (1, 2, p - 1, p, 2 * p, 13)])
def test_zb_h1_equals_pytorch_zero_bubble_with_one_stage_per_rank(p, m):
    """PyTorch's ScheduleInterleavedZeroBubble with one local stage is its ZB1P = ZB-H1."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = generate("zb-h1", p, m)
    if pytorch_accepts_rounds(p, m):
        assert our_tables(ours) == torch_tables(schedules.ScheduleInterleavedZeroBubble, p, m, 1)
    else:
        with pytest.raises(ValueError, match="multiple of the number of rounds"):
            torch_tables(schedules.ScheduleInterleavedZeroBubble, p, m, 1)
        assert validate(ours) == []


# --- golden tables -----------------------------------------------------------------------
GOLDEN = [
    ("interleaved-1f1b_p4_m8.txt", "interleaved-1f1b", 4, 8, {"v": 2}),
    ("interleaved-1f1b_p4_m10_v3.txt", "interleaved-1f1b", 4, 10, {"v": 3}),
    ("looped-bfs_p4_m8.txt", "looped-bfs", 4, 8, {"v": 2}),
    ("zb-h1_p4_m8.txt", "zb-h1", 4, 8, {}),
    ("zb-h2_p4_m8.txt", "zb-h2", 4, 8, {}),
    ("zb-v_p4_m8.txt", "zb-v", 4, 8, {}),
    ("v-half_p4_m8.txt", "v-half", 4, 8, {}),
    ("v-min_p4_m8.txt", "v-min", 4, 8, {}),
]


@pytest.mark.parametrize(("filename", "name", "p", "m", "options"), GOLDEN)
def test_golden_table(golden, filename, name, p, m, options):
    schedule = generate(name, p, m, **options)
    assert validate(schedule) == []
    golden.check(filename, dumps(schedule))


def test_megatron_interleaved_warm_up():
    # Narayanan et al. (2021), figure 4, p=4, m=8, v=2: device 0 runs microbatches 1-4 through
    # chunk 1, 1-4 through chunk 2, then 5 and 6 through chunk 1 before its first backward
    ops = generate("interleaved-1f1b", 4, 8, v=2).device_ops[0]
    first_backward = next(k for k, op in enumerate(ops) if op.kind is not F)
    assert [str(op) for op in ops[:first_backward]] == [
        "0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3", "0F4", "0F5", "0F6"]
    assert str(ops[first_backward]) == "4B0"


# --- the heuristics ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 8), (5, 12), (8, 24)])
def test_one_stage_heuristic_with_equal_costs_is_as_good_as_the_handcrafted_table(name, p, m):
    handcrafted = generate(name, p, m)
    limit = max(inflight_per_device(handcrafted))
    heuristic = generate(name, p, m, activation_limit=limit)
    assert validate(heuristic, activation_limit=limit) == []
    assert heuristic.params["heuristic"] is True
    assert table_metrics(heuristic).makespan <= table_metrics(handcrafted).makespan


@pytest.mark.parametrize("costs", [StageCosts.slots(f=1, i=2, w=0.5), StageCosts.slots(f=2, i=1, w=1), StageCosts.slots(f=1, i=1, w=3)])
def test_zb_h1_heuristic_uses_the_costs(costs):
    handcrafted = generate("zb-h1", 6, 24)
    heuristic = generate("zb-h1", 6, 24, costs=costs)
    assert validate(heuristic, activation_limit=6) == []
    assert table_metrics(heuristic, costs).makespan <= table_metrics(handcrafted, costs).makespan


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_zb_h1_heuristic_trades_bubble_for_memory(limit):
    schedule = generate("zb-h1", 4, 12, activation_limit=limit)
    assert validate(schedule, activation_limit=limit) == []
    assert max(inflight_per_device(schedule)) <= limit
    if limit == 1:
        # one microbatch at a time on every device: F, I, W in turn
        assert [str(op) for op in schedule.device_ops[0][:6]] == ["0F0", "0I0", "0W0", "0F1", "0I1", "0W1"]


def test_heuristics_take_per_stage_costs():
    p = 4
    stage_costs = StageCosts(
        forward=[1, 1, 2, 1], backward_input=[1, 2, 2, 1], backward_weight=[1, 1, 1, 2],
        activation_bytes=[1] * p, output_bytes=[0] * p,
    )
    schedule = generate("zb-h2", p, 12, costs=stage_costs)
    assert validate(schedule, activation_limit=2 * p - 1) == []
    v_costs = StageCosts(
        forward=[1, 2] * p, backward_input=[2, 1] * p, backward_weight=[1] * (2 * p),
        activation_bytes=[1] * (2 * p), output_bytes=[0] * (2 * p),
    )
    assert validate(generate("zb-v", p, 12, costs=v_costs), activation_limit=2 * p) == []


@pytest.mark.parametrize(("p", "m"), [(4, 8), (6, 12), (8, 32)])
def test_zb_v_heuristic_at_1f1b_memory_is_as_good_as_the_handcrafted_table(p, m):
    heuristic = generate("zb-v", p, m, activation_limit=2 * p)
    assert validate(heuristic, activation_limit=2 * p) == []
    assert table_metrics(heuristic).makespan <= table_metrics(generate("zb-v", p, m)).makespan


@pytest.mark.parametrize("limit", [2, 3, 5, 7])
def test_zb_v_heuristic_keeps_a_lower_activation_limit(limit):
    schedule = generate("zb-v", 4, 8, activation_limit=limit)
    assert validate(schedule, activation_limit=limit) == []
    assert max(inflight_per_device(schedule)) <= limit


def test_memory_families_order_as_published():
    # activation memory: ZB-V (1F1B's) > V-Half (about half) > V-Min (about a third);
    # bubble: the other way round
    p, m = 8, 32
    peaks = {name: max(inflight_per_device(generate(name, p, m))) for name in ("zb-v", "v-half", "v-min")}
    assert peaks == {"zb-v": 16, "v-half": 10, "v-min": 8}
    spans = {name: table_metrics(generate(name, p, m)).makespan for name in ("zb-v", "v-half", "v-min")}
    assert spans["zb-v"] < spans["v-half"] < spans["v-min"]


# --- level 1 --------------------------------------------------------------------------------
def test_formulas_at_p4_m8():
    unit = StageCosts.slots()
    assert formula("zb-h1", 4, 8, costs=unit).idle == 3
    assert formula("zb-h2", 4, 8, costs=unit).peak_inflight == 7
    interleaved = formula("interleaved-1f1b", 4, 8, v=2, costs=StageCosts.slots(f=1, i=1, w=1))
    # (p-1)(F+B) chunk slots; device 0 holds (v-1)p + 2(p-1) + 1 = 11 chunks = p + (p-1)/v stages
    assert (interleaved.idle, interleaved.peak_inflight, interleaved.activation_units) == (9, 11, 5.5)
    zb_v = formula("zb-v", 4, 8, costs=unit)
    assert (zb_v.idle, zb_v.peak_inflight, zb_v.activation_units, zb_v.exact) == (3, 8, 4, True)
    assert not formula("v-half", 4, 8).exact and "approximation" in formula("v-min", 4, 8).note
    assert not formula("zb-h1", 4, 8, costs=StageCosts.slots(f=1, i=2, w=1)).exact


# --- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: generate("interleaved-1f1b", 4, 8, v=1), "v=1: interleaved-1f1b needs at least 2 chunks"),
        (lambda: generate("looped-bfs", 4, 8, v=1), "v=1: looped-bfs needs at least 2 chunks"),
        (lambda: generate("interleaved-1f1b", 1, 8), "p=1: needs at least 2 pipeline devices"),
        (lambda: generate("zb-h1", 4, 0), "m=0: needs at least 1 microbatch"),
        (lambda: generate("zb-v", 4, 8, v=3), "v=3: zb-v always uses 2 stage(s) per device"),
        (lambda: generate("zb-h1", 4, 8, activation_limit=0), "activation_limit=0: too small for zb-h1 to make progress; the smallest that works here is 1"),
        (lambda: generate("zb-v", 4, 8, activation_limit=1), "activation_limit=1: too small for zb-v to make progress; the smallest that works here is 2"),
        (lambda: generate("zb-h2", 4, 8, activation_limit=2.5), "activation_limit=2.5: give a whole number"),
        (lambda: generate("v-half", 4, 8, activation_limit=4), "option=activation_limit: v-half does not take it"),
        (lambda: generate("zb-h1", 4, 8, costs=StageCosts.slots(f=-1)), "forward[stage 0]=-1.0: must be a finite number >= 0"),
        (lambda: generate("zb-v", 4, 8, costs=StageCosts.uniform(4)), "costs=4 stages: zb-v here has 8 stages"),
        (lambda: generate("zb-h1", 4, 8, costs="fast"), "costs=str: give a StageCosts"),
    ],
)
def test_bad_input_names_the_constraint(call, message):
    with pytest.raises(PipeschedError) as error:
        call()
    assert message in str(error.value)
    assert "\n" not in str(error.value)


# --- docstring examples -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["interleaved", "looped_bfs", "zb_h1", "zb_h2", "zb_v", "v_controllable"],
)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(f"pipesched.generators.{name}"))
    assert result.attempted > 0 and result.failed == 0
