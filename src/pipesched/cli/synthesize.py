"""`pipesched synthesize`: a schedule made by a solver for given stage costs and a memory cap."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched import io
from pipesched.cli.options import (
    AsJson,
    Bandwidth,
    BandwidthEfficiency,
    ClusterName,
    Devices,
    Dtype,
    HostBandwidth,
    HostMemory,
    Latency,
    MatmulEfficiency,
    MemoryLimit,
    Microbatches,
    MicroBatchSize,
    Model,
    PartitionOption,
    Recompute,
    SeqLen,
    SequenceParallel,
    StageCostsFile,
    TensorParallel,
    parse_memory_limit,
    workload,
)
from pipesched.cli.views import Html, NoTimeline, Png, Svg, Trace, ViewPaths, print_timeline
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.io.files import Output
from pipesched.limits import MAX_TIMEOUT_S, check_amount
from pipesched.schedule import Placement, Schedule
from pipesched.units import GiB

BACKWARDS = ("split", "full")


def synthesize_command(
    p: Devices = None,
    m: Microbatches = None,
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
    stage_costs: StageCostsFile = None,
    latency: Latency = None,
    bandwidth: Bandwidth = None,
    memory_limit: MemoryLimit = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="seconds for the whole synthesis")] = 10.0,
    backward: Annotated[str, typer.Option("--backward", help="split (I and W ops) or full (one B op)")] = "split",
    allow_recompute: Annotated[bool, typer.Option(
        "--allow-recompute", help="let the solver choose stages that keep only their input and redo the forward in the backward")] = False,
    allow_offload: Annotated[bool, typer.Option(
        "--allow-offload", help="let the solver choose stages that offload their activations to host memory over the "
                                "devices' host links (an O after each forward, an R before each backward)")] = False,
    host_bandwidth: HostBandwidth = None,
    host_memory: HostMemory = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="write the schedule, in the format its extension names: .json JSON, .csv PyTorch CSV, else grid text")] = None,
    as_json: AsJson = False,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
    no_timeline: NoTimeline = False,
) -> None:
    """Synthesize the fastest one-stage-per-device schedule under a memory cap with a CP-SAT
    solver (warm-started from the best built-in family), with its proven lower bound.
    Without --model/--cluster/--stage-costs it runs the default scenario's model and cluster.

    \b
    Examples:
      pipesched synthesize -p 4 -m 8 --model llama3-8b --cluster 1x8-h100 -t 2 --time-limit 5 --json
    """
    require(backward in BACKWARDS, "backward", backward, f"choose one of {', '.join(BACKWARDS)}")
    check_amount("time-limit", time_limit, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")
    if output is not None:
        for flag, allowed, what in (("--allow-recompute", allow_recompute, "stage checkpoints"),
                                    ("--allow-offload", allow_offload, "offloads and reloads")):
            require(not (allowed and io.output_format(output) == "csv"), "output", output,
                    f"PyTorch's CSV cannot carry the {what} {flag} may choose; write .json or .txt")
    views = ViewPaths(png, svg, trace, html).check(("output", output))
    limit = parse_memory_limit(memory_limit)
    from pipesched.search.problem import check_size

    p = p if p is not None else DEFAULTS.p
    m = m if m is not None else DEFAULTS.m
    check_size(p, m, split_backward=backward == "split")
    setup = workload(model=model, cluster=cluster, micro_batch_size=micro_batch_size, seq_len=seq_len,
                     tensor_parallel=tensor_parallel, recompute=recompute, partition=partition, dtype=dtype, sequence_parallel=sequence_parallel,
                     matmul_efficiency=matmul_efficiency, bandwidth_efficiency=bandwidth_efficiency,
                     stage_costs=stage_costs, latency=latency, bandwidth=bandwidth, host_bandwidth=host_bandwidth,
                     host_memory=host_memory).setup()
    # costs and links depend only on the placement: one stage per device
    placement = Schedule("synthesized", Placement.one_per_device(p), m, ((),) * p)
    costs, network = setup.costs_for(placement), setup.network_for(placement)
    if limit is None and network.capacity is not None:
        limit = network.capacity[:p]

    from pipesched.search.synthesis import synthesize

    result = synthesize(costs, network, m, memory_limit=limit, split_backward=backward == "split",
                        allow_recompute=allow_recompute, allow_offload=allow_offload, time_limit=time_limit)
    schedule = result.schedule
    layout = setup.layout_for(placement)
    if layout is not None:  # the layers of each stage, so that the file simulates as synthesized
        schedule = schedule.with_ops(schedule.device_ops, params={**schedule.params, "partition": layout})
    # the schedule file and the pictures, all or none
    schedule_file = [Output(output, io.dumps(schedule, io.output_format(output)))] if output is not None else []
    views.write([result.timeline], title=f"synthesized, p={p}, m={m}: {setup.description}", others=schedule_file)
    if as_json:
        typer.echo(json.dumps({**result.to_dict(), "partition": layout, "setup": setup.description}, indent=1))
        return
    _print(result, network, setup.description, timeline_view=not no_timeline)


def _memory(nbytes: float) -> str:
    return f"{nbytes / GiB:.4g} GiB" if nbytes >= GiB else f"{nbytes:.4g} B"


def _seconds(x: float) -> str:
    return f"{x:.6g} s"


def _print(result, network, description: str, *, timeline_view: bool) -> None:
    from pipesched.simulate import simulate

    console = Console() if Console().is_terminal else Console(width=140)
    if timeline_view:
        print_timeline(result.timeline, console)
    schedule = result.schedule
    contended = simulate(schedule, result.costs, network).makespan
    table = Table(title=f"synthesized: p={schedule.num_devices}, m={schedule.num_microbatches}, "
                        f"{'split' if schedule.splits_backward else 'full'} backward; {description}")
    table.add_column("")
    table.add_column("value", justify="right")
    made = result.method if result.method == "solver" else f"{result.method} (solver: {result.solver_status})"
    table.add_row("status", f"{result.status}, made by {made}")
    table.add_row("makespan (no contention)", _seconds(result.makespan_s))
    table.add_row("lower bound (solver)", f"{_seconds(result.lower_bound_s)}, gap {result.gap:.3%}")
    if result.baseline is not None:
        table.add_row("best built-in family", f"{result.baseline.label}: {_seconds(result.baseline.makespan)} "
                                              f"({result.speedup_over_baseline:.4f}x)")
    else:
        table.add_row("best built-in family", "none fits the memory limit")
    table.add_row("makespan with link contention", _seconds(contended))
    table.add_row("stage checkpoints",
                  "stages " + ", ".join(map(str, result.recompute)) if result.recompute else "none")
    if result.offload:
        table.add_row("offload", "stages " + ", ".join(map(str, result.offload)))
    peaks = result.timeline.memory.peak
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    limit = result.memory_limit
    table.add_row("peak memory", f"{_memory(peaks[worst])} (device {worst})"
                                 + (f", limit {_memory(limit[worst])}" if limit else ""))
    table.add_row("solver time grid", _seconds(result.time_unit_s))
    table.add_row("time taken", _seconds(result.seconds))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("synthesize")(synthesize_command)
