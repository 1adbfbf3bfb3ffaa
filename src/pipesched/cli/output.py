"""Where the commands print: a rich console that keeps its tables whole when the output
goes to a file or a pipe (rich would otherwise squeeze them into 80 columns)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

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
