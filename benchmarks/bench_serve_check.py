"""Accuracy of ``serve check`` on this machine, run after run: each run serves the check's
trace for real (``serve_run`` with its profile) and predicts it three ways on the same
measurement, so that the machine's state at the time weighs on all three alike:

- ``full``: the check's prediction (the fitted rows times the stages' load factors, the
  host's hop, return and pickup delays);
- ``no-load``: the same without the load factors (the rows as profiled);
- ``profile-only``: the rows as profiled and nothing measured from the run.

Each line: the load average, then each prediction's median |error| of TTFT, TPOT and
end-to-end latency (per cent); the summary: per prediction the median over runs of each
metric and of the worst metric, and the runs that pass (every metric within 10%).

    python benchmarks/bench_serve_check.py --runs 5 [--model small] [--requests 32]
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.experiments.serving import ServingWorkload, served_requests
from pipesched.model import load_model
from pipesched.runtime.measure import ELEMENT_BYTES
from pipesched.runtime.serve_run import ServeRunOptions, serve_run
from pipesched.serving.engine import simulate_serving

# the module, not the function ``pipesched.runtime`` exports under the same name
check = importlib.import_module("pipesched.runtime.serve_check")
WAYS = ("full", "no-load", "profile-only")


def one_run(model_name: str, requests: int) -> dict[str, list[float]]:
    model = load_model(model_name)
    trace = served_requests(ServingWorkload(requests=requests, qps=DEFAULTS.serve_run_qps,
                                            prompt_tokens=DEFAULTS.serve_run_prompt_tokens,
                                            output_tokens=DEFAULTS.serve_run_output_tokens), model.context_length)
    options = ServeRunOptions(profile_repeats=check.CHECK_REPEATS)
    measured = serve_run(model, trace, options=options)
    hidden = model.hidden_size * ELEMENT_BYTES[options.dtype]
    rows = check.fit_stage_rows(measured.ranks, trace, options, measured.slots)
    links = check.fit_links(measured.ranks, hidden)
    delays = check.host_delays(measured.run, links, hidden)

    def errors(stage_rows, *, delayed: bool) -> list[float]:
        deployment = check.predicted_deployment(
            model, trace, options, stage_rows, links, slots=measured.slots, hop_s=delays.hop_s if delayed else (),
            cpu_overhead_s=measured.cpu_overhead_s + (delays.return_s if delayed else 0.0))
        return [100 * m.median_abs_error for m in check.compare_runs(measured.run, simulate_serving(deployment, trace))]

    profiled = check.predicted_deployment(model, trace, options, rows, links, cpu_overhead_s=measured.cpu_overhead_s,
                                          slots=measured.slots)
    load = check.load_factors(measured, profiled.instances[0].stages)
    no_pickup = tuple(0.0 for _ in delays.pickup_s)
    return {"full": errors(check.scaled_rows(rows, load, delays.pickup_s), delayed=True),
            "no-load": errors(check.scaled_rows(rows, tuple((1.0, 1.0) for _ in load), no_pickup), delayed=True),
            "profile-only": errors(rows, delayed=False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default=DEFAULTS.serve_run_model)
    parser.add_argument("--requests", type=int, default=DEFAULTS.serve_run_requests)
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        with open("/proc/loadavg", encoding="utf-8") as file:
            load_average = file.read().split()[0]
        results.append(one_run(args.model, args.requests))
        print(f"load {load_average}  " + "  ".join(f"{way} {' '.join(f'{e:5.1f}' for e in results[-1][way])}"
                                                  for way in WAYS), flush=True)
    for way in WAYS:
        table = np.array([r[way] for r in results])
        print(f"{way:13s} median |error| over runs: TTFT {np.median(table[:, 0]):.1f}%  TPOT {np.median(table[:, 1]):.1f}%"
              f"  e2e {np.median(table[:, 2]):.1f}%  worst metric {np.median(table.max(axis=1)):.1f}%;  "
              f"passed {int((table.max(axis=1) <= 100 * check.TOLERANCE).sum())} of {len(results)}")


if __name__ == "__main__":
    main()
