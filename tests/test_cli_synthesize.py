"""`pipesched synthesize`: the JSON object, the schedule file, and bad input."""

from __future__ import annotations

import json
import sys

import pytest

from cli_helpers import assert_one_line_error
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.io import json_format, load_schedule, save_schedule
from pipesched.io.stage_costs import load_stage_costs
from pipesched.model import load_cluster
from pipesched.runtime.runs import check_runnable
from pipesched.schedule import SYNCHRONOUS, Execution
from pipesched.simulate import Network, simulate
from pipesched.validation import validate

HEADER = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes,static_bytes"
KEYS = {"status", "makespan_s", "lower_bound_s", "gap", "seconds", "baseline"}


@pytest.fixture
def costs_file(tmp_path):
    path = tmp_path / "costs.csv"
    rows = [f"{s},{1 + 0.25 * s},{1.5},{0.75},4,1,10" for s in range(3)]
    path.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    return path


def test_json_has_the_result_keys(cli, costs_file) -> None:
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "--latency", "0.5",
                 "--memory-limit", "22", "--time-limit", "10", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert set(data) >= KEYS
    assert data["status"] in ("optimal", "feasible")
    assert data["lower_bound_s"] <= data["makespan_s"]
    assert data["gap"] == pytest.approx((data["makespan_s"] - data["lower_bound_s"]) / data["makespan_s"])
    assert data["baseline"]["family"] in ("1f1b", "gpipe", "zb-h1", "zb-h2")
    assert data["makespan_s"] <= data["baseline"]["makespan_s"]
    assert max(data["peak_memory_bytes"]) <= 22
    assert data["p"] == 3 and data["m"] == 4 and data["backward"] == "split"


@pytest.mark.parametrize("suffix", [".csv", ".json", ".txt"])
def test_schedule_file_round_trips_and_simulates_to_the_reported_time(cli, costs_file, tmp_path, suffix) -> None:
    out = tmp_path / f"synth{suffix}"
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "--latency", "0.5",
                 "--memory-limit", "22", "--backward", "full", "-o", str(out), "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    schedule = load_schedule(out)
    assert validate(schedule) == []
    assert not schedule.splits_backward
    timeline = simulate(schedule, load_stage_costs(costs_file), Network.uniform(3, latency=0.5, bandwidth=float("inf")),
                        contention=False)
    assert timeline.makespan == pytest.approx(data["makespan_s"], rel=1e-12)


def test_text_output_shows_the_bound_and_the_baseline_and_draws(cli, costs_file, tmp_path) -> None:
    picture = tmp_path / "synth.svg"
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "--memory-limit", "22",
                 "--no-timeline", "--svg", str(picture))
    assert result.code == 0, result
    for fragment in ("status", "lower bound (solver)", "best built-in family", "makespan with link contention"):
        assert fragment in result.out
    assert picture.read_text(encoding="utf-8").lstrip().startswith(("<?xml", "<svg"))


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--memory-limit", "5"], ["memory_limit=5", "below the 10 bytes of parameters"]),
        (["--memory-limit", "12"], ["memory_limit=12", "one microbatch", "allow recompute"]),
        (["--memory-limit", "0"], ["memory-limit=0", "> 0"]),
        (["--memory-limit", "lots"], ["memory-limit=lots"]),
        (["--backward", "half"], ["backward=half", "split, full"]),
        (["--time-limit", "0"], ["time-limit=0"]),
        (["--model", "llama3-8b"], ["model=llama3-8b", "not with --stage-costs"]),
        (["-m", "100000"], ["size=p3 x m100000", "lower p or m"]),
        (["-m", "0"], ["m=0"]),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(cli, costs_file, tmp_path, extra, fragments) -> None:
    out = tmp_path / "never.csv"
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "-o", str(out), *extra)
    assert_one_line_error(result, *fragments)
    assert not out.exists()


def test_unknown_model_is_named(cli, tmp_path) -> None:
    out = tmp_path / "never.txt"
    result = cli("synthesize", "-p", "2", "-m", "2", "--model", "no-such-model", "--cluster", "1x8-h100", "-o", str(out))
    assert_one_line_error(result, "no-such-model")
    assert not out.exists()


def test_missing_ortools_says_how_to_install_it(cli, costs_file, tmp_path, monkeypatch) -> None:
    # a None entry in sys.modules makes the import fail as if the package were absent
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    out = tmp_path / "never.csv"
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "-o", str(out))
    assert_one_line_error(result, "pip install 'pipesched[solver]'")
    assert not out.exists()


