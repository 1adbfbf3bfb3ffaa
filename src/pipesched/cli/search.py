"""`pipesched search`: the fastest way to train a model on a cluster with a global batch, over
tensor, pipeline and data parallelism, micro-batch sizes, schedule families, partitions,
recompute and ZeRO stages; results in an SQLite store that a killed search resumes from."""

from __future__ import annotations

import json
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
    Dtype,
    Model,
    SeqLen,
    SequenceParallel,
    split_names,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_whole, wrote
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.io.files import Output, check_outputs, write_all
from pipesched.limits import MAX_WORKERS, check_count
from pipesched.search.results import SearchResult, simulate_command
from pipesched.search.space import SearchSpace
from pipesched.search.store import EVALUATED, INVALID, OUT_OF_MEMORY, PRUNED, StoredRow
from pipesched.wording import counted

GiB = 2.0**30


def _listed(axis: str) -> str:
    """The default values of a SearchSpace axis (its defaults live there, once)."""
    return ",".join(str(value) for value in SearchSpace.__dataclass_fields__[axis].default)


def _numbers(field: str, text: str | None) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); None -> () (every value)."""
    if text is None:
        return ()
    values = []
    for part in split_names(text):
        try:
            values.append(int(part))
        except ValueError:
            raise PipeschedError(f"{field}={text[:40]!r}: give whole numbers separated by commas, e.g. 1,2,4") from None
    require(bool(values), field, repr(text), "give at least one value")
    return tuple(values)


def search_command(
    model: Model = None,
    cluster: ClusterName = None,
    global_batch: Annotated[int | None, typer.Option(
        "--global-batch", "-g", help=f"sequences per iteration, all data-parallel pipelines together "
                                     f"[default: {DEFAULTS.global_batch}]")] = None,
    seq_len: SeqLen = None,
    dtype: Dtype = None,
    sequence_parallel: SequenceParallel = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="use the cluster's first N devices [default: all]")] = None,
    schedules: Annotated[str | None, typer.Option("--schedules", help="comma-separated families [default: every synchronous family; name pipedream or pipedream-2bw to search them too]")] = None,
    tensor_parallel: Annotated[str | None, typer.Option(
        "--tensor-parallel", "-t", help="tensor-parallel degrees to try, like 2,4 (one value fixes it, as -t does in "
                                        "the other commands) [default: every divisor of the node size]")] = None,
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="pipeline sizes p to try [default: all]")] = None,
    dp: Annotated[str | None, typer.Option("--dp", help="data-parallel sizes to try [default: all]")] = None,
    micro_batch_sizes: Annotated[str | None, typer.Option(
        "--micro-batch-sizes", "-b", help="micro-batch sizes to try, like 1,2 (one value fixes it, as -b does in the "
                                          "other commands) [default: every divisor of the batch per pipeline]")] = None,
    chunks: Annotated[str | None, typer.Option(
        "--chunks", help=f"chunks v per device for the families that take it [default: {_listed('chunks')}]")] = None,
    partitions: Annotated[str | None, typer.Option(
        "--partitions", help=f"partition methods to try [default: {_listed('partitions')}]")] = None,
    recompute: Annotated[str | None, typer.Option(
        "--recompute", help=f"recompute modes to try [default: {_listed('recompute')}]")] = None,
    zero: Annotated[str | None, typer.Option(
        "--zero", help=f"ZeRO stages of the optimizer state to try, 1 only with dp > 1 "
                       f"[default: {_listed('zero')}]")] = None,
    db: Annotated[str, typer.Option("--db", help="SQLite store of the results: a search started again with the same "
                                                 "store and options resumes")] = DEFAULTS.search_db,
    workers: Annotated[int | None, typer.Option(
        "--workers", help=f"local worker processes, at most {MAX_WORKERS} [default: the CPU count]")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="run on a local Ray (loopback only) instead of a process pool")] = False,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="run on the Ray cluster at this HOST:PORT (ray start --head prints it)")] = None,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="simulate every point that fits, even those the "
                                                              "bound rules out")] = False,
    top: Annotated[int, typer.Option("--top", help="configurations to print (0: all)")] = DEFAULTS.top,
    show: Annotated[bool, typer.Option("--show", help="print the results stored in --db and stop")] = False,
    csv: Annotated[str | None, typer.Option("--csv", help="write every point's row to this CSV file")] = None,
    as_json: AsJson = False,
    html: Annotated[str | None, typer.Option("--html", help="write a report: the Pareto front drawn, the best "
                                                            "configurations and their timelines")] = None,
) -> None:
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
    require(0 <= top <= 1_000_000, "top", top, "give a number of rows >= 0 (0: all)")
    check_outputs((("csv", csv), ("html", html)))
    if show:
        results = _stored(db)
        _write_files(results, csv=csv, html=html)
        if as_json:
            typer.echo(json.dumps(_store_json(db, results, top), indent=1))
            return
        for result in results:
            print_result(result, top=top)
        return
    if workers is not None:
        check_count("workers", workers, MAX_WORKERS, what="worker processes")
    if ray or ray_address is not None:
        require(workers is None, "workers", workers, "not with --ray or --ray-address: Ray decides where tasks run")
        require(not (ray and ray_address is not None), "ray-address", ray_address, "give --ray or --ray-address, not both")
        from pipesched.experiments.ray_pool import require_ray

        require_ray("--ray" if ray else "--ray-address")  # before anything is written
    given = {
        "model": model, "cluster": cluster, "global_batch": global_batch, "seq_len": seq_len, "gpus": gpus,
        "dtype": dtype, "sequence_parallel": sequence_parallel,
        "schedules": tuple(split_names(schedules)) if schedules is not None else None,
        "chunks": _numbers("chunks", chunks) or None,
        "partitions": tuple(split_names(partitions)) if partitions is not None else None,
        "recompute": tuple(split_names(recompute)) if recompute is not None else None,
        "zero": _numbers("zero", zero) or None, "tensor_parallel": _numbers("tensor-parallel", tensor_parallel),
        "pipeline": _numbers("pipeline", pipeline), "data_parallel": _numbers("dp", dp),
        "micro_batch_sizes": _numbers("micro-batch-sizes", micro_batch_sizes),
    }
    space = SearchSpace(**{name: value for name, value in given.items() if value is not None})
    space.check_capacity()  # a model the cluster cannot hold fails before the store is touched
    from pipesched.search.store import SearchStore
    from pipesched.search.sweep import search

    bar = _ProgressBar(Console(stderr=True))
    # the pool first: a Ray that cannot start or be joined leaves no store behind
    with _mapper(workers, ray, ray_address) as mapper, SearchStore.open(db) as store:
        try:
            result = search(space, store=store, mapper=mapper, prune=not no_prune, progress=bar,
                            timelines=html is not None)
        finally:
            bar.close()
    _write_files([result], csv=csv, html=html)
    if as_json:
        typer.echo(json.dumps(_store_json(db, [result], top), indent=1))
        return
    print_result(result, top=top)


def _store_json(db: str, results: list[SearchResult], top: int) -> dict:
    """The one JSON shape of ``search --json`` and ``search --show --json``: the store and
    its searches (a search run now: the one it ran)."""
    return {"db": db, "searches": [result.to_dict(top=top or None) for result in results]}


def _mapper(workers: int | None, ray: bool, ray_address: str | None):
    if ray or ray_address is not None:
        from pipesched.experiments.ray_pool import ray_pool

        return ray_pool(ray_address)
    from pipesched.experiments.grid import process_map

    return process_map(workers)


def _stored(db: str) -> list[SearchResult]:
    from pipesched.search.store import read_rows

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
        from pipesched.render.search_page import render_search_html

        outputs.append(Output(html, render_search_html(results[-1]), "html"))
    for path in write_all(outputs):
        wrote(path)


class _ProgressBar:
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
    return [str(rank) if evaluated else "OOM", row.schedule, "-" if row.v is None else str(row.v), str(row.dp),
            str(row.tp), str(row.pp), str(row.micro_batch_size), str(row.m), row.recompute, row.partition,
            str(row.zero), f"{row.iteration_time_s:.4f}" if evaluated else "-",
            f"{row.throughput_tokens_per_s:,.0f}" if evaluated else "-",
            _share(row.mfu) if evaluated else "-", _share(row.hfu) if evaluated else "-", _gib(row.peak_memory_bytes)]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


_HEADER = ("rank", "schedule", "v", "dp", "tp", "pp", "b", "m", "recompute", "partition", "zero", "time (s)",
           "tokens/s", "MFU", "HFU", "peak memory")
# the columns a narrow console drops first (the "best" line's command reproduces them)
_DROPPABLE = tuple(_HEADER.index(name) for name in ("partition", "recompute", "HFU", "MFU", "zero"))


def _table(title: str, rows: list[tuple[int, StoredRow]]) -> Table:
    table = Table(title=title)
    for heading in _HEADER:
        table.add_column(heading, justify="left" if heading in ("schedule", "recompute", "partition") else "right")
    for rank, row in rows:
        table.add_row(*_row_cells(rank, row))
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
        print_whole(console, _table(f"the {len(shown)} fastest configurations that fit (then the least memory-hungry "
                                    "that do not)", list(enumerate(shown, start=1))), _DROPPABLE)
    front = result.front
    ranks = {row.key: k for k, row in enumerate(result.ranked, start=1)}
    if front:
        print_whole(console, _table("Pareto front: iteration time against peak memory (none is both faster and "
                                    "smaller)", [(ranks[row.key], row) for row in front]), _DROPPABLE)
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
        console.print(f"  {heading}: {split}{more}; e.g. {example.key}: {example.reason}",
                      highlight=False, markup=False, soft_wrap=True)
    best = result.best
    if best is not None:
        console.print(f"best: {best.schedule}, dp {best.dp} x pp {best.pp} x tp {best.tp}, "
                      f"{counted(best.m, 'microbatch')} of {best.micro_batch_size}: {best.iteration_time_s:.4f} s, {best.throughput_tokens_per_s:,.0f} "
                      f"tokens/s; reproduce with\n  {simulate_command(space, best)}", highlight=False, markup=False,
                      soft_wrap=True)
    else:
        console.print("no configuration fits in memory", highlight=False)
    took = f" in {result.seconds:.1f} s" if result.seconds else ""
    console.print(f"results in {result.db}{took} (run {result.runs})", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)
