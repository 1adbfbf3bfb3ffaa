"""Fused ops (``(0F1;1B0)OVERLAP_F_B``, DualPipe's overlapped F&B pair): the value type and
its text, PyTorch's own CSV helpers both ways, validation of bad pairs, the slot table at
DualPipe's published bubble, the compiled graph's timing, memory and messages, and the gain
on a slow network."""

from __future__ import annotations

import csv
import dataclasses
import io as _io
from types import SimpleNamespace

import numpy as np
import pytest

from pipesched import io
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import formula, generate
from pipesched.ops import OVERLAP_F_B, B, F, I, Op
from pipesched.passes.communication import with_communication
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import Network, compile_graph, simulate
from pipesched.slots import slot_table, table_metrics
from pipesched.validation import FUSED, validate

PAIR = Op.fused(Op(0, F, 1), Op(1, B, 0))


# --- the value type ------------------------------------------------------------------------
def test_fused_op_text_round_trips():
    assert str(PAIR) == "(0F1;1B0)OVERLAP_F_B"
    assert Op.parse(str(PAIR)) == PAIR
    assert PAIR.kind is OVERLAP_F_B and PAIR.atoms == (Op(0, F, 1), Op(1, B, 0))
    assert Op(0, F, 1).atoms == (Op(0, F, 1),)
    assert Op.parse(" (2F3;5I1)OVERLAP_F_B ") == Op.fused(Op(2, F, 3), Op(5, I, 1))
    assert hash(Op.parse(str(PAIR))) == hash(PAIR)


@pytest.mark.parametrize("text", ["(0F1)OVERLAP_F_B", "(0F1;1B0)FUSED", "((0F1;1B0)OVERLAP_F_B;2B0)OVERLAP_F_B",
                                  "(0F1;1X0)OVERLAP_F_B", "(0F1;1B0)"])
def test_malformed_fused_text_is_refused(text):
    with pytest.raises(PipeschedError, match="op="):
        Op.parse(text)


def _torch():
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def test_pytorch_action_text_is_ours():
    torch_schedules = _torch()
    action = torch_schedules._Action.from_str(str(PAIR))
    assert action.computation_type == torch_schedules._ComputationType.OVERLAP_F_B
    assert str(action) == str(PAIR)
    assert [str(sub) for sub in action.sub_actions] == ["0F1", "1B0"]


def _torch_dualpipev(p: int, m: int):
    torch_schedules = _torch()
    stages = [SimpleNamespace(submod=None, group_size=p, group_rank=0, num_stages=2 * p) for _ in range(2)]
    return torch_schedules.ScheduleDualPipeV(stages, m)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 11)])
def test_round_trip_through_pytorchs_own_csv_helpers(p, m, tmp_path):
    runtime = _torch_dualpipev(p, m)
    ours = generate("dualpipev", p, m)
    # PyTorch's _dump_csv -> our loader: its OVERLAP_F_B actions are our fused ops
    runtime._dump_csv(tmp_path / "torch.csv", format="compute_only")
    loaded = io.load_schedule(tmp_path / "torch.csv")
    assert loaded.device_ops == ours.device_ops and loaded.placement == ours.placement
    # our CSV -> PyTorch's _load_csv: the same actions, lowered with the same sends as ours
    expected = {rank: [str(action) for action in actions] for rank, actions in runtime.pipeline_order.items()}
    io.save_schedule(ours, tmp_path / "ours.csv")
    runtime._load_csv(tmp_path / "ours.csv", format="compute_only")
    assert {rank: [str(action) for action in actions if action is not None]  # our CSV keeps idle steps empty
            for rank, actions in runtime.pipeline_order.items()} == expected
    # its lowering of what it loaded (PyTorch's _add_send_recv, which takes OVERLAP_F_B's
    # sub-actions) equals ours
    torch_schedules = _torch()
    compute = {rank: [a for a in actions if a is not None] for rank, actions in runtime.pipeline_order.items()}
    owner = ours.placement.replicas[0]
    lowered = torch_schedules._add_send_recv(compute, stage_to_rank=lambda s: owner[s], num_stages=ours.num_stages)
    assert [[str(a) for a in lowered[rank]] for rank in range(p)] == with_communication(ours).text_rows()


