"""`pipesched simulate`: one iteration of a schedule with real costs and communication."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Annotated

import typer
from rich.table import Table

from pipesched.cli.output import console as output_console
from pipesched.cli.schedules import load_or_generate
from pipesched.cli.views import Html, NoTimeline, Png, Svg, Trace, ViewPaths, print_timeline
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES
from pipesched.io.stage_costs import load_stage_costs
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_MICRO_BATCH_SIZE,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    check_amount,
    check_count,
    check_number_text,
)
from pipesched.metrics import summarize
from pipesched.schedule import Schedule
from pipesched.simulate import simulate
from pipesched.simulate.setup import DEFAULT_SCENARIO, SimulationSetup, describe_model_setup

GiB = 2.0**30

# options that pick what the simulation runs on, shared with `pipesched compare`
Model = Annotated[str | None, typer.Option("--model", help=f"model preset or file [default: {DEFAULT_SCENARIO.model}]")]
ClusterName = Annotated[str | None, typer.Option("--cluster", help=f"cluster preset or YAML file [default: {DEFAULT_SCENARIO.cluster}]")]
MicroBatchSize = Annotated[int | None, typer.Option("--micro-batch-size", "-b", help="sequences per microbatch [default: 1]")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", "-s", help=f"tokens per sequence [default: {DEFAULT_SCENARIO.settings.seq_len}]")]
TensorParallel = Annotated[int | None, typer.Option(
    "--tensor-parallel", "-t",
    help=f"tensor-parallel degree; pipeline device d runs on cluster rank d x t [default: {DEFAULT_SCENARIO.settings.tensor_parallel}]")]
Recompute = Annotated[str | None, typer.Option("--recompute", help=f"none, selective or full [default: {DEFAULT_SCENARIO.settings.recompute}]")]
StageCostsFile = Annotated[str | None, typer.Option(
    "--stage-costs",
    help="CSV of measured per-stage costs: stage,forward,backward_input,backward_weight,activation_bytes,output_bytes")]
Latency = Annotated[float | None, typer.Option("--latency", help="link latency in seconds, with --stage-costs [default: 0]")]
Bandwidth = Annotated[str | None, typer.Option("--bandwidth", help="link bandwidth in bytes/s or inf, with --stage-costs [default: inf]")]
NoContention = Annotated[bool, typer.Option("--no-contention", help="transfers never wait for a busy channel")]
NoOverlap = Annotated[bool, typer.Option("--no-overlap", help="blocking runtime: no compute while a device sends or receives")]


def parse_bandwidth(text: str | None) -> float:
    """``--bandwidth`` text -> bytes/s (``inf`` allowed)."""
    if text is None or text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(check_number_text("bandwidth", text))
    except ValueError:
        raise PipeschedError(f"bandwidth={text!r}: not a number; give bytes/s like 2.5e10, or inf") from None
    if not value > 0:
        raise PipeschedError(f"bandwidth={text}: must be > 0 bytes/s (use inf for free links)")
    if not value <= MAX_AMOUNT:
        raise PipeschedError(f"bandwidth={text}: over the limit of {MAX_AMOUNT:g} bytes/s; write inf for free links")
    return value


def build_setup(
    *,
    num_stages: int | None,
    model: str | None,
    cluster: str | None,
    micro_batch_size: int | None,
    seq_len: int | None,
    tensor_parallel: int | None,
    recompute: str | None,
    stage_costs: str | None,
    latency: float | None,
    bandwidth: str | None,
) -> SimulationSetup:
    """The simulation setup the options ask for: a stage-cost file with uniform links, or a
    model on a cluster (each unset option from the default scenario)."""
    model_options = {"--model": model, "--cluster": cluster, "--tensor-parallel": tensor_parallel,
                     "--recompute": recompute}
    if stage_costs is not None:
        given = [name for name, value in model_options.items() if value is not None]
        if given:
            raise PipeschedError(f"{given[0].lstrip('-')}={model_options[given[0]]}: not with --stage-costs; "
                                 "give either a model and cluster or a stage-cost file")
        costs = load_stage_costs(stage_costs)
        if num_stages is not None and num_stages % costs.num_stages:
            raise PipeschedError(f"stage_costs={stage_costs}: {costs.num_stages} stage rows but the schedule has "
                                 f"{num_stages} stages; give {num_stages} rows (or a divisor of {num_stages})")
        links = check_amount("latency", latency, limit=MAX_SECONDS, unit="seconds") if latency is not None else 0.0
        rate = parse_bandwidth(bandwidth)
        batch = check_count("micro-batch-size", micro_batch_size, MAX_MICRO_BATCH_SIZE) if micro_batch_size is not None else 1
        if seq_len is not None:
            check_count("seq-len", seq_len, MAX_SEQ_LEN)
        return SimulationSetup.from_costs(costs, latency=links, bandwidth=rate,
                                          micro_batch_size=batch, seq_len=seq_len,
                                          description=f"stage costs {stage_costs}, links {links:g} s + bytes / {rate:g} B/s")
    if latency is not None or bandwidth is not None:
        name = "latency" if latency is not None else "bandwidth"
        raise PipeschedError(f"{name}={latency if latency is not None else bandwidth}: only with --stage-costs; "
                             "with a model the cluster file gives the links")
    from pipesched.model import load_cluster, load_model

    base = DEFAULT_SCENARIO.settings
    settings = dataclasses.replace(
        base,
        micro_batch_size=micro_batch_size if micro_batch_size is not None else base.micro_batch_size,
        seq_len=seq_len if seq_len is not None else base.seq_len,
        tensor_parallel=tensor_parallel if tensor_parallel is not None else base.tensor_parallel,
        recompute=recompute if recompute is not None else base.recompute,
    )
    spec = load_model(model or DEFAULT_SCENARIO.model)
    machines = load_cluster(cluster or DEFAULT_SCENARIO.cluster)
    setup = SimulationSetup.from_model(spec, machines, settings)
    return dataclasses.replace(setup, description=describe_model_setup(spec.name, machines.name, settings,
                                                                       measured=bool(spec.measured)))


def simulate_command(
    schedule_name: Annotated[str, typer.Argument(metavar="SCHEDULE|FILE", help="schedule family or schedule file (.txt, .csv, .json)")],
    p: Annotated[int | None, typer.Option("-p", help=f"pipeline devices [default: {DEFAULT_SCENARIO.p}]")] = None,
    m: Annotated[int | None, typer.Option("-m", help=f"microbatches [default: {DEFAULT_SCENARIO.m}]")] = None,
    v: Annotated[int | None, typer.Option("-v", help="chunks (stages) per device, for families that take it")] = None,
    family_settings: Annotated[list[str] | None, typer.Option("--set", help="family option KEY=VALUE")] = None,
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
    as_json: Annotated[bool, typer.Option("--json", help="print the metrics as one JSON object")] = False,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
    no_timeline: NoTimeline = False,
) -> None:
    """Simulate one training iteration of a schedule: iteration time, bubbles, communication,
    memory per device, throughput. Without --model/--cluster/--stage-costs it runs the
    default scenario's model and cluster.

    \b
    Examples:
      pipesched simulate zb-v -p 8 -m 32
      pipesched simulate 1f1b -p 4 -m 8 --model llama3-8b --cluster 1x8-h100 -t 2 --json
    """
    views = ViewPaths(png, svg, trace, html).check()
    schedule = _schedule(schedule_name, p, m, v, family_settings)
    setup = build_setup(num_stages=schedule.num_stages, model=model, cluster=cluster,
                        micro_batch_size=micro_batch_size, seq_len=seq_len, tensor_parallel=tensor_parallel,
                        recompute=recompute, stage_costs=stage_costs, latency=latency, bandwidth=bandwidth)
    network = setup.network_for(schedule)
    timeline = simulate(schedule, setup.costs_for(schedule), network, contention=not no_contention, overlap=not no_overlap)
    peaks = setup.peak_flops_per_device(network)
    metrics = summarize(timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                        flops_per_iteration=setup.flops_per_iteration(schedule.num_microbatches),
                        peak_flops=peaks[: schedule.num_devices] if peaks is not None else None)
    views.write([timeline], title=f"{schedule.name}: {setup.description}")
    if as_json:
        typer.echo(json.dumps(_json(schedule, setup, network, timeline, metrics, not no_contention, not no_overlap), indent=1))
        return
    _print(schedule, setup, network, timeline, metrics, not no_contention, not no_overlap, timeline_view=not no_timeline)


def _schedule(name: str, p: int | None, m: int | None, v: int | None, settings: list[str] | None) -> Schedule:
    if name not in FAMILIES and any(ch in name for ch in "./\\"):
        for flag, value in (("p", p), ("m", m), ("v", v)):
            if value is not None:
                raise PipeschedError(f"{flag}={value}: a schedule file fixes its own sizes; drop -{flag}")
    return load_or_generate(name, p=p if p is not None else DEFAULT_SCENARIO.p,
                            m=m if m is not None else DEFAULT_SCENARIO.m, v=v, settings=settings)


def _json(schedule, setup, network, timeline, metrics, contention, overlap) -> dict:
    path = timeline.meta["critical_path"]
    return {
        "schedule": schedule.name,
        "p": schedule.num_devices,
        "m": schedule.num_microbatches,
        "num_stages": schedule.num_stages,
        "setup": setup.description,
        "ranks": list(network.ranks[: schedule.num_devices]),
        "contention": contention,
        "overlap": overlap,
        "iteration_time_s": metrics.iteration_time,
        "bubble_ratio": metrics.bubble_ratio,
        "bubble_over_work": metrics.bubble_over_work,
        "bubble_per_device": list(metrics.bubble_per_device),
        "throughput_samples_per_s": metrics.throughput_samples_per_s,
        "throughput_tokens_per_s": metrics.throughput_tokens_per_s,
        "mfu": metrics.mfu,
        "peak_memory_bytes": list(metrics.peak_memory),
        "memory_capacity_bytes": list(timeline.memory.capacity) if timeline.memory.capacity else None,
        "out_of_memory": list(metrics.out_of_memory),
        "exposed_comm_s": list(metrics.exposed_comm),
        "hidden_comm_s": list(metrics.hidden_comm),
        "critical_path": {
            "ops": metrics.critical_path_ops,
            "transfers": metrics.critical_path_transfers,
            "compute_s": metrics.critical_path_compute,
            "comm_s": metrics.critical_path_comm,
            "length": len(path),
        },
        "optimizer_step_s": list(timeline.meta["optimizer_step_s"]),
        "num_ops": len(timeline),
        "num_transfers": len(timeline.transfers),
    }


def _print(schedule, setup, network, timeline, metrics, contention, overlap, *, timeline_view: bool = True) -> None:
    console = output_console()
    if timeline_view:
        print_timeline(timeline, console)
    mode = ", ".join(x for x in ("contention" if contention else "no contention",
                                   "overlap" if overlap else "blocking (no overlap)"))
    summary = Table(title=f"{schedule.name}: p={schedule.num_devices}, m={schedule.num_microbatches}, "
                          f"{schedule.num_stages} stages; {setup.description}; {mode}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("iteration time", f"{metrics.iteration_time:.6g} s")
    summary.add_row("bubble ratio (idle / devices x time)", f"{metrics.bubble_ratio:.4f}")
    summary.add_row("bubble over work (idle / busy)", f"{metrics.bubble_over_work:.4f}")
    summary.add_row("throughput", f"{metrics.throughput_samples_per_s:.4g} samples/s"
                    + (f", {metrics.throughput_tokens_per_s:.4g} tokens/s" if metrics.throughput_tokens_per_s else ""))
    if metrics.mfu is not None:
        summary.add_row("MFU", f"{metrics.mfu:.1%}")
    summary.add_row("critical path", f"{metrics.critical_path_ops} ops ({metrics.critical_path_compute:.4g} s), "
                                     f"{metrics.critical_path_transfers} transfers ({metrics.critical_path_comm:.4g} s)")
    summary.add_row("communication exposed / hidden (sum)",
                    f"{sum(metrics.exposed_comm):.4g} s / {sum(metrics.hidden_comm):.4g} s")
    console.print(summary)
    devices = Table(title="per device (memory in GiB)")
    for column in ("device", "rank", "busy s", "bubble", "exposed comm s", "hidden comm s", "peak", "capacity", "fits"):
        devices.add_column(column, justify="right")
    capacity = timeline.memory.capacity
    for d in range(schedule.num_devices):
        fits = "-" if capacity is None else ("yes" if not metrics.out_of_memory[d] else "NO")
        devices.add_row(str(d), str(network.ranks[d]), f"{metrics.busy_per_device[d]:.4g}",
                        f"{metrics.bubble_per_device[d]:.3f}", f"{metrics.exposed_comm[d]:.4g}",
                        f"{metrics.hidden_comm[d]:.4g}", f"{metrics.peak_memory[d] / GiB:.2f}",
                        "-" if capacity is None else f"{capacity[d] / GiB:.2f}", fits)
    console.print(devices)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)
