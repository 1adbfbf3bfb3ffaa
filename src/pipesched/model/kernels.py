"""How long one kernel takes on one device: the time half of the layer cost model (the
FLOP counts live in ``pipesched.model.transformer`` and never depend on these times).

Matmul ``[m, k] x [k, n]`` (``groups`` independent ones in one kernel: the heads of an
unfused attention, the experts of an MoE layer). The GEMM library cuts the ``m x n`` output
into tiles (``device.matmul_tiles``, it picks the best shape); each compute unit
(``device.sm_count``) runs one tile at a time, so the tiles run in ``waves = ceil(tiles /
sm_count)`` and a partial last wave or partial edge tiles idle part of the device::

    tile efficiency = m n groups / (waves x sm_count x tile rows x tile columns)
    compute time    = 2 m n k groups / (peak x matmul_efficiency x tile efficiency)
    memory time     = bytes read and written / (memory_bandwidth x bandwidth_efficiency)
    time            = max(compute, memory) + kernel_overhead_s

The max is the roofline: below the ridge point (FLOPs per byte under peak / bandwidth) a
kernel is memory-bound.

Skinny matmuls (``m`` below the smallest tile's rows: a decode step's few tokens against a
weight matrix) have too few output tiles to fill the device, and the GEMM libraries run them
split-K: each tile's ``k`` is cut into ``splits = min(sm_count // tiles, k / SPLIT_K_DEPTH)``
slices that run on their own compute units and are summed after, so the tiles x splits fill
the waves::

    tile efficiency = m n groups splits / (waves x sm_count x tile rows x tile columns),
    waves = ceil(tiles x splits / sm_count)

Such a matmul then streams its weights at the memory rate: against Vidur's profiled fp16
GEMMs of Llama-2-7B, CodeLlama-34B and Llama-2-70B at 1-64 tokens (tensor parallelism 1 and
4) the time is within 7.5% median on an H100 and an A100, against 10% and 21% when the
partial wave of a few tiles sets it (``benchmarks/bench_decode_kernels.py``). At ``m`` of
a whole tile and more nothing changes.

Fused causal attention as FlashAttention runs it: per (sequence, head) the ``s`` queries are
cut into ``n = ceil(s / flash_block)`` query tiles; query tile ``i`` visits the key tiles
``0..i`` (causal masking skips the rest: about half of the ``s x s`` scores, and the
diagonal tile is half wasted), plus ``c`` tile-visits of fixed work (loading Q, the final
rescale, writing O; in the backward accumulating and writing dQ, dK, dV). Each visit is
``4 flash_block^2 d`` FLOPs (two matmuls); the backward does 5 matmuls per visit instead of
2 (recomputing the scores)::

    forward time  = heads x (n (n + 1) / 2 + n x flash_tile_overhead) x 4 block^2 d
                    / (peak x flash_forward_efficiency)
    backward time = 2.5 x heads x (n (n + 1) / 2 + n x flash_backward_tile_overhead)
                    x 4 block^2 d / (peak x flash_backward_efficiency)

Nothing of size ``s x s`` touches memory. The efficiencies are what the kernel reaches on
long sequences; the tile overhead is what makes short sequences slower (the FlashAttention
papers' curves over 512 ... 16k tokens).

FP8 matmuls on a device with a kernel table (``device.fp8_gemm_table``: DeepGEMM's published
H800 rates on the Hopper presets) run at the table's rate for their shape instead of
``matmul_efficiency`` x tile efficiency (``pipesched.model.kernel_tables``: the forward and
input-gradient kernels by one table, the weight gradients, slower, by their own)::

    compute time    = 2 m n k groups / (fp8 peak x table efficiency(m, n, k, groups))

Memory-bound kernels (norms, activation functions, residual adds, dropout): ``bytes /
(memory_bandwidth x bandwidth_efficiency) + kernel_overhead_s``.
"""

from __future__ import annotations

import math

import numpy as np

