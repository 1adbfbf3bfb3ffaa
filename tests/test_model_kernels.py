"""The time model of the layer costs (pipesched.model.kernels): tile and wave quantization,
the roofline's memory-bound side, fused causal attention, fixed per-kernel costs, and the
GPU presets against the public figures they were calibrated on."""

from __future__ import annotations

import dataclasses
import math

import pytest

from model_helpers import one_device
from pipesched.errors import PipeschedError
from pipesched.model import (
    DEVICES,
    DeviceSpec,
    ModelSpec,
    TrainingSettings,
    layer_costs,
    load_device,
    load_model,
    transformer,
)
from pipesched.model.kernels import (
    flash_attention_time,
    flash_tile_visits,
    matmul_time,
    memory_time,
    tile_efficiency,
)

H100 = load_device("h100-sxm")
H200 = load_device("h200")
# the same H100 without any shape effect: the plain roofline
PLAIN = dataclasses.replace(H100, sm_count=1, matmul_tiles=((1, 1),), kernel_overhead_s=0.0,
                            flash_forward_efficiency=0.0, flash_backward_efficiency=0.0, grad_accumulation_traffic=0.0)


def gpt(hidden: int, *, dropout: bool = False) -> ModelSpec:
    return ModelSpec(name=f"gpt-h{hidden}", num_layers=1, hidden_size=hidden, num_heads=hidden // 128,
                     num_kv_heads=hidden // 128, ffn_hidden_size=4 * hidden, vocab_size=51200,
                     position_embeddings=2048, bias=True, dropout=dropout)


def block(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings):
    return layer_costs(model, device, settings)[1]


@pytest.mark.parametrize("device", [H100, load_device("cpu"), PLAIN, DeviceSpec("bare", 1.0, 1.0, 1.0)],
                         ids=lambda d: d.name)
def test_flop_counts_are_the_closed_form_on_every_device(device):
    # the time model never touches the useful work: 3 x (24 b s h^2 + 4 b s^2 h) per block
    b, s, h = 2, 2048, 2048
    cost = block(gpt(h), device, one_device(micro_batch_size=b, seq_len=s))
    assert math.isclose(cost.flops, 3 * (24 * b * s * h**2 + 4 * b * s**2 * h), rel_tol=1e-12)


def test_one_full_wave_of_tiles_is_efficient_and_one_row_more_halves_it():
    m, n, k = 128 * 12, 128 * 11, 4096  # 132 tiles of 128 x 128: one wave on 132 SMs
    assert tile_efficiency(H100, m, n) == 1.0
    assert tile_efficiency(H100, m + 1, n) < 0.55  # a 13th tile row: a second, nearly empty wave
    full = matmul_time(H100, m, n, k) - H100.kernel_overhead_s
    spilled = matmul_time(H100, m + 1, n, k) - H100.kernel_overhead_s
    assert 1.8 < spilled / full < 2.01
    # without quantization the extra row costs its share only
    assert math.isclose(matmul_time(PLAIN, m + 1, n, k) / matmul_time(PLAIN, m, n, k), (m + 1) / m)


def test_thin_matmuls_are_memory_bound_below_the_ridge_point():
    m, n, k = 65536, 16, 8192  # 16 output columns: 2 FLOPs per byte of the [m, k] input
    traffic = 2 * (m * k + k * n + m * n)
    assert 2 * m * n * k / traffic < H100.peak_flops / H100.memory_bandwidth  # below the ridge
    assert math.isclose(matmul_time(H100, m, n, k, traffic=traffic), memory_time(H100, traffic), rel_tol=1e-12)


def test_causal_flash_attention_visits_half_the_tiles_and_keeps_no_scores_in_memory():
    tiles = 1000
    visits = flash_tile_visits(H100, 128 * tiles)
    assert 0.5 < visits / tiles**2 < 0.502  # causal: about half of the n^2 tiles (plus the diagonal)
    long, longer = (flash_attention_time(H100, heads=16, seq=s, head_dim=128) for s in (8192, 16384))
    assert 3.8 < longer / long < 4.05  # quadratic in the sequence
    # compute-bound: Q, K, V, O only move through memory, so bandwidth does not matter
    traffic = 2 * 16384 * 2048 * 4
    slow = dataclasses.replace(H100, memory_bandwidth=H100.memory_bandwidth / 4)
    assert flash_attention_time(slow, heads=16, seq=16384, head_dim=128, traffic=traffic) == \
        flash_attention_time(H100, heads=16, seq=16384, head_dim=128, traffic=traffic)


def test_fused_attention_makes_long_sequences_cheap_and_ignores_selective_recompute():
    model = gpt(2048, dropout=True)
    fused = block(model, H100, one_device(seq_len=8192))
    unfused = block(model, dataclasses.replace(H100, flash_forward_efficiency=0.0, flash_backward_efficiency=0.0),
                    one_device(seq_len=8192))
    assert fused.forward_s < 0.75 * unfused.forward_s  # no s x s scores, softmax or dropout in memory
    selective = block(model, H100, one_device(seq_len=8192, recompute="selective"))
    assert selective.backward_input_s == fused.backward_input_s  # the flash backward recomputes anyway
    plain_selective = block(model, PLAIN, one_device(seq_len=8192, recompute="selective"))
    assert plain_selective.backward_input_s > block(model, PLAIN, one_device(seq_len=8192)).backward_input_s


