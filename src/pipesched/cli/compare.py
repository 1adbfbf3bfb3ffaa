"""`pipesched compare`: schedule families side by side at the formula, table and simulation
levels, ranked, with the places where the ranking changes marked."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched.cli.groups import (
    EngineOptions,
    TrainingOptions,
    VariabilityOptions,
    WorkloadOptions,
)
from pipesched.cli.options import AsJson, ScheduleOptions, command, split_names
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_whole
from pipesched.cli.progress import LateProgress
from pipesched.cli.training import freeze_plan_option, report_freeze_plan
from pipesched.cli.views import ViewPaths
from pipesched.compare import LEVELS, RANKING, Comparison, compare
from pipesched.enums import Level, MemoryUnit, TimeUnit
from pipesched.errors import PipeschedError
from pipesched.experiments.evaluation import check_levels
from pipesched.experiments.point import Point, points_for
from pipesched.units import GiB
from pipesched.wording import significant

LEVEL_TITLES = {Level.FORMULA: "formula (slots)", Level.TABLE: "table (slots)", Level.SIM: "simulated (s)"}
Schedules = Annotated[str | None, typer.Option("--schedules", help="comma-separated families [default: all]")]
ALL_LEVELS = ",".join(LEVELS)
Levels = Annotated[str, typer.Option("--levels", help="comma-separated: formula, table, sim")]


@command
def compare_command(*, schedules: Schedules = None, schedule: ScheduleOptions, levels: Levels = ALL_LEVELS,
                    workload: WorkloadOptions, training: TrainingOptions, engine: EngineOptions,
                    variability: VariabilityOptions, as_json: AsJson = False, views: ViewPaths) -> None:
    """Compare schedule families: iteration time, bubble ratio and peak memory under the
    closed forms, the slot table and the simulation, ranked per level; frozen, recomputed
    and offloaded work per device. With --freeze-plan: the best schedule of each step range
    and the total time. Without arguments: every family on the default scenario
    (Llama-3-70B-like model on 4 x 8 H100, p=8, m=32). With --jitter (or the other
    variability options) the simulated schedules are also ranked by their mean over Monte
    Carlo samples drawn on common random numbers, with p99, the chance that each is the
    fastest and how often the ranking flips.

    \b
    Examples:
      pipesched compare --schedules 1f1b,zb-h1,zb-v -p 4 -m 16
      pipesched compare --levels formula,table --json
      pipesched compare --schedules 1f1b,zb-v -p 4 -m 8 --jitter 0.1 --samples 200
    """
    views.check()
    plan = freeze_plan_option(training, views=views, variability=variability,
                              levels=None if split_names(levels) in (list(LEVELS), [Level.SIM]) else levels)
    chosen = check_levels(split_names(levels))
    names = split_names(schedules) if schedules else None
    point = _template(schedule, workload, training, engine).replace(variability=variability.model())
    (p, m), v = schedule.sizes(), schedule.v
    if plan is not None:
        report_freeze_plan(plan, points_for(point, names, p=p, m=m, v=v), as_json=as_json)
        return
    result = _compared(names, p=p, m=m, v=v, levels=chosen, workload=point, keep_timelines=views.any)
    views.write(result.timelines, comparison=result.to_wide_records(), title=_title(result),
                distributions=distribution_plots(result))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    print_comparison(result)


def _compared(names: list[str] | None, **settings: object) -> Comparison:
    """``compare`` with a progress line on a terminal; nothing compared is an error that says why."""
    progress = LateProgress()
    try:
        result = compare(names, progress=progress, **settings)
    finally:
        progress.close()
    if not result.results and result.skipped:
        name, reason = result.skipped[0]
        others = f" (and {len(result.skipped) - 1} more schedules)" if len(result.skipped) > 1 else ""
        raise PipeschedError(f"no schedule could be compared: {name}{others}: {reason}")
    return result


def _template(schedule: ScheduleOptions, workload: WorkloadOptions, training: TrainingOptions,
              engine: EngineOptions) -> Point:
    """The workload point every compared family runs on, with the family options and slot costs."""
    return workload.point(training, engine).replace(**schedule.request())


def _time(value: float, unit: str) -> str:
    return significant(value) if unit == TimeUnit.SECONDS else f"{value:g}"


def _memory(value: float, unit: str) -> str:
    return f"{value / GiB:.1f} GiB" if unit == MemoryUnit.BYTES else f"{value:g}"


def _title(result: Comparison) -> str:
    title = f"p={result.p}, m={result.m}" + (f", v={result.v}" if result.v else "")
    return title + (f"; {result.setup}" if result.setup else "")


def print_comparison(result: Comparison) -> None:
    """One wide table: a row per schedule (ordered by the last level's rank), for each level
    its time, bubble ratio, memory and rank; ``*`` marks a rank that changed from the level
    before."""
    console = output_console()
    last = result.levels[-1]
    order = result.ranking(last)
    title = f"p={result.p}, m={result.m}" + (f", v={result.v}" if result.v else "")
    if result.setup:
        title += f"; sim: {result.setup}"
    table = Table(title=title)
    table.add_column("schedule")
    # model and hardware FLOPs utilization, at the sim level of a model's workload
    utilization = any(r.mfu is not None for r in result.results)
    for level in result.levels:
        heading = LEVEL_TITLES[level]
        memory = "peak mem" if level == Level.SIM else "act. units"
        table.add_column(f"{heading}\ntime", justify="right")
        table.add_column("bubble", justify="right")
        if level == Level.SIM and utilization:
            table.add_column("MFU / HFU", justify="right")
        table.add_column(memory, justify="right")
        table.add_column("rank", justify="right")
    for name in order:
        cells = [name + (" (async)" if result.result(name, last).asynchronous else "")]
        for level in result.levels:
            r = result.result(name, level)
            memory = _memory(r.peak_memory, r.memory_unit) + (" OOM" if r.out_of_memory else "")
            rank = f"{r.rank}" + (f" *(was {r.previous_rank})" if r.rank_changed else "")
            cells += [_time(r.iteration_time, r.time_unit), f"{r.bubble_ratio:.3f}"]
            if level == Level.SIM and utilization:
                cells.append("-" if r.mfu is None else f"{r.mfu:.1%} / {r.hfu:.1%}")
            cells += [memory, rank]
        table.add_row(*cells)
    # on a narrow console: the bubbles of the earlier levels go first, then their memory, then
    # the last level's bubble (each level's column k of 4 after the schedule's)
    earlier = range(len(result.levels) - 1)
    print_whole(console, table, [*(2 + 4 * k for k in earlier), *(3 + 4 * k for k in earlier),
                                 2 + 4 * (len(result.levels) - 1)])
    console.print(f"rank: {RANKING}", highlight=False)
    if len(result.levels) > 1:
        changes = result.rank_changes()
        if changes:
            console.print(f"* rank changed from the level before for {len({r.schedule for r in changes})} of "
                          f"{len(order)} schedules")
        else:
            console.print("the ranking is the same at every level")
    console.print("slots: time of a 1F1B stage op (F = I = W = 1); act. units: peak in-flight activations "
                  "of the worst device in 1F1B-stage units; bubble = idle / (devices x time)")
    _print_training(result, order, console)
    steady = [r for r in result.results if r.steady_state and r.level == last]
    if steady:
        console.print("steady state (iterations back to back, the mean iteration between the first and the last) for "
                      + ("every family" if result.settings.get("steady_state") else
                         "the asynchronous families (no flush: their weights are stale)"), highlight=False)
    for r in steady:
        if r.asynchronous or r.staleness:
            console.print(f"{r.schedule}: staleness {r.staleness} update{'' if r.staleness == 1 else 's'} at most "
                          f"({r.mean_staleness:.3g} on "
                          f"average), {r.weight_versions} weight versions on the busiest stage", highlight=False)
    for name, reason in result.skipped:
        console.print(f"skipped {name}: {reason}", highlight=False, markup=False)
    if result.variability is not None:
        print_paired(result, console)


def print_paired(result: Comparison, console: Console) -> None:
    """The schedules ranked by mean iteration time over the Monte Carlo samples."""
    paired = result.variability
    first = result.distributions[0][1]
    table = Table(title=f"with variability: {first.samples:,} samples on common random numbers, seed "
                        f"{first.variability.seed}; {first.variability.describe()}")
    for column in ("rank", "schedule", "mean (s)", "p99 (s)", "fastest in", "faster than next"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    for k, name in enumerate(paired.names):
        after = paired.beats_next[k]
        table.add_row(str(k + 1), name, significant(paired.mean[k]), significant(paired.p99[k]), f"{paired.fastest[k]:.1%}",
                      "-" if after is None else f"{after:.1%}")
    console.print(table)
    console.print(f"the order of the schedules differs from the order by mean in {paired.flip_share:.1%} of the samples")


def distribution_plots(result: Comparison) -> list[dict] | None:
    """Per schedule (by mean), its iteration-time samples for the HTML report's plots."""
    if result.variability is None:
        return None
    drawn = dict(result.distributions)
    return [{"name": name, "samples": drawn[name].makespan, "deterministic": drawn[name].deterministic,
             "fastest": result.variability.fastest[k]} for k, name in enumerate(result.variability.names)]


def _print_training(result: Comparison, order: list[str], console: Console) -> None:
    """Per schedule, the frozen, recomputed and offloaded work of each device (sim level),
    when there is any."""
    rows = [(name, r.training) for name in order if (r := result.result(name, Level.SIM)) is not None
            and r.training is not None and r.training.any]
    if not rows:
        return
    table = Table(title="training work per device (sim): device 0, 1, ...")
    for column in ("schedule", "frozen stages", "recompute s", "offloaded", "offload exposed s", "host peak GiB"):
        table.add_column(column, justify="right")
    for name, work in rows:
        frozen = " | ".join(",".join(map(str, stages)) or "-" for stages in work.frozen_stages)
        table.add_row(name, frozen, " ".join(f"{x:.3g}" for x in work.recompute_s),
                      " ".join(str(x) for x in work.offloaded), " ".join(f"{x:.3g}" for x in work.offload_exposed_s),
                      " ".join(f"{x / GiB:.2f}" for x in work.host_peak_bytes))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
