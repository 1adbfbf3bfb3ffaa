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

``evaluate_freeze_plan`` first reads every range's frozen layers against the candidates'
model (a range naming layers the model lacks fails, naming its line, before anything is
simulated), then simulates every candidate point once per distinct frozen set and keeps
the fastest in each range: the schedule each range should use, its iteration time, the
range's time (steps x iteration time) and the total; beside it, the total of each
candidate kept for the whole plan. A plan has at most MAX_FREEZE_RANGES ranges.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pipesched.enums import Level
from pipesched.errors import PipeschedError, shorten
from pipesched.experiments.evaluation import Record, evaluate
from pipesched.experiments.point import Point
from pipesched.io.files import read_text
from pipesched.limits import MAX_FREEZE_RANGES, MAX_TRAINING_STEPS, check_number_text
from pipesched.model.freezing import parse_frozen_layers

COLUMNS = ("start", "end", "frozen_layers")


@dataclass(frozen=True)
class FreezeRange:
    """Steps start .. end-1, with ``frozen_layers`` (``--frozen-layers`` text) frozen."""

    start: int
    end: int
    frozen_layers: str
    line: int = 0  # where the range is written in its plan (0: not read from a file)

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
    rows = _rows(text, source)
    if not rows:
        raise PipeschedError(f"freeze_plan={source}: empty; write the header {','.join(COLUMNS)} and one row per "
                             "step range")
    header_line, header = rows[0]
    if [cell.strip() for cell in header] != list(COLUMNS):
        raise PipeschedError(f"{source}:{header_line}: header={shorten(','.join(c.strip() for c in header))!r}: "
                             f"write {','.join(COLUMNS)}")
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
        ranges.append(FreezeRange(start, end, cells[2], number))
    if not ranges:
        raise PipeschedError(f"freeze_plan={source}: no ranges; give one row per step range after the header")
    return FreezePlan(tuple(ranges), source)


def _rows(text: str, source: str) -> list[tuple[int, list[str]]]:
    """The plan's rows that are not blank or comments, with their line numbers: the header
    and at most MAX_FREEZE_RANGES ranges (reading stops at the first row over)."""
    rows: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            if not any(cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
                continue
            if len(rows) > MAX_FREEZE_RANGES:
                raise PipeschedError(f"freeze_plan={source}: over the limit of {MAX_FREEZE_RANGES:,} step ranges; "
                                     "give at most that many rows")
            rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise PipeschedError(f"{source}:{reader.line_num}: not CSV ({exc}); write start,end,frozen_layers rows") from None
    return rows


def load_freeze_plan(path: str | os.PathLike[str]) -> FreezePlan:
    return parse_freeze_plan(read_text(path, "freeze_plan"), source=str(path))


def _step(text: str, field: str, source: str, line: int) -> int:
    try:
        step = int(check_number_text(field, text))
    except (ValueError, PipeschedError):
        raise PipeschedError(f"{source}:{line}: {field}={shorten(text)!r}: not a whole number of steps") from None
    if not 0 <= step <= MAX_TRAINING_STEPS:
        raise PipeschedError(f"{source}:{line}: {field}={step}: must be in 0..{MAX_TRAINING_STEPS:,}")
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
    """Simulate every point of ``points`` with each range's frozen layers of ``plan`` (see
    the module docstring), once per distinct frozen set; ``mapper`` runs the evaluations
    (``map``, a process pool, Ray). Raises PipeschedError, before any simulation, for a
    range whose frozen layers a point's model does not have."""
    if not points:
        raise PipeschedError("schedules=[]: give at least one schedule to evaluate the freeze plan with")
    jobs, per_range = _jobs(plan, points)
    records = list(mapper(_simulate, jobs))
    results = []
    for freeze_range, mine in zip(plan.ranges, per_range, strict=True):
        chosen = tuple(records[job] for job in mine)
        fine = [record for record in chosen if record.ok]
        best = min(fine, key=lambda record: record.results[-1].iteration_time) if fine else None
        results.append(RangeResult(freeze_range, chosen, best))
    return FreezePlanResult(plan, tuple(results))


def _jobs(plan: FreezePlan, points: Sequence[Point]) -> tuple[list[Point], list[list[int]]]:
    """The points to simulate, one per candidate and distinct frozen set, and for each range
    of ``plan`` the job of each candidate; every range's layers checked first."""
    counts = [_layer_count(point) for point in points]
    resolved: dict[tuple[str, int], tuple[int, ...]] = {}  # (text, layer count) -> frozen positions
    job_of: dict[tuple[int, tuple[int, ...]], int] = {}  # (candidate, frozen positions) -> job
    jobs: list[Point] = []
    per_range: list[list[int]] = []
    for freeze_range in plan.ranges:
        mine = []
        for k, point in enumerate(points):
            key = (freeze_range.frozen_layers, counts[k])
            if key not in resolved:
                resolved[key] = _frozen(freeze_range, counts[k], plan.source)
            job = (k, resolved[key])
            if job not in job_of:
                job_of[job] = len(jobs)
                jobs.append(point.replace(frozen_layers=resolved[key]))
            mine.append(job_of[job])
        per_range.append(mine)
    return jobs, per_range


def _layer_count(point: Point) -> int:
    """How many positions frozen layers index at ``point``: its model's layers (embedding
    first), or its stage costs' rows."""
    setup = point.replace(frozen_layers="").setup()
    return setup.model.num_cost_layers if setup.model is not None else setup.costs.num_stages


def _frozen(freeze_range: FreezeRange, count: int, source: str) -> tuple[int, ...]:
    """The positions ``freeze_range`` freezes of ``count``; an error names its line."""
    try:
        return parse_frozen_layers(freeze_range.frozen_layers, count)
    except PipeschedError as exc:
        raise PipeschedError(f"{source}:{freeze_range.line}: {exc}") from None


def _simulate(point: Point) -> Record:
    return evaluate(point, (Level.SIM,))
