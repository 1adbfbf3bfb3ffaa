"""Adaptive freezing: a plan of frozen layers over training steps, evaluated range by range.

Layer-freezing methods stop training the layers that have converged: every so many steps
the next block freezes, and the iteration gets cheaper (no W there, and soon no backward
at all at the front of the pipeline). Which schedule is fastest changes with it. A freeze
plan is a CSV of step ranges, each with the layers frozen during it::

    start,end,frozen_layers
    0,1000,
    1000,2000,0-19
    2000,3000,0-39

``start`` is the first step of a range and ``end`` the first step after it; the ranges
follow each other without gaps. ``frozen_layers`` takes the ``--frozen-layers`` forms
(positions in the model's layer list like ``0-39``, quoted when it holds a comma, or a
fraction from the front like ``0.5``; cost rows with stage costs), empty for none.

``evaluate_freeze_plan`` simulates every candidate point in every range with that range's
frozen layers and keeps the fastest: the schedule each range should use, its iteration
time, the range's time (steps x iteration time) and the total; beside it, the total of
each candidate kept for the whole plan.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pipesched.errors import PipeschedError
from pipesched.experiments.evaluate import Record, evaluate
from pipesched.experiments.point import Point
from pipesched.io.files import read_text

COLUMNS = ("start", "end", "frozen_layers")
MAX_RANGES = 10_000  # rows of one plan
MAX_STEP = 10**12  # training steps


@dataclass(frozen=True)
class FreezeRange:
    """Steps start .. end-1, with ``frozen_layers`` (``--frozen-layers`` text) frozen."""

    start: int
    end: int
    frozen_layers: str

    @property
    def steps(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class FreezePlan:
    ranges: tuple[FreezeRange, ...]
    source: str = "<plan>"

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.ranges)


def parse_freeze_plan(text: str, *, source: str = "<plan>") -> FreezePlan:
    """A freeze plan from its CSV text (see the module docstring); every problem raises
    PipeschedError naming the line and field."""
    rows = [(number, row) for number, row in enumerate(csv.reader(io.StringIO(text)), start=1)
            if any(cell.strip() for cell in row) and not row[0].lstrip().startswith("#")]
    if not rows:
        raise PipeschedError(f"freeze_plan={source}: empty; write the header {','.join(COLUMNS)} and one row per "
                             "step range")
    header_line, header = rows[0]
    if [cell.strip() for cell in header] != list(COLUMNS):
        raise PipeschedError(f"{source}:{header_line}: header={','.join(c.strip() for c in header)[:60]!r}: "
                             f"write {','.join(COLUMNS)}")
    if len(rows) - 1 > MAX_RANGES:
        raise PipeschedError(f"freeze_plan={source}: {len(rows) - 1} ranges; at most {MAX_RANGES:,}")
    ranges: list[FreezeRange] = []
    for number, row in rows[1:]:
        cells = [cell.strip() for cell in row]
        if len(cells) == 2:
            cells.append("")
        if len(cells) != 3:
            raise PipeschedError(f"{source}:{number}: {len(cells)} fields; give start,end,frozen_layers (quote a "
                                 "layer list that holds commas)")
        start, end = (_step(cells[k], COLUMNS[k], source, number) for k in (0, 1))
        if end <= start:
            raise PipeschedError(f"{source}:{number}: end={end}: the steps go backwards; end must be after "
                                 f"start={start}")
        if ranges and start != ranges[-1].end:
            problem = "goes back over" if start < ranges[-1].end else "leaves a gap after"
            raise PipeschedError(f"{source}:{number}: start={start}: the steps {problem} the range before, which "
                                 f"ends at {ranges[-1].end}; start each range where the one before ends")
        ranges.append(FreezeRange(start, end, cells[2]))
    if not ranges:
        raise PipeschedError(f"freeze_plan={source}: no ranges; give one row per step range after the header")
    return FreezePlan(tuple(ranges), source)


def load_freeze_plan(path: str | os.PathLike[str]) -> FreezePlan:
    return parse_freeze_plan(read_text(path, "freeze_plan"), source=str(path))


def _step(text: str, field: str, source: str, line: int) -> int:
    try:
        step = int(text)
    except ValueError:
        raise PipeschedError(f"{source}:{line}: {field}={text[:40]!r}: not a whole number of steps") from None
    if not 0 <= step <= MAX_STEP:
        raise PipeschedError(f"{source}:{line}: {field}={step}: must be in 0..{MAX_STEP:,}")
    return step


@dataclass(frozen=True)
class RangeResult:
    """One range of the plan: every candidate simulated with its frozen layers, and the best."""

    range: FreezeRange
    records: tuple[Record, ...]
    best: Record | None  # the fastest candidate that could be simulated

    @property
    def iteration_time(self) -> float | None:
        return None if self.best is None else self.best.results[-1].iteration_time

    @property
    def time(self) -> float | None:
        """Seconds of the range with its best schedule."""
        return None if self.iteration_time is None else self.range.steps * self.iteration_time


@dataclass(frozen=True)
class FreezePlanResult:
    plan: FreezePlan
    ranges: tuple[RangeResult, ...]

    @property
    def total_s(self) -> float | None:
        """Seconds of the whole plan, each range with its best schedule (None when some
        range has no candidate that could be simulated)."""
        times = [r.time for r in self.ranges]
        return None if any(t is None for t in times) else float(sum(times))  # type: ignore[arg-type]

    def total_per_candidate(self) -> dict[str, float | None]:
        """Seconds of the whole plan with one candidate throughout (None where it fails)."""
        totals: dict[str, float | None] = {}
        for result in self.ranges:
            for record in result.records:
                name = record.point.family
                previous = totals.get(name, 0.0)
                if not record.ok or previous is None:
                    totals[name] = None
                    continue
                totals[name] = previous + result.range.steps * record.results[-1].iteration_time
        return totals

    def to_dict(self) -> dict:
        return {
            "plan": self.plan.source,
            "steps": self.plan.steps,
            "total_s": self.total_s,
            "ranges": [{
                "start": r.range.start, "end": r.range.end, "frozen_layers": r.range.frozen_layers,
                "frozen_stages": sorted(r.best.point.build_schedule().frozen) if r.best is not None else None,
                "best": r.best.point.family if r.best is not None else None,
                "iteration_time_s": r.iteration_time, "time_s": r.time,
                "skipped": {rec.point.family: rec.error for rec in r.records if not rec.ok},
            } for r in self.ranges],
            "total_per_schedule_s": self.total_per_candidate(),
        }


def evaluate_freeze_plan(plan: FreezePlan, points: Sequence[Point], *,
                         mapper: Callable[[Callable[[Point], Record], Iterable[Point]], Iterable[Record]] = map,
                         ) -> FreezePlanResult:
    """Simulate every point of ``points`` in every range of ``plan`` with the range's frozen
    layers (see the module docstring); ``mapper`` runs the evaluations (``map``, a process
    pool, Ray)."""
    if not points:
        raise PipeschedError("schedules=[]: give at least one schedule to evaluate the freeze plan with")
    jobs = [point.replace(frozen_layers=r.frozen_layers) for r in plan.ranges for point in points]
    records = list(mapper(_simulate, jobs))
    results = []
    for k, freeze_range in enumerate(plan.ranges):
        mine = tuple(records[k * len(points):(k + 1) * len(points)])
        fine = [record for record in mine if record.ok]
        best = min(fine, key=lambda record: record.results[-1].iteration_time) if fine else None
        results.append(RangeResult(freeze_range, mine, best))
    return FreezePlanResult(plan, tuple(results))


def _simulate(point: Point) -> Record:
    return evaluate(point, ("sim",))
