"""`pipesched serve`: serving a model with pipeline parallelism, prefill then decode with a
paged KV cache and a batch scheduler per instance: `simulate` one trace, the `capacity` of a
configuration (the highest request rate within the SLOs), `search` the configurations of a
cluster ranked by capacity per device, `run` a small model for real and `check` the
simulation against it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched.cli.groups import (
    BatchOptions,
    CacheOptions,
    DeploymentOptions,
    RealRequestOptions,
    RequestOptions,
    SloOptions,
    serving_point,
)
from pipesched.cli.options import (
    AsJson,
    Attainment,
    Backend,
    Gpus,
    LatencyModelFile,
    LatencyModelOut,
    OptionGroup,
    PerRequest,
    RayAddress,
    RayFlag,
    ResidentFrom,
    RunDtype,
    ServeCluster,
    ServeModel,
    ServeRunModel,
    ServeRunStages,
    Timeout,
    Top,
    Workers,
    command,
    split_names,
    whole_numbers,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_json, print_whole, wrote
from pipesched.cli.progress import StatusLine
from pipesched.cli.serve_events import EventsFile, print_changes
from pipesched.cli.serve_offline import offline_command
from pipesched.cli.serve_pool import pool_command
from pipesched.cli.serve_residency import residency_command
from pipesched.cli.views import Html, Png, Svg, Trace
from pipesched.defaults import DEFAULTS
from pipesched.enums import SchedulerName, SearchStatus
from pipesched.errors import PipeschedError, require
from pipesched.experiments.serving import (
    ServingPoint,
    Targets,
    at_capacity,
    point_capacity,
    rate_rows,
    served_requests,
    simulate_point,
    simulate_point_with_events,
    unbounded_reason,
)
from pipesched.io.files import Output, check_outputs, write_all
from pipesched.io.latency_model import dumps_latency_model
from pipesched.limits import MAX_WORKERS, check_count
from pipesched.model import load_model
from pipesched.serving.config import layout_label
from pipesched.serving.events import reconfiguration_dicts
from pipesched.serving.records import ServeRun
from pipesched.serving.results import ServeResult, serve_result, summarize

# what only some commands need loads when they run: the real runs' modules (run, check),
# the search's (search), the pictures' (the views asked for)
if TYPE_CHECKING:
    from pipesched.runtime.serve_check import ServeCheckReport
    from pipesched.search.serving import ServingRow, ServingSearchResult, ServingSpace
    from pipesched.serving.capacity import CapacityResult

HELP = """Serve a model: simulate a trace, find a configuration's capacity, search a cluster's
configurations, run a small model for real and check the simulation against it; serve
several models on one device pool; or run a block of sequences offline with offloading
(offline).

\b
Examples:
  pipesched serve simulate --requests 200
  pipesched serve capacity --requests 100 --scheduler vllm
"""


def _deployment_line(point: ServingPoint) -> str:
    config = point.config
    scheduler = config.scheduler
    caps = (f"chunk {scheduler.chunk}" if scheduler.name == SchedulerName.SARATHI else f"max {scheduler.max_tokens} tokens")
    return (f"{point.model} on {point.cluster}: {layout_label(config)} ({config.devices} devices), "
            f"{scheduler.name} ({caps}, max batch {scheduler.max_batch})")


def print_summary(what: str, run: ServeRun, result: ServeResult, console: Console) -> None:
    """``what`` was served (``run``): the latencies' table, then throughput, SLOs, cache and
    stages, one line each."""
    console.print(f"{what}; {result.requests:,} requests over {result.duration_s:.1f} s", highlight=False,
                  markup=False)
    table = Table(title="latency (s)")
    for heading in ("", "mean", "p50", "p90", "p99"):
        table.add_column(heading, justify="left" if not heading else "right")
    for name, values in (("TTFT", result.ttft_s), ("TPOT", result.tpot_s), ("TBT", result.tbt_s),
                         ("E2E", result.e2e_s), ("queue", result.queue_s)):
        summary = summarize(values)
        table.add_row(name, *(f"{value:.4f}" for value in (summary.mean, summary.p50, summary.p90, summary.p99)))
    print_whole(console, table)
    numbers = Counter()
    busy = []
    for kind, shares in zip(run.instance_kind, result.stage_busy, strict=True):
        busy.append(f"{kind} {numbers[kind]}: {' '.join(f'{share:.0%}' for share in shares)}")
        numbers[kind] += 1
    for line in (f"throughput: {result.throughput_tokens_per_s:,.0f} output tokens/s, "
                 f"{result.requests_per_s:.2f} requests/s, MFU {result.mfu:.1%}",
                 f"SLOs (TTFT <= {result.slo_ttft_s:g} s, TPOT <= {result.slo_tpot_s:g} s): "
                 f"{result.slo_attainment:.1%} of requests meet both; goodput {result.goodput_requests_per_s:.2f} "
                 "requests/s",
                 f"preemptions: {int(result.preemptions.sum()):,} (cost {_preemption_cost(result)}); KV cache peak "
                 f"{result.kv_peak_fraction:.1%} of its blocks",
                 f"stage busy (stage by stage): {'; '.join(busy)}; pipeline bubble {result.bubble:.1%}"):
        console.print(line, highlight=False, markup=False)


def _preemption_cost(result: ServeResult) -> str:
    """The preemptions' seconds, all requests together, part by part."""
    cost = result.preemption_cost()
    return ", ".join(f"{name} {seconds:.3f} s" for name, seconds in cost.items())


