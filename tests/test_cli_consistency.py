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
@pytest.mark.slow
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
@pytest.mark.slow
def test_memory_limit_is_bytes_with_a_unit_everywhere(cli) -> None:
    partition = ("partition", "--model", "llama3-8b", "--device", "h100-sxm", "-p", "4", "-t", "1", "--partition",
                 "memory", "--schedule", "1f1b", "-m", "8")
    with_unit = cli(*partition, "--memory-limit", "40GiB")
    in_bytes = cli(*partition, "--memory-limit", str(40 * 2**30))
    assert_one_line_error(with_unit, "memory=40.0 GiB")
    assert in_bytes.err == with_unit.err
    fits = cli(*partition, "--memory-limit", "80GiB", "--json")
    assert fits.code == 0, fits
    assert json.loads(fits.out)["memory_capacity_bytes"] == [80 * 2**30] * 4
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


# --- one flag, one meaning, one default ---------------------------------------------------
# the commands whose defaults are rows of their own (DEFAULTS.PREFIX_*): real runs start from
# the sizes this machine runs in seconds, serving from its own scenario
FAMILY_OF = {"run": "real", "check": "real", "profile": "real", "serve simulate": "serve",
             "serve capacity": "serve", "serve search": "serve", "serve run": "serve-real",
             "serve check": "serve-real"}
DEFAULTS_PREFIX = {"real": ("run_",), "serve": ("serve_",), "serve-real": ("serve_run_", "run_", "serve_")}
# where a flag legitimately reads differently, and why
EXEMPT = {
    # search takes each of these as the list of values to try
    **{flag: ({"search", "serve search"}, "a list of values to try") for flag in (
        "--tensor-parallel", "-t", "--dp", "--zero", "--recompute", "--schedules", "-b", "--pipeline", "--replicas",
        "--scheduler", "--max-batch", "--max-tokens", "--chunk", "--ep")},
    # each command writes its own result to the file it is given
    **{flag: ({"check", "search", "show", "synthesize", "profile", "serve simulate", "serve capacity",
               "serve search", "serve run", "serve check"}, "the command's own result")
       for flag in ("--html", "--perfetto", "-o", "--output")},
    # each search keeps its own kind of store
    "--db": ({"serve search"}, "the serving search's own store"),
    # profile times single ops (untimed repeats first) on a torch device, adds one runtime's
    # per-op overhead, and writes per-stage costs of its own split
    **{flag: ({"profile"}, "profiling's op repeats, torch device and stage split")
       for flag in ("--device", "--partition", "-p", "-v", "--warmup", "--runtime")},
    # check needs schedules to run (families or files); search lists those to try
    "--schedules": ({"search", "check"}, "required by check; a list to try in search"),
}


def _commands() -> dict:
    """Every command by its name on the line, a group's (``serve``) as ``serve simulate``."""
    import click
    import typer

    from pipesched.cli import COMMANDS, app

    group = typer.main.get_group(app)
    context = typer.Context(group)
    found = {}
    for name in COMMANDS:
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            found |= {f"{name} {sub}": command.get_command(context, sub) for sub in command.list_commands(context)}
        else:
            found[name] = command
    return found


def _signature(param) -> tuple:
    return (str(param.type_descriptor.annotation), param.is_flag, param.multiple, param.default, param.help)


def _options(command) -> list:
    return [param for param in command.params if param.param_type_name == "option"]


def test_every_flag_has_one_type_help_and_default_in_every_command() -> None:
    from pipesched.defaults import DEFAULTS

    commands = _commands()
    seen: dict[tuple[str, str], dict[str, tuple]] = {}
    for name, command in commands.items():
        for param in _options(command):
            for flag in param.opts:
                exempt, _ = EXEMPT.get(flag, (set(), ""))
                if name in exempt:
                    continue
                seen.setdefault((flag, FAMILY_OF.get(name, "")), {})[name] = _signature(param)
    checked = 0
    for (flag, family), by_command in seen.items():
        assert len(set(by_command.values())) == 1, (flag, by_command)
        checked += len(by_command) > 1
        other = seen.get((flag, ""))
        if family and other is not None and set(other.values()) != set(by_command.values()):
            # a flag that differs from the analytical one has its own default row
            param = next(p for p in commands[next(iter(by_command))].params if flag in getattr(p, "opts", ()))
            assert any(hasattr(DEFAULTS, f"{prefix}{param.name}") for prefix in DEFAULTS_PREFIX[family]), flag
    assert checked >= 30  # most flags are shared


