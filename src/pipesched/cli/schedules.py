"""`pipesched list`, `show`, `validate`: the schedule table commands."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from pipesched.generators import FAMILIES


def list_families() -> None:
    """List the schedule families with their constraints."""
    table = Table(title="schedule families")
    for column in ("name", "chunks per device", "constraints", "summary"):
        table.add_column(column)
    for family in FAMILIES.values():
        chunks = "v (default %d)" % family.default_v if family.chunks is None else str(family.chunks)
        table.add_row(family.name, chunks, family.constraints, family.summary)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("list")(list_families)
