"""What one serving iteration costs on one pipeline stage: the record the serving engine reads.

An iteration batches prefill chunks (a chunk of a prompt, over the context already cached
before it) and decode steps (one new token of a running request, reading its whole KV
cache). Its time on a stage, per device of the stage's tensor-parallel group::

    time = base_s
         + token_s[T]                     GEMMs, norms, tensor-parallel all-reduces at T tokens
         + prefill_attention_s x A        A = sum over chunks of chunk x (context + chunk)
         + decode_request_s x D           D decode requests (per-sequence fixed work)
         + kv_token_s x K                 K = KV tokens the decodes read (their contexts)
         + sample_s[n]                    last stage: LM head and sampling of n sequences

with T = prefill chunk tokens + D. With weights streamed (``--resident``: only part of a
stage's blocks kept on the device, the rest loaded from host memory or disk every
iteration), the iteration takes ``streamed_seconds`` of that compute time instead: the
loads overlap the compute of the layers before them. ``send_s[T]`` is the hidden state of T tokens sent to the
next stage (zeros on the last stage), T x ``hidden_bytes_per_token`` bytes. The kernel
model fills ``token_s`` from the GEMM shapes at each token count (decode sizes are
memory-bound: the weights are read once per iteration); a fitted latency model
(DistServe's form, ``--latency-model``: its rows are ``pipesched.io.latency_model.LatencyRow``)
fills it as a line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import pipesched.model.kernels as kernels
from pipesched.enums import Tier
from pipesched.errors import PipeschedError, require
from pipesched.io.latency_model import LatencyRow
from pipesched.model.collectives import CollectiveLevel, collective_seconds, link_levels
from pipesched.model.hardware import Cluster, DeviceSpec
from pipesched.model.spec import (
    DTYPE_BYTES,
    EMBEDDING,
    FP8_DTYPES,
    LOSS,
    ModelSpec,
    TrainingSettings,
)
from pipesched.model.tiers import move_seconds, tier_capacity
from pipesched.model.transformer import WEIGHT_MATMUL, Kernel, LayerPlan, layer_plans
from pipesched.partition import min_bottleneck


@dataclass(frozen=True, eq=False)
class StageIterationCosts:
    """One stage's iteration time as a function of its batch (module docstring), its memory
    per device and the model FLOPs it does (for MFU)."""

    stage: int
    layers: tuple[int, int]  # the model's layer positions [first, end) on this stage (embedding = 0)
    base_s: float  # seconds of every iteration, whatever it holds
    token_s: np.ndarray  # float64 [max_tokens + 1]: seconds at T tokens (token_s[0] = 0)
    prefill_attention_s: float  # seconds per unit of chunk x (context + chunk)
    decode_request_s: float  # seconds per decode request
    kv_token_s: float  # seconds per KV token a decode reads
    sample_s: np.ndarray  # float64 [max_batch + 1]: LM head and sampling of n sequences (zeros but the last stage)
    send_s: np.ndarray  # float64 [max_tokens + 1]: hidden state of T tokens to the next stage (zeros on the last)
    weight_bytes: float  # parameters held per device
    kv_bytes_per_token: float  # KV cache of one token over this stage's layers, per device
    workspace_bytes: float  # activation workspace per device at the largest iteration
    flops_per_token: float  # model FLOPs per token of the stage's GEMMs, all its devices together
    flops_per_attention: float  # model FLOPs per unit of A (prefill) and per KV token read (decode)
    # bytes of one token's hidden state sent to the next stage (send_s's payload; 0 on the last
    # stage, and where the costs do not say)
    hidden_bytes_per_token: float = 0.0
    # weights streamed each iteration (``with_residency``): the stage's transformer blocks,
    # how many of them (its last) are not resident, one block's parameters per device (bytes)
    # and the seconds one block's load takes over the link from where they live
    blocks: int = 0
    streamed_blocks: int = 0
    block_weight_bytes: float = 0.0
    block_load_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("token_s", "sample_s", "send_s"):
            values = np.ascontiguousarray(getattr(self, name), np.float64)
            require(values.ndim == 1 and values.size >= 1 and bool(np.isfinite(values).all()) and values.min() >= 0,
                    name, "an array", "give finite seconds >= 0 per count, from 0")
            object.__setattr__(self, name, values)

    @property
    def max_tokens(self) -> int:
        return int(self.token_s.shape[0]) - 1

    @property
    def max_batch(self) -> int:
        return int(self.sample_s.shape[0]) - 1

    @property
    def device_weight_bytes(self) -> float:
        """Parameters in device memory per device: the resident blocks', the embedding's and
        the head's, and the staging buffer of ``STAGING_BLOCKS`` streamed blocks."""
        freed = self.streamed_blocks - min(self.streamed_blocks, STAGING_BLOCKS)
        return self.weight_bytes - freed * self.block_weight_bytes

    def time(self, tokens: int, attention: float, decodes: int, kv_tokens: float, sampled: int) -> float:
        """Seconds of one iteration of ``tokens`` tokens (module docstring)."""
        compute = iteration_seconds(self.base_s, float(self.token_s[tokens]), self.prefill_attention_s, attention,
                                    self.decode_request_s, decodes, self.kv_token_s, kv_tokens,
                                    float(self.sample_s[sampled]))
        return streamed_seconds(compute, self.blocks, self.streamed_blocks, self.block_load_s)

    def flops(self, tokens: int, attention: float, kv_tokens: float) -> float:
        """Model FLOPs of one iteration on this stage (all its devices)."""
        return iteration_flops(self.flops_per_token, tokens, self.flops_per_attention, attention, kv_tokens)


