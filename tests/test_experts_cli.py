"""Expert parallelism and FP8 through the commands: --ep and --etp in simulate, costs and
search, results unchanged at --ep 1, and the bad inputs of issue 23 as one error line."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error
from pipesched.search.space import SearchSpace

# a small MoE model file: 4 blocks, 8 experts top-2, h 256
MOE_YAML = """name: small-moe
num_layers: 4
hidden_size: 256
num_heads: 8
num_kv_heads: 8
ffn_hidden_size: 512
vocab_size: 2048
num_experts: 8
experts_per_token: {k}
gated_mlp: true
"""
SMALL = ["-p", "2", "-m", "4", "-s", "256", "--cluster", "1x8-h100"]


@pytest.fixture
def moe_file(tmp_path):
    def write(k: int = 2) -> str:
        path = tmp_path / f"moe-{k}.yaml"
        path.write_text(MOE_YAML.format(k=k), encoding="utf-8")
        return str(path)

    return write


@pytest.mark.slow
def test_dense_results_unchanged_with_ep_1(cli):
    for command in (["simulate", "1f1b", "--model", "llama3-8b", "-t", "4", *SMALL, "--json"],
                    ["costs", "--model", "llama3-8b", "-s", "256", "--json"]):
        plain, with_ep = cli(*command), cli(*command, "--ep", "1")
        assert plain.code == with_ep.code == 0, (plain, with_ep)
        assert json.loads(plain.out) == json.loads(with_ep.out)


def test_expert_parallelism_splits_the_experts_memory(cli, moe_file):
    model = moe_file()
    peaks = {}
    for ep in (1, 4):
        result = cli("simulate", "1f1b", "--model", model, "-t", "1", "--dp", "4", "--ep", str(ep), *SMALL, "--json")
        assert result.code == 0, result
        peaks[ep] = json.loads(result.out)["max_peak_memory_bytes"]
    assert peaks[4] < peaks[1]


def test_costs_lists_the_all_to_alls(cli, moe_file):
    result = cli("costs", "--model", moe_file(), "-t", "1", "--ep", "4", "-s", "256", "--ops", "--json")
    assert result.code == 0, result
    names = {c["name"] for layer in json.loads(result.out)["layers"] for c in layer.get("collectives", [])}
    assert {"dispatch all-to-all", "combine all-to-all", "dispatch gradient all-to-all"} <= names


def test_search_space_takes_ep_where_it_folds():
    space = SearchSpace(model="mixtral-8x7b", cluster="1x8-h100", global_batch=8, schedules=("1f1b",),
                        partitions=("balanced",), recompute=("full",), zero=(0,), tensor_parallel=(1,),
                        pipeline=(2,), expert_parallel=(1, 2, 8))
    points = space.points()
    # t 1 x p 2: d = 4 data-parallel pipelines; EP must divide d (8 does not)
    assert {point.ep for point in points} == {1, 2}
    assert all(point.dp % point.ep == 0 for point in points)


@pytest.mark.parametrize(("argv", "fragments"), [
    (["costs", "--model", "mixtral-8x7b", "-t", "1", "--ep", "3"], ("expert_parallel=3", "num_experts=8")),
    (["simulate", "1f1b", "--model", "mixtral-8x7b", "-t", "2", "--ep", "4", *SMALL],
     ("expert_parallel=4", "--dp")),
    (["costs", "--model", "llama3-8b", "--ep", "2"], ("expert_parallel=2", "mixture-of-experts")),
    (["costs", "--model", "llama3-8b", "--dtype", "fp8", "--device", "a100-80gb"], ("dtype=fp8", "fp8_peak_flops")),
    (["simulate", "1f1b", "--model", "mixtral-8x7b", "-t", "1", "--etp", "2", *SMALL],
     ("expert_tensor_parallel=2", "--ep")),
])
def test_bad_expert_input_is_one_error_line(cli, argv, fragments):
    assert_one_line_error(cli(*argv), *fragments)


def test_top_k_above_the_experts_is_one_error_line(cli, moe_file):
    assert_one_line_error(cli("costs", "--model", moe_file(k=9)), "experts_per_token=9", "num_experts=8")
