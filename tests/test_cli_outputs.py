"""Output files and refused input, as a user types the commands: the format of `-o` follows
its extension, option combinations a command cannot honour are refused before any work, a
schedule file is validated before anything is printed or written, freeze plans are read
against the model first, output targets are new paths or regular files, and a command's
files are written all or none. Also: a rank that runs out of memory says so."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from pipesched import io
from pipesched.errors import PipeschedError
from pipesched.experiments.evaluation import Record
from pipesched.experiments.freeze_plan import evaluate_freeze_plan, parse_freeze_plan
from pipesched.experiments.point import Point
from pipesched.generators import generate
from pipesched.io import files
from pipesched.io.files import check_output_path
from pipesched.limits import MAX_FREEZE_RANGES
from pipesched.runtime import launch, worker

COSTS = ("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
         "0,1,1,1,2e9,1e6\n1,1,1,1,2e9,1e6\n2,1,1,1,2e9,1e6\n3,1,1,1,2e9,1e6\n")
# the default model, llama3-70b: the embedding, 80 blocks and the head
DEFAULT_LAYERS = 82


def _entries(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


# --- show -o and synthesize -o: the extension names the format ------------------------------------
# what each extension means, written out here independently of the code: JSON, PyTorch's
# compute-only CSV, grid text for the rest
BY_EXTENSION = {".json": "json", ".csv": "csv", ".txt": "grid", ".sched": "grid"}


@pytest.mark.parametrize("suffix", sorted(BY_EXTENSION))
def test_show_writes_the_format_its_output_file_names(cli, tmp_path, suffix):
    path = tmp_path / f"s{suffix}"
    result = cli("show", "gpipe", "-p", "3", "-m", "4", "-o", str(path))
    assert result.code == 0, result
    text = path.read_text(encoding="utf-8")
    fmt = BY_EXTENSION[suffix]
    if fmt == "json":
        assert json.loads(text)["name"] == "gpipe"
    if fmt == "csv":
        assert not text.startswith("#") and "0F0" in text.splitlines()[0].split(",")
    if fmt == "grid":
        assert text.startswith("# pipesched schedule")
    assert io.loads(text, fmt).device_ops == generate("gpipe", 3, 4).device_ops


@pytest.mark.parametrize(("fmt", "name"), [("grid", "s.json"), ("json", "s.csv"), ("csv", "s.json"),
                                           ("csv-comms", "s.txt"), ("json", "s.txt")])
def test_show_refuses_a_format_that_contradicts_the_extension(cli, tmp_path, fmt, name):
    result = cli("show", "1f1b", "-p", "2", "-m", "2", "--format", fmt, "-o", str(tmp_path / name))
    assert_one_line_error(result, f"format={fmt}", name)
    assert _entries(tmp_path) == []


def test_show_takes_a_format_the_extension_allows_or_does_not_name(cli, tmp_path):
    comms = tmp_path / "s.csv"
    assert cli("show", "1f1b", "-p", "2", "-m", "2", "--format", "csv-comms", "-o", str(comms)).code == 0
    assert "SEND_F" in comms.read_text(encoding="utf-8") or "RECV_F" in comms.read_text(encoding="utf-8")
    other = tmp_path / "s.sched"
    assert cli("show", "1f1b", "-p", "2", "-m", "2", "--format", "json", "-o", str(other)).code == 0
    assert json.loads(other.read_text(encoding="utf-8"))["name"] == "1f1b"


def test_synthesize_writes_the_format_its_output_names_with_its_pictures(cli, tmp_path):
    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS.replace("3,1,1,1,2e9,1e6\n", "").replace("2,1,1,1,2e9,1e6\n", ""), encoding="utf-8")
    schedule, trace = tmp_path / "synth.json", tmp_path / "synth.trace.json"
    result = cli("synthesize", "-p", "2", "-m", "2", "--stage-costs", str(costs), "--time-limit", "5",
                 "--no-timeline", "-o", str(schedule), "--perfetto", str(trace))
    assert result.code == 0, result
    assert json.loads(schedule.read_text(encoding="utf-8"))["format"] == "pipesched-schedule"
    assert "traceEvents" in json.loads(trace.read_text(encoding="utf-8"))
    same = cli("synthesize", "-p", "2", "-m", "2", "--stage-costs", str(costs), "--time-limit", "5",
               "-o", str(tmp_path / "x.json"), "--perfetto", str(tmp_path / "x.json"))
    assert_one_line_error(same, "x.json", "the same file")


# --- combinations a command cannot honour, and invalid schedule files --------------------------------
def _plan(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "plan.csv"
    path.write_text("\n".join(["start,end,frozen_layers", *rows]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("layers", "fragments"), [
    ("0-900", ["plan.csv:3", "frozen_layers=0-900", f"outside the {DEFAULT_LAYERS} layers"]),
    ("nan", ["plan.csv:3", "frozen_layers='nan'"]),
    ("NaN%", ["plan.csv:3", "fraction"]),
    ("1.5", ["plan.csv:3", "fraction"]),
])
def test_a_freeze_plan_naming_layers_the_model_lacks_is_refused(cli, tmp_path, layers, fragments):
    plan = _plan(tmp_path, "0,10,", f'10,20,"{layers}"')
    for command in (("simulate", "1f1b"), ("compare", "--schedules", "1f1b,zb-h1")):
        assert_one_line_error(cli(*command, "-p", "4", "-m", "4", "--freeze-plan", str(plan)), *fragments)


@pytest.mark.parametrize(("flag", "value"), [("--png", "p.png"), ("--html", "r.html"), ("--perfetto", "t.json"),
                                             ("--jitter", "0.1"), ("--straggler", "0:2"), ("--frozen-layers", "0-3")])
def test_freeze_plan_refuses_the_options_it_cannot_honour(cli, tmp_path, flag, value):
    plan = _plan(tmp_path, "0,10,")
    argv = [flag, str(tmp_path / value) if flag in ("--png", "--html", "--perfetto") else value]
    for command in (("simulate", "1f1b"), ("compare", "--schedules", "1f1b")):
        result = cli(*command, "-p", "4", "-m", "4", "--freeze-plan", str(plan), *argv)
        assert_one_line_error(result, f"{flag.lstrip('-')}=", "--freeze-plan")
    assert _entries(tmp_path) == ["plan.csv"]


def test_compare_refuses_levels_a_freeze_plan_does_not_evaluate(cli, tmp_path):
    plan = _plan(tmp_path, "0,10,")
    result = cli("compare", "--schedules", "1f1b", "-p", "4", "-m", "4", "--freeze-plan", str(plan),
                 "--levels", "formula,table")
    assert_one_line_error(result, "levels=formula,table", "--freeze-plan")


def test_a_freeze_plan_range_no_schedule_can_run_is_an_error(cli, tmp_path, monkeypatch):
    from pipesched.experiments import freeze_plan

    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS, encoding="utf-8")
    plan = _plan(tmp_path, "0,10,", "10,20,0-1")
    real = freeze_plan._simulate

    def fails_when_frozen(point: Point) -> Record:
        return Record(point, error="sim: cannot run") if point.frozen_layers else real(point)

    monkeypatch.setattr(freeze_plan, "_simulate", fails_when_frozen)
    result = cli("simulate", "1f1b", "-p", "4", "-m", "4", "--stage-costs", str(costs), "--freeze-plan", str(plan))
    assert_one_line_error(result, "plan.csv:3", "no schedule could run steps 10..19", "cannot run")
    assert result.out == ""


def test_a_freeze_plan_over_the_limit_is_refused_before_it_is_read_whole(cli, tmp_path):
    rows = [f'{k},{k + 1},"{k % 40}-{40 + k % 41},{k % 82}"' for k in range(10_000)]
    plan = _plan(tmp_path, *rows)
    begun = time.monotonic()
    result = cli("simulate", "1f1b", "-p", "4", "-m", "4", "--freeze-plan", str(plan))
    assert_one_line_error(result, "freeze_plan=", f"over the limit of {MAX_FREEZE_RANGES:,} step ranges")
    assert time.monotonic() - begun < 10
    within = "\n".join(["start,end,frozen_layers", *rows[:MAX_FREEZE_RANGES]])
    assert len(parse_freeze_plan(within).ranges) == MAX_FREEZE_RANGES


def test_a_freeze_plan_simulates_each_distinct_frozen_set_once(tmp_path):
    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS, encoding="utf-8")
    from pipesched.io.stage_costs import load_stage_costs

    stage_costs = load_stage_costs(costs)
    # five ranges, three frozen sets: none, rows 0-1 (written two ways), row 0
    plan = parse_freeze_plan("start,end,frozen_layers\n0,1,\n1,2,0-1\n2,3,\"0,1\"\n3,4,0\n4,5,0-1\n")
    points = [Point(name, p=4, m=4, stage_costs=stage_costs) for name in ("1f1b", "zb-h1")]
    ran: list[Point] = []

    def counting(function, jobs):
        for job in jobs:
            ran.append(job)
            yield function(job)

    result = evaluate_freeze_plan(plan, points, mapper=counting)
    assert len(ran) == 3 * len(points)
    # each range as it would be alone
    for freeze_range, found in zip(plan.ranges, result.ranges, strict=True):
        alone = evaluate_freeze_plan(parse_freeze_plan(f'start,end,frozen_layers\n0,1,"{freeze_range.frozen_layers}"\n'),
                                     points)
        assert found.iteration_time == alone.ranges[0].iteration_time
        assert found.best.point.family == alone.ranges[0].best.point.family


def _invalid_schedule(tmp_path: Path) -> Path:
    """1F1B on 2 devices, 2 microbatches, with 1F1 written as a second 1F0."""
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F0,1B1\n", encoding="utf-8")
    return path


def test_an_invalid_schedule_file_is_refused_before_anything_is_printed_or_written(cli, tmp_path):
    bad = _invalid_schedule(tmp_path)
    result = cli("show", str(bad))
    assert_one_line_error(result, f"schedule_file={bad}", "duplicate", "pipesched validate")
    assert result.out == ""
    for name in ("out.txt", "out.json"):
        assert_one_line_error(cli("show", str(bad), "-o", str(tmp_path / name)), "duplicate")
    assert_one_line_error(cli("show", str(bad), "--png", str(tmp_path / "g.png")), "duplicate")
    assert _entries(tmp_path) == ["bad.csv"]
    assert cli("validate", str(bad)).code == 1  # validate still reports it


def test_a_schedule_file_takes_no_family_option(cli, tmp_path):
    good = tmp_path / "good.csv"
    assert cli("show", "1f1b", "-p", "2", "-m", "2", "-o", str(good)).code == 0
    costs = tmp_path / "costs.csv"
    costs.write_text(COSTS.replace("3,1,1,1,2e9,1e6\n", "").replace("2,1,1,1,2e9,1e6\n", ""), encoding="utf-8")
    for command in (("simulate", str(good), "--stage-costs", str(costs)), ("show", str(good))):
        assert_one_line_error(cli(*command, "--set", "activation_limit=3"), "activation_limit=3", "schedule file",
                              "drop --set activation_limit")
    # the slot costs are no family's option: show draws a file's slot table with them ...
    assert cli("show", str(good), "--set", "costs=1,2,1").code == 0
    # ... but simulate costs the ops from the workload: only a family that plans with slot
    # costs takes them there
    for schedule in (str(good), "1f1b"):
        result = cli("simulate", schedule, *(["-p", "2", "-m", "2"] if schedule == "1f1b" else []),
                     "--stage-costs", str(costs), "--set", "costs=1,2,1")
        assert_one_line_error(result, "costs=1,2,1", "drop --set costs")
    planned = cli("simulate", "zb-h1", "-p", "2", "-m", "2", "--stage-costs", str(costs), "--set", "costs=1,2,1",
                  "--json")
    assert planned.code == 0, planned


# --- output targets --------------------------------------------------------------------------------
def test_output_onto_a_link_or_a_pipe_is_refused_and_left_alone(cli, tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("keep", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    assert_one_line_error(cli("show", "1f1b", "-o", str(link)), "link.txt", "symbolic link")
    assert_one_line_error(cli("show", "1f1b", "--svg", str(fifo)), "pipe.txt", "FIFO")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "keep"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_character_device_is_no_output_file():
    with pytest.raises(PipeschedError, match=r"^output=/dev/null: is a character device"):
        check_output_path("/dev/null")


def test_two_outputs_onto_one_file_are_refused(cli, tmp_path):
    same = str(tmp_path / "a.json")
    assert_one_line_error(cli("show", "1f1b", "-o", same, "--perfetto", same), "the same file")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "2", "--png", same, "--svg", same),
                          "the same file")
    assert _entries(tmp_path) == []


def test_a_run_whose_second_output_fails_replaces_none(cli, tmp_path, monkeypatch):
    keep = tmp_path / "keep.png"
    keep.write_bytes(b"the picture of an earlier run")
    full = tmp_path / "full"
    full.mkdir()
    fill = files._fill

    def disk_full_in(fd: int, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(full)):
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fill(fd, data)

    monkeypatch.setattr(files, "_fill", disk_full_in)
    result = cli("show", "1f1b", "-p", "2", "-m", "2", "--png", str(keep), "--perfetto", str(full / "t.json"))
    assert_one_line_error(result, "trace=", "No space left on device")
    assert keep.read_bytes() == b"the picture of an earlier run"
    assert _entries(tmp_path) == ["full", "keep.png"] and _entries(full) == []
    schedule = tmp_path / "s.txt"
    result = cli("show", "1f1b", "-p", "2", "-m", "2", "-o", str(schedule), "--perfetto", str(full / "t.json"))
    assert result.code == 2 and not schedule.exists()


# --- a rank that runs out of memory ----------------------------------------------------------------
class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError (a RuntimeError), which CUDA's allocator raises."""