def iteration_seconds(base_s, token_s, prefill_attention_s, attention, decode_request_s, decodes, kv_token_s,
                      kv_tokens, sample_s):
    """The iteration time of the module docstring from a stage's terms, ``token_s`` and
    ``sample_s`` already read at the batch's T and n: plain arithmetic, so the serving
    engine compiles this one statement of it."""
    return (base_s + token_s + prefill_attention_s * attention + decode_request_s * decodes
            + kv_token_s * kv_tokens + sample_s)


# streamed blocks in device memory at once: the one computing and the one loading (a double
# buffer, as FlexGen and ZeRO-Inference prefetch the next layer during the current one)
STAGING_BLOCKS = 2


def streamed_seconds(compute_s, blocks, streamed, load_s):
    """An iteration of ``compute_s`` seconds of compute on a stage of ``blocks`` blocks whose
    last ``streamed`` are loaded over the host link (``load_s`` seconds each) while the
    earlier ones compute. Each block computes c = compute_s / blocks (the embedding and head
    counted in); the R = compute_s - streamed x c of the resident blocks runs first. Block
    k's load starts when the link is free and a staging slot is (block k - 2's compute has
    ended), its compute when block k - 1's compute and its own load have ended. That
    recurrence has the closed form

        max(R + m c, w + m c, m w + c, R + s c + (m - s) w),   s = min(m, 2)

    (m = ``streamed``, w = ``load_s``): the compute chain; the first load then every streamed
    block's compute; every load then the last compute; the staging slots, which let only s
    loads run during the resident compute. Plain arithmetic: the engine compiles it.

    >>> streamed_seconds(1.0, 10, 0, 5.0), streamed_seconds(1.0, 10, 5, 0.01), streamed_seconds(1.0, 10, 5, 0.5)
    (1.0, 1.0, 2.6)
    """
    if streamed <= 0:
        return compute_s
    per_block = compute_s / blocks
    staged = min(streamed, STAGING_BLOCKS)
    return max(compute_s, load_s + streamed * per_block, streamed * load_s + per_block,
               compute_s - (streamed - staged) * per_block + (streamed - staged) * load_s)


def resident_blocks(blocks: int, resident: float) -> int:
    """Blocks of a stage of ``blocks`` kept on the device at residency ``resident`` (its
    first floor(resident x blocks); all of them at 1).

    >>> resident_blocks(40, 0.25), resident_blocks(40, 1.0), resident_blocks(3, 0.5)
    (10, 40, 1)
    """
    return min(blocks, math.floor(resident * blocks + 1e-9))


