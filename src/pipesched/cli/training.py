"""What the commands print about frozen, recomputed and offloaded work, and freeze plans."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from pipesched.cli.groups import TrainingOptions, VariabilityOptions
from pipesched.cli.options import refuse_with
from pipesched.cli.output import print_json
from pipesched.cli.views import ViewPaths
from pipesched.enums import Role
from pipesched.errors import PipeschedError
from pipesched.experiments.freeze_plan import (
    FreezePlan,
    FreezePlanResult,
    evaluate_freeze_plan,
    load_freeze_plan,
)
from pipesched.experiments.point import Point
from pipesched.indices import format_indices
from pipesched.metrics import TrainingWork
from pipesched.timeline import Timeline
from pipesched.units import GiB


def training_columns(training: TrainingWork | None, timeline: Timeline) -> dict[str, list[str]]:
    """Per-device table columns for the training work there is (none when nothing is
    frozen, recomputed or offloaded): column title -> one cell per device."""
    columns: dict[str, list[str]] = {}
    if training is None or not training.any:
        return columns
    devices = range(timeline.num_devices)
    if any(training.frozen_stages):
        columns["frozen stages"] = [
            ", ".join(f"{stage} ({'no backward' if role == Role.FORWARD_ONLY else 'no W'})"
                      for stage, role in zip(training.frozen_stages[d], training.frozen_roles[d], strict=True)) or "-"
            for d in devices]
    if any(training.recompute_s):
        columns["recompute s"] = [f"{training.recompute_s[d]:.4g}" for d in devices]
    if any(training.offloaded):
        columns["offloaded"] = [f"{training.offloaded[d]} ({training.offloaded_bytes[d] / GiB:.3g} GiB)"
                                for d in devices]
        columns["host link s"] = [f"{training.host_link_busy_s[d]:.4g}" for d in devices]
        columns["offload exposed s"] = [f"{training.offload_exposed_s[d]:.4g}" for d in devices]
        columns["host peak GiB"] = [f"{training.host_peak_bytes[d] / GiB:.2f}" for d in devices]
    return columns


def freeze_plan_option(training: TrainingOptions, *, views: ViewPaths, variability: VariabilityOptions,
                       levels: str | None = None) -> FreezePlan | None:
    """The ``--freeze-plan`` file, read before any work, and the options it cannot honour
    refused: it sets each range's frozen layers, prints a table of step ranges (no
    timeline to draw: ``views``) and simulates each range once (no Monte Carlo:
    ``variability``; no other level than sim: ``levels``, None when only sim is asked)."""
    if training.freeze_plan is None:
        return None
    refuse_with("freeze-plan", {"frozen-layers": training.frozen_layers}, "whose ranges say which layers are frozen")
    refuse_with("freeze-plan", views.given(), "which prints a table of step ranges, no timeline to draw")
    refuse_with("freeze-plan", variability.given(), "which simulates each range once, without variability")
    refuse_with("freeze-plan", {"levels": levels}, "which simulates each range (level sim)")
    return load_freeze_plan(training.freeze_plan)


def report_freeze_plan(plan: FreezePlan, points: Sequence[Point], *, as_json: bool) -> None:
    """Evaluate ``plan`` with the candidate ``points`` and print it (or its JSON); a range
    that no candidate could run is an error, and nothing is printed."""
    result = evaluate_freeze_plan(plan, points)
    for r in result.ranges:
        if r.best is None:
            record = r.records[0]
            others = f" (and {len(r.records) - 1} more schedules)" if len(r.records) > 1 else ""
            raise PipeschedError(f"{plan.source}:{r.range.line}: no schedule could run steps {r.range.start:,}.."
                                 f"{r.range.end - 1:,}: {record.point.family}{others}: {record.error}")
    if as_json:
        print_json(result.to_dict())
        return
    print_freeze_plan(result)


def print_freeze_plan(result: FreezePlanResult, console: Console | None = None) -> None:
    """One row per step range: its frozen layers and stages, the best schedule and its
    iteration time, the range's time; then the total, and each schedule's total alone."""
    console = console or (Console() if Console().is_terminal else Console(width=160))
    table = Table(title=f"freeze plan {result.plan.source}: {result.plan.steps:,} steps")
    for column in ("steps", "frozen layers", "frozen stages", "schedule", "iteration s", "range s"):
        table.add_column(column, justify="right")
    for r in result.ranges:
        frozen_stages = "-"
        if r.best is not None:
            frozen_stages = format_indices(r.best.point.build_schedule().frozen) or "none"
        table.add_row(f"{r.range.start:,}..{r.range.end - 1:,}", r.range.frozen_layers or "none", frozen_stages,
                      r.best.point.family if r.best is not None else "none could run",
                      "-" if r.iteration_time is None else f"{r.iteration_time:.6g}",
                      "-" if r.time is None else f"{r.time:.6g}")
    console.print(table)
    total = result.total_s
    console.print("total: " + ("-" if total is None else f"{total:.6g} s") + " with each range's best schedule")
    totals = result.total_per_candidate()
    if len(totals) > 1:
        for name, seconds in sorted(totals.items(), key=lambda item: (item[1] is None, item[1] or 0.0)):
            console.print(f"  {name} throughout: " + ("could not run every range" if seconds is None
                                                      else f"{seconds:.6g} s"), highlight=False)
    for r in result.ranges:
        for record in r.records:
            if not record.ok:
                console.print(f"skipped {record.point.family} in steps {r.range.start:,}..{r.range.end - 1:,}: "
                              f"{record.error}", highlight=False, markup=False)
