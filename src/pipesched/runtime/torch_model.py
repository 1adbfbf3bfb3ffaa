"""A real transformer stack in PyTorch, built layer by layer from a ModelSpec.

The layers are the cost model's: ``embedding`` (token + optional learned positions),
``layer.0 .. layer.{L-1}`` (pre-norm attention + MLP, dense, gated or mixture-of-experts) and
``head`` (final norm + LM head; the loss is applied to its logits). Every layer is
initialized from its own seed, so any process can build any subset of layers and get the
same weights as a single-process model: that is what makes a pipelined step comparable
with the reference step number for number.

Left out on purpose (they do not change the work of a step or its pipeline traffic):
rotary position rotation, dropout (its masks would make the numbers random) and tying the
head to the embedding (the head keeps its own copy, as a pipeline's last stage does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipesched.errors import require
from pipesched.model.spec import ModelSpec
from pipesched.runtime.torch_import import require_torch

torch = require_torch()
nn = torch.nn
functional = torch.nn.functional

# Runtime dtypes by name; the CLI's --dtype takes these names.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
INIT_STD = 0.02  # normal init of every weight matrix (GPT-2 / Megatron default)


def torch_dtype(name: str) -> torch.dtype:
    require(name in DTYPES, "dtype", name, f"must be one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _norm(model: ModelSpec) -> nn.Module:
    # GPT-style models (biases) use LayerNorm; Llama-style models RMSNorm
    return nn.LayerNorm(model.hidden_size) if model.bias else nn.RMSNorm(model.hidden_size)


class Embedding(nn.Module):
    """Token ids [b, s] (int64) -> hidden states [b, s, h]."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.tokens = nn.Embedding(model.vocab_size, model.hidden_size)
        self.positions = nn.Embedding(model.position_embeddings, model.hidden_size) if model.position_embeddings else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(tokens)
        if self.positions is not None:
            seq = min(tokens.shape[1], self.positions.num_embeddings)
            hidden = hidden[:, :seq] + self.positions(torch.arange(seq, device=tokens.device))
        return hidden


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads: [b, s, h] -> [b, s, h]."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = model.num_heads, model.num_kv_heads, model.kv_channels
        self.query = nn.Linear(model.hidden_size, self.heads * self.head_dim, bias=model.bias)
        self.key_value = nn.Linear(model.hidden_size, 2 * self.kv_heads * self.head_dim, bias=model.bias)
        self.out = nn.Linear(self.heads * self.head_dim, model.hidden_size, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.query(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.key_value(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [b, kv_heads, s, d]
        if self.kv_heads < self.heads:
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """[.., h] -> [.., h]: GELU MLP, or SwiGLU when gated (three matrices)."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.gated = model.gated_mlp
        width = 2 * model.ffn_hidden_size if self.gated else model.ffn_hidden_size
        self.up = nn.Linear(model.hidden_size, width, bias=model.bias)
        self.down = nn.Linear(model.ffn_hidden_size, model.hidden_size, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(functional.silu(gate) * up)
        return self.down(functional.gelu(self.up(x)))


class MixtureOfExperts(nn.Module):
    """Top-k routed experts: each token goes through ``experts_per_token`` MLPs, weighted by
    its renormalized router probabilities."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.top_k = model.experts_per_token
        self.router = nn.Linear(model.hidden_size, model.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(model) for _ in range(model.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [tokens, h]
        weights, chosen = torch.softmax(self.router(flat), dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            rows, slot = (chosen == index).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.view_as(x)


class Block(nn.Module):
    """One transformer layer: x + attn(norm(x)), then + mlp(norm(.)). [b, s, h] -> [b, s, h]."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = _norm(model)
        self.attention = Attention(model)
        self.mlp_norm = _norm(model)
        self.mlp = MixtureOfExperts(model) if model.is_moe else MLP(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Head(nn.Module):
    """Final norm + LM head: [b, s, h] -> logits [b, s, V]."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(model)
        self.lm_head = nn.Linear(model.hidden_size, model.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def check_buildable(model: ModelSpec) -> None:
    """A measured model (a profile file) has no shape to build."""
    require(not model.measured, "model", model.name,
            "has measured layer costs but no shape; real runs need a shape (a preset, YAML shape or config.json)")


def _init_weights(module: nn.Module) -> None:
    for child in module.modules():
        if isinstance(child, nn.Linear | nn.Embedding):
            nn.init.normal_(child.weight, mean=0.0, std=INIT_STD)
            if getattr(child, "bias", None) is not None:
                nn.init.zeros_(child.bias)


def build_layer(model: ModelSpec, index: int, *, seed: int, dtype: torch.dtype, device: str | torch.device,
                init_on_device: bool = False) -> nn.Module:
    """Layer ``index`` of the model (0 = embedding, last = head), initialized from
    ``(seed, index)`` alone.

    The weights are drawn on the CPU, so every rank and device gets the same ones; with
    ``init_on_device`` they are drawn on ``device`` itself (other values, the same
    distribution), which profiling uses: a Llama-3-70B layer takes a CPU thread 15 to 20 s
    to draw and a GPU milliseconds.
    """
    count = model.num_cost_layers
    require(0 <= index < count, "layer", index, f"must be in 0..{count - 1}")
    target = torch.device(device)
    where = target if init_on_device else torch.device("cpu")
    forked = [where.index if where.index is not None else torch.cuda.current_device()] if where.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), where:
        torch.manual_seed(seed * 1_000_003 + index)
        if index == 0:
            layer: nn.Module = Embedding(model)
        elif index == count - 1:
            layer = Head(model)
        else:
            layer = Block(model)
        _init_weights(layer)
    return layer.to(device=target, dtype=dtype)


class StageModule(nn.Module):
    """A contiguous run of layers; parameters are named ``<layer name>.<parameter>``."""

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.names = tuple(names)
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def named_grads(self) -> dict[str, torch.Tensor | None]:
        """Gradient of every parameter, keyed ``<layer name>.<parameter>``."""
        grads = {}
        for name, layer in zip(self.names, self.layers, strict=True):
            for param_name, param in layer.named_parameters():
                grads[f"{name}.{param_name}"] = param.grad
        return grads


def build_stage(model: ModelSpec, layers: range, *, seed: int, dtype: torch.dtype,
                device: str | torch.device, init_on_device: bool = False) -> StageModule:
    """The stage holding layers ``layers`` (indices in model order); ``init_on_device`` as
    in ``build_layer``."""
    check_buildable(model)
    names = model.layer_names
    return StageModule([names[i] for i in layers],
                       [build_layer(model, i, seed=seed, dtype=dtype, device=device, init_on_device=init_on_device)
                        for i in layers])


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one microbatch (computed in float32 or wider)."""
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.float()
    return functional.cross_entropy(flat, targets.reshape(-1))


@dataclass(frozen=True)
class Batch:
    """One iteration's data, split into microbatches: token ids and targets [b, s] each."""

    tokens: tuple[torch.Tensor, ...]
    targets: tuple[torch.Tensor, ...]


def make_batch(model: ModelSpec, *, microbatches: int, micro_batch_size: int, seq_len: int, seed: int,
               device: str | torch.device = "cpu") -> Batch:
    """Random token ids (the same on every rank for the same seed)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (microbatches, micro_batch_size, seq_len)
    tokens = torch.randint(model.vocab_size, shape, generator=generator).to(device)
    targets = torch.randint(model.vocab_size, shape, generator=generator).to(device)
    return Batch(tuple(tokens.unbind(0)), tuple(targets.unbind(0)))


def reference_step(model: ModelSpec, *, microbatches: int, micro_batch_size: int, seq_len: int,
                   dtype: str = "float64", seed: int = 0) -> tuple[float, dict[str, object]]:
    """Loss and gradients of one step of the whole model in one process.

    The loss is the mean of the microbatch losses (every microbatch has the same size, so it
    is also the mean over all tokens); the gradients are those of that mean. Returns the
    loss and ``{parameter name: numpy array}``.
    """
    check_buildable(model)
    stage = build_stage(model, range(model.num_cost_layers), seed=seed, dtype=torch_dtype(dtype), device="cpu")
    batch = make_batch(model, microbatches=microbatches, micro_batch_size=micro_batch_size,
                       seq_len=seq_len, seed=seed)
    total = 0.0
    for tokens, targets in zip(batch.tokens, batch.targets, strict=True):
        loss = lm_loss(stage(tokens), targets)
        (loss / microbatches).backward()
        total += float(loss.detach())
    grads = {name: grad.detach().double().numpy() for name, grad in stage.named_grads().items() if grad is not None}
    return total / microbatches, grads
