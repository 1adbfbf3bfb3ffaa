"""What real training runs do to a schedule: parameter freezing, activation offload and
per-stage recompute, through the rules, the generators, every level, the reports and the
command line."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from model_helpers import one_device
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments import Point
from pipesched.experiments.freeze_plan import evaluate_freeze_plan, parse_freeze_plan
from pipesched.experiments.simulation import simulate_point
from pipesched.generators import FAMILIES, generate
from pipesched.io import dumps, loads
from pipesched.metrics import offload_exposed, training_work
from pipesched.model import build_stage_costs, load_cluster, load_model
from pipesched.model.freezing import parse_frozen_layers
from pipesched.model.recompute import recompute_modes
from pipesched.ops import B, F, I, O, Op, R, W
from pipesched.passes.freeze import freeze
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.rules import FORWARD_ONLY, INPUT_GRADIENT, ROLES, RULES, TRAINS, stage_roles
from pipesched.schedule import Placement
from pipesched.simulate import Network, compile_graph, run, simulate
from pipesched.simulate.graph import op_queues
from pipesched.slots import slot_table
from pipesched.validation import FROZEN, validate

FREE = {"latency": 0.0, "bandwidth": math.inf}
MODEL = {"model": "llama3-8b", "cluster": "1x8-h100", "tp": 2}


# --- the rules: roles, reduced complete sets, folded memory effects ----------------------------
def test_roles_follow_the_frozen_stages_in_model_order():
    assert stage_roles(4, {0, 1}) == (FORWARD_ONLY, FORWARD_ONLY, TRAINS, TRAINS)
    assert stage_roles(4, {1, 3}) == (TRAINS, INPUT_GRADIENT, TRAINS, INPUT_GRADIENT)
    assert RULES.complete_for(INPUT_GRADIENT) == (frozenset({F, B}), frozenset({F, I}))
    assert RULES.complete_for(FORWARD_ONLY) == (frozenset({F}),)
    assert RULES.describe_complete(FORWARD_ONLY) == "one F (a frozen stage: forward only)"
    # offload and reload come as a pair on stages that keep activations
    assert frozenset({F, B, O, R}) in RULES.accepted_for(TRAINS)
    assert all(O not in kinds for kinds in RULES.accepted_for(FORWARD_ONLY))


def test_every_accepted_set_of_every_role_frees_what_it_takes():
    for role in ROLES:
        for kinds in RULES.accepted_for(role):
            for input_frees in (0.0, 0.4, 1.0):
                device = sum(RULES.memory_for(k, role).bytes(7.0, input_frees, 3.0) for k in kinds)
                host = sum(RULES.memory_for(k, role).host for k in kinds)
                assert device == pytest.approx(0.0) and host == pytest.approx(0.0), (role, kinds)
    # a frozen stage's I frees everything (nothing is kept for a W that does not run)
    assert RULES.memory_for(I, INPUT_GRADIENT).bytes(1.0, 0.3, 1.0) == pytest.approx(-1.0)
    # a stage with no backward keeps nothing from its forward
    assert RULES.memory_for(F, FORWARD_ONLY).bytes(1.0, 0.3) == 0.0
    assert RULES.cost_for(B, INPUT_GRADIENT) == "backward_input" and RULES.cost_for(B, TRAINS) == "backward"


# --- freezing: generators, validation, levels --------------------------------------------------
@pytest.mark.parametrize("family", ["1f1b", "zb-h1"])
def test_first_half_frozen_drops_w_and_input_gradients_and_validates(family):
    p, m = 4, 8
    table = generate(family, p, m, frozen={0, 1})
    assert validate(table) == []
    kinds_of = {stage: {op.kind for _, op in table.ops() if op.stage == stage} for stage in range(p)}
    # no W (and no backward at all) on the frozen stages: nothing before them trains
    assert kinds_of[0] == kinds_of[1] == {F}
    assert W not in kinds_of[0] | kinds_of[1]
    assert kinds_of[2] >= {F} and kinds_of[3] >= {F}
    assert table.frozen == frozenset({0, 1})
    # a W on a frozen stage is a violation naming it
    bad = table.with_ops(((*table.device_ops[0], Op(0, I, 0), Op(0, W, 0)), *table.device_ops[1:]))
    assert [v.kind for v in validate(bad)] == [FROZEN]
    assert "stage 0 is frozen" in validate(bad)[0].message


@pytest.mark.parametrize("family", ["1f1b", "zb-h1"])
def test_freezing_the_first_half_of_the_stages_lowers_the_simulated_time(family):
    # llama3-8b has 34 layers (embedding, 32 blocks, head); uniform over 4 stages: 9|8|8|9,
    # so layers 0-16 are the first two stages
    base = Point(family, p=4, m=8, partition="uniform", **MODEL)
    frozen = simulate_point(base.replace(frozen_layers="0-16"))
    plain = simulate_point(base)
    assert frozen.schedule.frozen == frozenset({0, 1})
    assert frozen.metrics.iteration_time < plain.metrics.iteration_time
    # the balanced partitioner gives the cheaper frozen layers fewer stages: a larger drop
    balanced = simulate_point(base.replace(partition="balanced", frozen_layers="0-16"))
    plain_balanced = simulate_point(base.replace(partition="balanced"))
    assert (plain_balanced.metrics.iteration_time - balanced.metrics.iteration_time
            > plain.metrics.iteration_time - frozen.metrics.iteration_time)


def _reference_makespan(table, f: float = 1.0, i: float = 1.0, w: float = 1.0) -> tuple[float, dict]:
    """Longest path through the reduced table, from the documented dependencies alone: each
    device runs its ops in order; F(s) needs F(s-1); I/B(s) needs F(s) and the I/B(s+1) that
    exists; W(s) needs I(s). B is I + W on a stage that trains, I alone on a frozen one."""
    frozen = table.frozen
    present = {op for _, op in table.ops()}

    def duration(op: Op) -> float:
        if op.kind is B:
            return i if op.stage in frozen else i + w
        return {F: f, I: i, W: w}[op.kind]

    def needs(op: Op) -> list[Op]:
        s, mb = op.stage, op.microbatch
        if op.kind is F:
            return [Op(s - 1, F, mb)] if s > 0 else []
        if op.kind is W:
            return [Op(s, I, mb)]
        found = [Op(s, F, mb)]
        found += [x for x in (Op(s + 1, I, mb), Op(s + 1, B, mb)) if x in present]
        return found

    end: dict[Op, float] = {}
    position = [0] * table.num_devices
    free = [0.0] * table.num_devices
    progress = True
    while progress:
        progress = False
        for device, ops in enumerate(table.device_ops):
            while position[device] < len(ops):
                op = ops[position[device]]
                if any(need not in end for need in needs(op)):
                    break
                start = max([free[device], *(end[need] for need in needs(op))])
                end[op] = free[device] = start + duration(op)
                position[device] += 1
                progress = True
    assert len(end) == len(present), "the reference could not run every op"
    return max(end.values()), end


@pytest.mark.parametrize("family", ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zb-v", "v-half"])
@pytest.mark.parametrize("frozen", [{0}, {0, 1}, {1, 2}, {0, 2}])
def test_slot_table_of_a_frozen_table_equals_an_independent_longest_path(family, frozen):
    table = generate(family, 4, 6, frozen=frozen)
    assert validate(table) == []
    makespan, end = _reference_makespan(table)
    timeline = slot_table(table)
    assert timeline.makespan == makespan
    for row in range(len(timeline)):
        assert timeline.op_end[row] == end[timeline.op(row)]


def test_zero_bubble_families_fill_with_trainable_w_only_and_never_lose_to_the_plain_drop():
    for family in ("zb-h1", "zb-h2", "zb-v"):
        for frozen in ({0, 1}, {0, 1, 2}):
            base = generate(family, 4, 8)
            stages = {s for s in range(base.num_stages) if s < len(frozen) * base.num_stages // 4}
            planned = generate(family, 4, 8, frozen=stages)
            plain = freeze(base, stages)
            assert validate(planned) == []
            assert not any(op.kind is W and op.stage in stages for _, op in planned.ops())
            assert slot_table(planned).makespan <= slot_table(plain).makespan
    # ZB-V's heuristic re-plan beats dropping the ops from its handcrafted table here
    assert slot_table(generate("zb-v", 4, 8, frozen=set(range(4)))).makespan < \
        slot_table(freeze(generate("zb-v", 4, 8), set(range(4)))).makespan


def test_every_family_freezes_into_a_valid_table():
    for name, family in FAMILIES.items():
        p = 4
        table = generate(name, p, 8)
        frozen = set(range(table.num_stages // 2))
        reduced = generate(name, p, 8, frozen=frozen)
        assert validate(reduced) == [], name
        assert slot_table(reduced).makespan <= slot_table(table).makespan, name
        assert family.name == name


def test_frozen_replicated_stages_reduce_no_gradients():
    table = generate("chimera", 4, 4, frozen={0, 1})
    graph = compile_graph(table, StageCosts.uniform(4), Network.uniform(4, **FREE))
    plain = compile_graph(generate("chimera", 4, 4), StageCosts.uniform(4), Network.uniform(4, **FREE))
    from pipesched.timeline import ALLREDUCE

    assert set(plain.tr_stage[plain.tr_kind == ALLREDUCE].tolist()) == {0, 1, 2, 3}
    assert set(graph.tr_stage[graph.tr_kind == ALLREDUCE].tolist()) == {2, 3}


def test_frozen_stages_round_trip_through_grid_text_and_json():
    table = generate("zb-h1", 4, 4, frozen={0, 2})
    for fmt in ("grid", "json"):
        back = loads(dumps(table, fmt), fmt)
        assert back == table and back.frozen == frozenset({0, 2})
    with pytest.raises(PipeschedError, match="cannot mark frozen stages"):
        dumps(table, "csv")


def test_frozen_layers_cost_what_they_still_run():
    model, cluster = load_model("llama3-8b"), load_cluster("1x8-h100")
    placement = Placement.one_per_device(4)
    settings = one_device(seq_len=4096, tensor_parallel=2)
    plain = build_stage_costs(model, placement, cluster, settings, method="uniform")
    costs = build_stage_costs(model, placement, cluster, dataclasses.replace(settings, frozen_layers=tuple(range(17))),
                              method="uniform")
    assert costs.frozen == (True, True, False, False)
    assert plain.frozen is None
    # no backward before the first layer that trains: no activations kept, forward unchanged
    assert costs.activation_bytes[0] == 0.0 and costs.forward[0] == plain.forward[0]
    # frozen parameters keep their weights only (2 of 18 bytes per parameter)
    assert costs.static_bytes[0] == pytest.approx(plain.static_bytes[0] * 2 / 18)
    assert costs.grad_bytes[0] == 0.0
    # the stages that train are costed as before
    assert costs.backward_weight[3] == plain.backward_weight[3]
    # a frozen layer after one that trains keeps what its input gradient needs, not W's inputs
    late = build_stage_costs(model, placement, cluster, dataclasses.replace(settings, frozen_layers=tuple(range(25, 34))),
                             method="uniform")
    assert late.frozen == (False, False, False, True)
    assert 0 < late.activation_bytes[3] < plain.activation_bytes[3]
    assert late.backward_input[3] == plain.backward_input[3]
    assert late.backward_weight[3] < plain.backward_weight[3]


def test_frozen_layer_text():
    assert parse_frozen_layers("0-3, 8", 10) == (0, 1, 2, 3, 8)
    assert parse_frozen_layers("50%", 10) == parse_frozen_layers("0.5", 10) == (0, 1, 2, 3, 4)
    assert parse_frozen_layers("", 10) == ()
    with pytest.raises(PipeschedError, match="frozen_layers=0-40: outside the 34 layers"):
        parse_frozen_layers("0-40", 34)
    with pytest.raises(PipeschedError, match="goes backwards"):
        parse_frozen_layers("9-3", 34)


# --- offload -----------------------------------------------------------------------------------
def test_offload_pass_places_reloads_ahead_of_their_backward():
    table = offload(generate("1f1b", 2, 3), OffloadPolicy(stages=(0,), prefetch=1))
    assert validate(table) == []
    row = [str(op) for op in table.device_ops[0]]
    # each offload right after its forward; each reload one compute op ahead of its backward
    for mb in range(3):
        assert row[row.index(f"0F{mb}") + 1] == f"0O{mb}"
        backward = row.index(f"0B{mb}")
        compute_between = [x for x in row[row.index(f"0R{mb}") + 1:backward] if x[1] not in "OR"]
        assert len(compute_between) <= 1
    half = offload(generate("gpipe", 2, 4), OffloadPolicy(fraction=0.5))
    assert sorted(op.microbatch for _, op in half.ops() if op.kind is O) == [1, 1, 3, 3]
    # a stage with no backward keeps nothing to offload
    frozen = offload(generate("1f1b", 2, 2, frozen={0}), OffloadPolicy())
    assert not any(op.kind is O and op.stage == 0 for _, op in frozen.ops())


def test_host_link_ops_run_on_a_second_queue_beside_compute():
    table = offload(generate("gpipe", 2, 4), OffloadPolicy(stages=(0,), prefetch=0))
    graph = compile_graph(table, StageCosts.uniform(2, activation_bytes=2.0),
                          Network.uniform(2, **FREE, host_bandwidth=1.0))
    assert graph.side_queues == 1
    host = np.array([rule.kind in (O, R) for rule in table.rules])[graph.ops.kind]
    assert set(graph.op_queue[~host].tolist()) == {0, 1}
    assert len(set(graph.op_queue[host].tolist())) == 1 and graph.op_queue[host].min() >= graph.num_resources - 2
    # queues: program order within each; device 0's host queue holds its 8 host-link ops
    assert graph.queue_offsets.tolist()[-1] == graph.num_ops
    timeline = run(graph)
    first_o = int(np.flatnonzero(host)[0])
    # the first offload (0O0) runs while device 0 computes 0F1: two ops at once on one device
    f1 = next(row for row in range(len(timeline)) if timeline.op(row) == Op(0, F, 1))
    assert timeline.op_start[first_o] < timeline.op_end[f1] and timeline.op_start[f1] < timeline.op_end[first_o]
    # one queue per device when nothing offloads: today's arrays exactly
    plain = compile_graph(generate("gpipe", 2, 4), StageCosts.uniform(2), Network.uniform(2, **FREE))
    assert plain.side_queues == 0 and plain.op_queue.tolist() == plain.ops.device.tolist()
    queue, rows, offsets, side = op_queues(plain.ops, np.zeros(len(RULES), np.int8), 2, 99)
    assert side == 0 and rows.tolist() == list(range(plain.num_ops))
    assert queue.tolist() == plain.ops.device.tolist() and offsets.tolist() == plain.ops.device_offsets.tolist()


def test_offloading_every_activation_of_a_stage_lowers_its_peak_by_the_activations_held():
    # GPipe, 2 devices, 4 microbatches, M = 2 bytes per stage-microbatch; with no offload
    # device 0 holds all 4 after its forwards. A host link fast enough to be free, reloads
    # issued just before their backward: device 0 holds one stage-microbatch at a time.
    costs = StageCosts.uniform(2, activation_bytes=2.0)
    network = Network.uniform(2, **FREE, host_bandwidth=math.inf)
    base = generate("gpipe", 2, 4)
    plain = simulate(base, costs, network)
    moved = simulate(offload(base, OffloadPolicy(stages=(0,), prefetch=0)), costs, network)
    assert plain.memory.peak == (8.0, 8.0)
    assert moved.memory.peak[0] == 2.0  # the one being computed
    assert plain.memory.peak[0] - moved.memory.peak[0] == 3 * 2.0  # the other three it held
    assert moved.memory.peak[1] == plain.memory.peak[1]
    assert moved.makespan == plain.makespan
    # host memory holds all four between their offload and their reload
    assert moved.host_memory.peak == (8.0, 0.0)
    assert moved.host_memory.values[0][-1] == 0.0


def test_a_slow_host_link_raises_the_iteration_time_by_exactly_the_exposed_transfers():
    # F = 1, B = 2 (I = W = 1); 2 bytes at 1 B/s: each offload and reload takes 2 s. By hand:
    # offloads 1..3, 3..5, 5..7, 7..9; reload 0 waits for them (9..11) and B(0,0) for it
    # (11..13, 4 s late: its gradient was there at 7); each later reload is issued when the
    # backward before it ends and runs 2 s exposed: 13..15, 17..19, 21..23. 15 s -> 25 s.
    costs = StageCosts.uniform(2, activation_bytes=2.0)
    network = Network.uniform(2, **FREE, host_bandwidth=1.0)
    base = generate("gpipe", 2, 4)
    plain = simulate(base, costs, network)
    moved = simulate(offload(base, OffloadPolicy(stages=(0,), prefetch=0)), costs, network)
    exposed = offload_exposed(moved)
    assert (plain.makespan, moved.makespan) == (15.0, 25.0)
    assert exposed.tolist() == [10.0, 0.0]
    assert moved.makespan - plain.makespan == exposed.sum()
    work = training_work(moved)
    assert work.offloaded == (4, 0) and work.offloaded_bytes == (8.0, 0.0) and work.host_link_busy_s == (16.0, 0.0)
    # compute time stays compute time: the host link is not busy compute
    assert moved.busy_per_device().tolist() == plain.busy_per_device().tolist()
    # the report says a reload waited for the backward that issues it
    from pipesched.waits import WAIT_DEVICE, waited_for

    rows = {moved.op(row): row for row in range(len(moved))}
    waits = waited_for(moved)
    assert (waits.cause[rows[Op(0, R, 1)]], waits.ref[rows[Op(0, R, 1)]]) == (WAIT_DEVICE, rows[Op(0, B, 0)])


def test_a_link_fast_enough_hides_the_reloads_behind_compute():
    costs = StageCosts.uniform(2, forward=1.0, backward_input=1.0, backward_weight=1.0, activation_bytes=1.0)
    base = generate("1f1b", 2, 8)
    plain = simulate(base, costs, Network.uniform(2, **FREE))
    hidden = simulate(offload(base, OffloadPolicy(stages=(0,), prefetch=1)), costs,
                      Network.uniform(2, **FREE, host_bandwidth=4.0))
    assert hidden.makespan == plain.makespan
    assert offload_exposed(hidden).sum() == 0.0


def test_offload_without_a_host_link_is_refused():
    table = offload(generate("gpipe", 2, 2), OffloadPolicy())
    with pytest.raises(PipeschedError, match="has no host link"):
        simulate(table, StageCosts.uniform(2), Network.uniform(2, **FREE))
    # the cpu preset is the host itself
    cpu = Point("gpipe", p=2, m=2, model="tiny", cluster="1x8-h100", tp=1, offload="all")
    assert simulate_point(cpu).timeline.host_memory is not None
    with pytest.raises(PipeschedError, match="no host link"):
        simulate_point(cpu.replace(cluster=_cpu_cluster()))


def _cpu_cluster():
    from pipesched.model.clusters import homogeneous_cluster
    from pipesched.model.devices import load_device

    return homogeneous_cluster(load_device("cpu"), 8)


def test_the_device_presets_name_their_host_links():
    from pipesched.model.devices import DEVICES

    assert DEVICES["h100-sxm"].host_bandwidth == pytest.approx(0.85 * 63.0e9)
    assert DEVICES["a100-80gb"].host_bandwidth == pytest.approx(0.85 * 31.5e9)
    assert DEVICES["gh200"].host_bandwidth == pytest.approx(0.85 * 450e9)
    assert DEVICES["cpu"].host_bandwidth == 0.0
    network = Network.from_cluster(load_cluster("1x8-h100"))
    assert network.host_bandwidth[0] == DEVICES["h100-sxm"].host_bandwidth
    assert network.host_capacity[0] == 250e9


# --- per-stage recompute ------------------------------------------------------------------------
def test_recompute_per_stage_matches_the_global_setting_when_all_stages_agree():
    model, cluster = load_model("llama3-8b"), load_cluster("1x8-h100")
    placement = Placement.one_per_device(4)
    for mode in ("none", "selective", "full"):
        settings = one_device(seq_len=4096, tensor_parallel=2, recompute=mode)
        assert build_stage_costs(model, placement, cluster, settings, recompute=(mode,) * 4) == \
            build_stage_costs(model, placement, cluster, settings)
    # and through a point at every level, with the per-stage text
    for text in ("full", "full,full,full,full", "full:0-3"):
        point = Point("1f1b", p=4, m=8, recompute=text, **MODEL)
        assert simulate_point(point).metrics.iteration_time == \
            simulate_point(Point("1f1b", p=4, m=8, recompute="full", **MODEL)).metrics.iteration_time


def test_recompute_per_stage_moves_forward_time_into_the_backward_and_frees_memory():
    model, cluster = load_model("llama3-8b"), load_cluster("1x8-h100")
    settings = one_device(seq_len=4096, tensor_parallel=2)
    placement = Placement.one_per_device(4)
    none = build_stage_costs(model, placement, cluster, settings, method="uniform")
    mixed = build_stage_costs(model, placement, cluster, settings, method="uniform",
                              recompute=recompute_modes("full:0-1", 4))
    assert recompute_modes("full:0-1", 4) == ("full", "full", "none", "none")
    assert mixed.activation_bytes[0] < none.activation_bytes[0]
    assert mixed.backward_input[0] > none.backward_input[0]
    assert mixed.forward[0] == none.forward[0]
    assert mixed.recompute_s[0] > 0 and mixed.recompute_s[3] == 0 == none.recompute_s[0]
    assert mixed.backward_input[0] - none.backward_input[0] == pytest.approx(mixed.recompute_s[0])
    assert (mixed.activation_bytes[2], mixed.backward_input[3]) == (none.activation_bytes[2], none.backward_input[3])
    # the memory trace follows: device 0 peaks lower, device 3 does not change
    base = Point("1f1b", p=4, m=8, partition="uniform", recompute="none", **MODEL)
    plain, recomputed = simulate_point(base), simulate_point(base.replace(recompute="full:0-1"))
    assert recomputed.metrics.peak_memory[0] < plain.metrics.peak_memory[0]
    assert recomputed.metrics.peak_memory[3] == plain.metrics.peak_memory[3]
    point_costs = base.replace(recompute="full:0-1").setup().costs_for(recomputed.schedule)
    assert recomputed.metrics.training.recompute_s[0] == pytest.approx(8 * point_costs.recompute_s[0])
    assert plain.metrics.training.recompute_s == (0.0,) * 4


def test_recompute_text():
    assert recompute_modes("none,full,none,selective", 4) == ("none", "full", "none", "selective")
    assert recompute_modes("full:2-3", 4) == ("none", "none", "full", "full")
    for bad, fragment in (("fast", "recompute='fast'"), ("full,none", "2 modes for 4 stages"),
                          ("full:0-9", "outside the 4 stages"), ("full:0-1,none:1", "named twice")):
        with pytest.raises(PipeschedError, match=fragment):
            recompute_modes(bad, 4)


# --- adaptive freezing ---------------------------------------------------------------------------
PLAN = "start,end,frozen_layers\n0,1000,\n1000,3000,0-8\n3000,4000,\"0-8,9-16\"\n"


def test_a_freeze_plan_is_evaluated_range_by_range():
    plan = parse_freeze_plan(PLAN)
    assert [(r.start, r.end, r.frozen_layers) for r in plan.ranges] == \
        [(0, 1000, ""), (1000, 3000, "0-8"), (3000, 4000, "0-8,9-16")]
    points = [Point(name, p=4, m=8, **MODEL) for name in ("1f1b", "zb-h1")]
    result = evaluate_freeze_plan(plan, points)
    times = [r.iteration_time for r in result.ranges]
    # each range freezes more; the balanced partition moves layers onto the cheaper frozen
    # ones, and in the last range stage 0 holds frozen layers only
    assert times[0] > times[1] > times[2]
    assert [sorted(r.best.point.build_schedule().frozen) for r in result.ranges] == [[], [], [0]]
    assert result.total_s == pytest.approx(1000 * times[0] + 2000 * times[1] + 1000 * times[2])
    alone = result.total_per_candidate()
    assert result.total_s <= min(alone.values())
    assert result.to_dict()["ranges"][2]["frozen_stages"] == [0]


@pytest.mark.parametrize(("text", "fragment"), [
    ("start,end,frozen_layers\n0,100,\n50,200,0-3\n", "goes back over"),
    ("start,end,frozen_layers\n100,50,\n", "end=50: the steps go backwards"),
    ("start,end,frozen_layers\n0,100,\n150,200,\n", "leaves a gap"),
    ("step,frozen\n0,\n", "header"),
    ("start,end,frozen_layers\nx,100,\n", "start='x'"),
])
def test_bad_freeze_plans_name_the_problem(text, fragment):
    with pytest.raises(PipeschedError, match=fragment):
        parse_freeze_plan(text, source="plan.csv")


# --- the command line ----------------------------------------------------------------------------
COSTS = ("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes,frozen\n"
         "0,1,1,1,2e9,1e6,1\n1,1,1,1,2e9,1e6,1\n2,1,1,1,2e9,1e6,0\n3,1,1,1,2e9,1e6,0\n")


def test_simulate_shows_frozen_offloaded_and_recomputed_work(cli, tmp_path):
    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS)
    result = cli("simulate", "zb-h1", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--offload", "2-3",
                 "--host-bandwidth", "4e9", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert data["frozen_stages"] == [0, 1]
    assert data["host_peak_memory_bytes"][0] == 0 and data["host_peak_memory_bytes"][2] > 0
    assert data["training_per_device"]["offloaded"] == [0, 0, 8, 8]
    text = cli("simulate", "zb-h1", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--offload", "2-3",
               "--host-bandwidth", "4e9", "--no-timeline")
    assert text.code == 0 and "frozen stages" in text.out and "0 (no backward)" in text.out
    assert "offload exposed s" in text.out and "host peak" in text.out
    recompute = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100",
                    "-t", "2", "--recompute", "full:0-1", "--json")
    assert recompute.code == 0, recompute
    assert json.loads(recompute.out)["training_per_device"]["recompute_s"][0] > 0
    # with nothing frozen, offloaded or recomputed there is no training table
    bare = tmp_path / "bare.csv"
    bare.write_text(COSTS.replace(",frozen", "").replace(",1\n", "\n").replace(",0\n", "\n"))
    plain = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", str(bare), "--no-timeline",
                "--frozen-layers", "")
    assert plain.code == 0 and "training work per device" not in plain.out


def test_compare_shows_the_training_work_and_a_freeze_plan(cli, tmp_path):
    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS)
    result = cli("compare", "--schedules", "1f1b,zb-h1", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert data["training_per_device"]["1f1b"]["frozen_stages"] == [[0], [1], [], []]
    plan = tmp_path / "plan.csv"
    plan.write_text("start,end,frozen_layers\n0,10,\n10,20,0-1\n")
    text = cli("compare", "--schedules", "1f1b,zb-h1", "-p", "4", "-m", "8", "--stage-costs", str(tmp_path / "c2.csv"),
               "--freeze-plan", str(plan))
    assert text.code == 2  # the cost file does not exist
    (tmp_path / "c2.csv").write_text(COSTS.replace(",frozen", "").replace(",1\n", "\n").replace(",0\n", "\n"))
    text = cli("compare", "--schedules", "1f1b,zb-h1", "-p", "4", "-m", "8", "--stage-costs", str(tmp_path / "c2.csv"),
               "--freeze-plan", str(plan))
    assert text.code == 0, text
    assert "total:" in text.out and "0..9" in text.out and "10..19" in text.out


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--frozen-layers", "0-99"], ["frozen_layers=0-99", "outside the 34 layers"]),
    (["--frozen-layers", "0-x"], ["frozen_layers='0-x'"]),
    (["--offload", "all", "--cluster", "CPU"], ["no host link"]),
    (["--offload", "all", "--host-memory", "1MiB"], ["offload=all", "host memory"]),
    (["--offload", "0-9"], ["offload=0-9", "outside"]),
    (["--recompute", "full:0-9"], ["recompute=0-9", "outside"]),
])
def test_bad_training_input_is_one_line(cli, tmp_path, argv, fragments):
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("name: cpus\nnodes: [{count: 1, devices_per_node: 8, device: cpu}]\n"
                   "intra_node: {bandwidth: 10 GB/s}\ninter_node: {bandwidth: 1 GB/s}\n")
    argv = [str(cpu) if arg == "CPU" else arg for arg in argv]
    cluster = [] if "--cluster" in argv else ["--cluster", "1x8-h100"]
    result = cli("simulate", "1f1b", "-p", "4", "-m", "4", "--model", "llama3-8b", "-t", "2", *cluster, *argv)
    assert_one_line_error(result, *fragments)


def test_a_freeze_plan_whose_steps_go_backwards_is_one_line(cli, tmp_path):
    plan = tmp_path / "plan.csv"
    plan.write_text("start,end,frozen_layers\n0,100,\n100,50,0-3\n")
    result = cli("simulate", "1f1b", "-p", "4", "-m", "4", "--freeze-plan", str(plan))
    assert_one_line_error(result, "end=50", "backwards")


# --- pictures: the offload stream and the host memory curve ---------------------------------------
def _offloaded_timeline():
    costs = StageCosts.uniform(2, activation_bytes=2.0 * 2**30)
    network = Network.uniform(2, **FREE, host_bandwidth=2.0 * 2**30)
    return simulate(offload(generate("1f1b", 2, 4), OffloadPolicy(stages=(0,))), costs, network)


def test_pictures_draw_the_offload_stream_and_host_memory(tmp_path):
    from rich.console import Console

    from pipesched.render.gantt import gantt_figure
    from pipesched.render.html import timeline_data
    from pipesched.render.summary import summarize
    from pipesched.render.terminal import timeline_view
    from pipesched.render.trace import trace_document

    timeline = _offloaded_timeline()
    host_rows = int((~timeline.on_compute).sum())
    assert host_rows == 8
    # Gantt: every op drawn once, a "d0 host link" row
    built = gantt_figure([timeline])
    assert built.op_boxes == len(timeline)
    names = [tick.get_text() for tick in built.figure.axes[0].get_yticklabels()]
    assert "d0 host link" in names and "d1 host link" not in names
    # trace: a host-link thread on device 0 with the eight host ops, and a host memory counter
    events = trace_document([timeline])["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    host_tid = [key for key, name in threads.items() if name == "host link"]
    assert len(host_tid) == 1
    assert sum(1 for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) == host_tid[0]) == host_rows
    assert any(e.get("name") == "host memory" and e["args"]["bytes"] > 0 for e in events if e.get("ph") == "C")
    # HTML data: the host lanes, which ops run there, the host memory curve in the memory unit
    data = timeline_data(timeline, summarize(timeline))
    assert data["hostLanes"] == [0] and sum(data["onHost"]) == host_rows
    assert max(data["hostMemory"]["peak"]) > 0 and data["memory"]["unit"] == "GiB"
    # terminal: an h0 row under d0
    console = Console(width=100, color_system=None)
    with console.capture() as out:
        console.print(timeline_view(timeline, width=100))
    rows = out.get().splitlines()
    assert rows[2].startswith("h0") and rows[1].startswith("d0")


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_draws_the_host_link_row_and_host_memory_in_a_browser(tmp_path):
    import shutil

    from pipesched.render.views import write_views
    from test_report_browser import CHROMIUM, browser_or_fail

    timeline = _offloaded_timeline()
    path = tmp_path / "offload.html"
    write_views([timeline], html=path, title="offload")
    sync_playwright = browser_or_fail()
    executable = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready=true]", timeout=15_000)
            assert page.locator("[data-op]").count() == len(timeline)
            assert page.locator("text.link-label", has_text="d0 host link").count() == 1
            assert page.locator("[data-host-memory-device]").count() == 1
            # host-link boxes sit in the thin row below the devices, not on device 0's row
            first = page.locator("[data-op]").nth(0).bounding_box()
            offload_row = next(row for row in range(len(timeline)) if not timeline.on_compute[row])
            host_box = page.locator("[data-op]").nth(offload_row).bounding_box()
            assert host_box["y"] > first["y"] + first["height"] and host_box["height"] < first["height"]
        finally:
            browser.close()
    assert problems == []


def test_batched_runs_of_an_offloading_graph_equal_single_runs():
    from pipesched.simulate import run_batch

    table = offload(generate("zb-h1", 4, 6), OffloadPolicy(fraction=0.5))
    graph = compile_graph(table, StageCosts.uniform(4, activation_bytes=3.0, output_bytes=1.0),
                          Network.uniform(4, latency=0.1, bandwidth=10.0, host_bandwidth=2.0))
    scaled = np.stack([graph.op_duration, 1.5 * graph.op_duration])
    batch = run_batch(graph, scaled, critical=True)
    assert batch.makespan.tolist() == [run(graph).makespan, run(graph, op_durations=scaled[1]).makespan]


def test_show_validate_and_stage_cost_files_carry_frozen_stages(cli, tmp_path):
    result = cli("show", "1f1b", "-p", "4", "-m", "4", "--frozen-stages", "0-1", "-o", str(tmp_path / "t.txt"))
    assert result.code == 0
    assert cli("validate", str(tmp_path / "t.txt")).code == 0
    assert "# frozen: 0 1" in (tmp_path / "t.txt").read_text()
    assert_one_line_error(cli("show", "1f1b", "-p", "4", "-m", "4", "--frozen-stages", "0-9"),
                          "frozen-stages=0-9", "outside the 4 stages")
    from pipesched.io.stage_costs import dumps_stage_costs, parse_stage_costs

    costs = parse_stage_costs(COSTS)
    assert costs.frozen_stages == frozenset({0, 1})
    assert parse_stage_costs(dumps_stage_costs(costs)) == costs
    with pytest.raises(PipeschedError, match="frozen=2"):
        parse_stage_costs(COSTS.replace("2e9,1e6,1\n1,", "2e9,1e6,2\n1,"))


def test_partition_rebalances_for_frozen_layers(cli):
    argv = ("partition", "--model", "llama3-8b", "--device", "h100-sxm", "-p", "4", "-t", "2", "-s", "4096", "--json")
    plain = json.loads(cli(*argv).out)
    frozen = json.loads(cli(*argv, "--frozen-layers", "0-16").out)
    assert frozen["sizes"][0] > plain["sizes"][0]
    assert frozen["stages"][0]["frozen"] and not plain["stages"][0]["frozen"]
    assert frozen["bottleneck_s"] < plain["bottleneck_s"]
    recomputed = json.loads(cli(*argv, "--recompute", "full:0,none").out)
    assert [stage["recompute"] for stage in recomputed["stages"]] == ["full", "none", "none", "none"]


def test_real_runs_refuse_frozen_and_offloading_tables():
    from pipesched.runtime.runs import run_schedules

    with pytest.raises(PipeschedError, match="frozen stages"):
        run_schedules([generate("1f1b", 2, 2, frozen={0})], load_model("tiny"))
    with pytest.raises(PipeschedError, match="offloads activations"):
        run_schedules([offload(generate("1f1b", 2, 2), OffloadPolicy())], load_model("tiny"))
