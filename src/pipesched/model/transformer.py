"""Per-layer costs of a transformer from its shape: Megatron FLOPs, kernel times,
Korthikanti activation memory.

Every layer is a list of kernels. A kernel is a matmul (2mnk FLOPs) or a memory-bound
elementwise op (norm, softmax, dropout, activation function, residual add). The FLOP counts
are the model's useful work and come from the kernels' shapes alone; the times come from
the time model of ``pipesched.model.kernels`` (a roofline per kernel with tile and wave
quantization of matmuls, a fixed cost per kernel, and the attention core as one fused
causal FlashAttention kernel on devices that have it), so a faster or slower device never
changes a FLOP count.

Backward, per kernel:
- matmul with a weight, ``Y = X W``: the input gradient ``dX = dY W^T`` (in I) and the weight
  gradient ``dW = X^T dY`` (in W) each cost one forward matmul;
- matmul of two activations (attention scores ``Q K^T`` and context ``P V``): two input
  gradients, both in I;
- elementwise: I moves twice the forward bytes.
So backward FLOPs are twice the forward FLOPs, as in Narayanan et al. (2021). With fused
attention the score and context gradients are one flash backward kernel in I (its own
efficiency; it recomputes the scores, so selective recompute adds no time). W also adds
each weight gradient into the existing one (``grad_accumulation_traffic``). ``I`` computes
the output gradient of every weight matmul; W still needs them (``kept_for_w_bytes``).

Forward matmul FLOPs of a dense GPT block: ``24 b s h^2 + 4 b s^2 h`` (QKV 6bsh^2, scores
2bs^2h, context 2bs^2h, projection 2bsh^2, MLP 16bsh^2). Grouped-query attention shrinks the
K and V projections to ``num_kv_heads`` heads; a gated MLP has three ``h x f`` matrices; a
mixture-of-experts MLP runs each token through ``experts_per_token`` experts after a router.
The LM head is a ``h x V`` matmul followed by a cross-entropy over the logits.

Activation bytes kept per microbatch (Korthikanti et al. 2022, 16-bit activations, 1-byte
dropout masks): ``s b h (34 + 5 a s / h)`` for a GPT block with dropout; selective
recompute drops the ``5 a s / h`` attention-core term (recomputed in the backward); full
recompute keeps only the block input ``2 s b h`` and redoes the whole forward inside I.
Tensor parallelism of degree t splits the matmuls and attention (``s b h (10 + 24/t +
5 a s / (h t))``); with sequence parallelism everything is split (``s b h / t (34 + 5 a s / h)``).
Each block then all-reduces its attention and MLP outputs in the forward and the matching
input gradients in I over the intra-node link (ring: ``2 (t-1)/t`` bytes per rank).

Activation memory stays Korthikanti's inventory even with fused attention (which keeps no
scores): choose selective recompute for the memory a FlashAttention layer keeps.

Mixture of experts. Without expert parallelism every expert of a block sits on its stage,
split by tensor parallelism. With ``expert_parallel`` EP > 1 (Megatron-Core's parallel
folding, ``pipesched.model.groups``) each rank routes its ``b s / t`` tokens, dispatches
their ``k`` copies over the EP group in an all-to-all (FP8 under FP8 training), runs its
``E / EP`` experts as one grouped GEMM (tile and wave quantization per expert's rows), and
combines back; the busiest rank under load imbalance (``expert_skew`` or a measured
``expert_load``) sets the rows and the bytes, or a capacity factor pads every expert's
buffer. Shared experts run as a dense MLP on every rank; the first ``first_dense_layers``
blocks are dense. Every kernel carries its phase (attention, dispatch, MLP, combine) and
every collective the phase it ends. Latent attention (DeepSeek's MLA) projects queries
and keys/values through low-rank latents.

FP8 training (``dtype="fp8"``): the linear layers' matmuls (forward, input and weight
gradients) run at the device's ``fp8_peak_flops`` (at its FP8 kernel table's rate by shape
where it has one, ``pipesched.model.kernels``); the router, the LM head, the attention
core and every elementwise kernel stay in bf16, and activations are kept in bf16 (2 bytes).

Context parallelism of degree c (``context_parallel``, Megatron-Core's ``cp_comm_type``)
splits every sequence over c ranks, two chunks of s / 2c tokens each (causal load
balancing): the linear layers and every activation see s / c tokens, the attention core does
1 / c of the causal work (``_core``) and the ranks exchange keys and values in the context
group (``_context_exchange``): p2p ring attention's c - 1 KV hand-offs, each hidden behind
the attention of the block before it up to that block's time (``exposed_exchange_seconds``),
Ulysses' four all-to-alls (a2a), or an all-gather of K and V (allgather).

Not modelled: clock throttling under sustained load and compute/communication overlap
inside a layer (the phases are what a schedule overlaps across microbatches:
``pipesched.model.phases``, DualPipe's and Megatron's overlapped pairs) other than ring
attention's.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import pipesched.model.kernels as kernels
from pipesched.enums import Collective, Group
from pipesched.errors import require
from pipesched.model.collectives import (
    NVLINK_H100,
    CollectiveTime,
    collective_choice,
    collective_seconds,
    link_levels,
)
from pipesched.model.devices import load_device
from pipesched.model.groups import DEVICES_PER_NODE, GroupLevels, levels_on_link
from pipesched.model.hardware import DeviceSpec, LinkSpec
from pipesched.model.spec import (
    EMBEDDING,
    FP8_MATMUL_BYTES,
    LOSS,
    TRANSFORMER,
    LayerCost,
    ModelSpec,
    TrainingSettings,
)

# Tensor-parallel link assumed when none is given: NVLink 4, 450 GB/s per direction.
DEFAULT_TP_LINK = LinkSpec(bandwidth=450e9, latency=3e-6, collectives=NVLINK_H100)

# How a kernel's backward splits (see the module docstring).
WEIGHT_MATMUL = "weight"
ACTIVATION_MATMUL = "activations"
ELEMENTWISE = "elementwise"
# elementwise op on the way to a weight with no input gradient (the embedding lookup): W
# moves twice the forward bytes (the scatter-add into the embedding gradient)
WEIGHT_ELEMENTWISE = "weight elementwise"
QKV_KERNEL = "qkv"  # the fused query, key and value projection of an attention block


@dataclass(frozen=True)
class Kernel:
    """One forward kernel of a layer: its FLOPs and bytes (the work), and for a matmul its
    shape (what the time model needs: ``groups`` matmuls ``[m, k] x [k, n]``)."""

    name: str
    flops: float  # forward FLOPs
    traffic: float  # forward bytes read + written
    backward: str  # WEIGHT_MATMUL, ACTIVATION_MATMUL, ELEMENTWISE or WEIGHT_ELEMENTWISE
    attention_core: bool = False  # recomputed by selective recompute
    groups: float = 0.0  # independent matmuls (heads x sequences, experts); 0 for elementwise kernels
    m: float = 0.0
    n: float = 0.0
    k: float = 0.0
    phase: str = ""  # the part of the layer it runs in (PHASES): what overlaps another microbatch's communication
    high_precision: bool = False  # stays in bf16 under FP8 training (the router and the LM head, as DeepSeek-V3 keeps them)


# The parts of a layer, in forward order: what a phase model (DualPipe's overlapped pair,
# Megatron's EP overlap) interleaves with another microbatch's. A kernel or collective with
# no phase belongs to the one before it.
ATTENTION, DISPATCH, MLP, COMBINE = "attention", "dispatch", "mlp", "combine"
PHASES = (ATTENTION, DISPATCH, MLP, COMBINE)


@dataclass(frozen=True)
class PlanCollective:
    """One collective of a layer: its kind, the bytes each rank holds (``collective_seconds``
    says what they mean per kind), the group it runs over, whether it is in F or in I, and
    the phase it ends (a forward collective runs after its phase's kernels, a backward one
    after the backward of its phase's kernels)."""

    name: str
    kind: Collective
    nbytes: float
    group: Group
    backward: bool = False  # False: in F; True: in I
    phase: str = ATTENTION
    steps: int = 1  # times it runs back to back in the layer (a ring attention's cp - 1 hand-offs)
    # each step runs beside one block of the attention core (ring attention): only what a
    # step takes beyond its block's compute is exposed (``exposed_exchange_seconds``)
    hidden_by_core: bool = False
    # bytes each rank sends across nodes once per destination node, forwarded over the
    # node's own link to their ranks (DeepEP's dispatch and combine): the across-node leg runs
    # beside the inside-node all-to-all of ``nbytes``; 0 = ``nbytes`` spread evenly
    across_nodes: float = 0.0


@dataclass(frozen=True)
class _Shape:
    """Per-rank sizes of one microbatch under tensor parallelism."""

    tokens: float  # b * s / cp, the tokens of this rank
    batch: int  # b
    seq: int  # s, the whole sequence
    hidden: int  # h
    heads: float  # query heads on this rank, a / t
    kv_heads: float  # key/value heads on this rank
    head_dim: int  # d
    ffn: float  # f / t
    vocab: float  # V / t (vocab-parallel embedding and head)
    elem: int  # bytes per activation element
    replicated: float  # share of a replicated activation on this rank: 1, or 1/t with sequence parallelism
    tp: int
    expert_ffn: float = 0.0  # hidden size of one expert on this rank without expert parallelism, f_e / t
    ep: int = 1  # expert-parallel ranks
    etp: int = 1  # tensor-parallel ranks of one expert under expert parallelism
    dispatch_elem: int = 2  # bytes of one dispatched token element (1 under FP8 training)
    cp: int = 1  # context-parallel ranks the sequence is split over
    cp_comm: str = "p2p"  # how they exchange keys and values (CP_COMM_TYPES)
    dispatcher: str = "alltoall"  # TrainingSettings.moe_dispatcher

    @property
    def q_width(self) -> float:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> float:
        return self.kv_heads * self.head_dim


def _shape(model: ModelSpec, settings: TrainingSettings) -> _Shape:
    t = settings.tensor_parallel
    require(model.num_heads % t == 0, "tensor_parallel", t, f"must divide num_heads={model.num_heads}")
    require(model.is_mla or model.num_kv_heads % t == 0, "tensor_parallel", t,
            f"must divide num_kv_heads={model.num_kv_heads} (Megatron splits whole key/value groups)")
    ep, etp = settings.expert_parallel, settings.expert_tensor
    require(ep == 1 or model.is_moe, "expert_parallel", ep, f"needs a mixture-of-experts model; {model.name} "
            "is dense: use --ep 1")
    require(model.num_experts % ep == 0, "expert_parallel", ep,
            f"must divide num_experts={model.num_experts}; give a divisor of it")
    require(ep == 1 or model.expert_ffn % etp == 0, "expert_tensor_parallel", etp,
            f"must divide the expert hidden size {model.expert_ffn}")
    cp = settings.context_parallel
    if cp > 1 and settings.cp_comm_type == "a2a":
        # Ulysses scatters whole heads (query heads and key/value groups) over the cp ranks
        kv_heads = model.num_heads if model.is_mla else model.num_kv_heads
        for field_name, heads in (("num_heads", model.num_heads), ("num_kv_heads", kv_heads)):
            require(heads % (t * cp) == 0, "context_parallel", cp,
                    f"a2a splits the heads over t x cp ranks and {field_name}={heads} is no multiple of {t * cp}; "
                    "give --cp-comm p2p or allgather, or a cp that divides it")
    return _Shape(
        tokens=settings.micro_batch_size * settings.seq_len / cp,
        batch=settings.micro_batch_size,
        seq=settings.seq_len,
        hidden=model.hidden_size,
        heads=model.num_heads / t,
        kv_heads=model.num_kv_heads / t,
        head_dim=model.kv_channels,
        ffn=model.ffn_hidden_size / t,
        vocab=model.vocab_size / t,
        elem=settings.element_bytes,
        replicated=1.0 / t if settings.sequence_parallel else 1.0,
        tp=t,
        expert_ffn=model.expert_ffn / t,
        ep=ep,
        etp=etp if ep > 1 else 1,
        dispatch_elem=FP8_MATMUL_BYTES if settings.fp8 else settings.element_bytes,
        cp=cp,
        cp_comm=settings.cp_comm_type,
        dispatcher=settings.moe_dispatcher,
    )


def _matmul(name: str, m: float, n: float, k: float, elem: int, *, batch: float = 1.0, weights: float = 1.0,
            backward: str = WEIGHT_MATMUL, attention_core: bool = False, high_precision: bool = False) -> Kernel:
    """``batch`` products of [m, k] x [k, n]; ``weights`` copies of the [k, n] operand (experts),
    each multiplying its share of the m rows."""
    if backward == WEIGHT_MATMUL:
        traffic = elem * (m * k + weights * k * n + m * n)
        groups, rows = weights, m / weights
    else:
        traffic = elem * batch * (m * k + k * n + m * n)
        groups, rows = batch, m
    return Kernel(name, 2.0 * batch * m * n * k, traffic, backward, attention_core, groups, rows, n, k,
                  high_precision=high_precision)


def _elementwise(name: str, traffic: float, *, attention_core: bool = False, backward: str = ELEMENTWISE) -> Kernel:
    return Kernel(name, 0.0, traffic, backward, attention_core)


@dataclass(frozen=True)
class LayerPlan:
    """A layer before timing: its kernels, its tensor-parallel collectives and its memory."""

    name: str
    kind: str
    kernels: tuple[Kernel, ...]
    collectives: tuple[PlanCollective, ...]  # in F and in I, in the order they run
    activation_bytes: float  # kept without recompute
    selective_activation_bytes: float  # kept with selective recompute
    checkpoint_bytes: float  # kept with full recompute (the layer input)
    weight_input_bytes: float  # matmul inputs W needs after I
    params: float
    output_bytes: float
    # the causal attention core as a fused kernel sees it: (sequences x heads on this rank,
    # sequence length, head size) and the bytes of Q, K, V and O; None without attention
    attention: tuple[float, float, float] | None = None
    attention_traffic: float = 0.0
    # fused kernels the core runs as, each of ``attention``'s shape and traffic: a ring
    # attention's cp steps (1 otherwise)
    attention_blocks: int = 1


def _tensor_reductions(x: _Shape, named: tuple[tuple[str, float, bool, str], ...]) -> tuple[PlanCollective, ...]:
    """The tensor-parallel all-reduces ``(name, bytes, backward, phase)`` of a layer; none
    without tensor parallelism."""
    if x.tp == 1:
        return ()
    return tuple(PlanCollective(name, Collective.ALL_REDUCE, nbytes, Group.TENSOR, backward, phase)
                 for name, nbytes, backward, phase in named)


def _embedding(model: ModelSpec, x: _Shape) -> LayerPlan:
    tokens, h, e = x.tokens, x.hidden, x.elem
    hidden_bytes = tokens * h * e * x.replicated
    # token ids have no gradient: the whole backward is the embedding's weight gradient (W)
    kernels = [_elementwise("lookup", 2 * tokens * h * e, backward=WEIGHT_ELEMENTWISE)]
    if model.position_embeddings:
        kernels.append(_elementwise("add positions", 3 * tokens * h * e, backward=WEIGHT_ELEMENTWISE))
    mask = 0.0
    if model.dropout:
        kernels.append(_elementwise("dropout", 2 * hidden_bytes + tokens * h * x.replicated,
                                    backward=WEIGHT_ELEMENTWISE))
        mask = tokens * h * x.replicated
    ids = 8.0 * tokens  # int64 token ids
    return LayerPlan(
        name="embedding", kind=EMBEDDING, kernels=tuple(kernels),
        collectives=_tensor_reductions(x, (("embedding all-reduce", tokens * h * e, False, ATTENTION),)),
        activation_bytes=mask + ids, selective_activation_bytes=mask + ids, checkpoint_bytes=ids,
        weight_input_bytes=ids,
        params=x.vocab * h + model.position_embeddings * h,
        output_bytes=hidden_bytes,
    )


@dataclass(frozen=True)
class _Part:
    """One part of a block (its attention, or its MLP) before the block is assembled."""

    kernels: tuple[Kernel, ...]
    kept: float  # activation bytes kept without recompute (the attention core's apart)
    params: float
    weight_inputs: float  # matmul inputs W needs after I
    collectives: tuple[PlanCollective, ...] = ()


def _phased(phase: str, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` run in ``phase``."""
    return [dataclasses.replace(kernel, phase=phase) for kernel in kernels]


def _attention(model: ModelSpec, x: _Shape) -> tuple[_Part, _Core]:
    """Norm, QKV, the attention core and the output projection; with the core as the fused
    kernel sees it (``_core``)."""
    tokens, h, e, r = x.tokens, x.hidden, x.elem, x.replicated
    hidden_bytes = tokens * h * e * r
    q_bytes, kv_bytes = tokens * x.q_width * e, tokens * x.kv_width * e  # this rank's Q (or O), K (or V)
    core = _core(x, x.head_dim, e * tokens * (2 * x.q_width + 2 * x.kv_width),  # read Q, K, V; write O
                 (q_bytes, kv_bytes, kv_bytes, q_bytes))
    mask_hidden = tokens * h * r if model.dropout else 0.0
    norm_params = h * (2 if model.bias else 1)
    kernels = [
        _elementwise("norm 1", 2 * hidden_bytes),
        _matmul(QKV_KERNEL, tokens, x.q_width + 2 * x.kv_width, h, e),
        *_core_kernels(model, x, core, x.head_dim, x.head_dim),
        _matmul("projection", tokens, h, x.q_width, e),
    ]
    kept = (
        2 * hidden_bytes  # norm-1 input, QKV input
        + tokens * (x.q_width + 2 * x.kv_width) * e  # Q, K for the scores; V for the context
        + tokens * x.q_width * e  # projection input
        + mask_hidden
    )
    params = (norm_params + h * (x.q_width + 2 * x.kv_width) + x.q_width * h
              + ((x.q_width + 2 * x.kv_width) + h if model.bias else 0))
    weight_inputs = 2 * hidden_bytes + tokens * x.q_width * e  # QKV, projection and MLP inputs
    return _Part(tuple(_phased(ATTENTION, kernels)), kept, params, weight_inputs), core


@dataclass(frozen=True)
class _Core:
    """The causal attention core of one rank: ``batch`` products of ``queries`` x ``keys``
    scores, and the same work as ``blocks`` fused kernels see it (``flash``: sequences x
    heads, sequence length, head size of each) with the bytes each moves; and the bytes of
    this rank's Q, K, V and O (what context-parallel ranks exchange)."""

    batch: float
    queries: float
    keys: float
    flash: tuple[float, float, float]
    traffic: float  # bytes each block moves: Q, K, V read and O written
    blocks: int = 1
    exchanged: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # bytes of Q, K, V, O


def _core(x: _Shape, head_dim: float, traffic: float, exchanged: tuple[float, float, float, float]) -> _Core:
    """A rank's share of causal attention (``traffic``: the bytes of its tokens' Q, K, V and
    O). Without context parallelism, and with a2a (the all-to-all hands each rank the whole
    sequence of heads / cp heads), the rank's heads over the whole sequence. With p2p or
    allgather the rank's s / cp queries (two chunks, i and 2 cp - 1 - i) meet all s keys;
    under the causal mask each of the cp ring steps then does the work of a causal attention
    over s / cp tokens (the local step: two causal chunk blocks and one full; every other:
    two full chunk blocks), 1 / cp of the whole."""
    b, s = x.batch, x.seq
    if x.cp == 1 or x.cp_comm == "a2a":
        heads = b * x.heads / x.cp
        return _Core(heads, s, s, (heads, s, head_dim), traffic, 1, exchanged)
    if x.cp_comm == "p2p":  # one kernel per ring step, as the KV blocks arrive
        return _Core(b * x.heads, s / x.cp, s, (b * x.heads, s / x.cp, head_dim), traffic, x.cp, exchanged)
    return _Core(b * x.heads, s / x.cp, s, (b * x.heads * x.cp, s / x.cp, head_dim), x.cp * traffic, 1, exchanged)


def _core_kernels(model: ModelSpec, x: _Shape, core: _Core, qk_dim: float, v_dim: float) -> list[Kernel]:
    """Scores, softmax (+ dropout) and context of the attention core on this rank."""
    e = x.elem
    scores = core.batch * core.queries * core.keys
    kernels = [
        _matmul("scores", core.queries, core.keys, qk_dim, e, batch=core.batch, backward=ACTIVATION_MATMUL,
                attention_core=True),
        _elementwise("softmax", 2 * scores * e, attention_core=True),
    ]
    if model.dropout:
        kernels.append(_elementwise("attention dropout", 2 * scores * e + scores, attention_core=True))
    kernels.append(_matmul("context", core.queries, v_dim, core.keys, e, batch=core.batch,
                           backward=ACTIVATION_MATMUL, attention_core=True))
    return kernels


def _context_exchange(x: _Shape, core: _Core) -> tuple[PlanCollective, ...]:
    """The context-parallel collectives of a block's attention, in F and in I (Megatron-Core's
    ``cp_comm_type``): none without context parallelism. ``kv``: the K and V of this rank's
    s / cp tokens.

    - p2p (ring attention): cp - 1 hand-offs of a KV block to the next rank, each beside one
      block's attention; in I the KV block and its gradients dK, dV (twice the bytes);
    - a2a (Ulysses): all-to-alls of Q, K, V before the core and of O after it; in I the same
      four of their gradients;
    - allgather: the whole sequence's K and V gathered in F and again in I (not kept), and
      dK, dV reduce-scattered back to their ranks.
    """
    if x.cp == 1:
        return ()
    context = Group.CONTEXT
    kv = core.exchanged[1] + core.exchanged[2]  # K and V
    if x.cp_comm == "p2p":
        return (PlanCollective("kv ring exchange", Collective.SEND_RECV, kv, context, False, ATTENTION, x.cp - 1,
                               True),
                PlanCollective("kv and dkv ring exchange", Collective.SEND_RECV, 2 * kv, context, True, ATTENTION,
                               x.cp - 1, True))
    if x.cp_comm == "a2a":
        return tuple(PlanCollective(f"{prefix}{name} all-to-all", Collective.ALL_TO_ALL, nbytes, context, backward,
                                    ATTENTION)
                     for backward, prefix in ((False, ""), (True, "d")) for name, nbytes in zip("qkvo", core.exchanged,
                                                                                              strict=True))
    gathered = x.cp * kv  # the whole sequence's K and V, on every rank
    return (PlanCollective("kv all-gather", Collective.ALL_GATHER, gathered, context, False, ATTENTION),
            PlanCollective("kv all-gather", Collective.ALL_GATHER, gathered, context, True, ATTENTION),
            PlanCollective("dkv reduce-scatter", Collective.REDUCE_SCATTER, gathered, context, True, ATTENTION))


def _latent_attention(model: ModelSpec, x: _Shape) -> tuple[_Part, _Core]:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_lora_rank``
    latent, keys and values up-projected per head from a rank-``kv_lora_rank`` latent plus
    one rotary key shared by the heads. The down-projections and their norms are replicated
    on the tensor-parallel ranks (as Megatron-Core's MLA keeps them), the up-projections and
    the output projection split by heads."""
    tokens, h, e, r = x.tokens, x.hidden, x.elem, x.replicated
    hidden_bytes = tokens * h * e * r
    mask_hidden = tokens * h * r if model.dropout else 0.0
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim  # query/key head size
    v, q_rank, latent = model.v_head_dim, model.q_lora_rank, model.kv_lora_rank + model.qk_rope_head_dim
    heads = x.heads
    # the fused kernel's two matmuls per tile: scores over qk, context over v
    core = _core(x, (qk + v) / 2, e * tokens * heads * (2 * qk + 2 * v),  # read Q, K, V; write O
                 (tokens * heads * qk * e, tokens * heads * qk * e, tokens * heads * v * e, tokens * heads * v * e))
    kernels = [_elementwise("norm 1", 2 * hidden_bytes)]
    if q_rank:
        kernels += [_matmul("q down", tokens, q_rank, h, e), _elementwise("q norm", 2 * tokens * q_rank * e),
                    _matmul("q up", tokens, heads * qk, q_rank, e)]
    else:
        kernels.append(_matmul("q", tokens, heads * qk, h, e))
    kernels += [
        _matmul("kv down", tokens, latent, h, e),
        _elementwise("kv norm", 2 * tokens * model.kv_lora_rank * e),
        _matmul("kv up", tokens, heads * (model.qk_nope_head_dim + v), model.kv_lora_rank, e),
        *_core_kernels(model, x, core, qk, v),
        _matmul("projection", tokens, h, heads * v, e),
    ]
    latents = tokens * (q_rank + model.kv_lora_rank) * e  # the normed latents the up-projections read
    kept = (2 * hidden_bytes + 2 * latents + tokens * latent * e
            + tokens * heads * (2 * qk + v) * e  # Q, K, V
            + tokens * heads * v * e + mask_hidden)  # projection input
    params = (h * (2 if model.bias else 1) + h * q_rank + q_rank + q_rank * heads * qk
              + (0 if q_rank else h * heads * qk) + h * latent + model.kv_lora_rank
              + model.kv_lora_rank * heads * (model.qk_nope_head_dim + v) + heads * v * h)
    weight_inputs = 2 * hidden_bytes + latents + tokens * latent * e + tokens * heads * v * e
    return _Part(tuple(_phased(ATTENTION, kernels)), kept, params, weight_inputs), core


def _dense_mlp(model: ModelSpec, x: _Shape, moe: bool) -> _Part:
    """Residual, norm and the dense MLP, or without expert parallelism (``moe``) the router
    and every expert on this rank, each split by tensor parallelism."""
    tokens, h, e, r = x.tokens, x.hidden, x.elem, x.replicated
    hidden_bytes = tokens * h * e * r
    mask_hidden = tokens * h * r if model.dropout else 0.0
    norm_params = h * (2 if model.bias else 1)
    kernels = [_elementwise("residual 1", 3 * hidden_bytes + mask_hidden), _elementwise("norm 2", 2 * hidden_bytes)]
    # MLP: dense, or router + experts; every routed token runs experts_per_token experts
    matrices = 3 if model.gated_mlp else 2
    ffn = x.expert_ffn if moe else x.ffn
    if moe:
        experts, routed = model.num_experts, tokens * model.experts_per_token
        kernels += [
            _matmul("router", tokens, experts, h, e, high_precision=True),
            _elementwise("dispatch", tokens * h * e * (1 + model.experts_per_token)),
        ]
        kept = 2 * hidden_bytes + 4.0 * tokens * experts + routed * h * e  # norm-2 in, router in, fp32 router probs, expert inputs
        params = norm_params + h * experts + experts * matrices * h * ffn
        weight_inputs = routed * h * e + routed * ffn * e
    else:
        experts, routed = 1, tokens
        kept = 2 * hidden_bytes  # norm-2 input, MLP input
        params = norm_params + matrices * h * ffn
        weight_inputs = routed * ffn * e
    up_width = 2 * ffn if model.gated_mlp else ffn
    kernels += [
        _matmul("mlp up", routed, up_width, h, e, weights=experts),
        _elementwise("activation", routed * ffn * e * (3 if model.gated_mlp else 2)),
        _matmul("mlp down", routed, h, ffn, e, weights=experts),
    ]
    if moe:
        kernels.append(_elementwise("combine", tokens * h * e * (1 + model.experts_per_token)))
        kept += routed * h * e  # expert outputs for the combine weights' gradient
    kernels.append(_elementwise("residual 2", 3 * hidden_bytes + mask_hidden))
    kept += routed * up_width * e + routed * ffn * e + mask_hidden  # activation-function input, down input
    if model.bias:
        params += experts * (up_width + h)
    shared = _shared_experts(model, x) if moe else None
    if not moe:
        return _Part(tuple(_phased(MLP, kernels)), kept, params, weight_inputs)
    shared = _shared_experts(model, x)
    if shared is not None:
        kernels[-2:-2] = shared.kernels
        kept, params, weight_inputs = kept + shared.kept, params + shared.params, weight_inputs + shared.weight_inputs
    # residual, norm, router and permutation; the experts; the weighted sum and residual
    return _Part(tuple(_phased(DISPATCH, kernels[:4]) + _phased(MLP, kernels[4:-2]) + _phased(COMBINE, kernels[-2:])),
                 kept, params, weight_inputs)


def _shared_experts(model: ModelSpec, x: _Shape) -> _Part | None:
    """The shared experts: a dense MLP of ``num_shared_experts`` experts' width every token
    runs through on every rank, split by tensor parallelism."""
    if not model.num_shared_experts:
        return None
    tokens, h, e = x.tokens, x.hidden, x.elem
    ffn = model.num_shared_experts * x.expert_ffn / x.tp
    up_width = 2 * ffn if model.gated_mlp else ffn
    kernels = (_matmul("shared up", tokens, up_width, h, e),
               _elementwise("shared activation", tokens * ffn * e * (3 if model.gated_mlp else 2)),
               _matmul("shared down", tokens, h, ffn, e))
    params = (3 if model.gated_mlp else 2) * h * ffn + ((up_width + h) if model.bias else 0)
    return _Part(kernels, tokens * (up_width + ffn) * e, params, tokens * (h + ffn) * e)


def _expert_parallel_mlp(model: ModelSpec, x: _Shape) -> _Part:
    """A MoE MLP over ``x.ep`` expert-parallel ranks (``pipesched.model.groups``: folded over
    the stage's tensor-parallel ranks and its data-parallel peers).

    Each rank routes its ``T = b s / t`` tokens (Megatron-Core runs expert parallelism with
    tensor parallelism only under sequence parallelism: every tensor-parallel rank routes its
    sequence shard), dispatches ``T k`` token copies of ``h`` elements over the EP group,
    all-gathers them inside its ETP group, runs its ``E / EP`` experts as one grouped GEMM
    (``E / EP`` groups of the rows each expert received, ``f / ETP`` wide), reduce-scatters
    over ETP and combines back. Dropless, the busiest rank's load over the mean
    (``ModelSpec.hottest_share``) sets the rows and the bytes; with a capacity factor every
    expert's buffer is padded to that factor times the mean."""
    tokens, h, e, r = x.tokens, x.hidden, x.elem, x.replicated
    k, experts, ep, etp = model.experts_per_token, model.num_experts, x.ep, x.etp
    hidden_bytes = tokens * h * e * r
    mask_hidden = tokens * h * r if model.dropout else 0.0
    local = tokens / x.tp  # tokens this rank routes
    share = model.capacity_factor or model.hottest_share(ep)
    rows = etp * local * k * share  # token copies this rank's experts run
    per_rank = experts // ep
    ffn = model.expert_ffn / etp
    up_width = 2 * ffn if model.gated_mlp else ffn
    matrices = 3 if model.gated_mlp else 2
    copies, across = _dispatched_copies(model, x)
    dispatched = local * copies * h * share  # elements this rank sends (and the busiest receives)
    dispatch = _phased(DISPATCH, [
        _elementwise("residual 1", 3 * hidden_bytes + mask_hidden), _elementwise("norm 2", 2 * hidden_bytes),
        _matmul("router", local, experts, h, e, high_precision=True),
        _elementwise("permute", local * h * e * (1 + k)),
    ])
    mlp = [
        _matmul("expert up", rows, up_width, h, e, weights=per_rank),
        _elementwise("activation", rows * ffn * e * (3 if model.gated_mlp else 2)),
        _matmul("expert down", rows, h, ffn, e, weights=per_rank),
    ]
    shared = _shared_experts(model, x)
    if shared is not None:
        mlp += shared.kernels
    combine = _phased(COMBINE, [_elementwise("unpermute", local * h * e * (1 + k)),
                                _elementwise("residual 2", 3 * hidden_bytes + mask_hidden)])
    kept = (2 * hidden_bytes + 4.0 * local * experts  # norm-2 in, router in, fp32 router probs
            + rows * h * e + rows * (up_width + ffn) * e  # expert inputs, activation-function and down inputs
            + local * k * h * e + mask_hidden)  # the combined-back expert outputs (the gate weights' gradient)
    params = h * (2 if model.bias else 1) + h * experts + per_rank * (matrices * h * ffn + ((up_width + h) if model.bias else 0))
    weight_inputs = rows * h * e + rows * ffn * e
    if shared is not None:
        kept, params, weight_inputs = kept + shared.kept, params + shared.params, weight_inputs + shared.weight_inputs
    return _Part(tuple(dispatch + _phased(MLP, mlp) + combine), kept, params, weight_inputs,
                 _expert_collectives(x, (dispatched, local * across * h * share), rows * h, shared is not None))


def _dispatched_copies(model: ModelSpec, x: _Shape) -> tuple[float, float]:
    """Copies of one token a rank dispatches, and those that cross nodes (0: no forwarding):
    Megatron's all-to-all sends one per selected expert; DeepEP one per destination rank,
    across nodes once per destination node (``ModelSpec.routed_destinations``, nodes of
    ``DEVICES_PER_NODE / ETP`` expert ranks)."""
    if x.dispatcher != "deepep":
        return float(model.experts_per_token), 0.0
    nodes, ranks = model.routed_destinations(x.ep, max(1, DEVICES_PER_NODE // x.etp))
    return ranks, (nodes if x.ep > DEVICES_PER_NODE // x.etp else 0.0)


def _expert_collectives(x: _Shape, sent: tuple[float, float], gathered: float,
                        shared: bool) -> tuple[PlanCollective, ...]:
    """The token dispatch and combine all-to-alls of ``dispatched`` elements per rank (and
    inside an expert's tensor-parallel group the all-gather and reduce-scatter of the
    ``gathered`` elements its experts run), in F, and their gradients in I: the combine's
    gradient is a dispatch-shaped all-to-all to the experts, the dispatch's one back to the
    tokens. The dispatch moves FP8 under FP8 training (DeepSeek-V3); everything else is in
    the activations' dtype. ``sent``: the elements each rank dispatches, and those sent
    across nodes once per node (DeepEP's forwarding; 0 without)."""
    e, d = x.elem, x.dispatch_elem
    dispatched, across = sent
    forward = [PlanCollective("dispatch all-to-all", Collective.ALL_TO_ALL, dispatched * d, Group.EXPERT,
                              False, DISPATCH, across_nodes=across * d)]
    backward = [PlanCollective("combine gradient all-to-all", Collective.ALL_TO_ALL, dispatched * e, Group.EXPERT,
                               True, COMBINE, across_nodes=across * e)]
    if x.etp > 1:
        forward += [PlanCollective("expert input all-gather", Collective.ALL_GATHER, gathered * d,
                                   Group.EXPERT_TENSOR, False, DISPATCH),
                    PlanCollective("expert output reduce-scatter", Collective.REDUCE_SCATTER, gathered * e,
                                   Group.EXPERT_TENSOR, False, MLP)]
        backward += [PlanCollective("expert output-gradient all-gather", Collective.ALL_GATHER, gathered * e,
                                    Group.EXPERT_TENSOR, True, MLP),
                     PlanCollective("expert input-gradient reduce-scatter", Collective.REDUCE_SCATTER, gathered * e,
                                    Group.EXPERT_TENSOR, True, DISPATCH)]
    forward.append(PlanCollective("combine all-to-all", Collective.ALL_TO_ALL, dispatched * e, Group.EXPERT,
                                  False, COMBINE, across_nodes=across * e))
    backward.append(PlanCollective("dispatch gradient all-to-all", Collective.ALL_TO_ALL, dispatched * e,
                                   Group.EXPERT, True, DISPATCH, across_nodes=across * e))
    tensor = ()
    if shared:  # the shared experts' partial sums over the tensor-parallel ranks
        tensor = _tensor_reductions(x, (("shared expert output all-reduce", x.tokens * x.hidden * e, False, MLP),
                                        ("shared expert input-gradient all-reduce", x.tokens * x.hidden * e, True, MLP)))
    return (*forward, *tensor[:1], *backward, *tensor[1:])


def _block(model: ModelSpec, x: _Shape, index: int) -> LayerPlan:
    tokens, h, e, r = x.tokens, x.hidden, x.elem, x.replicated
    hidden_bytes = tokens * h * e * r  # one replicated hidden-state tensor on this rank
    attention, core = (_latent_attention if model.is_mla else _attention)(model, x)
    scores = core.batch * core.queries * core.keys  # attention score elements on this rank
    core_bytes = scores * e  # softmax output
    if model.dropout:
        core_bytes += scores + scores * e  # mask + dropout output
    moe = model.moe_block(index)
    expert_parallel = moe and x.ep > 1
    mlp = _expert_parallel_mlp(model, x) if expert_parallel else _dense_mlp(model, x, moe)
    reductions = [("attention output all-reduce", tokens * h * e, False, ATTENTION),
                  ("mlp output all-reduce", tokens * h * e, False, COMBINE if moe else MLP),
                  ("qkv input-gradient all-reduce", tokens * h * e, True, ATTENTION),
                  ("mlp input-gradient all-reduce", tokens * h * e, True, COMBINE if moe else MLP)]
    if expert_parallel:  # the experts' own collectives replace the MLP's all-reduces
        reductions = reductions[::2]
    tensor = _tensor_reductions(x, tuple(reductions))
    collectives = (*_context_exchange(x, core), *tensor[:len(tensor) // 2], *mlp.collectives,
                   *tensor[len(tensor) // 2:])
    if expert_parallel:  # in the order they run: F's, then I's
        collectives = tuple(c for c in collectives if not c.backward) + tuple(c for c in collectives if c.backward)
    selective = attention.kept + mlp.kept
    return LayerPlan(
        name=f"layer.{index}", kind=TRANSFORMER, kernels=attention.kernels + mlp.kernels,
        collectives=collectives,
        activation_bytes=selective + core_bytes,
        selective_activation_bytes=selective,
        checkpoint_bytes=hidden_bytes,
        weight_input_bytes=attention.weight_inputs + mlp.weight_inputs,
        params=attention.params + mlp.params,
        output_bytes=hidden_bytes,
        attention=core.flash,
        attention_traffic=core.traffic,
        attention_blocks=core.blocks,
    )


def _head(model: ModelSpec, x: _Shape) -> LayerPlan:
    tokens, h, e = x.tokens, x.hidden, x.elem
    hidden_bytes = tokens * h * e * x.replicated
    logits = tokens * x.vocab  # logit elements on this rank
    kernels = (
        _elementwise("final norm", 2 * hidden_bytes),
        _matmul("lm head", tokens, x.vocab, h, e, high_precision=True),
        # softmax cross-entropy in fp32 over the logits
        _elementwise("cross entropy", logits * (e + 4)),
    )
    kept = 2 * hidden_bytes + 4 * logits  # norm input, head input, fp32 logits (Korthikanti: 4sbh/t (1 + V/h))
    return LayerPlan(
        name="head", kind=LOSS, kernels=kernels,
        # vocab-parallel cross-entropy: max and sum over the vocabulary shards (fp32 per token)
        collectives=_tensor_reductions(x, (("logits max all-reduce", 4.0 * tokens, False, ATTENTION),
                                           ("logits sum all-reduce", 4.0 * tokens, False, ATTENTION),
                                           ("head input-gradient all-reduce", tokens * h * e, True, ATTENTION))),
        activation_bytes=kept, selective_activation_bytes=kept, checkpoint_bytes=kept,
        weight_input_bytes=hidden_bytes,
        params=h * x.vocab + h * (2 if model.bias else 1),
        output_bytes=0.0,
    )


def layer_plans(model: ModelSpec, settings: TrainingSettings) -> list[LayerPlan]:
    x = _shape(model, settings)
    return [_embedding(model, x), *_blocks(model, x), _head(model, x)]


def _blocks(model: ModelSpec, x: _Shape) -> list[LayerPlan]:
    """Every block: a block's plan depends on its index only through its name and whether
    it is a MoE block, so each of the (at most two) kinds is planned once."""
    planned: dict[bool, LayerPlan] = {}
    blocks = []
    for index in range(model.num_layers):
        moe = model.moe_block(index)
        if moe not in planned:
            planned[moe] = _block(model, x, index)
        blocks.append(dataclasses.replace(planned[moe], name=f"layer.{index}"))
    return blocks


def allreduce_time(nbytes: float, ranks: int, link: LinkSpec) -> float:
    """All-reduce of ``nbytes`` over ``ranks`` ranks on ``link``, as NCCL runs it
    (``pipesched.model.collectives``).

    >>> allreduce_time(1e9, 1, DEFAULT_TP_LINK)
    0.0
    """
    return collective_seconds(Collective.ALL_REDUCE, nbytes, link_levels(link, ranks))


def plan_collective_seconds(collective: PlanCollective, settings: TrainingSettings, link: LinkSpec,
                            groups: GroupLevels | None = None) -> float:
    """Seconds of one of a layer's collectives over its group's levels: as ``groups`` lists
    them (a cluster's, ``pipesched.model.groups``), else one ring of the group's ranks
    (tensor: ``tensor_parallel``, expert: ``expert_parallel``, expert tensor:
    ``expert_tensor_parallel``, context: ``context_parallel``) on ``link``; all its steps,
    with no overlap.

    >>> c = PlanCollective("x", Collective.ALL_REDUCE, 1e9, Group.TENSOR)
    >>> plan_collective_seconds(c, TrainingSettings(tensor_parallel=1), DEFAULT_TP_LINK)
    0.0
    """
    return collective.steps * plan_collective_choice(collective, settings, link, groups).seconds


def exposed_exchange_seconds(step_s: float, block_s: float, steps: int) -> float:
    """Ring attention's overlap condition: each of the ``steps`` KV hand-offs (``step_s``
    seconds) runs while the attention of the block before it computes (``block_s``), so
    only what it takes beyond that block is exposed: zero when the block is long enough
    for its compute to hide the transfer, growing as the block shrinks below that.

    >>> exposed_exchange_seconds(2.0, 3.0, 4), exposed_exchange_seconds(3.0, 2.0, 4)
    (0.0, 4.0)
    """
    return steps * max(0.0, step_s - block_s)


def plan_collective_choice(collective: PlanCollective, settings: TrainingSettings, link: LinkSpec,
                           groups: GroupLevels | None = None) -> CollectiveTime:
    """One step of ``plan_collective_seconds`` with the algorithm and protocol NCCL runs it with; a
    forwarded all-to-all (``across_nodes``) as its slower leg: the inside-node all-to-all of
    ``nbytes`` or the across-node one of ``across_nodes``."""
    levels = [level for level in levels_on_link(settings, collective.group, link, groups) if level.ranks > 1]
    if collective.across_nodes <= 0 or len(levels) < 2:
        return collective_choice(collective.kind, collective.nbytes, levels)
    inside = collective_choice(collective.kind, collective.nbytes, levels[:1])
    across = collective_choice(collective.kind, collective.across_nodes, levels[1:])
    return max(inside, across, key=lambda choice: choice.seconds)


@dataclass(frozen=True)
class _Times:
    """Seconds of a layer's F, I and W on one device, and of its attention core's forward
    (what selective recompute redoes in I)."""

    forward: float
    backward_input: float
    backward_weight: float
    core: float


def fp8_matmul(kernel: Kernel, settings: TrainingSettings) -> bool:
    """Whether ``kernel`` runs on the FP8 tensor cores: under FP8 training, every matmul with
    a weight (forward, input and weight gradient) but the router and the LM head; the
    attention core and the elementwise kernels stay in bf16 (DeepSeek-V3's FP8 recipe)."""
    return settings.fp8 and kernel.backward == WEIGHT_MATMUL and kernel.groups > 0 and not kernel.high_precision


def check_fp8(device: DeviceSpec, settings: TrainingSettings) -> None:
    """Refuse FP8 training on a device without FP8 tensor cores."""
    require(not settings.fp8 or device.fp8_peak_flops > 0, "dtype", settings.dtype,
            f"device {device.name} has no FP8 tensor cores (fp8_peak_flops=0); train in bf16, or give a device "
            "with fp8_peak_flops (h100-sxm, h200, h800)")


def kernel_times(kernel: Kernel, device: DeviceSpec, settings: TrainingSettings) -> tuple[float, float, float]:
    """Seconds of one kernel's forward and of its parts of I and W (``_times`` says how a
    kernel's backward splits)."""
    fp32 = settings.dtype == "fp32"
    fp8 = fp8_matmul(kernel, settings)
    if kernel.groups == 0:
        backward = kernels.memory_time(device, 2 * kernel.traffic)
        weight = kernel.backward == WEIGHT_ELEMENTWISE
        return kernels.memory_time(device, kernel.traffic), 0.0 if weight else backward, backward if weight else 0.0
    matmul = functools.partial(kernels.matmul_time, device, groups=kernel.groups, traffic=kernel.traffic, fp32=fp32,
                               fp8=fp8)
    forward = matmul(kernel.m, kernel.n, kernel.k)
    if kernel.backward != WEIGHT_MATMUL:
        return forward, matmul(kernel.m, kernel.k, kernel.n) + matmul(kernel.k, kernel.n, kernel.m), 0.0
    weight = matmul(kernel.k, kernel.n, kernel.m, weight_gradient=True)
    accumulate = device.grad_accumulation_traffic * kernel.groups * kernel.k * kernel.n * settings.element_bytes
    if accumulate > 0:
        weight += kernels.memory_time(device, accumulate)
    return forward, matmul(kernel.m, kernel.k, kernel.n), weight


def _times(plan: LayerPlan, device: DeviceSpec, settings: TrainingSettings, link: LinkSpec,
           groups: GroupLevels | None = None) -> _Times:
    """The time model (``pipesched.model.kernels``) applied to every kernel of the layer.

    Backward, per kernel: ``Y = X W`` gives ``dX = dY W^T`` (an [m, k] output) in I and
    ``dW = X^T dY`` (a [k, n] output over the m rows) in W, where W then adds dW into the
    existing gradient (``grad_accumulation_traffic``); an activation matmul gives both input
    gradients in I. With fused attention the scores, softmax, dropout and context kernels are
    one flash kernel in F and one in I (a ring attention's: one per ring step). A collective
    hidden by the core (the ring's KV hand-offs) adds only its exposed part.
    """
    forward = backward_input = backward_weight = 0.0
    for kernel in plan.kernels:
        if kernel.attention_core:
            continue
        step, backward, weight = kernel_times(kernel, device, settings)
        forward += step
        backward_input += backward
        backward_weight += weight
    core_forward, core_backward = core_seconds(plan, device, settings)
    forward += core_forward
    backward_input += core_backward
    for collective in plan.collectives:
        seconds = _exposed_seconds(collective, plan, (core_forward, core_backward), settings, link, groups)
        if collective.backward:
            backward_input += seconds
        else:
            forward += seconds
    # the fused backward kernel recomputes the scores itself: selective recompute adds nothing
    flash = plan.attention is not None and kernels.uses_flash(device, settings.element_bytes)
    return _Times(forward, backward_input, backward_weight, 0.0 if flash else core_forward)


def core_seconds(plan: LayerPlan, device: DeviceSpec, settings: TrainingSettings) -> tuple[float, float]:
    """Seconds of the layer's attention core in F and in I: its score, softmax, dropout and
    context kernels, or with fused attention its flash kernels (``attention_blocks`` of
    them); (0, 0) without attention."""
    if plan.attention is not None and kernels.uses_flash(device, settings.element_bytes):
        heads, seq, head_dim = plan.attention
        shape = {"heads": heads, "seq": seq, "head_dim": head_dim, "traffic": plan.attention_traffic}
        return (plan.attention_blocks * kernels.flash_attention_time(device, **shape),
                plan.attention_blocks * kernels.flash_attention_time(device, **shape, backward=True))
    forward = backward = 0.0
    for kernel in plan.kernels:
        if kernel.attention_core:
            step, gradient, _ = kernel_times(kernel, device, settings)
            forward += step
            backward += gradient
    return forward, backward


def _exposed_seconds(collective: PlanCollective, plan: LayerPlan, core: tuple[float, float],
                     settings: TrainingSettings, link: LinkSpec, groups: GroupLevels | None) -> float:
    """What ``collective`` adds to its F or I: all of it, or for one hidden by the core the
    exposed part of its steps (``exposed_exchange_seconds``; ``core``: the core's F and I
    seconds, run as ``plan.attention_blocks`` blocks)."""
    seconds = plan_collective_seconds(collective, settings, link, groups)
    if not collective.hidden_by_core:
        return seconds
    block = core[1 if collective.backward else 0] / plan.attention_blocks
    return exposed_exchange_seconds(seconds / collective.steps, block, collective.steps)


def _flops(plan: LayerPlan, settings: TrainingSettings) -> float:
    """Matmul FLOPs of F + I + W (+ recompute): what the device executes, independent of
    any device. Backward FLOPs are twice the forward's (two products per matmul), as in
    Narayanan et al."""
    return sum(3 * kernel.flops for kernel in plan.kernels if kernel.groups > 0) + _recompute_flops(plan, settings)


def _recompute_flops(plan: LayerPlan, settings: TrainingSettings) -> float:
    """Forward FLOPs the backward redoes: the attention core with selective recompute, the
    whole forward with full recompute (transformer blocks only)."""
    if plan.kind == TRANSFORMER and settings.recompute == "selective":
        return sum(kernel.flops for kernel in plan.kernels if kernel.attention_core)
    if plan.kind == TRANSFORMER and settings.recompute == "full":
        return sum(kernel.flops for kernel in plan.kernels)
    return 0.0


def _kept_for_w(plan: LayerPlan, settings: TrainingSettings) -> float:
    """Bytes I computes that W still needs: the output gradient of every weight matmul (``dW
    = X^T dY`` needs dY), or the whole output gradient of a layer whose backward is all W
    (the embedding)."""
    grads = sum(kernel.groups * kernel.m * kernel.n for kernel in plan.kernels if kernel.backward == WEIGHT_MATMUL)
    kept = grads * settings.element_bytes
    if any(kernel.backward == WEIGHT_ELEMENTWISE for kernel in plan.kernels):
        kept += plan.output_bytes
    return kept


def _cost(plan: LayerPlan, device: DeviceSpec, settings: TrainingSettings, link: LinkSpec,
          groups: GroupLevels | None = None) -> LayerCost:
    times = _times(plan, device, settings, link, groups)
    forward, backward_input = times.forward, times.backward_input
    activation = plan.activation_bytes
    weight_inputs = plan.weight_input_bytes
    recompute = 0.0
    if settings.recompute == "selective" and plan.kind == TRANSFORMER:
        activation = plan.selective_activation_bytes
        recompute = times.core  # redo scores, softmax, dropout and context before their backward
    elif settings.recompute == "full" and plan.kind == TRANSFORMER:
        activation = plan.checkpoint_bytes
        recompute = forward  # redo the whole forward from the kept input
        weight_inputs = activation  # the kept input stays until W is done
    backward_input += recompute
    return LayerCost(
        name=plan.name,
        forward_s=forward,
        backward_input_s=backward_input,
        backward_weight_s=times.backward_weight,
        activation_bytes=activation,
        params=plan.params,
        output_bytes=plan.output_bytes,
        flops=_flops(plan, settings),
        recompute_flops=_recompute_flops(plan, settings),
        weight_input_bytes=min(weight_inputs, activation),
        kind=plan.kind,
        kept_for_w_bytes=_kept_for_w(plan, settings),
        recompute_s=recompute,
        forward_flops=sum(kernel.flops for kernel in plan.kernels if kernel.groups > 0),
        weight_flops=sum(kernel.flops for kernel in plan.kernels if kernel.backward == WEIGHT_MATMUL),
    )


def layer_costs(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings, *,
                tp_link: LinkSpec | None = None, groups: GroupLevels | None = None) -> list[LayerCost]:
    """Cost of every layer (embedding, blocks, head) for one microbatch on ``device``.

    ``tp_link`` carries the tensor-parallel all-reduces (default: NVLink, 450 GB/s), and
    every group ``groups`` does not list (``pipesched.model.groups``). A
    model with measured layers returns them as given, with times scaled by the ratio of
    peak FLOP/s when they were measured on another device (``measured_on``).

    >>> from pipesched.model import load_device, load_model
    >>> costs = layer_costs(load_model("tiny"), load_device("h100-sxm"), TrainingSettings(seq_len=128))
    >>> [c.name for c in costs][:3], costs[-1].name
    (['embedding', 'layer.0', 'layer.1'], 'head')
    """
    if model.measured:
        require(settings.tensor_parallel == 1, "tensor_parallel", settings.tensor_parallel,
                "measured layer costs already include any tensor parallelism; use 1 (CLI: -t 1)")
        return _measured(model, device)
    check_fp8(device, settings)
    if settings.optimizer_shards != 1:  # the optimizer's share of memory is no layer cost
        settings = dataclasses.replace(settings, optimizer_shards=1)
    return list(_layer_costs(model, device, settings, tp_link or DEFAULT_TP_LINK, groups))


@functools.lru_cache(maxsize=512)
def _layer_costs(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings,
                 link: LinkSpec, groups: GroupLevels | None = None) -> tuple[LayerCost, ...]:
    """Pure in hashable inputs: a sweep asks for the same layers on every placement. A
    model's blocks are alike: each distinct layer (all but its name) is timed once."""
    timed: dict[LayerPlan, LayerCost] = {}
    costs = []
    for plan in layer_plans(model, settings):
        unnamed = dataclasses.replace(plan, name="")
        cost = timed.get(unnamed)
        if cost is None:
            cost = timed[unnamed] = _cost(plan, device, settings, link, groups)
        costs.append(cost if cost.name == plan.name else dataclasses.replace(cost, name=plan.name))
    return tuple(costs)


@functools.lru_cache(maxsize=1024)
def attention_time_share(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings) -> float:
    """The share of a transformer block's F + B on ``device`` spent in its causal attention
    core (what grows with the prefix a token attends to: TeraPipe's slices); 0 for a model
    without blocks or with measured layers.

    >>> from pipesched.model import load_device, load_model
    >>> share = attention_time_share(load_model("llama3-8b"), load_device("h100-sxm"), TrainingSettings(seq_len=32768))
    >>> 0.3 < share < 0.8
    True
    """
    if model.measured or model.num_layers == 0:
        return 0.0
    block = _block(model, _shape(model, settings), 0)  # the first block, as layer_costs' [1]
    cost = layer_costs(model, device, settings)[1]
    total = cost.forward_s + cost.backward_input_s + cost.backward_weight_s
    return sum(core_seconds(block, device, settings)) / total if total > 0 else 0.0


def layer_params(model: ModelSpec) -> list[float]:
    """Parameters of every layer (embedding, blocks, head), in order: all of them, as one
    device holds them without tensor parallelism.

    >>> from pipesched.model import load_model
    >>> round(sum(layer_params(load_model("llama3-8b"))) / 1e9, 2)
    8.03
    """
    return [layer.params for layer in layer_costs(model, load_device("cpu"), TrainingSettings(seq_len=1, tensor_parallel=1))]


def routed_expert_params(model: ModelSpec) -> float:
    """Parameters of every routed expert of every MoE block (what expert parallelism splits)."""
    blocks = sum(model.moe_block(i) for i in range(model.num_layers))
    up = 2 if model.gated_mlp else 1
    expert = (up + 1) * model.hidden_size * model.expert_ffn + ((up * model.expert_ffn + model.hidden_size)
                                                               if model.bias else 0)
    return blocks * model.num_experts * expert


def active_params(model: ModelSpec, *, embedding: bool = True) -> float:
    """Parameters one token runs through: ``layer_params`` less the routed experts it is not
    sent to (``num_experts - experts_per_token`` of every MoE block's); without the
    embedding table (a lookup, no matmul) when ``embedding`` is False, as DeepSeek counts
    its 36.6B activated parameters (Qwen and Mistral count it).

    >>> from pipesched.model import load_model
    >>> round(active_params(load_model("mixtral-8x22b")) / 1e9, 1)
    39.2
    """
    params = layer_params(model)
    total = sum(params) if embedding else sum(params[1:])
    idle = (model.num_experts - model.experts_per_token) / model.num_experts
    return total - idle * routed_expert_params(model)


def _measured(model: ModelSpec, device: DeviceSpec) -> list[LayerCost]:
    if not model.measured_on or model.measured_on == device.name:
        return list(model.measured)
    scale = load_device(model.measured_on).peak_flops / device.peak_flops
    return [
        dataclasses.replace(layer, forward_s=layer.forward_s * scale, backward_input_s=layer.backward_input_s * scale,
                            backward_weight_s=layer.backward_weight_s * scale, recompute_s=layer.recompute_s * scale)
        for layer in model.measured
    ]


def model_flops_per_iteration(model: ModelSpec, settings: TrainingSettings, num_microbatches: int) -> float:
    """Model FLOPs of one training iteration over the whole model (all tensor-parallel
    ranks): the forward and backward of every sample, no recompute (what MFU counts, as
    PaLM and Megatron-LM define it): ``num_microbatches`` x the layers' ``model_flops``."""
    return _flops_per_microbatch(model, settings, hardware=False) * num_microbatches


def hardware_flops_per_iteration(model: ModelSpec, settings: TrainingSettings, num_microbatches: int) -> float:
    """The FLOPs the devices execute in one iteration (what HFU counts): the model FLOPs and
    the forward work recompute redoes, ``num_microbatches`` x the layers' ``flops``."""
    return _flops_per_microbatch(model, settings, hardware=True) * num_microbatches


@functools.lru_cache(maxsize=512)
def _flops_per_microbatch(model: ModelSpec, settings: TrainingSettings, *, hardware: bool) -> float:
    """A pure function of hashable inputs, asked for by every evaluation of a sweep."""
    if model.measured:
        return sum(layer.flops if hardware else layer.model_flops for layer in model.measured)
    plans = layer_plans(model, settings)
    per_rank = sum(_flops(plan, settings) if hardware else _flops(plan, settings) - _recompute_flops(plan, settings)
                   for plan in plans)
    return per_rank * settings.stage_width


# --- every kernel of a layer (``pipesched costs --ops``) ------------------------------------
BOUNDS = {True: "memory", False: "compute"}  # a kernel's bound, by whether its bytes set its time


@dataclass(frozen=True)
class KernelCost:
    """One kernel of a layer on one device, and which side of its roofline sets its time."""

    name: str
    m: float  # rows of each matmul [m, k] x [k, n] (0 for a memory-bound kernel)
    n: float
    k: float
    groups: float  # matmuls in the kernel (heads x sequences, experts; 0 for a memory-bound kernel)
    flops: float  # forward FLOPs
    traffic: float  # forward bytes read and written
    forward_s: float
    backward_input_s: float  # its part of I
    backward_weight_s: float  # its part of W
    memory_bound: bool  # its forward's bytes, not its FLOPs, set its time
    phase: str = ATTENTION  # the part of the layer it runs in (PHASES; a plan kernel's empty phase resolved)

    @property
    def bound(self) -> str:
        """``memory`` or ``compute``: the side of the roofline that sets the forward."""
        return BOUNDS[self.memory_bound]


@dataclass(frozen=True)
class CollectiveCost:
    """One tensor-parallel collective of a layer: in the forward or in I."""

    name: str
    traffic: float  # bytes each rank holds (PlanCollective.nbytes)
    group: Group  # the ranks it runs over
    forward_s: float  # exposed, in F
    backward_s: float  # exposed, in I
    algorithm: str = ""  # what NCCL runs it with: ring, tree, switch, direct ("" when nothing moves)
    protocol: str = ""  # LL, LL128 or Simple ("" over an uncalibrated link)
    hidden_s: float = 0.0  # hidden behind the attention core (ring attention's KV hand-offs)
    phase: str = ATTENTION  # the phase it ends (PlanCollective.phase)


@dataclass(frozen=True)
class LayerOps:
    """A layer's cost (as ``layer_costs`` gives it) with the kernels and collectives it sums:
    F = the kernels' forward + the forward collectives; I = the kernels' I + the backward
    collectives + ``cost.recompute_s``; W = the kernels' W."""

    cost: LayerCost
    kernels: tuple[KernelCost, ...]
    collectives: tuple[CollectiveCost, ...]


def layer_ops(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings, *,
              tp_link: LinkSpec | None = None, groups: GroupLevels | None = None) -> list[LayerOps]:
    """Every layer's kernels and collectives with their times, beside its ``layer_costs``
    row (the same settings: decode sizes are ``micro_batch_size`` requests of ``seq_len``
    1).

    >>> from pipesched.model import load_device, load_model
    >>> ops = layer_ops(load_model("tiny"), load_device("h100-sxm"), TrainingSettings(seq_len=128))
    >>> [kernel.name for kernel in ops[1].kernels][:4]
    ['norm 1', 'qkv', 'flash attention', 'projection']
    """
    require(not model.measured, "model", model.name, "its layers are measured, with no kernels to list; "
            "give a model with its shape")
    costs = layer_costs(model, device, settings, tp_link=tp_link, groups=groups)
    if settings.optimizer_shards != 1:
        settings = dataclasses.replace(settings, optimizer_shards=1)
    link = tp_link or DEFAULT_TP_LINK
    return [LayerOps(cost, _kernel_costs(plan, device, settings), _collective_costs(plan, device, settings, link, groups))
            for cost, plan in zip(costs, layer_plans(model, settings), strict=True)]


def _kernel_costs(plan: LayerPlan, device: DeviceSpec, settings: TrainingSettings) -> tuple[KernelCost, ...]:
    """The layer's kernels as ``_times`` times them: with fused attention its core kernels
    are one flash kernel, where the first of them stood."""
    flash = plan.attention is not None and kernels.uses_flash(device, settings.element_bytes)
    listed = []
    phase = ATTENTION  # a kernel with no phase runs in the one before it
    for kernel in plan.kernels:
        phase = kernel.phase or phase
        if flash and kernel.attention_core:
            if not any(cost.name == FLASH_KERNEL for cost in listed):
                listed.append(dataclasses.replace(_flash_cost(plan, device), phase=phase))
            continue
        forward, backward_input, backward_weight = kernel_times(kernel, device, settings)
        listed.append(KernelCost(kernel.name, kernel.m, kernel.n, kernel.k, kernel.groups, kernel.flops,
                                 kernel.traffic, forward, backward_input, backward_weight,
                                 _memory_bound(kernel, device, settings), phase))
    return tuple(listed)


FLASH_KERNEL = "flash attention"


def _flash_cost(plan: LayerPlan, device: DeviceSpec) -> KernelCost:
    assert plan.attention is not None
    heads, seq, head_dim = plan.attention
    shape = {"heads": heads, "seq": seq, "head_dim": head_dim, "traffic": plan.attention_traffic}
    compute, memory = kernels.flash_attention_roofline(device, **shape)
    # FLOPs as the layer counts them: the score and context matmuls it fuses
    flops = sum(kernel.flops for kernel in plan.kernels if kernel.attention_core)
    blocks = plan.attention_blocks  # a ring attention's kernels, one per step, listed as one
    return KernelCost(FLASH_KERNEL, seq, seq, head_dim, heads * blocks, flops, plan.attention_traffic * blocks,
                      blocks * kernels.flash_attention_time(device, **shape),
                      blocks * kernels.flash_attention_time(device, **shape, backward=True), 0.0,
                      memory > compute)


def _memory_bound(kernel: Kernel, device: DeviceSpec, settings: TrainingSettings) -> bool:
    if kernel.groups == 0:
        return True
    compute, memory = kernels.matmul_roofline(device, kernel.m, kernel.n, kernel.k, groups=kernel.groups,
                                              traffic=kernel.traffic, fp32=settings.dtype == "fp32",
                                              fp8=fp8_matmul(kernel, settings))
    return memory > compute


def _collective_costs(plan: LayerPlan, device: DeviceSpec, settings: TrainingSettings, link: LinkSpec,
                      groups: GroupLevels | None) -> tuple[CollectiveCost, ...]:
    costs = []
    core = core_seconds(plan, device, settings)
    for collective in plan.collectives:
        choice = plan_collective_choice(collective, settings, link, groups)
        seconds = _exposed_seconds(collective, plan, core, settings, link, groups)
        costs.append(CollectiveCost(collective.name, collective.nbytes, collective.group,
                                    0.0 if collective.backward else seconds, seconds if collective.backward else 0.0,
                                    choice.algorithm, choice.protocol, hidden_s=collective.steps * choice.seconds - seconds,
                                    phase=collective.phase))
    return tuple(costs)
