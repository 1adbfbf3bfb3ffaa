"""Offline inference with offloading, the FlexGen way (Sheng et al., "FlexGen:
High-Throughput Generative Inference of Large Language Models with a Single GPU", ICML 2023):
a fixed block of sequences, every prompt prefilled and ``gen_len`` tokens generated for each,
tokens per second maximised with weights, KV cache and activations placed across device
memory, host memory and disk by percentages.

The block. ``gpu_batch`` sequences form a GPU batch and ``num_batches`` GPU batches a block
(``gpu_batch x num_batches`` sequences). The model is a list of units, FlexGen's layers: the
embedding, each block's attention (with its KV cache) and its MLP, the head.

The zig-zag block schedule. For each generated token (the first one is the prefill), walk
unit by unit and, inside a unit, batch by batch: step (token i, unit j, batch k) computes
batch k on unit j and, on their own streams at once, loads the next step's KV cache and
input hidden state, stores the previous step's KV cache and output hidden state, and, at
batch 0, loads the next unit's offloaded weights (FlexGen's ``generation_loop_overlap``:
every step ends with a sync). A step takes its longest stream: the compute (the device's
kernels, then the host's attention over the cache held in host memory when compute is
delegated), or the busiest link the step's moves cross (``pipesched.model.tiers``:
each direction of the host link and of the disk is its own link). Without overlap the step
runs its moves and its compute one after another. Before the first step the first unit's
weights load with nothing to hide behind.

Costs. A unit's device time is the kernel model's (``pipesched.model.inference``: the
layer's kernels at the step's tokens, ``gpu_batch x prompt_len`` at the prefill and
``gpu_batch`` at a decode step, and its attention: the prefill's over the prompt, a
decode's over its cached tokens), plus the device's fixed cost per op. Compute delegation
(FlexGen's ``--cpu``): a decode's attention over the share of the cache in host memory or on
disk runs on the host at the device's ``host_attention_flops`` (the disk share read into
host memory first), so that share of the cache never crosses the host link.

Placement. Weights go tensor by tensor (FlexGen's ``init_weight_list``): each weight matrix
of a unit goes whole to the tier whose share of the cumulative percentages (disk first, then
host memory, then device memory) holds the matrix's middle; the query, key and value
projections are three tensors, as OPT's checkpoints and FlexGen hold them. The KV cache and
the activations are split by their percentages.

Memory per tier (checked against ``tiers.tier_capacity``; a placement that does not fit is
refused): device memory holds its weights, two buffers of the largest unit's offloaded
weights (the unit computed and the one loading), its share of the block's KV cache at full
length, its share of the block's hidden states, two buffers of one batch's hidden state
when they move, two of one batch's cache when it is loaded to the device, and the workspace
of one batch's prefill; host memory its weights (and two staging buffers of a unit's disk
weights), its share of the cache (and two staging buffers of one batch's disk cache when
the host attends over it) and of the hidden states; disk its shares.

>>> from pipesched.model import load_device, load_model
>>> run = offline_run(load_model("opt-1.3b"), load_device("t4"), OfflineTask(128, 8),
...                   OffloadPolicy(gpu_batch=4, num_batches=2))
>>> run.sequences, run.generated_tokens, run.throughput_tokens_per_s > 0
(8, 64, True)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from pipesched.enums import Tier
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_OFFLINE_BATCHES, MAX_OFFLINE_SEQUENCES, MAX_SEQ_LEN, check_count
from pipesched.model.hardware import DeviceSpec
from pipesched.model.inference import (
    block_attention,
    inference_plans,
    layer_forward_s,
    workspace_bytes_per_token,
)
from pipesched.model.spec import DTYPE_BYTES, EMBEDDING, LOSS, ModelSpec
from pipesched.model.tiers import TIERS, link_seconds, links_seconds, tier_capacity
from pipesched.model.transformer import QKV_KERNEL, WEIGHT_MATMUL, Kernel, LayerPlan
from pipesched.units import GB

DEVICE, HOST, DISK = range(3)  # a tier's column in the share arrays (``TIERS`` order)
ATTENTION_UNIT, MLP_UNIT = "a", "m"  # the two units of a transformer block (FlexGen's two layers)


@dataclass(frozen=True)
class TierShares:
    """One kind of tensor's percentages in device memory, host memory and disk (FlexGen's
    ``--percent``, the disk share made explicit): each in [0, 100], summing to 100.

    >>> TierShares.parse("weights", "20,80,0").fraction(Tier.HOST)
    0.8
    """

    device: float = 100.0
    host: float = 0.0
    disk: float = 0.0

    def __post_init__(self) -> None:
        values = (self.device, self.host, self.disk)
        require(all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 100
                    for v in values), "percentages", ",".join(map(str, values)),
                "give three percentages in [0, 100]: device memory, host memory, disk")
        require(abs(sum(values) - 100.0) <= 1e-6, "percentages", ",".join(f"{v:g}" for v in values),
                "the device, host and disk percentages must sum to 100")
        for name, value in zip(("device", "host", "disk"), values, strict=True):
            object.__setattr__(self, name, float(value))  # plain floats (JSON), whatever array they came from

    @classmethod
    def parse(cls, field: str, text: str) -> TierShares:
        """``"G,C,D"``: percentages on the device, in host memory, on disk."""
        parts = [part.strip() for part in str(text).split(",")]
        try:
            values = [float(part) for part in parts]
        except ValueError:
            values = []
        require(len(values) == 3 and all(math.isfinite(v) for v in values), field, str(text)[:40],
                "give three percentages G,C,D (device, host memory, disk), e.g. 20,80,0")
        try:
            return cls(*values)
        except PipeschedError as error:
            raise PipeschedError(f"{field}={str(text)[:40]}: {str(error).split(': ', 1)[-1]}") from None

    def fraction(self, tier: Tier) -> float:
        return (self.device, self.host, self.disk)[TIERS.index(tier)] / 100.0

    @property
    def fractions(self) -> tuple[float, float, float]:
        return (self.device / 100.0, self.host / 100.0, self.disk / 100.0)

    def __str__(self) -> str:
        return ",".join(f"{v:g}" for v in (self.device, self.host, self.disk))


@dataclass(frozen=True)
class OffloadPolicy:
    """Where the tensors live and how the block is cut (FlexGen's policy)."""

    weights: TierShares = TierShares()
    cache: TierShares = TierShares()  # the KV cache
    activations: TierShares = TierShares()  # the hidden states between units
    gpu_batch: int = 1  # sequences of one GPU batch
    num_batches: int = 1  # GPU batches of one block
    host_attention: bool = True  # compute delegation: the host attends over the cache it holds
    overlap: bool = True  # loads, stores and compute on their own streams (False: one after another)

    def __post_init__(self) -> None:
        check_count("gpu_batch", self.gpu_batch, MAX_OFFLINE_SEQUENCES, what="sequences")
        check_count("num_batches", self.num_batches, MAX_OFFLINE_BATCHES, what="GPU batches")
        check_count("block", self.gpu_batch * self.num_batches, MAX_OFFLINE_SEQUENCES,
                    what="sequences (gpu_batch x num_batches)")

    @property
    def sequences(self) -> int:
        return self.gpu_batch * self.num_batches


@dataclass(frozen=True)
class OfflineTask:
    """Every sequence of the block: ``prompt_len`` prompt tokens, ``gen_len`` generated."""

    prompt_len: int
    gen_len: int

    def __post_init__(self) -> None:
        check_count("prompt_len", self.prompt_len, MAX_SEQ_LEN, what="tokens")
        check_count("gen_len", self.gen_len, MAX_SEQ_LEN, what="tokens")


@dataclass(frozen=True, eq=False)
class Units:
    """The model's units for one GPU batch (placement aside), one entry per unit."""

    kind: tuple[str, ...]  # E, a (attention), m (MLP), L
    tensors: tuple[tuple[float, ...], ...]  # bytes of each weight tensor, in order
    prefill_s: np.ndarray  # device seconds of one batch's prefill, attention over the prompt included
    decode_s: np.ndarray  # device seconds of one batch's decode step, without the attention over the cache
    kv_read_s: np.ndarray  # device seconds per cached token per sequence a decode's attention reads
    attention_flops: np.ndarray  # FLOPs per cached token per sequence of a decode's attention
    kv_bytes: np.ndarray  # KV-cache bytes per token per sequence
    hidden_bytes: np.ndarray  # bytes of the unit's output per token per sequence
    workspace_bytes: float  # device bytes of one batch's prefill working set
    op_overhead_s: float  # fixed device seconds of each step

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def weight_bytes(self) -> np.ndarray:
        return np.array([sum(t) for t in self.tensors])


def _split_block(plan: LayerPlan) -> tuple[LayerPlan, LayerPlan]:
    """A block's attention unit (its kernels to the output projection after the attention
    core and the residual add after it) and its MLP unit (the rest)."""
    cores = [i for i, kernel in enumerate(plan.kernels) if kernel.attention_core]
    first = cores[-1] + 1 if cores else 0
    cut = next((i + 1 for i in range(first, len(plan.kernels)) if plan.kernels[i].backward == WEIGHT_MATMUL),
               len(plan.kernels))
    if cut < len(plan.kernels) and plan.kernels[cut].backward != WEIGHT_MATMUL:
        cut += 1  # the residual add after the projection
    return (dataclasses.replace(plan, kernels=plan.kernels[:cut]),
            dataclasses.replace(plan, kernels=plan.kernels[cut:]))


def _matrix_columns(kernel: Kernel, kv_width: float) -> tuple[float, ...]:
    """The output columns of each weight tensor a weight matmul multiplies by: one, or the
    fused QKV projection's three, its query, key and value matrices (``kv_width`` columns
    each of the key's and the value's), as OPT's checkpoints and FlexGen's ``SelfAttention``
    hold them (``w_q``, ``w_k``, ``w_v``, each placed on its own)."""
    if kernel.name == QKV_KERNEL and 0 < 2 * kv_width < kernel.n:
        return (kernel.n - 2 * kv_width, kv_width, kv_width)
    return (kernel.n,)


def _tensors(plan: LayerPlan, params: float, elem: int, kv_width: float) -> tuple[float, ...]:
    """Bytes of ``plan``'s weight tensors: its weight matrices (``_matrix_columns``), then the
    rest of ``params`` (biases, norms, embeddings) as one."""
    matrices = [elem * k.groups * k.k * columns for k in plan.kernels if k.backward == WEIGHT_MATMUL and k.groups > 0
                for columns in _matrix_columns(k, kv_width)]
    rest = max(elem * params - sum(matrices), 0.0)
    return tuple(matrices) + ((rest,) if rest > 0 else ())


def _unit_row(kind: str, unit: LayerPlan, params: float, out_bytes: float, device: DeviceSpec, attention,
              task: OfflineTask, gpu_batch: int, dtype: str, kv_width: float) -> tuple:
    """One unit's entries of ``Units``: its tensors, its prefill and decode times, its
    attention terms and its bytes per token."""
    s, elem = task.prompt_len, DTYPE_BYTES[dtype]
    decode_tokens = np.array([float(gpu_batch)])
    # the LM head samples each sequence's last position only
    prefill_tokens = decode_tokens if kind == LOSS else np.array([float(gpu_batch * s)])
    prefill = float(layer_forward_s(unit, device, (), prefill_tokens, dtype=dtype)[0])
    decode = float(layer_forward_s(unit, device, (), decode_tokens, dtype=dtype)[0])
    if kind != ATTENTION_UNIT:
        return (kind, _tensors(unit, params, elem, kv_width), prefill, decode, 0.0, 0.0, 0.0, out_bytes)
    model_flops = 4.0 * unit.attention[0] * unit.attention[2] if unit.attention else 0.0
    return (kind, _tensors(unit, params, elem, kv_width), prefill + attention.prefill_s * gpu_batch * s * s
            + device.kernel_overhead_s, decode + attention.request_s * gpu_batch + device.kernel_overhead_s,
            attention.kv_token_s, model_flops, attention.kv_bytes, out_bytes)


@functools.lru_cache(maxsize=64)
def offline_units(model: ModelSpec, device: DeviceSpec, task: OfflineTask, gpu_batch: int, *,
                  dtype: str = "fp16") -> Units:
    """The model's units for one GPU batch of ``gpu_batch`` sequences of ``task``: every
    unit's device time at the prefill and per decode step, its cache and hidden-state bytes
    (module docstring)."""
    plans = inference_plans(model, 1, dtype)
    elem = DTYPE_BYTES[dtype]
    attention = block_attention(model, device, dtype=dtype)
    s = task.prompt_len
    rows: list[tuple] = []
    timed: dict = {}
    hidden = float(model.hidden_size * elem)
    # columns of the key (and of the value) projection; latent attention has no fused QKV
    kv_width = 0.0 if model.is_mla else float(model.num_kv_heads * model.kv_channels)
    for plan in plans:
        if plan.kind == EMBEDDING:
            parts = [(EMBEDDING, plan, plan.params, hidden)]
        elif plan.kind == LOSS:
            parts = [(LOSS, plan, plan.params, 0.0)]
        else:
            attn, mlp = _split_block(plan)
            attn_params = sum(k.k * k.n * k.groups for k in attn.kernels if k.backward == WEIGHT_MATMUL)
            parts = [(ATTENTION_UNIT, attn, attn_params, hidden), (MLP_UNIT, mlp, plan.params - attn_params, hidden)]
        for kind, unit, params, out_bytes in parts:
            key = (kind, unit.kernels, params)  # every block alike: timed once
            if key not in timed:
                timed[key] = _unit_row(kind, unit, params, out_bytes, device, attention, task, gpu_batch, dtype,
                                       kv_width)
            rows.append(timed[key])
    kind, tensors, prefill, decode, kv_read, attn_flops, kv_bytes, hidden_out = zip(*rows, strict=True)
    largest = max(workspace_bytes_per_token(plan, elem) for plan in plans[:-1])
    # unfused attention writes one batch's scores: heads x prompt x prompt per sequence
    scores = 0.0 if device.flash_forward_efficiency > 0 else elem * model.num_heads * s * s
    workspace = gpu_batch * (s * hidden + max(s * largest, scores) + model.vocab_size * elem)
    return Units(tuple(kind), tuple(tensors), np.array(prefill), np.array(decode), np.array(kv_read),
                 np.array(attn_flops), np.array(kv_bytes), np.array(hidden_out), float(workspace),
                 device.op_overhead_s)


def weight_split(units: Units, shares: np.ndarray) -> np.ndarray:
    """Bytes of every unit's weights on each tier, [P, units, 3], for P weight placements
    (``shares``: [P, 3] fractions device, host, disk): each tensor whole on the tier whose
    share of the cumulative fractions, disk first, holds its middle (FlexGen's rule)."""
    shares = np.atleast_2d(np.asarray(shares, np.float64))
    out = np.zeros((shares.shape[0], len(units), 3))
    # cumulative ends of disk, host, device, in percent (FlexGen compares percentages)
    ends = np.cumsum(100.0 * shares[:, [DISK, HOST, DEVICE]], axis=1)
    for j, tensors in enumerate(units.tensors):
        sizes = np.asarray(tensors, np.float64)
        if sizes.size == 0:
            continue
        middle = 100.0 * (np.cumsum(sizes) - sizes / 2) / sizes.sum()
        # the first range whose end is past the middle (the last one when none is)
        index = np.minimum((middle[None, :, None] >= ends[:, None, :] - 1e-9).sum(axis=2), 2)
        tier = np.array([DISK, HOST, DEVICE])[index]  # [P, tensors]
        for column in (DEVICE, HOST, DISK):
            out[:, j, column] = ((tier == column) * sizes[None, :]).sum(axis=1)
    return out


@dataclass(frozen=True, eq=False)
class Layout:
    """Which steps are evaluated, each standing for ``unit_count x batch_count`` steps: every
    unit and batch (the timeline), or the distinct ones (a sum)."""

    units: np.ndarray  # int64: the unit index of each unit position
    unit_count: np.ndarray  # float64: steps each unit position stands for
    batch_first: np.ndarray  # bool per batch position: batch 0 (loads the next unit's weights)
    batch_next: np.ndarray  # bool per batch position: its next step is the next unit's batch 0
    batch_prev: np.ndarray  # bool per batch position: its previous step is the previous unit's last batch
    batch_count: np.ndarray  # float64: batches each batch position stands for


def full_layout(num_units: int, num_batches: int) -> Layout:
    """Every unit and every batch, in schedule order."""
    k = np.arange(num_batches)
    return Layout(np.arange(num_units), np.ones(num_units), k == 0, k == num_batches - 1, k == 0, np.ones(num_batches))


def _blocks_alike(units: Units) -> bool:
    """Every block's two units cost and hold the same (a dense model's do; a model with
    dense and MoE blocks does not)."""
    rows = [(units.kind[j], units.tensors[j], units.prefill_s[j], units.decode_s[j], units.kv_bytes[j])
            for j in range(1, len(units) - 1)]
    return all(row == rows[index % 2] for index, row in enumerate(rows))


def compact_layout(units: Units, num_batches: int) -> Layout:
    """The distinct steps: every block's units alike but the first and last block's (their
    neighbours differ), and batch 0, the middle batches and the last batch."""
    kinds, blocks = units.kind, (len(units) - 2) // 2
    if blocks < 3 or kinds[0] != EMBEDDING or kinds[-1] != LOSS or not _blocks_alike(units):
        position, count = np.arange(len(units)), np.ones(len(units))
    else:  # E, the first block, a middle block (standing for blocks - 2), the last block, L
        n = len(units)
        position = np.array([0, 1, 2, 3, 4, n - 3, n - 2, n - 1])
        count = np.array([1, 1, 1, blocks - 2, blocks - 2, 1, 1, 1], np.float64)
    if num_batches <= 3:
        batches = full_layout(1, num_batches)
        return dataclasses.replace(batches, units=position, unit_count=count)
    return Layout(position, count, np.array([True, False, False]), np.array([False, False, True]),
                  np.array([True, False, False]), np.array([1.0, num_batches - 2, 1.0]))


# --- the block schedule's steps ------------------------------------------------------------
# what each step moves, by name: (bytes array, source tier, destination tier)
WEIGHT_LOAD, CACHE_LOAD, HIDDEN_LOAD, CACHE_STORE, HIDDEN_STORE = (
    "weights in", "cache in", "hidden in", "cache out", "hidden out")


@dataclass(frozen=True, eq=False)
class Placements:
    """P placements of one block shape, as arrays (a single run has P = 1)."""

    weights: np.ndarray  # [P, units, 3] bytes of each unit's weights per tier (``weight_split``)
    cache: np.ndarray  # [P, 3] fractions of the KV cache per tier
    activations: np.ndarray  # [P, 3] fractions of the hidden states per tier

    @classmethod
    def of(cls, units: Units, policies: list[OffloadPolicy]) -> Placements:
        return cls(weight_split(units, np.array([p.weights.fractions for p in policies])),
                   np.array([p.cache.fractions for p in policies]),
                   np.array([p.activations.fractions for p in policies]))

    def __len__(self) -> int:
        return int(self.cache.shape[0])


@dataclass(frozen=True, eq=False)
class Steps:
    """Every evaluated step's streams, arrays [P, tokens, unit positions, batch positions]."""

    compute_s: np.ndarray  # the device's kernels
    host_s: np.ndarray  # the host's attention over its share of the cache (compute delegation)
    moves: tuple[tuple[str, np.ndarray, Tier, Tier], ...]  # (name, bytes, source, destination)
    links_s: dict  # LINKS -> busy seconds
    step_s: np.ndarray  # the step's time
    weight: np.ndarray  # steps each evaluated step stands for, broadcastable to step_s
    prologue_s: np.ndarray  # [P] the first unit's weights, loaded before the first step


def block_steps(units: Units, layout: Layout, task: OfflineTask, device: DeviceSpec, placed: Placements,
           gpu_batch: int, *, delegate: bool, overlap: bool, tokens: np.ndarray | None = None) -> Steps:
    """The streams of each step of the layout (module docstring), for every placement, at
    every token (0 = the prefill) or at the ``tokens`` given."""
    n, s, count = task.gen_len, float(task.prompt_len), len(units)
    i = (np.arange(n, dtype=np.float64) if tokens is None else np.asarray(tokens, np.float64))[None, :, None, None]
    j = layout.units[None, None, :, None]
    first, to_next, from_prev = (x[None, None, None, :] for x in (layout.batch_first, layout.batch_next,
                                                                 layout.batch_prev))
    cache, act = placed.cache[:, None, None, None, :], placed.activations[:, None, None, None, :]
    decode = i >= 1
    tokens = np.where(decode, 1.0, s)  # tokens per sequence a step runs
    read_share = cache[..., DEVICE] if delegate else 1.0
    device_s = units.op_overhead_s + np.where(
        decode, units.decode_s[j] + gpu_batch * (s + i) * units.kv_read_s[j] * read_share, units.prefill_s[j])
    host_s = (np.where(decode, gpu_batch * (s + i) * units.attention_flops[j] * (1.0 - cache[..., DEVICE])
                       / device.host_attention_flops, 0.0) if delegate else np.zeros_like(device_s))
    next_unit, prev_unit = (j + 1) % count, j - 1
    wraps = j == count - 1  # the next unit is the next token's embedding
    weights_in = placed.weights[:, next_unit[0, 0, :, 0], :][:, None, :, None, :] * (first & ((i + wraps) < n))[..., None]
    target = np.where(to_next, next_unit, j)
    source = np.where(from_prev, prev_unit, j)
    kv_in = units.kv_bytes[target] * gpu_batch * (s + i - 1) * decode * (target > 0)
    hidden_in = units.hidden_bytes[np.maximum(target - 1, 0)] * gpu_batch * tokens * (target > 0)
    kv_out = units.kv_bytes[np.maximum(source, 0)] * gpu_batch * tokens * (source >= 0) * (i < n - 1)
    hidden_out = units.hidden_bytes[np.maximum(source, 0)] * gpu_batch * tokens * (source >= 0)
    moves = [(WEIGHT_LOAD, weights_in[..., HOST], Tier.HOST, Tier.DEVICE),
             (WEIGHT_LOAD, weights_in[..., DISK], Tier.DISK, Tier.DEVICE)]
    if delegate:
        moves.append((CACHE_LOAD, kv_in * cache[..., DISK], Tier.DISK, Tier.HOST))
    else:
        moves += [(CACHE_LOAD, kv_in * cache[..., HOST], Tier.HOST, Tier.DEVICE),
                  (CACHE_LOAD, kv_in * cache[..., DISK], Tier.DISK, Tier.DEVICE)]
    moves += [(HIDDEN_LOAD, hidden_in * act[..., HOST], Tier.HOST, Tier.DEVICE),
              (HIDDEN_LOAD, hidden_in * act[..., DISK], Tier.DISK, Tier.DEVICE),
              (CACHE_STORE, kv_out * cache[..., HOST], Tier.DEVICE, Tier.HOST),
              (CACHE_STORE, kv_out * cache[..., DISK], Tier.DEVICE, Tier.DISK),
              (HIDDEN_STORE, hidden_out * act[..., HOST], Tier.DEVICE, Tier.HOST),
              (HIDDEN_STORE, hidden_out * act[..., DISK], Tier.DEVICE, Tier.DISK)]
    shape = np.broadcast_shapes(device_s.shape, *(m[1].shape for m in moves), (len(placed), i.shape[1], len(j[0, 0]), 1),
                                first.shape)
    moves = [(name, np.broadcast_to(nbytes, shape), src, dst) for name, nbytes, src, dst in moves]
    busy = {link: np.broadcast_to(seconds, shape) for link, seconds in
            link_seconds(device, [(nbytes, src, dst) for _, nbytes, src, dst in moves]).items()}
    compute = np.broadcast_to(device_s + host_s, shape)
    links = np.stack(list(busy.values()))
    step = np.maximum(compute, links.max(axis=0)) if overlap else compute + links.sum(axis=0)
    first_weights = placed.weights[:, 0, :]
    prologue = [(first_weights[:, HOST], Tier.HOST, Tier.DEVICE), (first_weights[:, DISK], Tier.DISK, Tier.DEVICE)]
    prologue_s = (links_seconds(device, prologue) if overlap else
                  np.sum([np.broadcast_to(v, (len(placed),)) for v in link_seconds(device, prologue).values()], axis=0))
    weight = layout.unit_count[None, None, :, None] * layout.batch_count[None, None, None, :]
    return Steps(np.broadcast_to(device_s, shape), np.broadcast_to(host_s, shape), tuple(moves), busy, step, weight,
                 np.broadcast_to(prologue_s, (len(placed),)))


# --- memory per tier -------------------------------------------------------------------------


def peak_bytes(units: Units, task: OfflineTask, placed: Placements, gpu_batch: int, num_batches: int, *,
               delegate: bool) -> np.ndarray:
    """Bytes each tier holds at its fullest, [P, 3] (device, host, disk; module docstring)."""
    sequences, length = gpu_batch * num_batches, task.prompt_len + task.gen_len
    weights = placed.weights
    offloaded = weights[..., HOST] + weights[..., DISK]  # [P, units]
    kv_block = float(units.kv_bytes.sum()) * sequences * length  # the block's cache at full length
    kv_batch = float(units.kv_bytes.max()) * gpu_batch * length  # one batch's cache of one unit
    hidden = float(units.hidden_bytes.max()) * task.prompt_len  # one sequence's largest hidden state
    cache, act = placed.cache, placed.activations
    moving_cache = (1.0 - cache[:, DEVICE]) if not delegate else 0.0
    device = (weights[..., DEVICE].sum(axis=1) + 2.0 * offloaded.max(axis=1) + cache[:, DEVICE] * kv_block
              + 2.0 * kv_batch * moving_cache + act[:, DEVICE] * hidden * sequences
              + 2.0 * hidden * gpu_batch * (act[:, DEVICE] < 1) + units.workspace_bytes)
    host = (weights[..., HOST].sum(axis=1) + 2.0 * weights[..., DISK].max(axis=1) + cache[:, HOST] * kv_block
            + (2.0 * kv_batch * (cache[:, DISK] > 0) if delegate else 0.0) + act[:, HOST] * hidden * sequences)
    disk = weights[..., DISK].sum(axis=1) + cache[:, DISK] * kv_block + act[:, DISK] * hidden * sequences
    return np.stack([device, host, disk], axis=1)


def capacities(device: DeviceSpec) -> np.ndarray:
    """Bytes of device memory, host memory and disk (``tiers.tier_capacity``)."""
    return np.array([tier_capacity(device, tier) for tier in TIERS])


# --- one run --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class OfflineRun:
    """One block run to its end: its times, its throughput and its memory per tier."""

    model: str
    device: str
    task: OfflineTask
    policy: OffloadPolicy
    prefill_s: float  # the prologue and the prefill (the first token of every sequence)
    decode_s: float  # the other gen_len - 1 tokens
    peak_bytes: tuple[float, float, float]  # device memory, host memory, disk
    capacity_bytes: tuple[float, float, float]
    busy_s: dict  # stream -> seconds busy over the run: compute, host attention, each link
    delegated: bool  # the host attended over its share of the cache
    weight_bytes: tuple[float, float, float]  # the weights on each tier as placed tensor by tensor

    @property
    def weights_placed(self) -> TierShares:
        """The weights' percentages per tier as placed (whole tensors: near the asked ones)."""
        total = sum(self.weight_bytes)
        device, host = (round(100.0 * x / total, 2) for x in self.weight_bytes[:2])
        return TierShares(device, host, round(max(100.0 - device - host, 0.0), 2))

    @property
    def sequences(self) -> int:
        return self.policy.sequences

    @property
    def generated_tokens(self) -> int:
        return self.sequences * self.task.gen_len

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def throughput_tokens_per_s(self) -> float:
        """Generated tokens over the whole run, the prefill's time included (FlexGen's)."""
        return self.generated_tokens / self.total_s

    def to_dict(self) -> dict[str, object]:
        """The run as JSON (``pipesched serve offline --json``)."""
        policy = self.policy
        return {
            "model": self.model, "device": self.device, "prompt_len": self.task.prompt_len,
            "gen_len": self.task.gen_len, "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "placement": {"weights": str(policy.weights), "cache": str(policy.cache),
                          "activations": str(policy.activations)},
            "weights_placed": str(self.weights_placed),
            "weight_bytes": dict(zip(("device", "host", "disk"), self.weight_bytes, strict=True)),
            "gpu_batch": policy.gpu_batch, "num_batches": policy.num_batches, "sequences": self.sequences,
            "host_attention": self.delegated, "overlap": policy.overlap,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s, "total_s": self.total_s,
            "generated_tokens": self.generated_tokens,
            "peak_bytes": dict(zip(("device", "host", "disk"), self.peak_bytes, strict=True)),
            "capacity_bytes": dict(zip(("device", "host", "disk"), self.capacity_bytes, strict=True)),
            "busy_s": dict(self.busy_s),
        }


