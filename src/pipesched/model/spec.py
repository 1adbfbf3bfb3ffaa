"""What is being trained and how: the model's shape, the training settings, and the cost of
one layer for one microbatch.

A model is a list of layers: the embedding (``E``), ``num_layers`` transformer blocks
(``t``: attention + MLP, dense or mixture-of-experts) and the final norm + LM head + loss
(``L``). The letters are Megatron's pipeline-layout symbols. A model may instead carry
``measured`` layer costs (from a profile file); those are used as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.limits import (
    MAX_CLUSTER_RANKS,
    MAX_CONTEXT_PARALLEL,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SEQ_LEN,
    MAX_TENSOR_PARALLEL,
    MAX_VOCAB,
    MAX_WIDTH,
    check_amount,
    check_count,
    check_name,
)

# Megatron pipeline-layout letters of the layer kinds.
EMBEDDING = "E"
TRANSFORMER = "t"
MTP = "m"
LOSS = "L"
LAYER_KINDS = (EMBEDDING, TRANSFORMER, MTP, LOSS)

# bytes of one activation element per training dtype (Korthikanti et al. assume 16-bit)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
RECOMPUTE_MODES = ("none", "selective", "full")
# how context-parallel ranks exchange keys and values, as Megatron-Core names them
# (``cp_comm_type``): p2p ring attention (each rank passes its KV block round the ring, cp - 1
# steps, each hidden behind the previous block's attention when that is long enough), a2a
# (DeepSpeed-Ulysses: all-to-alls scatter the heads and gather the sequence of Q, K, V and back
# for O) and allgather (every rank gathers the whole sequence's K and V)
CP_COMM_TYPES = ("p2p", "a2a", "allgather")

# mixed-precision Adam, bytes per parameter (Megatron without a distributed optimizer): the
# bf16 working weight, the fp32 gradient (what data parallel all-reduces), the fp32 master
# weight and the two fp32 Adam moments; 18 bytes of static state in all
WEIGHT_BYTES_PER_PARAM = 2.0
GRAD_BYTES_PER_PARAM = 4.0
OPTIMIZER_BYTES_PER_PARAM = 12.0
STATIC_BYTES_PER_PARAM = WEIGHT_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM


# the whole-number fields of a ModelSpec: (limit, what it counts, what 0 means or "" when 0
# is not allowed)
_SHAPE_LIMITS = {
    "num_layers": (MAX_LAYERS, "layers", ""),
    "hidden_size": (MAX_WIDTH, "", ""),
    "num_heads": (MAX_HEADS, "heads", ""),
    "num_kv_heads": (MAX_HEADS, "heads", ""),
    "ffn_hidden_size": (MAX_WIDTH, "", ""),
    "vocab_size": (MAX_VOCAB, "tokens", ""),
    "num_experts": (MAX_HEADS, "experts", ""),
    "experts_per_token": (MAX_HEADS, "experts", ""),
    "head_dim": (MAX_WIDTH, "", "hidden_size / num_heads"),
    "position_embeddings": (MAX_VOCAB, "positions", "rotary positions"),
    "context_length": (MAX_SEQ_LEN, "tokens", "no limit known"),
}
_SWITCHES = ("gated_mlp", "tied_embeddings", "bias", "dropout")


def _finite(value: float, field_name: str) -> float:
    """A finite number >= 0 (computed costs may be large; loaders bound what they read)."""
    return check_amount(field_name, value, limit=math.inf)


@dataclass(frozen=True)
class LayerCost:
    """What one layer costs for one microbatch on one device (its tensor-parallel share).

    The first seven fields are the columns of the measured-layer CSV and of
    ``pipesched costs --json``.
    """

    name: str
    forward_s: float  # F: forward time, seconds
    backward_input_s: float  # I: input-gradient time (with any recompute), seconds
    backward_weight_s: float  # W: weight-gradient time, seconds
    activation_bytes: float  # kept from F until the backward ends, bytes per microbatch
    params: float  # parameters this device holds for the layer
    output_bytes: float  # tensor sent to the next layer (its gradient comes back the same size)
    flops: float = 0.0  # matmul FLOPs of F + I + W (+ recompute) on this device
    weight_input_bytes: float = 0.0  # part of activation_bytes W still needs after I
    kind: str = TRANSFORMER  # layout letter: E, t, m or L
    # gradients I computes and W still needs (the output gradient of each weight matmul):
    # allocated by I, freed by W, bytes per microbatch
    kept_for_w_bytes: float = 0.0
    recompute_s: float = 0.0  # part of backward_input_s that redoes the forward (activation recompute)
    forward_flops: float = 0.0  # part of flops in F (0: unknown, as for measured layers)
    weight_flops: float = 0.0  # part of flops in W (0: unknown)
    frozen: bool = False  # its parameters do not train (see pipesched.model.freezing)
    recompute_flops: float = 0.0  # part of flops that redoes the forward (activation recompute; 0: unknown)

    def __post_init__(self) -> None:
        require(bool(self.name), "layer name", repr(self.name), "give every layer a name")
        check_name("layer name", self.name)
        for field_name in ("forward_s", "backward_input_s", "backward_weight_s", "activation_bytes",
                           "params", "output_bytes", "flops", "weight_input_bytes", "kept_for_w_bytes",
                           "recompute_s", "forward_flops", "weight_flops", "recompute_flops"):
            object.__setattr__(self, field_name, _finite(getattr(self, field_name), f"{self.name}.{field_name}"))
        require(self.kind in LAYER_KINDS, f"{self.name}.kind", self.kind,
                f"must be one of {', '.join(LAYER_KINDS)}")

    @property
    def model_flops(self) -> float:
        """The layer's model FLOPs: its work without what recompute redoes (what MFU counts)."""
        return max(self.flops - self.recompute_flops, 0.0)

    @property
    def total_s(self) -> float:
        """F + I + W, seconds."""
        return self.forward_s + self.backward_input_s + self.backward_weight_s


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (nanoGPT-style config: one field, one meaning).

    For mixture-of-experts models ``ffn_hidden_size`` is the hidden size of one expert.
    With ``measured`` layer costs the shape fields are informational and may be 0.
    """

    name: str
    num_layers: int  # transformer blocks (not counting embedding and head)
    hidden_size: int  # h
    num_heads: int  # a, query heads
    num_kv_heads: int  # key/value heads (grouped-query attention when < num_heads)
    ffn_hidden_size: int  # f, MLP (or per-expert) hidden size
    vocab_size: int  # V
    num_experts: int = 1  # E, 1 = dense MLP
    experts_per_token: int = 1  # top-k routing
    gated_mlp: bool = False  # SwiGLU (Llama, Mixtral): three MLP matrices instead of two
    head_dim: int = 0  # per-head size; 0 = hidden_size / num_heads
    tied_embeddings: bool = False  # LM head shares the embedding matrix (the head stage keeps a copy)
    position_embeddings: int = 0  # learned absolute positions (GPT); 0 = rotary, no parameters
    context_length: int = 0  # longest sequence (prompt + output) the model serves; 0 = no limit known
    bias: bool = False  # linear layers and norms have biases (GPT); False for RMSNorm models
    dropout: bool = False  # dropout masks are kept (Korthikanti's inventory assumes dropout)
    measured: tuple[LayerCost, ...] = ()  # measured per-layer costs, used as given
    measured_on: str = ""  # device preset the measured costs come from ("" = use them anywhere as is)

    def __post_init__(self) -> None:
        require(bool(self.name), "model name", repr(self.name), "give the model a name")
        check_name("model name", self.name)
        if self.measured_on:
            check_name("measured_on", self.measured_on)
        if self.measured:
            object.__setattr__(self, "measured", tuple(self.measured))
            check_count("layers", len(self.measured), MAX_LAYERS, what="layers")
            names = [layer.name for layer in self.measured]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            require(not duplicates, "layer name", duplicates[0] if duplicates else "",
                    "appears twice in the measured layers; give each layer its own name")
            return
        for field_name, (limit, counted, zero) in _SHAPE_LIMITS.items():
            value = getattr(self, field_name)
            fix = f"must be a whole number >= 0 (0 = {zero})" if zero else "must be a positive integer"
            require(isinstance(value, int) and not isinstance(value, bool) and value >= (0 if zero else 1),
                    field_name, value, fix)
            check_count(field_name, value, limit, minimum=None, what=counted)
        for field_name in _SWITCHES:
            value = getattr(self, field_name)
            require(isinstance(value, bool), field_name, value, "must be true or false")
        if self.head_dim == 0:
            require(self.hidden_size % self.num_heads == 0, "num_heads", self.num_heads,
                    f"must divide hidden_size={self.hidden_size} (or give head_dim)")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
                f"must divide num_heads={self.num_heads}")
        require(self.experts_per_token <= self.num_experts, "experts_per_token", self.experts_per_token,
                f"must be at most num_experts={self.num_experts}")

    @property
    def kv_channels(self) -> int:
        """Size of one attention head (d_h)."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The layout letter of every layer, in order."""
        if self.measured:
            return tuple(layer.kind for layer in self.measured)
        return (EMBEDDING,) + (TRANSFORMER,) * self.num_layers + (LOSS,)

    @property
    def layer_names(self) -> tuple[str, ...]:
        if self.measured:
            return tuple(layer.name for layer in self.measured)
        return ("embedding", *(f"layer.{i}" for i in range(self.num_layers)), "head")

    @property
    def num_cost_layers(self) -> int:
        """Layers the partitioner places (embedding and head included)."""
        return len(self.layer_kinds)


