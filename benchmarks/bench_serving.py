"""Serving simulation speed: a trace of 8,819 requests (the size of the public Splitwise
conversation trace) on Llama-3-70B, TP 4 x PP 2 on one 8 x H100 node (``1x8-h100``),
Sarathi-Serve with a 512-token chunk (the serving defaults), simulated whole.

The trace is synthetic, with lengths like the Splitwise conversation trace: prompts
lognormal with median 1,000 tokens, outputs lognormal with median 200, Poisson arrivals
at ``--qps`` (default 10: a rate this deployment sustains, its TTFT p99 near a second;
at 14 its queue grows without bound). The stage costs come from the kernel model
(``build_deployment``). A lower rate means more, smaller batches: the run's work is per
batch (and per token of a batch), so it takes longer.

Target (issue 21): under 2 s for the whole process on one core. Time it whole:

    /usr/bin/time -f "%e s wall, %U s user, %S s sys" taskset -c 0 python benchmarks/bench_serving.py

With ``--cli N`` it times instead the command a user runs, ``python -m pipesched serve
simulate`` on the same deployment and requests, as N whole processes pinned to one core
(start-up, options, simulation, result and output): each one's wall time and CPU time
(user + sys; on a shared machine the wall time also holds the waits for the core).

The script prints its own parts: importing pipesched's serving modules (numpy, numba and
the model's modules come with them), building the trace and the deployment, and the
simulation (the first call in a process loads the compiled engine from numba's cache;
a second call shows the run alone).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

started = time.perf_counter()

import numpy as np  # noqa: E402

from pipesched.model import load_cluster, load_model  # noqa: E402
from pipesched.serving.config import ServeConfig  # noqa: E402
from pipesched.serving.deployment import build_deployment  # noqa: E402
from pipesched.serving.engine import simulate_serving  # noqa: E402
from pipesched.serving.trace import TraceSpec, synthetic_trace  # noqa: E402

imported = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8819)
    parser.add_argument("--qps", type=float, default=10.0)
    parser.add_argument("--again", action="store_true", help="simulate a second time, to time the run alone")
    parser.add_argument("--cli", type=int, default=0, metavar="N", help="time N processes of the command instead")
    args = parser.parse_args()
    if args.cli:
        time_command(args.requests, args.qps, args.cli)
        return
    begin = time.perf_counter()
    model = load_model("llama3-70b")
    deployment = build_deployment(ServeConfig(), model, load_cluster("1x8-h100"))
    trace = synthetic_trace(TraceSpec(requests=args.requests, qps=args.qps, prompt="lognormal:1000,0.8",
                                      output="lognormal:200,0.8", seed=0, max_context=model.context_length))
    built = time.perf_counter()
    run = simulate_serving(deployment, trace)
    done = time.perf_counter()
    ttft = run.first_token_at - trace.arrived_at
    print(f"requests {len(trace):,}  output tokens {int(trace.decode_tokens.sum()):,}  prompt tokens "
          f"{int(trace.prefill_tokens.sum()):,}  at {args.qps:g} req/s")
    print(f"batches {int(run.iterations.offsets.size - 1):,}  simulated {run.duration:,.0f} s  TTFT p50 "
          f"{np.median(ttft):.3f} s p99 {np.quantile(ttft, 0.99):.3f} s  preemptions {int(run.preemptions.sum())}")
    print(f"import {imported - started:.2f} s  trace + deployment {built - begin:.2f} s  simulate {done - built:.2f} s")
    if args.again:
        again = time.perf_counter()
        simulate_serving(deployment, trace)
        print(f"simulate again {time.perf_counter() - again:.2f} s")


def time_command(requests: int, qps: float, runs: int) -> None:
    """``runs`` whole processes of ``pipesched serve simulate`` on core 0: wall and CPU seconds each."""
    command = [sys.executable, "-m", "pipesched", "serve", "simulate", "--model", "llama3-70b", "--cluster",
               "1x8-h100", "--requests", str(requests), "--qps", f"{qps:g}", "--prompt-tokens", "lognormal:1000,0.8",
               "--output-tokens", "lognormal:200,0.8"]
    print("$", " ".join(["python", *command[1:]]))
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begin = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
        walls.append(time.perf_counter() - begin)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        print(f"{walls[-1]:.2f} s wall, {cpus[-1]:.2f} s CPU (user + sys)")
    print(f"median of {runs}: {np.median(walls):.2f} s wall, {np.median(cpus):.2f} s CPU; best {min(walls):.2f} s wall")


if __name__ == "__main__":
    main()
