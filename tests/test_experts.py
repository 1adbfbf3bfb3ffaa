"""Mixture-of-experts layers: kernel phases, the dispatch and combine all-to-alls, expert
parallelism's share of the experts, load imbalance and the presets' sizes."""

import dataclasses
import math

import pytest

from pipesched.enums import Collective, Group
from pipesched.model import (
    TrainingSettings,
    layer_costs,
    load_cluster,
    load_device,
    load_model,
    parse_hf_config,
)
from pipesched.model.collectives import CollectiveLevel, collective_seconds
from pipesched.model.groups import GroupLevels, expert_group_levels, fold_rank
from pipesched.model.hardware import LinkSpec
from pipesched.model.kernels import matmul_time
from pipesched.model.spec import ModelSpec
from pipesched.model.transformer import (
    ATTENTION,
    COMBINE,
    DISPATCH,
    MLP,
    PHASES,
    active_params,
    layer_ops,
    layer_params,
    layer_plans,
    plan_collective_seconds,
)

# a small MoE: 4 blocks, the first dense, 8 routed experts of hidden 32 (top-2), 1 shared
SMALL_MOE = ModelSpec(name="moe", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                      vocab_size=256, num_experts=8, experts_per_token=2, gated_mlp=True, moe_ffn_hidden_size=32,
                      num_shared_experts=1, first_dense_layers=1)
SETTINGS = TrainingSettings(micro_batch_size=2, seq_len=128, tensor_parallel=1)


def _plan(model, settings, index):
    return layer_plans(model, settings)[1 + index]


def test_dense_block_phases_are_attention_then_mlp():
    kernels = _plan(SMALL_MOE, SETTINGS, 0).kernels
    phases = [kernel.phase for kernel in kernels]
    assert set(phases) == {ATTENTION, MLP}
    assert phases == sorted(phases, key=PHASES.index)  # attention first, then the MLP
    assert [k.phase for k in kernels if k.name in ("qkv", "projection")] == [ATTENTION, ATTENTION]


@pytest.mark.parametrize("ep", [1, 4])
def test_moe_block_phases_in_order(ep):
    kernels = _plan(SMALL_MOE, dataclasses.replace(SETTINGS, expert_parallel=ep), 1).kernels
    phases = [kernel.phase for kernel in kernels]
    assert phases == sorted(phases, key=PHASES.index)
    assert set(phases) == set(PHASES)
    assert {k.phase for k in kernels if k.name == "router"} == {DISPATCH}
    assert {k.phase for k in kernels if "up" in k.name or "down" in k.name} == {MLP}


def test_dispatch_and_combine_bytes_are_routed_tokens_times_hidden():
    settings = dataclasses.replace(SETTINGS, expert_parallel=4)
    plan = _plan(SMALL_MOE, settings, 1)
    routed = 2 * 128 * 2 * 64 * 2  # b s tokens x top-2 x h x 2 bytes (bf16)
    by_name = {c.name: c for c in plan.collectives}
    assert {c.kind for c in plan.collectives} == {Collective.ALL_TO_ALL}
    assert {c.group for c in plan.collectives} == {Group.EXPERT}
    for name, backward, phase in (("dispatch all-to-all", False, DISPATCH), ("combine all-to-all", False, COMBINE),
                                  ("combine gradient all-to-all", True, COMBINE),
                                  ("dispatch gradient all-to-all", True, DISPATCH)):
        assert (by_name[name].nbytes, by_name[name].backward, by_name[name].phase) == (routed, backward, phase)
    # no all-to-all without expert parallelism, nor in a dense block
    assert not _plan(SMALL_MOE, SETTINGS, 1).collectives
    assert not _plan(SMALL_MOE, settings, 0).collectives


@pytest.mark.parametrize("g", [2, 4, 8])
def test_all_to_all_moves_g_minus_1_over_g_of_the_dispatched_bytes(g):
    settings = dataclasses.replace(SETTINGS, expert_parallel=g)
    dispatch = _plan(SMALL_MOE, settings, 1).collectives[0]
    bandwidth = 1e9
    seconds = plan_collective_seconds(dispatch, settings, LinkSpec(bandwidth, 0.0))
    assert seconds * bandwidth == pytest.approx((g - 1) / g * dispatch.nbytes)
    assert seconds == collective_seconds(Collective.ALL_TO_ALL, dispatch.nbytes, (CollectiveLevel(g, 0.0, bandwidth),))


def test_each_rank_holds_its_share_of_the_experts():
    # routed expert parameters: 8 experts x 3 matrices x h x f_e; the rest of the block stays
    expert_params = 8 * 3 * 64 * 32
    full = _plan(SMALL_MOE, SETTINGS, 1).params
    for ep in (2, 4, 8):
        split = _plan(SMALL_MOE, dataclasses.replace(SETTINGS, expert_parallel=ep), 1).params
        assert full - split == pytest.approx(expert_params * (1 - 1 / ep))