def test_every_default_is_stated_once_in_the_help() -> None:
    """A flag whose default is a value (not None) says it in its help, as the None ones do:
    the same text the README's Defaults table gives."""
    for name, command in _commands().items():
        for param in _options(command):
            if not param.is_flag and not param.hidden and param.default not in (
                    None, (), []) and param.required is False:
                shown = param.default if not isinstance(param.default, float) else f"{param.default:g}"
                assert param.show_default is False or "[default: " not in (param.help or ""), (name, param.opts)
                assert param.show_default is not False or f"[default: {shown}]" in (param.help or ""), \
                    (name, param.opts, param.help)


def test_sequence_parallel_help_states_its_default_once(cli) -> None:
    for command in ("costs", "partition", "simulate", "compare", "synthesize"):
        help_text = " ".join(cli(command, "--help").out.split())
        assert help_text.count("[default: on]") == 1, command
        assert "[default: sequence-parallel]" not in help_text


def test_partition_frozen_layers_help_names_no_option_it_lacks(cli) -> None:
    help_text = " ".join(cli("partition", "--help").out.split())
    assert "--stage-costs" not in help_text


def test_the_analytical_commands_start_from_the_default_scenario(cli) -> None:
    costs = cli("costs", "--json")
    assert costs.code == 0, costs
    plan = cli("partition", "--json")
    assert plan.code == 0, plan
    from pipesched.defaults import DEFAULTS

    assert json.loads(plan.out)["model"] == DEFAULTS.model
    assert len(json.loads(plan.out)["stages"]) == DEFAULTS.p
    # partition's -m defaults like every command's: the in-flight memory of DEFAULTS.m microbatches
    with_m = cli("partition", "--schedule", "1f1b", "-m", str(DEFAULTS.m), "--json")
    without = cli("partition", "--schedule", "1f1b", "--json")
    assert with_m.code == 0 and with_m.out == without.out


def test_the_default_device_is_the_default_clusters() -> None:
    from pipesched.defaults import DEFAULTS
    from pipesched.model import load_cluster

    assert {device.name for device in load_cluster(DEFAULTS.cluster).devices} == {DEFAULTS.device}


def test_dtype_and_sequence_parallel_reach_the_simulation(cli) -> None:
    base = ("simulate", "1f1b", "-p", "2", "-m", "4", "--model", "llama3-8b", "--cluster", "1x8-h100", "--json")
    plain, fp32, no_sp = (json.loads(cli(*base, *extra).out) for extra in
                          ((), ("--dtype", "fp32"), ("--no-sequence-parallel",)))
    assert fp32["iteration_time_s"] > plain["iteration_time_s"]  # fp32 matmuls at half the 16-bit peak
    assert max(no_sp["peak_memory_bytes"]) > max(plain["peak_memory_bytes"])  # norms' activations not split
    slower = json.loads(cli(*base, "--matmul-efficiency", "0.35").out)
    assert slower["iteration_time_s"] > plain["iteration_time_s"]
    assert_one_line_error(cli(*base, "--matmul-efficiency", "2"), "matmul_efficiency=2")


def test_search_takes_t_and_b_as_its_reproduce_line_does(cli, tmp_path) -> None:
    db = tmp_path / "s.sqlite"
    result = cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules",
                 "1f1b", "-t", "2", "-b", "1", "--pipeline", "4", "--partitions", "uniform", "--recompute", "none",
                 "--db", str(db), "--workers", "1", "--json")
    assert result.code == 0, result


