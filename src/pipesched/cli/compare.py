"""`pipesched compare`: schedule families side by side at the formula, table and simulation
levels, ranked, with the places where the ranking changes marked."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipesched.cli.options import (
    AsJson,
    Bandwidth,
    Chunks,
    ClusterName,
    Devices,
    FamilySettings,
    Latency,
    Microbatches,
    MicroBatchSize,
    Model,
    NoContention,
    NoOverlap,
    PartitionOption,
    Recompute,
    SeqLen,
    StageCostsFile,
    SteadyStateFlag,
    TensorParallel,
    family_options,
    split_names,
    workload,
)
from pipesched.cli.views import Html, Png, Svg, Trace, ViewPaths
from pipesched.compare import LEVELS, Comparison, compare
from pipesched.errors import PipeschedError
from pipesched.experiments.defaults import DEFAULTS

GiB = 2.0**30
LEVEL_TITLES = {"formula": "formula (slots)", "table": "table (slots)", "sim": "simulated (s)"}


class _LateProgress:
    """A progress bar on stderr that appears only once the work has taken over a second."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.began = time.monotonic()
        self.bar: Progress | None = None
        self.task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is None:
            if time.monotonic() - self.began < 1.0 or done >= total:
                return
            self.bar = Progress(TextColumn("comparing {task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)
        self.bar.update(self.task, completed=done, description=label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def compare_command(
    schedules: Annotated[str | None, typer.Option("--schedules", help="comma-separated families [default: all]")] = None,
    p: Devices = None,
    m: Microbatches = None,
    v: Chunks = None,
    family_settings: FamilySettings = None,
    levels: Annotated[str, typer.Option("--levels", help="comma-separated: formula, table, sim")] = ",".join(LEVELS),
    model: Model = None,
    cluster: ClusterName = None,
    micro_batch_size: MicroBatchSize = None,
    seq_len: SeqLen = None,
    tensor_parallel: TensorParallel = None,
    recompute: Recompute = None,
    partition: PartitionOption = None,
    stage_costs: StageCostsFile = None,
    latency: Latency = None,
    bandwidth: Bandwidth = None,
    no_contention: NoContention = False,
    no_overlap: NoOverlap = False,
    steady_state: SteadyStateFlag = False,
    as_json: AsJson = False,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
) -> None:
    """Compare schedule families: iteration time, bubble ratio and peak memory under the
    closed forms, the slot table and the simulation, ranked per level. Without arguments:
    every family on the default scenario (Llama-3-70B-like model on 4 x 8 H100, p=8, m=32)."""
    views = ViewPaths(png, svg, trace, html).check()
    chosen_levels = split_names(levels)
    for level in chosen_levels:
        if level not in LEVELS:
            raise PipeschedError(f"levels={level}: unknown level; choose from {', '.join(LEVELS)}")
    if not chosen_levels:
        raise PipeschedError(f"levels={levels!r}: give at least one of {', '.join(LEVELS)}")
    names = split_names(schedules) if schedules else None
    point = workload(model=model, cluster=cluster, micro_batch_size=micro_batch_size, seq_len=seq_len,
                     tensor_parallel=tensor_parallel, recompute=recompute, partition=partition,
                     stage_costs=stage_costs, latency=latency, bandwidth=bandwidth, no_contention=no_contention,
                     no_overlap=no_overlap, steady_state=steady_state)
    options, slot_costs, fb_cost = family_options(family_settings)
    point = point.replace(options=tuple(sorted(options.items())), slot_costs=slot_costs, fb_cost=fb_cost)
    progress = _LateProgress(Console(file=sys.stderr))
    try:
        result = compare(names, p=p if p is not None else DEFAULTS.p, m=m if m is not None else DEFAULTS.m, v=v,
                         levels=chosen_levels, workload=point, progress=progress, keep_timelines=views.any)
    finally:
        progress.close()
    if not result.results and result.skipped:  # nothing to compare: say why, write nothing
        name, reason = result.skipped[0]
        others = f" (and {len(result.skipped) - 1} more schedules)" if len(result.skipped) > 1 else ""
        raise PipeschedError(f"no schedule could be compared: {name}{others}: {reason}")
    views.write(result.timelines, comparison=result.to_wide_records(), title=_title(result))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    print_comparison(result)


def _time(value: float, unit: str) -> str:
    return f"{value:.4g}" if unit == "s" else f"{value:g}"


def _memory(value: float, unit: str) -> str:
    return f"{value / GiB:.1f} GiB" if unit == "bytes" else f"{value:g}"


def _title(result: Comparison) -> str:
    title = f"p={result.p}, m={result.m}" + (f", v={result.v}" if result.v else "")
    return title + (f"; {result.setup}" if result.setup else "")


def print_comparison(result: Comparison) -> None:
    """One wide table: a row per schedule (ordered by the last level's rank), for each level
    its time, bubble ratio, memory and rank; ``*`` marks a rank that changed from the level
    before."""
    console = Console() if Console().is_terminal else Console(width=200)
    last = result.levels[-1]
    order = result.ranking(last)
    title = f"p={result.p}, m={result.m}" + (f", v={result.v}" if result.v else "")
    if result.setup:
        title += f"; sim: {result.setup}"
    table = Table(title=title)
    table.add_column("schedule")
    for level in result.levels:
        heading = LEVEL_TITLES[level]
        memory = "peak mem" if level == "sim" else "act. units"
        table.add_column(f"{heading}\ntime", justify="right")
        table.add_column("bubble", justify="right")
        table.add_column(memory, justify="right")
        table.add_column("rank", justify="right")
    for name in order:
        cells = [name + (" (async)" if result.result(name, last).asynchronous else "")]
        for level in result.levels:
            r = result.result(name, level)
            memory = _memory(r.peak_memory, r.memory_unit) + (" OOM" if r.out_of_memory else "")
            rank = f"{r.rank}" + (f" *(was {r.previous_rank})" if r.rank_changed else "")
            cells += [_time(r.iteration_time, r.time_unit), f"{r.bubble_ratio:.3f}", memory, rank]
        table.add_row(*cells)
    console.print(table)
    if len(result.levels) > 1:
        changes = result.rank_changes()
        if changes:
            console.print(f"* rank changed from the level before for {len({r.schedule for r in changes})} of "
                          f"{len(order)} schedules")
        else:
            console.print("the ranking is the same at every level")
    console.print("slots: time of a 1F1B stage op (F = I = W = 1); act. units: peak in-flight activations "
                  "of the worst device in 1F1B-stage units; bubble = idle / (devices x time)")
    steady = [r for r in result.results if r.steady_state and r.level == last]
    if steady:
        console.print("steady state (iterations back to back, the mean iteration between the first and the last) for "
                      + ("every family" if result.settings.get("steady_state") else
                         "the asynchronous families (no flush: their weights are stale)"), highlight=False)
    for r in steady:
        if r.asynchronous or r.staleness:
            console.print(f"{r.schedule}: staleness {r.staleness} updates at most ({r.mean_staleness:.3g} on "
                          f"average), {r.weight_versions} weight versions on the busiest stage", highlight=False)
    for name, reason in result.skipped:
        console.print(f"skipped {name}: {reason}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
