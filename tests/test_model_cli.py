"""`pipesched costs` and `pipesched partition` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_helpers import one_device
from pipesched.model import LAYER_COLUMNS, layer_costs, load_device, load_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def run(cli):
    """``run(*argv) -> (exit code, stdout, stderr)`` through the real entry point."""
    def invoke(*argv: str) -> tuple[int, str, str]:
        result = cli(*argv)
        return result.code, result.out, result.err
    return invoke


def test_costs_json_has_the_layer_columns(run):
    code, out, _ = run("costs", "--model", "tiny", "--device", "cpu", "--micro-batch-size", "2",
                       "--seq-len", "128", "-t", "1", "--recompute", "none", "--no-sequence-parallel", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["model"], data["device"], data["seq_len"], data["micro_batch_size"]) == ("tiny", "cpu", 128, 2)
    rows = data["layers"]
    expected = layer_costs(load_model("tiny"), load_device("cpu"), one_device(micro_batch_size=2, seq_len=128))
    assert [row["name"] for row in rows] == [layer.name for layer in expected]
    for row, layer in zip(rows, expected, strict=True):
        assert set(LAYER_COLUMNS) <= set(row)
        assert all(row[column] == getattr(layer, column) for column in LAYER_COLUMNS)


def test_costs_table_options(run):
    code, out, _ = run("costs", "--model", "llama3-70b", "--device", "h100-sxm", "--seq-len", "4096",
                       "--recompute", "selective", "--tensor-parallel", "8", "--matmul-efficiency", "0.5")
    assert code == 0
    assert "llama3-70b on h100-sxm" in out and "t=8 recompute=selective" in out
    assert "layer.79" in out and "head" in out and "total" in out


def test_costs_reads_an_hf_config(run):
    code, out, _ = run("costs", "--model", str(EXAMPLES / "llama3_8b_config.json"), "--device", "h100-sxm",
                       "--json")
    assert code == 0
    assert len(json.loads(out)["layers"]) == 34


def test_partition_table_and_layout(run):
    code, out, _ = run("partition", "--model", "llama3-8b", "--cluster", "4x8-h100", "-p", "4", "-v", "2",
                       "-t", "8", "--seq-len", "4096", "--layout")
    assert code == 0
    assert "8 stages (balanced)" in out and "bottleneck stage" in out
    layout = out.split("layout: ")[1].strip()
    assert layout.startswith("E") and layout.endswith("L") and layout.count("|") >= 1


def test_partition_from_layout_and_json(run):
    code, out, _ = run("partition", "--model", "tiny", "--device", "cpu", "-p", "2",
                       "--partition", "Et*5|t*3L", "--seq-len", "64", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["sizes"] == [6, 4] and plan["layout"] == "Et*5|t*3L" and plan["method"] == "given"
    assert plan["stages"][1]["layers"][-1] == "head"


def test_partition_memory_method_with_a_schedule(run):
    code, out, _ = run("partition", "--model", "llama3-70b", "--cluster", str(EXAMPLES / "cluster_4x8_h100.yaml"),
                       "-p", "4", "-t", "8", "--seq-len", "4096", "--partition", "memory", "--schedule", "1f1b",
                       "-m", "8")
    assert code == 0
    assert "in flight" in out and "peak memory per pipeline rank" in out and "NO" not in out


def one_line_error(code: int, err: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["costs", "--model", "gpt5", "--device", "cpu"], "known presets: tiny, small, gpt3-1.3b"),
    (["costs", "--model", "tiny", "--device", "tpu"], "known presets: a100-40gb"),
    (["costs", "--model", "tiny", "--device", "cpu", "--micro-batch-size", "0"], "micro_batch_size=0"),
    (["costs", "--model", "tiny", "--device", "cpu", "--seq-len", "-5"], "seq_len=-5"),
    (["costs", "--model", "tiny", "--device", "cpu", "--recompute", "most"], "recompute=most"),
    (["costs", "--model", "llama3-8b", "--device", "cpu", "-t", "3"], "tensor_parallel=3: must divide num_heads=32"),
    (["costs", "--model", "tiny", "--device", "cpu", "--matmul-efficiency", "2"], "matmul_efficiency=2.0"),
    (["costs", "--model", "missing/config.json", "--device", "cpu"], "no such file"),
    (["partition", "--model", "tiny", "-p", "2", "--device", "cpu", "--cluster", "1x8-h100"], "give one of --device"),
    (["partition", "--model", "tiny", "--cluster", "huge", "-p", "2"], "known presets: 1x8-h100"),
    (["partition", "--model", "tiny", "--device", "cpu", "-p", "20"], "only 10 layers"),
    (["partition", "--model", "tiny", "--device", "cpu", "-p", "2", "--partition", "memory"], "needs --schedule"),
    (["partition", "--model", "tiny", "--device", "cpu", "-p", "2", "--partition", "Et*4|t*3L"],
     "has 7 't' layers, the model has 8"),
    (["partition", "--model", "llama3-70b", "--device", "h100-sxm", "-p", "4", "--partition", "memory",
      "--schedule", "1f1b", "-m", "8"], "the smallest memory that fits is"),
])
def test_bad_input_gives_one_line_and_exit_2(run, argv, message):
    code, _, err = run(*argv)
    assert message in one_line_error(code, err)


def test_bad_config_files_give_one_line(run, tmp_path):
    config = json.loads((EXAMPLES / "llama3_8b_config.json").read_text(encoding="utf-8"))
    cases = [
        ({k: v for k, v in config.items() if k != "num_attention_heads"}, "missing field num_attention_heads"),
        (dict(config, num_attention_heads=7, num_key_value_heads=7), "num_heads=7: must divide hidden_size=4096"),
        (dict(config, vocab_size=-1), "vocab_size=-1: must be a positive integer"),
    ]
    for index, (data, message) in enumerate(cases):
        path = tmp_path / f"config{index}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        code, _, err = run("costs", "--model", str(path), "--device", "h100-sxm")
        assert message in one_line_error(code, err)


def test_memory_error_states_a_size_that_then_fits(run):
    argv = ["partition", "--model", "llama3-70b", "--cluster", "4x8-h100", "-p", "4", "-t", "8",
            "--seq-len", "4096", "--partition", "memory", "--schedule", "gpipe", "-m", "8"]
    code, _, err = run(*argv, "--memory-limit", "40GiB")
    line = one_line_error(code, err)
    smallest = float(line.split("fits is ")[1].split(" GiB")[0])
    assert smallest > 40
    code, out, _ = run(*argv, "--memory-limit", f"{smallest + 0.01}GiB")
    assert code == 0 and "NO" not in out
