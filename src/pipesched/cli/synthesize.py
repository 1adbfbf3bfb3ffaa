"""`pipesched synthesize`: a schedule made by a solver for given stage costs and a memory cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched import io
from pipesched.cli.groups import WorkloadOptions
from pipesched.cli.options import (
    AsJson,
    Devices,
    MemoryLimit,
    Microbatches,
    OptionGroup,
    command,
    parse_memory_limit,
)
from pipesched.cli.output import print_json
from pipesched.cli.views import NoTimeline, ViewPaths, print_timeline
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.generators import generate
from pipesched.io.files import Output
from pipesched.limits import MAX_TIMEOUT_S, check_amount
from pipesched.schedule import Schedule
from pipesched.search.problem import check_size
from pipesched.search.synthesis import SynthesisResult, synthesize
from pipesched.simulate import simulate
from pipesched.simulate.network import Network
from pipesched.units import GiB

BACKWARDS = ("split", "full")
ScheduleFile = Annotated[str | None, typer.Option(
    "-o", "--output", help="write the schedule, in the format its extension names: .json JSON, .csv PyTorch CSV, "
                           "else grid text")]


@dataclass(frozen=True)
class SolverOptions(OptionGroup):
    """What the solver may choose, under which memory cap and in how long."""

    memory_limit: MemoryLimit = None
    time_limit: Annotated[float, typer.Option("--time-limit", help="seconds for the whole synthesis")] = 10.0
    backward: Annotated[str, typer.Option("--backward", help="split (I and W ops) or full (one B op)")] = "split"
    allow_recompute: Annotated[bool, typer.Option(
        "--allow-recompute", help="let the solver choose stages that keep only their input and redo the forward in "
                                  "the backward")] = False
    allow_offload: Annotated[bool, typer.Option(
        "--allow-offload", help="let the solver choose stages that offload their activations to host memory over the "
                                "devices' host links (an O after each forward, an R before each backward)")] = False

    def check(self, output: str | None) -> None:
        """The choices are known and the schedule file can carry what the solver may choose."""
        require(self.backward in BACKWARDS, "backward", self.backward, f"choose one of {', '.join(BACKWARDS)}")
        check_amount("time-limit", self.time_limit, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")
        for flag, allowed, what in (("--allow-recompute", self.allow_recompute, "stage checkpoints"),
                                    ("--allow-offload", self.allow_offload, "offloads and reloads")):
            require(not (allowed and output is not None and io.output_format(output) == "csv"), "output", output,
                    f"PyTorch's CSV cannot carry the {what} {flag} may choose; write .json or .txt")

    @property
    def split(self) -> bool:
        return self.backward == "split"

    def synthesize(self, table: Schedule, setup, limit: float | None) -> tuple[SynthesisResult, Network]:
        """The solver's schedule for ``table``'s placement on the workload ``setup`` (the
        memory cap: ``limit``, else the devices' capacity), and the network it ran on."""
        costs, network = setup.costs_for(table), setup.network_for(table)
        if limit is None and network.capacity is not None:
            limit = network.capacity[:table.num_devices]
        return synthesize(costs, network, table.num_microbatches, memory_limit=limit, split_backward=self.split,
                          allow_recompute=self.allow_recompute, allow_offload=self.allow_offload,
                          time_limit=self.time_limit), network


@command
def synthesize_command(*, p: Devices = None, m: Microbatches = None, workload: WorkloadOptions,
                       solver: SolverOptions, output: ScheduleFile = None, as_json: AsJson = False,
                       views: ViewPaths, no_timeline: NoTimeline = False) -> None:
    """Synthesize the fastest one-stage-per-device schedule under a memory cap with a CP-SAT
    solver (warm-started from the best built-in family), with its proven lower bound.
    Without --model/--cluster/--stage-costs it runs the default scenario's model and cluster.

    \b
    Examples:
      pipesched synthesize -p 4 -m 8 --model llama3-8b --cluster 1x8-h100 -t 2 --time-limit 5 --json
    """
    solver.check(output)
    views.check(("output", output))
    limit = parse_memory_limit(solver.memory_limit)
    p, m = DEFAULTS.p if p is None else p, DEFAULTS.m if m is None else m
    check_size(p, m, split_backward=solver.split)
    setup = workload.point().setup()
    table = generate("1f1b", p, m)  # costs and links depend only on the placement: one stage per device
    result, network = solver.synthesize(table, setup, limit)
    layout = setup.layout_for(table)
    schedule = result.schedule
    if layout is not None:  # the layers of each stage, so that the file simulates as synthesized
        schedule = schedule.with_ops(schedule.device_ops, params={**schedule.params, "partition": layout})
    # the schedule file and the pictures, all or none
    schedule_file = [Output(output, io.dumps(schedule, io.output_format(output)))] if output is not None else []
    views.write([result.timeline], title=f"synthesized, p={p}, m={m}: {setup.description}", others=schedule_file)
    if as_json:
        print_json({**result.to_dict(), "partition": layout, "setup": setup.description})
        return
    _print(result, network, setup.description, timeline_view=not no_timeline)


def _memory(nbytes: float) -> str:
    return f"{nbytes / GiB:.4g} GiB" if nbytes >= GiB else f"{nbytes:.4g} B"


def _seconds(x: float) -> str:
    return f"{x:.6g} s"


def _print(result, network, description: str, *, timeline_view: bool) -> None:
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
