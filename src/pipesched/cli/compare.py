"""`pipesched compare`: schedule families side by side at the formula, table and simulation
levels, ranked, with the places where the ranking changes marked."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from pipesched.cli.options import split_names
from pipesched.cli.output import console as output_console
from pipesched.cli.progress import LateProgress
from pipesched.cli.simulate import (
    Bandwidth,
    ClusterName,
    Latency,
    MicroBatchSize,
    Model,
    NoContention,
    NoOverlap,
    Recompute,
    SeqLen,
    StageCostsFile,
    TensorParallel,
    build_setup,
)
from pipesched.cli.views import Html, Png, Svg, Trace, ViewPaths
from pipesched.compare import LEVELS, Comparison, compare
from pipesched.errors import PipeschedError
from pipesched.simulate.setup import DEFAULT_SCENARIO

GiB = 2.0**30
LEVEL_TITLES = {"formula": "formula (slots)", "table": "table (slots)", "sim": "simulated (s)"}


def compare_command(
    schedules: Annotated[str | None, typer.Option("--schedules", help="comma-separated families [default: all]")] = None,
    p: Annotated[int, typer.Option("-p", help="pipeline devices")] = DEFAULT_SCENARIO.p,
    m: Annotated[int, typer.Option("-m", help="microbatches")] = DEFAULT_SCENARIO.m,
    v: Annotated[int | None, typer.Option("-v", help="chunks per device for the families that take it")] = None,
    levels: Annotated[str, typer.Option("--levels", help="comma-separated: formula, table, sim")] = ",".join(LEVELS),
    model: Model = None,
    cluster: ClusterName = None,
    micro_batch_size: MicroBatchSize = None,
    seq_len: SeqLen = None,
    tensor_parallel: TensorParallel = None,
    recompute: Recompute = None,
    stage_costs: StageCostsFile = None,
    latency: Latency = None,
    bandwidth: Bandwidth = None,
    no_contention: NoContention = False,
    no_overlap: NoOverlap = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
) -> None:
    """Compare schedule families: iteration time, bubble ratio and peak memory under the
    closed forms, the slot table and the simulation, ranked per level. Without arguments:
    every family on the default scenario (Llama-3-70B-like model on 4 x 8 H100, p=8, m=32).

    \b
    Examples:
      pipesched compare --schedules 1f1b,zb-h1,zb-v -p 4 -m 16
      pipesched compare --levels formula,table --json
    """
    views = ViewPaths(png, svg, trace, html).check()
    chosen_levels = split_names(levels)
    for level in chosen_levels:
        if level not in LEVELS:
            raise PipeschedError(f"levels={level}: unknown level; choose from {', '.join(LEVELS)}")
    if not chosen_levels:
        raise PipeschedError(f"levels={levels!r}: give at least one of {', '.join(LEVELS)}")
    names = split_names(schedules) if schedules else None
    setup = None
    if "sim" in chosen_levels:
        setup = build_setup(num_stages=None, model=model, cluster=cluster, micro_batch_size=micro_batch_size,
                            seq_len=seq_len, tensor_parallel=tensor_parallel, recompute=recompute,
                            stage_costs=stage_costs, latency=latency, bandwidth=bandwidth)
    progress = LateProgress()
    try:
        result = compare(names, p=p, m=m, v=v, levels=chosen_levels, setup=setup,
                         contention=not no_contention, overlap=not no_overlap, progress=progress,
                         keep_timelines=views.any)
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
    console = output_console()
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
        cells = [name]
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
    for name, reason in result.skipped:
        console.print(f"skipped {name}: {reason}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