def _wrapped(cause: BaseException) -> BaseException:
    """``cause`` as PyTorch's schedule runtime passes it on: wrapped in its own error."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise RuntimeError("Failed to run stage backward for stage 1") from exc
    except RuntimeError as wrapped:
        return wrapped


@pytest.mark.parametrize("cause", [
    OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 8589934592 bytes."),
    MemoryError(),
    OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)),
], ids=["cuda", "cpu-allocator", "python", "enomem"])
def test_a_rank_out_of_memory_names_memory_and_a_fix(tmp_path, cause):
    worker._report_error(tmp_path, 1, _wrapped(cause))

    class Running:  # rank 0, still waiting for its peer
        returncode = None

    class Exited:  # rank 1, exited with an error status after its report
        returncode = 1

    message = launch._failure_message([Running(), Exited()], tmp_path, {1: 0.0})
    assert message.startswith("rank 1 failed: RuntimeError: Failed to run stage backward")
    assert "out of memory" in message and type(cause).__name__ in message
    assert all(flag in message for flag in ("--model", "-b", "-s"))
    assert len(message) < 500 and "\n" not in message


def test_a_rank_killed_by_signal_9_names_memory_and_a_fix():
    class Killed:
        returncode = -9

    message = launch._failure_message([Killed()], Path("/nonexistent"), {0: 0.0})
    assert message.startswith("rank 0 failed first: killed by SIGKILL")
    assert "out of memory" in message and all(flag in message for flag in ("--model", "-b", "-s"))


def test_a_rank_error_that_is_not_memory_is_left_as_it_is():
    message = launch.rank_error_message(_wrapped(ValueError("shape mismatch")))
    assert message == "RuntimeError: Failed to run stage backward for stage 1"
    long = launch.rank_error_message(RuntimeError("x" * 1000))
    assert len(long) <= launch.MESSAGE_CHARS + 4 and long.endswith(" ...")


# --- one JSON shape on stdout -----------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ("list", "--json"),
    ("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-b", "1", "-s", "4096", "--json"),
    ("synthesize", "-p", "2", "-m", "4", "--model", "tiny", "--cluster", "1x8-h100", "-t", "1", "--time-limit", "1",
     "--json"),
    ("simulate", "1f1b", "-p", "2", "-m", "4", "--json"),
])
def test_every_json_output_is_one_document_indented_by_one(cli, argv):
    result = cli(*argv)
    assert result.code == 0, result.err
    assert result.out == json.dumps(json.loads(result.out), indent=1) + "\n"


def test_validate_json_is_indented_by_one(cli, tmp_path):
    path = tmp_path / "s.json"
    assert cli("show", "1f1b", "-p", "2", "-m", "2", "-o", str(path)).code == 0
    result = cli("validate", str(path), "--json")
    assert result.code == 0 and json.loads(result.out)["valid"] is True
    assert result.out == json.dumps(json.loads(result.out), indent=1) + "\n"
