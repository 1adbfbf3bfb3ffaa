"""`pipesched list / show / validate`: exit codes, one-line errors, files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cli_helpers import assert_one_line_error
from pipesched import io
from pipesched.generators import generate


def test_list_shows_every_family(cli) -> None:
    result = cli("list")
    assert result.code == 0
    assert "gpipe" in result.out and "1f1b" in result.out


def test_show_prints_grid_and_both_levels(cli) -> None:
    result = cli("show", "1f1b", "-p", "4", "-m", "8")
    assert result.code == 0
    assert "d3: .   .   .   3F0 3B0" in result.out
    assert "slot makespan 33" in result.out and "formula: makespan 33" in result.out


def test_show_writes_each_format_that_loads_back(cli, tmp_path) -> None:
    for fmt, suffix in (("grid", ".txt"), ("csv", ".csv"), ("json", ".json")):
        path = tmp_path / f"s{suffix}"
        result = cli("show", "gpipe", "-p", "3", "-m", "4", "--format", fmt, "-o", str(path))
        assert result.code == 0, result
        assert io.load_schedule(path).device_ops == generate("gpipe", 3, 4).device_ops


def test_show_bad_input_is_one_line(cli, tmp_path) -> None:
    assert_one_line_error(cli("show", "nope"), "unknown family", "gpipe")
    assert_one_line_error(cli("show", "1f1b", "-p", "1"), "p=1")
    assert_one_line_error(cli("show", "1f1b", "-m", "0"), "m=0")
    assert_one_line_error(cli("show", "1f1b", "--format", "xml"), "format")
    assert_one_line_error(cli("show", "1f1b", "-o", str(tmp_path / "missing" / "s.txt")), "does not exist")
    assert_one_line_error(cli("show", "1f1b", "--set", "waves"), "KEY=VALUE")
    assert_one_line_error(cli("show", "1f1b", "--set", "waves=2"), "option=waves")
    assert list(tmp_path.iterdir()) == []


def test_show_takes_the_published_variants_options(cli) -> None:
    plain = cli("show", "chimera", "-p", "4", "-m", "8", "--set", "forward_doubling=0")
    assert plain.code == 0 and "slot makespan 30" in plain.out
    doubled = cli("show", "chimera", "-p", "4", "-m", "8")
    assert doubled.code == 0 and "slot makespan 27" in doubled.out
    waves = cli("show", "hanayo", "-p", "4", "-m", "8", "--set", "waves=2")
    assert waves.code == 0 and "slot makespan 108" in waves.out
    automatic = cli("show", "zb-2p", "-p", "4", "-m", "8", "--set", "latency=0.5", "--set", "m_w=0.25")
    assert automatic.code == 0 and '"latency": 0.5, "m": 8, "m_w": 0.25' in automatic.out
    assert_one_line_error(cli("show", "chimera", "--set", "forward_doubling=yes"), "forward_doubling=yes")
    assert_one_line_error(cli("show", "zb-1p", "--set", "m_w=2"), "m_w=2")
    assert_one_line_error(cli("show", "zb-1p", "--set", "activation_limit=0"), "activation_limit=0")
    assert_one_line_error(cli("show", "hanayo", "-v", "4", "--set", "waves=3"), "waves=3")


def test_validate_exit_codes(cli, tmp_path) -> None:
    good = tmp_path / "good.txt"
    io.save_schedule(generate("1f1b", 2, 3), good)
    assert cli("validate", str(good)).code == 0
    cycle = tmp_path / "cycle.txt"
    cycle.write_text("d0: 0F0 0B0 0F1 0B1\nd1: 1F1 1F0 1B0 1B1\n")
    result = cli("validate", str(cycle))
    assert result.code == 1 and "deadlock" in result.out and "<-- ERROR HERE" in result.out
    over = tmp_path / "gpipe.csv"
    io.save_schedule(generate("gpipe", 2, 4), over)
    assert cli("validate", str(over), "--activation-limit", "4").code == 0
    assert cli("validate", str(over), "--activation-limit", "2").code == 1
    bad = tmp_path / "bad.txt"
    bad.write_text("d0: 0F0 0B0\nd1: 1F0 1Z0\n")
    assert_one_line_error(cli("validate", str(bad)), "bad.txt:2:9", "1Z0")
    assert_one_line_error(cli("validate", str(tmp_path / "none.txt")), "no such file")


@pytest.mark.slow
def test_console_script_exits_2_without_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipesched", "show", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_show_and_compare_name_their_slot_units_and_agree_on_them(cli) -> None:
    # zb-v on 4 devices has 8 stages: each of its ops is half a 1F1B-stage op, and each of
    # its stage-microbatches holds half a 1F1B stage's activations
    shown = cli("show", "zb-v", "-p", "4", "-m", "8")
    assert shown.code == 0, shown
    line = next(text for text in shown.out.splitlines() if text.startswith("# slot makespan"))
    chunk_slots = float(line.split()[3])
    assert "stage-op slots" in line and "stage-microbatches" in line
    assert f"{chunk_slots / 2:g} in 1F1B-stage slots, as compare counts" in line
    assert "[8, 8, 8, 8] stage-microbatches (4 in 1F1B-stage units)" in line
    compared = json.loads(cli("compare", "--schedules", "zb-v", "-p", "4", "-m", "8", "--levels", "table",
                              "--json").out)
    record = compared["records"][0]
    # the key names the unit: slots and activations of a 1F1B stage
    assert record["iteration_time_slots"] == chunk_slots / 2 and record["peak_activation_units"] == 4.0
    printed = cli("compare", "--schedules", "zb-v", "-p", "4", "-m", "8", "--levels", "table").out
    assert "slots: time of a 1F1B stage op" in printed


ANSI = r"\x1b\[[0-9;]*m"


def test_show_on_a_terminal_prints_the_time_aligned_grid_within_columns(cli, monkeypatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)
    result = cli("show", "dualpipev", "-p", "4", "-m", "8")
    assert result.code == 0, result
    assert re.search(r"\x1b\[[0-9;]*4\dm|\x1b\[[0-9;]*48;", result.out)  # op backgrounds
    lines = [re.sub(ANSI, "", line) for line in result.out.splitlines()]
    assert all(len(line) <= 80 for line in lines)
    assert "time-aligned" in lines[0] and "(0F7;7B3)OVERLAP_F_B" not in result.out
    assert lines[-1].startswith("# formula:")  # the summary lines stay


def test_show_with_no_color_draws_the_grid_without_colour(cli, monkeypatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    result = cli("show", "dualpipev", "-p", "4", "-m", "8")
    assert result.code == 0, result
    assert not re.search(r"\x1b\[[0-9;]*(3|4)\dm|\x1b\[[0-9;]*(38|48);", result.out)
    assert "0F7&7B3────" in re.sub(ANSI, "", result.out)


def test_show_to_a_pipe_or_with_format_grid_keeps_the_grid_text(cli, monkeypatch) -> None:
    from pipesched import io

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    piped = cli("show", "dualpipev", "-p", "4", "-m", "8")
    assert piped.code == 0 and piped.out.startswith(io.dumps(generate("dualpipev", 4, 8), "grid"))
    monkeypatch.setenv("FORCE_COLOR", "1")
    explicit = cli("show", "dualpipev", "-p", "4", "-m", "8", "--format", "grid")
    assert explicit.out == piped.out