@dataclass(frozen=True)
class ServeViews(OptionGroup):
    """The pictures of a serving run asked for, a path each: the report, the Gantt chart of
    its timeline (stage groups' iterations around the fullest KV cache) and its trace."""

    html: Html = None
    png: Png = None
    svg: Svg = None
    perfetto: Trace = None

    def check(self) -> ServeViews:
        """Fail on an unwritable path (or two views on one file) before any work is done."""
        check_outputs([(name, path) for name in ("html", "png", "svg", "perfetto")
                       if (path := getattr(self, name)) is not None])
        return self

    @property
    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in ("html", "png", "svg", "perfetto"))

    def write(self, point: ServingPoint, *, run: ServeRun | None = None, result: ServeResult | None = None,
              probes: list[dict[str, float]] | None = None) -> None:
        """Draw the views of a run of ``point`` (simulated here unless given) and write them,
        all or none; ``probes``: the rates of a capacity search, for the report."""
        if not self.any:
            return
        from pipesched.render.serving import serving_report
        from pipesched.render.views import render_views
        from pipesched.serving.timeline import serving_timeline

        run = run if run is not None else simulate_point(point)
        targets = point.targets
        result = result or serve_result(run, slo_ttft=targets.slo_ttft, slo_tpot=targets.slo_tpot)
        title = f"serve: {_deployment_line(point)}"
        outputs = []
        if self.png is not None or self.svg is not None or self.perfetto is not None:
            outputs += render_views([serving_timeline(run)], png=self.png, svg=self.svg, trace=self.perfetto,
                                    title=title)
        if self.html is not None:
            outputs.append(Output(self.html, serving_report(run, result.to_dict(), probes=probes, title=title,
                                                            slo_ttft=targets.slo_ttft, slo_tpot=targets.slo_tpot,
                                                            latencies=result),
                                  "html"))
        for written in write_all(outputs):
            wrote(written)


@command
def simulate_command(*, deployment: DeploymentOptions, batch: BatchOptions, cache: CacheOptions,
                     requests: RequestOptions, slo: SloOptions, views: ServeViews, as_json: AsJson = False,
                     per_request: PerRequest = False, events: EventsFile = None) -> None:
    """Simulate serving a trace: every iteration of every instance, stage by stage, with the
    paged KV cache and the scheduler; TTFT, TPOT, end-to-end latency, throughput, SLO
    attainment, goodput, KV-cache use, stage busy time and the pipeline bubble; --html the
    report, --png / --svg the Gantt chart, --perfetto the trace of the serving timeline.

    \b
    Examples:
      pipesched serve simulate --requests 200
      pipesched serve simulate --requests 200 --scheduler vllm --json
      pipesched serve simulate --requests 100 --disaggregate 2x1x2,4x1 --qps 4
      pipesched serve simulate --model llama3-8b -t 1 -p 1 --replicas 2 --requests 100 --events events.yaml
    """
    require(as_json or not per_request, "per-request", "true", "add --json (the requests are listed in it)")
    views.check()
    point = serving_point(deployment, batch, cache, requests, slo)
    changed = simulate_point_with_events(point, events) if events is not None else None
    run = changed.run if changed is not None else simulate_point(point)
    result = serve_result(run, slo_ttft=point.targets.slo_ttft, slo_tpot=point.targets.slo_tpot)
    views.write(point, run=run, result=result)
    changes = reconfiguration_dicts(changed) if changed is not None else None
    if as_json:
        print_json({**result.to_dict(per_request=per_request), **({"reconfigurations": changes} if changes else {})})
        return
    print_summary(f"serve: {_deployment_line(point)}", run, result, output_console())
    if changes:
        print_changes(changes, output_console())


