"""Run a design-space search: bound every point, then simulate the promising ones, pruning the
points that cannot beat what was found, and write every result to the store as it comes.

1. Bound: every point not yet in the store, over the map. A point that cannot be built or
   costed is ``invalid`` (with the reason); its exact peak memory per device over a device's
   capacity makes it ``out of memory``; the others are ``bounded`` (``bounds.lower_bound``).
2. Evaluate: the bounded points by increasing bound, in waves (``FIRST_WAVE`` points, then
   twice as many each time, up to ``WAVE``). Before a wave, a point is ``pruned`` when an evaluated point needs no more memory and takes no
   longer than the point's lower bound: it can be neither faster nor on the Pareto front of
   time against memory. The rest of the wave is simulated at level 3 over the map
   (``pipesched.experiments.evaluation_all``) and becomes ``evaluated``.

Each point is built and compiled once: the bound's graph (free communication) stays in the
process that bounded it, and the evaluation lowers the network onto it there
(``experiments.evaluation.keep_graph``; ``process_map`` sends a point to the same worker in
both phases, and a point evaluated elsewhere is compiled again).

Waves have fixed sizes, so a search gives the same rows with any map (one process, a pool
of any size, Ray). A search started again on the same store resumes: the points already
settled are read back, not computed again, and bounded ones go straight to phase 2. A
search stopped by an error or Ctrl-C first writes every row it holds.
"""

from __future__ import annotations

import bisect
import builtins
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial

from pipesched.enums import Level
from pipesched.errors import OutOfMemory, PipeschedError
from pipesched.experiments.evaluation import Record, keep_graph
from pipesched.experiments.grids import Mapper, evaluate_all
from pipesched.experiments.point import Point, point_key
from pipesched.search.bounds import lower_bound
from pipesched.search.results import SearchResult
from pipesched.search.space import SearchSpace
from pipesched.search.store import (
    BOUNDED,
    EVALUATED,
    INVALID,
    OUT_OF_MEMORY,
    PRUNED,
    SearchStore,
    StoredRow,
    point_row,
)
from pipesched.timeline import Timeline
from pipesched.units import GiB

FIRST_WAVE = 8  # points simulated before the first look at what was found ...
WAVE = 256  # ... and at most between two looks
FLUSH_ROWS = 64  # rows per store transaction, at most ...
FLUSH_SECONDS = 0.5  # ... or this long after the first unwritten one

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def search(space: SearchSpace, *, db: str | os.PathLike[str], mapper: Mapper | AbstractContextManager[Mapper] = builtins.map,
           prune: bool = True, progress: Progress | None = None, timelines: bool = False) -> SearchResult:
    """Search ``space`` (see the module docstring) into the store at ``db``, resuming what
    it holds of the space. The space is checked first (its size, and that the cluster can
    hold the model in some layout): a space refused leaves no store.

    ``mapper``: a ``map`` (the built-in one), or a pool that gives one
    (``experiments.process_map(n)``, ``ray_pool(...)``), entered once the space is checked
    and before the store is opened (a pool that cannot start leaves no store either) and
    left when the search ends;
    ``prune``: skip the points the bound rules out; ``progress(phase, done, total)`` is
    called as results come, phases "bound" and "simulate"; ``timelines``: keep the
    timelines of the front's points simulated now (``SearchResult.timelines``, what the
    search page draws).
    """
    began = time.monotonic()
    space.check_capacity()
    points = {point_key(point): point for point in space.points()}
    pool = mapper if isinstance(mapper, AbstractContextManager) else nullcontext(mapper)
    with pool as mapping, SearchStore.open(db) as store:
        search_id, run, stored = store.begin(space.spec())
        rows = {row.key: row for row in stored if row.key in points}
        writer = _Writer(store, search_id)
        try:
            _bound(points, rows, writer, mapper=mapping, run=run, progress=progress)
            found = _simulate(points, rows, writer, mapper=mapping, run=run, prune=prune, progress=progress,
                              timelines=timelines)
        finally:
            writer.flush()  # a search stopped by an error or Ctrl-C keeps every point it finished
    return SearchResult(space.spec(), tuple(rows[key] for key in points if key in rows),
                        seconds=time.monotonic() - began, db=str(store.path), runs=run, timelines=found.timelines)


def _bound(points: dict[str, Point], rows: dict[str, StoredRow], writer: _Writer, *, mapper: Mapper, run: int,
           progress: Progress | None) -> None:
    """Phase 1: a row for every point not yet in ``rows``."""
    pending = [point for key, point in points.items() if key not in rows]
    _report(progress, "bound", len(points) - len(pending), len(points))
    for row in mapper(partial(bound_row, run=run), pending):
        rows[row.key] = row
        writer.add(row)
        _report(progress, "bound", len(rows), len(points))
    writer.flush()