def link_name(link: tuple[Tier, Tier]) -> str:
    """``host -> device`` for a link of ``LINKS``."""
    short = {Tier.DEVICE: "device", Tier.HOST: "host", Tier.DISK: "disk"}
    return f"{short[link[0]]} -> {short[link[1]]}"


def delegates(device: DeviceSpec, policy: OffloadPolicy) -> bool:
    """Compute delegation is on: asked for, the device's host computes, and some of the
    cache is off the device."""
    return policy.host_attention and device.host_attention_flops > 0 and policy.cache.device < 100


def check_fits(model: ModelSpec, device: DeviceSpec, peak: np.ndarray, policy: OffloadPolicy) -> None:
    """Refuse a placement whose tiers overflow, in one line: a model whose weights and cache
    fit in no arrangement of the tiers, or the first tier over its capacity."""
    capacity = capacities(device)
    needed = float(peak.sum())
    if needed > capacity.sum():
        raise PipeschedError(f"model={model.name}: {needed / GB:,.1f} GB of weights, KV cache and buffers fit nowhere "
                             f"on {device.name} (device {capacity[0] / GB:,.1f} GB + host {capacity[1] / GB:,.1f} GB "
                             f"+ disk {capacity[2] / GB:,.1f} GB); give fewer sequences (--gpu-batch, --num-batches), "
                             "shorter sequences, or a device with more memory or disk")
    for column, what in enumerate(("device memory", "host memory", "disk")):
        if peak[column] > capacity[column]:
            shares = f"weights {policy.weights}, cache {policy.cache}, activations {policy.activations}"
            if capacity[column] == 0:
                raise PipeschedError(f"placement={shares}: {device.name} has no {what}; put every share on the "
                                     "tiers it has (--weights, --cache, --activations), or give a device with "
                                     "host memory and disk")
            raise PipeschedError(f"placement={shares}: {what} needs {peak[column] / GB:,.2f} GB of its "
                                 f"{capacity[column] / GB:,.2f} GB; move shares to the tiers below (--weights, "
                                 "--cache, --activations), give fewer sequences (--gpu-batch, --num-batches), or --optimize")


