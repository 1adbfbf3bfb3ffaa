"""A schedule's execution: the typed record the simulation reads beyond the ops
(``Schedule.execution``), how files carry it, and how older files (with it in params) load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.io import dumps, json_format, load_schedule, loads
from pipesched.schedule import SYNCHRONOUS, Execution, WeightUpdates
from pipesched.simulate import Network, simulate
from pipesched.simulate.iterations import steady_state

OLD_FILES = Path(__file__).parent / "reference" / "schedule_files"


def test_an_old_grid_file_loads_its_params_into_the_typed_execution() -> None:
    # written before the execution line: PipeDream-2BW, p=4, 2 iterations of m=4
    loaded = load_schedule(OLD_FILES / "pipedream-2bw_p4_m4_k2_params.txt")
    # PipeDream-2BW: one update per iteration of m microbatches, two weight versions per
    # stage (double buffering), every batch one update behind
    assert loaded.execution == Execution(iterations=2, updates=WeightUpdates(4, (2, 2, 2, 2), 1))
    assert loaded.iteration_microbatches == 4
    assert set(loaded.params) == {"p", "m", "iterations"}  # what is left is for display


def test_an_old_json_file_loads_its_microbatch_fraction() -> None:
    loaded = load_schedule(OLD_FILES / "chimera_halving_p4_m4_params.json")
    assert loaded.microbatch_fraction == 0.5 and loaded.iteration_microbatches == 4  # 8 halves make 4
    assert "microbatch_fraction" not in loaded.params and loaded.params["backward_halving"] == 1
    slots, network = StageCosts.slots().broadcast(4), Network.uniform(4, latency=0.0, bandwidth=1e9)
    # no bytes to send: half-size microbatches run the same table in half the time
    whole = loaded.with_ops(loaded.device_ops, execution=SYNCHRONOUS)
    assert simulate(loaded, slots, network).makespan == simulate(whole, slots, network).makespan / 2


@pytest.mark.parametrize("fmt", ["grid", "json"])
@pytest.mark.parametrize("schedule", [
    generate("pipedream", 4, 4, iterations=3),
    generate("pipedream-2bw", 3, 6, iterations=2),
    generate("chimera", 4, 4, backward_halving=1),
    generate("1f1b", 3, 4).with_ops(generate("1f1b", 3, 4).device_ops,
                                    execution=Execution(recompute_stages=(0, 2), offload_stages=(1,))),
], ids=["pipedream", "pipedream-2bw", "chimera-halving", "checkpoints"])
def test_files_written_now_carry_the_execution_in_one_place(schedule, fmt) -> None:
    text = dumps(schedule, fmt)
    again = loads(text, fmt)
    assert again.execution == schedule.execution and dict(again.params) == dict(schedule.params)
    if fmt == "json":
        data = json.loads(text)
        assert data["execution"] == schedule.execution.to_dict()
        assert not set(data["params"]) & {"asynchronous", "versions", "microbatch_fraction", "recompute_stages"}


def test_the_typed_execution_drives_the_steady_state_not_the_params() -> None:
    slots = StageCosts.slots().broadcast(4)
    made = generate("pipedream", 4, 8, iterations=4)
    result = steady_state(made, slots)
    # PipeDream's steady state: every device runs its F, B pairs back to back, no bubble
    # (m x (F + B) per iteration), and stage s keeps p - s weight versions
    assert result.iteration_time == 8 * (slots.f + slots.b)
    assert result.weights.versions == (4, 3, 2, 1)
    bare = made.with_ops(made.device_ops, params={})
    assert steady_state(bare, slots).iteration_time == result.iteration_time
    # the same ops with no asynchronous updates are k flushed iterations of 32 microbatches
    flushed = made.with_ops(made.device_ops, execution=SYNCHRONOUS)
    assert steady_state(flushed, slots, iterations=2).iterations.mode == "flush"


def _file(tmp_path: Path, execution: dict) -> Path:
    data = json_format.to_dict(generate("pipedream", 4, 4, iterations=2))
    data["execution"] = execution
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["validate", "simulate"])
@pytest.mark.parametrize(("execution", "fragment"), [
    ({"microbatch_fraction": 0}, "execution.microbatch_fraction=0"),
    ({"iterations": 2, "updates": {"update_every": 1, "versions": [4, 3, 2]}}, "execution.updates.versions="),
    ({"iterations": 3}, "execution.iterations=3"),
    ({"iterations": 10**30}, "execution.iterations=1000000000000000000000000000000: over the limit"),
    ({"iterations": 2, "updates": {"update_every": 0, "versions": [1, 1, 1, 1]}}, "execution.updates.update_every=0"),
    ({"recompute_stages": [4]}, "execution.recompute_stages="),
    ({"asynchronous": True}, "execution=asynchronous: unknown key"),
])
def test_a_bad_execution_is_a_one_line_error(cli, tmp_path, command, execution, fragment) -> None:
    path = _file(tmp_path, execution)
    result = cli(command, str(path))
    assert_one_line_error(result, fragment)
    assert not result.out


@pytest.mark.parametrize("params", [{"microbatch_fraction": 0}, {"asynchronous": True, "update_every": 1,
                                                                  "versions": [2]}])
def test_a_bad_old_params_execution_is_a_one_line_error(cli, tmp_path, params) -> None:
    path = tmp_path / "old.txt"
    path.write_text("# name: custom\n# params: " + json.dumps(params) + "\nd0: 0F0 0B0\nd1: 1F0 1B0\n", encoding="utf-8")
    result = cli("validate", str(path))
    assert_one_line_error(result, f"{path}:2:1: header params.")


@pytest.mark.parametrize("stated", [3, 0, "4", 10**30])
def test_an_old_iteration_count_that_does_not_divide_the_table_is_a_one_line_error(cli, tmp_path, stated) -> None:
    path = tmp_path / "old.json"
    data = {**json_format.to_dict(generate("1f1b", 2, 8)), "params": {"iteration_microbatches": stated}}
    del data["execution"]
    path.write_text(json.dumps(data), encoding="utf-8")
    assert_one_line_error(cli("simulate", str(path)), "params.iteration_microbatches=")
