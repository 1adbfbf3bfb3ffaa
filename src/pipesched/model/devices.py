"""Accelerator presets: dense 16-bit peak FLOP/s, memory capacity and memory bandwidth from
the vendors' data sheets (SXM/OAM parts), and every assumption the layer cost model
(``pipesched.model.kernels``) makes about each device, with where it comes from.

Sources, by the names the comments below use:

- MAMF: the "Maximum Achievable Matmul FLOPS" table of Stas Bekman's ML Engineering book
  (stas00/ml-engineering, compute/accelerator): the best bf16 matmul TFLOP/s found over
  many shapes. A100 SXM 267.9 (85.9% of peak), H100 SXM 792.1 (80.1%), H100/H200 SXM 794.5
  (80.3%), B200 1745 (77.6%), MI300X 781.9 (60.1%).
- GEMM-SWEEP: a public torch 2.7 / CUDA 12.8 bf16 square-matmul sweep on an H100 80GB HBM3
  (zzc0721/torch-performance-test-data issue 79): 1024^3 177, 2048^3 677, 4096^3 789,
  8192^3 798, 10240^3 720 TFLOP/s. The 2048 -> 4096 step fixes the per-kernel fixed cost
  (about 2.5 us on top of the quantized compute time); 10240 runs clock-throttled (not
  modelled).
- FA3-PAPER: Shah et al., "FlashAttention-3" (2024), figures on an H100 SXM5, 16k tokens per
  batch, 2048 hidden (16 heads of 128), causal forward: FlashAttention-2 191 / 260 / 298 /
  319 / 333 / 335, cuDNN 315 / 410 / 484 / 518 / 529 / 539, FlashAttention-3 292 / 423 / 521
  / 579 / 602 / 616 TFLOP/s at 512 / 1k / 2k / 4k / 8k / 16k tokens; backward (head dim
  128): FlashAttention-2 214 ... 322, cuDNN 305 ... 516, FlashAttention-3 316 ... 561.
- FA2-README: the FlashAttention-2 repository's A100 and H100 forward + backward figures
  (Dao-AILab/flash-attention, assets/flash2_*_fwd_bwd_benchmark.png), causal, head dim 128:
  A100 99 / 133 / 155 / 173 / 182 / 189, H100 163 / 221 / 265 / 294 / 308 / 328 TFLOP/s.
- Attention fits: with 128-row tiles a causal head of s tokens costs n (n + 1) / 2 + c n
  key-tile visits (n = s / 128) for n^2 / 2 useful ones; an efficiency E and overhead c
  fit by least squares to each curve above reproduce it within 5% from 512 to 16k tokens
  (the backward curves are non-causal: n (n + c) visits). Forward / backward (E, c):
  FlashAttention-2 (0.355, 1.1) / (0.335, 2.2), cuDNN (0.565, 1.0) / (0.55, 3.0),
  FlashAttention-3 (0.665, 1.9) / (0.60, 3.4). On the A100 (FA2-README, forward +
  backward only) the forward is taken at 0.70 (the FlashAttention-2 paper's forward reaches
  up to 73% of peak there) and the backward fit with the H100's overheads: 0.64.
- FRAGMENTATION: PyTorch's caching allocator keeps freed blocks for reuse; reported
  reserved-over-allocated ratios of training jobs range from 1.02 (a 75 GiB Llama-70B job,
  vllm-project/compressed-tensors PR 587) to 1.5 (torchtune issue 1185, fixed by
  expandable segments). The presets assume 1.1 on activations.

The H100 and H200 presets take cuDNN's fused attention (what Transformer Engine and
Megatron run on Hopper, and PyTorch's cuDNN SDPA backend). PyTorch's default flash backend
is FlashAttention-2: set its figures with ``dataclasses.replace`` or, in a cluster file,
``flash_forward_efficiency`` and the other flash fields.

Weight gradients: PyTorch adds each W result into the parameter's existing gradient with a
separate kernel (read both, write one: ``grad_accumulation_traffic`` 3, what a pipelined
step does for every microbatch but the first); Megatron's gradient-accumulation fusion
does it inside the GEMM (set 0).

Fixed costs of a pipeline, per op and per transfer (``op_overhead_s``,
``transfer_setup_s``): assumed for the GPUs from the usual orders of magnitude (a kernel
launch and an event wait, about 5 us each; a NCCL send/receive posted through
torch.distributed, about 10 us of host time on top of the link's wire latency), not
measured. ``pipesched profile`` measures both on the machine at hand and writes them as
device fields (the ``.link.yaml`` beside its output).

Host link and host memory (what activation offload moves over and fills:
``host_bandwidth``, ``host_memory_bytes``):

- PCIE: the PCI Express base specification's signalling rates, per direction of a x16
  link: Gen4 16 GT/s x 16 lanes x 128/130 encoding = 31.5 GB/s, Gen5 32 GT/s = 63.0 GB/s
  (the A100 and the HGX H100, H200, B200 and MI300X boards are Gen4, Gen5, Gen5, Gen5, Gen5
  x16 to the host). A copy moves data in transaction packets of 256 payload bytes behind
  about 24 bytes of headers and framing, and DMA engines reach about 85% of the signalling
  rate in published pinned-memory copy benchmarks: the presets take 0.85 x the rate
  (``HOST_LINK_EFFICIENCY``, an assumption, not measured here).
- NVLINK-C2C: NVIDIA's Grace Hopper data sheet, 900 GB/s total between the Grace CPU and
  the Hopper GPU, 450 GB/s per direction, and 480 GB of LPDDR5X host memory; the same 0.85.
- DGX: the DGX A100 holds 1 TB of system memory for 8 GPUs, the DGX H100, H200 and B200 2
  TB (the presets give each GPU 1/8; MI300X platforms are taken like the DGX H100). Pinned
  host buffers share it with the data loader and the operating system: set
  ``host_memory`` in a cluster file for the share a job really has.

- DEEPGEMM: FP8 matmuls (training's ``--dtype fp8``) on the Hopper presets run at DeepGEMM's
  own H800 figures by shape (``pipesched/data/kernels/deepgemm_h800.csv``: the README tables
  of its first release, normal and grouped GEMMs, and its weight-gradient kernels' tables),
  the kernels DeepSeek-V3 trains with: 1058-1358 TFLOP/s forward at 4096 rows (0.53-0.69 of
  the FP8 peak, against the 16-bit matmuls' 0.80), 920-1092 for weight gradients.

Compute beside communication (``comm_sm_fraction``): DeepSeek-V3's report (section 3.2.2)
gives its all-to-all kernels 20 of the H800's 132 SMs while they overlap compute, and
DeepEP's ``Buffer`` takes 20 SMs by default; the GPU presets assume those 20 SMs on every
device (``COMM_SMS``), the rest left to the compute they overlap.
T4: NVIDIA's T4 data sheet (65 TFLOP/s fp16 tensor cores, 16 GB GDDR6 at 320 GB/s, 40
SMs, PCIe Gen3 x16, 70 W), and its host as FlexGen measured it (Sheng et al., "FlexGen:
High-Throughput Generative Inference of Large Language Models with a Single GPU", ICML 2023,
Section 6 "Evaluation", Hardware: a GCP instance with one T4, 208 GB of CPU DRAM and a 1.5 TB
SSD; the constants its cost model is fitted with, FLEXGEN-COST below). FLEXGEN-COST: the
``CostModelConfig`` of FlexLLMGen's ``experimental/cost_model.py`` ("default value aligned
on google cloud T4"): host -> GPU 12.89 GB/s; GPU -> host 0.97 GB/s for KV-cache stores and
4.82 GB/s for hidden states (the preset takes the cache store's 0.97: the KV cache is most
of what a block schedule writes back); prefill matmuls 21.24 TFLOP/s (the T4 throttles at its
70 W: 0.33 of its peak, the preset's matmul efficiency); the host's attention over a cache in
host memory 0.0123 TFLOP/s (``host_attention_flops``). The disk is not the cost model's
(disk -> host 0.473 GB/s, host -> disk 0.746 GB/s): FlexGen's disk is four 375 GB local NVMe
SSDs striped into one 1.5 TB volume (FlexLLMGen's ``scripts/mount_nvme_gcp.sh``), and
GCP-LOCAL-SSD gives that volume 2.65 GB/s read and 1.40 GB/s write. (The cost model's own
formulas at its 0.473 GB/s give FlexGen's published OPT-175B policy, whose KV cache is all on
disk, 0.15 tokens/s, a fifth of the 0.69 that FlexGen measured with it.)
GCP-LOCAL-SSD: Google Cloud's Compute Engine documentation, "Configure disks to meet
performance requirements", Local SSD (NVMe): 1.77 MB/s read and 0.94 MB/s write per GB of
local SSD, at most 2,650 and 1,400 MB/s per instance, reached on N1 machines of 32 or more
vCPUs (208 GB of DRAM is an n1-highmem-32's, 32 vCPUs: taken to be FlexGen's machine type,
which its paper does not name).

``cpu`` is a nominal multi-core server CPU (AVX-512 FMA, DDR5): rough numbers that only make
CPU runs of the ``tiny`` and ``small`` models comparable in order of magnitude, with the
plain roofline (no tiles, unfused attention). Measure the real machine for anything more.
"""

