"""Presets, Hugging Face config.json, YAML/CSV model files and cluster files."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from model_helpers import one_device
from pipesched.errors import PipeschedError
from pipesched.model import (
    DEVICES,
    LAYER_COLUMNS,
    MODELS,
    ModelSpec,
    cluster_presets,
    layer_costs,
    load_cluster,
    load_device,
    load_model,
    parse_cluster,
)

# Published parameter counts (billions); GPT-3 with Megatron's padded 51200 vocabulary.
PUBLISHED_PARAMS = {
    "gpt3-1.3b": 1.3, "gpt3-6.7b": 6.7, "gpt3-13b": 13.0, "gpt3-175b": 175.0,
    "llama3-8b": 8.03, "llama3-70b": 70.6, "llama3-405b": 405.9, "mixtral-8x7b": 46.7,
}


def model_params(model: ModelSpec) -> float:
    costs = layer_costs(model, load_device("h100-sxm"), one_device(seq_len=128))
    total = sum(layer.params for layer in costs)
    if model.tied_embeddings:
        total -= model.vocab_size * model.hidden_size  # the head's copy of the shared matrix
    return total


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_preset_loads_and_costs(name):
    model = load_model(name)
    assert model.name == name
    costs = layer_costs(model, load_device("cpu"), one_device(seq_len=256))
    assert len(costs) == model.num_layers + 2
    assert all(layer.forward_s > 0 and layer.backward_input_s + layer.backward_weight_s > 0 for layer in costs)


@pytest.mark.parametrize(("name", "billions"), sorted(PUBLISHED_PARAMS.items()))
def test_model_presets_have_their_published_size(name, billions):
    assert math.isclose(model_params(load_model(name)) / 1e9, billions, rel_tol=0.03)


def test_cpu_models_are_small():
    assert model_params(load_model("tiny")) < 1e6
    assert model_params(load_model("small")) < 2e7
    tiny = load_model("tiny")
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.ffn_hidden_size, tiny.vocab_size) == (8, 64, 4, 256, 256)


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_device_preset_loads(name):
    device = load_device(name)
    assert device.peak_flops > 0 and device.memory_bytes > 0 and device.memory_bandwidth > 0


@pytest.mark.parametrize("name", cluster_presets())
def test_every_cluster_preset_loads(name):
    cluster = load_cluster(name)
    assert cluster.num_devices >= 8
    assert cluster.intra_node.bandwidth > cluster.inter_node.bandwidth


def test_cluster_presets_include_the_common_ones():
    assert {"4x8-h100", "1x8-h100", "2x8-a100", "mixed-h100-a100"} <= set(cluster_presets())
    big = load_cluster("4x8-h100")
    assert big.num_devices == 32 and big.node_of[7] == 0 and big.node_of[8] == 1
    assert big.intra_node.bandwidth == 450e9 and big.inter_node.bandwidth == 50e9
    mixed = load_cluster("mixed-h100-a100")
    assert {d.name for d in mixed.devices} == {"h100-sxm", "a100-80gb"} and not mixed.nic_per_device


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(PipeschedError, match=r"known presets: tiny, small, gpt3-1\.3b"):
        load_model("gpt5")
    with pytest.raises(PipeschedError, match="h100-sxm"):
        load_device("tpu")
    with pytest.raises(PipeschedError, match="4x8-h100"):
        load_cluster("huge")


LLAMA_CONFIG = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


def write_json(path, data) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_hf_config_matches_the_preset(tmp_path):
    model = load_model(write_json(tmp_path / "config.json", LLAMA_CONFIG))
    preset = load_model("llama3-8b")
    assert model.name == "Meta-Llama-3-8B"
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                  "gated_mlp", "tied_embeddings", "position_embeddings", "num_experts"):
        assert getattr(model, field) == getattr(preset, field), field


def test_hf_moe_and_gpt2_configs(tmp_path):
    mixtral = dict(LLAMA_CONFIG, model_type="mixtral", vocab_size=32000, num_local_experts=8, num_experts_per_tok=2)
    model = load_model(write_json(tmp_path / "mixtral.json", mixtral))
    assert (model.num_experts, model.experts_per_token, model.ffn_hidden_size) == (8, 2, 14336)
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
            "vocab_size": 50257, "activation_function": "gelu_new"}
    model = load_model(write_json(tmp_path / "gpt2.json", gpt2))
    assert (model.num_layers, model.ffn_hidden_size, model.position_embeddings) == (12, 3072, 1024)
    assert model.tied_embeddings and not model.gated_mlp
    assert math.isclose(model_params(model) / 1e6, 124.4, rel_tol=0.01)  # GPT-2 small


def test_hf_config_missing_field_is_named(tmp_path):
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"}
    with pytest.raises(PipeschedError, match="missing field intermediate_size"):
        load_model(write_json(tmp_path / "config.json", config))


def test_bad_shapes_are_rejected(tmp_path):
    with pytest.raises(PipeschedError, match="num_heads=5: must divide hidden_size=64"):
        load_model(write_json(tmp_path / "a.json", dict(LLAMA_CONFIG, hidden_size=64, num_attention_heads=5,
                                                         num_key_value_heads=5)))
    with pytest.raises(PipeschedError, match="hidden_size=0: must be a positive integer"):
        load_model(write_json(tmp_path / "b.json", dict(LLAMA_CONFIG, hidden_size=0)))
    with pytest.raises(PipeschedError, match="num_kv_heads=3: must divide num_heads=32"):
        load_model(write_json(tmp_path / "c.json", dict(LLAMA_CONFIG, num_key_value_heads=3)))
    with pytest.raises(PipeschedError, match="micro_batch_size=0"):
        one_device(micro_batch_size=0)
    with pytest.raises(PipeschedError, match="recompute=some"):
        one_device(recompute="some")
    with pytest.raises(PipeschedError, match="tensor_parallel=3: must divide num_heads=32"):
        layer_costs(load_model("llama3-8b"), load_device("h100-sxm"), one_device(tensor_parallel=3))


def test_yaml_model_shape(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("name: mine\nnum_layers: 4\nhidden_size: 128\nnum_heads: 4\nffn_hidden_size: 512\n"
                    "vocab_size: 1000\ngated_mlp: true\n", encoding="utf-8")
    model = load_model(str(path))
    assert (model.name, model.num_layers, model.num_kv_heads, model.gated_mlp) == ("mine", 4, 4, True)
    path.write_text("name: mine\nnum_layers: 4\nhidden_size: 128\nheads: 4\n", encoding="utf-8")
    with pytest.raises(PipeschedError, match=r"model\.heads"):
        load_model(str(path))


def costs_csv(model: ModelSpec) -> str:
    costs = layer_costs(model, load_device("cpu"), one_device(seq_len=64))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=LAYER_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for layer in costs:
        writer.writerow({column: getattr(layer, column) for column in LAYER_COLUMNS})
    return out.getvalue()


def test_measured_csv_round_trip(tmp_path):
    path = tmp_path / "tiny_profile.csv"
    path.write_text(costs_csv(load_model("tiny")), encoding="utf-8")
    measured = load_model(str(path))
    assert measured.name == "tiny_profile"
    assert measured.layer_kinds == ("E",) + ("t",) * 8 + ("L",)
    original = layer_costs(load_model("tiny"), load_device("cpu"), one_device(seq_len=64))
    again = layer_costs(measured, load_device("h100-sxm"), one_device())  # used as given
    assert [(x.name, x.forward_s, x.params) for x in again] == [(x.name, x.forward_s, x.params) for x in original]


def test_measured_yaml_scales_to_other_devices(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(
        "name: profiled\nmeasured_on: a100-80gb\nlayers:\n"
        "  - {name: embed, forward_s: 0.001, backward_input_s: 0, backward_weight_s: 0.001,"
        " activation_bytes: 10, params: 100, output_bytes: 8}\n"
        "  - {name: block, forward_s: 0.01, backward_input_s: 0.01, backward_weight_s: 0.01,"
        " activation_bytes: 10, params: 100, output_bytes: 8}\n"
        "  - {name: lm_head, kind: L, forward_s: 0.002, backward_input_s: 0.002, backward_weight_s: 0.002,"
        " activation_bytes: 10, params: 100, output_bytes: 0}\n", encoding="utf-8")
    model = load_model(str(path))
    assert model.layer_kinds == ("E", "t", "L")
    h100 = layer_costs(model, load_device("h100-sxm"), one_device())
    assert math.isclose(h100[1].forward_s, 0.01 * 312 / 989)


def test_measured_csv_errors(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("name,forward_s\nx,1\n", encoding="utf-8")
    with pytest.raises(PipeschedError, match="csv column=backward_input_s: is missing"):
        load_model(str(path))
    path.write_text(",".join(LAYER_COLUMNS) + "\nx,1,1,1,1,1,oops\n", encoding="utf-8")
    with pytest.raises(PipeschedError, match="output_bytes=oops: must be a number"):
        load_model(str(path))
    path.write_text(",".join(LAYER_COLUMNS) + "\nx,1,-1,1,1,1,1\n", encoding="utf-8")
    with pytest.raises(PipeschedError, match=r"x\.backward_input_s=-1\.0"):
        load_model(str(path))


def test_cluster_yaml_with_mixed_nodes_and_custom_device():
    cluster = parse_cluster(
        "name: lab\n"
        "nodes:\n"
        "  - devices: [h100-sxm, {preset: a100-80gb, matmul_efficiency: 0.6}]\n"
        "  - count: 2\n"
        "    devices_per_node: 2\n"
        "    device: {name: my-gpu, peak_flops: 500 TFLOP/s, memory: 96 GiB, memory_bandwidth: 4 TB/s}\n"
        "intra_node: {bandwidth: 100 GB/s, latency: 2 us}\n"
        "inter_node: {bandwidth: 200 Gb/s, latency: 10 us}\n"
        "nic_per_device: false\n")
    assert [d.name for d in cluster.devices] == ["h100-sxm", "a100-80gb", "my-gpu", "my-gpu", "my-gpu", "my-gpu"]
    assert cluster.node_of == (0, 0, 1, 1, 2, 2)
    assert cluster.devices[1].matmul_efficiency == 0.6
    assert cluster.devices[2].memory_bytes == 96 * 2**30 and cluster.devices[2].peak_flops == 500e12
    assert cluster.inter_node.bandwidth == 25e9 and cluster.intra_node.latency == 2e-6
    assert not cluster.nic_per_device


@pytest.mark.parametrize(("text", "message"), [
    ("nodes: []\nintra_node: {bandwidth: 1}\ninter_node: {bandwidth: 1}\n", "nodes=.*non-empty"),
    ("nodes: [{device: h100-sxm}]\nintra_node: {bandwidth: 1}\n", "missing 'inter_node'"),
    ("nodes: [{device: h100-sxm}]\nintra_node: {bandwidth: 5 parsecs}\ninter_node: {bandwidth: 1}\n",
     "unknown bandwidth unit"),
    ("nodes: [{device: tpu}]\nintra_node: {bandwidth: 1}\ninter_node: {bandwidth: 1}\n", "unknown device preset"),
    ("nodes: [{device: h100-sxm, gpus: 8}]\nintra_node: {bandwidth: 1}\ninter_node: {bandwidth: 1}\n",
     r"nodes\[0\].gpus"),
    ("nodes: [\n", "not valid YAML"),
])
def test_cluster_yaml_errors(text, message):
    with pytest.raises(PipeschedError, match=message):
        parse_cluster(text)


def test_example_cluster_file_matches_the_preset():
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "cluster_4x8_h100.yaml"
    assert load_cluster(str(example)) == load_cluster("4x8-h100")


def test_example_mixed_cluster_file_loads():
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "cluster_mixed_nodes.yaml"
    cluster = load_cluster(str(example))
    assert cluster.num_devices == 12 and cluster.node_of == (0,) * 4 + (1,) * 4 + (2,) * 4
    assert [d.name for d in cluster.devices[:4]] == ["h100-sxm", "h100-sxm", "a100-80gb", "a100-80gb"]
    assert cluster.devices[2].matmul_efficiency == 0.65
    assert cluster.devices[3].matmul_efficiency == load_device("a100-80gb").matmul_efficiency
    assert cluster.devices[4].memory_bandwidth == 4e12 and cluster.inter_node.bandwidth == 25e9
