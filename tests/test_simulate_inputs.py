"""Inputs of the simulator: stage-cost files, networks from clusters, and `pipesched simulate`."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments.setup import split_stage_costs
from pipesched.io.stage_costs import dumps_stage_costs, load_stage_costs, parse_stage_costs
from pipesched.model import load_cluster
from pipesched.simulate import Network

HEADER = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes"


def costs_text(rows: list[str], header: str = HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"



# --- stage-cost files -----------------------------------------------------------------------
def test_stage_cost_file_reads_and_round_trips() -> None:
    text = costs_text(["1,0.2,0.3,0.1,2e9,1e6", "0,0.1,0.2,0.1,1e9,1e6"])
    costs = parse_stage_costs(text, num_stages=2)
    assert costs.forward == (0.1, 0.2)
    assert costs.full_backward(1) == pytest.approx(0.4)
    assert parse_stage_costs(dumps_stage_costs(costs)) == costs


def test_backward_column_overrides_i_plus_w() -> None:
    costs = parse_stage_costs(costs_text(["0,0.1,0.2,0.1,1,1,0.25"], HEADER + ",backward"))
    assert costs.full_backward(0) == 0.25


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ["empty file"]),
        (costs_text(["0,1,1,1,1,1"], "stage,forward,backward_input,backward_weight,activation_bytes"),
         ["column='output_bytes'", "missing"]),
        (costs_text(["0,1,1,1,1,1,1"], HEADER + ",speed"), ["column='speed'", "unknown"]),
        (costs_text(["0,1,1,1,1,1", "0,1,1,1,1,1"]), ["costs.csv:3", "stage=0", "twice"]),
        (costs_text(["0,1,1,1,1,1"]), ["stage=1", "missing row"]),
        (costs_text(["0,-1,1,1,1,1", "1,1,1,1,1,1"]), ["costs.csv:2", "forward=-1", ">= 0"]),
        (costs_text(["0,1,nan,1,1,1", "1,1,1,1,1,1"]), ["backward_input=nan", "finite"]),
        (costs_text(["0,1,1,1,1,abc", "1,1,1,1,1,1"]), ["output_bytes='abc'", "not a number"]),
        (costs_text(["0,1,1,1,1", "1,1,1,1,1,1"]), ["costs.csv:2", "5 fields"]),
        (costs_text(["x,1,1,1,1,1"]), ["stage='x'"]),
        (costs_text(["0,1,1,1,1,1", "1,1,1,1,1,1", "2,1,1,1,1,1"]), ["stage=2", "extra row", "2 stages"]),
    ],
)
def test_bad_stage_cost_files_name_the_line_field_and_value(text: str, fragments: list[str]) -> None:
    with pytest.raises(PipeschedError) as info:
        parse_stage_costs(text, source="costs.csv", num_stages=2)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_load_stage_costs_reports_a_missing_file(tmp_path) -> None:
    with pytest.raises(PipeschedError, match="no such file"):
        load_stage_costs(tmp_path / "absent.csv")


def test_split_stage_costs_into_chunks() -> None:
    costs = StageCosts((2.0, 4.0), (2.0, 2.0), (1.0, 1.0), (8.0, 8.0), (3.0, 5.0), static_bytes=(18.0, 36.0))
    split = split_stage_costs(costs, 4)
    assert split.forward == (1.0, 1.0, 2.0, 2.0)
    assert split.output_bytes == (3.0, 3.0, 5.0, 5.0)  # a chunk boundary carries the same tensor
    assert split.static_bytes == (9.0, 9.0, 18.0, 18.0)
    with pytest.raises(PipeschedError, match="stage_costs=2 stages"):
        split_stage_costs(costs, 3)


# --- networks -------------------------------------------------------------------------------
def test_network_from_cluster_uses_intra_and_inter_node_links() -> None:
    cluster = load_cluster("4x8-h100")
    network = Network.from_cluster(cluster, ranks=[0, 4, 8, 12])
    assert network.node_of == (0, 0, 1, 1)
    # the link's latency plus the transfer set-up of the devices at its ends
    setup = cluster.devices[0].transfer_setup_s
    assert setup > 0
    assert network.transfer_time(0, 1, 0.0) == pytest.approx(cluster.intra_node.latency + setup)
    assert network.transfer_time(1, 2, 1e9) == pytest.approx(cluster.inter_node.transfer_time(1e9) + setup)
    slow = dataclasses.replace(cluster.devices[0], transfer_setup_s=1e-3)
    mixed = dataclasses.replace(cluster, devices=(slow, *cluster.devices[1:]))
    # the slower end sets the set-up, both ways
    assert Network.from_cluster(mixed, ranks=[0, 4]).latency[1, 0] == pytest.approx(cluster.intra_node.latency + 1e-3)
    assert network.capacity == (cluster.devices[0].memory_bytes,) * 4
    with pytest.raises(PipeschedError, match="rank=40"):
        Network.from_cluster(cluster, ranks=[0, 40])


def test_uniform_network_accepts_infinite_bandwidth_only_above_zero() -> None:
    assert Network.uniform(2, latency=0.0, bandwidth=math.inf).transfer_time(0, 1, 1e12) == 0.0
    with pytest.raises(PipeschedError, match="bandwidth=-1"):
        Network.uniform(2, latency=0.0, bandwidth=-1.0)


# --- pipesched simulate ---------------------------------------------------------------------
def write_costs(tmp_path, rows: int, *, bad: str | None = None) -> str:
    lines = [f"{s},0.01,0.01,0.01,1e8,1e6" for s in range(rows)]
    if bad is not None:
        lines[-1] = bad
    path = tmp_path / "costs.csv"
    path.write_text(costs_text(lines), encoding="utf-8")
    return str(path)


def test_simulate_json_with_a_stage_cost_file(cli, tmp_path) -> None:
    path = write_costs(tmp_path, 4)
    result = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", path, "--latency", "0",
                 "--bandwidth", "inf", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    # free links: (m + p - 1)(F + B) = 11 x 0.03
    assert data["iteration_time_s"] == pytest.approx(11 * 0.03)
    assert data["bubble_ratio"] == pytest.approx(3 / 11)
    assert data["peak_memory_bytes"] == pytest.approx([4e8, 3e8, 2e8, 1e8])
    assert data["throughput_samples_per_s"] == pytest.approx(8 / (11 * 0.03))


def test_simulate_slower_links_and_switches_change_the_result(cli, tmp_path) -> None:
    path = write_costs(tmp_path, 4)
    times = {}
    for flags in ((), ("--no-contention",), ("--no-overlap",)):
        result = cli("simulate", "gpipe", "-p", "4", "-m", "8", "--stage-costs", path, "--latency", "1e-3",
                     "--bandwidth", "1e8", "--json", *flags)
        assert result.code == 0, result
        times[flags] = json.loads(result.out)["iteration_time_s"]
    assert times[()] > 11 * 0.03
    assert times[("--no-contention",)] <= times[()]
    assert times[("--no-overlap",)] >= times[()]


def test_simulate_reads_a_schedule_file(cli, tmp_path) -> None:
    from pipesched import io
    from pipesched.generators import generate

    schedule_path = tmp_path / "s.json"
    io.save_schedule(generate("zb-h1", 4, 8), schedule_path)
    result = cli("simulate", str(schedule_path), "--stage-costs", write_costs(tmp_path, 4), "--json")
    assert result.code == 0, result
    assert json.loads(result.out)["num_stages"] == 4


def test_simulate_default_scenario_table(cli) -> None:
    result = cli("simulate", "1f1b", "-p", "8", "-m", "8")
    assert result.code == 0, result
    assert "iteration time" in result.out and "llama3-70b on 4x8-h100" in result.out
    assert "MFU" in result.out


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--bandwidth", "0"], ["bandwidth=0", "> 0"]),
        (["--bandwidth", "fast"], ["bandwidth='fast'"]),
        (["--latency", "-1"], ["latency=-1"]),
    ],
)
def test_simulate_bad_links_exit_2(cli, tmp_path, args, fragments) -> None:
    result = cli("simulate", "1f1b", "-p", "4", "-m", "4", "--stage-costs", write_costs(tmp_path, 4), *args)
    assert_one_line_error(result, *fragments)


def test_simulate_bad_inputs_exit_2(cli, tmp_path) -> None:
    assert_one_line_error(cli("simulate", "1f1b", "-p", "4", "-m", "4", "--stage-costs", write_costs(tmp_path, 3)),
                          "3 stage rows", "4 stages")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "4", "-m", "4",
                              "--stage-costs", write_costs(tmp_path, 4, bad="3,0.01,-0.5,0.01,1e8,1e6")),
                          "backward_input=-0.5")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "4", "-m", "4",
                              "--stage-costs", write_costs(tmp_path, 4, bad="3,nan,0.01,0.01,1e8,1e6")),
                          "forward=nan")
    # a pipeline of 16 x tensor parallel 4 needs 64 ranks; the cluster has 32
    assert_one_line_error(cli("simulate", "1f1b", "-p", "16", "-m", "16"), "4x8-h100", "32 devices")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "4", "-m", "4", "--latency", "-1"), "latency=-1")
    assert_one_line_error(cli("simulate", "1f1b", "--stage-costs", write_costs(tmp_path, 8), "--model", "llama3-8b"),
                          "model=llama3-8b")
    assert_one_line_error(cli("simulate", "no-such-family"), "unknown family")


@pytest.mark.parametrize("name", ["pipesched.simulate.network", "pipesched.simulate.simulator",
                                  "pipesched.experiments.setup", "pipesched.io.stage_costs", "pipesched.compare"])
def test_docstring_examples_run(name) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_link_overrides_replace_every_link_of_the_cluster(cli) -> None:
    def time_of(*extra: str) -> float:
        result = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--json", *extra)
        assert result.code == 0, result
        return json.loads(result.out)["iteration_time_s"]

    base = time_of()
    assert time_of("--latency", "0.05") > base + 7 * 2 * 0.05  # the critical path crosses 3 links each way
    assert time_of("--bandwidth", "inf") <= base
    assert time_of("--bandwidth", "1e8") > base
