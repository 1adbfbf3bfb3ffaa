"""The phase model of a layer's chunks and the overlapped forward-backward pair
(``pipesched.model.phases``), and the pair in the stage costs built from a model."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.enums import Group
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.model import (
    ModelSpec,
    TrainingSettings,
    build_stage_costs,
    homogeneous_cluster,
    load_cluster,
    load_device,
    load_model,
)
from pipesched.model.clusters import parse_cluster
from pipesched.model.phases import (
    COMPUTE,
    LINK,
    Phase,
    chunk_pair,
    layer_phases,
    overlapped,
    pair,
    serial_time,
)
from pipesched.model.stages import pair_partners
from pipesched.model.transformer import (
    COMBINE,
    DISPATCH,
    MLP,
    CollectiveCost,
    KernelCost,
    LayerOps,
    layer_costs,
    layer_ops,
)
from pipesched.ops import B, F
from pipesched.partition import device_peak_bytes
from pipesched.schedule import Placement
from pipesched.slots import slot_table
from pipesched.validation import validate

H100 = load_device("h100-sxm")
# a small MoE: 4 blocks, the first dense, 8 routed experts of hidden 32 (top-2), 1 shared
SMALL_MOE = ModelSpec(name="moe", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                      vocab_size=256, num_experts=8, experts_per_token=2, gated_mlp=True, moe_ffn_hidden_size=32,
                      num_shared_experts=1, first_dense_layers=1)


def _random_chunk(rng: np.random.Generator, phases: int) -> tuple[Phase, ...]:
    return tuple(Phase(COMPUTE if rng.random() < 0.6 else LINK, float(rng.exponential(1.0))) for _ in range(phases))


@pytest.mark.parametrize("seed", range(40))
def test_pair_lies_between_its_longer_part_and_the_two_back_to_back(seed):
    rng = np.random.default_rng(seed)
    forward, backward = _random_chunk(rng, int(rng.integers(1, 9))), _random_chunk(rng, int(rng.integers(1, 9)))
    fraction = float(rng.choice([0.0, 20 / 132, 0.5]))
    cost = pair(forward, backward, comm_sm_fraction=fraction)
    compute = sum(p.seconds for p in (*forward, *backward) if p.resource is COMPUTE)
    comm = sum(p.seconds for p in (*forward, *backward) if p.resource is LINK)
    longer = max(compute, comm, serial_time(forward), serial_time(backward))
    assert longer * (1 - 1e-9) <= cost.pair_s <= (serial_time(forward) + serial_time(backward)) * (1 + 1e-9)
    assert cost.pair_comm_s == pytest.approx(comm)
    assert 0.0 <= cost.pair_hidden_comm_s <= comm * (1 + 1e-9)


def test_communication_inside_the_other_microbatchs_compute_is_fully_hidden():
    # A: attention 2, its dispatch 1, experts 2, its combine 1; B's backward computes three
    # phases of 3: each of A's all-to-alls runs inside one of them
    forward = (Phase(COMPUTE, 2.0), Phase(LINK, 1.0), Phase(COMPUTE, 2.0), Phase(LINK, 1.0))
    backward = (Phase(COMPUTE, 3.0),) * 3
    cost = pair(forward, backward, comm_sm_fraction=0.0)
    assert cost.pair_hidden_comm_s == pytest.approx(2.0)
    assert cost.exposed_comm_s == pytest.approx(0.0)
    assert cost.pair_s == pytest.approx(13.0)  # all compute, one stream: 4 + 9


def test_without_communication_the_pair_is_forward_plus_backward_even_with_sms_taken():
    forward, backward = (Phase(COMPUTE, 3.0), Phase(COMPUTE, 1.0)), (Phase(COMPUTE, 2.5),)
    assert pair(forward, backward, comm_sm_fraction=0.5).pair_s == pytest.approx(6.5)


def test_sms_taken_by_communication_slow_the_compute_beside_it():
    # F computes 2 then sends 1; B computes 3. During the send B has half the SMs: it gets
    # 0.5 of its work done in that second, then 2.5 more at full speed: 2 + 1 + 2.5
    forward, backward = (Phase(COMPUTE, 2.0), Phase(LINK, 1.0)), (Phase(COMPUTE, 3.0),)
    assert pair(forward, backward, comm_sm_fraction=0.5).pair_s == pytest.approx(5.5)
    assert pair(forward, backward).pair_s == pytest.approx(5.0)


def test_exposed_communication_is_what_no_compute_covers():
    # the backward's last all-to-all comes after every compute phase of both: exposed
    forward = (Phase(COMPUTE, 1.0),)
    backward = (Phase(COMPUTE, 1.0), Phase(LINK, 2.0))
    cost = pair(forward, backward)
    # B's compute first, then A's beside B's send: 1 + 2 (A's compute first would give 4)
    assert cost.pair_s == pytest.approx(3.0)
    assert cost.pair_hidden_comm_s == pytest.approx(1.0)
    assert cost.exposed_comm_s == pytest.approx(1.0)


def test_overlapped_phases_keep_each_part_in_order():
    run = overlapped((Phase(COMPUTE, 1.0), Phase(LINK, 2.0), Phase(COMPUTE, 1.0)), (Phase(LINK, 1.0),))
    for starts, ends in zip(run.start, run.end, strict=True):
        assert all(ends[k] <= starts[k + 1] + 1e-12 for k in range(len(starts) - 1))
    assert run.makespan == pytest.approx(4.0)


def test_bad_phases_are_refused():
    with pytest.raises(PipeschedError, match="phase seconds"):
        pair((Phase(COMPUTE, -1.0),), ())
    with pytest.raises(PipeschedError, match="comm_sm_fraction"):
        pair((Phase(COMPUTE, 1.0),), (), comm_sm_fraction=1.0)
    with pytest.raises(PipeschedError, match="comm_sm_fraction"):
        dataclasses.replace(H100, comm_sm_fraction=-0.1)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_layers_chunks_sum_to_its_costs(recompute):
    settings = TrainingSettings(seq_len=512, tensor_parallel=2, recompute=recompute)
    model = load_model("tiny")
    for ops, cost in zip(layer_ops(model, H100, settings), layer_costs(model, H100, settings), strict=True):
        phases = layer_phases(ops, full_recompute=recompute == "full")
        assert serial_time(phases.forward) == pytest.approx(cost.forward_s, rel=1e-12)
        assert serial_time(phases.backward) == pytest.approx(cost.backward_input_s + cost.backward_weight_s,
                                                             rel=1e-12)


def test_a_tensor_parallel_layers_all_reduces_hide_behind_the_other_microbatch():
    settings = TrainingSettings(seq_len=2048, tensor_parallel=4)
    ops = layer_ops(load_model("llama3-8b"), H100, settings)[1]
    layer = layer_phases(ops)
    cost = chunk_pair([layer], [layer], comm_sm_fraction=H100.comm_sm_fraction)
    comm = sum(c.forward_s + c.backward_s for c in ops.collectives)
    assert cost.pair_comm_s == pytest.approx(comm)
    assert cost.pair_hidden_comm_s > 0.5 * comm
    assert cost.compute_s <= cost.pair_s < cost.forward_s + cost.backward_s


def _moe_layer() -> LayerOps:
    """A hand-made MoE layer: attention, dispatch, experts, combine, each phase's kernels
    and its all-to-all (in F and in I), in seconds."""
    def kernel(name, phase, f, i, w):
        return KernelCost(name, 0, 0, 0, 0, 0, 0, f, i, w, False, phase)
    kernels = (kernel("attention", "attention", 3.0, 3.0, 1.0), kernel("permute", DISPATCH, 0.1, 0.1, 0.0),
               kernel("experts", MLP, 4.0, 4.0, 4.0), kernel("unpermute", COMBINE, 0.1, 0.1, 0.0))
    collectives = (CollectiveCost("dispatch", 1, Group.EXPERT, 1.5, 0.0, phase=DISPATCH),
                   CollectiveCost("combine", 1, Group.EXPERT, 1.5, 0.0, phase=COMBINE),
                   CollectiveCost("dispatch grad", 1, Group.EXPERT, 0.0, 1.5, phase=DISPATCH),
                   CollectiveCost("combine grad", 1, Group.EXPERT, 0.0, 1.5, phase=COMBINE))
    cost = layer_costs(load_model("tiny"), H100, TrainingSettings(seq_len=128))[1]
    cost = dataclasses.replace(cost, forward_s=10.2, backward_input_s=10.2, backward_weight_s=5.0, recompute_s=0.0)
    return LayerOps(cost, kernels, collectives)


def test_a_moe_layers_phases_follow_deepseeks_order():
    layer = layer_phases(_moe_layer())
    assert [p.name for p in layer.forward] == ["attention F", "dispatch F", "dispatch", "mlp F", "combine F", "combine"]
    assert [p.name for p in layer.backward] == ["combine I", "combine grad", "mlp I", "dispatch I",
                                                "dispatch grad", "mlp W", "attention I", "attention W"]
    # the experts' weight gradient runs beside the dispatch's backward all-to-all
    assert [p.beside for p in layer.backward] == [False] * 5 + [True, False, False]
    assert overlapped(layer.backward).makespan == pytest.approx(15.2 - 1.5)
    assert serial_time(layer.forward) == pytest.approx(10.2)
    assert serial_time(layer.backward) == pytest.approx(15.2)


def test_moe_pair_hides_most_all_to_all():
    layer = layer_phases(_moe_layer())
    one = chunk_pair([layer], [layer])
    four = chunk_pair([layer] * 4, [layer] * 4)
    assert one.pair_comm_s == pytest.approx(6.0) and four.pair_comm_s == pytest.approx(24.0)
    for cost in (one, four):
        # most of the all-to-all hides behind the other microbatch's compute, and the pair
        # lies between all compute on one stream and the two chunks back to back
        assert cost.pair_hidden_comm_s / cost.pair_comm_s >= 0.75
        assert cost.compute_s - 1e-9 <= cost.pair_s < cost.forward_s + cost.backward_s


def test_pipeline_sends_run_on_the_communication_stream():
    layer = layer_phases(_moe_layer())
    plain = chunk_pair([layer], [layer])
    sent = chunk_pair([layer], [layer], forward_send_s=0.5, backward_send_s=0.5)
    assert sent.pair_comm_s == pytest.approx(plain.pair_comm_s + 1.0)
    assert plain.pair_s <= sent.pair_s <= plain.pair_s + 1.0 + 1e-9


@pytest.mark.slow
def test_model_stage_costs_carry_the_computed_pair():
    settings = TrainingSettings(micro_batch_size=4, seq_len=512, tensor_parallel=2, expert_parallel=4)
    costs = build_stage_costs(SMALL_MOE, Placement.bidirectional(2), homogeneous_cluster(H100, 16, devices_per_node=2),
                              settings)
    assert costs.forward_backward is not None
    for s, partner in enumerate(pair_partners(Placement.bidirectional(2))):
        forward, backward = costs.forward[s], costs.full_backward(partner)
        assert costs.fused_time(s, forward, backward) < forward + backward
        assert costs.forward_backward[s] >= max(forward, backward)


@pytest.mark.parametrize(("family", "p", "m"), [("dualpipe", 4, 8), ("dualpipe", 8, 16), ("dualpipev", 4, 8)])
def test_pair_partners_are_the_stages_dualpipe_pairs(family, p, m):
    schedule = generate(family, p, m)
    partners = pair_partners(schedule.placement)
    pairs = [(op.parts[0].stage, op.parts[1].stage) for ops in schedule.device_ops for op in ops if op.parts]
    assert pairs and all(backward == partners[forward] for forward, backward in pairs)


@pytest.mark.parametrize("tensor_parallel", [1, 4])
def test_without_expert_parallelism_model_costs_keep_their_pairs_at_f_plus_b(tensor_parallel):
    # with EP = 1 everything is as it was: a pair costs F + B (its all-reduces not overlapped)
    costs = build_stage_costs(load_model("llama3-8b"), Placement.bidirectional(2), load_cluster("1x8-h100"),
                              TrainingSettings(seq_len=1024, tensor_parallel=tensor_parallel))
    assert costs.forward_backward is None
    assert costs.fused_time(0, costs.forward[0], costs.full_backward(1)) == costs.forward[0] + costs.full_backward(1)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_dualpipe_holds_twice_the_parameters_and_p_plus_one_activations(p, m):
    # the DualPipe README: parameters 2x, activations PP + 1 stage-microbatches per device
    costs = dataclasses.replace(StageCosts.uniform(p, activation_bytes=1.0), static_bytes=(10.0,) * p,
                                input_frees=0.0)
    peaks = device_peak_bytes(generate("dualpipe", p, m), costs)
    assert peaks == [2 * 10.0 + p + 1] * p


@pytest.mark.slow
def test_costs_pair_reports_each_layers_pair_within_its_bounds(cli):
    args = ("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "4", "-s", "2048", "--json")
    plain = json.loads(cli(*args).out)
    result = cli(*args, "--pair")
    assert result.code == 0, result
    listed = json.loads(result.out)
    assert (listed["model"], listed["device"]) == ("llama3-8b", "h100-sxm")
    assert [layer["name"] for layer in listed["layers"]] == [layer["name"] for layer in plain["layers"]]
    for layer, row in zip(listed["layers"], plain["layers"], strict=True):
        assert layer["forward_s"] == pytest.approx(row["forward_s"], rel=1e-12)
        assert layer["backward_s"] == pytest.approx(row["backward_input_s"] + row["backward_weight_s"], rel=1e-12)
        assert max(layer["forward_s"], layer["backward_s"]) <= layer["pair_s"] * (1 + 1e-9)
        assert layer["pair_s"] <= (layer["forward_s"] + layer["backward_s"]) * (1 + 1e-9)
        assert layer["exposed_comm_s"] == pytest.approx(layer["pair_comm_s"] - layer["pair_hidden_comm_s"], abs=1e-15)
    blocks = [layer for layer in listed["layers"] if layer["kind"] == "t"]
    assert all(layer["pair_s"] < layer["forward_s"] + layer["backward_s"] for layer in blocks)


@pytest.mark.slow
def test_costs_pair_of_an_expert_parallel_model_spans_nodes(cli):
    args = ("costs", "--model", "mixtral-8x22b", "--device", "h100-sxm", "-t", "1", "--ep", "8", "-s", "1024",
            "--pair", "--json")
    inside = json.loads(cli(*args).out)["layers"][1]
    assert inside["pair_comm_s"] > 0 and inside["pair_hidden_comm_s"] > 0


@pytest.mark.parametrize(("extra", "field"), [(("--pair", "--ops"), "ops="), (("--cluster", "1x8-h100"), "cluster=")])
def test_costs_pair_refuses_what_it_cannot_honour(cli, extra, field):
    result = cli("costs", "--model", "tiny", *extra)
    assert result.code == 2 and result.err.startswith(f"pipesched: error: {field}") and result.out == ""


@pytest.mark.parametrize("family", ["1f1b", "interleaved-1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 3), (4, 5), (4, 16), (8, 12)])
def test_megatron_overlapped_pairs_keep_every_op_and_a_valid_table(family, p, m):
    plain, fused = generate(family, p, m), generate(family, p, m, fused=True)
    assert validate(fused) == []
    for before, after in zip(plain.device_ops, fused.device_ops, strict=True):
        # the same ops, some of them two adjacent ones to an entry
        parts = [part for op in after for part in (op.parts or (op,))]
        assert sorted(parts) == sorted(before) and len(parts) == len(before)
        for op in after:
            if op.parts:
                forward, backward = op.parts
                assert (forward.kind, backward.kind) == (F, B) and forward.microbatch != backward.microbatch
    if m >= 2 * p:
        assert any(op.parts for ops in fused.device_ops for op in ops)


def test_an_overlapped_pair_holds_its_device_for_the_pair_time():
    schedule = generate("interleaved-1f1b", 4, 16, fused=True)
    costs = StageCosts.slots(fb_cost=0.8)
    timeline = slot_table(schedule, costs)
    # F = 1 slot, B = I + W = 2; every pair costs 0.8 x (F + B) = 2.4 slots of device time
    pairs = sum(1 for ops in schedule.device_ops for op in ops if op.parts)
    forwards = sum(1 for ops in schedule.device_ops for op in ops if op.kind == F)
    backwards = sum(1 for ops in schedule.device_ops for op in ops if op.kind == B)
    assert pairs > 0
    assert timeline.busy_per_device().sum() == pytest.approx(2.4 * pairs + forwards + 2 * backwards)




def test_dualpipe_on_a_moe_model_runs_its_pairs_for_the_computed_time():
    # EP4 over ranks 0, 2, 4, 6 of a cluster of two devices a node: the all-to-alls cross nodes
    cluster = homogeneous_cluster(H100, 8, devices_per_node=2)
    settings = TrainingSettings(micro_batch_size=4, seq_len=512, tensor_parallel=1, expert_parallel=4)
    costs = build_stage_costs(SMALL_MOE, Placement.bidirectional(2), cluster, settings)
    assert costs.forward_backward is not None
    schedule = generate("dualpipe", 2, 8)
    overlapped_run, serial_run = slot_table(schedule, costs), slot_table(schedule, costs.with_pair_cost(1.0))
    heads = [row for row in range(len(overlapped_run.op_kind)) if overlapped_run.box_kind[row] != overlapped_run.op_kind[row]]
    assert heads
    for row in heads:
        # the forward's stage's computed pair, or the longer part when the backward's stage is slower
        forward, backward = overlapped_run.entry(row).parts
        expected = max(costs.forward_backward[forward.stage], costs.forward[forward.stage],
                       costs.full_backward(backward.stage))
        assert overlapped_run.op_end[row] - overlapped_run.op_start[row] == pytest.approx(expected)
    assert overlapped_run.iteration_time < serial_run.iteration_time


def test_a_cluster_file_sets_the_sms_communication_takes():
    text = """
name: two
nodes: [{count: 1, devices_per_node: 2, device: {preset: h100-sxm, comm_sm_fraction: 0.25}}]
intra_node: {bandwidth: 450 GB/s, latency: 3 us}
inter_node: {bandwidth: 50 GB/s, latency: 5 us}
"""
    assert parse_cluster(text).devices[0].comm_sm_fraction == 0.25
    assert load_device("h100-sxm").comm_sm_fraction == pytest.approx(20 / 132)  # DeepSeek-V3's 20 of 132 SMs
    with pytest.raises(PipeschedError, match="comm_sm_fraction"):
        parse_cluster(text.replace("0.25", "1.5"))