def test_grouped_gemm_rows_and_flops_per_rank():
    ep = 4
    plan = _plan(SMALL_MOE, dataclasses.replace(SETTINGS, expert_parallel=ep), 1)
    up = next(k for k in plan.kernels if k.name == "expert up")
    # E / EP = 2 experts on the rank, each with (b s k / E) x EP... = b s k / EP / 2 rows on average
    assert up.groups == 8 // ep
    assert up.m == 2 * 128 * 2 / up.groups
    # the rank's routed FLOPs: its b s tokens x top-2 through one expert's up matrix (2 f_e wide)
    assert up.flops == 2 * (2 * 128 * 2) * (2 * 32) * 64


def test_skew_slows_the_busiest_rank_and_balanced_routing_does_not():
    device = load_device("h100-sxm")
    settings = dataclasses.replace(SETTINGS, expert_parallel=4)
    balanced = layer_costs(SMALL_MOE, device, settings)[2]
    skewed_model = dataclasses.replace(SMALL_MOE, expert_skew=3.0)
    skewed = layer_costs(skewed_model, device, settings)[2]
    assert skewed.forward_s > balanced.forward_s
    # hottest expert at 3x the mean, the other 7 share the rest: its rank of 2 experts takes
    # (3 + 5/7) / 2 of the mean rank's tokens
    assert skewed_model.hottest_share(4) == pytest.approx((3 + 5 / 7) / 2)
    assert skewed_model.hottest_share(1) == pytest.approx(1.0)
    measured = dataclasses.replace(SMALL_MOE, expert_load=(4, 4, 1, 1, 1, 1, 1, 3))
    assert measured.hottest_share(4) == pytest.approx(8 / 4)


def test_capacity_factor_pads_every_expert():
    settings = dataclasses.replace(SETTINGS, expert_parallel=4)
    padded = _plan(dataclasses.replace(SMALL_MOE, capacity_factor=1.25), settings, 1)
    dropless = _plan(SMALL_MOE, settings, 1)
    assert padded.collectives[0].nbytes == pytest.approx(1.25 * dropless.collectives[0].nbytes)


def test_first_dense_layers_use_the_dense_hidden_size():
    plans = layer_plans(SMALL_MOE, SETTINGS)
    dense_up = next(k for k in plans[1].kernels if k.name == "mlp up")
    assert dense_up.n == 2 * 256 and dense_up.groups == 1
    assert all(any(k.name == "router" for k in plan.kernels) for plan in plans[2:-1])


# (preset, total parameters, active parameters, the embedding counted in the active ones):
# DeepSeek-V3 671B / 36.6B without the embedding (its README_WEIGHTS: 36.6B "including 0.9B
# for the output head"), Qwen3-235B-A22B 235B / 22B, Mixtral 8x22B 141B / 39B
PUBLISHED = [("deepseek-v3", 671e9, 36.6e9, False), ("qwen3-235b-a22b", 235e9, 22e9, True),
             ("mixtral-8x22b", 141e9, 39e9, True)]


@pytest.mark.parametrize(("name", "total", "active", "embedding"), PUBLISHED)
def test_presets_match_the_published_parameter_counts(name, total, active, embedding):
    model = load_model(name)
    assert sum(layer_params(model)) == pytest.approx(total, rel=0.01)
    assert active_params(model, embedding=embedding) == pytest.approx(active, rel=0.01)


def test_latent_attention_caches_the_compressed_latent():
    model = load_model("deepseek-v3")
    # 512 latent + 64 rotary elements per token and block, not 2 x 128 heads x 192
    assert model.kv_cache_elements(8) == 512 + 64
    assert load_model("llama3-8b").kv_cache_elements(2) == 2 * 8 / 2 * 128


def test_hugging_face_configs_read_the_expert_and_latent_fields():
    # DeepSeek-V3's config.json keys, as the preset cites them
    config = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
              "intermediate_size": 18432, "moe_intermediate_size": 2048, "vocab_size": 129280,
              "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
              "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
              "v_head_dim": 128, "hidden_act": "silu", "tie_word_embeddings": False,
              "max_position_embeddings": 163840}
    parsed = parse_hf_config(config, name="deepseek-v3")
    preset = load_model("deepseek-v3")
    assert sum(layer_params(parsed)) == sum(layer_params(preset))
    assert active_params(parsed) == active_params(preset)


