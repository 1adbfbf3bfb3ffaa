"""Placement speed: 8 models on 16 devices (two nodes of 8 A100 80 GB, ``2x8-a100``), the
greedy placement against the simulator beside the two baselines (``serve pool``).

The models and their traffic are AlpaServe's setting: models of 1.3 to 70 billion
parameters, rates skewed between them (a power law: the busiest model gets about ten times
the quietest's requests), bursty arrivals (gamma gaps of CV 3-4), chat-like lengths
(prompts uniform 64-1024, outputs uniform 16-256), per-model SLOs. Each model allows the
TP x PP shapes listed in ``MODELS``; the greedy search cuts the devices into groups of
those shapes as it adds replicas.

Target (issue 22): the greedy placement search under 10 s. Time it:

    python benchmarks/bench_pool_placement.py [--requests N] [--scale X]

It prints, per method: the seconds the placement took (the search, its group runs
included; wall clock and this process's CPU time, the figure on a machine other jobs
share), the group runs simulated, the SLO attainment of the pool's run of the
placement, and the groups.
"""

from __future__ import annotations

import argparse
import time

from pipesched.model import load_cluster, load_model
from pipesched.serving.config import SchedulerSpec
from pipesched.serving.pool import ModelTraffic, PoolSpec
from pipesched.serving.pool_result import serve_pool
from pipesched.serving.pool_search import PLACEMENTS, Scores, check_placeable, place
from pipesched.serving.trace import TraceSpec, synthetic_trace

SMALL = ((1, 1), (2, 1), (1, 2))
# name, model preset, requests per second, arrival CV, TTFT SLO (s), TPOT SLO (s), shapes
MODELS = (
    ("chat-a", "llama3-8b", 8.0, 3.0, 1.0, 0.05, SMALL),
    ("chat-b", "llama3-8b", 4.0, 4.0, 1.0, 0.05, SMALL),
    ("code", "llama3-8b", 2.5, 3.0, 1.5, 0.05, SMALL),
    ("summary", "gpt3-6.7b", 2.0, 4.0, 2.0, 0.1, SMALL),
    ("search", "gpt3-6.7b", 1.5, 3.0, 1.0, 0.05, SMALL),
    ("writer", "gpt3-13b", 1.2, 4.0, 2.0, 0.1, ((1, 1), (2, 1), (4, 1))),
    ("tagger", "gpt3-1.3b", 1.0, 3.0, 0.5, 0.03, SMALL),
    ("large", "llama3-70b", 0.8, 3.0, 3.0, 0.15, ((4, 1), (2, 2), (8, 1))),
)


def pool(requests: int, scale: float) -> PoolSpec:
    models = tuple(
        ModelTraffic(name=name, model=load_model(preset),
                     trace=synthetic_trace(TraceSpec(requests=requests, qps=qps * scale, arrival=f"gamma:{cv:g}",
                                                     prompt="uniform:64-1024", output="uniform:16-256",
                                                     seed=seed)),
                     slo_ttft_s=ttft, slo_tpot_s=tpot, shapes=shapes)
        for seed, (name, preset, qps, cv, ttft, tpot, shapes) in enumerate(MODELS))
    return PoolSpec(cluster=load_cluster("2x8-a100"), models=models,
                    scheduler=SchedulerSpec(max_batch=64, chunk=512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per model (default 200)")
    parser.add_argument("--scale", type=float, default=1.0, help="every model's rate times this (default 1)")
    args = parser.parse_args()
    started = time.perf_counter()
    spec = pool(args.requests, args.scale)
    check_placeable(spec)
    print(f"8 models, {sum(len(m.trace) for m in spec.models):,} requests, 16 devices; "
          f"pool built in {time.perf_counter() - started:.2f} s")
    for method in PLACEMENTS:
        scores = Scores(spec)
        start, cpu = time.perf_counter(), time.process_time()
        placement = place(spec, method, scores)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        result = serve_pool(spec, placement, placement_s=seconds)
        groups = "; ".join(f"{g['ranks'][0]}-{g['ranks'][-1]} {g['tp']}x{g['pp']}"
                           f"{' swapped' if g['swapped'] else ''}: {','.join(g['models'])}"
                           for g in placement.to_dict(spec)["groups"])
        print(f"{method:12s} {seconds:6.2f} s ({cpu:5.2f} s CPU)  {scores.runs:4d} group runs  attainment {result.attainment:6.1%}  "
              f"swaps {len(result.swaps)}")
        print(f"    {groups}")
    print(f"total {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
