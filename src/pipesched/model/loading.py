"""Models from presets, Hugging Face ``config.json`` files, and model files (YAML or CSV).

config.json (Hugging Face): ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``intermediate_size`` and ``vocab_size`` are required (GPT-2 spellings ``n_layer``, ``n_embd``,
``n_head``, ``n_inner`` are accepted); ``num_key_value_heads``, ``head_dim``,
``tie_word_embeddings`` and the mixture-of-experts fields ``num_local_experts`` (or
``num_experts``, ``n_routed_experts``), ``num_experts_per_tok``, ``moe_intermediate_size``,
``n_shared_experts`` (or Qwen's ``shared_expert_intermediate_size``) and
``first_k_dense_replace``, and DeepSeek's latent attention (``q_lora_rank``,
``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``) are optional.
A SiLU/SwiGLU activation means a gated MLP.

YAML model file, either a shape (the ModelSpec field names)::

    name: my-model
    num_layers: 32
    hidden_size: 4096
    num_heads: 32
    num_kv_heads: 8
    ffn_hidden_size: 14336
    vocab_size: 128256
    gated_mlp: true

or measured layers, in order, with the columns of the CSV below::

    name: my-profiled-model
    measured_on: h100-sxm     # optional: scale the times to other devices by peak FLOP/s
    layers:
      - {name: embedding, kind: E, forward_s: 0.0002, backward_input_s: 0, ...}

CSV file of measured layers, one row per layer in order (what the profiler writes)::

    name,forward_s,backward_input_s,backward_weight_s,activation_bytes,params,output_bytes

with optional columns ``kind`` (E, t, m, L), ``flops`` and ``weight_input_bytes``. Without a
kind, a name containing ``embed`` is the embedding, one containing ``head``, ``loss`` or
``lm_`` is the loss layer, and every other layer is a transformer block.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from pipesched.errors import PipeschedError, invalid, require, shorten
from pipesched.io.files import names_a_path, read_text
from pipesched.io.json_text import load_json
from pipesched.io.yaml_text import load_yaml
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_LAYERS,
    MAX_SECONDS,
    check_amount,
    check_name,
    parse_float,
)
from pipesched.model.devices import load_device
from pipesched.model.presets import MODELS, model_preset
from pipesched.model.spec import EMBEDDING, LOSS, TRANSFORMER, LayerCost, ModelSpec

# The measured-layer columns, in file order (the profiler writes exactly these).
LAYER_COLUMNS = ("name", "forward_s", "backward_input_s", "backward_weight_s",
                 "activation_bytes", "params", "output_bytes")
_OPTIONAL_LAYER_COLUMNS = ("kind", "flops", "weight_input_bytes")

# config.json field -> accepted spellings (first is the Hugging Face name)
_HF_REQUIRED = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}
_GATED_ACTIVATIONS = {"silu", "swiglu", "swish"}
# model types with learned absolute position embeddings
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode", "opt", "gpt_neo", "gptj"}


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or a config.json / YAML / CSV file (or a folder holding a
    config.json).

    >>> load_model("tiny").num_layers
    8
    """
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file() and name_or_path not in MODELS:
        path = path / "config.json"  # a Hugging Face model folder
    suffix = path.suffix.lower()
    if suffix in (".json", ".yaml", ".yml", ".csv") or names_a_path(str(path), MODELS):
        text = read_text(path, "model")
        if suffix == ".csv":
            return parse_layer_csv(text, name=path.stem)
        if suffix == ".json":
            folder = path.resolve().parent.name
            return parse_hf_config(_json(text, path), name=folder if path.stem == "config" and folder else path.stem)
        return parse_model_yaml(text, source=str(path))
    return model_preset(name_or_path)


def _json(text: str, path: Path) -> dict:
    data = load_json(text, field="model", source=str(path))
    require(isinstance(data, dict), "model", path, "config.json must hold a JSON object")
    return data


def _first(config: Mapping, names: tuple[str, ...]) -> object | None:
    for key in names:
        if config.get(key) is not None:
            return config[key]
    return None


def _int_field(config: Mapping, names: tuple[str, ...], *, default: int | None = None) -> int:
    value = _first(config, names)
    if value is None:
        if default is not None:
            return default
        aliases = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
        raise PipeschedError(f"config.json: missing field {names[0]}{aliases}; add it to the config")
    require(isinstance(value, int) and not isinstance(value, bool), names[0], value, "must be an integer")
    return value