def check_resident(resident: object) -> float:
    """A residency: a share of each stage's layers kept on the GPU, in (0, 1]."""
    require(isinstance(resident, int | float) and not isinstance(resident, bool) and 0.0 < resident <= 1.0,
            "resident", resident, "give the share of each stage's layers kept on the GPU, in (0, 1]")
    return float(resident)


def with_residency(costs: StageIterationCosts, device: DeviceSpec, resident: float, *,
                   source: Tier = Tier.HOST) -> StageIterationCosts:
    """``costs`` with only ``resident`` of its blocks kept on ``device``: the rest live in
    ``source`` (host memory or disk) and each iteration loads them block by block over the
    link (``model.tiers.move_seconds``), into ``STAGING_BLOCKS`` blocks of device memory;
    ``streamed_seconds`` is the iteration's time. The streamed blocks must fit the tier."""
    check_resident(resident)
    streamed = costs.blocks - resident_blocks(costs.blocks, resident)
    if streamed == 0:
        return costs
    held = streamed * costs.block_weight_bytes
    capacity = tier_capacity(device, source)
    require(held <= capacity, "resident", resident,
            f"stage {costs.stage} streams {held / 1e9:.1f} GB of weights from {source}, which holds "
            f"{capacity / 1e9:.1f} GB per device; give a higher --resident or a tier with room")
    return dataclasses.replace(costs, streamed_blocks=streamed,
                               block_load_s=move_seconds(device, costs.block_weight_bytes, source, Tier.DEVICE))


def iteration_flops(flops_per_token, tokens, flops_per_attention, attention, kv_tokens):
    """Model FLOPs of an iteration on a stage: its GEMMs at T tokens, its attention (plain
    arithmetic, compiled by the serving engine)."""
    return flops_per_token * tokens + flops_per_attention * (attention + kv_tokens)


# --- the kernel model's iteration costs -------------------------------------------------
# A layer's forward at T tokens is its training kernels at one token (``layer_plans`` at a
# batch of one 1-token sequence) with every matmul's rows and every elementwise kernel's
# bytes scaled by T; the attention core is left out (the attention coefficients carry it).


@dataclass(frozen=True, eq=False)
class _Tables:
    """One device's layer times over token counts, per kind of layer (every block alike)."""

    embedding: np.ndarray  # [max_tokens + 1] seconds: lookup (+ its vocab-parallel all-reduce)
    block: np.ndarray  # [max_tokens + 1] seconds: one transformer block without its attention core
    head: np.ndarray  # [max_batch + 1] seconds: final norm, LM head and sampling of n sequences


@functools.lru_cache(maxsize=64)
def inference_plans(model: ModelSpec, tp: int, dtype: str) -> tuple[LayerPlan, ...]:
    """Every layer's kernels for one token per rank of a ``tp``-way group (no dropout:
    inference runs none; plain all-reduces, no sequence parallelism)."""
    if model.measured:
        raise PipeschedError(f"model={model.name}: its layers are measured, with no kernel shapes to cost an "
                             "iteration from; give a model with its shape, or a fitted latency model "
                             "(--latency-model FILE)")
    require(dtype in DTYPE_BYTES and dtype not in FP8_DTYPES, "dtype", dtype,
            f"must be one of {', '.join(d for d in DTYPE_BYTES if d not in FP8_DTYPES)} (fp8 is a training dtype)")
    settings = TrainingSettings(micro_batch_size=1, seq_len=1, tensor_parallel=tp, dtype=dtype,
                                sequence_parallel=False)
    return tuple(layer_plans(dataclasses.replace(model, dropout=False), settings))


