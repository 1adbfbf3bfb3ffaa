"""The analytical layer-cost model against public GPU figures: implied TFLOP/s per matmul,
attention and GPT-layer shape, beside what was measured and published.

    python benchmarks/bench_layer_costs.py > benchmarks/results/layer_costs.txt

Every reference figure below names its source in a comment. "model" is the time model of
``pipesched.model.kernels`` with the device presets of ``pipesched.model.devices``;
"roofline" is the model before tile quantization, fused attention and fixed costs (the
same preset with those fields at their plain-roofline defaults and the H200's former 80%
matmul efficiency), printed beside it for comparison.

Useful FLOPs of a GPT layer are Megatron's ``24 b s h^2 + 4 b s^2 h`` forward (the masked
half of causal attention included, as everyone counts it) and twice that backward; the
implied TFLOP/s is those FLOPs over the modelled time. Attention kernels are counted as the
FlashAttention benchmarks count them (causal: half of ``4 s^2 d`` per head).

Checks (printed at the end, each PASS or MISS): the H200 forward of a GPT layer with
h=2048, s=4096, b=1 within 10% of the about 700 TFLOP/s real layers reach; mid-size GPT
layers (h 4096-12288) within 10% of the 600-750 TFLOP/s band; square-GEMM and attention
curves within 10% of their published figures (median) and 25% (worst).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from pipesched.model import ModelSpec, TrainingSettings, layer_costs, load_device
from pipesched.model.hardware import DeviceSpec
from pipesched.model.kernels import causal_attention_flops, flash_attention_time, matmul_time

TFLOP = 1e12

# --- public figures ------------------------------------------------------------------------
# bf16 square matmuls n x n x n on an H100 80GB HBM3, torch 2.7 + CUDA 12.8: GitHub
# zzc0721/torch-performance-test-data issue 79 ("NVIDIA H100 80GB HBM3"), TFLOP/s
SQUARE_GEMM_H100 = {1024: 176.62, 2048: 676.59, 4096: 788.72, 8192: 797.51, 10240: 719.72}
# Maximum Achievable Matmul FLOPS, bf16, best shape found (stas00/ml-engineering,
# compute/accelerator/README.md): (device preset, m, n, k) -> TFLOP/s
MAMF = {("a100-80gb", 6912, 16384, 2048): 267.9, ("h100-sxm", 6144, 17920, 2816): 792.1,
        ("mi300x", 4096, 10240, 4864): 781.9}
# Causal attention forward, head dim 128, 16k tokens per batch, 16 heads, H100 SXM5:
# FlashAttention-3 paper (Shah et al. 2024), figure "Forward, with causal mask, head dim 128"
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
FA3_PAPER_CAUSAL_FWD = {
    "cudnn": (315, 410, 484, 518, 529, 539),
    "flash-attention-2": (191, 260, 298, 319, 333, 335),
    "flash-attention-3": (292, 423, 521, 579, 602, 616),
}
# Causal attention forward + backward, head dim 128, same sizes: FlashAttention-2 README
# figures (Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png and
# flash2_h100_fwd_bwd_benchmark.png), FlashAttention-2
FA2_README_CAUSAL_FWD_BWD = {
    "a100-80gb": (99, 133, 155, 173, 182, 189),
    "h100-sxm": (163, 221, 265, 294, 308, 328),
}
# Fused-attention fields of the attention libraries on Hopper, fit to the FlashAttention-3
# paper's curves (see pipesched/model/devices.py): (efficiency, tile overhead) forward and
# backward; the H100 and H200 presets carry cuDNN's
ATTENTION_VARIANTS = {
    "flash-attention-2": ((0.355, 1.1), (0.335, 2.2)),
    "cudnn": ((0.565, 1.0), (0.55, 3.0)),
    "flash-attention-3": ((0.665, 1.9), (0.60, 3.4)),
}
# Real H200 GPT layers: h=2048, s=4096, b=1 forward reaches about 700 TFLOP/s (pipesched
# issue 15); mid-size layers (h 4096-12288) 600-750 TFLOP/s in forward (ANCHORS, "Hardware
# reference"); an 8192^3 bf16 matmul on an H200 about 790-800 TFLOP/s (same)
H200_SMALL_LAYER = 700.0
MIDSIZE_BAND = (600.0, 750.0)
H200_8192_GEMM = (790.0, 800.0)
# GPT layer shapes of the target: h from 2048 to 12288 (GPT-3 1.3B ... 175B, head size 128)
HIDDEN = (2048, 4096, 5120, 8192, 12288)
SEQ_LENS = (2048, 4096)


def roofline(device: DeviceSpec) -> DeviceSpec:
    """The preset as the model saw it before shapes mattered: no tiles, no fixed costs,
    unfused attention, no gradient accumulation pass; the H200 at its former 80%."""
    plain = DeviceSpec("plain", 1.0, 1.0, 1.0)
    fields = ("sm_count", "matmul_tiles", "kernel_overhead_s", "flash_forward_efficiency",
              "flash_backward_efficiency", "flash_tile_overhead", "flash_backward_tile_overhead",
              "grad_accumulation_traffic")
    return dataclasses.replace(device, **{f: getattr(plain, f) for f in fields})


def gpt_layer(hidden: int) -> ModelSpec:
    return ModelSpec(name=f"gpt-h{hidden}", num_layers=1, hidden_size=hidden, num_heads=hidden // 128,
                     num_kv_heads=hidden // 128, ffn_hidden_size=4 * hidden, vocab_size=51200,
                     position_embeddings=2048, bias=True)


def layer_tflops(device: DeviceSpec, hidden: int, seq: int) -> tuple[float, float, float, float]:
    """(forward ms, backward ms, forward TFLOP/s, backward TFLOP/s) of one GPT block, b=1."""
    block = layer_costs(gpt_layer(hidden), device, TrainingSettings(seq_len=seq, tensor_parallel=1, recompute="none",
                                                                    sequence_parallel=False))[1]
    useful = 24 * seq * hidden**2 + 4 * seq**2 * hidden
    backward = block.backward_input_s + block.backward_weight_s
    return block.forward_s * 1e3, backward * 1e3, useful / block.forward_s / TFLOP, 2 * useful / backward / TFLOP


def attention_variant(device: DeviceSpec, name: str) -> DeviceSpec:
    (forward, forward_overhead), (backward, backward_overhead) = ATTENTION_VARIANTS[name]
    return dataclasses.replace(device, flash_forward_efficiency=forward, flash_tile_overhead=forward_overhead,
                               flash_backward_efficiency=backward, flash_backward_tile_overhead=backward_overhead)


def ratio_line(label: str, model: float, reference: float, ratios: list[float]) -> str:
    ratios.append(model / reference)
    return f"  {label:<34} model {model:7.1f}   published {reference:7.1f}   model/published {model / reference:5.2f}"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    h100, h200 = load_device("h100-sxm"), load_device("h200")
    checks: list[tuple[str, bool]] = []

    print("== bf16 matmuls: model vs measured (TFLOP/s)")
    gemm_ratios: list[float] = []
    for n, measured in SQUARE_GEMM_H100.items():
        model = 2 * n**3 / matmul_time(h100, n, n, n, traffic=6 * n * n) / TFLOP
        line = ratio_line(f"h100-sxm {n}^3 (GEMM-SWEEP)", model, measured, gemm_ratios)
        note = {1024: "  (one partial wave; timed in a Python loop: launch-bound)",
                10240: "  (measured clock-throttled: not modelled)"}.get(n, "")
        print(line + note)
    for (preset, m, n, k), measured in MAMF.items():
        device = load_device(preset)
        model = 2 * m * n * k / matmul_time(device, m, n, k, traffic=2 * (m * k + k * n + m * n)) / TFLOP
        print(ratio_line(f"{preset} {m}x{n}x{k} (MAMF)", model, measured, gemm_ratios))
    model_8192 = 2 * 8192**3 / matmul_time(h200, 8192, 8192, 8192, traffic=6 * 8192**2) / TFLOP
    print(f"  h200 8192^3 (ANCHORS)              model {model_8192:7.1f}   published {H200_8192_GEMM[0]:.0f}-"
          f"{H200_8192_GEMM[1]:.0f}")
    core = [r for n, r in zip(SQUARE_GEMM_H100, gemm_ratios, strict=False) if n not in (1024, 10240)]
    core += gemm_ratios[len(SQUARE_GEMM_H100):]
    checks.append(("matmuls (2048-8192 squares, MAMF shapes): median within 10%, worst within 25%",
                   abs(statistics.median(core) - 1) <= 0.10 and max(abs(r - 1) for r in core) <= 0.25))

    print("\n== causal attention, head dim 128, 16k tokens per batch, 16 heads (TFLOP/s, FlashAttention counting)")
    attention_ratios: list[float] = []
    for library, published in FA3_PAPER_CAUSAL_FWD.items():
        device = attention_variant(h100, library)
        for seq, measured in zip(SEQS, published, strict=True):
            heads = (16384 // seq) * 16
            seconds = flash_attention_time(device, heads=heads, seq=seq, head_dim=128)
            model = causal_attention_flops(heads, seq, 128) / seconds / TFLOP
            print(ratio_line(f"h100 {library} fwd s={seq} (FA3-PAPER)", model, measured, attention_ratios))
    for preset, published in FA2_README_CAUSAL_FWD_BWD.items():
        device = load_device(preset) if preset == "a100-80gb" else attention_variant(h100, "flash-attention-2")
        for seq, measured in zip(SEQS, published, strict=True):
            heads = (16384 // seq) * 16
            seconds = (flash_attention_time(device, heads=heads, seq=seq, head_dim=128)
                       + flash_attention_time(device, heads=heads, seq=seq, head_dim=128, backward=True))
            model = 3.5 * causal_attention_flops(heads, seq, 128) / seconds / TFLOP
            print(ratio_line(f"{preset} FA2 fwd+bwd s={seq} (FA2-README)", model, measured, attention_ratios))
    checks.append(("attention curves: median within 10%, worst within 25%",
                   abs(statistics.median(attention_ratios) - 1) <= 0.10
                   and max(abs(r - 1) for r in attention_ratios) <= 0.25))

    print("\n== GPT layer on an H200, b=1: useful TFLOP/s (24bsh^2 + 4bs^2h forward, twice that backward)")
    print(f"  {'h':>6} {'s':>5} | {'roofline F':>10} {'B':>5} | {'model F':>8} {'B':>5} {'F ms':>7} {'B ms':>7} |"
          f" {'F with FA2':>10} {'FA3':>5}")
    forward_model: dict[tuple[int, int], float] = {}
    for hidden in HIDDEN:
        for seq in SEQ_LENS:
            _, _, before_f, before_b = layer_tflops(roofline(h200), hidden, seq)
            forward_ms, backward_ms, after_f, after_b = layer_tflops(h200, hidden, seq)
            fa2 = layer_tflops(attention_variant(h200, "flash-attention-2"), hidden, seq)[2]
            fa3 = layer_tflops(attention_variant(h200, "flash-attention-3"), hidden, seq)[2]
            forward_model[(hidden, seq)] = after_f
            print(f"  {hidden:>6} {seq:>5} | {before_f:>10.0f} {before_b:>5.0f} | {after_f:>8.0f} {after_b:>5.0f}"
                  f" {forward_ms:>7.3f} {backward_ms:>7.3f} | {fa2:>10.0f} {fa3:>5.0f}")
    small = forward_model[(2048, 4096)]
    print(f"  h=2048 s=4096 forward: model {small:.0f}, real layers about {H200_SMALL_LAYER:.0f} (issue 15); "
          f"roofline {layer_tflops(roofline(h200), 2048, 4096)[2]:.0f}")
    checks.append(("H200 GPT layer h=2048 s=4096 forward within 10% of 700 TFLOP/s",
                   abs(small / H200_SMALL_LAYER - 1) <= 0.10))
    low, high = MIDSIZE_BAND
    mid = [v for (hidden, _), v in forward_model.items() if hidden >= 4096]
    checks.append((f"H200 GPT layers h 4096-12288 forward within 10% of the {low:.0f}-{high:.0f} band",
                   all(0.9 * low <= v <= 1.1 * high for v in mid)))

    print("\n== checks")
    for label, passed in checks:
        print(f"  {'PASS' if passed else 'MISS'}  {label}")


if __name__ == "__main__":
    main()