from pipesched.model.hardware import DeviceSpec
from pipesched.model.kernel_tables import gemm_efficiency

# rows of ``k`` one split-K slice takes at least (a few of the kernel's 32- to 64-deep main
# loop steps, so each slice still pipelines its loads)
SPLIT_K_DEPTH = 128
# FLOPs of the FlashAttention backward per forward FLOP: 5 matmuls per tile visit
# (recomputed scores, dV, dP, dQ, dK) against the forward's 2
FLASH_BACKWARD_FLOPS = 2.5


def tile_efficiency(device: DeviceSpec, m: float, n: float, groups: float = 1.0, k: float = 0.0) -> float:
    """Useful share of the tile-slots an ``m x n`` output (``groups`` of them) occupies, best
    over the device's tile shapes; a skinny one (``m`` under every tile's rows, ``k`` given)
    split-K over ``k`` (module docstring).

    >>> from pipesched.model.devices import load_device
    >>> h100 = load_device("h100-sxm")
    >>> round(tile_efficiency(h100, 8192, 8192), 3)
    0.97
    >>> [round(128 * tile_efficiency(h100, 1, 2560, **deep), 3) for deep in ({}, {"k": 8192})]  # SMs busy
    [0.152, 0.985]
    """
    best = 0.0
    units = device.sm_count
    for rows, columns in device.matmul_tiles:
        tiles = groups * _ceil(m / rows) * _ceil(n / columns)
        splits = _splits(device, m, tiles, k)
        waves = _ceil(tiles * splits / units)
        if isinstance(waves, np.ndarray):
            best = np.maximum(best, groups * m * n * splits / (np.maximum(waves, 1) * units * rows * columns))
        elif waves > 0:
            best = max(best, groups * m * n * splits / (waves * units * rows * columns))
    return best


