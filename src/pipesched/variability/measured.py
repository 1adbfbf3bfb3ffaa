"""Measured variability: every repeat ``pipesched profile`` timed, as relative factors.

The repeats file (``FILE.repeats.csv`` beside the cost file ``profile`` writes) has one row
per timed repeat::

    stage,kind,repeat,seconds        (per-stage costs, profile -p)
    layer,kind,repeat,seconds        (per-layer costs)

``seconds`` are counted as the cost file counts them (per-stage rows include the runtime's
per-op overhead), so the median of a (stage, kind)'s repeats is its cost. The factor of a
repeat is its seconds over that median: an empirical distribution per op kind and stage,
which a Monte Carlo run draws from instead of a lognormal. A schedule with k times more
stages than the file (v chunks per device) reads stage s's factors for its stages
s*k .. s*k+k-1; a per-layer file pools each kind's factors over its layers and gives them
to every stage.

>>> factors = parse_repeats("stage,kind,repeat,seconds\\n0,F,0,1.0\\n0,F,1,2.0\\n0,F,2,1.5\\n")
>>> factors.for_stages("F", 2)[1].tolist()
[0.6666666666666666, 1.0, 1.3333333333333333]
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import require
from pipesched.io.files import read_text
from pipesched.limits import MAX_REPEATS, parse_float, parse_int

COLUMNS = ("kind", "repeat", "seconds")
INDEX_COLUMNS = ("stage", "layer")
# the most repeat rows one file may hold, and the most stages or layers it may name
MAX_REPEAT_ROWS = 1_000_000
MAX_INDEX = 100_000


@dataclass(frozen=True, eq=False)
class MeasuredFactors:
    """Sorted relative factors per op kind letter: one array per stage, or one pooled array."""

    factors: Mapping[str, tuple[np.ndarray, ...]]
    pooled: bool  # one array per kind, for every stage (a per-layer file)
    source: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.factors)

    def for_stages(self, kind: str, num_stages: int) -> list[np.ndarray]:
        """The sorted factors of each of ``num_stages`` schedule stages for ``kind``."""
        arrays = self.factors[kind]
        if self.pooled:
            return [arrays[0]] * num_stages
        require(num_stages % len(arrays) == 0, "jitter_file", self.source,
                f"holds {len(arrays)} stages, the schedule has {num_stages}: profile {num_stages} stages "
                f"(or a number that divides {num_stages})")
        k = num_stages // len(arrays)
        return [arrays[s // k] for s in range(num_stages)]

    @classmethod
    def from_seconds(cls, seconds: Sequence[Mapping[str, Sequence[float]]], *, pooled: bool = False,
                     source: str = "") -> MeasuredFactors:
        """From per-stage (or per-layer, ``pooled``) mappings kind letter -> repeat seconds."""
        kinds: dict[str, list[np.ndarray]] = {}
        for index, per_kind in enumerate(seconds):
            for kind, values in per_kind.items():
                array = np.asarray(values, np.float64)
                require(array.size > 0 and bool(np.all(np.isfinite(array))) and bool(np.all(array > 0)),
                        f"{source or 'repeats'} stage {index} kind {kind}", "no positive times",
                        "every repeat must be a time > 0 seconds")
                kinds.setdefault(kind, []).append(np.sort(array / np.median(array)))
        count = len(seconds)
        for kind, arrays in kinds.items():
            require(len(arrays) == count, source or "repeats", kind,
                    f"kind {kind} has repeats for {len(arrays)} of {count} {'layers' if pooled else 'stages'}; "
                    "give every one")
        if pooled:
            return cls({kind: (np.sort(np.concatenate(arrays)),) for kind, arrays in kinds.items()}, True, source)
        return cls({kind: tuple(arrays) for kind, arrays in kinds.items()}, False, source)


def repeats_csv(seconds: Sequence[Mapping[str, Sequence[float]]], *, index: str = "stage") -> str:
    """The repeats file of per-stage (``index="stage"``) or per-layer mappings kind letter ->
    repeat seconds."""
    require(index in INDEX_COLUMNS, "index", index, "stage or layer")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow((index, *COLUMNS))
    for position, per_kind in enumerate(seconds):
        for kind, values in per_kind.items():
            for repeat, value in enumerate(values):
                writer.writerow((position, kind, repeat, f"{value:.9g}"))
    return buffer.getvalue()


def parse_repeats(text: str, *, source: str = "<text>") -> MeasuredFactors:
    """Read a repeats file (see the module docstring); every problem names the line."""
    rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    require(bool(rows), "jitter_file", source, f"empty; the header is stage,{','.join(COLUMNS)}")
    header = [cell.strip() for cell in rows[0]]
    require(len(header) == 4 and header[0] in INDEX_COLUMNS and tuple(header[1:]) == COLUMNS,
            f"{source}:1: header", ",".join(header)[:60],
            f"write stage,{','.join(COLUMNS)} (or layer,{','.join(COLUMNS)}), as `pipesched profile` does")
    require(len(rows) - 1 <= MAX_REPEAT_ROWS, "jitter_file", source, f"over {MAX_REPEAT_ROWS:,} repeat rows")
    seconds: dict[int, dict[str, list[float]]] = {}
    for number, row in enumerate(rows[1:], start=2):
        cells = [cell.strip() for cell in row]
        require(len(cells) == 4, f"{source}:{number}", f"{len(cells)} fields", "give stage, kind, repeat and seconds")
        position = parse_int(f"{source}:{number}: {header[0]}", cells[0], MAX_INDEX - 1)
        kind = cells[1]
        require(0 < len(kind) <= 8 and kind.isalpha(), f"{source}:{number}: kind", kind[:20],
                "an op kind letter like F, I, W or B")
        parse_int(f"{source}:{number}: repeat", cells[2], MAX_REPEATS - 1)
        value = parse_float(f"{source}:{number}: seconds", cells[3])
        require(math.isfinite(value) and value > 0, f"{source}:{number}: seconds", value, "must be a time > 0")
        seconds.setdefault(position, {}).setdefault(kind, []).append(value)
    count = max(seconds) + 1 if seconds else 0
    for position in range(count):
        require(position in seconds, "jitter_file", source, f"has no repeats for {header[0]} {position}; give every one")
    return MeasuredFactors.from_seconds([seconds[p] for p in range(count)], pooled=header[0] == "layer",
                                        source=source)


def load_repeats(path: str | os.PathLike[str]) -> MeasuredFactors:
    return parse_repeats(read_text(path, "jitter_file"), source=str(path))
