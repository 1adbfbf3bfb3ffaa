"""Grids of experiment points evaluated over any map, and competition ranks.

``evaluate_all(points, levels, mapper=...)`` is ``(evaluate(p, levels) for p in points)``
with the loop handed to ``mapper``: the built-in ``map`` (one process), ``process_map(workers)``
(a local process pool, kept for a ``with`` block), ``ray_pool`` (``pipesched.experiments.ray_pool``: Ray tasks, on this machine or a cluster),
or any function with the shape of ``map``. Points travel to the workers, records come back; the
schedules and per-layer costs a worker builds stay cached in it for the next points.
"""

from __future__ import annotations

import builtins
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from functools import partial

from pipesched.experiments.evaluation import LEVELS, LevelResult, Record, check_levels, evaluate
from pipesched.experiments.point import Point
from pipesched.limits import MAX_WORKERS, check_count

Mapper = Callable[..., Iterable[Record]]


def evaluate_all(points: Sequence[Point], levels: Sequence[str] = LEVELS, *, mapper: Mapper = builtins.map,
                 keep_timelines: bool = False) -> Iterator[Record]:
    """Every point at ``levels``, in the order given, as the records come (see the module
    docstring)."""
    levels = check_levels(levels)
    return iter(mapper(partial(evaluate, levels=levels, keep_timeline=keep_timelines), points))


class process_map:
    """A ``map`` over a local pool of ``workers`` processes (default: the CPU count, at most
    ``limits.MAX_WORKERS``). The pool starts on first use and lives until ``close()`` (or
    the end of a ``with`` block), so the schedules and stage costs its workers cached serve
    the next calls too.

    Points that share a schedule (family, p, m, v) always go to the same worker, in every
    call: a schedule is built once in the pool, and a second pass over a grid finds it in
    that worker's cache. A schedule met for the first time goes to the worker given the
    least work so far, an item's work counted as its table's size (p x m x v): the
    workers share a grid evenly. Results come back in the order of the items.

    The workers die with the process that started them (even one killed with SIGKILL) and
    leave Ctrl-C to it; a ``with`` block left by an exception (Ctrl-C's KeyboardInterrupt
    among them) drops the queued work and kills the workers at once instead of waiting for it.
    """

    def __init__(self, workers: int | None = None, *, chunksize: int = 16) -> None:
        if workers is None:
            workers = min(os.cpu_count() or 1, MAX_WORKERS)
        self.workers = check_count("workers", workers, MAX_WORKERS, what="worker processes")
        self.chunksize = chunksize
        self._pools: list[ProcessPoolExecutor] = []
        self._worker_of_schedule: dict[tuple, int] = {}  # a Point's schedule -> the worker that holds it
        self._given = [0] * self.workers  # work given to each worker, over every call (in ops of the tables)

    def __call__(self, function: Callable, items: Iterable) -> Iterator:
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return builtins.map(function, items)
        if not self._pools:
            self._pools = [ProcessPoolExecutor(max_workers=1, initializer=_worker_started)
                           for _ in range(self.workers)]
        shards: list[list[int]] = [[] for _ in self._pools]
        for index, item in enumerate(items):
            shards[self._worker_of(item, index)].append(index)
        placed: list[tuple[Future, int] | None] = [None] * len(items)
        for pool, indices in zip(self._pools, shards, strict=True):
            size = max(1, min(self.chunksize, len(indices) // 4 or 1))
            for start in range(0, len(indices), size):
                chunk = indices[start:start + size]
                future = pool.submit(_apply, function, [items[i] for i in chunk])
                for position, index in enumerate(chunk):
                    placed[index] = (future, position)
        return (future.result()[position] for future, position in placed)  # type: ignore[misc]

    def _worker_of(self, item: object, index: int) -> int:
        """The worker of an item: a Point's schedule stays with the worker it was first
        given to (the one given the least work then); anything else goes in turn."""
        if not isinstance(item, Point):
            return index % self.workers
        key = (item.family, item.p, item.m, item.v, item.schedule is None)
        worker = self._worker_of_schedule.get(key)
        if worker is None:
            worker = self._worker_of_schedule[key] = self._given.index(min(self._given))
        self._given[worker] += item.p * item.m * (item.v or 1)
        return worker

    def close(self) -> None:
        """Let the workers finish what was given to them, then stop them."""
        for pool in self._pools:
            pool.shutdown()
        self._pools = []

    def stop(self) -> None:
        """Drop the queued work and kill the workers now (what they compute is lost)."""
        for pool in self._pools:
            # the executor has no public way to end a running task (Python 3.14 adds one)
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.kill()
            pool.shutdown(wait=True, cancel_futures=True)
        self._pools = []

    def __enter__(self) -> process_map:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.close()
        else:
            self.stop()


def _worker_started() -> None:
    """In each pool worker: Ctrl-C is the parent's to handle, and the worker exits as soon as
    its parent is gone (its sentinel, a pipe the parent holds open, becomes readable)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True, name="parent-watch").start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _apply(function: Callable, chunk: list) -> list:
    return [function(item) for item in chunk]


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
    """The records that have results, each result with its competition rank (1, 2, 2, 4)
    within its level and its rank at the level before: by iteration time among the results
    that fit in memory, then the ones out of memory by iteration time (``rank_key``)."""
    ok = [r for r in records if r.ok]
    rank_of: dict[tuple[int, str], int] = {}
    for level in levels:
        keys = [rank_key(r.result(level)) for r in ok]
        for index, (over, mine) in enumerate(keys):
            # equal within rounding: 1e-9 relative
            rank_of[(index, level)] = 1 + sum(1 for other, t in keys
                                              if other < over or (other == over and t < mine * (1 - 1e-9)))
    ranked = []
    for index, record in enumerate(ok):
        results: list[LevelResult] = []
        for k, level in enumerate(levels):
            previous = rank_of[(index, levels[k - 1])] if k > 0 else None
            results.append(replace(record.result(level), rank=rank_of[(index, level)], previous_rank=previous))
        ranked.append(replace(record, results=tuple(results)))
    return ranked


def rank_key(result: LevelResult) -> tuple[bool, float]:
    """What ranks a result within its level: whether it is out of memory (those that fit
    come first, as a search ranks them), then its iteration time."""
    return bool(result.out_of_memory), result.iteration_time