def _splits(device: DeviceSpec, m, tiles, k: float):
    """Split-K slices per output tile: as many as fill the compute units, each at least
    ``SPLIT_K_DEPTH`` deep, for a skinny matmul (``m`` under every tile's rows); 1 for a
    matmul of whole tiles, or of no known ``k``."""
    if k <= 0:
        return 1.0
    deepest = max(1.0, k // SPLIT_K_DEPTH)
    skinny = m < min(rows for rows, _ in device.matmul_tiles)
    if isinstance(m, np.ndarray):
        return np.where(skinny, np.clip(device.sm_count // tiles, 1.0, deepest), 1.0)
    return min(max(device.sm_count // tiles, 1.0), deepest) if skinny else 1.0


def _ceil(x):
    """``math.ceil`` of a number, or of every element of an array (the token counts of a
    serving iteration's table)."""
    return np.ceil(x) if isinstance(x, np.ndarray) else math.ceil(x)


def _matmul_peak(device: DeviceSpec, fp32: bool, fp8: bool = False) -> float:
    # fp32 matmuls run as TF32 at half the 16-bit tensor-core rate; FP8 ones at the FP8 rate
    if fp8:
        return device.fp8_peak_flops * device.matmul_efficiency
    return device.peak_flops * device.matmul_efficiency / (2.0 if fp32 else 1.0)


def memory_time(device: DeviceSpec, traffic: float) -> float:
    """Seconds of a memory-bound kernel moving ``traffic`` bytes."""
    return traffic / (device.memory_bandwidth * device.bandwidth_efficiency) + device.kernel_overhead_s


def matmul_time(device: DeviceSpec, m: float, n: float, k: float, *, groups: float = 1.0, traffic: float = 0.0,
                fp32: bool = False, fp8: bool = False, weight_gradient: bool = False) -> float:
    """Seconds of ``groups`` matmuls ``[m, k] x [k, n]`` moving ``traffic`` bytes in all
    (``weight_gradient``: a weight's gradient, reduced over ``k`` tokens).

    ``m`` and ``traffic`` may be arrays of the same shape (one matmul per row count, every
    count >= 1: a serving iteration's table over its token counts); the time is then the
    array of their times."""
    if not isinstance(m, np.ndarray) and (m <= 0 or n <= 0 or k <= 0):
        return memory_time(device, traffic)
    compute, memory = matmul_roofline(device, m, n, k, groups=groups, traffic=traffic, fp32=fp32, fp8=fp8,
                                      weight_gradient=weight_gradient)
    return _larger(compute, memory) + device.kernel_overhead_s


def matmul_roofline(device: DeviceSpec, m, n: float, k: float, *, groups: float = 1.0, traffic=0.0,
                    fp32: bool = False, fp8: bool = False, weight_gradient: bool = False):
    """The two sides of a matmul's roofline (``matmul_time`` is the larger plus the fixed
    cost): seconds of its FLOPs at the quantized matmul rate (an FP8 one at its kernel
    table's rate, where the device has one), and of its bytes."""
    flops = 2.0 * groups * m * n * k
    if fp8 and device.fp8_gemm_table:
        efficiency = gemm_efficiency(device.fp8_gemm_table, device.fp8_peak_flops, groups=groups, m=m, n=n, k=k,
                                     weight_gradient=weight_gradient)
        compute = flops / (device.fp8_peak_flops * efficiency)
    else:
        compute = flops / (_matmul_peak(device, fp32, fp8) * tile_efficiency(device, m, n, groups, k))
    return compute, traffic / (device.memory_bandwidth * device.bandwidth_efficiency)


def _larger(a, b):
    """The roofline's max, of numbers or element by element."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def uses_flash(device: DeviceSpec, element_bytes: int) -> bool:
    """Attention runs fused when the device has flash efficiencies and the activations are
    16-bit (the FlashAttention kernels take fp16 / bf16 inputs only)."""
    return device.flash_forward_efficiency > 0 and element_bytes == 2


def flash_tile_visits(device: DeviceSpec, seq: float, *, backward: bool = False) -> float:
    """Key-tile visits of one (sequence, head) under the causal mask, fixed work included.

    >>> from pipesched.model.devices import load_device
    >>> h100 = load_device("h100-sxm")
    >>> flash_tile_visits(h100, 256) == 2 * 3 / 2 + 2 * h100.flash_tile_overhead
    True
    """
    tiles = math.ceil(seq / device.flash_block)
    overhead = device.flash_backward_tile_overhead if backward else device.flash_tile_overhead
    return tiles * (tiles + 1) / 2 + tiles * overhead


def flash_attention_time(device: DeviceSpec, *, heads: float, seq: float, head_dim: float,
                         traffic: float = 0.0, backward: bool = False) -> float:
    """Seconds of a fused causal attention over ``heads`` (sequences x heads) of ``seq``
    tokens; ``backward`` for its backward kernel."""
    compute, memory = flash_attention_roofline(device, heads=heads, seq=seq, head_dim=head_dim, traffic=traffic,
                                               backward=backward)
    return max(compute, memory) + device.kernel_overhead_s


def flash_attention_roofline(device: DeviceSpec, *, heads: float, seq: float, head_dim: float,
                             traffic: float = 0.0, backward: bool = False) -> tuple[float, float]:
    """The compute and memory sides of ``flash_attention_time``, seconds."""
    block = device.flash_block
    flops = heads * flash_tile_visits(device, seq, backward=backward) * 4.0 * block * block * head_dim
    if backward:
        compute = FLASH_BACKWARD_FLOPS * flops / (device.peak_flops * device.flash_backward_efficiency)
    else:
        compute = flops / (device.peak_flops * device.flash_forward_efficiency)
    return compute, traffic / (device.memory_bandwidth * device.bandwidth_efficiency)


def causal_attention_flops(heads: float, seq: float, head_dim: float) -> float:
    """Useful FLOPs of a causal attention forward as the FlashAttention benchmarks count them
    (half of the full ``4 s^2 d`` per head)."""
    return heads * 2.0 * seq * seq * head_dim
