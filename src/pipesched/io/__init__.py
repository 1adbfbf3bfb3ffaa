"""Schedule files: grid text (``.txt`` and anything else), PyTorch CSV (``.csv``), JSON
(``.json``). Every format round-trips: ``load(save(s)) == s``. ``csv-comms`` writes
PyTorch's compute+comms CSV (the communication pass's sends and receives added), which
loads back as the same schedule (and, with ``torch_csv.loads_comms``, the same actions)."""

from __future__ import annotations

import os
from pathlib import Path

from pipesched.errors import PipeschedError
from pipesched.io import grid, json_format, torch_csv
from pipesched.io.files import read_text, write_atomic
from pipesched.schedule import Schedule

FORMATS = ("grid", "csv", "csv-comms", "json")


def format_for(path: str | os.PathLike[str]) -> str:
    """The format a file name implies: ``.csv`` PyTorch CSV, ``.json`` JSON, else grid text."""
    suffix = Path(path).suffix.lower()
    return {".csv": "csv", ".json": "json"}.get(suffix, "grid")


def dumps(schedule: Schedule, fmt: str = "grid") -> str:
    """A schedule as text in ``fmt`` (grid, csv, csv-comms or json)."""
    if fmt == "grid":
        return grid.dumps(schedule)
    if fmt == "csv":
        return torch_csv.dumps(schedule)
    if fmt == "csv-comms":
        from pipesched.passes.communication import with_communication

        return torch_csv.dumps_comms(with_communication(schedule))
    if fmt == "json":
        return json_format.dumps(schedule)
    raise PipeschedError(f"format={fmt!r}: unknown; choose one of {', '.join(FORMATS)}")


def loads(text: str, fmt: str = "grid", *, source: str = "<text>") -> Schedule:
    """Parse schedule text in ``fmt``; errors name ``source`` with line and column."""
    if fmt == "grid":
        return grid.loads(text, source=source)
    if fmt in ("csv", "csv-comms"):
        name = "custom" if source.startswith("<") else Path(source).stem
        return torch_csv.loads(text, source=source, name=name)
    if fmt == "json":
        return json_format.loads(text, source=source)
    raise PipeschedError(f"format={fmt!r}: unknown; choose one of {', '.join(FORMATS)}")


def load_schedule(path: str | os.PathLike[str], *, fmt: str | None = None) -> Schedule:
    """Read a schedule file; the format follows the extension unless ``fmt`` is given."""
    return loads(read_text(path, "schedule_file"), fmt or format_for(path), source=str(path))


def save_schedule(schedule: Schedule, path: str | os.PathLike[str], *, fmt: str | None = None) -> Path:
    """Write a schedule file atomically; the format follows the extension unless ``fmt`` is
    given (PyTorch's CSV cannot hold replicated stages and raises PipeschedError)."""
    return write_atomic(path, dumps(schedule, fmt or format_for(path)))


__all__ = ["FORMATS", "dumps", "format_for", "load_schedule", "loads", "save_schedule"]
