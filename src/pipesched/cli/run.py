"""`pipesched run`, `profile`, `check`: real PyTorch runs, layer profiling, and the
simulator's error against real runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from rich.table import Table

from pipesched.cli.options import (
    AsJson,
    Backend,
    Chunks,
    FamilySettings,
    OptionGroup,
    RunDevices,
    RunDtype,
    RunMicrobatches,
    RunMicroBatchSize,
    RunModel,
    RunSeqLen,
    Runtime,
    Steps,
    Timeout,
    Warmup,
    command,
    split_names,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_json, wrote
from pipesched.cli.profile_collectives import CollectiveOptions, profile_collectives_command
from pipesched.cli.progress import StatusLine
from pipesched.cli.schedules import load_or_generate
from pipesched.cli.views import ViewPaths
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.generators import FAMILIES
from pipesched.io.files import check_outputs
from pipesched.model import load_model
from pipesched.render.terminal import timeline_view
from pipesched.render.views import write_check_views
from pipesched.runtime.check import check_schedules
from pipesched.runtime.launch import Fault as FaultSpec
from pipesched.runtime.profile import ProfileOptions
from pipesched.runtime.profiling import ProfileRequest, profile_to_files
from pipesched.runtime.runs import RunOptions, check_runnable, run_schedules
from pipesched.schedule import Schedule

RunSchedule = Annotated[str, typer.Argument(metavar="SCHEDULE|FILE", help="schedule family or schedule file")]
CheckSchedules = Annotated[str, typer.Option(
    "--schedules", help="comma-separated families or schedule files, e.g. gpipe,1f1b,zb-h1")]
CheckTrace = Annotated[str | None, typer.Option(
    "--perfetto", help="write both timelines of every schedule as one Perfetto trace: two processes per device")]
CheckHtml = Annotated[str | None, typer.Option(
    "--html", help="write the comparison page: predicted over measured timelines, deviations, step times")]
Fault = Annotated[str | None, typer.Option("--inject-fault", hidden=True, help="crash:RANK, hang:RANK or kill:RANK (tests)")]

_RUNTIME_NAMES = {"pytorch": "PyTorch _PipelineScheduleRuntime", "ours": "pipesched executor"}


def _schedule(name: str, p: int | None, m: int | None, v: int | None, settings: list[str] | None) -> Schedule:
    """A family at the real-run sizes (-p and -m, else DEFAULTS.run_p and run_m), or a
    schedule file at its own."""
    schedule = load_or_generate(name, p=p, m=m, v=v, settings=settings, default_p=DEFAULTS.run_p,
                                default_m=DEFAULTS.run_m)
    check_runnable(schedule)  # before a model is built or a rank started
    return schedule


# what each figure of the check table is (pipesched.runtime.check)
CHECK_LEGEND = ("predicted: every op at the median of its profiled repeats; p50 / p99: the same costs with every op "
                "drawn independently from its repeats (factors over their median: equal repeats give p50 = predicted); "
                "measured: the median step, whose timeline --html draws; a pair of schedules is judged when the "
                "difference of their medians exceeds each one's step-time IQR")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


# --- run ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RealRunOptions(OptionGroup):
    """A real run: the model and its sizes, the backend and runtime, the steps measured."""

    model: RunModel = DEFAULTS.run_model
    backend: Backend = "gloo"
    steps: Steps = DEFAULTS.run_steps
    warmup: Warmup = DEFAULTS.run_warmup
    runtime: Runtime = "auto"
    micro_batch_size: RunMicroBatchSize = DEFAULTS.run_micro_batch_size
    seq_len: RunSeqLen = DEFAULTS.run_seq_len
    dtype: RunDtype = DEFAULTS.run_dtype
    timeout: Timeout = DEFAULTS.run_timeout

    def options(self) -> RunOptions:
        """What every rank runs with."""
        return RunOptions(micro_batch_size=self.micro_batch_size, seq_len=self.seq_len, dtype=self.dtype,
                          backend=self.backend, steps=self.steps, warmup=self.warmup, timeout_s=self.timeout)


@command
def run_command(*, schedule_name: RunSchedule, p: RunDevices = None, m: RunMicrobatches = None, v: Chunks = None,
                family_settings: FamilySettings = None, real: RealRunOptions, as_json: AsJson = False,
                views: ViewPaths, inject_fault: Fault = None) -> None:
    """Run a schedule for real on P local ranks (gloo on CPU, NCCL on GPUs): median step time
    after warm-up and the measured timeline of every op on every rank (--png/--svg/--perfetto/--html
    draw the median step).

    \b
    Examples:
      pipesched run zb-h1 -p 2 -m 4 --model tiny -s 16 --steps 2 --warmup 1
    """
    views.check()
    schedule = _schedule(schedule_name, p, m, v, family_settings)
    spec, options = load_model(real.model), real.options()
    fault = FaultSpec.parse(inject_fault) if inject_fault else None
    with StatusLine(f"run {schedule.name} ({options.warmup} warm-up + {options.steps} steps)") as status:
        result = run_schedules([schedule], spec, options=options, runtime=real.runtime, fault=fault,
                               on_status=status)[0]
    views.write([result.timeline], title=f"{schedule.name}: measured on {result.runtime}, {result.backend} "
                                         f"(median of {len(result.step_times)} steps)")
    if as_json:
        print_json(result.to_dict(spec.name))
        return
    _print_run(schedule, spec.name, options, result)


def _print_run(schedule: Schedule, model_name: str, options: RunOptions, result) -> None:
    console = output_console()
    table = Table(title=f"{schedule.name}: p={schedule.num_devices}, m={schedule.num_microbatches}, "
                        f"{schedule.num_stages} stages; {model_name} ({result.timeline.measured.partition}), "
                        f"micro-batch {options.micro_batch_size} x {options.seq_len}, {options.dtype}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("runtime", f"{result.runtime} ({_RUNTIME_NAMES[result.runtime]}), {result.backend}")
    table.add_row("median step time", f"{_ms(result.step_time)} ms")
    table.add_row(f"steps ({options.steps} after {options.warmup} warm-up)",
                  ", ".join(_ms(t) for t in result.step_times) + " ms")
    table.add_row("loss (mean over microbatches)", f"{result.loss:.6f}")
    busy = result.timeline.busy_per_device()
    table.add_row("busy per rank (median step)", ", ".join(_ms(b) for b in busy) + " ms")
    table.add_row("bubble ratio (median step)", f"{result.timeline.bubble_ratio():.3f}")
    console.print(table)
    console.print(timeline_view(result.timeline, width=min(console.width, 160)))


# --- profile -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasureOptions(OptionGroup):
    """How each op is timed: on which device, at which sizes, how many times."""

    device: Annotated[str, typer.Option("--device", help="cpu or cuda")] = "cpu"
    micro_batch_size: RunMicroBatchSize = DEFAULTS.run_micro_batch_size
    seq_len: RunSeqLen = DEFAULTS.run_seq_len
    dtype: RunDtype = DEFAULTS.run_dtype
    repeats: Annotated[int, typer.Option(
        "--repeats", help="timed repeats per op (the median is the cost; every repeat goes to "
                          "FILE.repeats.csv)")] = 10
    warmup: Annotated[int, typer.Option("--warmup", help="untimed repeats first")] = 3
    ranks: Annotated[int, typer.Option(
        "--ranks", help="ranks timing at once, each on its own core or GPU (load the machine as a run with that "
                        "many ranks does)")] = 1

    def options(self) -> ProfileOptions:
        return ProfileOptions(micro_batch_size=self.micro_batch_size, seq_len=self.seq_len, dtype=self.dtype,
                              device=self.device, repeats=self.repeats, warmup=self.warmup, ranks=self.ranks)


@dataclass(frozen=True)
class CostFileOptions(OptionGroup):
    """What the cost file holds: per layer, or per stage of p ranks, and the link."""

    output: Annotated[str, typer.Option(
        "-o", "--output", help="cost file to write: CSV per layer, or per stage with -p; .yaml: a per-layer model "
                               "file headed by how it was measured; every repeat goes to FILE.repeats.csv")] = \
        "costs.csv"
    p: Annotated[int | None, typer.Option("-p", help="write per-stage costs for p ranks")] = None
    v: Annotated[int, typer.Option("-v", help="stages per rank, with -p")] = 1
    partition: Annotated[str | None, typer.Option(
        "--partition", help="layers per stage like 3|4|3, with -p (default: uniform)")] = None
    runtime: Annotated[str, typer.Option(
        "--runtime", help="whose per-op overhead to add to per-stage costs: ours or pytorch")] = "ours"
    link: Annotated[bool, typer.Option("--link/--no-link", help="measure rank-to-rank latency and bandwidth")] = True

    def request(self) -> ProfileRequest:
        """The files to write; a bad output path fails here, before the model is loaded."""
        request = ProfileRequest(self.output, p=self.p, v=self.v, partition=self.partition, runtime=self.runtime,
                                 link=self.link)
        request.paths()
        return request


@command
def profile_command(*, model: RunModel = DEFAULTS.run_model, measure: MeasureOptions, files: CostFileOptions,
                    collective: CollectiveOptions, as_json: AsJson = False) -> None:
    """Measure layer (or stage) op times in isolation, the runtime's per-op overhead and the
    link between ranks; write the cost CSV the simulator reads, the link beside it
    (FILE.link.yaml) and every timed repeat (FILE.repeats.csv, what `simulate --jitter-file`
    draws from). With --collectives: time the collectives on --ranks ranks and write their
    calibration as a cluster file's link.

    \b
    Examples:
      pipesched profile --model tiny -s 16 --repeats 3 --no-link -o tiny.csv
      pipesched profile --collectives --ranks 2 --sizes 4KiB,1MiB -o link.yaml
    """
    if collective.collectives:
        return profile_collectives_command(collective, ranks=measure.ranks, device=measure.device,
                                           repeats=measure.repeats, warmup=measure.warmup, output=files.output,
                                           as_json=as_json)
    request = files.request()
    spec = load_model(model)
    options = measure.options()
    with StatusLine(f"profile {spec.name}") as status:
        summary = profile_to_files(spec, options, request, on_status=status)
    target, link_path, repeats_path = request.paths()
    if as_json:
        print_json(summary)
        return
    wrote(target, f" ({summary['partition']})" if "partition" in summary else "")
    wrote(repeats_path, f" (every timed repeat: simulate --jitter-file {repeats_path})")
    if "per_op_overhead_s" in summary:
        typer.echo(f"per-op overhead of the {files.runtime} runtime: {summary['per_op_overhead_s'] * 1e6:.0f} us (included)")
    if files.link:
        wrote(link_path)
        typer.echo(f"simulate with --stage-costs {target} --latency {summary['latency_s']:.6g} "
                   f"--bandwidth {summary['bandwidth_bytes_per_s']:.6g}")


# --- check ---------------------------------------------------------------------------------
@command
def check_command(*, schedules: CheckSchedules, p: RunDevices = None, m: RunMicrobatches = None, v: Chunks = None,
                  real: RealRunOptions, as_json: AsJson = False, trace: CheckTrace = None,
                  html: CheckHtml = None) -> None:
    """Profile in isolation, simulate, run for real, and compare: predicted vs measured step
    time per schedule, the error, and whether the ranking of the schedules agrees.

    \b
    Examples:
      pipesched check --schedules gpipe,1f1b -p 2 -m 4 --model tiny -s 16 --steps 2 --warmup 1
    """
    check_outputs((("trace", trace), ("html", html)))
    built = _check_schedules(schedules, p, m, v)
    p, m = built[0].num_devices, built[0].num_microbatches
    with StatusLine(f"check {', '.join(split_names(schedules))}") as status:
        report = check_schedules(built, load_model(real.model), options=real.options(), runtime=real.runtime,
                                 on_status=status)
    for path in write_check_views(report, html=html, trace=trace, title=f"prediction check: {real.model}, p={p}, m={m}"):
        wrote(path)
    if as_json:
        print_json(report.to_dict(model=real.model, p=p, m=m))
        return
    _print_check(report, real, p, m)


def _check_schedules(schedules: str, p: int | None, m: int | None, v: int | None) -> list[Schedule]:
    """The schedules ``--schedules`` names, at one size (``v`` for the families that take it)."""
    names = split_names(schedules)
    require(len(names) >= 1, "schedules", schedules, "give at least one schedule family")
    built = [_schedule(name, p, m, v if FAMILIES.get(name) is not None and FAMILIES[name].takes_v else None, None)
             for name in names]
    for schedule in built[1:]:
        require(schedule.num_devices == built[0].num_devices, "schedules", schedule.name,
                f"has {schedule.num_devices} devices and {built[0].name} {built[0].num_devices}; compare schedules "
                "of one size")
    return built


def _print_check(report, real: RealRunOptions, p: int, m: int) -> None:
    console = output_console()
    table = Table(title=f"prediction check: {real.model}, p={p}, m={m}, micro-batch {real.micro_batch_size} x "
                        f"{real.seq_len}, {real.dtype}, {real.backend}")
    for column in ("schedule", "runtime", "predicted ms", "measured ms", "error", "predicted p50 / p99 (std) ms",
                   "measured min / max (IQR) ms"):
        table.add_column(column, justify="left" if column in ("schedule", "runtime") else "right")
    for row in report.rows:
        steps = row.measured_spread
        predicted = "-" if row.spread is None else (
            f"{_ms(row.spread.time.p50)} / {_ms(row.spread.time.p99)} ({row.spread.time.std * 1e3:.2f})")
        iqr = "-" if row.measured_iqr is None else f"{row.measured_iqr * 1e3:.2f}"
        table.add_row(row.schedule.name, row.run.runtime, _ms(row.predicted_s), _ms(row.measured_s), f"{row.error:+.1%}",
                      predicted, f"{_ms(steps.min)} / {_ms(steps.max)} ({iqr})")
    console.print(table)
    console.print(CHECK_LEGEND, highlight=False)
    console.print(f"median |error| {report.median_abs_error:.1%}; {report.ranking_verdict} "
                  f"(predicted {' < '.join(report.predicted_order)}; measured {' < '.join(report.measured_order)})",
                  highlight=False)
    overheads = ", ".join(f"{name} {seconds * 1e6:.0f} us" for name, seconds in report.overhead_s.items())
    console.print(f"link {report.link.latency * 1e6:.0f} us, {report.link.bandwidth / 1e9:.2f} GB/s; "
                  f"per-op overhead {overheads}")


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("profile")(profile_command)
    app.command("check")(check_command)