def _simulate(points: dict[str, Point], rows: dict[str, StoredRow], writer: _Writer, *, mapper: Mapper, run: int,
              prune: bool, progress: Progress | None, timelines: bool) -> _Staircase:
    """Phase 2: the bounded rows by increasing bound, in waves, pruned or simulated; the
    front found, with the timelines of the points simulated now when asked for."""
    found = _Staircase()
    for row in rows.values():
        if row.status == EVALUATED:
            found.add(row)
    queue = sorted((row for row in rows.values() if row.status == BOUNDED), key=lambda r: (r.bound_s, r.label))
    done = 0
    for start, stop in _waves(len(queue)):
        wave = []
        for row in queue[start:stop]:
            better = found.dominating(row) if prune else None
            if better is None:
                wave.append(row)
                continue
            rows[row.key] = row.settled(PRUNED, run=run, reason=(
                f"bound {row.bound_s:.6g} s >= {better.iteration_time_s:.6g} s of {better.label}, which needs no "
                f"more memory ({better.peak_memory_bytes / GiB:.2f} <= {row.peak_memory_bytes / GiB:.2f} GiB)"))
            writer.add(rows[row.key])
        done += stop - start - len(wave)
        records = evaluate_all([points[r.key] for r in wave], (Level.SIM,), mapper=mapper, keep_timelines=timelines)
        for row, record in zip(wave, records, strict=True):
            rows[row.key] = settled = _settle(row, record, run)
            if settled.status == EVALUATED:
                found.add(settled, record.timeline)
            writer.add(settled)
            done += 1
            _report(progress, "simulate", done, len(queue))
        writer.flush()
    _report(progress, "simulate", done, len(queue))
    return found


def _waves(count: int) -> list[tuple[int, int]]:
    """(start, stop) of each wave: FIRST_WAVE points, then twice as many each time up to WAVE,
    so pruning starts after a few simulations."""
    bounds, start, size = [], 0, FIRST_WAVE
    while start < count:
        bounds.append((start, min(count, start + size)))
        start, size = start + size, min(WAVE, 2 * size)
    return bounds


def bound_row(point: Point, *, run: int = 0) -> StoredRow:
    """Phase 1 for one point: its row, ``bounded``, ``out of memory`` or ``invalid``."""
    row = point_row(point, run=run)
    try:
        bound = lower_bound(point)
    except OutOfMemory as exc:
        return row.settled(OUT_OF_MEMORY, reason=str(exc))
    except PipeschedError as exc:
        return row.settled(INVALID, reason=str(exc))
    largest = max(range(len(bound.peak_memory)), key=bound.peak_memory.__getitem__)
    capacity = bound.capacity[largest] if bound.capacity is not None else None
    row = row.settled(BOUNDED, bound_s=bound.seconds, peak_memory_bytes=bound.peak_memory[largest],
                      capacity_bytes=capacity)
    if bound.fits:
        if bound.graph is not None:
            keep_graph(point, bound.graph)  # for its evaluation in this process: compiled once
        return row
    worst = bound.worst_device
    return row.settled(OUT_OF_MEMORY, reason=(
        f"device {worst} needs {bound.peak_memory[worst] / GiB:.2f} GiB (of {bound.capacity[worst] / GiB:.0f} GiB)"))


def _settle(row: StoredRow, record: Record, run: int) -> StoredRow:
    """Phase 2 for one point: what its level-3 record says."""
    if not record.ok:
        return row.settled(INVALID, run=run, reason=record.error or "")
    result = record.results[0]
    return row.settled(OUT_OF_MEMORY if result.out_of_memory else EVALUATED, run=run,
                       iteration_time_s=result.iteration_time, throughput_tokens_per_s=result.throughput_tokens_per_s,
                       mfu=result.mfu, hfu=result.hfu, peak_memory_bytes=result.peak_memory,
                       reason="over a device's memory in the simulation" if result.out_of_memory else "")


def _report(progress: Progress | None, phase: str, done: int, total: int) -> None:
    if progress is not None:
        progress(phase, done, total)


@dataclass
class _Staircase:
    """The evaluated rows no other beats in both time and memory, by increasing memory (and
    decreasing time): the points a candidate must beat."""

    memory: list[float] = field(default_factory=list)
    rows: list[StoredRow] = field(default_factory=list)
    timelines: dict[str, Timeline] = field(default_factory=dict)  # of the rows simulated in this run

    def dominating(self, row: StoredRow) -> StoredRow | None:
        """An evaluated row with no more memory than ``row`` and a time within its bound."""
        return self._within(row.peak_memory_bytes, row.bound_s)

    def _within(self, memory: float, seconds: float) -> StoredRow | None:
        index = bisect.bisect_right(self.memory, memory) - 1
        if index >= 0 and self.rows[index].iteration_time_s <= seconds:
            return self.rows[index]
        return None

    def add(self, row: StoredRow, timeline: Timeline | None = None) -> None:
        if self._within(row.peak_memory_bytes, row.iteration_time_s) is not None:
            return  # no better than a row with no more memory
        start = bisect.bisect_left(self.memory, row.peak_memory_bytes)
        stop = start
        while stop < len(self.rows) and self.rows[stop].iteration_time_s >= row.iteration_time_s:
            stop += 1  # rows with as much memory or more that are no faster fall off
        for gone in self.rows[start:stop]:
            self.timelines.pop(gone.key, None)
        self.memory[start:stop] = [row.peak_memory_bytes]
        self.rows[start:stop] = [row]
        if timeline is not None:
            self.timelines[row.key] = timeline


class _Writer:
    """Rows to the store in transactions of up to FLUSH_ROWS rows or FLUSH_SECONDS."""

    def __init__(self, store: SearchStore, search_id: int) -> None:
        self.store, self.search_id = store, search_id
        self.rows: list[StoredRow] = []
        self.since = 0.0

    def add(self, row: StoredRow) -> None:
        if not self.rows:
            self.since = time.monotonic()
        self.rows.append(row)
        if len(self.rows) >= FLUSH_ROWS or time.monotonic() - self.since >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.store.write(self.search_id, self.rows)
        self.rows = []

