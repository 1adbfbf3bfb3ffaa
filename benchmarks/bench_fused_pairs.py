"""DualPipe's overlapped pairs on a slow network: the fused table (each F&B pair one op, as
DeepSeek's runtime runs it) against the same table with every pair written as two ops.

    python benchmarks/bench_fused_pairs.py [--png docs/fused_pairs.png]

Setup: DualPipeV on p = 4 devices (8 stages), m = 16 microbatches, and DualPipe on p = 4,
m = 16 and p = 8, m = 32; every stage's F = I = W = 1 s, one-byte messages over links of the given latency
and unlimited bandwidth (so a message takes its latency), contention on. Two runtimes:

- overlapping (the simulator's default): transfers run beside compute;
- blocking (``--no-overlap``): a device alternates steps of compute and batches of sends
  and receives; a fused pair is one step, its receives batched before it and its sends
  after it, as DeepSeek's ``_forward_backward_chunk`` runs it. The unfused table runs with
  one batch per op where that does not deadlock, else per forward-backward pair
  (``blocking_steps="auto"``). DualPipeV's sends and receives cross either way, and so do
  DualPipe's at p = 8, m = 32: they deadlock on a blocking runtime, fused or not, and their
  rows say so.

And two pair costs: F&B = F + B (``fb_cost`` 1, no compute overlap) and F&B = 0.7 (F + B).
Printed: the iteration time of the unfused and the fused table and the fused table's gain.
"""

from __future__ import annotations

import argparse
import dataclasses

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.simulate import Network, simulate

CASES = (("dualpipev", 4, 16), ("dualpipe", 4, 16), ("dualpipe", 8, 32))
LATENCIES = (0.0, 0.1, 0.3, 1.0)


def iteration(name: str, p: int, m: int, *, fused: int, latency: float, overlap: bool, fb_cost: float = 1.0):
    schedule = generate(name, p, m, fused=fused)
    costs = dataclasses.replace(StageCosts.uniform(schedule.num_stages, output_bytes=1.0), fb_cost=fb_cost)
    return simulate(schedule, costs, Network.uniform(p, latency=latency, bandwidth=float("inf")), overlap=overlap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", help="draw DualPipeV at latency 1 s, F&B = 0.7 (F + B), unfused over fused")
    args = parser.parse_args()
    print(f"{'schedule':<10} {'runtime':<11} {'F&B':<10} {'latency s':>9} {'unfused s':>10} {'fused s':>8} {'gain':>7}")
    for name, p, m in CASES:
        for overlap in (False, True):
            for fb_cost in (1.0, 0.7):
                for latency in LATENCIES:
                    runtime = "overlapping" if overlap else "blocking"
                    pair = "F + B" if fb_cost == 1.0 else f"{fb_cost:g} (F + B)"
                    try:
                        unfused = iteration(name, p, m, fused=0, latency=latency, overlap=overlap).makespan
                        fused = iteration(name, p, m, fused=1, latency=latency, overlap=overlap,
                                          fb_cost=fb_cost).makespan
                    except PipeschedError:
                        print(f"{name + f' p={p}':<10} {runtime:<11} {pair:<10} {latency:>9g} "
                              "deadlocks: its sends and receives cross")
                        continue
                    print(f"{name + f' p={p}':<10} {runtime:<11} {pair:<10} {latency:>9g} {unfused:>10.1f} "
                          f"{fused:>8.1f} {1 - fused / unfused:>+7.1%}")
    if args.png:
        from pathlib import Path

        from pipesched.render.gantt import render_gantt

        timelines = [iteration("dualpipev", 4, 16, fused=fused, latency=1.0, overlap=True, fb_cost=0.7)
                     for fused in (0, 1)]
        Path(args.png).write_bytes(render_gantt(timelines, fmt="png", dpi=110,
                                                title="DualPipeV, p=4, m=16, 1 s links, F&B = 0.7 (F + B): "
                                                      "pairs as two ops (top) and fused (bottom)"))
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
