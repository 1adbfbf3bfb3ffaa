"""Built-in model shapes, by name.

GPT-3 sizes follow Brown et al. (2020) as Megatron configures them (vocabulary padded to
51200, learned positions, biases, dropout); Llama-3 and Mixtral follow their published
Hugging Face configs; the mixture-of-experts presets cite theirs beside them. OPT follows Zhang et al. (2022), Table 1, as the facebook/opt-* Hugging
Face configs give it (learned positions, 2048 of them plus OPT's offset of 2 that holds no
model position, ReLU MLP of 4 h, biases, vocabulary 50272, tied embeddings). ``tiny`` and ``small`` are CPU-sized models for real runs and tests.
"""

from __future__ import annotations

from types import MappingProxyType

from pipesched.errors import PipeschedError, shorten, suggest
from pipesched.model.spec import ModelSpec


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
        ffn_hidden_size=4 * hidden, vocab_size=51200, tied_embeddings=True,
        position_embeddings=2048, context_length=2048, bias=True, dropout=True,
    )


def _opt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
        ffn_hidden_size=4 * hidden, vocab_size=50272, tied_embeddings=True,
        position_embeddings=2048, context_length=2048, bias=True,
    )


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=8,
        ffn_hidden_size=ffn, vocab_size=128256, gated_mlp=True, context_length=8192,
    )


MODELS: MappingProxyType[str, ModelSpec] = MappingProxyType({
    spec.name: spec
    for spec in (
        # CPU-sized: 8 blocks, h=64, 4 heads, f=256, V=256 (about 0.4 M parameters)
        ModelSpec(name="tiny", num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=4,
                  ffn_hidden_size=256, vocab_size=256, context_length=1024),
        # CPU-sized: 8 blocks, h=256, 8 heads, f=1024, V=2048 (about 7.3 M parameters)
        ModelSpec(name="small", num_layers=8, hidden_size=256, num_heads=8, num_kv_heads=8,
                  ffn_hidden_size=1024, vocab_size=2048, context_length=1024),
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5120, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        _opt("opt-1.3b", 24, 2048, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _opt("opt-30b", 48, 7168, 56),
        _opt("opt-66b", 64, 9216, 72),
        _opt("opt-175b", 96, 12288, 96),
        _llama3("llama3-8b", 32, 4096, 32, 14336),
        _llama3("llama3-70b", 80, 8192, 64, 28672),
        _llama3("llama3-405b", 126, 16384, 128, 53248),
        ModelSpec(name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                  ffn_hidden_size=14336, vocab_size=32000, num_experts=8, experts_per_token=2,
                  gated_mlp=True, context_length=32768),
        # mistralai/Mixtral-8x22B-v0.1 config.json (hidden_size 6144, intermediate_size 16384,
        # 56 layers, 48 heads / 8 kv, 8 local experts top-2, vocab 32768 in the v0.3 tokenizer):
        # 141B parameters, 39B active (Mistral's announcement)
        ModelSpec(name="mixtral-8x22b", num_layers=56, hidden_size=6144, num_heads=48, num_kv_heads=8,
                  ffn_hidden_size=16384, vocab_size=32768, num_experts=8, experts_per_token=2,
                  gated_mlp=True, context_length=65536),
        # deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, intermediate_size 18432 (the
        # first_k_dense_replace = 3 dense blocks), moe_intermediate_size 2048, 61 layers, 128
        # heads, n_shared_experts 1, n_routed_experts 256, num_experts_per_tok 8, q_lora_rank
        # 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
        # vocab 129280, untied head; 671B parameters, 37B active (the technical report; the
        # multi-token-prediction module's further 14B are not counted); node-limited routing:
        # a token's experts on at most 4 nodes (the report's M = 4)
        ModelSpec(name="deepseek-v3", num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128,
                  ffn_hidden_size=18432, vocab_size=129280, num_experts=256, experts_per_token=8,
                  gated_mlp=True, context_length=163840, moe_ffn_hidden_size=2048, num_shared_experts=1,
                  first_dense_layers=3, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                  qk_nope_head_dim=128, v_head_dim=128, routed_node_limit=4),
        # Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536, 94
        # layers, 64 heads / 4 kv heads of head_dim 128, 128 experts top-8 in every block, vocab
        # 151936, untied head, max_position_embeddings 40960: 235B parameters, 22B active
        ModelSpec(name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4,
                  ffn_hidden_size=12288, vocab_size=151936, num_experts=128, experts_per_token=8,
                  gated_mlp=True, head_dim=128, context_length=40960, moe_ffn_hidden_size=1536),
    )
})


def model_preset(name: str) -> ModelSpec:
    """A built-in model by name; the error lists the known names.

    >>> model_preset("tiny").hidden_size
    64
    """
    try:
        return MODELS[name]
    except KeyError:
        raise PipeschedError(f"model={shorten(name)!r}: unknown model preset{suggest(name, MODELS)}; known presets: "
                             f"{', '.join(MODELS)}; or give a config.json, YAML or CSV file") from None