def _text_field(config: Mapping, names: tuple[str, ...]) -> str:
    value = _first(config, names)
    if value is None:
        return ""
    require(isinstance(value, str), names[0], value, "must be text")
    return value


def parse_hf_config(config: Mapping, *, name: str = "config") -> ModelSpec:
    """A ModelSpec from a Hugging Face config dictionary (see the module docstring)."""
    sizes = {field: _int_field(config, names) for field, names in _HF_REQUIRED.items()}
    hidden = sizes["hidden_size"]
    ffn = _int_field(config, ("intermediate_size", "n_inner", "ffn_dim"),
                     default=4 * hidden if "n_embd" in config else None)
    experts = _int_field(config, ("num_local_experts", "num_experts", "n_routed_experts"), default=1)
    expert_ffn = _int_field(config, ("moe_intermediate_size",), default=0) if experts > 1 else 0
    activation = _text_field(config, ("hidden_act", "activation_function")).lower()
    model_type = _text_field(config, ("model_type",)).lower()
    positions = _int_field(config, ("max_position_embeddings", "n_positions"), default=0)
    source_name = _text_field(config, ("_name_or_path",)).rstrip("/").split("/")[-1]
    tied = config.get("tie_word_embeddings", model_type in _LEARNED_POSITIONS)
    require(isinstance(tied, bool), "tie_word_embeddings", tied, "must be true or false")
    return ModelSpec(
        name=source_name or name or model_type,
        num_layers=sizes["num_layers"],
        hidden_size=hidden,
        num_heads=sizes["num_heads"],
        num_kv_heads=_int_field(config, ("num_key_value_heads", "num_kv_heads"), default=sizes["num_heads"]),
        ffn_hidden_size=ffn,
        vocab_size=sizes["vocab_size"],
        num_experts=experts,
        experts_per_token=_int_field(config, ("num_experts_per_tok", "moe_topk"), default=1) if experts > 1 else 1,
        gated_mlp=activation in _GATED_ACTIVATIONS,
        head_dim=_int_field(config, ("head_dim",), default=0),
        tied_embeddings=tied,
        position_embeddings=positions if model_type in _LEARNED_POSITIONS else 0,
        bias=model_type in _LEARNED_POSITIONS,
        **_experts_and_latents(config, experts, expert_ffn),
    )