def test_grid_and_json_keep_fused_ops():
    schedule = generate("dualpipe", 4, 8)
    for fmt in ("grid", "json"):
        again = io.loads(io.dumps(schedule, fmt), fmt)
        assert again.device_ops == schedule.device_ops


# --- bad pairs -----------------------------------------------------------------------------
def _custom(rows: str) -> Schedule:
    return io.loads(rows, "grid")


def test_halves_on_two_devices_are_refused():
    # 1B0 belongs to device 1, fused on device 0
    schedule = _custom("# placement: 0 1\nd0: 0F0 0F1 (0F2;1B0)OVERLAP_F_B 0B0 0B1 0B2\nd1: 1F0 1F1 1F2 1B1 1B2\n")
    problems = [v for v in validate(schedule) if v.kind == FUSED]
    assert problems and "devices 0, 1" in problems[0].message
    with pytest.raises(PipeschedError, match=r"^op=\(0F2;1B0\)OVERLAP_F_B: its parts belong to devices 0, 1"):
        slot_table(schedule)


def test_halves_that_need_each_other_are_refused():
    schedule = _custom("d0: 0F0 (0F1;0B1)OVERLAP_F_B 0B0\n")
    problems = [v for v in validate(schedule) if v.kind == FUSED]
    assert problems and "its part 0B1 needs the output of 0F1" in problems[0].message
    with pytest.raises(PipeschedError, match=r"^op=\(0F1;0B1\)OVERLAP_F_B: its part 0B1 needs the output"):
        slot_table(schedule)


def test_halves_of_the_wrong_kinds_are_refused():
    schedule = _custom("d0: 0F0 0F1 (0B0;0B1)OVERLAP_F_B\n")
    assert any("kinds (F;B|I)" in v.message for v in validate(schedule) if v.kind == FUSED)
    with pytest.raises(PipeschedError, match=r"^op=\(0B0;0B1\)OVERLAP_F_B: its parts must be of kinds"):
        slot_table(schedule)