def print_capacity(point: ServingPoint, found: CapacityResult) -> None:
    """The capacity line (and, when no rate tried missed the SLOs, why the figure is a floor)."""
    targets = point.targets
    bound = "" if found.converged else "at least "
    output_console().print(
        f"capacity: {bound}{found.max_qps:.3g} requests/s ({found.max_qps / point.devices:.3g} per device) with "
        f"{targets.attainment:.0%} of requests within TTFT {targets.slo_ttft:g} s and TPOT {targets.slo_tpot:g} s; "
        f"{_deployment_line(point)}; {len(found.probes)} rates simulated", highlight=False, markup=False)
    if not found.converged:
        output_console(stderr=True).print(f"note: {unbounded_reason(found)}", highlight=False, markup=False)


@command
def capacity_command(*, deployment: DeploymentOptions, batch: BatchOptions, cache: CacheOptions,
                     requests: RequestOptions, slo: SloOptions, attainment: Attainment = None,
                     views: ServeViews, as_json: AsJson = False) -> None:
    """The highest request rate at which --attainment of the requests meet both SLOs: a
    bisection over rates on the same requests (their arrivals scaled to each rate). The views
    (--html, --png, --svg, --perfetto) are of a run at that rate; the report adds latency
    against every rate probed.

    \b
    Examples:
      pipesched serve capacity --requests 100
      pipesched serve capacity --requests 100 --scheduler vllm --slo-ttft 1 --json
      pipesched serve capacity --requests 100 --html capacity.html
    """
    views.check()
    point = serving_point(deployment, batch, cache, requests, slo, attainment=attainment)
    found = point_capacity(point)
    views.write(at_capacity(point, found), probes=rate_rows(found))
    if as_json:
        print_json(found.to_dict())
        return
    print_capacity(point, found)


@dataclass(frozen=True)
class ServeSpaceOptions(OptionGroup):
    """What a serving search tries: the model and cluster, and the values of each axis."""

    model: ServeModel = None
    cluster: ServeCluster = None
    gpus: Gpus = None
    tensor_parallel: Annotated[str | None, typer.Option(
        "--tensor-parallel", "-t", help="tensor-parallel degrees to try, like 2,4 [default: every divisor of the node "
                                        "size]")] = None
    pipeline: Annotated[str | None, typer.Option(
        "--pipeline", help="pipeline stages to try, like 1,2 [default: every divisor of the devices left]")] = None
    replicas: Annotated[str | None, typer.Option(
        "--replicas", help="replica counts to try, like 1,2 [default: every count that fits]")] = None
    with_disaggregated: Annotated[bool, typer.Option(
        "--with-disaggregated", help="also every split into prefill and decode instances (each a TP x PP x N of the "
                                     "space) that fits")] = False
    scheduler: Annotated[str | None, typer.Option(
        "--scheduler", help="schedulers to try, like vllm,sarathi [default: vllm,sarathi]")] = None
    max_batch: Annotated[str | None, typer.Option(
        "--max-batch", help=f"sequence caps to try [default: {DEFAULTS.max_batch}]")] = None
    max_tokens: Annotated[str | None, typer.Option(
        "--max-tokens", help=f"token caps to try (static, orca, vllm) [default: {DEFAULTS.max_tokens}]")] = None
    chunk: Annotated[str | None, typer.Option(
        "--chunk", help=f"Sarathi-Serve chunks to try [default: {DEFAULTS.chunk}]")] = None
    latency_model: LatencyModelFile = None
    resident: Annotated[str | None, typer.Option(
        "--resident", help=f"residencies to try, like 0.5,1: shares of each stage's layers kept on the GPU, in (0, 1]; "
                           f"the rest stream in from --resident-from every iteration [default: {DEFAULTS.resident:g}]")] = None
    resident_from: ResidentFrom = None

    def space(self, cache: CacheOptions, requests: RequestOptions, slo: SloOptions,
              attainment: float | None) -> ServingSpace:
        # loaded here, as serve residency loads it: a serving simulation imports no experiment module
        from pipesched.experiments.residency import parse_fractions
        from pipesched.search.serving import ServingSpace

        given = {"model": self.model, "cluster": self.cluster, "gpus": self.gpus,
                 "tensor_parallel": whole_numbers("tensor-parallel", self.tensor_parallel),
                 "pipeline": whole_numbers("pipeline", self.pipeline), "replicas": whole_numbers("replicas", self.replicas),
                 "schedulers": tuple(split_names(self.scheduler)) if self.scheduler is not None else None,
                 "max_batch": whole_numbers("max-batch", self.max_batch) or None,
                 "max_tokens": whole_numbers("max-tokens", self.max_tokens) or None,
                 "chunks": whole_numbers("chunk", self.chunk) or None, "latency_model": self.latency_model,
                 "resident": parse_fractions(self.resident, field="resident") if self.resident is not None else None,
                 "resident_from": self.resident_from}
        kv = cache.kv()
        return ServingSpace(**{name: value for name, value in given.items() if value is not None},
                            disaggregated=self.with_disaggregated, block_size=kv.block_size,
                            kv_fraction=kv.kv_fraction, preemption=cache.preemption or DEFAULTS.preemption,
                            routing=str(cache.routed()), cpu_overhead=cache.overhead(),
                            workload=requests.workload(), targets=slo.targets(attainment))


