"""`pipesched simulate`: one iteration of a schedule with real costs and communication."""

from __future__ import annotations

import json
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from pipesched.cli.options import (
    AsJson,
    Bandwidth,
    BandwidthEfficiency,
    Chunks,
    ClusterName,
    DataParallelSize,
    Devices,
    Dtype,
    FamilySettings,
    FreezePlan,
    FrozenLayers,
    HostBandwidth,
    HostMemory,
    Jitter,
    JitterFile,
    Latency,
    MatmulEfficiency,
    Microbatches,
    MicroBatchSize,
    Model,
    NoContention,
    NoOverlap,
    Offload,
    PartitionOption,
    RandomStraggler,
    Recompute,
    Samples,
    Seed,
    SeqLen,
    SequenceParallel,
    SlowLink,
    StageCostsFile,
    SteadyStateFlag,
    Straggler,
    TensorParallel,
    ZeroStage,
    family_options,
    parse_settings,
    variability_options,
    workload,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.schedules import carried_partition, load_or_generate
from pipesched.cli.training import freeze_plan_option, report_freeze_plan, training_columns
from pipesched.cli.views import Html, NoTimeline, Png, Svg, Trace, ViewPaths, print_timeline
from pipesched.errors import PipeschedError, shorten
from pipesched.experiments.simulation import Simulation, simulate_point
from pipesched.generators import FAMILIES, get_family
from pipesched.metrics import allreduce_per_device, iteration_microbatches
from pipesched.units import GiB
from pipesched.variability.distribution import Distribution, Spread


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
    dtype: Dtype = None,
    sequence_parallel: SequenceParallel = None,
    matmul_efficiency: MatmulEfficiency = None,
    bandwidth_efficiency: BandwidthEfficiency = None,
    dp: DataParallelSize = None,
    zero: ZeroStage = None,
    stage_costs: StageCostsFile = None,
    latency: Latency = None,
    bandwidth: Bandwidth = None,
    no_contention: NoContention = False,
    no_overlap: NoOverlap = False,
    frozen_layers: FrozenLayers = None,
    offload: Offload = None,
    host_bandwidth: HostBandwidth = None,
    host_memory: HostMemory = None,
    freeze_plan: FreezePlan = None,
    jitter: Jitter = None,
    jitter_file: JitterFile = None,
    straggler: Straggler = None,
    random_straggler: RandomStraggler = None,
    slow_link: SlowLink = None,
    samples: Samples = None,
    seed: Seed = None,
    steady_state: SteadyStateFlag = False,
    as_json: AsJson = False,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
    no_timeline: NoTimeline = False,
) -> None:
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
    views = ViewPaths(png, svg, trace, html).check()
    plan = freeze_plan_option(freeze_plan, frozen_layers=frozen_layers,
                              views={"png": png, "svg": svg, "trace": trace, "html": html},
                              variability={"jitter": jitter, "jitter-file": jitter_file, "straggler": straggler,
                                           "random-straggler": random_straggler, "slow-link": slow_link,
                                           "samples": samples, "seed": seed})
    variability = variability_options(jitter=jitter, jitter_file=jitter_file, straggler=straggler,
                                      random_straggler=random_straggler, slow_link=slow_link, samples=samples,
                                      seed=seed)
    schedule = load_or_generate(schedule_name, p=p, m=m, v=v, settings=family_settings)
    if partition is None and stage_costs is None:
        partition = carried_partition(schedule)
    options, _, fb_cost = family_options(family_settings)
    if "costs" in options and (schedule_name not in FAMILIES or "costs" not in get_family(schedule_name).options):
        # the slot costs of levels 1 and 2: the simulation costs its ops from the workload
        raise PipeschedError(f"costs={shorten(parse_settings(family_settings)['costs'])}: simulate costs the ops from "
                             "the workload (--model or --stage-costs), and this schedule does not plan with slot "
                             "costs; drop --set costs")
    point = workload(model=model, cluster=cluster, micro_batch_size=micro_batch_size, seq_len=seq_len,
                     tensor_parallel=tensor_parallel, recompute=recompute, partition=partition, dtype=dtype, sequence_parallel=sequence_parallel,
                     matmul_efficiency=matmul_efficiency, bandwidth_efficiency=bandwidth_efficiency,
                     dp=dp, zero=zero, stage_costs=stage_costs, latency=latency, bandwidth=bandwidth, no_contention=no_contention,
                     no_overlap=no_overlap, frozen_layers=frozen_layers, offload=offload,
                     host_bandwidth=host_bandwidth, host_memory=host_memory, steady_state=steady_state).replace(fb_cost=fb_cost)
    if point.stage_costs is not None and schedule.num_stages % point.stage_costs.num_stages:
        raise PipeschedError(f"stage_costs={stage_costs}: {point.stage_costs.num_stages} stage rows but the schedule "
                             f"has {schedule.num_stages} stages; give {schedule.num_stages} rows (or a divisor of "
                             f"{schedule.num_stages})")
    if schedule_name in FAMILIES:
        # a family is built by the point: the cost-planning ones plan with the workload's costs,
        # and frozen layers regenerate the family's own table for its frozen stages
        family = get_family(schedule_name)
        point = point.replace(family=schedule_name, p=schedule.num_devices,
                              m=int(schedule.params.get("iteration_microbatches", schedule.num_microbatches)),
                              v=v if family.takes_v else None,
                              options=tuple(sorted((k, x) for k, x in options.items() if k in family.options)))
    else:
        point = point.replace(schedule=schedule)
    point = point.replace(variability=variability)
    if plan is not None:
        report_freeze_plan(plan, [point], as_json=as_json)
        return
    result = simulate_point(point)
    plots = None
    if result.distribution is not None:
        plots = [{"name": schedule.name, "samples": result.distribution.makespan,
                  "deterministic": result.distribution.deterministic}]
    views.write([result.timeline], title=f"{schedule.name}: {result.setup.description}", distributions=plots,
                comparison=[_rates_row(result)])
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    _print(result, timeline_view=not no_timeline)


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
