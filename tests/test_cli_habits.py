"""The command behaves the way command-line users expect: help without arguments, a
version, lists of what names it takes, JSON where it prints results, suggestions for
misspelled names, output that keeps its width in a pipe, and a fast start."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import typer

from cli_helpers import assert_one_line_error
from pipesched.cli import COMMANDS
from pipesched.cli.progress import StatusLine
from pipesched.runtime.launch import status_line


def test_bare_pipesched_prints_help_and_succeeds(cli):
    result = cli()
    assert result.code == 0 and result.err == ""
    assert result.out.startswith("Usage: pipesched [OPTIONS] COMMAND")
    for name, entry in COMMANDS.items():
        assert f"{name} " in result.out and entry.summary in result.out


def test_version(cli):
    result = cli("--version")
    assert result.code == 0 and result.out.startswith("pipesched ")


def test_the_command_table_names_what_each_module_registers():
    modules = {entry.module for entry in COMMANDS.values()}
    registered = set()
    for module in modules:
        group = typer.Typer()
        __import__(module, fromlist=["register"]).register(group)
        names = {info.name for info in (*group.registered_commands, *group.registered_groups)}
        assert names == {name for name, entry in COMMANDS.items() if entry.module == module}
        registered |= names
    assert registered == set(COMMANDS)


def test_help_and_validate_load_neither_numpy_nor_the_drawing_and_run_modules(tmp_path, cli):
    path = tmp_path / "s.txt"
    assert cli("show", "zb-v", "-p", "4", "-m", "8", "-o", str(path)).code == 0
    code = ("import sys, contextlib\n"
            "from pipesched.cli import main\n"
            "for argv in (['--help'], ['validate', sys.argv[1]]):\n"
            "    with contextlib.suppress(SystemExit):\n"
            "        main(argv)\n"
            "heavy = ('numpy', 'numba', 'matplotlib', 'torch', 'rich', 'pipesched.cli.simulate', 'pipesched.cli.run')\n"
            "print('loaded:', ','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "loaded:"


@pytest.mark.parametrize("what", ["families", "models", "devices", "clusters"])
def test_list_each_kind_as_text_and_json(cli, what):
    from pipesched.generators import FAMILIES
    from pipesched.model import DEVICES, MODELS, cluster_presets

    names = {"families": list(FAMILIES), "models": list(MODELS), "devices": list(DEVICES),
             "clusters": list(cluster_presets())}[what]
    result = cli("list", what, "--json")
    assert result.code == 0, result
    rows = json.loads(result.out)
    assert [row["name"] for row in rows] == names
    text = cli("list", what)
    assert text.code == 0 and all(name in text.out for name in names)


def test_plain_list_lists_the_families(cli):
    assert cli("list").out == cli("list", "families").out


def test_list_models_gives_parameter_counts(cli):
    rows = {row["name"]: row for row in json.loads(cli("list", "models", "--json").out)}
    assert rows["llama3-70b"]["parameters_billion"] == pytest.approx(70.55, abs=0.01)
    assert rows["llama3-8b"]["num_layers"] == 32


def test_piped_tables_are_not_squeezed_to_80_columns(cli):
    widest = max(len(line) for line in cli("list").out.splitlines())
    assert widest > 100  # the summary column stays on one line


@pytest.mark.parametrize(("argv", "fragments"), [
    (("costs", "--model", "tiny", "--device", "h100"), ["device='h100'", "did you mean h100-sxm?"]),
    (("costs", "--model", "llama3-70", "--device", "h100-sxm"), ["model='llama3-70'", "did you mean llama3-70b?"]),
    (("simulate", "1f1b", "-p", "4", "-m", "8", "--cluster", "4x8h100"), ["did you mean 4x8-h100?"]),
    (("show", "zbv"), ["schedule='zbv'", "did you mean zb-v?"]),
    (("list", "model"), ["list='model'", "did you mean models?"]),
    (("shw",), ["No such command 'shw'", "did you mean show?"]),
])
def test_a_misspelled_name_gets_the_closest_one(cli, argv, fragments):
    assert_one_line_error(cli(*argv), *fragments)


def test_validate_json_reports_a_valid_file_and_the_violations_of_a_broken_one(cli, tmp_path):
    good = tmp_path / "good.txt"
    cli("show", "1f1b", "-p", "2", "-m", "2", "-o", str(good))
    result = cli("validate", str(good), "--json")
    assert result.code == 0
    data = json.loads(result.out)
    assert data["valid"] and (data["p"], data["num_stages"], data["m"], data["num_ops"]) == (2, 2, 2, 8)
    broken = tmp_path / "broken.txt"
    broken.write_text("d0: 0F0 0F1 0B0\nd1: 1F0 1B0 1F1 1B1\n")
    result = cli("validate", str(broken), "--json")
    assert result.code == 1
    data = json.loads(result.out)
    assert not data["valid"] and data["violation_count"] == 1
    assert data["violations"][0]["kind"] == "missing" and data["violations"][0]["ops"] == ["0B1"]


def test_a_long_report_lists_50_violations_and_counts_the_rest(cli, tmp_path):
    path = tmp_path / "sparse.txt"
    path.write_text("# microbatches: 400\nd0: 0F0 0B0\n")
    result = cli("validate", str(path))
    assert result.code == 1
    lines = result.out.splitlines()
    assert lines[0].endswith("399 violations")  # one per incomplete stage-microbatch: F and B of 399
    assert "  ... and 349 more: 349 missing" in lines
    assert len(result.out) < 10_000


def test_show_help_examples_are_accepted(cli):
    # hanayo takes its number of waves; a family refuses an option it does not take
    assert cli("show", "zb-v", "-p", "4", "-m", "8", "--set", "activation_limit=6").code == 0
    assert cli("show", "hanayo", "-p", "4", "-m", "8", "--set", "waves=2").code == 0
    refused = cli("show", "1f1b", "-p", "4", "-m", "8", "--set", "waves=2")
    assert refused.code == 2 and "waves" in refused.err


def test_status_line_shows_on_a_terminal_after_a_delay_and_is_erased(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    clock = iter([0.0, 0.5, 2.0, 3.0])
    monkeypatch.setattr("pipesched.cli.progress.time.monotonic", lambda: next(clock))
    with StatusLine("run gpipe", stream=stream) as line:
        line("step 1")  # at 0.5 s: too early
        assert stream.getvalue() == ""
        line("step 2")  # at 2 s
        assert stream.getvalue() == "\rrun gpipe: step 2 (2 s)\x1b[K"
    assert stream.getvalue().endswith("\r\x1b[K")  # erased at the end
    piped = io.StringIO()
    monkeypatch.setattr("pipesched.cli.progress.time.monotonic", lambda: 10.0)
    StatusLine("run", stream=piped)("step 1")
    assert piped.getvalue() == ""  # never on a pipe or file


def test_launch_status_names_the_slowest_rank():
    assert status_line([(0, 2, 5, 1), (0, 1, 7, 1)], ["gpipe"]) == "gpipe, step 2, op 8 (slowest rank)"
    assert status_line([(0, 0, 0, 1), (0, 0, 0, 0)], ["gpipe"]) == "1 of 2 ranks started"


def test_readme_lists_every_limit():
    from pathlib import Path

    from pipesched.limits import LIMITS

    def shown(value):
        if isinstance(value, int):
            return f"{value:,}"
        return f"{int(value):,}" if float(value).is_integer() and value < 1e6 else f"{value:g}"

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Limits", 1)[1].split("\n\n")[2]
    assert table.splitlines()[2:] == [f"| {what} | {shown(value)} |" for _, value, what in LIMITS]


def test_readme_lists_every_default():
    import dataclasses
    from pathlib import Path

    from pipesched.defaults import DEFAULTS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Defaults", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3].strip() for line in section.splitlines()
            if line.startswith("| `")}
    for field in dataclasses.fields(DEFAULTS):
        value = getattr(DEFAULTS, field.name)
        assert rows.get(field.name) == (str(value).lower() if isinstance(value, bool) else str(value)), field.name


def test_real_run_commands_start_from_the_defaults():
    import inspect

    from pipesched.cli.run import check_command, profile_command, run_command
    from pipesched.defaults import DEFAULTS

    for command in (run_command, profile_command, check_command):
        parameters = inspect.signature(command).parameters
        assert parameters["model"].default == DEFAULTS.run_model, command.__name__
        assert parameters["seq_len"].default == DEFAULTS.run_seq_len
        assert parameters["micro_batch_size"].default == DEFAULTS.run_micro_batch_size
        assert parameters["dtype"].default == DEFAULTS.run_dtype