# --- one JSON shape per result, one meaning per key -----------------------------------------
def _kind(value: object) -> str:
    """What a JSON value is: a per-device list, a number, a flag, text or an object."""
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float) or value is None:
        return "number"
    return type(value).__name__


def _flat(data: object, into: dict[str, set[str]], command: str, seen: dict) -> None:
    """Every key of ``data`` (nested objects and lists of objects too) with its kind; a
    search's ``space`` lists the values each axis tries, as its flags do, and is left out."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "space":
                continue
            if value is not None:
                into.setdefault(key, set()).add(_kind(value))
                seen.setdefault(key, {}).setdefault(_kind(value), command)
            _flat(value, into, command, seen)
    elif isinstance(data, list):
        for value in data:
            _flat(value, into, command, seen)


@pytest.mark.slow
def test_every_json_key_has_one_kind_and_one_meaning(cli, tmp_path) -> None:
    sizes = ("-p", "4", "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2")
    outputs = {
        "simulate": cli("simulate", "1f1b", *sizes, "--json"),
        "compare": cli("compare", "--schedules", "1f1b,zb-h1", *sizes, "--json"),
        "search": cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8",
                      "--schedules", "1f1b", "-t", "2", "--pipeline", "4", "--dp", "1", "-b", "1",
                      "--partitions", "balanced", "--recompute", "selective", "--zero", "0",
                      "--db", str(tmp_path / "s.sqlite"), "--workers", "1", "--json"),
        "synthesize": cli("synthesize", *sizes, "--time-limit", "2", "--no-timeline", "--json"),
        "costs": cli("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "2", "--json"),
        "partition": cli("partition", *sizes, "--schedule", "1f1b", "--json"),
    }
    grid = tmp_path / "s.txt"
    assert cli("show", "1f1b", "-p", "4", "-m", "8", "-o", str(grid)).code == 0
    outputs["validate"] = cli("validate", str(grid), "--json")
    data = {}
    for command, result in outputs.items():
        assert result.code == 0, (command, result)
        data[command] = json.loads(result.out)
        assert isinstance(data[command], dict), command  # one object per command
    kinds: dict[str, set[str]] = {}
    seen: dict = {}
    for command, value in data.items():
        _flat(value, kinds, command, seen)
    mixed = {key: seen[key] for key, found in kinds.items() if len(found) > 1}
    assert not mixed, mixed
    # the same point, read three ways: the same seconds, bytes and rates under the same keys
    simulated = data["simulate"]
    (record,) = [r for r in data["compare"]["records"] if r["schedule"] == "1f1b" and r["level"] == "sim"]
    (search,) = data["search"]["searches"]
    best = search["best"]
    for key in ("iteration_time_s", "max_peak_memory_bytes", "throughput_tokens_per_s", "mfu"):
        assert record[key] == pytest.approx(simulated[key]), key
        assert best[key] == pytest.approx(simulated[key]), key
    assert simulated["max_peak_memory_bytes"] == max(simulated["peak_memory_bytes"])
    assert simulated["any_out_of_memory"] == any(simulated["out_of_memory"]) == record["any_out_of_memory"]
    assert data["costs"]["model"] == "llama3-8b" and data["costs"]["device"] == "h100-sxm"
    assert data["costs"]["layers"][0]["name"] == "embedding"
    assert (data["validate"]["p"], data["validate"]["m"]) == (simulated["p"], simulated["m"])
    assert data["validate"]["num_stages"] == simulated["num_stages"]
    assert len(data["partition"]["peak_memory_bytes"]) == len(data["partition"]["memory_capacity_bytes"]) == 4


def test_search_json_has_one_shape_run_or_shown(cli, tmp_path) -> None:
    db = str(tmp_path / "s.sqlite")
    ran = cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules",
              "1f1b", "-t", "2", "--pipeline", "4", "--partitions", "balanced", "--recompute", "selective",
              "--db", db, "--workers", "1", "--json")
    shown = cli("search", "--db", db, "--show", "--json")
    assert ran.code == 0 and shown.code == 0, (ran, shown)
    first, stored = json.loads(ran.out), json.loads(shown.out)
    assert set(first) == set(stored) == {"db", "searches"}
    assert stored["searches"][0]["best"] == first["searches"][0]["best"]


# --- narrow terminals keep names and numbers whole ------------------------------------------
@pytest.mark.parametrize("columns", ["100", "80"])
def test_compare_and_search_keep_names_and_numbers_whole_on_a_narrow_terminal(cli, tmp_path, monkeypatch,
                                                                             columns) -> None:
    sizes = ("-p", "4", "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2")
    data = json.loads(cli("compare", "--schedules", "hanayo,pipedream-2bw,interleaved-1f1b", *sizes, "--json").out)
    db = str(tmp_path / "s.sqlite")
    searched = cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules",
                   "interleaved-1f1b", "-t", "2", "--partitions", "balanced", "--recompute", "selective", "--db", db,
                   "--workers", "1", "--json")
    rows = json.loads(searched.out)["searches"][0]["rows"]
    monkeypatch.setenv("COLUMNS", columns)
    compared = cli("compare", "--schedules", "hanayo,pipedream-2bw,interleaved-1f1b", *sizes)
    shown = cli("search", "--db", db, "--show", "--top", "5")
    for result in (compared, shown):
        assert result.code == 0, result
        assert "…" not in result.out
    words = set(compared.out.split())
    for record in data["records"]:
        assert record["schedule"] in words
        if record["level"] == "sim":  # four significant digits, a trailing zero kept or not
            seconds = record["iteration_time_s"]
            assert f"{seconds:.4g}" in words or f"{seconds:#.4g}" in words
    for row in rows[:5]:
        assert row["schedule"] in shown.out.split() and f"{row['iteration_time_s']:.4f}" in shown.out.split()


# --- small things a careful user notices ----------------------------------------------------
def test_counts_read_in_the_right_number(cli, tmp_path) -> None:
    from pipesched.wording import counted

    one = tmp_path / "one.txt"
    assert cli("show", "1f1b", "-p", "2", "-m", "1", "-o", str(one)).code == 0
    assert "(2 devices, 2 stages, 1 microbatch, 4 ops)" in cli("validate", str(one)).out
    broken = tmp_path / "broken.txt"
    broken.write_text("d0: 0F0\n")
    report = cli("validate", str(broken))
    assert report.code == 1 and report.out.splitlines()[0].endswith(": 1 violation")
    assert (counted(1, "microbatch"), counted(2, "microbatch"), counted(0, "op")) == (
        "1 microbatch", "2 microbatches", "0 ops")


def test_a_missing_op_names_the_closest_complete_set_and_counts_the_rest(cli, tmp_path) -> None:
    from pipesched.rules import RULES

    broken = tmp_path / "broken.txt"
    broken.write_text("d0: 0F0\n")
    (line,) = [text for text in cli("validate", str(broken)).out.splitlines() if "missing:" in text]
    # every set of kinds a training stage-microbatch may run holds F: 0F0 alone is short of each
    others = len(RULES.accepted_for("trains")) - 2
    assert line.strip() == f"missing: 0B0 is missing (or 0I0 and 0W0, or {others} other complete sets)"


def test_times_keep_their_trailing_zeros() -> None:
    from pipesched.wording import significant

    # four significant digits, whatever the value: a column of times reads alike
    for value in (3.9, 3.11, 3.257, 0.05, 12.5, 1234.5):
        text = significant(value)
        assert len(text.replace(".", "").lstrip("0")) == 4 or float(text) >= 1000, text
        assert float(text) == pytest.approx(value, rel=5e-4)


def test_compare_prints_times_with_their_trailing_zeros(cli, tmp_path) -> None:
    costs = tmp_path / "c.csv"  # 0.3 s ops on free links: an iteration of whole tenths, 3.9 s or so
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                     "0,0.3,0.3,0.3,1,0\n")
    result = cli("compare", "--schedules", "gpipe", "-p", "2", "-m", "2", "--stage-costs", str(costs),
                 "--levels", "sim", "--json")
    seconds = json.loads(result.out)["records"][0]["iteration_time_s"]
    text = cli("compare", "--schedules", "gpipe", "-p", "2", "-m", "2", "--stage-costs", str(costs), "--levels", "sim")
    assert f"{seconds:#.4g}" in text.out.split()


@pytest.mark.slow
def test_every_command_says_wrote_on_stderr_for_every_file(cli, tmp_path) -> None:
    grid = tmp_path / "s.txt"
    shown = cli("show", "1f1b", "-p", "2", "-m", "2", "-o", str(grid))
    assert shown.code == 0 and f"wrote {grid}" in shown.err and "wrote" not in shown.out
    svg = tmp_path / "s.svg"
    drawn = cli("simulate", "1f1b", "-p", "2", "-m", "2", "--no-timeline", "--svg", str(svg))
    assert f"wrote {svg}" in drawn.err and "wrote" not in drawn.out
    made = tmp_path / "synth.csv"
    synthesized = cli("synthesize", "-p", "2", "-m", "2", "--model", "tiny", "--cluster", "1x8-h100", "-t", "1",
                      "--time-limit", "2", "--no-timeline", "-o", str(made))
    assert synthesized.code == 0 and f"wrote {made}" in synthesized.err and "wrote" not in synthesized.out


def test_no_table_title_names_a_unit_none_of_its_cells_has(cli) -> None:
    result = cli("simulate", "1f1b", "-p", "2", "-m", "4", "--recompute", "full,none", "--no-timeline")
    assert result.code == 0, result
    assert "training work per device" in result.out and "training work per device (GiB)" not in result.out


@pytest.mark.parametrize("costs", ["0,0,0", "1,0,1", "0,1,1"])
def test_zero_slot_costs_are_refused(cli, costs) -> None:
    for command in (("show", "1f1b"), ("compare", "--schedules", "1f1b", "--levels", "formula,table")):
        assert_one_line_error(cli(*command, "-p", "2", "-m", "2", "--set", f"costs={costs}"), f"costs='{costs}'",
                              "> 0")


def test_the_library_starts_from_the_commands_defaults() -> None:
    import dataclasses

    from pipesched.defaults import DEFAULTS
    from pipesched.model import TrainingSettings

    settings = TrainingSettings()
    for field in dataclasses.fields(DEFAULTS):
        if hasattr(settings, field.name):
            assert getattr(settings, field.name) == getattr(DEFAULTS, field.name), field.name
    assert settings.tensor_parallel == DEFAULTS.tensor_parallel and settings.seq_len == DEFAULTS.seq_len


def test_search_takes_the_dtype_and_sequence_parallel_and_reproduces_them(cli, tmp_path) -> None:
    base = ("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules", "1f1b",
            "-t", "2", "--pipeline", "4", "-b", "1", "--partitions", "balanced", "--recompute", "selective",
            "--zero", "0", "--workers", "1")
    plain = cli(*base, "--db", str(tmp_path / "a.sqlite"), "--json")
    changed = cli(*base, "--db", str(tmp_path / "b.sqlite"), "--dtype", "fp32", "--no-sequence-parallel", "--json")
    assert plain.code == 0 and changed.code == 0, (plain, changed)
    fast, slow = (json.loads(r.out)["searches"][0]["best"] for r in (plain, changed))
    assert slow["iteration_time_s"] > fast["iteration_time_s"]  # fp32 matmuls at half the 16-bit peak
    text = cli(*base, "--db", str(tmp_path / "b.sqlite"), "--dtype", "fp32", "--no-sequence-parallel")
    command = text.out.split("reproduce with")[1].split()
    assert "--dtype" in command and "--no-sequence-parallel" in command
    simulated = json.loads(cli(*command[1:command.index("results")] if "results" in command else command[1:],
                               "--json").out)
    assert simulated["iteration_time_s"] == slow["iteration_time_s"]