def test_fp8_runs_the_linear_layers_at_the_fp8_rate():
    device = load_device("h100-sxm")
    model = load_model("mixtral-8x7b")
    settings = TrainingSettings(seq_len=4096, tensor_parallel=1)
    times = {dtype: {k.name: k for k in layer_ops(model, device, dataclasses.replace(settings, dtype=dtype))[1].kernels}
             for dtype in ("bf16", "fp8")}
    bf16, fp8 = times["bf16"], times["fp8"]
    # a compute-bound linear layer: faster than in bf16, but at the FP8 kernels' published
    # rate (the device's kernel table), short of the peak ratio's speed-up
    ratio = device.fp8_peak_flops / device.peak_flops
    assert bf16["qkv"].forward_s / ratio < fp8["qkv"].forward_s < bf16["qkv"].forward_s
    assert fp8["qkv"].backward_weight_s < bf16["qkv"].backward_weight_s
    # without a kernel table: at most the bf16 time over the peak ratio, plus its fixed cost
    plain = dataclasses.replace(device, fp8_gemm_table="")
    untabled = {k.name: k for k in layer_ops(model, plain, dataclasses.replace(settings, dtype="fp8"))[1].kernels}
    assert untabled["qkv"].forward_s < bf16["qkv"].forward_s / ratio * 1.1
    # the router and the attention core stay in bf16
    for name in ("router", "flash attention"):
        assert (fp8[name].forward_s, fp8[name].backward_input_s) == (bf16[name].forward_s, bf16[name].backward_input_s)


def test_expert_groups_fold_over_the_tensor_ranks_then_the_data_parallel_peers():
    cluster = load_cluster("4x8-h100")
    # t = 2, p = 4: stage device 0 on ranks 0-1, its data-parallel peers every p x t = 8 ranks
    settings = TrainingSettings(tensor_parallel=2, expert_parallel=4, expert_tensor_parallel=1)
    assert [fold_rank(0, i, 2, 8) for i in range(4)] == [0, 1, 8, 9]
    levels = expert_group_levels(cluster, settings, 0, 8).of(Group.EXPERT)
    assert [(level.ranks, level.bandwidth) for level in levels] == [(2, cluster.intra_node.bandwidth),
                                                                     (2, cluster.inter_node.bandwidth)]
    # the EP group inside the tensor-parallel ranks stays on the node
    inside = expert_group_levels(cluster, dataclasses.replace(settings, tensor_parallel=4, expert_parallel=4), 0, 16)
    assert [level.ranks for level in inside.of(Group.EXPERT)] == [4]


def test_latent_attention_parameters_by_hand():
    model = load_model("deepseek-v3")
    h, heads, q_rank, kv_rank, rope, nope, v = 7168, 128, 1536, 512, 64, 128, 128
    attention = (h  # norm 1
                 + h * q_rank + q_rank + q_rank * heads * (nope + rope)  # q down, q norm, q up
                 + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)  # kv down, kv norm, kv up
                 + heads * v * h)  # output projection
    dense_mlp = h + 3 * h * 18432  # norm 2, gated MLP
    assert layer_plans(model, TrainingSettings(seq_len=16, tensor_parallel=1))[1].params == attention + dense_mlp


def test_small_expert_batches_run_below_the_dense_rate():
    # the same FLOPs as 32 experts of 16 rows each, or one matmul of 512 rows: the grouped
    # GEMM's partial tiles waste the device
    device = load_device("h100-sxm")
    grouped = matmul_time(device, 16, 4096, 7168, groups=32)
    dense = matmul_time(device, 512, 4096, 7168)
    assert grouped > 1.5 * dense


def test_deepep_sends_a_copy_per_destination_rank_and_once_per_node_across_nodes():
    model = load_model("deepseek-v3")
    settings = TrainingSettings(seq_len=256, tensor_parallel=1, expert_parallel=64, moe_dispatcher="deepep")
    dispatch = next(c for c in layer_plans(model, settings)[4].collectives if c.name == "dispatch all-to-all")
    nodes, ranks = model.routed_destinations(64, 8)
    # closed forms of drawing 8 of the 4 chosen nodes' 128 experts: distinct nodes and GPUs
    assert nodes == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    assert ranks == pytest.approx(32 * (1 - math.comb(124, 8) / math.comb(128, 8)))
    assert dispatch.nbytes == pytest.approx(256 * ranks * 7168 * 2)
    assert dispatch.across_nodes == pytest.approx(256 * nodes * 7168 * 2)
    # the slower leg sets the time: NVLink inside the node, InfiniBand once per node
    link = LinkSpec(450e9, 0.0)
    levels = (CollectiveLevel(8, 0.0, 450e9), CollectiveLevel(8, 0.0, 50e9))
    groups = GroupLevels(((Group.EXPERT, levels),))
    expected = max(collective_seconds(Collective.ALL_TO_ALL, dispatch.nbytes, levels[:1]),
                   collective_seconds(Collective.ALL_TO_ALL, dispatch.across_nodes, levels[1:]))
    assert plan_collective_seconds(dispatch, settings, link, groups) == pytest.approx(expected)
    # Megatron's all-to-all: a copy per selected expert, spread evenly
    alltoall = layer_plans(model, dataclasses.replace(settings, moe_dispatcher="alltoall"))[4].collectives[0]
    assert (alltoall.nbytes, alltoall.across_nodes) == (256 * 8 * 7168 * 2, 0.0)
    assert plan_collective_seconds(alltoall, settings, link, groups) > plan_collective_seconds(
        dispatch, settings, link, groups)