def _experts_and_latents(config: Mapping, experts: int, expert_ffn: int) -> dict[str, int]:
    """The mixture-of-experts and latent-attention fields of a Hugging Face config
    (DeepSeek-V2/V3: ``moe_intermediate_size``, ``n_shared_experts``,
    ``first_k_dense_replace``, ``q_lora_rank``, ``kv_lora_rank`` and the head sizes; Qwen-MoE:
    ``shared_expert_intermediate_size``, as a number of experts' widths)."""
    fields = {"moe_ffn_hidden_size": expert_ffn}
    if experts > 1:
        shared = _int_field(config, ("n_shared_experts",), default=0)
        shared_width = _int_field(config, ("shared_expert_intermediate_size",), default=0)
        if not shared and shared_width and expert_ffn and shared_width % expert_ffn == 0:
            shared = shared_width // expert_ffn
        fields |= {"num_shared_experts": shared,
                   "first_dense_layers": _int_field(config, ("first_k_dense_replace",), default=0)}
    if _first(config, ("kv_lora_rank",)) is not None:
        fields |= {name: _int_field(config, (name,), default=0)
                   for name in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    return fields


def parse_model_yaml(text: str, *, source: str = "model") -> ModelSpec:
    """A ModelSpec from a YAML shape or measured-layer file (see the module docstring)."""
    data = load_yaml(text, field="model", source=source)
    require(isinstance(data, dict), "model", source, "must be a YAML mapping (a model shape or a layers list)")
    require(all(isinstance(key, str) for key in data), "model", source, "keys must be field names")
    name = check_name("model.name", data.get("name", Path(source).stem or "model"))
    if "layers" in data:
        rows = data["layers"]
        require(isinstance(rows, list) and len(rows) > 0, "layers", rows, "must be a non-empty list of layer rows")
        require(len(rows) <= MAX_LAYERS, "layers", f"{len(rows):,} rows", f"over the limit of {MAX_LAYERS:,} layers")
        unknown = sorted(set(data) - {"name", "layers", "measured_on"})
        require(not unknown, f"model.{unknown[0] if unknown else ''}", "", "unknown key; use name, measured_on, layers")
        measured_on = data.get("measured_on", "")
        require(isinstance(measured_on, str), "model.measured_on", measured_on, "must be a device preset name")
        layers = [_layer_row(row, f"layers[{i}]") for i, row in enumerate(rows)]
        return _measured_model(name, layers, measured_on=measured_on)
    known = {f.name for f in fields(ModelSpec)} - {"measured", "measured_on"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise invalid(f"model.{unknown[0]}", data[unknown[0]], f"unknown key; known keys: {', '.join(sorted(known))}")
    for required in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size"):
        require(required in data, "model", source, f"is missing field {required}; add it")
    shape = dict(data, name=name)
    shape.setdefault("num_kv_heads", shape["num_heads"])
    return ModelSpec(**shape)


def parse_layer_csv(text: str, *, name: str = "measured") -> ModelSpec:
    """A measured model from the layer CSV (see the module docstring)."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = reader.fieldnames or []
        missing = [column for column in LAYER_COLUMNS if column not in header]
        require(not missing, "csv column", missing[0] if missing else "",
                f"is missing; the header must hold {','.join(LAYER_COLUMNS)}")
        unknown = [column for column in header if column not in LAYER_COLUMNS + _OPTIONAL_LAYER_COLUMNS]
        require(not unknown, "csv column", unknown[0] if unknown else "",
                f"unknown column; allowed: {','.join(LAYER_COLUMNS + _OPTIONAL_LAYER_COLUMNS)}")
        layers = []
        for line, row in enumerate(reader, start=2):
            require(len(layers) < MAX_LAYERS, "csv", name, f"has more than {MAX_LAYERS:,} layer rows, over the limit")
            if None in row:  # DictReader keeps the surplus cells under None
                raise invalid(f"row {line}", ",".join(map(str, row[None])),
                              "more fields than the header; give one value per column")
            layers.append(_layer_row({k: v for k, v in row.items() if v not in (None, "")}, f"row {line}"))
    except csv.Error as exc:
        raise PipeschedError(f"csv={name}: not a CSV file ({shorten(str(exc))}); fix the file") from None
    require(len(layers) > 0, "csv", name, "has no layer rows")
    return _measured_model(name, layers)


def _layer_row(row: object, where: str) -> LayerCost:
    require(isinstance(row, dict), where, row, "must be a mapping of the layer columns")
    missing = [column for column in LAYER_COLUMNS if column not in row]
    require(not missing, f"{where}.{missing[0] if missing else ''}", "missing", "add the column")
    unknown = sorted(str(key) for key in row if key not in LAYER_COLUMNS + _OPTIONAL_LAYER_COLUMNS)
    require(not unknown, f"{where}.{unknown[0] if unknown else ''}", "", "unknown column; allowed: "
            f"{','.join(LAYER_COLUMNS + _OPTIONAL_LAYER_COLUMNS)}")
    values: dict[str, object] = {"name": check_name(f"{where}.name", row["name"])}
    for column in (*LAYER_COLUMNS[1:], "flops", "weight_input_bytes"):
        if column in row:
            values[column] = _layer_number(row[column], f"{where}: {values['name']}.{column}",
                                           MAX_SECONDS if column.endswith("_s") else MAX_AMOUNT)
    if "kind" in row:
        require(isinstance(row["kind"], str), f"{where}.kind", row["kind"], "must be one of E, t, m, L")
    values["kind"] = row["kind"] if "kind" in row else _guess_kind(values["name"])
    return LayerCost(**values)


def _layer_number(value: object, field: str, limit: float) -> float:
    """A measured number: a YAML number, or CSV text holding one."""
    if isinstance(value, str):
        try:
            value = parse_float(field, value)
        except PipeschedError:
            raise invalid(field, value, "must be a number") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(field, value, "must be a number")
    return check_amount(field, value, limit=limit)


def _guess_kind(name: str) -> str:
    lowered = name.lower()
    if "embed" in lowered:
        return EMBEDDING
    if any(word in lowered for word in ("head", "loss", "lm_")):
        return LOSS
    return TRANSFORMER


def _measured_model(name: str, layers: list[LayerCost], *, measured_on: str = "") -> ModelSpec:
    if measured_on:
        load_device(measured_on)
    blocks = sum(1 for layer in layers if layer.kind == TRANSFORMER)
    return ModelSpec(name=name, num_layers=blocks, hidden_size=0, num_heads=0, num_kv_heads=0,
                     ffn_hidden_size=0, vocab_size=0, measured=tuple(layers), measured_on=measured_on)
