"""Experiments layer throughput: level-3 evaluations per second over a grid of points.

    python benchmarks/bench_experiments.py            # both grids, 2 worker processes
    python benchmarks/bench_experiments.py --workers 1

The grids (every family, p in {4, 8, 16}, m in {8, 16, 32, 64}, v in {2, 4}: 13 families x
3 x 4 x 2 = 312 schedule points, of which those a family cannot build are skipped) are
evaluated at the sim level only, each schedule point under several workloads, as a sweep
does:

- uniform: per-stage costs F = 20 ms, I = 25 ms, W = 15 ms (split into chunks for
  interleaved families), 16 MiB boundary tensors, on uniform links of 4 latencies x 2
  bandwidths (8 workloads per schedule point);
- model: llama3-70b on the 4 x 8 H100 cluster (tensor parallel 4 for p <= 8, 2 for p = 16),
  micro-batch 1 x 4096 tokens, 4 link what-ifs (the cluster's links, every link at 3 us,
  50 GB/s, and both).

What is timed: each point's ``evaluate(point, ["sim"])`` over ``process_map(workers)`` from
a fresh pool, wall clock, and the CPU time each point took in its worker (what the points
cost whatever else runs on a shared machine); "cold" is the first pass over the grid (every schedule generated and
every stage cost computed once in the worker that meets it first), "warm" a second pass
over the same grid in the same pool (schedules and costs cached in the workers). Evaluations per second count
every point evaluated (skipped points included: they cost a failed build).

Targets: >= 2,000 evaluations/s with uniform costs and >= 1,000/s with model costs on 2
cores (before the experiments layer, the same kind of sweep ran 243/s and 67/s). Since
then zb-1p and zb-2p plan with each workload's own costs: every (schedule point, workload)
pair runs the zero-bubble heuristic once in the cold pass.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

from figures import figure

from pipesched.costs import StageCosts
from pipesched.experiments import Point, Record, evaluate, process_map
from pipesched.generators import FAMILIES

P, M, V = (4, 8, 16), (8, 16, 32, 64), (2, 4)


def schedule_points() -> list[tuple[str, int, int, int | None]]:
    out = []
    for name, p, m, v in itertools.product(FAMILIES, P, M, V):
        takes_v = FAMILIES[name].chunks is None
        if not takes_v and v != V[0]:
            continue  # one point per size for families with a fixed chunk count
        out.append((name, p, m, v if takes_v else None))
    return out


def uniform_grid() -> list[Point]:
    points = []
    for name, p, m, v in schedule_points():
        costs = StageCosts.uniform(p, forward=0.020, backward_input=0.025, backward_weight=0.015,
                                   activation_bytes=2e9, output_bytes=16 * 2**20)
        for latency, bandwidth in itertools.product((0.0, 2e-6, 1e-5, 5e-5), (50e9, 400e9)):
            points.append(Point(name, p=p, m=m, v=v, stage_costs=costs, latency=latency, bandwidth=bandwidth))
    return points


def model_grid() -> list[Point]:
    points = []
    for name, p, m, v in schedule_points():
        tp = 4 if p <= 8 else 2
        for latency, bandwidth in ((None, None), (3e-6, None), (None, 50e9), (3e-6, 50e9)):
            points.append(Point(name, p=p, m=m, v=v, model="llama3-70b", cluster="4x8-h100", tp=tp,
                                latency=latency, bandwidth=bandwidth))
    return points


def timed_evaluate(point: Point) -> tuple[Record, float]:
    """A point at the sim level, and the CPU seconds it took in its worker."""
    start = time.process_time()
    record = evaluate(point, ("sim",))
    return record, time.process_time() - start


def rate(points: list[Point], workers: int) -> tuple[float, float, float, float, int, int]:
    """(cold, warm) evaluations per second, (cold, warm) CPU seconds per point in the
    workers, evaluated and skipped counts."""
    with process_map(workers) as mapper:
        start = time.perf_counter()
        cold_timed = list(mapper(timed_evaluate, points))
        cold = time.perf_counter() - start
        start = time.perf_counter()
        warm_timed = list(mapper(timed_evaluate, points))
        warm = time.perf_counter() - start
    ok = sum(1 for record, _ in cold_timed if record.ok)
    cold_cpu = sum(seconds for _, seconds in cold_timed) / len(points)
    warm_cpu = sum(seconds for _, seconds in warm_timed) / len(points)
    return len(points) / cold, len(points) / warm, cold_cpu, warm_cpu, ok, len(points) - ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; workers {args.workers}; load average {os.getloadavg()[0]:.2f}")
    for name, build, target in (("uniform costs", uniform_grid, 2000), ("model costs (llama3-70b, 4x8-h100)",
                                                                         model_grid, 1000)):
        label = name.split()[0]
        points = build()
        cold, warm, cold_cpu, warm_cpu, ok, skipped = rate(points, args.workers)
        verdict = "meets" if min(cold, warm) >= target else ("meets warm" if warm >= target else "MISSES")
        print(f"{name}: {len(points)} points ({ok} evaluated, {skipped} skipped): cold {cold:,.0f}/s, "
              f"warm {warm:,.0f}/s (target {target:,}/s: {verdict}); CPU per point in the workers: cold "
              f"{cold_cpu * 1e3:.2f} ms, warm {warm_cpu * 1e3:.2f} ms ({args.workers / cold_cpu:,.0f}/s and "
              f"{args.workers / warm_cpu:,.0f}/s on {args.workers} otherwise idle cores)")
        figure(f"{label}_grid_cold", cold, "points/s")
        figure(f"{label}_grid_warm", warm, "points/s")
        figure(f"{label}_grid_cold_cpu_per_point", cold_cpu * 1e3, "ms", better="lower")
        figure(f"{label}_grid_warm_cpu_per_point", warm_cpu * 1e3, "ms", better="lower")


if __name__ == "__main__":
    main()
