"""Layer costs against the published closed forms: Megatron FLOPs (Narayanan et al. 2021)
and activation memory (Korthikanti et al. 2022)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from model_helpers import one_device
from pipesched.enums import Collective
from pipesched.model import (
    LinkSpec,
    ModelSpec,
    TrainingSettings,
    allreduce_time,
    hardware_flops_per_iteration,
    layer_costs,
    load_device,
    load_model,
    model_flops_per_iteration,
)
from pipesched.model.collectives import CollectiveLevel, collective_seconds

H100 = load_device("h100-sxm")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12)


@pytest.mark.parametrize("tensor_parallel", [1, 8])
def test_gpt3_175b_flops_match_megatron_without_recompute(tensor_parallel):
    # Narayanan et al. (2021), model FLOPs of one iteration (forward + backward):
    # 72 B s l h^2 (1 + s/(6h) + V/(12 l h)), B = global batch in sequences
    model = load_model("gpt3-175b")
    b, m, s = 2, 8, 2048
    depth, h, v = model.num_layers, model.hidden_size, model.vocab_size
    settings = one_device(micro_batch_size=b, seq_len=s, tensor_parallel=tensor_parallel)
    expected = 72 * (b * m) * s * depth * h**2 * (1 + s / (6 * h) + v / (12 * depth * h))
    assert close(model_flops_per_iteration(model, settings, m), expected)


def test_gpt3_175b_flops_match_megatron_with_full_recompute():
    # with full activation recompute every block runs its forward twice (the LM head does
    # not): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), the paper's hardware-FLOPs formula
    model = load_model("gpt3-175b")
    b, m, s = 1, 16, 2048
    depth, h, v = model.num_layers, model.hidden_size, model.vocab_size
    settings = one_device(micro_batch_size=b, seq_len=s, recompute="full")
    expected = 96 * (b * m) * s * depth * h**2 * (1 + s / (6 * h) + v / (16 * depth * h))
    assert close(hardware_flops_per_iteration(model, settings, m), expected)
    # model FLOPs (what MFU counts) leave the recompute out: the paper's model-FLOPs formula
    model_flops = 72 * (b * m) * s * depth * h**2 * (1 + s / (6 * h) + v / (12 * depth * h))
    assert close(model_flops_per_iteration(model, settings, m), model_flops)


def test_selective_recompute_adds_the_attention_core_forward():
    model = load_model("gpt3-13b")
    b, s = 1, 4096
    depth, h = model.num_layers, model.hidden_size
    plain = hardware_flops_per_iteration(model, one_device(micro_batch_size=b, seq_len=s), 1)
    chosen = one_device(micro_batch_size=b, seq_len=s, recompute="selective")
    selective = hardware_flops_per_iteration(model, chosen, 1)
    assert close(selective - plain, depth * 4 * b * s**2 * h)  # scores + context matmuls again
    assert close(model_flops_per_iteration(model, chosen, 1), plain)


def block(model: ModelSpec, settings: TrainingSettings):
    return layer_costs(model, H100, settings)[1]


@pytest.mark.parametrize(("b", "s"), [(1, 2048), (4, 1024), (2, 8192)])
def test_gpt_block_activations_match_korthikanti(b, s):
    model = load_model("gpt3-175b")
    h, a = model.hidden_size, model.num_heads
    none = block(model, one_device(micro_batch_size=b, seq_len=s))
    selective = block(model, one_device(micro_batch_size=b, seq_len=s, recompute="selective"))
    full = block(model, one_device(micro_batch_size=b, seq_len=s, recompute="full"))
    assert close(none.activation_bytes, s * b * h * (34 + 5 * a * s / h))
    assert close(selective.activation_bytes, s * b * h * 34)
    assert close(full.activation_bytes, 2 * s * b * h)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_activations_match_korthikanti(t):
    model = load_model("gpt3-175b")
    b, s, h, a, v = 1, 2048, model.hidden_size, model.num_heads, model.vocab_size
    plain = one_device(micro_batch_size=b, seq_len=s, tensor_parallel=t)
    sequence = dataclasses.replace(plain, sequence_parallel=True)
    assert close(block(model, plain).activation_bytes, s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert close(block(model, sequence).activation_bytes, s * b * h / t * (34 + 5 * a * s / h))
    head = layer_costs(model, H100, sequence)[-1]
    assert close(head.activation_bytes, 4 * s * b * h / t * (1 + v / h))  # output layer + fp32 logits


def test_gqa_gated_mlp_forward_flops_by_hand():
    model = load_model("llama3-8b")
    b, s = 1, 4096
    h, f, d, a, k = model.hidden_size, model.ffn_hidden_size, model.kv_channels, model.num_heads, model.num_kv_heads
    forward = (2 * b * s * h * (a + 2 * k) * d  # QKV with 8 key/value heads
               + 4 * b * s * s * a * d  # scores and context
               + 2 * b * s * a * d * h  # projection
               + 3 * 2 * b * s * h * f)  # gate, up, down
    cost = block(model, one_device(micro_batch_size=b, seq_len=s))
    assert close(cost.flops, 3 * forward)  # forward + input gradients + weight gradients


def test_moe_flops_count_active_experts_and_router():
    model = load_model("mixtral-8x7b")
    b, s = 1, 4096
    h, f, d, a, k = model.hidden_size, model.ffn_hidden_size, model.kv_channels, model.num_heads, model.num_kv_heads
    attention = 2 * b * s * h * (a + 2 * k) * d + 4 * b * s * s * a * d + 2 * b * s * a * d * h
    experts = model.experts_per_token * 3 * 2 * b * s * h * f
    router = 2 * b * s * h * model.num_experts
    cost = block(model, one_device(micro_batch_size=b, seq_len=s))
    assert close(cost.flops, 3 * (attention + experts + router))
    # all 8 experts' weights are held, 2 are run
    dense_mlp = 3 * h * f
    assert cost.params > model.num_experts * dense_mlp


def test_backward_is_about_twice_forward_and_split_between_input_and_weight():
    cost = block(load_model("gpt3-13b"), one_device(micro_batch_size=4, seq_len=2048))
    backward = cost.backward_input_s + cost.backward_weight_s
    assert 1.8 < backward / cost.forward_s < 2.3
    # I also carries the attention score/context gradients and the elementwise backward
    assert cost.backward_input_s > cost.backward_weight_s > 0.3 * cost.forward_s


def test_full_recompute_adds_a_forward_to_the_input_gradient():
    model = load_model("gpt3-13b")
    none = block(model, one_device(seq_len=2048))
    full = block(model, one_device(seq_len=2048, recompute="full"))
    assert close(full.backward_input_s, none.backward_input_s + none.forward_s)
    assert close(full.backward_weight_s, none.backward_weight_s)


def test_roofline_large_matmuls_are_compute_bound():
    model = load_model("gpt3-175b")
    settings = one_device(micro_batch_size=1, seq_len=2048)
    cost = block(model, settings)
    matmul_floor = (cost.flops / 3) / (H100.peak_flops * H100.matmul_efficiency)
    assert matmul_floor <= cost.forward_s < 1.2 * matmul_floor
    faster = dataclasses.replace(H100, peak_flops=2 * H100.peak_flops)
    assert layer_costs(model, faster, settings)[1].forward_s < 0.6 * cost.forward_s


def test_small_layers_are_memory_bound():
    # on the plain roofline (no tiles, no fixed cost per kernel, unfused attention) a tiny
    # layer's forward is all memory time: half the bandwidth, twice the time
    model = load_model("tiny")
    settings = one_device(micro_batch_size=1, seq_len=128)
    plain = dataclasses.replace(H100, sm_count=1, matmul_tiles=((1, 1),), kernel_overhead_s=0.0,
                                flash_forward_efficiency=0.0, flash_backward_efficiency=0.0)
    slow_memory = dataclasses.replace(plain, memory_bandwidth=H100.memory_bandwidth / 2)
    assert math.isclose(layer_costs(model, slow_memory, settings)[1].forward_s,
                        2 * layer_costs(model, plain, settings)[1].forward_s, rel_tol=1e-9)


def test_tensor_parallel_all_reduces_use_the_link():
    model = load_model("llama3-70b")
    settings = one_device(micro_batch_size=1, seq_len=4096, tensor_parallel=8)
    fast = layer_costs(model, H100, settings, tp_link=LinkSpec(bandwidth=float("inf"), latency=0.0))[1]
    link = LinkSpec(bandwidth=100e9, latency=10e-6)
    slow = layer_costs(model, H100, settings, tp_link=link)[1]
    one = allreduce_time(4096 * model.hidden_size * 2, 8, link)  # one hidden-state all-reduce
    assert math.isclose(slow.forward_s - fast.forward_s, 2 * one, rel_tol=1e-9)
    assert math.isclose(slow.backward_input_s - fast.backward_input_s, 2 * one, rel_tol=1e-9)
    assert slow.backward_weight_s == fast.backward_weight_s
    assert math.isclose(one, 2 * 7 / 8 * 4096 * model.hidden_size * 2 / 100e9 + 14 * 10e-6)


def test_tensor_parallel_splits_compute_and_parameters():
    model = load_model("llama3-70b")
    one = block(model, one_device(seq_len=4096))
    eight = layer_costs(model, H100, one_device(seq_len=4096, tensor_parallel=8),
                        tp_link=LinkSpec(bandwidth=float("inf"), latency=0.0))[1]
    assert close(eight.flops * 8, one.flops)
    norms = 2 * model.hidden_size  # replicated on every rank
    assert close((eight.params - norms) * 8, one.params - norms)
    assert 0.1 < eight.forward_s / one.forward_s < 0.2


def test_lm_head_is_heavy_and_embedding_has_no_input_gradient():
    costs = layer_costs(load_model("llama3-8b"), H100, one_device(seq_len=4096))
    embedding, first, head = costs[0], costs[1], costs[-1]
    assert head.forward_s > first.forward_s  # 128k-vocabulary projection + cross-entropy
    assert head.output_bytes == 0
    assert embedding.backward_input_s == 0 and embedding.backward_weight_s > 0
    assert embedding.flops == 0
    assert close(first.output_bytes, 4096 * 4096 * 2)


def test_parameter_bytes_default_to_mixed_precision_adam():
    settings = one_device()
    assert settings.static_bytes_per_param == 18
    assert one_device(optimizer_bytes=0, grad_bytes=2).static_bytes_per_param == 4


def test_an_all_to_all_moves_all_but_its_own_share_of_each_ranks_bytes() -> None:
    # g ranks, each holding B bytes for the group: it keeps B / g and sends (g - 1) / g x B
    for g in (2, 4, 8):
        ring = (CollectiveLevel(g, 0.0, 1e9),)
        assert collective_seconds(Collective.ALL_TO_ALL, 8e9, ring) == pytest.approx((g - 1) / g * 8)
