"""`pipesched simulate`: one iteration of a schedule with real costs and communication."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
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
    workload,
)
from pipesched.cli.schedules import load_or_generate
from pipesched.cli.views import Html, NoTimeline, Png, Svg, Trace, ViewPaths, print_timeline
from pipesched.errors import PipeschedError
from pipesched.experiments.simulation import Simulation, simulate_point
from pipesched.generators import FAMILIES, get_family

GiB = 2.0**30


def simulate_command(
    schedule_name: Annotated[str, typer.Argument(metavar="SCHEDULE|FILE", help="schedule family or schedule file (.txt, .csv, .json)")],
    p: Devices = None,
    m: Microbatches = None,
    v: Chunks = None,
    family_settings: FamilySettings = None,
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
    no_timeline: NoTimeline = False,
) -> None:
    """Simulate one training iteration of a schedule: iteration time, bubbles, communication,
    memory per device, throughput. Without --model/--cluster/--stage-costs it runs the
    default scenario's model and cluster."""
    views = ViewPaths(png, svg, trace, html).check()
    schedule = load_or_generate(schedule_name, p=p, m=m, v=v, settings=family_settings)
    options, _, fb_cost = family_options(family_settings)
    point = workload(model=model, cluster=cluster, micro_batch_size=micro_batch_size, seq_len=seq_len,
                     tensor_parallel=tensor_parallel, recompute=recompute, partition=partition,
                     stage_costs=stage_costs, latency=latency, bandwidth=bandwidth, no_contention=no_contention,
                     no_overlap=no_overlap, steady_state=steady_state).replace(fb_cost=fb_cost)
    if schedule_name in FAMILIES:
        # a family is built by the point: the cost-planning ones plan with the workload's costs
        family = get_family(schedule_name)
        point = point.replace(family=schedule_name, p=schedule.num_devices,
                              m=int(schedule.params.get("iteration_microbatches", schedule.num_microbatches)),
                              v=v if family.chunks is None else None,
                              options=tuple(sorted((k, x) for k, x in options.items() if k in family.options)))
    else:
        point = point.replace(schedule=schedule)
    if point.stage_costs is not None and schedule.num_stages % point.stage_costs.num_stages:
        raise PipeschedError(f"stage_costs={stage_costs}: {point.stage_costs.num_stages} stage rows but the schedule "
                             f"has {schedule.num_stages} stages; give {schedule.num_stages} rows (or a divisor of "
                             f"{schedule.num_stages})")
    result = simulate_point(point)
    views.write([result.timeline], title=f"{schedule.name}: {result.setup.description}")
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    _print(result, timeline_view=not no_timeline)


def _print(result: Simulation, *, timeline_view: bool = True) -> None:
    schedule, setup, network, timeline, metrics = (result.schedule, result.setup, result.network, result.timeline,
                                                   result.metrics)
    contention, overlap = result.point.contention, result.point.overlap
    console = Console() if Console().is_terminal else Console(width=140)
    if timeline_view:
        print_timeline(timeline, console)
    mode = ", ".join(x for x in ("contention" if contention else "no contention",
                                   "overlap" if overlap else "blocking (no overlap)"))
    summary = Table(title=f"{schedule.name}: p={schedule.num_devices}, m={schedule.num_microbatches}, "
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
