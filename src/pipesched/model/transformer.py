"""Per-layer costs of a transformer from its shape: Megatron FLOPs, roofline times,
Korthikanti activation memory.

Every layer is a list of kernels. A kernel is a matmul (2mnk FLOPs) or a memory-bound
elementwise op (norm, softmax, dropout, activation function, residual add). A kernel takes
``max(flops / (peak * matmul_efficiency), bytes / (bandwidth * bandwidth_efficiency))``
seconds: the roofline.

Backward, per kernel:
- matmul with a weight, ``Y = X W``: the input gradient ``dX = dY W^T`` (in I) and the weight
  gradient ``dW = X^T dY`` (in W) each cost one forward matmul;
- matmul of two activations (attention scores ``Q K^T`` and context ``P V``): two input
  gradients, both in I;
- elementwise: I moves twice the forward bytes.
So backward FLOPs are twice the forward FLOPs, as in Narayanan et al. (2021).

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

Not modelled: expert parallelism (all experts of a layer sit on its stage, split by tensor
parallelism, with perfectly balanced routing), fused attention kernels (use selective
recompute for flash-attention memory), kernel launch overheads and compute/communication
overlap inside a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.errors import require
from pipesched.model.devices import load_device
from pipesched.model.hardware import DeviceSpec, LinkSpec
from pipesched.model.spec import (
    EMBEDDING,
    LOSS,
    TRANSFORMER,
    LayerCost,
    ModelSpec,
    TrainingSettings,
)

# Tensor-parallel link assumed when none is given: NVLink 4, 450 GB/s per direction.
DEFAULT_TP_LINK = LinkSpec(bandwidth=450e9, latency=3e-6)

# How a kernel's backward splits (see the module docstring).
WEIGHT_MATMUL = "weight"
ACTIVATION_MATMUL = "activations"
ELEMENTWISE = "elementwise"
# elementwise op on the way to a weight with no input gradient (the embedding lookup): W
# moves twice the forward bytes (the scatter-add into the embedding gradient)
WEIGHT_ELEMENTWISE = "weight elementwise"


@dataclass(frozen=True)
class Kernel:
    """One forward kernel of a layer."""

    name: str
    flops: float  # forward FLOPs
    traffic: float  # forward bytes read + written
    backward: str  # WEIGHT_MATMUL, ACTIVATION_MATMUL, ELEMENTWISE or WEIGHT_ELEMENTWISE
    attention_core: bool = False  # recomputed by selective recompute


@dataclass(frozen=True)
class _Shape:
    """Per-rank sizes of one microbatch under tensor parallelism."""

    tokens: int  # b * s
    batch: int  # b
    seq: int  # s
    hidden: int  # h
    heads: float  # query heads on this rank, a / t
    kv_heads: float  # key/value heads on this rank
    head_dim: int  # d
    ffn: float  # f / t
    vocab: float  # V / t (vocab-parallel embedding and head)
    elem: int  # bytes per activation element
    replicated: float  # share of a replicated activation on this rank: 1, or 1/t with sequence parallelism
    tp: int

    @property
    def q_width(self) -> float:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> float:
        return self.kv_heads * self.head_dim


def _shape(model: ModelSpec, settings: TrainingSettings) -> _Shape:
    t = settings.tensor_parallel
    require(model.num_heads % t == 0, "tensor_parallel", t, f"must divide num_heads={model.num_heads}")
    require(model.num_kv_heads % t == 0, "tensor_parallel", t,
            f"must divide num_kv_heads={model.num_kv_heads} (Megatron splits whole key/value groups)")
    return _Shape(
        tokens=settings.micro_batch_size * settings.seq_len,
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
    )


def _matmul(name: str, m: float, n: float, k: float, elem: int, *, batch: float = 1.0, weights: float = 1.0,
            backward: str = WEIGHT_MATMUL, attention_core: bool = False) -> Kernel:
    """``batch`` products of [m, k] x [k, n]; ``weights`` copies of the [k, n] operand (experts)."""
    if backward == WEIGHT_MATMUL:
        traffic = elem * (m * k + weights * k * n + m * n)
    else:
        traffic = elem * batch * (m * k + k * n + m * n)
    return Kernel(name, 2.0 * batch * m * n * k, traffic, backward, attention_core)


def _elementwise(name: str, traffic: float, *, attention_core: bool = False, backward: str = ELEMENTWISE) -> Kernel:
    return Kernel(name, 0.0, traffic, backward, attention_core)


@dataclass(frozen=True)
class _LayerPlan:
    """A layer before timing: its kernels, its tensor-parallel collectives and its memory."""

    name: str
    kind: str
    kernels: tuple[Kernel, ...]
    forward_collectives: tuple[float, ...]  # bytes all-reduced in F
    backward_collectives: tuple[float, ...]  # bytes all-reduced in I
    activation_bytes: float  # kept without recompute
    selective_activation_bytes: float  # kept with selective recompute
    checkpoint_bytes: float  # kept with full recompute (the layer input)
    weight_input_bytes: float  # matmul inputs W needs after I
    params: float
    output_bytes: float


def _embedding(model: ModelSpec, x: _Shape) -> _LayerPlan:
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
    return _LayerPlan(
        name="embedding", kind=EMBEDDING, kernels=tuple(kernels),
        forward_collectives=(tokens * h * e,) if x.tp > 1 else (),
        backward_collectives=(),
        activation_bytes=mask + ids, selective_activation_bytes=mask + ids, checkpoint_bytes=ids,
        weight_input_bytes=ids,
        params=x.vocab * h + model.position_embeddings * h,
        output_bytes=hidden_bytes,
    )


def _block(model: ModelSpec, x: _Shape, index: int) -> _LayerPlan:
    b, s, tokens, h, e, r = x.batch, x.seq, x.tokens, x.hidden, x.elem, x.replicated
    hidden_bytes = tokens * h * e * r  # one replicated hidden-state tensor on this rank
    mask_hidden = tokens * h * r if model.dropout else 0.0  # 1-byte dropout mask
    scores = b * x.heads * s * s  # attention score elements on this rank
    norm_params = h * (2 if model.bias else 1)

    # attention: norm, QKV, scores, softmax (+ dropout), context, projection, residual
    kernels = [
        _elementwise("norm 1", 2 * hidden_bytes),
        _matmul("qkv", tokens, x.q_width + 2 * x.kv_width, h, e),
        _matmul("scores", s, s, x.head_dim, e, batch=b * x.heads, backward=ACTIVATION_MATMUL, attention_core=True),
        _elementwise("softmax", 2 * scores * e, attention_core=True),
    ]
    core_bytes = scores * e  # softmax output
    if model.dropout:
        kernels.append(_elementwise("attention dropout", 2 * scores * e + scores, attention_core=True))
        core_bytes += scores + scores * e  # mask + dropout output
    kernels += [
        _matmul("context", s, x.head_dim, s, e, batch=b * x.heads, backward=ACTIVATION_MATMUL, attention_core=True),
        _matmul("projection", tokens, h, x.q_width, e),
        _elementwise("residual 1", 3 * hidden_bytes + mask_hidden),
        _elementwise("norm 2", 2 * hidden_bytes),
    ]
    attention_kept = (
        2 * hidden_bytes  # norm-1 input, QKV input
        + tokens * (x.q_width + 2 * x.kv_width) * e  # Q, K for the scores; V for the context
        + tokens * x.q_width * e  # projection input
        + mask_hidden
    )
    attention_params = (norm_params + h * (x.q_width + 2 * x.kv_width) + x.q_width * h
                        + ((x.q_width + 2 * x.kv_width) + h if model.bias else 0))
    weight_inputs = 2 * hidden_bytes + tokens * x.q_width * e  # QKV, projection and MLP inputs

    # MLP: dense, or router + experts; every routed token runs experts_per_token experts
    matrices = 3 if model.gated_mlp else 2
    if model.is_moe:
        experts, routed = model.num_experts, tokens * model.experts_per_token
        kernels += [
            _matmul("router", tokens, experts, h, e),
            _elementwise("dispatch", tokens * h * e * (1 + model.experts_per_token)),
        ]
        mlp_kept = 2 * hidden_bytes + 4.0 * tokens * experts + routed * h * e  # norm-2 in, router in, fp32 router probs, expert inputs
        mlp_params = norm_params + h * experts + experts * matrices * h * x.ffn
        weight_inputs += routed * h * e + routed * x.ffn * e
    else:
        experts, routed = 1, tokens
        mlp_kept = 2 * hidden_bytes  # norm-2 input, MLP input
        mlp_params = norm_params + matrices * h * x.ffn
        weight_inputs += routed * x.ffn * e
    up_width = 2 * x.ffn if model.gated_mlp else x.ffn
    kernels += [
        _matmul("mlp up", routed, up_width, h, e, weights=experts),
        _elementwise("activation", routed * x.ffn * e * (3 if model.gated_mlp else 2)),
        _matmul("mlp down", routed, h, x.ffn, e, weights=experts),
    ]
    if model.is_moe:
        kernels.append(_elementwise("combine", tokens * h * e * (1 + model.experts_per_token)))
        mlp_kept += routed * h * e  # expert outputs for the combine weights' gradient
    kernels.append(_elementwise("residual 2", 3 * hidden_bytes + mask_hidden))
    mlp_kept += routed * up_width * e + routed * x.ffn * e + mask_hidden  # activation-function input, down input
    if model.bias:
        mlp_params += experts * (up_width + h)

    selective = attention_kept + mlp_kept
    return _LayerPlan(
        name=f"layer.{index}", kind=TRANSFORMER, kernels=tuple(kernels),
        forward_collectives=(tokens * h * e,) * 2 if x.tp > 1 else (),
        backward_collectives=(tokens * h * e,) * 2 if x.tp > 1 else (),
        activation_bytes=selective + core_bytes,
        selective_activation_bytes=selective,
        checkpoint_bytes=hidden_bytes,
        weight_input_bytes=weight_inputs,
        params=attention_params + mlp_params,
        output_bytes=hidden_bytes,
    )


def _head(model: ModelSpec, x: _Shape) -> _LayerPlan:
    tokens, h, e = x.tokens, x.hidden, x.elem
    hidden_bytes = tokens * h * e * x.replicated
    logits = tokens * x.vocab  # logit elements on this rank
    kernels = (
        _elementwise("final norm", 2 * hidden_bytes),
        _matmul("lm head", tokens, x.vocab, h, e),
        # softmax cross-entropy in fp32 over the logits
        _elementwise("cross entropy", logits * (e + 4)),
    )
    kept = 2 * hidden_bytes + 4 * logits  # norm input, head input, fp32 logits (Korthikanti: 4sbh/t (1 + V/h))
    return _LayerPlan(
        name="head", kind=LOSS, kernels=kernels,
        # vocab-parallel cross-entropy: max and sum over the vocabulary shards (fp32 per token)
        forward_collectives=(4.0 * tokens, 4.0 * tokens) if x.tp > 1 else (),
        backward_collectives=(tokens * h * e,) if x.tp > 1 else (),
        activation_bytes=kept, selective_activation_bytes=kept, checkpoint_bytes=kept,
        weight_input_bytes=hidden_bytes,
        params=h * x.vocab + h * (2 if model.bias else 1),
        output_bytes=0.0,
    )


def layer_plans(model: ModelSpec, settings: TrainingSettings) -> list[_LayerPlan]:
    x = _shape(model, settings)
    return [_embedding(model, x), *(_block(model, x, i) for i in range(model.num_layers)), _head(model, x)]


def _kernel_time(flops: float, traffic: float, device: DeviceSpec, settings: TrainingSettings) -> float:
    peak = device.peak_flops * device.matmul_efficiency
    if settings.dtype == "fp32":
        peak /= 2  # fp32 (TF32) matmuls at half the 16-bit rate
    return max(flops / peak, traffic / (device.memory_bandwidth * device.bandwidth_efficiency))


def allreduce_time(nbytes: float, ranks: int, link: LinkSpec) -> float:
    """Ring all-reduce of ``nbytes`` over ``ranks`` ranks: 2 (t-1)/t of the bytes per rank.

    >>> allreduce_time(1e9, 1, DEFAULT_TP_LINK)
    0.0
    """
    if ranks <= 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / link.bandwidth + steps * link.latency


def _cost(plan: _LayerPlan, device: DeviceSpec, settings: TrainingSettings, link: LinkSpec) -> LayerCost:
    def time(flops: float, traffic: float) -> float:
        return _kernel_time(flops, traffic, device, settings)

    forward = backward_input = backward_weight = core = 0.0
    flops = 0.0
    core_flops = 0.0
    for kernel in plan.kernels:
        step = time(kernel.flops, kernel.traffic)
        forward += step
        if kernel.attention_core:
            core += step
            core_flops += kernel.flops
        if kernel.backward == WEIGHT_MATMUL:
            backward_input += step
            backward_weight += step
            flops += 3 * kernel.flops
        elif kernel.backward == ACTIVATION_MATMUL:
            backward_input += 2 * step
            flops += 3 * kernel.flops
        elif kernel.backward == WEIGHT_ELEMENTWISE:
            backward_weight += time(0.0, 2 * kernel.traffic)
        else:
            backward_input += time(0.0, 2 * kernel.traffic)
    tp = settings.tensor_parallel
    forward += sum(allreduce_time(n, tp, link) for n in plan.forward_collectives)
    backward_input += sum(allreduce_time(n, tp, link) for n in plan.backward_collectives)

    activation = plan.activation_bytes
    weight_inputs = plan.weight_input_bytes
    if settings.recompute == "selective" and plan.kind == TRANSFORMER:
        activation = plan.selective_activation_bytes
        backward_input += core  # redo scores, softmax, dropout and context before their backward
        flops += core_flops
    elif settings.recompute == "full" and plan.kind == TRANSFORMER:
        activation = plan.checkpoint_bytes
        backward_input += forward  # redo the whole forward from the kept input
        flops += sum(kernel.flops for kernel in plan.kernels)
        weight_inputs = activation  # the kept input stays until W is done
    return LayerCost(
        name=plan.name,
        forward_s=forward,
        backward_input_s=backward_input,
        backward_weight_s=backward_weight,
        activation_bytes=activation,
        params=plan.params,
        output_bytes=plan.output_bytes,
        flops=flops,
        weight_input_bytes=min(weight_inputs, activation),
        kind=plan.kind,
    )


def layer_costs(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings, *,
                tp_link: LinkSpec | None = None) -> list[LayerCost]:
    """Cost of every layer (embedding, blocks, head) for one microbatch on ``device``.

    ``tp_link`` carries the tensor-parallel all-reduces (default: NVLink, 450 GB/s). A
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
    link = tp_link or DEFAULT_TP_LINK
    return [_cost(plan, device, settings, link) for plan in layer_plans(model, settings)]


