"""`pipesched simulate`: one iteration of a schedule with real costs and communication."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from pipesched.cli.groups import (
    EngineOptions,
    TrainingOptions,
    VariabilityOptions,
    WorkloadOptions,
)
from pipesched.cli.options import AsJson, ScheduleOptions, command, parse_settings
from pipesched.cli.output import console as output_console
from pipesched.cli.schedules import carried_partition, load_or_generate
from pipesched.cli.training import freeze_plan_option, report_freeze_plan, training_columns
from pipesched.cli.views import NoTimeline, ViewPaths, print_timeline
from pipesched.errors import PipeschedError, shorten
from pipesched.experiments.point import Point, check_stage_rows, points_for
from pipesched.experiments.simulation import Simulation, simulate_point
from pipesched.generators import FAMILIES, get_family
from pipesched.metrics import allreduce_per_device, iteration_microbatches
from pipesched.units import GiB
from pipesched.variability.distribution import Distribution, Spread

ScheduleName = Annotated[str, typer.Argument(metavar="SCHEDULE|FILE",
                                             help="schedule family or schedule file (.txt, .csv, .json)")]


@command
def simulate_command(schedule_name: ScheduleName, schedule: ScheduleOptions, workload: WorkloadOptions,
                     training: TrainingOptions, engine: EngineOptions, variability: VariabilityOptions,
                     views: ViewPaths, as_json: AsJson = False, no_timeline: NoTimeline = False) -> None:
    """Simulate one training iteration of a schedule: iteration time, bubbles, communication,
    memory per device, throughput; frozen, recomputed and offloaded work per device. Without
    --model/--cluster/--stage-costs it runs the default scenario's model and cluster.
    --jitter, --jitter-file, --straggler, --random-straggler and --slow-link add a Monte
    Carlo run: the distribution of the iteration time, bubble and memory, and what sets the
    iteration time.

    \b
    Examples:
      pipesched simulate zb-v -p 8 -m 32
      pipesched simulate 1f1b -p 4 -m 8 --model llama3-8b --cluster 1x8-h100 -t 2 --json
      pipesched simulate zb-h1 -p 4 -m 8 --model llama3-8b --cluster 1x8-h100 -t 2 --jitter 0.1 --samples 500
    """
    views.check()
    plan = freeze_plan_option(training, views=views, variability=variability)
    point = _point(schedule_name, schedule, workload, training, engine).replace(variability=variability.model())
    if plan is not None:
        report_freeze_plan(plan, [point], as_json=as_json)
        return
    result = simulate_point(point)
    plots = None if result.distribution is None else [
        {"name": result.schedule.name, "samples": result.distribution.makespan,
         "deterministic": result.distribution.deterministic}]
    views.write([result.timeline], title=f"{result.schedule.name}: {result.setup.description}", distributions=plots,
                comparison=[_rates_row(result)])
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    _print(result, timeline_view=not no_timeline)


def _point(name: str, schedule: ScheduleOptions, workload: WorkloadOptions, training: TrainingOptions,
           engine: EngineOptions) -> Point:
    """The point of the family or schedule file ``name`` on the workload asked for; a file's
    carried partition is the default ``--partition`` of its model."""
    table = load_or_generate(name, p=schedule.p, m=schedule.m, v=schedule.v, settings=schedule.family_settings)
    if workload.partition is None and workload.stage_costs is None:
        workload = dataclasses.replace(workload, partition=carried_partition(table))
    request = schedule.request()
    if "costs" in dict(request["options"]) and (name not in FAMILIES or "costs" not in get_family(name).options):
        # the slot costs of levels 1 and 2: the simulation costs its ops from the workload
        raise PipeschedError(f"costs={shorten(parse_settings(schedule.family_settings)['costs'])}: simulate costs the "
                             "ops from the workload (--model or --stage-costs), and this schedule does not plan with "
                             "slot costs; drop --set costs")
    template = workload.point(training, engine).replace(**request)
    check_stage_rows(template, table)
    # a family at the sizes of its table, or the table of a file as it is
    (point,) = points_for(template, [name if name in FAMILIES else table], p=table.num_devices,
                          m=int(table.iteration_microbatches), v=schedule.v)
    return point


def _rates_row(result: Simulation) -> dict[str, object]:
    """The figures the terminal prints beside the report's metrics: throughput and MFU / HFU."""
    metrics = result.metrics
    tokens = metrics.throughput_tokens_per_s
    return {
        "schedule": result.schedule.name,
        "throughput (samples/s)": f"{metrics.throughput_samples_per_s:,.4g}",
        "throughput (tokens/s)": "-" if tokens is None else f"{tokens:,.0f}",
        "MFU": "-" if metrics.mfu is None else f"{metrics.mfu:.1%}",
        "HFU": "-" if metrics.hfu is None else f"{metrics.hfu:.1%}",
    }