from __future__ import annotations

from types import MappingProxyType

from pipesched.errors import PipeschedError, shorten, suggest
from pipesched.model.hardware import DeviceSpec
from pipesched.units import GB, TB, GiB

# output tiles the NVIDIA GEMM libraries pick from for bf16 (CUTLASS / cuBLAS threadblock tiles)
NVIDIA_TILES = ((128, 128), (128, 256), (256, 128))
# Turing's fp16 tensor-op GEMMs (CUTLASS's sm75 instances) add a 64 x 64 tile the
# skinny decode matmuls of a small batch take
T4_TILES = ((64, 64), *NVIDIA_TILES)
# hipBLASLt macro tiles on CDNA3
AMD_TILES = ((128, 128), (128, 256), (256, 128), (256, 256))
KERNEL_OVERHEAD_S = 2.5e-6  # GEMM-SWEEP: 2048^3 and 4096^3 against their quantized compute time
FLASH_BLOCK = 128  # query and key rows of a FlashAttention tile (FA2 and FA3, head dim 128)
# fused attention of the presets, (efficiency, tile overhead) forward and backward (see the fits above)
CUDNN_ATTENTION = ((0.565, 1.0), (0.55, 3.0))
FLASH_ATTENTION_2_A100 = ((0.70, 1.1), (0.64, 2.2))
GPU_OP_OVERHEAD_S = 20e-6  # assumed: first launch + event wait + schedule bookkeeping per pipeline op
GPU_TRANSFER_SETUP_S = 10e-6  # assumed: host-side cost of posting and matching one NCCL send/receive
# DEEPGEMM: FP8 GEMMs of the 132-SM Hopper parts (H100 SXM, H200, H800, GH200: one chip, one
# FP8 peak) at DeepGEMM's published H800 rates by shape (the table's header gives its source)
HOPPER_FP8_GEMMS = "deepgemm_h800"
COMM_SMS = 20  # SMs the communication kernels take beside compute (DeepSeek-V3, DeepEP)
GPU_FRAGMENTATION = 1.1  # FRAGMENTATION: allocator bytes per activation byte
HOST_LINK_EFFICIENCY = 0.85  # PCIE: achievable fraction of a host link's signalling rate (assumed)
PCIE_GEN4_X16 = 31.5 * GB  # PCIE: bytes/s per direction
# FLEXGEN-COST: the T4 host's link and its attention FLOP/s, as FlexGen fitted them
T4_HOST_READ, T4_HOST_WRITE = 12.89 * GB, 0.97 * GB
# GCP-LOCAL-SSD: the 1.5 TB local NVMe volume FlexGen offloads to, read and write
T4_DISK_READ, T4_DISK_WRITE = 2.65 * GB, 1.40 * GB
T4_HOST_ATTENTION_FLOPS = 0.0123e12
PCIE_GEN5_X16 = 63.0 * GB
NVLINK_C2C = 450 * GB  # NVLINK-C2C: bytes/s per direction
# a device with no host link of its own (a cluster file's device without host_bandwidth)
# swaps a preempted request's KV cache over a PCIe Gen5 x16 link at the presets' efficiency
DEFAULT_HOST_BANDWIDTH = HOST_LINK_EFFICIENCY * PCIE_GEN5_X16
HOST_COPY_LATENCY_S = 10e-6  # assumed: launching one device-host copy and waiting for it