@dataclass(frozen=True)
class TrainingSettings:
    """How one microbatch is run. Parameter memory uses mixed-precision Adam by default:
    2 bytes bf16 weight + 4 bytes fp32 gradient + 12 bytes fp32 master weight, Adam m and v
    = 18 bytes per parameter (Megatron without a distributed optimizer; with it,
    ``optimizer_shards`` = d splits the 12 bytes over the data-parallel ranks)."""

    # the commands' defaults (pipesched.defaults), tensor parallelism included
    micro_batch_size: int = DEFAULTS.micro_batch_size  # b, sequences per microbatch
    seq_len: int = DEFAULTS.seq_len  # s, tokens per sequence
    dtype: str = DEFAULTS.dtype  # activation and matmul dtype: bf16, fp16 or fp32 (fp32 matmuls at half the 16-bit peak)
    recompute: str = DEFAULTS.recompute  # none | selective (attention core) | full (whole layer, keeps its input); per stage: see pipesched.model.recompute
    tensor_parallel: int = DEFAULTS.tensor_parallel  # t, ranks that split every layer (Megatron tensor parallelism)
    sequence_parallel: bool = DEFAULTS.sequence_parallel  # also split norms/dropouts along the sequence (Korthikanti)
    weight_bytes: float = WEIGHT_BYTES_PER_PARAM  # bytes per parameter for the working weights
    grad_bytes: float = GRAD_BYTES_PER_PARAM  # bytes per parameter for the gradient (what data parallel all-reduces)
    optimizer_bytes: float = OPTIMIZER_BYTES_PER_PARAM  # bytes per parameter for optimizer state (fp32 master + Adam m, v)
    # layers whose parameters do not train, as positions in the model's layer list (embedding
    # first, as `pipesched costs` lists them; see pipesched.model.freezing)
    frozen_layers: tuple[int, ...] = ()
    # data-parallel ranks the optimizer state is split over (ZeRO-1, Megatron's distributed
    # optimizer: each of d ranks keeps 1/d of it); 1: every rank keeps all of it
    optimizer_shards: int = 1
    # cp, ranks that split every sequence (context parallelism): each holds 2 chunks of s / (2 cp)
    # tokens (Megatron's load balancing of causal attention), so 2 cp must divide seq_len
    context_parallel: int = DEFAULTS.context_parallel
    cp_comm_type: str = DEFAULTS.cp_comm_type  # one of CP_COMM_TYPES

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_layers", tuple(sorted({int(layer) for layer in self.frozen_layers})))
        require(all(layer >= 0 for layer in self.frozen_layers), "frozen_layers",
                self.frozen_layers[0] if self.frozen_layers else "", "layer positions are >= 0")
        for field_name, limit, what in (("micro_batch_size", MAX_MICRO_BATCH_SIZE, "sequences per microbatch"),
                                        ("seq_len", MAX_SEQ_LEN, "tokens per sequence"),
                                        ("tensor_parallel", MAX_TENSOR_PARALLEL, "tensor-parallel ranks"),
                                        ("optimizer_shards", MAX_CLUSTER_RANKS, "optimizer shards"),
                                        ("context_parallel", MAX_CONTEXT_PARALLEL, "context-parallel ranks")):
            value = getattr(self, field_name)
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, field_name, value,
                    "must be a positive integer")
            check_count(field_name, value, limit, what=what)
        require(isinstance(self.sequence_parallel, bool), "sequence_parallel", self.sequence_parallel,
                "must be true or false")
        require(self.dtype in DTYPE_BYTES, "dtype", self.dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
        require(self.recompute in RECOMPUTE_MODES, "recompute", self.recompute,
                f"must be one of {', '.join(RECOMPUTE_MODES)}")
        for field_name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
            _finite(getattr(self, field_name), field_name)
        check_context_parallel(self.context_parallel, self.cp_comm_type, self.seq_len)

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def stage_width(self) -> int:
        """Devices one pipeline stage spans: its tensor-parallel group in each of its
        context-parallel ranks, t x cp."""
        return self.tensor_parallel * self.context_parallel

    @property
    def static_bytes_per_param(self) -> float:
        """Parameters + gradients + this rank's share of the optimizer state, bytes per
        parameter."""
        if self.optimizer_shards == 1:
            return self.weight_bytes + self.grad_bytes + self.optimizer_bytes
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes / self.optimizer_shards


def check_context_parallel(cp: int, comm: str, seq_len: int) -> None:
    """Refuse a context-parallel split the load balancing cannot make: each of the cp ranks
    holds 2 chunks of the sequence (chunk i and chunk 2 cp - 1 - i), so 2 cp divides it."""
    require(comm in CP_COMM_TYPES, "cp_comm_type", comm, f"choose one of {', '.join(CP_COMM_TYPES)}")
    if cp > 1:
        require(seq_len % (2 * cp) == 0, "context_parallel", cp,
                f"each rank holds 2 chunks of the sequence, so 2 x cp must divide seq_len={seq_len}; give a cp "
                f"with 2 x cp dividing {seq_len}, or a seq_len that is a multiple of {2 * cp}")

