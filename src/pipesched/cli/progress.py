"""Progress on stderr for long work, shown only on a terminal and only once the work has
taken over a second: a bar for `compare`, a status line for the commands that launch ranks
(`run`, `check`, `profile`). Output that goes to a file or a pipe never holds it."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

DELAY_S = 1.0  # seconds of work before any progress appears


class LateProgress:
    """A progress bar (``done`` of ``total``, with a label) on stderr."""

    def __init__(self, console: Console | None = None, *, verb: str = "comparing") -> None:
        from rich.console import Console

        self.console = console or Console(file=sys.stderr)
        self.verb = verb
        self.began = time.monotonic()
        self.bar: Progress | None = None
        self.task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is None:
            if time.monotonic() - self.began < DELAY_S or done >= total or not self.console.is_terminal:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"{self.verb} {{task.description:<28}}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)
        self.bar.update(self.task, completed=done, description=label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class StatusLine:
    """One line on stderr, rewritten in place: ``label: status (elapsed)``; erased by close
    (or at the end of a ``with`` block)."""

    def __init__(self, label: str, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.began = time.monotonic()
        self.shown = False

    def __call__(self, status: str) -> None:
        elapsed = time.monotonic() - self.began
        if elapsed < DELAY_S or not self.stream.isatty():
            return
        width = shutil.get_terminal_size().columns - 1
        line = f"{self.label}: {status} ({elapsed:.0f} s)"[:width]
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()
        self.shown = True

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
