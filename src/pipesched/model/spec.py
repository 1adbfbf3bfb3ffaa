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
    MAX_CAPACITY_FACTOR,
    MAX_CLUSTER_RANKS,
    MAX_EXPERT_PARALLEL,
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
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
# dtypes whose matmuls run on a device's FP8 tensor cores (DeviceSpec.fp8_peak_flops). FP8
# training keeps its activations, the tensors communicated (but the expert dispatch) and the
# non-matmul kernels in bf16, as DeepSeek-V3 and Transformer Engine do: fp8's element is 2
# bytes, and only the matmuls' inputs are 1-byte (FP8_MATMUL_BYTES)
FP8_DTYPES = ("fp8",)
FP8_MATMUL_BYTES = 1
RECOMPUTE_MODES = ("none", "selective", "full")
MOE_DISPATCHERS = ("alltoall", "deepep")  # TrainingSettings.moe_dispatcher

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
    "moe_ffn_hidden_size": (MAX_WIDTH, "", "ffn_hidden_size"),
    "num_shared_experts": (MAX_HEADS, "experts", "none"),
    "first_dense_layers": (MAX_LAYERS, "layers", "every block has the MoE MLP"),
    "q_lora_rank": (MAX_WIDTH, "", "full-rank queries"),
    "kv_lora_rank": (MAX_WIDTH, "", "no multi-head latent attention"),
    "qk_rope_head_dim": (MAX_WIDTH, "", "no rotary part apart"),
    "qk_nope_head_dim": (MAX_WIDTH, "", "head_dim"),
    "v_head_dim": (MAX_WIDTH, "", "head_dim"),
    "routed_node_limit": (MAX_HEADS, "nodes", "any node"),
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
    # --- mixture of experts (DeepSeek-V3, Qwen3-MoE): num_experts routed experts per MoE block
    moe_ffn_hidden_size: int = 0  # hidden size of one routed (and shared) expert; 0 = ffn_hidden_size
    num_shared_experts: int = 0  # experts every token runs through besides its top-k (a dense MLP of this many experts' width)
    first_dense_layers: int = 0  # the first k blocks have a dense MLP of ffn_hidden_size (DeepSeek's first_k_dense_replace)
    capacity_factor: float = 0.0  # tokens an expert takes at most, over the balanced mean; 0 = dropless
    expert_skew: float = 1.0  # the hottest expert's tokens over the mean (load imbalance); 1 = balanced
    expert_load: tuple[float, ...] = ()  # measured tokens per routed expert (any scale); replaces expert_skew
    routed_node_limit: int = 0  # nodes one token's experts may span (DeepSeek-V3's node-limited routing: 4); 0 = any
    # --- multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = ordinary attention
    q_lora_rank: int = 0  # rank of the query's down-projection; 0 = queries from h directly
    kv_lora_rank: int = 0  # rank of the compressed key-value latent (what the KV cache holds)
    qk_rope_head_dim: int = 0  # rotary part of each query/key head, shared by all heads for keys
    qk_nope_head_dim: int = 0  # non-rotary part of each query/key head
    v_head_dim: int = 0  # size of each value head

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
                f"must be at most num_experts={self.num_experts}; give a smaller top-k or more experts")
        self._check_experts()

    def _check_experts(self) -> None:
        """The mixture-of-experts and latent-attention fields are consistent."""
        require(self.first_dense_layers <= self.num_layers, "first_dense_layers", self.first_dense_layers,
                f"must be at most num_layers={self.num_layers}")
        check_amount("capacity_factor", self.capacity_factor, limit=MAX_CAPACITY_FACTOR)
        require(self.capacity_factor == 0 or self.capacity_factor >= 1, "capacity_factor", self.capacity_factor,
                "must be 0 (dropless) or >= 1 (an expert takes at least its balanced share)")
        check_amount("expert_skew", self.expert_skew, limit=MAX_CAPACITY_FACTOR)
        require(self.expert_skew >= 1, "expert_skew", self.expert_skew,
                "must be >= 1 (the hottest expert's tokens over the mean; 1 = balanced)")
        object.__setattr__(self, "expert_load", tuple(float(x) for x in self.expert_load))
        if self.expert_load:
            require(len(self.expert_load) == self.num_experts, "expert_load", f"{len(self.expert_load)} values",
                    f"give one load per routed expert ({self.num_experts})")
            for load in self.expert_load:
                check_amount("expert_load", load)
            require(sum(self.expert_load) > 0, "expert_load", "all 0", "give some expert a positive load")
        if self.kv_lora_rank:
            require(self.qk_rope_head_dim > 0 and self.qk_nope_head_dim > 0 and self.v_head_dim > 0,
                    "kv_lora_rank", self.kv_lora_rank,
                    "latent attention needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim too")

    @property
    def kv_channels(self) -> int:
        """Size of one attention head (d_h)."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: keys and values from a compressed latent."""
        return self.kv_lora_rank > 0

    @property
    def expert_ffn(self) -> int:
        """Hidden size of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def moe_block(self, index: int) -> bool:
        """Block ``index`` (0-based) has the mixture-of-experts MLP."""
        return self.is_moe and index >= self.first_dense_layers

    def kv_cache_elements(self, tensor_parallel: int = 1) -> float:
        """Elements one token's attention cache holds per block on one of ``tensor_parallel``
        ranks: its keys and values (split by heads), or with latent attention the compressed
        latent and the shared rotary key (the same on every rank, as DeepSeek's inference
        keeps it)."""
        if self.is_mla:
            return float(self.kv_lora_rank + self.qk_rope_head_dim)
        return 2.0 * (self.num_kv_heads / tensor_parallel) * self.kv_channels

    def hottest_share(self, groups: int) -> float:
        """Tokens the busiest of ``groups`` equal groups of consecutive routed experts takes,
        over the mean group's: from the measured ``expert_load``, or with ``expert_skew`` the
        hottest expert at skew x the mean and the others sharing the rest evenly (1 with one
        group: every token stays).

        >>> round(ModelSpec("m", 1, 8, 1, 1, 8, 8, num_experts=8, expert_skew=2.0).hottest_share(4), 4)
        1.4286
        """
        per_group = self.num_experts // groups
        loads = self._expert_loads()
        sums = [sum(loads[g * per_group:(g + 1) * per_group]) for g in range(groups)]
        return max(sums) / (sum(loads) / groups)

    def routed_destinations(self, ranks: int, per_node: int) -> tuple[float, float]:
        """Distinct nodes and distinct ranks one token's ``experts_per_token`` experts reach
        over ``ranks`` expert-parallel ranks of ``per_node`` to a node (uniform routing, as
        DeepEP's tests draw it): the token picks ``routed_node_limit`` of the nodes (all
        when 0), then its experts among theirs, drawn without replacement.

        >>> model = ModelSpec("m", 1, 8, 1, 1, 8, 8, num_experts=256, experts_per_token=8, routed_node_limit=4)
        >>> [round(x, 2) for x in model.routed_destinations(8, 8)], [round(x, 2) for x in model.routed_destinations(64, 8)]
        ([1.0, 5.29], [3.63, 7.36])
        """
        k, experts = self.experts_per_token, self.num_experts
        nodes = max(1, ranks // per_node)
        chosen = min(nodes, self.routed_node_limit or nodes)
        per_node_experts = experts // nodes
        pool = chosen * per_node_experts  # the experts of the nodes the token may use
        reached_nodes = chosen * (1.0 - math.comb(pool - per_node_experts, k) / math.comb(pool, k))
        per_rank = experts // ranks
        reached_ranks = ranks * chosen / nodes * (1.0 - math.comb(pool - per_rank, k) / math.comb(pool, k))
        return (reached_nodes if nodes > 1 else 1.0), reached_ranks

    def _expert_loads(self) -> list[float]:
        """Every routed expert's tokens over the mean expert's."""
        experts = self.num_experts
        if self.expert_load:
            mean = sum(self.expert_load) / experts
            return [load / mean for load in self.expert_load]
        hottest = min(self.expert_skew, float(experts))
        rest = (experts - hottest) / (experts - 1) if experts > 1 else 1.0
        return [hottest] + [rest] * (experts - 1)

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
    # ranks the routed experts of a MoE block are split over (expert parallelism, EP); each
    # holds num_experts / EP of them. Megatron-Core's parallel folding: the EP x ETP ranks of a
    # MoE block are the stage's tensor-parallel ranks and its data-parallel peers
    expert_parallel: int = 1
    # tensor-parallel ranks that split each expert (ETP); 0 = tensor_parallel (Megatron's default)
    expert_tensor_parallel: int = 0
    # how tokens reach the experts: "alltoall" (a copy per selected expert, Megatron-Core's
    # all-to-all dispatcher) or "deepep" (a copy per destination rank, sent across nodes once
    # per destination node and forwarded over NVLink inside it: DeepEP's normal kernels)
    moe_dispatcher: str = DEFAULTS.moe_dispatcher

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_layers", tuple(sorted({int(layer) for layer in self.frozen_layers})))
        require(all(layer >= 0 for layer in self.frozen_layers), "frozen_layers",
                self.frozen_layers[0] if self.frozen_layers else "", "layer positions are >= 0")
        for field_name, limit, what in (("micro_batch_size", MAX_MICRO_BATCH_SIZE, "sequences per microbatch"),
                                        ("seq_len", MAX_SEQ_LEN, "tokens per sequence"),
                                        ("tensor_parallel", MAX_TENSOR_PARALLEL, "tensor-parallel ranks"),
                                        ("optimizer_shards", MAX_CLUSTER_RANKS, "optimizer shards"),
                                        ("expert_parallel", MAX_EXPERT_PARALLEL, "expert-parallel ranks")):
            value = getattr(self, field_name)
            require(isinstance(value, int) and not isinstance(value, bool) and value > 0, field_name, value,
                    "must be a positive integer")
            check_count(field_name, value, limit, what=what)
        require(isinstance(self.expert_tensor_parallel, int) and self.expert_tensor_parallel >= 0,
                "expert_tensor_parallel", self.expert_tensor_parallel, "must be a whole number >= 0 (0 = tensor_parallel)")
        check_count("expert_tensor_parallel", self.expert_tensor_parallel, MAX_TENSOR_PARALLEL, minimum=None)
        require(self.expert_parallel > 1 or self.expert_tensor_parallel in (0, self.tensor_parallel),
                "expert_tensor_parallel", self.expert_tensor_parallel,
                f"differs from tensor_parallel={self.tensor_parallel} only with expert parallelism; give --ep too "
                "or leave --etp out")
        require(self.moe_dispatcher in MOE_DISPATCHERS, "moe_dispatcher", self.moe_dispatcher,
                f"must be one of {', '.join(MOE_DISPATCHERS)}")
        require(isinstance(self.sequence_parallel, bool), "sequence_parallel", self.sequence_parallel,
                "must be true or false")
        require(self.dtype in DTYPE_BYTES, "dtype", self.dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
        require(self.recompute in RECOMPUTE_MODES, "recompute", self.recompute,
                f"must be one of {', '.join(RECOMPUTE_MODES)}")
        for field_name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
            _finite(getattr(self, field_name), field_name)

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def fp8(self) -> bool:
        """Matmuls on the FP8 tensor cores."""
        return self.dtype in FP8_DTYPES

    @property
    def expert_tensor(self) -> int:
        """Tensor-parallel ranks of each expert (ETP)."""
        return self.expert_tensor_parallel or self.tensor_parallel

    @property
    def static_bytes_per_param(self) -> float:
        """Parameters + gradients + this rank's share of the optimizer state, bytes per
        parameter."""
        if self.optimizer_shards == 1:
            return self.weight_bytes + self.grad_bytes + self.optimizer_bytes
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes / self.optimizer_shards