def test_model_and_cluster_use_the_device_memory_as_the_cap(cli) -> None:
    result = cli("synthesize", "-p", "4", "-m", "4", "--model", "llama3-8b", "--cluster", "1x8-h100",
                 "-t", "1", "--time-limit", "10", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    capacity = load_cluster("1x8-h100").devices[0].memory_bytes
    assert data["memory_limit_bytes"] == [capacity] * 4
    assert all(peak <= cap for peak, cap in zip(data["peak_memory_bytes"], data["memory_limit_bytes"], strict=True))
    assert "llama3-8b" in data["setup"]


@pytest.mark.parametrize("suffix", [".json", ".txt"])
def test_a_file_with_stage_checkpoints_simulates_to_the_synthesized_time_and_peak(cli, tmp_path, suffix) -> None:
    # a 60 MB cap on tiny's two stages (about 40 MB of activations a microbatch) leaves
    # room only with stage checkpoints
    out = tmp_path / f"synth{suffix}"
    workload = ("--model", "tiny", "--cluster", "1x8-h100", "-t", "1")
    made = cli("synthesize", "-p", "2", "-m", "4", *workload, "--memory-limit", "60MB", "--allow-recompute",
               "--time-limit", "1", "-o", str(out), "--json")
    assert made.code == 0, made
    synthesized = json.loads(made.out)
    assert synthesized["recompute_stages"]
    schedule = load_schedule(out)
    assert list(schedule.recompute_stages) == synthesized["recompute_stages"]
    assert schedule.params["partition"] == synthesized["partition"]
    run = cli("simulate", str(out), *workload, "--no-contention", "--json")
    assert run.code == 0, run
    simulated = json.loads(run.out)
    assert simulated["iteration_time_s"] == pytest.approx(synthesized["makespan_s"], rel=1e-12)
    assert simulated["peak_memory_bytes"] == pytest.approx(synthesized["peak_memory_bytes"], rel=1e-12)
    shown = cli("simulate", str(out), *workload, "--no-contention", "--no-timeline")
    assert "stage checkpoints (the schedule's)" in shown.out
    # the same table without its checkpoints runs over the cap
    schedule = schedule.with_ops(schedule.device_ops, execution=SYNCHRONOUS)
    plain = tmp_path / f"plain{suffix}"
    save_schedule(schedule, plain)
    over = json.loads(cli("simulate", str(plain), *workload, "--no-contention", "--json").out)
    assert max(over["peak_memory_bytes"]) > 60e6


@pytest.mark.parametrize(("flags", "what"), [(["--allow-recompute"], "stage checkpoints"),
                                            (["--allow-offload", "--host-bandwidth", "1e9"], "offloads")])
def test_decisions_a_csv_cannot_carry_are_refused_before_solving(cli, costs_file, tmp_path, flags, what) -> None:
    out = tmp_path / "never.csv"
    result = cli("synthesize", "-p", "3", "-m", "4", "--stage-costs", str(costs_file), "--memory-limit", "22",
                 *flags, "-o", str(out))
    assert_one_line_error(result, "output=", what, flags[0], ".json or .txt")
    assert not out.exists()


@pytest.mark.parametrize(("params", "fragment"), [({"recompute_stages": [5]}, "params.recompute_stages"),
                                                  ({"recompute_stages": "0"}, "params.recompute_stages"),
                                                  ({"partition": 3}, "params.partition")])
def test_bad_carried_checkpoints_or_partition_are_one_line_errors(cli, tmp_path, params, fragment) -> None:
    # a file written before the execution object, its checkpoints in params
    path = tmp_path / "bad.json"
    data = {**json_format.to_dict(generate("1f1b", 2, 2)), "params": params}
    del data["execution"]
    path.write_text(json.dumps(data), encoding="utf-8")
    result = cli("simulate", str(path), "--model", "tiny", "--cluster", "1x8-h100", "-t", "1", "--no-timeline")
    assert_one_line_error(result, fragment)


def test_a_real_run_refuses_stage_checkpoints_it_would_not_execute(tmp_path) -> None:
    table = generate("1f1b", 2, 2)
    check_runnable(table)
    with pytest.raises(PipeschedError, match=r"recompute_stages.*real runs do not execute"):
        check_runnable(table.with_ops(table.device_ops, execution=Execution(recompute_stages=(0,))))
