"""Grids of experiment points evaluated over any map, and competition ranks.

``evaluate_all(points, levels, mapper=...)`` is ``(evaluate(p, levels) for p in points)``
with the loop handed to ``mapper``: the built-in ``map`` (one process), ``process_map(workers)``
(a local process pool per call), ``process_pool(workers)`` (one pool for a ``with`` block),
``ray_pool`` (``pipesched.experiments.ray_pool``: Ray tasks, on this machine or a cluster),
or any function with the shape of ``map``. Points travel to the workers, records come back; the
schedules and per-layer costs a worker builds stay cached in it for the next points.
"""

from __future__ import annotations

import builtins
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from pipesched.experiments.evaluate import LEVELS, LevelResult, Record, check_levels, evaluate
from pipesched.experiments.point import Point

Mapper = Callable[..., Iterable[Record]]


def evaluate_all(points: Sequence[Point], levels: Sequence[str] = LEVELS, *, mapper: Mapper = builtins.map,
                 keep_timelines: bool = False) -> Iterator[Record]:
    """Every point at ``levels``, in the order given, as the records come (see the module
    docstring)."""
    levels = check_levels(levels)
    return iter(mapper(partial(evaluate, levels=levels, keep_timeline=keep_timelines), points))


def process_map(workers: int | None = None, *, chunksize: int = 16) -> Mapper:
    """A ``map`` over a local pool of ``workers`` processes (default: the CPU count), started
    for each call."""
    count = workers or os.cpu_count() or 1

    def pooled(function: Callable, items: Iterable) -> Iterator:
        items = list(items)
        if count <= 1 or len(items) <= 1:
            yield from builtins.map(function, items)
            return
        with ProcessPoolExecutor(max_workers=count) as pool:
            yield from pool.map(function, items, chunksize=_chunk(len(items), count, chunksize))

    return pooled


@contextmanager
def process_pool(workers: int | None = None, *, chunksize: int = 16) -> Iterator[Mapper]:
    """A ``map`` over one local pool of ``workers`` processes (default: the CPU count) kept
    for the whole ``with`` block, so the schedules and costs its workers cached serve every
    call; one worker maps in this process."""
    count = workers or os.cpu_count() or 1
    if count <= 1:
        yield builtins.map
        return
    with ProcessPoolExecutor(max_workers=count) as pool:
        def pooled(function: Callable, items: Iterable) -> Iterator:
            items = list(items)
            return pool.map(function, items, chunksize=_chunk(len(items), count, chunksize))

        yield pooled


def _chunk(items: int, workers: int, most: int) -> int:
    """Items per task: at most ``most``, fewer when that would leave workers idle."""
    return max(1, min(most, items // workers))



def grid(families: Iterable[str], **axes: Iterable[object] | object) -> list[Point]:
    """The points of every combination of ``families`` and the values of ``axes`` (a field
    of Point given one value or an iterable of values; strings count as one value).

    >>> [(p.family, p.m) for p in grid(["1f1b", "zb-h1"], p=4, m=[8, 16])]
    [('1f1b', 8), ('1f1b', 16), ('zb-h1', 8), ('zb-h1', 16)]
    """
    names = list(axes)
    values = [list(v) if isinstance(v, Iterable) and not isinstance(v, str | bytes) else [v] for v in axes.values()]
    return [Point(family, **dict(zip(names, combo, strict=True)))
            for family in families for combo in itertools.product(*values)]


def rank(records: Sequence[Record], levels: Sequence[str]) -> list[Record]:
    """The records that have results, each result with its competition rank (1, 2, 2, 4) by
    iteration time within its level and its rank at the level before."""
    ok = [r for r in records if r.ok]
    rank_of: dict[tuple[int, str], int] = {}
    for level in levels:
        times = [r.result(level).iteration_time for r in ok]
        for index, mine in enumerate(times):
            # equal within rounding: 1e-9 relative
            rank_of[(index, level)] = 1 + sum(1 for t in times if t < mine * (1 - 1e-9))
    ranked = []
    for index, record in enumerate(ok):
        results: list[LevelResult] = []
        for k, level in enumerate(levels):
            previous = rank_of[(index, levels[k - 1])] if k > 0 else None
            results.append(replace(record.result(level), rank=rank_of[(index, level)], previous_rank=previous))
        ranked.append(replace(record, results=tuple(results)))
    return ranked
