"""`pipesched costs --ops`: every kernel of each layer and its collectives, whose times sum
to the layer's costs, at training and at decode sizes."""

from __future__ import annotations

import json

import pytest

from pipesched.model import TrainingSettings, load_device, load_model
from pipesched.model.transformer import layer_ops


def _sums(layer: dict) -> tuple[float, float, float]:
    """A layer's F, I and W from its listed kernels and collectives (I with its recompute)."""
    forward = sum(op["forward_s"] for op in layer["ops"]) + sum(c["forward_s"] for c in layer["collectives"])
    backward = sum(op["backward_input_s"] for op in layer["ops"]) + sum(c["backward_s"] for c in layer["collectives"])
    weight = sum(op["backward_weight_s"] for op in layer["ops"])
    return forward, backward, weight


@pytest.mark.parametrize("sizes", [("-b", "1", "-s", "4096"), ("-b", "32", "-s", "1")])
def test_ops_sum_to_the_layer_costs(cli, sizes):
    args = ("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "2", *sizes, "--json")
    plain = json.loads(cli(*args).out)
    result = cli(*args, "--ops")
    assert result.code == 0, result
    listed = json.loads(result.out)
    assert (listed["model"], listed["device"]) == ("llama3-8b", "h100-sxm")
    assert [layer["name"] for layer in listed["layers"]] == [layer["name"] for layer in plain["layers"]]
    for layer, row in zip(listed["layers"], plain["layers"], strict=True):
        forward, backward, weight = _sums(layer)
        assert forward == pytest.approx(row["forward_s"], rel=1e-12)
        assert backward == pytest.approx(row["backward_input_s"], rel=1e-12)
        assert weight == pytest.approx(row["backward_weight_s"], rel=1e-12, abs=1e-18)
        for op in layer["ops"]:
            assert set(op) >= {"name", "m", "n", "k", "flops", "bytes", "forward_s", "backward_input_s",
                               "backward_weight_s", "bound"}
            assert op["bound"] in ("compute", "memory")
        for collective in layer["collectives"]:
            assert set(collective) == {"name", "bytes", "group", "forward_s", "backward_s", "algorithm", "protocol"}


def test_a_decode_step_is_memory_bound_and_a_long_prefill_compute_bound(cli):
    """At 32 tokens every GEMM of a Llama-8B block reads more bytes than the H100 computes
    FLOPs per byte at its ridge (about 300); at 4096 tokens the big ones compute."""
    def bounds(*sizes: str) -> dict[str, str]:
        out = json.loads(cli("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "1", *sizes,
                             "--ops", "--json").out)
        return {op["name"]: op["bound"] for op in out["layers"][1]["ops"]}

    decode, prefill = bounds("-b", "32", "-s", "1"), bounds("-b", "1", "-s", "4096")
    for gemm in ("qkv", "projection", "mlp up", "mlp down"):
        assert decode[gemm] == "memory" and prefill[gemm] == "compute"
    # the qkv GEMM of 32 tokens: [32, 4096] x [4096, 6144] in bf16, as the shape says
    out = json.loads(cli("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "1", "-b", "32", "-s", "1",
                         "--ops", "--json").out)
    qkv = next(op for op in out["layers"][1]["ops"] if op["name"] == "qkv")
    assert (qkv["m"], qkv["n"], qkv["k"]) == (32, 4096 + 2 * 1024, 4096)
    assert qkv["flops"] == 2 * 32 * 6144 * 4096
    assert qkv["bytes"] == 2 * (32 * 4096 + 4096 * 6144 + 32 * 6144)


def test_recompute_is_counted_in_the_backward():
    """With full recompute, I redoes the layer's forward: the kernels' I, the backward
    collectives and the recompute add up to the layer's I."""
    settings = TrainingSettings(tensor_parallel=2, recompute="full", seq_len=1024)
    for entry in layer_ops(load_model("llama3-8b"), load_device("a100-80gb"), settings):
        listed = sum(op.backward_input_s for op in entry.kernels) + sum(c.backward_s for c in entry.collectives)
        assert listed + entry.cost.recompute_s == pytest.approx(entry.cost.backward_input_s, rel=1e-12)
        if entry.cost.kind == "t":
            assert entry.cost.recompute_s == pytest.approx(entry.cost.forward_s)


def test_the_terminal_lists_distinct_layers_once(cli):
    result = cli("costs", "--model", "tiny", "--device", "h100-sxm", "-s", "128", "-t", "1", "--ops")
    assert result.code == 0, result
    assert "layer.0 ... layer.7 (8 alike)" in result.out
    assert result.out.count("mlp up") == 1 and "flash attention" in result.out


def test_measured_models_have_no_kernels(cli, tmp_path):
    path = tmp_path / "layers.csv"
    path.write_text("name,forward_s,backward_input_s,backward_weight_s,activation_bytes,params,output_bytes\n"
                    "a,0.1,0.1,0.1,1,1,1\nb,0.1,0.1,0.1,1,1,1\n", encoding="utf-8")
    result = cli("costs", "--model", str(path), "--device", "cpu", "-t", "1", "--ops")
    assert result.code == 2 and result.out == ""
    assert "its layers are measured, with no kernels to list" in result.err and "Traceback" not in result.err