def _print(result: Simulation, *, timeline_view: bool = True) -> None:
    schedule, setup, network, timeline, metrics = (result.schedule, result.setup, result.network, result.timeline,
                                                   result.metrics)
    contention, overlap = result.point.contention, result.point.overlap
    console = output_console()
    if timeline_view:
        print_timeline(timeline, console)
    batches = {"op": "a batch between ops", "pair": "a batch per forward-backward pair"}
    blocking = f"blocking (no overlap, {batches.get(timeline.simulation.blocking_steps, 'batches')})"
    mode = ", ".join(x for x in ("contention" if contention else "no contention", "overlap" if overlap else blocking))
    summary = Table(title=f"{schedule.name}: p={schedule.num_devices}, m={iteration_microbatches(timeline):g}, "
                          f"{schedule.num_stages} stages; {setup.description}; {mode}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    steady = result.steady
    if steady is not None:
        summary.add_row("iterations run back to back", f"{steady.iterations.iterations} ({steady.iterations.mode}), "
                        f"ending at {', '.join(f'{end:.4g}' for end in steady.iteration_end)} s")
        summary.add_row("steady-state iteration time", f"{metrics.iteration_time:.6g} s (mean between the first and the last)")
        weights = steady.weights
        summary.add_row("weight versions per stage", ", ".join(map(str, weights.versions)))
        summary.add_row("staleness (updates behind, max / mean)",
                        f"{weights.max_staleness} / {weights.mean_staleness:.3g}")
    else:
        summary.add_row("iteration time", f"{metrics.iteration_time:.6g} s")
    if schedule.recompute_stages:  # named by the schedule file (synthesize --allow-recompute)
        summary.add_row("stage checkpoints (the schedule's)", "stages " + ", ".join(map(str, schedule.recompute_stages)))
    summary.add_row("bubble ratio (idle / devices x time)", f"{metrics.bubble_ratio:.4f}")
    summary.add_row("bubble over work (idle / busy)", f"{metrics.bubble_over_work:.4f}")
    summary.add_row("throughput", f"{metrics.throughput_samples_per_s:.4g} samples/s"
                    + (f", {metrics.throughput_tokens_per_s:.4g} tokens/s" if metrics.throughput_tokens_per_s else ""))
    if metrics.mfu is not None:
        summary.add_row("MFU / HFU (model / hardware FLOPs)", f"{metrics.mfu:.1%} / {metrics.hfu:.1%}")
    summary.add_row("critical path", f"{metrics.critical_path_ops} ops ({metrics.critical_path_compute:.4g} s), "
                                     f"{metrics.critical_path_transfers} transfers ({metrics.critical_path_comm:.4g} s)")
    summary.add_row("communication exposed / hidden (sum)",
                    f"{sum(metrics.exposed_comm):.4g} s / {sum(metrics.hidden_comm):.4g} s")
    if network.replicas > 1:
        reducing = allreduce_per_device(timeline)
        summary.add_row("data parallel", f"{network.replicas} pipelines; gradient all-reduce up to "
                                         f"{reducing.max():.4g} s per device (device {int(reducing.argmax())})")
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
    training = training_columns(metrics.training, timeline)
    if training:
        work = Table(title="training work per device")
        work.add_column("device", justify="right")
        for column in training:
            work.add_column(column, justify="right")
        for d in range(schedule.num_devices):
            work.add_row(str(d), *(cells[d] for cells in training.values()))
        console.print(work)
    if result.distribution is not None:
        print_distribution(result.distribution, console)


def print_distribution(distribution: Distribution, console: Console, *, shown: int = 5) -> None:
    """The Monte Carlo run: the iteration time's spread, bubble and memory, and the stages,
    devices and links whose times set the iteration time most."""
    time = distribution.time
    table = Table(title=f"variability: {distribution.samples:,} samples, seed {distribution.variability.seed}; "
                        f"{distribution.variability.describe()}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("deterministic iteration time", f"{distribution.deterministic:.6g} s")
    table.add_row("mean ± std (± std. error)", f"{time.mean:.6g} ± {time.std:.3g} s (± {time.stderr:.2g})")
    table.add_row("p50 / p90 / p99", f"{time.p50:.6g} / {time.p90:.6g} / {time.p99:.6g} s")
    table.add_row("min / max", f"{time.min:.6g} / {time.max:.6g} s")
    bubble = Spread.of(distribution.bubble)
    table.add_row("bubble mean (p50 / p99)", f"{bubble.mean:.4f} ({bubble.p50:.4f} / {bubble.p99:.4f})")
    peak = distribution.peak_memory.max(axis=1)
    memory = (f"{peak[0] / GiB:.2f} GiB, the same in every sample" if distribution.memory_constant
              else f"{np.mean(peak) / GiB:.2f} GiB mean, {np.max(peak) / GiB:.2f} GiB max")
    table.add_row("peak memory (worst device)", memory)
    console.print(table)
    influences = Table(title="what sets the iteration time: share of the mean iteration time spent on the critical "
                             "path, and the group's tasks on it per sample")
    for column in ("group", "critical share", "on path per sample"):
        influences.add_column(column, justify="left" if column == "group" else "right")
    for group in ("stage", "device", "link", "kind"):
        for influence in [i for i in distribution.influences if i.group == group][:shown]:
            influences.add_row(f"{group} {influence.name}", f"{influence.critical_share:.3f}",
                               f"{influence.on_path:.2f}")
    console.print(influences)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)
