"""A pipeline stage of the decoder served for real: the training runtime's layers
(``torch_model``, the same weights for the same seed) run token by token with a KV cache.

The cache is preallocated per request slot: for each of the stage's blocks, keys and values
``[slots, kv_heads, max_len, head_dim]``. A slot holds one running request's whole context,
so a request admitted with a slot never runs out of cache (``serve_batches``).

One iteration feeds the batch's tokens as one flat sequence ``[T, h]`` through the GEMMs
(token-parallel, as vLLM does); attention goes request by request: a prefill chunk of n
tokens over its c cached ones (causal within the chunk, all of the context before it), a
decode step over its whole cache. The last stage takes each emitting request's last hidden
state through the head and samples greedily.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.model.spec import ModelSpec
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import Block, Embedding, Head, build_stage

torch = require_torch()
functional = torch.nn.functional


@dataclass(frozen=True)
class CacheShape:
    slots: int  # requests that may run at once
    max_len: int  # tokens one request's context may reach (prompt + output)


class ServeStage:
    """Layers ``layers`` of ``model`` with their KV cache, for inference."""

    def __init__(self, model: ModelSpec, layers: range, cache: CacheShape, *, seed: int, dtype, device) -> None:
        self.module = build_stage(model, layers, seed=seed, dtype=dtype, device=device)
        self.module.eval()
        self.device, self.dtype = device, dtype
        blocks = [layer for layer in self.module.layers if isinstance(layer, Block)]
        shape = (cache.slots, model.num_kv_heads, cache.max_len, model.kv_channels)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in blocks]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in blocks]
        self.first = isinstance(self.module.layers[0], Embedding)
        self.last = isinstance(self.module.layers[-1], Head)
        self.hidden_size = model.hidden_size

    @torch.inference_mode()
    def forward(self, inputs, entries, positions=None):
        """One iteration: token ids ``[T]`` (first stage) or hidden states ``[T, h]`` in,
        hidden states ``[T, h]`` out, or on the last stage the sampled token of each
        emitting entry (int64 ``[emitting entries]``). ``entries``: the batch's entry
        table, int64 ``[n, 4]``, a row per request in the order of the flat sequence: its
        cache slot, its tokens cached before, the tokens it feeds, 1 if it makes a token; ``positions``:
        each token's position, for learned position embeddings."""
        rows = entries.tolist()
        x = inputs
        block = 0
        for layer in self.module.layers:
            if isinstance(layer, Embedding):
                x = layer.tokens(inputs)
                if layer.positions is not None:
                    x = x + layer.positions(positions)
            elif isinstance(layer, Block):
                x = x + self._attention(layer, block, layer.attention_norm(x), rows)
                x = x + layer.mlp(layer.mlp_norm(x))
                block += 1
            else:
                return self._sample(layer, x, rows)
        return x

    def _attention(self, block: Block, index: int, x, rows: list[list[int]]):
        attention = block.attention
        heads, kv_heads, d = attention.heads, attention.kv_heads, attention.head_dim
        q = attention.query(x).view(-1, heads, d).transpose(0, 1)  # [heads, T, d]
        k, v = attention.key_value(x).view(-1, 2, kv_heads, d).unbind(1)  # [T, kv_heads, d]
        keys, values = self.keys[index], self.values[index]
        out = []
        start = 0
        for slot, context, count, _ in rows:
            end = context + count
            keys[slot, :, context:end] = k[start:start + count].transpose(0, 1)
            values[slot, :, context:end] = v[start:start + count].transpose(0, 1)
            out.append(_attend(q[:, start:start + count], keys[slot, :, :end], values[slot, :, :end],
                               context, heads // kv_heads))
            start += count
        y = torch.cat(out, dim=1)  # [heads, T, d]
        return attention.out(y.transpose(0, 1).reshape(-1, heads * d))

    def _sample(self, head: Head, x, rows: list[list[int]]):
        ends = []
        start = 0
        for _, _, count, emits in rows:
            start += count
            if emits:
                ends.append(start - 1)
        last = x[torch.tensor(ends, dtype=torch.long, device=x.device)]
        return head(last).argmax(dim=-1)


def _attend(q, k, v, context: int, group: int):
    """Causal attention of a chunk of n queries ``[heads, n, d]`` at positions context ..
    context + n - 1 over keys and values ``[kv_heads, context + n, d]``."""
    if group > 1:
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    n = q.shape[1]
    if n == 1:  # a decode step sees every cached key
        return functional.scaled_dot_product_attention(q, k, v)
    if context == 0:
        return functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    query_at = torch.arange(context, context + n, device=q.device)[:, None]
    mask = torch.arange(context + n, device=q.device)[None, :] <= query_at
    return functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def reference_tokens(model: ModelSpec, prompt, count: int, *, seed: int, dtype):
    """``count`` tokens generated greedily from ``prompt`` (int64 ``[p]``) by the whole
    model in one process without a cache: every step runs the full sequence again (the
    independent statement a cached, pipelined run must match)."""
    stage = build_stage(model, range(model.num_cost_layers), seed=seed, dtype=dtype, device="cpu")
    stage.eval()
    tokens = prompt.clone()
    with torch.inference_mode():
        for _ in range(count):
            logits = stage(tokens[None, :])
            tokens = torch.cat([tokens, logits[0, -1].argmax().reshape(1)])
    return tokens[prompt.shape[0]:]
