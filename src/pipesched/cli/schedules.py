"""`pipesched list`, `show`, `validate`: the schedule table commands."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched import io
from pipesched.cli.options import Chunks, Devices, FamilySettings, Microbatches, family_options
from pipesched.cli.views import Html, Png, Svg, Trace, ViewPaths
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments.defaults import DEFAULTS
from pipesched.generators import FAMILIES, formula, generate, get_family
from pipesched.io.files import check_output_path, write_atomic
from pipesched.schedule import Schedule
from pipesched.slot_table import slot_table, table_metrics
from pipesched.validate import format_report, validate


def list_families() -> None:
    """List the schedule families with their constraints."""
    table = Table(title="schedule families")
    for column in ("name", "chunks per device", "options", "constraints", "summary"):
        table.add_column(column)
    for family in FAMILIES.values():
        chunks = f"v (default {family.default_v})" if family.chunks is None else str(family.chunks)
        table.add_row(family.name, chunks, ", ".join(family.options) or "-", family.constraints, family.summary)
    Console().print(table)


def show(
    name: Annotated[str, typer.Argument(help="schedule family (see `pipesched list`) or a schedule file")],
    p: Devices = None,
    m: Microbatches = None,
    v: Chunks = None,
    fmt: Annotated[str, typer.Option("--format", help="grid | csv (PyTorch compute-only) | csv-comms (PyTorch compute+comms) | json")] = "grid",
    output: Annotated[str | None, typer.Option("-o", "--output", help="write to this file instead of stdout")] = None,
    settings: FamilySettings = None,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
) -> None:
    """Generate a schedule and print it as a table (or write it as grid text, CSV or JSON).
    --png/--svg/--trace/--html draw its idealized slot table (F = I = W = 1 slot, or the
    lengths --set costs=F,I,W gives)."""
    if fmt not in io.FORMATS:
        raise typer.BadParameter(f"format={fmt!r}: choose one of {', '.join(io.FORMATS)}")
    if output is not None:
        check_output_path(output)
    views = ViewPaths(png, svg, trace, html).check()
    schedule = load_or_generate(name, p=p, m=m, v=v, settings=settings)
    options, costs, fb_cost = family_options(settings)
    slots = costs if costs is not None else StageCosts.slots()
    if fb_cost is not None:
        slots = dataclasses.replace(slots, fb_cost=fb_cost, forward_backward=None)
    if views.any:
        views.write([slot_table(schedule, slots)], title=f"{schedule.name}: idealized slot table")
    text = io.dumps(schedule, fmt)
    if output is not None:
        write_atomic(output, text)
        return
    sys.stdout.write(text)
    if fmt == "grid":
        metrics = table_metrics(schedule, slots)
        lengths = (f"F={slots.f:g}, I={slots.i:g}, W={slots.w:g}, B={slots.b:g}" if costs is not None and costs.is_uniform
                   else "F=I=W=1, B=2" if costs is None else "given stage costs")
        sys.stdout.write(
            f"# slot makespan {metrics.makespan:g} ({lengths}), bubble ratio {metrics.bubble_ratio:.3f}, "
            f"peak in-flight per device {list(metrics.peak_inflight)}\n"
        )
        if name in FAMILIES:
            est = formula(name, schedule.num_devices, int(schedule.params.get("iteration_microbatches",
                                                                                schedule.num_microbatches)),
                          v=v, costs=slots, **{k: x for k, x in options.items() if k in get_family(name).options})
            sys.stdout.write(
                f"# formula: makespan {est.makespan:g}, bubble ratio {est.bubble_ratio:.3f}, "
                f"peak in-flight {est.peak_inflight:g}{'' if est.exact else ' (approximate)'}\n"
            )


def load_or_generate(name: str, *, p: int | None, m: int | None, v: int | None,
                     settings: list[str] | None = None) -> Schedule:
    """A family name generates (p and m default to DEFAULTS'); anything else is read as a
    schedule file, which fixes its own sizes. ``--set costs=...`` reaches the families that
    plan with costs (the zero-bubble heuristics)."""
    if name in FAMILIES:
        options, _, _ = family_options(settings)
        if "costs" in options and "costs" not in get_family(name).options:
            del options["costs"]  # only levels 1 and 2 use them for this family
        return generate(name, p if p is not None else DEFAULTS.p, m if m is not None else DEFAULTS.m, v=v,
                        **options)
    if any(ch in name for ch in "./\\"):
        for flag, value in (("p", p), ("m", m), ("v", v)):
            if value is not None:
                raise PipeschedError(f"{flag}={value}: a schedule file fixes its own sizes; drop -{flag}")
        return io.load_schedule(name)
    get_family(name)  # raises the unknown-family error listing the known names
    raise AssertionError("unreachable")


def validate_file(
    path: Annotated[str, typer.Argument(help="schedule file: grid text, PyTorch CSV (.csv) or JSON (.json)")],
    memory_limit: Annotated[int | None, typer.Option("--memory-limit", help="max in-flight stage-microbatches per device")] = None,
) -> None:
    """Check a schedule file: exit 0 valid, 1 violations (with the report), 2 unreadable."""
    schedule = io.load_schedule(path)
    violations = validate(schedule, memory_limit=memory_limit)
    if violations:
        sys.stdout.write(format_report(schedule, violations) + "\n")
        raise typer.Exit(1)
    sys.stdout.write(
        f"{path}: valid ({schedule.num_devices} devices, {schedule.num_stages} stages, "
        f"{schedule.num_microbatches} microbatches, {schedule.num_ops} ops)\n"
    )


def register(app: typer.Typer) -> None:
    app.command("list")(list_families)
    app.command("show")(show)
    app.command("validate")(validate_file)
