"""Design-space search speed on a small machine: points per second with 2 worker processes.

    python benchmarks/bench_search.py               # both parts
    python benchmarks/bench_search.py --quick       # part 1 only

Both parts use model costs (Llama-3-70B on 4 x 8 H100, 4096-token sequences) and sizes up
to p = 16 pipeline devices and m = 64 microbatches, on one pool of ``--workers`` processes
kept for the whole run (its workers cache the schedules and stage costs they build).

1. Level-3 evaluation rate (the target): a fixed list of points (every family at p = 4, 8,
   16 and m = 16, 32, 64, with two recompute modes and three partition methods) evaluated
   at level 3 (``pipesched.experiments.evaluation``, what the search runs) over the pool:
   twice to warm the workers' caches, then timed, each point's CPU time measured in its
   worker. Also the rate of the search's first phase (exact memory and the lower bound,
   ``search.sweep.bound_row``) on the same points, warm. Target: at least 1,000 evaluated
   points per second on 2 cores.
2. A whole search, cold: the default scenario's model and cluster with a global batch of
   64 sequences and p <= 16 (17,424 points), into a fresh store, every point bounded, the
   promising ones simulated: points settled per second (wall time) and the workers' CPU
   seconds per point. Its first pass builds each schedule and stage cost once per worker.

The machine may be shared: the load average before and after each part is printed, and
beside the wall-clock rates the CPU time the points took in the workers (per point in part
1; ``RUSAGE_CHILDREN`` of the pool, which ends with the part, in part 2), which says what
the points cost whatever else runs.
"""

from __future__ import annotations

import argparse
import inspect
import os
import resource
import tempfile
import time
from pathlib import Path

from figures import figure

from pipesched.experiments import Point, Record, evaluate, evaluate_all, process_map
from pipesched.generators import FAMILIES, get_family
from pipesched.search.results import SearchResult
from pipesched.search.space import SearchSpace
from pipesched.search.store import EVALUATED, SearchStore
from pipesched.search.sweep import bound_row, search

DEVICES = 32  # 4 x 8 H100