def _gpu(name: str, *, peak_flops: float, memory_bytes: float, memory_bandwidth: float, matmul_efficiency: float,
         sm_count: int, attention: tuple[tuple[float, float], tuple[float, float]],
         host_link: float, host_memory_bytes: float,
         tiles: tuple[tuple[int, int], ...] = NVIDIA_TILES, fp8_peak_flops: float = 0.0,
         fp8_gemm_table: str = "") -> DeviceSpec:
    (forward, forward_overhead), (backward, backward_overhead) = attention
    return DeviceSpec(
        name, peak_flops=peak_flops, memory_bytes=memory_bytes, memory_bandwidth=memory_bandwidth,
        matmul_efficiency=matmul_efficiency, sm_count=sm_count, matmul_tiles=tiles,
        kernel_overhead_s=KERNEL_OVERHEAD_S, flash_forward_efficiency=forward, flash_backward_efficiency=backward,
        flash_block=FLASH_BLOCK, flash_tile_overhead=forward_overhead,
        flash_backward_tile_overhead=backward_overhead, grad_accumulation_traffic=3.0,
        op_overhead_s=GPU_OP_OVERHEAD_S, transfer_setup_s=GPU_TRANSFER_SETUP_S,
        memory_fragmentation=GPU_FRAGMENTATION, host_bandwidth=HOST_LINK_EFFICIENCY * host_link,
        host_memory_bytes=host_memory_bytes, fp8_peak_flops=fp8_peak_flops, fp8_gemm_table=fp8_gemm_table,
        comm_sm_fraction=COMM_SMS / sm_count,
    )


