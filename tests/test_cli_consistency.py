"""Every command does what the README says, the same way: schedule files where a schedule
is taken, one rule per idea (ZeRO-1, the partition names), errors that say what to give."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error


# --- schedule files in run and check -----------------------------------------------------
@pytest.mark.slow
def test_run_and_check_take_a_schedule_file_at_its_own_sizes(cli, tmp_path) -> None:
    path = tmp_path / "synth.csv"
    assert cli("show", "1f1b", "-p", "2", "-m", "4", "--format", "csv", "-o", str(path)).code == 0
    run = cli("run", str(path), "--model", "tiny", "-s", "16", "--steps", "1", "--warmup", "0", "--json")
    assert run.code == 0, run
    record = json.loads(run.out)
    assert (record["p"], record["m"]) == (2, 4)
    check = cli("check", "--schedules", str(path), "--model", "tiny", "-s", "16", "--steps", "1", "--warmup", "0",
                "--json")
    assert check.code == 0, check
    assert (json.loads(check.out)["p"], json.loads(check.out)["m"]) == (2, 4)


def test_a_schedule_file_refuses_sizes_given_with_it(cli, tmp_path) -> None:
    path = tmp_path / "synth.csv"
    assert cli("show", "1f1b", "-p", "2", "-m", "4", "--format", "csv", "-o", str(path)).code == 0
    assert_one_line_error(cli("run", str(path), "-p", "3"), "p=3", "drop -p")
    assert_one_line_error(cli("check", "--schedules", str(path), "-m", "5"), "m=5", "drop -m")


# --- one ZeRO-1 rule ---------------------------------------------------------------------
def test_zero_1_needs_data_parallel_replicas_in_every_command(cli) -> None:
    for command in (("simulate", "1f1b", "--no-timeline"), ("compare", "--schedules", "1f1b")):
        assert_one_line_error(cli(*command, "-p", "2", "-m", "4", "--zero", "1", "--dp", "1"), "zero=1", "dp=1",
                              "--dp 2")
        assert_one_line_error(cli(*command, "-p", "2", "-m", "4", "--zero", "1"), "zero=1", "dp=1")


def test_search_never_pairs_zero_1_with_one_replica() -> None:
    from pipesched.search.space import SearchSpace

    points = SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8, schedules=("1f1b",)).points()
    assert {(point.dp > 1) for point in points if point.zero == 1} == {True}
    assert any(point.dp == 1 for point in points)


# --- a cluster too small says which sizes fit --------------------------------------------
def test_a_cluster_too_small_names_the_sizes_that_fit(cli) -> None:
    result = cli("compare", "--model", "llama3-8b", "--cluster", "1x8-h100", "--levels", "sim")
    assert_one_line_error(result, "has 8 devices", "-p 2 -t 4", "-p 8 -t 1")
    # each suggestion runs: 2 x 4 and 8 x 1 ranks are both 8 devices
    for sizes in (("-p", "2", "-t", "4"), ("-p", "8", "-t", "1")):
        fits = cli("simulate", "1f1b", *sizes, "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100",
                   "--json")
        assert fits.code == 0, fits
    replicas = cli("simulate", "1f1b", "-p", "8", "-t", "4", "--dp", "2", "--no-timeline")
    assert_one_line_error(replicas, "32 devices", "-p 4 -t 4 --dp 2", "-p 8 -t 2 --dp 2")


# --- error wording -----------------------------------------------------------------------
def test_a_misspelled_partition_method_gets_the_closest(cli) -> None:
    for command in (("simulate", "1f1b", "--no-timeline"), ("compare", "--schedules", "1f1b"),
                    ("synthesize", "--time-limit", "1")):
        assert_one_line_error(cli(*command, "-p", "2", "-m", "4", "--partition", "balancd"),
                              "partition='balancd'", "did you mean balanced?")
    # a layout string is still read as one, and its own problem named
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "4", "--partition", "Et*9|tx"), "unexpected 'x'")


@pytest.mark.parametrize("flag", ["--model", "--cluster"])
def test_a_directory_is_called_a_directory(cli, tmp_path, flag) -> None:
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "4", flag, str(tmp_path)), "is a directory")


def test_a_directory_as_the_search_store_is_called_a_directory(cli, tmp_path) -> None:
    assert_one_line_error(cli("search", "--db", str(tmp_path), "--show"), "db=", "is a directory")


def test_a_model_folder_with_a_config_reads_the_config(cli, tmp_path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 1000}))
    result = cli("costs", "--model", str(folder), "--device", "cpu", "-s", "16", "-t", "1", "--json")
    assert result.code == 0, result


def test_the_tensor_parallel_field_has_one_name(cli) -> None:
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "4", "-t", "0", "--no-timeline"),
                          "tensor_parallel=0")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "4", "-t", "3", "--no-timeline"),
                          "tensor_parallel=3")


# --- --memory-limit: bytes (or with a unit) in every command ------------------------------
def test_memory_limit_is_bytes_with_a_unit_everywhere(cli) -> None:
    partition = ("partition", "--model", "llama3-8b", "--device", "h100-sxm", "-p", "4", "-t", "1", "--method",
                 "memory", "--schedule", "1f1b", "-m", "8")
    with_unit = cli(*partition, "--memory-limit", "40GiB")
    in_bytes = cli(*partition, "--memory-limit", str(40 * 2**30))
    assert_one_line_error(with_unit, "memory=40.0 GiB")
    assert in_bytes.err == with_unit.err
    fits = cli(*partition, "--memory-limit", "80GiB", "--json")
    assert fits.code == 0, fits
    assert json.loads(fits.out)["device_memory_bytes"] == [80 * 2**30] * 4
    synthesize = cli("synthesize", "-p", "2", "-m", "2", "--model", "tiny", "--cluster", "1x8-h100", "-t", "1",
                     "--memory-limit", "80GiB", "--time-limit", "2", "--json", "--no-timeline")
    assert synthesize.code == 0, synthesize
    assert json.loads(synthesize.out)["memory_limit_bytes"] == [80 * 2**30] * 2


def test_activation_limits_have_their_own_name(cli, tmp_path) -> None:
    path = tmp_path / "gpipe.txt"
    assert cli("show", "gpipe", "-p", "2", "-m", "4", "-o", str(path)).code == 0
    assert cli("validate", str(path), "--activation-limit", "4").code == 0
    assert cli("validate", str(path), "--activation-limit", "3").code == 1
    assert_one_line_error(cli("validate", str(path), "--memory-limit", "4"), "--memory-limit")
    shown = cli("show", "zb-v", "-p", "4", "-m", "8", "--set", "activation_limit=6", "--format", "json")
    assert shown.code == 0, shown
    assert json.loads(shown.out)["params"]["activation_limit"] == 6
    assert_one_line_error(cli("show", "zb-v", "-p", "4", "-m", "8", "--set", "memory_limit=6"), "activation_limit")