@dataclass(frozen=True)
class ServePoolOptions(OptionGroup):
    """Where the serving search keeps its results and evaluates its points."""

    db: Annotated[str, typer.Option("--db", help="SQLite store of the serving search's results: a search started "
                                                 "again with the same store and options resumes")] = DEFAULTS.serve_db
    workers: Workers = None
    ray: RayFlag = False
    ray_address: RayAddress = None
    top: Top = DEFAULTS.top
    show: Annotated[bool, typer.Option("--show", help="print the results stored in --db and stop")] = False

    def search(self, space: ServingSpace) -> ServingSearchResult:
        from pipesched.cli.search import ProgressBar
        from pipesched.experiments.grids import process_map
        from pipesched.experiments.ray_pool import ray_pool, require_ray
        from pipesched.search.serving import search_serving

        require(0 <= self.top <= 1_000_000, "top", self.top, "give a number of rows >= 0 (0: all)")
        if self.workers is not None:
            check_count("workers", self.workers, MAX_WORKERS, what="worker processes")
        remote = self.ray or self.ray_address is not None
        if remote:
            require(self.workers is None, "workers", self.workers, "not with --ray or --ray-address")
            require_ray("--ray" if self.ray else "--ray-address")
        pool = ray_pool(self.ray_address) if remote else process_map(self.workers)
        bar = ProgressBar(Console(stderr=True))
        try:
            return search_serving(space, db=self.db, mapper=pool, progress=bar)
        finally:
            bar.close()


@command
def search_command(*, space: ServeSpaceOptions, cache: CacheOptions, requests: RequestOptions, slo: SloOptions,
                   attainment: Attainment = None, pool: ServePoolOptions, as_json: AsJson = False) -> None:
    """Search the ways to serve a model on a cluster: replicas x TP x PP (and prefill and
    decode splits), scheduler, batch and chunk caps; each configuration's capacity (as serve
    capacity finds it), ranked by requests per second per device. Results go to an SQLite
    store a search started again resumes from.

    \b
    Examples:
      pipesched serve search --requests 60 -t 4,8 --pipeline 1,2 --replicas 1 --db serve.sqlite --top 5
      pipesched serve search --db serve.sqlite --show
    """
    from pipesched.search.serving import read_serving_rows

    results = read_serving_rows(pool.db) if pool.show else [pool.search(space.space(cache, requests, slo, attainment))]
    if not pool.show:
        check_found(results[0])
    if as_json:
        print_json({"db": pool.db, "searches": [result.to_dict(top=pool.top or None) for result in results]})
        return
    for result in results:
        print_search(result, top=pool.top)


