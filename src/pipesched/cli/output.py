"""Where the commands print: a rich console that keeps its tables whole when the output
goes to a file or a pipe (rich would otherwise squeeze them into 80 columns)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# columns of output that is not a terminal (and COLUMNS is not set): wide enough for the
# widest table, the three-level comparison
PIPED_WIDTH = 200


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, COLUMNS when set, else
    PIPED_WIDTH."""
    from rich.console import Console

    plain = Console(stderr=stderr)
    if plain.is_terminal or "COLUMNS" in os.environ:
        return plain
    return Console(stderr=stderr, width=PIPED_WIDTH)


def print_whole(console: Console, table: Table, droppable: Sequence[int] = ()) -> None:
    """Print ``table`` with every name and number whole: cells wrap at spaces, never inside
    a word. Where even each column's longest word does not fit the console, the
    ``droppable`` columns go (their indices, the first named first); when the rest still
    does not fit, it is printed wider than the console (the terminal wraps the lines)
    rather than cut."""
    fits = console.width - _overhead(table)
    if sum(widest for _, widest in map(_extent, table.columns)) > fits:
        for column in [table.columns[index] for index in droppable]:
            if sum(word for word, _ in map(_extent, table.columns)) <= console.width - _overhead(table):
                break
            table.columns.remove(column)
        _share(table, console.width - _overhead(table))
    width, shown = sum(word for word, _ in map(_extent, table.columns)) + _overhead(table), console.width
    console.width = max(width, shown)
    try:
        console.print(table)
    finally:
        console.width = shown


def _extent(column) -> tuple[int, int]:
    """A column's longest word and longest line, in characters (header included)."""
    texts = [str(column.header), *(str(cell) for cell in column.cells)]
    words = [len(word) for text in texts for word in text.split()]
    lines = [len(line) for text in texts for line in text.splitlines()]
    return max(words, default=1), max(lines, default=1)


def _overhead(table: Table) -> int:
    """Characters of a table's row that are not cell text: padding and borders."""
    _, right, _, left = table.padding
    return len(table.columns) * (left + right) + (len(table.columns) + 1 if table.box else 0)


def _share(table: Table, room: int) -> None:
    """Fix every column's width: its longest word, and the room left shared in proportion to
    how much more its longest line needs."""
    extents = [_extent(column) for column in table.columns]
    spare = max(0, room - sum(word for word, _ in extents))
    wanted = sum(line - word for word, line in extents) or 1
    for column, (word, line) in zip(table.columns, extents, strict=True):
        column.width = min(line, word + spare * (line - word) // wanted)


def wrote(path: object, note: str = "") -> None:
    """Say that a file was written: ``wrote PATH`` (and a note), on stderr, the one place every
    command says it."""
    print(f"wrote {path}{note}", file=sys.stderr)


def print_json(document: object) -> None:
    """Print a command's result as JSON on stdout, as every command does (indented by one)."""
    typer.echo(json.dumps(document, indent=1))