DEVICES: MappingProxyType[str, DeviceSpec] = MappingProxyType({
    spec.name: spec
    for spec in (
        # 108 SMs; MAMF 85.9% at 6912x16384x2048 (exactly 32 waves of 128x256 tiles: no
        # quantization loss); FlashAttention-2 (FA2-README)
        _gpu("a100-40gb", peak_flops=312e12, memory_bytes=40 * GiB, memory_bandwidth=1.555e12,
             matmul_efficiency=0.86, sm_count=108, attention=FLASH_ATTENTION_2_A100,
             host_link=PCIE_GEN4_X16, host_memory_bytes=1e12 / 8),
        _gpu("a100-80gb", peak_flops=312e12, memory_bytes=80 * GiB, memory_bandwidth=2.039e12,
             matmul_efficiency=0.86, sm_count=108, attention=FLASH_ATTENTION_2_A100,
             host_link=PCIE_GEN4_X16, host_memory_bytes=1e12 / 8),
        # 132 SMs; MAMF 80.3% (GEMM-SWEEP: 8192^3 at 798 = 0.81 x peak x its 0.97 tile
        # efficiency); cuDNN fused attention (FA3-PAPER)
        _gpu("h100-sxm", peak_flops=989e12, fp8_peak_flops=1979e12, fp8_gemm_table=HOPPER_FP8_GEMMS, memory_bytes=80 * GiB, memory_bandwidth=3.35e12,
             matmul_efficiency=0.80, sm_count=132, attention=CUDNN_ATTENTION,
             host_link=PCIE_GEN5_X16, host_memory_bytes=2e12 / 8),
        # the same chip as the H100 with more and faster memory (HBM3e); MAMF lists H100 and
        # H200 together (794.5 TFLOP/s); FlashAttention-3 on an H200 runs within 4% of an H100
        # (Dao-AILab/flash-attention issue 1438)
        _gpu("h200", peak_flops=989e12, fp8_peak_flops=1979e12, fp8_gemm_table=HOPPER_FP8_GEMMS, memory_bytes=141 * GB, memory_bandwidth=4.8e12,
             matmul_efficiency=0.80, sm_count=132, attention=CUDNN_ATTENTION,
             host_link=PCIE_GEN5_X16, host_memory_bytes=2e12 / 8),
        # the H100 SXM's compute and memory (FP8 dense 1979 TFLOP/s, as all Hopper SXM parts)
        # with NVLink cut to 400 GB/s both directions (the links live in the cluster: 8x8-h800)
        _gpu("h800", peak_flops=989e12, fp8_peak_flops=1979e12, fp8_gemm_table=HOPPER_FP8_GEMMS, memory_bytes=80 * GiB, memory_bandwidth=3.35e12,
             matmul_efficiency=0.80, sm_count=132, attention=CUDNN_ATTENTION,
             host_link=PCIE_GEN5_X16, host_memory_bytes=2e12 / 8),
        # a Grace Hopper superchip: the H100 chip with 96 GB of HBM3 at 4 TB/s (the Grace
        # Hopper data sheet), its host memory behind NVLink-C2C (NVLINK-C2C)
        _gpu("gh200", peak_flops=989e12, fp8_peak_flops=1979e12, fp8_gemm_table=HOPPER_FP8_GEMMS, memory_bytes=96 * GB, memory_bandwidth=4.0e12,
             matmul_efficiency=0.80, sm_count=132, attention=CUDNN_ATTENTION,
             host_link=NVLINK_C2C, host_memory_bytes=480 * GB),
        # 148 SMs; MAMF 77.6%; FlashAttention-4 on a B200, head dim 128, causal, 8k tokens:
        # forward 1418, backward 1118 TFLOP/s (Dao-AILab/flash-attention PR 2280), over the
        # causal tile efficiency at 64 tiles with FlashAttention-3's overheads: 0.68 / 0.56
        _gpu("b200", peak_flops=2.25e15, fp8_peak_flops=4.5e15, memory_bytes=180 * GB, memory_bandwidth=8e12,
             matmul_efficiency=0.78, sm_count=148, attention=((0.68, 1.9), (0.56, 3.4)),
             host_link=PCIE_GEN5_X16, host_memory_bytes=2e12 / 8),
        # 304 compute units; MAMF 60.1%; fused attention assumed at the MAMF fraction forward
        # and 0.8 of it backward, with cuDNN's overheads (no public causal curve in the sources)
        _gpu("mi300x", peak_flops=1307e12, fp8_peak_flops=2615e12, memory_bytes=192 * GB, memory_bandwidth=5.3e12,
             matmul_efficiency=0.60, sm_count=304, attention=((0.60, 1.0), (0.48, 3.0)), tiles=AMD_TILES,
             host_link=PCIE_GEN5_X16, host_memory_bytes=2e12 / 8),
        # Turing, 40 SMs, no fused attention (FlexGen's OPT runs unfused attention); the host
        # link, host memory and disk as FlexGen measured them on its GCP machine (T4 above)
        DeviceSpec("t4", peak_flops=65e12, memory_bytes=16 * GB, memory_bandwidth=320 * GB,
                   matmul_efficiency=21.24 / 65, sm_count=40, matmul_tiles=T4_TILES,
                   kernel_overhead_s=KERNEL_OVERHEAD_S, op_overhead_s=GPU_OP_OVERHEAD_S,
                   transfer_setup_s=GPU_TRANSFER_SETUP_S, memory_fragmentation=GPU_FRAGMENTATION,
                   host_bandwidth=T4_HOST_READ, host_write_bandwidth=T4_HOST_WRITE, host_memory_bytes=208 * GB,
                   disk_read_bandwidth=T4_DISK_READ, disk_write_bandwidth=T4_DISK_WRITE, disk_bytes=1.5 * TB,
                   host_attention_flops=T4_HOST_ATTENTION_FLOPS),
        # the host itself: no host link to offload over
        DeviceSpec("cpu", peak_flops=1e12, memory_bytes=64 * GiB, memory_bandwidth=100e9,
                   matmul_efficiency=0.5, bandwidth_efficiency=0.6),
    )
})


def load_device(name: str) -> DeviceSpec:
    """A device preset by name; the error lists the known names.

    >>> load_device("h100-sxm").memory_bytes / 2**30
    80.0
    """
    try:
        return DEVICES[name]
    except KeyError:
        raise PipeschedError(f"device={shorten(name)!r}: unknown device preset{suggest(name, DEVICES)}; "
                             f"known presets: {', '.join(DEVICES)}") from None