def check_found(result: ServingSearchResult) -> None:
    """A search without a configuration to rank is an error: SLOs that none meets, or what
    kept the most of them from a capacity (too few requests to load any deployment, a size
    the model cannot take, a cache that cannot hold one request)."""
    if result.best is not None:
        return
    targets = Targets(**result.space["targets"])
    missed = sorted((row for row in result.rows if row.reason.startswith(("slo_ttft=", "slo_tpot="))),
                    key=lambda row: row.label)
    if missed:
        raise PipeschedError(f"slo_ttft={targets.slo_ttft:g}: no configuration of the search meets the SLOs (TTFT "
                             f"{targets.slo_ttft:g} s, TPOT {targets.slo_tpot:g} s for {targets.attainment:.0%} of "
                             f"requests) (e.g. {missed[0].label}: {missed[0].reason}); relax --slo-ttft, "
                             "--slo-tpot or --attainment, or widen the space")
    _, example = result.why(SearchStatus.INVALID)
    if example is None:
        _, example = result.why(SearchStatus.OUT_OF_MEMORY)
    raise PipeschedError(f"{example.reason} (no configuration of the search has a capacity; e.g. {example.label})")


_HEADER = ("rank", "layout", "scheduler", "batch", "tokens", "devices", "max qps", "qps/device", "SLO met",
           "TTFT p99", "TPOT p99")


