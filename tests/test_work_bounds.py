"""Rates, durations and the work of a command bounded where they are read: every derived time
finite (strict JSON, no numpy warnings), and Monte Carlo runs, traces and synthesis problems
refused before they outgrow the limits."""

from __future__ import annotations

import json
import math

import pytest

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_SAMPLED_TASKS,
    MAX_SECONDS,
    MAX_SYNTHESIS_OPS,
    MAX_TRACE_TASKS,
    MIN_RATE,
)
from pipesched.search.baseline import candidates, in_flight_allowed
from pipesched.search.problem import SynthesisProblem
from pipesched.simulate.network import Network

HEADER = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"


def stage_costs(tmp_path, stages: int, *, seconds: float = 1.0, nbytes: float = 1e9):
    path = tmp_path / f"costs{stages}.csv"
    path.write_text(HEADER + "".join(f"{s},{seconds:g},{seconds:g},{seconds:g},{nbytes:g},{nbytes:g}\n"
                                     for s in range(stages)))
    return str(path)


def strict_json(text: str):
    """The document, refusing NaN and Infinity (which are not JSON)."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def numbers(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, float):
        yield value


def cluster_file(tmp_path, bandwidth: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: slow\nnodes:\n  - devices_per_node: 8\n    device: h100-sxm\n"
                    f"intra_node: {{bandwidth: {bandwidth}, latency: 3 us}}\n"
                    "inter_node: {bandwidth: 400 Gb/s, latency: 5 us}\n")
    return str(path)


@pytest.mark.parametrize("tiny", ["1e-300", "1e-7"])
def test_rates_under_the_least_rate_are_refused_where_they_are_read(cli, tmp_path, tiny):
    assert float(tiny) < MIN_RATE
    costs = stage_costs(tmp_path, 2)
    cases = [
        (("simulate", "1f1b", "-p", "2", "-m", "4", "--stage-costs", costs, "--bandwidth", tiny, "--json"),
         "bandwidth="),
        (("simulate", "1f1b", "-p", "2", "-m", "4", "--stage-costs", costs, "--offload", "all",
          "--host-bandwidth", tiny, "--json"), "host-bandwidth="),
        (("compare", "--schedules", "1f1b", "-p", "2", "-m", "4", "--model", "tiny",
          "--cluster", cluster_file(tmp_path, tiny), "-t", "1", "--json"), "intra_node.bandwidth="),
        (("synthesize", "-p", "2", "-m", "4", "--stage-costs", costs, "--bandwidth", tiny), "bandwidth="),
    ]
    for argv, fragment in cases:
        assert_one_line_error(cli(*argv), fragment)


def test_durations_over_the_limit_are_refused(cli, tmp_path):
    costs = stage_costs(tmp_path, 2)
    assert_one_line_error(cli("show", "zb-h1", "-p", "4", "-m", "8", "--set", "costs=1e308,1,1"), "costs.F=")
    assert_one_line_error(cli("synthesize", "-p", "2", "-m", "4", "--stage-costs", costs,
                              "--time-limit", "1e308"), "time-limit=")


@pytest.mark.parametrize("argv", [
    ("simulate", "zb-h1", "-p", "2", "-m", "16", "--json"),
    ("simulate", "1f1b", "-p", "2", "-m", "8", "--offload", "all", "--json"),
    ("compare", "--schedules", "1f1b,zb-v,zb-1p", "-p", "2", "-m", "16", "--jitter", "0.5", "--samples", "20",
     "--json"),
])
def test_the_extremes_within_the_limits_give_finite_times(cli, tmp_path, argv):
    # the longest durations, the largest amounts and the slowest rates every reader takes
    costs = stage_costs(tmp_path, 2, seconds=MAX_SECONDS, nbytes=MAX_AMOUNT)
    extremes = ("--stage-costs", costs, "--bandwidth", f"{MIN_RATE:g}", "--latency", f"{MAX_SECONDS:g}")
    if "--offload" in argv:
        extremes += ("--host-bandwidth", f"{MIN_RATE:g}")
    result = cli(*argv, *extremes)
    assert result.code == 0, result.err
    assert result.err == ""  # no numpy RuntimeWarning (overflow, invalid value)
    document = strict_json(result.out)
    assert document.get("skipped", []) == []
    assert all(math.isfinite(value) for value in numbers(document))


def test_monte_carlo_work_is_bounded_by_samples_times_tasks(cli, tmp_path):
    costs = stage_costs(tmp_path, 2)
    p, m = 2, 1024
    # 1F1B's tasks: an F and a B per stage-microbatch, an activation and a gradient per
    # microbatch across each of the p - 1 boundaries
    tasks = 2 * p * m + 2 * (p - 1) * m
    samples = MAX_SAMPLED_TASKS // tasks + 1
    result = cli("simulate", "1f1b", "-p", str(p), "-m", str(m), "--stage-costs", costs, "--bandwidth", "1e10",
                 "--jitter", "0.1", "--samples", str(samples))
    assert_one_line_error(result, f"samples={samples:,}", f"give at most {MAX_SAMPLED_TASKS // tasks:,} samples")
    small = cli("simulate", "1f1b", "-p", str(p), "-m", "8", "--stage-costs", costs, "--jitter", "0.1",
                "--samples", "50", "--json")
    assert small.code == 0, small.err


@pytest.mark.slow
def test_a_trace_over_its_limit_is_refused_before_anything_is_written(cli, tmp_path):
    p, m = 3, 16384  # 1F1B's slot table: 2 p m ops, no transfers
    assert 2 * p * m > MAX_TRACE_TASKS
    trace, table = tmp_path / "t.json", tmp_path / "t.txt"
    result = cli("show", "1f1b", "-p", str(p), "-m", str(m), "--perfetto", str(trace), "-o", str(table))
    assert_one_line_error(result, f"trace={2 * p * m:,} ops and transfers")
    assert not trace.exists() and not table.exists()


def test_a_synthesis_problem_over_its_limit_is_refused_before_the_solver_runs(cli, tmp_path):
    p, m = 100, 66  # a split backward: F, I, W per stage-microbatch
    assert 3 * p * m > MAX_SYNTHESIS_OPS
    result = cli("synthesize", "-p", str(p), "-m", str(m), "--stage-costs", stage_costs(tmp_path, p))
    assert_one_line_error(result, f"{3 * p * m:,} ops", f"{MAX_SYNTHESIS_OPS:,}")


def test_synthesis_at_the_extremes_keeps_its_time_grid_within_the_solver(cli, tmp_path):
    # transfers 1e27 times the longest op: the grid coarsens instead of leaving int64
    costs = stage_costs(tmp_path, 2, seconds=MAX_SECONDS, nbytes=MAX_AMOUNT)
    result = cli("synthesize", "-p", "2", "-m", "4", "--stage-costs", costs, "--bandwidth", f"{MIN_RATE:g}",
                 "--latency", f"{MAX_SECONDS:g}", "--time-limit", "3", "--json")
    assert result.code == 0, result.err
    document = strict_json(result.out)
    assert all(math.isfinite(value) for value in numbers(document))
    # two stages in turn: at least the two messages and the forward and backward of each stage
    assert document["makespan_s"] >= 2 * MAX_AMOUNT / MIN_RATE
    assert document["lower_bound_s"] <= document["makespan_s"]


def test_synthesis_of_ops_that_take_no_time_reports_equal_speed(cli, tmp_path):
    costs = stage_costs(tmp_path, 2, seconds=0.0, nbytes=0.0)
    result = cli("synthesize", "-p", "2", "-m", "4", "--stage-costs", costs, "--time-limit", "2", "--json")
    assert result.code == 0, result.err
    document = strict_json(result.out)
    assert document["makespan_s"] == document["baseline"]["makespan_s"] == 0.0
    assert document["speedup_over_baseline"] == 1.0  # equal: the same (zero) time


def test_the_synthesis_baseline_plans_under_a_roomy_cap_within_the_option_bounds():
    # activations of 1 byte under an 80 GB cap: room for far more than the m microbatches
    p, m = 2, 4
    costs = StageCosts.uniform(p, activation_bytes=1.0, output_bytes=1.0)
    problem = SynthesisProblem(costs, Network.uniform(p, latency=0.0, bandwidth=1e9), m, memory_limit=(8e10,) * p)
    assert in_flight_allowed(problem) == m  # a stage holds at most its m microbatches
    planned = [(name, options) for name, options, _ in candidates(problem) if "activation_limit" in options]
    assert {name for name, _ in planned} >= {"zb-h1", "zb-1p"}
    assert all(options["activation_limit"] == m for _, options in planned)