def kernel_at_tokens(kernel: Kernel, tokens: np.ndarray, elem: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows per matmul and bytes moved of a 1-token ``kernel`` run at ``tokens`` tokens.

    A weight matmul reads its weights once whatever the rows (what makes decode sizes
    memory-bound); of an MoE layer's E experts, the expected number that T x k routed rows
    touch, E (1 - (1 - 1/E)^(T k)), is read."""
    tokens = np.asarray(tokens, np.float64)
    if kernel.groups == 0:
        return np.zeros_like(tokens), kernel.traffic * tokens
    rows = kernel.m * tokens
    if kernel.backward != WEIGHT_MATMUL:
        return rows, kernel.traffic * tokens
    weights = elem * kernel.groups * kernel.k * kernel.n  # bytes of all the kernel's weight matrices
    touched = 1.0 if kernel.groups == 1 else 1.0 - (1.0 - 1.0 / kernel.groups) ** (kernel.m * kernel.groups * tokens)
    return rows, weights * touched + (kernel.traffic - weights) * tokens


def layer_forward_s(plan: LayerPlan, device: DeviceSpec, levels: tuple[CollectiveLevel, ...],
                    tokens: np.ndarray, *, dtype: str = "bf16") -> np.ndarray:
    """Seconds of ``plan``'s forward at each count of ``tokens`` (every count >= 1) without
    its attention core, its tensor-parallel collectives over ``levels`` included."""
    fp32, elem = dtype == "fp32", DTYPE_BYTES[dtype]
    total = np.zeros(tokens.shape)
    for kernel in plan.kernels:
        if kernel.attention_core:
            continue
        rows, traffic = kernel_at_tokens(kernel, tokens, elem)
        if kernel.groups == 0:
            total += kernels.memory_time(device, traffic)
        else:
            total += kernels.matmul_time(device, rows, kernel.n, kernel.k, groups=kernel.groups, traffic=traffic,
                                         fp32=fp32)
    for collective in plan.collectives:
        if not collective.backward:
            total += collective_seconds(collective.kind, collective.nbytes * tokens, levels)
    return total


def _from_zero(values: np.ndarray) -> np.ndarray:
    """``values`` at counts 1..N behind a 0 at count 0, read-only (cached tables are shared)."""
    table = np.concatenate([[0.0], values])
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=256)
def _tables(model: ModelSpec, device: DeviceSpec, levels: tuple[CollectiveLevel, ...], tp: int, dtype: str,
            max_tokens: int, max_batch: int) -> _Tables:
    """A pure function of hashable inputs: a search asks for the same tables on every
    replica count and scheduler."""
    plans = inference_plans(model, tp, dtype)
    tokens = np.arange(1, max_tokens + 1, dtype=np.float64)
    batch = np.arange(1, max_batch + 1, dtype=np.float64)
    return _Tables(
        embedding=_from_zero(layer_forward_s(plans[0], device, levels, tokens, dtype=dtype)),
        block=_from_zero(layer_forward_s(plans[1], device, levels, tokens, dtype=dtype)),
        head=_from_zero(layer_forward_s(plans[-1], device, levels, batch, dtype=dtype)),
    )


def _stage_partition(model: ModelSpec, tables: Sequence[_Tables], max_tokens: int, max_batch: int) -> tuple[int, ...]:
    """Layer bounds of the stages: ``min_bottleneck`` (the training partitioner) over each
    layer's time in the largest iteration (blocks and embedding at the token budget, the
    head sampling a full batch), on each stage's device."""
    compute = np.array([[table.embedding[max_tokens], *([table.block[max_tokens]] * model.num_layers),
                         table.head[max_batch]] for table in tables])
    result = min_bottleneck(compute)
    assert result is not None  # no memory caps: every partition is allowed
    return result.partition.bounds


def stage_iteration_costs(model: ModelSpec, cluster: Cluster, *, tp: int, first_ranks: Sequence[int],
                          max_tokens: int, max_batch: int, dtype: str = "bf16") -> tuple[StageIterationCosts, ...]:
    """Every stage's iteration costs from the kernel model: stage s runs on the ``tp``
    cluster ranks from ``first_ranks[s]`` (costed on that rank's device), its tables over 0
    ... ``max_tokens`` tokens and 0 ... ``max_batch`` sampled sequences.

    >>> from pipesched.model import load_cluster, load_model
    >>> costs = stage_iteration_costs(load_model("llama3-8b"), load_cluster("1x8-h100"), tp=2,
    ...                               first_ranks=(0, 2), max_tokens=512, max_batch=64)
    >>> [c.layers for c in costs]
    [(0, 17), (17, 34)]
    """
    pp = len(first_ranks)
    require(1 <= pp <= max(model.num_layers, 1), "p", pp,
            f"{model.name} has {model.num_layers} transformer blocks; give at most that many stages (-p)")
    for first in first_ranks:
        require(first >= 0 and first + tp <= cluster.num_devices, "tensor_parallel", tp,
                f"stage ranks {first}..{first + tp - 1} are not all in the cluster's {cluster.num_devices} devices")
        require(all(cluster.same_node(first, r) for r in range(first, first + tp)), "tensor_parallel", tp,
                "a stage's group spans two nodes; use a degree that divides the node size")
    plans = inference_plans(model, tp, dtype)
    # the tensor-parallel ring inside a node, as training costs it (``transformer.allreduce_time``)
    levels = [link_levels(cluster.intra_node, tp)] * pp
    devices = [cluster.devices[first] for first in first_ranks]
    tables = [_tables(model, device, level, tp, dtype, max_tokens, max_batch) for device, level in
              zip(devices, levels, strict=True)]
    bounds = _stage_partition(model, tables, max_tokens, max_batch)
    placed = _Placed(model, plans, cluster, tuple(first_ranks), tp, dtype, max_tokens, max_batch)
    return tuple(_stage(placed, stage, bounds, tables[stage]) for stage in range(pp))