def _cells(rank: int, row: ServingRow, *, residency: bool) -> list[str]:
    tokens = row.chunk if row.scheduler == SchedulerName.SARATHI else row.max_tokens
    resident = [f"{row.resident:g}"] if residency else []
    return [str(rank), row.layout, *resident, row.scheduler, str(row.max_batch), str(tokens), str(row.devices),
            f"{row.max_qps:.3g}", f"{row.qps_per_gpu:.3g}", _share(row.slo_attainment), _seconds(row.ttft_p99_s),
            _seconds(row.tpot_p99_s)]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_search(result: ServingSearchResult, *, top: int) -> None:
    """The ranking, the counts, why points were left out, and the best one's command."""
    from pipesched.search.serving import capacity_command_line

    console = output_console()
    ranking = result.ranking
    shown = ranking if top == 0 else ranking[:top]
    console.print(f"serve search: {result.space['model']} on {result.space['cluster']}; {len(result.rows):,} points, "
                  f"{result.evaluated_now:,} evaluated now", highlight=False, markup=False)
    if shown:
        table = Table(title=f"the {len(shown)} configurations with the most capacity per device")
        # a residency column when the search tried layers off the GPU
        residency = any(row.resident != DEFAULTS.resident for row in result.rows)
        for heading in (*_HEADER[:2], "resident", *_HEADER[2:]) if residency else _HEADER:
            table.add_column(heading, justify="left" if heading in ("layout", "scheduler") else "right")
        for rank, row in enumerate(shown, start=1):
            table.add_row(*_cells(rank, row, residency=residency))
        print_whole(console, table)
    console.print(f"{result.count(SearchStatus.EVALUATED):,} evaluated, {result.count(SearchStatus.OUT_OF_MEMORY):,} out of memory, "
                  f"{result.count(SearchStatus.INVALID):,} invalid", highlight=False)
    for status in (SearchStatus.OUT_OF_MEMORY, SearchStatus.INVALID):
        kinds, example = result.why(status)
        if example is not None:
            console.print(f"  {status}: {', '.join(f'{k} {n}' for k, n in kinds.most_common(4))}; e.g. "
                          f"{example.label}: {example.reason}", highlight=False, markup=False, soft_wrap=True)
    best = result.best
    if best is None:
        console.print("no configuration meets the SLOs", highlight=False)
    else:
        console.print(f"best: {best.label}, {best.max_qps:.3g} requests/s; reproduce with\n  "
                      f"{capacity_command_line(result.space, best)}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"results in {result.db} (run {result.runs})", highlight=False, markup=False)


@command
def run_command(*, model: ServeRunModel = DEFAULTS.serve_run_model, p: ServeRunStages = DEFAULTS.serve_run_p,
                requests: RealRequestOptions, batch: BatchOptions, slo: SloOptions, dtype: RunDtype = DEFAULTS.run_dtype,
                backend: Backend = "gloo", timeout: Timeout = DEFAULTS.run_timeout, as_json: AsJson = False,
                per_request: PerRequest = False) -> None:
    """Serve a trace for real: the model's prefill and decode with a KV cache on P PyTorch
    processes (gloo on CPU, NCCL on GPU), one pipeline stage each, rank 0 forming the
    batches with the simulator's scheduler; every request's token times measured.

    \b
    Examples:
      pipesched serve run --requests 8
      pipesched serve run --requests 8 --scheduler vllm --json
    """
    from pipesched.runtime.serve_run import ServeRunOptions, serve_run

    require(as_json or not per_request, "per-request", "true", "add --json (the requests are listed in it)")
    spec = load_model(model)
    trace = served_requests(requests.workload(), spec.context_length)
    options = ServeRunOptions(p=p, scheduler=batch.spec(), dtype=dtype, backend=backend, timeout_s=timeout)
    with StatusLine(f"serve run ({len(trace)} requests on {p} ranks)") as status:
        report = serve_run(spec, trace, options=options, on_status=status)
    targets = slo.targets()
    result = serve_result(report.run, slo_ttft=targets.slo_ttft, slo_tpot=targets.slo_tpot)
    if as_json:  # how it ran, then the measured metrics under the SLOs asked for (serve simulate's keys)
        print_json({**report.to_dict(), **result.to_dict(per_request=per_request)})
        return
    print_summary(f"serve run: {spec.name} on {p} {backend} ranks ({report.partition}), measured", report.run,
                  result, output_console())


@command
def check_command(*, model: ServeRunModel = DEFAULTS.serve_run_model, p: ServeRunStages = DEFAULTS.serve_run_p,
                  requests: RealRequestOptions, batch: BatchOptions, dtype: RunDtype = DEFAULTS.run_dtype,
                  backend: Backend = "gloo", timeout: Timeout = DEFAULTS.run_timeout, output: LatencyModelOut = None,
                  as_json: AsJson = False) -> None:
    """Check the simulation against a real run: profile every stage, serve the trace for
    real, fit a latency model to the profile, simulate the same trace on it, and compare
    every request's TTFT, TPOT and end-to-end latency (median error; pass within 10%).

    \\b
    Examples:
      pipesched serve check --requests 8
      pipesched serve check --requests 8 -o fitted.csv --json
    """
    from pipesched.runtime.serve_check import CHECK_REPEATS, serve_check
    from pipesched.runtime.serve_run import ServeRunOptions

    check_outputs((("output", output),))
    spec = load_model(model)
    trace = served_requests(requests.workload(), spec.context_length)
    options = ServeRunOptions(p=p, scheduler=batch.spec(), dtype=dtype, backend=backend, timeout_s=timeout,
                              profile_repeats=CHECK_REPEATS)
    with StatusLine(f"serve check ({len(trace)} requests on {p} ranks)") as status:
        report = serve_check(spec, trace, options=options, on_status=status)
    if output is not None:
        for path in write_all([Output(output, dumps_latency_model(report.rows), "csv")]):
            wrote(path)
    if as_json:
        print_json(report.to_dict())
        return
    print_check(report, output_console())


def print_check(report: ServeCheckReport, console: Console) -> None:
    """Predicted against measured, metric by metric, and the verdict."""
    table = Table(title="predicted against measured (error = (predicted - measured) / measured)")
    for heading in ("", "measured p50 (s)", "predicted p50 (s)", "median error", "median |error|", "requests"):
        table.add_column(heading, justify="left" if not heading else "right")
    for name, values in report.to_dict()["metrics"].items():
        table.add_row(name, f"{values['measured_median']:.4f}", f"{values['predicted_median']:.4f}",
                      f"{values['median_error']:+.1%}", f"{values['median_abs_error']:.1%}", str(values["requests"]))
    print_whole(console, table)
    verdict = "pass" if report.passed else "fail"
    console.print(f"{verdict}: every median |error| within {report.tolerance:.0%}" if report.passed else
                  f"{verdict}: a median |error| over {report.tolerance:.0%}", highlight=False, markup=False)


def serve_help(ctx: typer.Context) -> None:
    """(bare `pipesched serve`: its help, and success, as bare `pipesched`)"""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    serve = typer.Typer(help=HELP, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    serve.callback(invoke_without_command=True)(serve_help)
    serve.command("simulate")(simulate_command)
    serve.command("capacity")(capacity_command)
    serve.command("search")(search_command)
    serve.command("run")(run_command)
    serve.command("check")(check_command)
    serve.command("residency")(residency_command)
    serve.command("pool")(pool_command)
    serve.command("offline")(offline_command)
    app.add_typer(serve, name="serve")