def test_every_kernel_pays_the_fixed_cost_once():
    model = load_model("tiny")
    settings = one_device(seq_len=128)
    free = dataclasses.replace(H100, kernel_overhead_s=0.0)
    extra = block(model, H100, settings).forward_s - block(model, free, settings).forward_s
    # norm, QKV, fused attention, projection, residual, norm, MLP up, activation, MLP down, residual
    assert math.isclose(extra, 10 * H100.kernel_overhead_s, rel_tol=1e-9)


def test_w_adds_each_weight_gradient_into_the_existing_one():
    h, s = 4096, 2048
    settings = one_device(seq_len=s)
    fused = dataclasses.replace(H200, grad_accumulation_traffic=0.0)
    extra = block(gpt(h), H200, settings).backward_weight_s - block(gpt(h), fused, settings).backward_weight_s
    weights = 12 * h * h  # QKV 3h^2, projection h^2, MLP 8h^2 (bf16, read both and write one)
    expected = 4 * H200.kernel_overhead_s + 3 * 2 * weights / (H200.memory_bandwidth * H200.bandwidth_efficiency)
    assert math.isclose(extra, expected, rel_tol=1e-9)


def useful_tflops(device: DeviceSpec, h: int, s: int) -> tuple[float, float]:
    cost = block(gpt(h), device, one_device(seq_len=s))
    useful = 24 * s * h * h + 4 * s * s * h
    return useful / cost.forward_s / 1e12, 2 * useful / (cost.backward_input_s + cost.backward_weight_s) / 1e12


def test_h200_gpt_layers_reach_the_published_throughput():
    # real H200 layers: h=2048, s=4096 forward about 700 TFLOP/s; h 4096-12288 600-750
    forward, backward = useful_tflops(H200, 2048, 4096)
    assert 630 <= forward <= 770 and 0.8 * forward < backward < forward
    assert useful_tflops(PLAIN, 2048, 4096)[0] < 500  # the plain roofline was far below
    for h in (4096, 8192, 12288):
        for s in (2048, 4096):
            forward, backward = useful_tflops(H200, h, s)
            assert 540 <= forward <= 825, (h, s, forward)
            assert 0.8 * forward < backward < forward, (h, s, backward)


def test_square_matmuls_match_the_published_h100_sweep():
    # bf16 n^3 on an H100 (torch 2.7): 2048 677, 4096 789, 8192 798 TFLOP/s
    for n, measured in ((2048, 676.59), (4096, 788.72), (8192, 797.51)):
        model = 2 * n**3 / matmul_time(H100, n, n, n, traffic=6 * n * n) / 1e12
        assert abs(model / measured - 1) < 0.06, (n, model)


# the T4 sustains about a third of its 65 TFLOP/s at its 70 W cap (tests/test_offload.py)
@pytest.mark.parametrize("name", [name for name in DEVICES if name not in ("cpu", "t4")])
def test_every_gpu_preset_lands_in_a_sensible_band(name):
    device = load_device(name)
    forward, backward = (value * 1e12 / device.peak_flops for value in useful_tflops(device, 4096, 4096))
    assert 0.45 < forward < 0.85 and 0.4 < backward < forward


def test_the_cpu_preset_is_the_plain_roofline():
    cpu = load_device("cpu")
    assert tile_efficiency(cpu, 1000, 7) == 1.0 and cpu.kernel_overhead_s == 0 and cpu.flash_forward_efficiency == 0


@pytest.mark.parametrize(("changes", "field"), [
    ({"matmul_tiles": ()}, "matmul_tiles"),
    ({"flash_forward_efficiency": 0.5}, "flash_backward_efficiency"),
    ({"memory_fragmentation": 0.9}, "memory_fragmentation"),
    ({"sm_count": 0}, "sm_count"),
    ({"op_overhead_s": -1.0}, "op_overhead_s"),
    ({"transfer_setup_s": math.nan}, "transfer_setup_s"),
])
def test_impossible_device_fields_are_refused(changes, field):
    with pytest.raises(PipeschedError, match=field):
        dataclasses.replace(PLAIN, **changes)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_layers_timed_once_per_distinct_layer_cost_what_each_layer_timed_alone_costs(recompute):
    """A model's alike blocks are timed once: every layer's cost, its name included, is the
    time model applied to that layer on its own."""
    model, device = load_model("llama3-8b"), load_device("h100-sxm")
    settings = TrainingSettings(micro_batch_size=2, seq_len=1024, recompute=recompute, tensor_parallel=2)
    alone = [transformer._cost(plan, device, settings, transformer.DEFAULT_TP_LINK)
             for plan in transformer.layer_plans(model, settings)]
    assert layer_costs(model, device, settings) == alone