def test_bad_pair_on_the_command_line_is_one_line_exit_2(cli, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("d0: 0F0 (0F1;0B1)OVERLAP_F_B 0B0\n")
    result = cli("simulate", str(path), "--stage-costs", str(_costs_file(tmp_path, 1)), "--no-timeline")
    assert result.code == 2
    # the file is validated before anything is simulated: the error names the file and the pair
    assert result.err.startswith(f"pipesched: error: schedule_file={path}: not a valid schedule: fused: "
                                 "(0F1;0B1)OVERLAP_F_B on device 0: its part 0B1 needs the output of 0F1")
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert cli("validate", str(path)).code == 1


def _costs_file(tmp_path, stages: int, extra: str = "") -> object:
    path = tmp_path / "costs.csv"
    header = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes" + (",fb" if extra else "")
    path.write_text(header + "\n" + "".join(f"{s},1,1,1,1,1{extra}\n" for s in range(stages)))
    return path


# --- DualPipe's published bubble ---------------------------------------------------------------
@pytest.mark.parametrize("x", [1.0, 2.0])
@pytest.mark.parametrize(("name", "p"), [("dualpipe", 4), ("dualpipe", 8), ("dualpipe", 16), ("dualpipev", 4),
                                         ("dualpipev", 8)])
def test_tables_idle_the_published_bubble(name, p, x):
    # DualPipe: (p/2-1)(F&B + B - 3W); DualPipeV (2p stages): (p-1)(F&B + B - 3W) in chunk
    # units; F&B = F + B at F = I = W
    costs = StageCosts.slots(x, x, x)
    published = (p // 2 - 1 if name == "dualpipe" else p - 1) * ((x + 2 * x) + 2 * x - 3 * x)
    for m in (2 * p, 4 * p):
        metrics = table_metrics(generate(name, p, m), costs)
        assert max(metrics.idle_per_device) == published
        estimate = formula(name, p, m, costs=costs)
        assert estimate.exact and estimate.idle == published
        assert metrics.makespan == estimate.makespan


@pytest.mark.parametrize("fb_cost", [1.0, 0.8, 0.6])
@pytest.mark.parametrize(("f", "w"), [(1.0, 0.5), (2.0, 1.0), (1.0, 1.0)])
def test_closed_form_is_exact_when_i_equals_f(fb_cost, f, w):
    costs = StageCosts.slots(f, f, w, fb_cost=fb_cost)
    for name, p, m in (("dualpipe", 8, 32), ("dualpipev", 4, 12)):
        estimate = formula(name, p, m, costs=costs)
        metrics = table_metrics(generate(name, p, m), costs)
        assert estimate.exact
        assert max(metrics.idle_per_device) == pytest.approx(estimate.idle)
        assert metrics.makespan == pytest.approx(estimate.makespan)


def test_unfused_option_writes_two_ops_per_pair():
    fused, unfused = generate("dualpipev", 4, 8), generate("dualpipev", 4, 8, fused=0)
    assert unfused.device_atoms == fused.device_atoms
    assert not unfused.has_fused_ops and fused.has_fused_ops
    assert fused.num_ops == unfused.num_ops
    with pytest.raises(PipeschedError, match=r"^fused=2"):
        generate("dualpipev", 4, 8, fused=2)
    # the unfused table runs the pair's ops one after the other and idles less in slots
    assert table_metrics(unfused).makespan < table_metrics(fused).makespan


# --- the compiled graph: one op, both inputs before, both outputs after, memory ----------------
def _pair_rows(schedule: Schedule, device: int):
    graph = compile_graph(schedule, StageCosts.slots().broadcast(schedule.num_stages), None)
    heads = np.flatnonzero((graph.ops.entry_kind != graph.ops.kind) & (graph.ops.entry_head == np.arange(graph.num_ops)))
    head = int(heads[graph.ops.device[heads] == device][0])
    return graph, head, head + 1


def test_pair_holds_its_device_for_its_cost_and_waits_for_both_inputs():
    schedule = generate("dualpipev", 4, 8)
    costs = StageCosts.slots(fb_cost=0.8)
    timeline = slot_table(schedule, costs)
    graph, head, tail = _pair_rows(schedule, 1)
    assert timeline.op_end[head] - timeline.op_start[head] == pytest.approx(0.8 * 3)
    assert timeline.op_start[tail] == timeline.op_end[tail] == timeline.op_end[head]
    # the head waits for what both parts need
    needed = [int(graph.pred_op[e]) for e in range(graph.pred_ptr[head], graph.pred_ptr[head + 1])]
    tail_needs = graph.pred_ptr[tail + 1] - graph.pred_ptr[tail]
    assert tail_needs == 0 and len(needed) >= 2
    assert timeline.op_start[head] >= max(timeline.op_end[needed])
    assert timeline.busy_per_device().sum() == pytest.approx(
        sum(costs.broadcast(8).duration(op) for ops in schedule.device_ops for op in ops))


def test_pair_sends_leave_after_it_and_memory_follows_both_parts():
    schedule = generate("dualpipev", 4, 8)
    costs = StageCosts.uniform(8, output_bytes=1.0, activation_bytes=10.0)
    network = Network.uniform(4, latency=0.5, bandwidth=float("inf"))
    graph = compile_graph(schedule, costs, network)
    timeline = simulate(schedule, costs, network)
    ops = graph.ops
    part = ops.entry_kind != ops.kind
    head_of = ops.entry_head
    for t in range(graph.num_messages):
        producer = int(graph.tr_rel[graph.tr_rel_ptr[t]])
        if part[producer]:
            assert timeline.transfers.start[t] >= timeline.op_end[head_of[producer]] - 1e-12
    # F allocates when the pair starts, B frees when it ends: the trace peaks inside pairs
    assert max(timeline.memory.peak) - timeline.memory.static[0] == pytest.approx(10.0 * table_metrics(schedule).peak_inflight[0])


def test_fused_timeline_draws_one_box_per_pair():
    timeline = slot_table(generate("dualpipev", 4, 8))
    drawn = timeline.drawn()
    heads = np.flatnonzero(timeline.box_kind != timeline.op_kind)
    assert len(heads) == sum(1 for ops in timeline.schedule.device_ops for op in ops if op.parts)
    assert drawn.sum() == sum(len(ops) for ops in timeline.schedule.device_ops)
    assert str(timeline.entry(int(heads[0]))).endswith(")OVERLAP_F_B")
    from pipesched.render.style import op_label

    assert op_label(timeline, int(heads[0]), several_stages=True).count("&") == 1


# --- the cost model ------------------------------------------------------------------------
def test_fused_time_model():
    costs = StageCosts.slots()
    assert costs.fused_time(0, 1.0, 2.0) == 3.0
    assert StageCosts.slots(fb_cost=0.5).fused_time(0, 1.0, 2.0) == 2.0  # never below the longer part
    measured = dataclasses.replace(StageCosts.uniform(2), forward_backward=(2.5, 4.0))
    assert measured.fused_time(1, 1.0, 2.0) == 4.0
    assert measured.duration(Op.fused(Op(0, F, 0), Op(1, B, 1))) == 2.5
    with pytest.raises(PipeschedError, match=r"^fb_cost=0\.2"):
        StageCosts.slots(fb_cost=0.2)


def test_stage_cost_file_fb_column(tmp_path):
    from pipesched.io.stage_costs import dumps_stage_costs, load_stage_costs, parse_stage_costs

    costs = load_stage_costs(_costs_file(tmp_path, 2, extra=",2.5"))
    assert costs.forward_backward == (2.5, 2.5)
    assert parse_stage_costs(dumps_stage_costs(costs)) == costs


# --- the gain on a slow network --------------------------------------------------------------
def test_fused_pairs_on_blocking_and_overlapping_runtimes():
    """On a blocking runtime a fused pair is one step: both receives batched before it and
    both sends after it, as DeepSeek's ``_forward_backward_chunk`` runs it. DualPipe fused
    then runs as fast as its unfused table does with a batch per forward-backward pair, and
    slower than on an overlapping runtime. DualPipeV's sends and receives cross: a blocking
    runtime deadlocks on it, fused or not. On an overlapping runtime the unfused table
    already hides its transfers, and the pair, which waits for both inputs, gains only by
    its compute overlap (fb_cost < 1)."""
    for latency in (0.1, 1.0):
        network = Network.uniform(4, latency=latency, bandwidth=float("inf"))
        times = {}
        for fused in (1, 0):
            schedule = generate("dualpipe", 4, 16, fused=fused)
            costs = StageCosts.uniform(schedule.num_stages, output_bytes=1.0)
            times[fused, True] = simulate(schedule, costs, network).makespan
            times[fused, "fb"] = simulate(schedule, dataclasses.replace(costs, fb_cost=0.7), network).makespan
            graph = compile_graph(schedule, costs, network, overlap=False)
            times[fused, False] = simulate(schedule, costs, network, overlap=False).makespan
            assert graph.blocking_steps == "pair"
            if fused:  # one batch per op deadlocks even with each fused pair one step
                with pytest.raises(PipeschedError, match="deadlocks"):
                    compile_graph(schedule, costs, network, overlap=False, blocking_steps="op")
        assert times[1, False] == pytest.approx(times[0, False])
        assert times[1, False] > times[1, True]
        assert times[1, True] > times[0, True]
        assert times[1, "fb"] < times[0, True]
        for fused in (1, 0):
            with pytest.raises(PipeschedError, match="deadlocks"):
                simulate(generate("dualpipev", 4, 16, fused=fused), StageCosts.uniform(8, output_bytes=1.0), network,
                         overlap=False)


def test_placement_of_custom_pairs():
    # a hand-written V-shaped table with one pair loads, validates and simulates
    schedule = Schedule("pairs", Placement.vshape(2), 2, (
        (Op(0, F, 0), Op(0, F, 1), Op(3, F, 0), Op(3, B, 0), Op.fused(Op(3, F, 1), Op(0, B, 0)), Op(3, B, 1),
         Op(0, B, 1)),
        (Op(1, F, 0), Op(2, F, 0), Op(1, F, 1), Op(2, B, 0), Op(2, F, 1), Op(1, B, 0), Op(2, B, 1), Op(1, B, 1)),
    ))
    assert validate(schedule) == []
    assert slot_table(schedule).makespan > 0
    rows = list(csv.reader(_io.StringIO(io.dumps(schedule, "csv"))))
    assert "(3F1;0B0)OVERLAP_F_B" in rows[0]


def test_memory_aware_partition_counts_a_pairs_parts():
    from pipesched.partition.memory import device_peak_bytes, inflight_per_stage

    fused, unfused = generate("dualpipe", 4, 8), generate("dualpipe", 4, 8, fused=0)
    assert inflight_per_stage(fused) == inflight_per_stage(unfused)
    costs = StageCosts.uniform(4)
    assert device_peak_bytes(fused, costs) == device_peak_bytes(unfused, costs)
