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
from pipesched.rules import RULES, Rules
from pipesched.schedule import Schedule

FORMATS = ("grid", "csv", "csv-comms", "json")
# the formats a file extension names, the first its default; any other extension (or none)
# defaults to grid text and takes any format
EXTENSION_FORMATS = {".csv": ("csv", "csv-comms"), ".json": ("json",), ".txt": ("grid",)}


def format_for(path: str | os.PathLike[str]) -> str:
    """The format a file name implies: ``.csv`` PyTorch CSV, ``.json`` JSON, else grid text."""
    return EXTENSION_FORMATS.get(Path(path).suffix.lower(), ("grid",))[0]


def output_format(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """The format to write the schedule file ``path`` in: the one its extension implies, or
    ``fmt`` when given, which must be one of FORMATS and not contradict the extension
    (``.json`` takes json, ``.csv`` csv or csv-comms, ``.txt`` grid).

    >>> output_format("s.json"), output_format("s.csv", "csv-comms"), output_format("s.out", "json")
    ('json', 'csv-comms', 'json')
    """
    if fmt is None:
        return format_for(path)
    if fmt not in FORMATS:
        raise PipeschedError(f"format={fmt!r}: unknown; choose one of {', '.join(FORMATS)}")
    suffix = Path(path).suffix.lower()
    allowed = EXTENSION_FORMATS.get(suffix, FORMATS)
    if fmt not in allowed:
        raise PipeschedError(f"format={fmt}: not for {Path(path).name}, whose extension {suffix} means "
                             f"{' or '.join(allowed)}; drop --format or name the file for {fmt}")
    return fmt


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


def loads(text: str, fmt: str = "grid", *, source: str = "<text>", rules: Rules = RULES) -> Schedule:
    """Parse schedule text in ``fmt`` whose ops are of the kinds of ``rules`` (grid and JSON;
    PyTorch's CSV holds PyTorch's kinds); errors name ``source`` with line and column."""
    if fmt == "grid":
        return grid.loads(text, source=source, rules=rules)
    if fmt in ("csv", "csv-comms"):
        name = "custom" if source.startswith("<") else Path(source).stem
        return torch_csv.loads(text, source=source, name=name)
    if fmt == "json":
        return json_format.loads(text, source=source, rules=rules)
    raise PipeschedError(f"format={fmt!r}: unknown; choose one of {', '.join(FORMATS)}")


def load_schedule(path: str | os.PathLike[str], *, fmt: str | None = None, rules: Rules = RULES) -> Schedule:
    """Read a schedule file (of the kinds of ``rules``, see ``loads``); the format follows the
    extension unless ``fmt`` is given."""
    return loads(read_text(path, "schedule_file"), fmt or format_for(path), source=str(path), rules=rules)


def save_schedule(schedule: Schedule, path: str | os.PathLike[str], *, fmt: str | None = None) -> Path:
    """Write a schedule file atomically; the format follows the extension, and ``fmt`` may
    not contradict it (see ``output_format``; PyTorch's CSV cannot hold replicated stages
    and raises PipeschedError)."""
    return write_atomic(path, dumps(schedule, output_format(path, fmt)))


__all__ = ["EXTENSION_FORMATS", "FORMATS", "dumps", "format_for", "load_schedule", "loads", "output_format",
           "save_schedule"]