@dataclass(frozen=True)
class _Attention:
    """One block's attention on one device of a ``tp``-way group, per unit of its work."""

    prefill_s: float  # seconds per unit of chunk x (context + chunk)
    request_s: float  # seconds per decode request: its query read and output written
    kv_token_s: float  # seconds per cached token a decode reads (memory-bound)
    kv_bytes: float  # bytes of one token's keys and values on this device

    @classmethod
    def of(cls, model: ModelSpec, device: DeviceSpec, tp: int, elem: int) -> _Attention:
        heads, head_dim = model.num_heads / tp, model.kv_channels
        bandwidth = device.memory_bandwidth * device.bandwidth_efficiency
        # a query row against a key row: 2 d FLOPs for the score and 2 d for the context, over
        # the rectangle of keys the chunk's query tiles visit (the causal half of the diagonal
        # tiles is computed too, as FlashAttention's tiles do)
        flops = 4.0 * heads * head_dim
        if kernels.uses_flash(device, elem):
            prefill = flops / (device.peak_flops * device.flash_forward_efficiency)
        else:  # unfused: the scores are written, soft-maxed (read and written) and read again
            prefill = flops / (device.peak_flops * device.matmul_efficiency) + 4.0 * heads * elem / bandwidth
        kv_bytes = model.kv_cache_elements(tp) * elem  # keys and values, or the latent of latent attention
        return cls(prefill, 2.0 * heads * head_dim * elem / bandwidth, kv_bytes / bandwidth, kv_bytes)