def points() -> list[Point]:
    """Every family at p in {4, 8, 16}, m in {16, 32, 64}; tensor parallel fills the
    cluster (t = 32 / p, at most 8: p = 4 runs two data-parallel pipelines)."""
    found = []
    for p in (4, 8, 16):
        tp = min(8, DEVICES // p)
        dp = DEVICES // (p * tp)
        for m in (16, 32, 64):
            for family in FAMILIES:
                v = 2 if get_family(family).chunks is None else None
                for recompute in ("selective", "full"):
                    for partition in ("uniform", "balanced", "memory"):
                        found.append(Point(family, p=p, m=m, v=v, tp=tp, dp=dp, recompute=recompute,
                                           partition=partition))
    return found


def load() -> str:
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def evaluation_rate(workers: int) -> None:
    chosen = points()
    print(f"## 1. level-3 evaluation rate, {len(chosen)} points (p <= 16, m <= 64), {workers} workers")
    print(f"before: {load()}")
    before = children_cpu()
    with process_map(workers) as mapper:
        for _ in range(2):  # warm the workers: schedules and stage costs built and cached
            warm = list(evaluate_all(chosen, ("sim",), mapper=mapper))
        start, parent = time.perf_counter(), time.process_time()
        timed = list(mapper(timed_evaluate, chosen))
        elapsed, parent = time.perf_counter() - start, time.process_time() - parent
        start = time.perf_counter()
        bounds = list(mapper(timed_bound, chosen))
        bounded = time.perf_counter() - start
    cpu = children_cpu() - before
    records = [record for record, _ in timed]
    ok = sum(1 for record in records if record.ok)
    assert [r.results for r in records] == [r.results for r in warm]  # the same results every time
    ops = sum(3 * p.p * (p.v or get_family(p.family).chunks) * p.m for p in chosen)
    each = sum(seconds for _, seconds in timed) / len(timed)
    print(f"evaluated {len(records)} points ({ok} simulated, {len(records) - ok} refused with a reason; about "
          f"{ops / len(chosen):,.0f} ops per point) in {elapsed:.3f} s: {len(records) / elapsed:,.0f} points/s "
          f"wall on this loaded machine")
    overall = each + parent / len(timed)
    print(f"CPU per evaluated point: {each * 1e3:.3f} ms in the workers, {parent / len(timed) * 1e3:.3f} ms in the "
          f"parent (sending points, receiving records): {workers / overall:,.0f} points/s on {workers} otherwise "
          "idle cores (target 1,000)")
    figure("evaluation_wall", len(records) / elapsed, "points/s")
    figure("evaluation_cpu_per_point", overall * 1e3, "ms", better="lower")
    bound_each = sum(seconds for _, seconds in bounds) / len(bounds)
    print(f"bound phase (exact memory and lower bound) on the same points: {len(bounds) / bounded:,.0f} points/s "
          f"wall, {bound_each * 1e3:.3f} ms CPU per point")
    figure("bound_wall", len(bounds) / bounded, "points/s")
    figure("bound_cpu_per_point", bound_each * 1e3, "ms", better="lower")
    print(f"workers' CPU in all, warm-up included: {cpu:.1f} s")
    print(f"after: {load()}")


def timed_evaluate(point: Point) -> tuple[Record, float]:
    """A point at level 3, and the CPU seconds it took in this worker."""
    start = time.process_time()
    record = evaluate(point, ("sim",))
    return record, time.process_time() - start


def timed_bound(point: Point) -> tuple[object, float]:
    start = time.process_time()
    row = bound_row(point)
    return row, time.process_time() - start


def whole_search(workers: int) -> None:
    space = SearchSpace(global_batch=64, pipeline=(2, 4, 8, 16))
    total = len(space.points())
    print(f"\n## 2. a whole search, cold: {space.describe()}, p <= 16: {total:,} points, {workers} workers")
    print(f"before: {load()}")
    before = children_cpu()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = run_search(space, Path(folder) / "bench.sqlite", workers)
        elapsed = time.perf_counter() - start
    cpu = children_cpu() - before
    print(f"settled {len(result.rows):,} points in {elapsed:.1f} s: {len(result.rows) / elapsed:,.0f} points/s wall; "
          f"workers' CPU {cpu:.1f} s = {cpu / len(result.rows) * 1e3:.2f} ms per point "
          f"({len(result.rows) / cpu * workers:,.0f} points/s on {workers} otherwise idle cores)")
    figure("search_wall", len(result.rows) / elapsed, "points/s")
    figure("search_cpu_per_point", cpu / len(result.rows) * 1e3, "ms", better="lower")
    print(f"{result.count(EVALUATED):,} simulated (fit), {result.count('out of memory'):,} out of memory, "
          f"{result.count('pruned'):,} pruned, {result.count('invalid'):,} invalid")
    best = result.best
    print(f"best: {best.key}: {best.iteration_time_s:.4f} s, {best.throughput_tokens_per_s:,.0f} tokens/s")
    print(f"after: {load()}")


def run_search(space: SearchSpace, db: Path, workers: int) -> SearchResult:
    """The search into a fresh store at ``db``, through whichever library call this tree
    has: ``search(space, db=...)``, or the earlier ``search(space, store=...)`` with the
    store and the pool opened by the caller (so that the benchmark runs on both)."""
    if "db" in inspect.signature(search).parameters:
        return search(space, db=db, mapper=process_map(workers))
    with SearchStore.open(db) as store, process_map(workers) as mapper:
        return search(space, store=store, mapper=mapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="part 1 only")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; {args.workers} worker processes")
    evaluation_rate(args.workers)
    if not args.quick:
        whole_search(args.workers)


if __name__ == "__main__":
    main()
