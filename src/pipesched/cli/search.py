"""`pipesched search`: the fastest way to train a model on a cluster with a global batch, over
tensor, pipeline and data parallelism, micro-batch sizes, schedule families, partitions,
recompute and ZeRO stages; results in an SQLite store that a killed search resumes from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pipesched.cli.options import (
    AsJson,
    ClusterName,
    CpComm,
    Dtype,
    Gpus,
    Model,
    OptionGroup,
    RayAddress,
    RayFlag,
    SeqLen,
    SequenceParallel,
    Top,
    Workers,
    command,
    split_names,
    whole_numbers,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_whole, wrote
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.experiments.grids import process_map
from pipesched.experiments.ray_pool import ray_pool, require_ray
from pipesched.io.files import Output, check_outputs, write_all
from pipesched.limits import MAX_WORKERS, check_count
from pipesched.render.search_page import render_search_html
from pipesched.search.results import SearchResult, simulate_command
from pipesched.search.space import SearchSpace
from pipesched.search.store import (
    EVALUATED,
    INVALID,
    OUT_OF_MEMORY,
    PRUNED,
    StoredRow,
    read_rows,
)
from pipesched.search.sweep import search
from pipesched.units import GiB
from pipesched.wording import counted


def _listed(axis: str) -> str:
    """The default values of a SearchSpace axis (its defaults live there, once)."""
    return ",".join(str(value) for value in SearchSpace.__dataclass_fields__[axis].default)


@dataclass(frozen=True)
class SpaceOptions(OptionGroup):
    """What the search tries: the model, cluster and batch, and the values of each axis
    (unset: the axis' defaults, ``SearchSpace``'s)."""

    model: Model = None
    cluster: ClusterName = None
    global_batch: Annotated[int | None, typer.Option(
        "--global-batch", "-g", help=f"sequences per iteration, all data-parallel pipelines together "
                                     f"[default: {DEFAULTS.global_batch}]")] = None
    seq_len: SeqLen = None
    dtype: Dtype = None
    sequence_parallel: SequenceParallel = None
    gpus: Gpus = None
    schedules: Annotated[str | None, typer.Option(
        "--schedules", help="comma-separated families [default: every synchronous family; name pipedream or "
                            "pipedream-2bw to search them too]")] = None
    tensor_parallel: Annotated[str | None, typer.Option(
        "--tensor-parallel", "-t", help="tensor-parallel degrees to try, like 2,4 (one value fixes it, as -t does in "
                                        "the other commands) [default: every divisor of the node size]")] = None
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="pipeline sizes p to try [default: all]")] = None
    context_parallel: Annotated[str | None, typer.Option(
        "--cp", help="context-parallel degrees to try, like 1,2,4 (each stage spans t x cp devices; 2 x cp must "
                     f"divide -s) [default: {DEFAULTS.context_parallel}]")] = None
    cp_comm: CpComm = None
    dp: Annotated[str | None, typer.Option("--dp", help="data-parallel sizes to try [default: all]")] = None
    micro_batch_sizes: Annotated[str | None, typer.Option(
        "--micro-batch-sizes", "-b", help="micro-batch sizes to try, like 1,2 (one value fixes it, as -b does in the "
                                          "other commands) [default: every divisor of the batch per pipeline]")] = None
    chunks: Annotated[str | None, typer.Option(
        "--chunks", help=f"chunks v per device for the families that take it [default: {_listed('chunks')}]")] = None
    partitions: Annotated[str | None, typer.Option(
        "--partitions", help=f"partition methods to try [default: {_listed('partitions')}]")] = None
    recompute: Annotated[str | None, typer.Option(
        "--recompute", help=f"recompute modes to try [default: {_listed('recompute')}]")] = None
    zero: Annotated[str | None, typer.Option(
        "--zero", help=f"ZeRO stages of the optimizer state to try, 1 only with dp > 1 "
                       f"[default: {_listed('zero')}]")] = None
    ep: Annotated[str | None, typer.Option(
        "--ep", help=f"expert-parallel degrees to try for a mixture-of-experts model, like 1,8 (those dividing the "
                     f"data-parallel size and the experts) [default: {_listed('expert_parallel')}]")] = None

    def space(self) -> SearchSpace:
        """The search space (the search checks that the cluster can hold the model, before the store is touched)."""
        given = {
            "model": self.model, "cluster": self.cluster, "global_batch": self.global_batch,
            "seq_len": self.seq_len, "gpus": self.gpus, "dtype": self.dtype,
            "sequence_parallel": self.sequence_parallel, "schedules": _names(self.schedules),
            "chunks": whole_numbers("chunks", self.chunks) or None, "partitions": _names(self.partitions),
            "recompute": _names(self.recompute), "zero": whole_numbers("zero", self.zero) or None,
            "tensor_parallel": whole_numbers("tensor-parallel", self.tensor_parallel),
            "pipeline": whole_numbers("pipeline", self.pipeline), "data_parallel": whole_numbers("dp", self.dp),
            "micro_batch_sizes": whole_numbers("micro-batch-sizes", self.micro_batch_sizes),
            "context_parallel": whole_numbers("cp", self.context_parallel) or None, "cp_comm": self.cp_comm,
            "expert_parallel": whole_numbers("ep", self.ep) or None,
        }
        return SearchSpace(**{name: value for name, value in given.items() if value is not None})


def _names(text: str | None) -> tuple[str, ...] | None:
    """``"a,b"`` -> ("a", "b"); None -> None (the axis' default)."""
    return None if text is None else tuple(split_names(text))


@dataclass(frozen=True)
class RunOptions(OptionGroup):
    """Where the results are kept and where the points are evaluated."""

    db: Annotated[str, typer.Option("--db", help="SQLite store of the results: a search started again with the same "
                                                 "store and options resumes")] = DEFAULTS.search_db
    workers: Workers = None
    ray: RayFlag = False
    ray_address: RayAddress = None
    no_prune: Annotated[bool, typer.Option("--no-prune", help="simulate every point that fits, even those the "
                                                              "bound rules out")] = False

    def check(self) -> None:
        """The pool asked for can be had, before anything is written."""
        if self.workers is not None:
            check_count("workers", self.workers, MAX_WORKERS, what="worker processes")
        if self.ray or self.ray_address is not None:
            require(self.workers is None, "workers", self.workers,
                    "not with --ray or --ray-address: Ray decides where tasks run")
            require(not (self.ray and self.ray_address is not None), "ray-address", self.ray_address,
                    "give --ray or --ray-address, not both")
            require_ray("--ray" if self.ray else "--ray-address")

    def search(self, space: SearchSpace, *, timelines: bool = False) -> SearchResult:
        """Search ``space`` in the store, with a progress bar on stderr; ``timelines``: keep
        the timelines of the front's points it simulates (for the HTML page)."""
        bar = ProgressBar(Console(stderr=True))
        # a pool the search starts before its store: a Ray that cannot start or be joined leaves no store behind
        pool = ray_pool(self.ray_address) if self.ray or self.ray_address is not None else process_map(self.workers)
        try:
            return search(space, db=self.db, mapper=pool, prune=not self.no_prune, progress=bar, timelines=timelines)
        finally:
            bar.close()


@dataclass(frozen=True)
class ReportOptions(OptionGroup):
    """What is printed and written of the results."""

    top: Top = DEFAULTS.top
    show: Annotated[bool, typer.Option("--show", help="print the results stored in --db and stop")] = False
    csv: Annotated[str | None, typer.Option("--csv", help="write every point's row to this CSV file")] = None
    as_json: AsJson = False
    html: Annotated[str | None, typer.Option("--html", help="write a report: the Pareto front drawn, the best "
                                                            "configurations and their timelines")] = None

    def check(self) -> None:
        require(0 <= self.top <= 1_000_000, "top", self.top, "give a number of rows >= 0 (0: all)")
        check_outputs((("csv", self.csv), ("html", self.html)))


@command
def search_command(*, space: SpaceOptions, run: RunOptions, report: ReportOptions) -> None:
    """Search every way to train a model on a cluster with a global batch: tensor, pipeline and
    data parallelism, micro-batch size, schedule family and chunks, partition, recompute and
    ZeRO stage. Every point is simulated (level 3) with its memory against the devices' (the
    bound prunes the ones that cannot win); results are ranked by throughput among those that
    fit, with the Pareto front of time against peak memory.

    \b
    Examples:
      pipesched search --model llama3-8b --cluster 1x8-h100 --global-batch 16 --schedules 1f1b,zb-h1 --db s.sqlite --top 5
      pipesched search --db s.sqlite --show
    """
    report.check()
    if report.show:
        results = _stored(run.db)
    else:
        run.check()
        results = [run.search(space.space(), timelines=report.html is not None)]
    _write_files(results, csv=report.csv, html=report.html)
    if report.as_json:
        typer.echo(json.dumps(_store_json(run.db, results, report.top), indent=1))
        return
    for result in results:
        print_result(result, top=report.top)


def _store_json(db: str, results: list[SearchResult], top: int) -> dict:
    """The one JSON shape of ``search --json`` and ``search --show --json``: the store and
    its searches (a search run now: the one it ran)."""
    return {"db": db, "searches": [result.to_dict(top=top or None) for result in results]}


def _stored(db: str) -> list[SearchResult]:
    require(not Path(db).is_dir(), "db", db, "is a directory; give the store file of a previous search (--db FILE)")
    require(Path(db).is_file(), "db", db, "no such file; give the store of a previous search (--db FILE)")
    results = [SearchResult(space, tuple(rows), db=db) for space, rows in read_rows(db)]
    require(bool(results), "db", db, "holds no search yet; run one with --db FILE")
    return results


def _write_files(results: list[SearchResult], *, csv: str | None, html: str | None) -> None:
    """The CSV of every row and the report page, all or none."""
    outputs = []
    if csv is not None:
        outputs.append(Output(csv, "".join(r.to_csv() for r in results), "csv"))
    if html is not None:
        outputs.append(Output(html, render_search_html(results[-1]), "html"))
    for path in write_all(outputs):
        wrote(path)


class ProgressBar:
    """A progress bar with the time left on stderr, when stderr is a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.tasks: dict[str, object] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.console.is_terminal or total == 0:
            return
        if self.bar is None:
            self.bar = Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.bar.start()
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(phase, total=total)
        self.bar.update(self.tasks[phase], completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f} GiB"


def _row_cells(rank: int, row: StoredRow) -> list[str]:
    evaluated = row.status == EVALUATED
    return [str(rank) if evaluated else "OOM", row.family, "-" if row.v is None else str(row.v), str(row.dp),
            str(row.tp), str(row.cp), str(row.p), str(row.micro_batch_size), str(row.m), row.recompute, row.partition,
            str(row.zero), f"{row.iteration_time_s:.4f}" if evaluated else "-",
            f"{row.throughput_tokens_per_s:,.0f}" if evaluated else "-",
            _share(row.mfu) if evaluated else "-", _share(row.hfu) if evaluated else "-", _gib(row.peak_memory_bytes)]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


_TEXT_COLUMNS = frozenset(("schedule", "recompute", "partition"))  # left-aligned columns
_HEADER = ("rank", "schedule", "v", "dp", "tp", "cp", "pp", "b", "m", "recompute", "partition", "zero", "time (s)",
           "tokens/s", "MFU", "HFU", "peak memory")
# the columns a narrow console drops first (the "best" line's command reproduces them)
_DROPPED_FIRST = ("partition", "recompute", "HFU", "MFU", "zero", "ep")
EP_COLUMN = _HEADER.index("zero") + 1  # where the expert-parallel degree shows, when a row has EP > 1


def _droppable(table: Table) -> tuple[int, ...]:
    """The indices of the columns a narrow console drops, in the order it drops them."""
    headers = [column.header for column in table.columns]
    return tuple(headers.index(name) for name in _DROPPED_FIRST if name in headers)


def _table(title: str, rows: list[tuple[int, StoredRow]]) -> Table:
    """The rows' table; with an ``ep`` column after ``zero`` when a row has expert parallelism
    (the droppable columns keep their places: ``ep`` comes after every one of them)."""
    table = Table(title=title)
    experts = any(row.ep > 1 for _, row in rows)
    header = list(_HEADER)
    if experts:
        header.insert(EP_COLUMN, "ep")
    for heading in header:
        table.add_column(heading, justify="left" if heading in _TEXT_COLUMNS else "right")
    for rank, row in rows:
        cells = _row_cells(rank, row)
        if experts:
            cells.insert(EP_COLUMN, str(row.ep))
        table.add_row(*cells)
    return table


def print_result(result: SearchResult, *, top: int) -> None:
    """The ranking, the Pareto front, the counts and why points were left out."""
    console = output_console()
    space = result.space
    shown = list(result.ranked) if top == 0 else list(result.ranked[:top])
    total = len(result.rows)
    console.print(f"search: {space['model']} on {space['cluster']}, global batch {space['global_batch']} x "
                  f"{space['seq_len']} tokens; {total:,} points", highlight=False)
    if shown:
        table = _table(f"the {len(shown)} fastest configurations that fit (then the least memory-hungry that do not)",
                       list(enumerate(shown, start=1)))
        print_whole(console, table, _droppable(table))
    front = result.front
    ranks = {row.key: k for k, row in enumerate(result.ranked, start=1)}
    if front:
        table = _table("Pareto front: iteration time against peak memory (none is both faster and smaller)",
                       [(ranks[row.key], row) for row in front])
        print_whole(console, table, _droppable(table))
    counts = (f"{result.count(EVALUATED):,} evaluated (simulated, fit in memory), {result.count(OUT_OF_MEMORY):,} out "
              f"of memory, {result.count(PRUNED):,} pruned by the bound, {result.count(INVALID):,} invalid")
    unfinished = total - sum(result.count(s) for s in (EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID))
    if unfinished:
        counts += f", {unfinished:,} not finished"
    console.print(counts, highlight=False)
    for status, heading in ((OUT_OF_MEMORY, "out of memory"), (PRUNED, "pruned"), (INVALID, "invalid")):
        kinds, example = result.why(status)
        if example is None:
            continue
        split = ", ".join(f"{kind} {count:,}" for kind, count in kinds.most_common(6))
        more = f", {len(kinds) - 6} more" if len(kinds) > 6 else ""
        console.print(f"  {heading}: {split}{more}; e.g. {example.label}: {example.reason}",
                      highlight=False, markup=False, soft_wrap=True)
    best = result.best
    if best is not None:
        context = f" x cp {best.cp}" if best.cp > 1 else ""
        console.print(f"best: {best.family}, dp {best.dp} x pp {best.p} x tp {best.tp}{context}, "
                      f"{counted(best.m, 'microbatch')} of {best.micro_batch_size}: {best.iteration_time_s:.4f} s, {best.throughput_tokens_per_s:,.0f} "
                      f"tokens/s; reproduce with\n  {simulate_command(space, best)}", highlight=False, markup=False,
                      soft_wrap=True)
    else:
        console.print("no configuration fits in memory", highlight=False)
    took = f" in {result.seconds:.1f} s" if result.seconds else ""
    console.print(f"results in {result.db}{took} (run {result.runs})", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)
