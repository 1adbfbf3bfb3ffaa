"""`pipesched list`, `show`, `validate`: the schedule table commands."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pipesched import io
from pipesched.cli.options import parse_settings
from pipesched.cli.views import Html, Png, Svg, Trace, ViewPaths
from pipesched.generators import FAMILIES, formula, generate, get_family
from pipesched.generators.base import SlotCosts
from pipesched.io.files import check_output_path, write_atomic
from pipesched.limits import MAX_OPS, check_count
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
    p: Annotated[int, typer.Option("-p", help="pipeline devices")] = 4,
    m: Annotated[int, typer.Option("-m", help="microbatches")] = 8,
    v: Annotated[int | None, typer.Option("-v", help="chunks (stages) per device, for families that take it")] = None,
    fmt: Annotated[str, typer.Option("--format", help="grid | csv (PyTorch compute-only) | json")] = "grid",
    output: Annotated[str | None, typer.Option("-o", "--output", help="write to this file instead of stdout")] = None,
    settings: Annotated[list[str] | None, typer.Option("--set", help="family option KEY=VALUE, e.g. waves=2, memory_limit=6")] = None,
    png: Png = None,
    svg: Svg = None,
    trace: Trace = None,
    html: Html = None,
) -> None:
    """Generate a schedule and print it as a table (or write it as grid text, CSV or JSON).
    --png/--svg/--trace/--html draw its idealized slot table (F = I = W = 1 slot)."""
    if fmt not in io.FORMATS:
        raise typer.BadParameter(f"format={fmt!r}: choose one of {', '.join(io.FORMATS)}")
    if output is not None:
        check_output_path(output)
    views = ViewPaths(png, svg, trace, html).check()
    schedule = load_or_generate(name, p=p, m=m, v=v, settings=settings)
    if views.any:
        views.write([slot_table(schedule)], title=f"{schedule.name}: idealized slot table")
    text = io.dumps(schedule, fmt)
    if output is not None:
        write_atomic(output, text)
        return
    sys.stdout.write(text)
    if fmt == "grid":
        metrics = table_metrics(schedule)
        sys.stdout.write(
            f"# slot makespan {metrics.makespan:g} (F=I=W=1, B=2), bubble ratio {metrics.bubble_ratio:.3f}, "
            f"peak in-flight per device {list(metrics.peak_inflight)}\n"
        )
        if name in FAMILIES:
            est = formula(name, p, m, v=v, costs=SlotCosts())
            sys.stdout.write(
                f"# formula: makespan {est.makespan:g}, bubble ratio {est.bubble_ratio:.3f}, "
                f"peak in-flight {est.peak_inflight:g}{'' if est.exact else ' (approximate)'}\n"
            )


def load_or_generate(name: str, *, p: int, m: int, v: int | None, settings: list[str] | None = None):
    """A family name generates; anything else is read as a schedule file."""
    if name in FAMILIES:
        return generate(name, p, m, v=v, **parse_settings(settings))
    if any(ch in name for ch in "./\\"):
        return io.load_schedule(name)
    get_family(name)  # raises the unknown-family error listing the known names
    raise AssertionError("unreachable")


def validate_file(
    path: Annotated[str, typer.Argument(help="schedule file: grid text, PyTorch CSV (.csv) or JSON (.json)")],
    memory_limit: Annotated[int | None, typer.Option("--memory-limit", help="max in-flight stage-microbatches per device")] = None,
) -> None:
    """Check a schedule file: exit 0 valid, 1 violations (with the report), 2 unreadable."""
    if memory_limit is not None:
        check_count("memory-limit", memory_limit, MAX_OPS, what="in-flight stage-microbatches")
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
