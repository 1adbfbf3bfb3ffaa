"""How fast are the serving metrics and the capacity search?

    python benchmarks/bench_serving_results.py [--runs 5] [--no-capacity] > benchmarks/results/serving_results.txt

1. ``serve_result`` and its JSON on a run of 8,819 requests of 227 output tokens each (about
   2 M token times) and 200,000 iteration rows, built directly (no engine): the target is
   well under 100 ms (median of ``--runs``).
2. ``capacity`` on the default scenario (Llama-3-70B, TP 4, PP 2 on one 8 x H100 node,
   Sarathi-Serve with chunk 512, 1,000 Poisson requests from 2 requests/s, TTFT 2 s, TPOT
   0.1 s, 90%) as a fresh process: wall-clock and CPU time (user + system of the child,
   less disturbed than wall time by other work on the machine). The target: under 30 s.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from pipesched.serving.config import ServeConfig
from pipesched.serving.records import IterationLog, KVTrace, ServeRun
from pipesched.serving.results import serve_result
from pipesched.serving.trace import TraceSpec, synthetic_trace

REQUESTS, OUTPUT, ROWS = 8819, 227, 200_000

CAPACITY = """
from functools import partial
from pipesched.model import load_cluster, load_model
from pipesched.serving.capacity import capacity
from pipesched.serving.config import ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.trace import TraceSpec
deployment = build_deployment(ServeConfig(), load_model("llama3-70b"), load_cluster("1x8-h100"))
found = capacity(partial(simulate_serving, deployment), TraceSpec(max_context=deployment.max_context))
print(f"max_qps {found.max_qps:.4g} requests/s, {len(found.probes)} runs")
"""


def _run() -> ServeRun:
    """Requests whose tokens come every 50 ms from 1 s after arrival; iterations of 0.5 s."""
    trace = synthetic_trace(TraceSpec(requests=REQUESTS, qps=3.0, output=f"fixed:{OUTPUT}", seed=1))
    offsets = np.concatenate([[0], np.cumsum(trace.decode_tokens)]).astype(np.int64)
    step = np.arange(offsets[-1]) - np.repeat(offsets[:-1], trace.decode_tokens)
    times = np.repeat(trace.arrived_at + 1.0, trace.decode_tokens) + 0.05 * step
    rows = np.arange(ROWS)
    zeros = np.zeros(ROWS, np.int64)
    log = IterationLog(batch=rows // 2, instance=np.zeros(ROWS, np.int32), stage=(rows % 2).astype(np.int32),
                       first_device=(rows % 2).astype(np.int32) * 4, start=rows * 0.25, end=rows * 0.25 + 0.2,
                       prefill_tokens=zeros, decodes=zeros, kv_tokens=zeros, flops=np.full(ROWS, 1e12),
                       members=np.zeros(ROWS // 2, np.int64), offsets=np.arange(ROWS // 2 + 1, dtype=np.int64))
    n = len(trace)
    return ServeRun(trace=trace, config=ServeConfig(), instance=np.zeros(n, np.int32),
                    scheduled_at=trace.arrived_at + 0.5, first_token_at=times[offsets[:-1]],
                    finished_at=times[offsets[1:] - 1], preemptions=np.zeros(n, np.int32), token_times=times,
                    token_offsets=offsets, iterations=log,
                    kv=KVTrace((np.zeros(1),), (np.zeros(1, np.int64),), (1000,), 16),
                    instance_kind=("replica",), instance_devices=((0, 4),), tp=(4,), peak_flops=9.89e14)


def _metrics(runs: int) -> None:
    run = _run()
    serve_result(run)  # the first call loads the compiled interval union
    seconds, json_seconds = [], []
    for _ in range(runs):
        start = time.perf_counter()
        result = serve_result(run)
        seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        result.to_dict()
        json_seconds.append(time.perf_counter() - start)
    print(f"serve_result of {REQUESTS:,} requests, {int(run.token_offsets[-1]):,} tokens, {ROWS:,} iteration rows: "
          f"{1000 * statistics.median(seconds):.1f} ms; to_dict {1000 * statistics.median(json_seconds):.1f} ms "
          f"(median of {runs})")


def _capacity() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CAPACITY], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"capacity, default scenario, whole process: {wall:.1f} s wall, {cpu:.1f} s CPU; {proc.stdout.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-capacity", action="store_true", help="time the metrics only")
    args = parser.parse_args()
    _metrics(args.runs)
    if not args.no_capacity:
        _capacity()


if __name__ == "__main__":
    main()