def layer_params(model: ModelSpec) -> list[float]:
    """Parameters of every layer (embedding, blocks, head), in order: all of them, as one
    device holds them without tensor parallelism.

    >>> from pipesched.model import load_model
    >>> round(sum(layer_params(load_model("llama3-8b"))) / 1e9, 2)
    8.03
    """
    return [layer.params for layer in layer_costs(model, load_device("cpu"), TrainingSettings(seq_len=1))]


def _measured(model: ModelSpec, device: DeviceSpec) -> list[LayerCost]:
    if not model.measured_on or model.measured_on == device.name:
        return list(model.measured)
    scale = load_device(model.measured_on).peak_flops / device.peak_flops
    return [
        LayerCost(layer.name, layer.forward_s * scale, layer.backward_input_s * scale,
                  layer.backward_weight_s * scale, layer.activation_bytes, layer.params,
                  layer.output_bytes, flops=layer.flops, weight_input_bytes=layer.weight_input_bytes,
                  kind=layer.kind)
        for layer in model.measured
    ]


def model_flops_per_iteration(model: ModelSpec, settings: TrainingSettings, num_microbatches: int) -> float:
    """Matmul FLOPs of one training iteration over the whole model (all tensor-parallel
    ranks), recompute included: ``num_microbatches`` x the layers' ``flops``."""
    if model.measured:
        return sum(layer.flops for layer in model.measured) * num_microbatches
    counter = DeviceSpec("flop-counter", 1.0, 1.0, 1.0)  # times unused
    per_rank = sum(_cost(plan, counter, settings, DEFAULT_TP_LINK).flops for plan in layer_plans(model, settings))
    return per_rank * settings.tensor_parallel * num_microbatches