def offline_run(model: ModelSpec, device: DeviceSpec, task: OfflineTask, policy: OffloadPolicy, *,
                dtype: str = "fp16") -> OfflineRun:
    """``task``'s block run under ``policy`` (module docstring); a placement that does not fit
    is refused."""
    require(task.prompt_len + task.gen_len <= (model.context_length or MAX_SEQ_LEN), "gen_len", task.gen_len,
            f"prompt + generated tokens must fit {model.name}'s context of {model.context_length} tokens")
    units = offline_units(model, device, task, policy.gpu_batch, dtype=dtype)
    placed = Placements.of(units, [policy])
    delegate = delegates(device, policy)
    peak = peak_bytes(units, task, placed, policy.gpu_batch, policy.num_batches, delegate=delegate)[0]
    check_fits(model, device, peak, policy)
    steps = block_steps(units, compact_layout(units, policy.num_batches), task, device, placed, policy.gpu_batch,
                   delegate=delegate, overlap=policy.overlap)
    per_token = (steps.step_s * steps.weight).sum(axis=(2, 3))[0]
    busy = {"compute": float((steps.compute_s * steps.weight).sum()),
            "host attention": float((steps.host_s * steps.weight).sum()),
            **{link_name(link): float((seconds * steps.weight).sum()) for link, seconds in steps.links_s.items()}}
    return OfflineRun(model.name, device.name, task, policy, float(steps.prologue_s[0] + per_token[0]),
                      float(per_token[1:].sum()), tuple(float(x) for x in peak),
                      tuple(float(x) for x in capacities(device)), busy, delegate,
                      tuple(float(x) for x in placed.weights[0].sum(axis=0)))