def block_attention(model: ModelSpec, device: DeviceSpec, *, tp: int = 1, dtype: str = "bf16") -> _Attention:
    """One block's attention on one device of a ``tp``-way group, per unit of its work
    (``prefill_s`` per unit of chunk x (context + chunk), ``request_s`` per decode request,
    ``kv_token_s`` per cached token a decode reads, ``kv_bytes`` of one token's keys and
    values): the terms every stage's iteration costs are made of, for a model of offloaded
    inference that times the same attention (``pipesched.serving.offload``)."""
    require(dtype in DTYPE_BYTES, "dtype", dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
    return _Attention.of(model, device, tp, DTYPE_BYTES[dtype])


def workspace_bytes_per_token(plan: LayerPlan, elem: int) -> float:
    """Bytes per token live at once in ``plan``'s forward beside the residual stream: its
    largest weight matmul's input and output (``_bytes_per_token``)."""
    return max((_bytes_per_token(kernel, elem) for kernel in plan.kernels), default=0.0)


def _bytes_per_token(kernel: Kernel, elem: int) -> float:
    """Bytes of one token's input and output of a weight matmul: what is live at once
    beside the residual stream (the elementwise kernels work in place or on as much)."""
    if kernel.backward != WEIGHT_MATMUL or kernel.groups == 0:
        return 0.0
    return elem * kernel.m * kernel.groups * (kernel.k + kernel.n)


def _send_s(cluster: Cluster, src: int, dst: int, nbytes: float, max_tokens: int) -> np.ndarray:
    """Seconds to send the hidden states of 0 ... ``max_tokens`` tokens (``nbytes`` each)."""
    if src == dst:
        return np.zeros(max_tokens + 1)
    tokens = np.arange(1, max_tokens + 1, dtype=np.float64)
    return np.concatenate([[0.0], cluster.latency(src, dst) + nbytes * tokens / cluster.link(src, dst).bandwidth])


@dataclass(frozen=True)
class _Placed:
    """What every stage of one pipeline shares: the model's kernels, the cluster, the ranks."""

    model: ModelSpec
    plans: tuple[LayerPlan, ...]
    cluster: Cluster
    first_ranks: tuple[int, ...]
    tp: int
    dtype: str
    max_tokens: int
    max_batch: int


def _stage(placed: _Placed, stage: int, bounds: Sequence[int], table: _Tables) -> StageIterationCosts:
    """One stage's record: its layers' sums of the device tables, its attention coefficients,
    its send to the next stage and its memory."""
    model, cluster, ranks = placed.model, placed.cluster, placed.first_ranks
    device = cluster.devices[ranks[stage]]
    stage_plans = placed.plans[bounds[stage]:bounds[stage + 1]]
    blocks = sum(1 for plan in stage_plans if plan.kind not in (EMBEDDING, LOSS))
    elem = DTYPE_BYTES[placed.dtype]
    attention = _Attention.of(model, device, placed.tp, elem)
    token_s = blocks * np.asarray(table.block)
    if stage_plans[0].kind == EMBEDDING:
        token_s = token_s + table.embedding
    has_head = stage_plans[-1].kind == LOSS
    hidden = model.hidden_size * elem  # bytes of one token's hidden state
    last = stage == len(ranks) - 1
    largest = max(_bytes_per_token(kernel, elem) for plan in stage_plans if plan.kind != LOSS
                  for kernel in plan.kernels)
    logits = placed.max_batch * model.vocab_size / placed.tp * 4.0 if has_head else 0.0  # fp32, a full batch
    return StageIterationCosts(
        stage=stage, layers=(bounds[stage], bounds[stage + 1]),
        base_s=blocks * device.kernel_overhead_s,  # each block's attention kernel
        token_s=token_s,
        prefill_attention_s=blocks * attention.prefill_s,
        decode_request_s=blocks * attention.request_s,
        kv_token_s=blocks * attention.kv_token_s,
        sample_s=table.head if has_head else np.zeros(placed.max_batch + 1),
        send_s=np.zeros(placed.max_tokens + 1) if last else _send_s(cluster, ranks[stage], ranks[stage + 1], hidden,
                                                                     placed.max_tokens),
        weight_bytes=elem * sum(plan.params for plan in stage_plans),
        kv_bytes_per_token=blocks * attention.kv_bytes,
        workspace_bytes=placed.max_tokens * (hidden + largest) + logits,
        # model FLOPs: the weight matmuls of every token (the LM head's are the sampled rows')
        flops_per_token=placed.tp * sum(kernel.flops for plan in stage_plans if plan.kind != LOSS
                                        for kernel in plan.kernels if kernel.backward == WEIGHT_MATMUL),
        flops_per_attention=blocks * 4.0 * model.num_heads * model.kv_channels,
        hidden_bytes_per_token=0.0 if last else hidden,
        blocks=blocks, block_weight_bytes=elem * placed.plans[1].params,
    )


# --- a fitted latency model (DistServe's form) ----------------------------------------------


def latency_costs(rows: Sequence[LatencyRow], model: ModelSpec, cluster: Cluster, *, tp: int,
                  first_ranks: Sequence[int], max_tokens: int, max_batch: int,
                  dtype: str = "bf16") -> tuple[StageIterationCosts, ...]:
    """Every stage's iteration costs from its fitted row, exactly the fitted form: ``token_s``
    is ``prefill_token_s`` x T, and since T counts the decodes too, ``decode_request_s`` is
    the row's less ``prefill_token_s`` (a decode costs the row's ``decode_request_s`` in
    all); no separate sampling. The layers, memory, FLOPs and sends are the kernel model's
    (``stage_iteration_costs``)."""
    require(len(rows) == len(first_ranks), "latency_model", f"{len(rows)} stages",
            f"give one row per pipeline stage ({len(first_ranks)}), stage 0 to {len(first_ranks) - 1}")
    built = stage_iteration_costs(model, cluster, tp=tp, first_ranks=first_ranks, max_tokens=max_tokens,
                                  max_batch=max_batch, dtype=dtype)
    tokens = np.arange(max_tokens + 1, dtype=np.float64)
    return tuple(
        dataclasses.replace(stage, base_s=row.base_s, token_s=row.prefill_token_s * tokens,
                            prefill_attention_s=row.prefill_attention_s,
                            decode_request_s=row.decode_request_s - row.prefill_token_s,
                            kv_token_s=row.kv_token_s, sample_s=np.zeros(max_batch + 1))
        for stage, row in zip(built, sorted(rows, key=lambda row: row.stage), strict=True))


# columns of the samples ``fit_latency_rows`` takes, one measured iteration of one stage a row
SAMPLE_COLUMNS = ("stage", "tokens", "attention", "decodes", "kv_tokens", "seconds")


def fit_latency_rows(samples: np.ndarray) -> tuple[LatencyRow, ...]:
    """Each stage's latency row fitted to its measured iterations: ``samples`` is an
    [n, 6] array of ``SAMPLE_COLUMNS`` (tokens = prefill tokens + decodes, as
    ``StageIterationCosts.time`` counts them), and each stage's coefficients are the
    non-negative least-squares fit of seconds on (1, prefill tokens, attention, decodes,
    KV tokens).

    >>> samples = np.array([[0, t, 0, d, kv, 1e-3 + 2e-5 * (t - d) + 1e-4 * d + 1e-7 * kv]
    ...                     for t, d, kv in ((8, 0, 0), (64, 0, 0), (4, 4, 900), (16, 16, 2000), (40, 8, 300))])
    >>> row = fit_latency_rows(samples)[0]
    >>> round(row.base_s, 6), round(row.prefill_token_s, 7), round(row.decode_request_s, 6)
    (0.001, 2e-05, 0.0001)
    """
    data = np.asarray(samples, np.float64)
    require(data.ndim == 2 and data.shape[1] == len(SAMPLE_COLUMNS), "samples", data.shape,
            f"give one row of {', '.join(SAMPLE_COLUMNS)} per measured iteration")
    require(bool(np.isfinite(data).all()) and data.min(initial=0.0) >= 0, "samples", "a negative or non-finite value",
            "give finite measurements >= 0")
    require(bool((data[:, 1] >= data[:, 3]).all()), "samples", "fewer tokens than decodes",
            "count each decode among the iteration's tokens (tokens = prefill tokens + decodes)")
    rows = []
    for stage in np.unique(data[:, 0]).astype(int):
        part = data[data[:, 0] == stage]
        design = np.column_stack([np.ones(len(part)), part[:, 1] - part[:, 3], part[:, 2], part[:, 3], part[:, 4]])
        base, prefill, attention, decode, kv = nonnegative_least_squares(design, part[:, 5])
        rows.append(LatencyRow(int(stage), base, prefill, attention, decode, kv))
    return tuple(rows)


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray, *, iterations: int = 100) -> tuple[float, ...]:
    """x >= 0 minimising |a x - b| (Lawson and Hanson's active-set method): columns enter
    the passive set by the largest gradient; a step that would turn one negative stops on
    the boundary and drops it. Columns are scaled to unit norm first (seconds per token and
    per squared token differ by orders of magnitude).

    >>> nonnegative_least_squares(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0]))
    (2.0, 0.0)
    """
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scaled = a / norms
    x = np.zeros(a.shape[1])
    passive = np.zeros(a.shape[1], dtype=bool)
    for _ in range(iterations):
        gradient = scaled.T @ (b - scaled @ x)
        free = ~passive & (gradient > 1e-12 * max(1.0, float(np.abs(b).max(initial=0.0))))
        if not free.any():
            break
        passive[np.argmax(np.where(free, gradient, -np.inf))] = True
        while True:
            z = np.zeros_like(x)
            z[passive] = np.linalg.lstsq(scaled[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocked = passive & (z <= 0)
            step = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + step * (z - x)
            passive &= x > 1e-15
    return tuple(float(value) for value in x / norms)
