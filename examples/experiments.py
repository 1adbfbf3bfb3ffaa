"""Experiments as data: a grid of points evaluated over a process pool, and one schedule
compiled once and run again with new op durations (a what-if without lowering again).

Run: python examples/experiments.py
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.experiments import evaluate_all, grid, process_map, rank
from pipesched.generators import generate
from pipesched.simulate import Network, compile_graph, run

# four families at p = 4, m = 16 on the default model and cluster, two latency what-ifs
points = grid(["1f1b", "interleaved-1f1b", "zb-h1", "zb-v"], p=4, m=16, tp=8, latency=[None, 1e-4])
with process_map(2) as pool:
    records = list(evaluate_all(points, ["table", "sim"], mapper=pool))
for latency in (None, 1e-4):
    ranked = rank([r for r in records if r.point.latency == latency], ["table", "sim"])
    for record in sorted(ranked, key=lambda r: r.result("sim").rank):
        table, sim = record.result("table"), record.result("sim")
        links = "cluster links" if latency is None else f"links at {latency * 1e6:g} us"
        print(f"{record.point.family:17} {links:16} table rank {table.rank}  sim {sim.iteration_time:.3f} s  "
              f"rank {sim.rank}  {sim.throughput_tokens_per_s:,.0f} tokens/s")

# compile once, run many: the same ZB-V graph with every op 10% slower on device 0
schedule = generate("zb-v", 4, 16)
graph = compile_graph(schedule, StageCosts.uniform(8, forward=0.01, backward_input=0.012, backward_weight=0.008,
                                                   output_bytes=2**24),
                      Network.uniform(4, latency=5e-6, bandwidth=50e9))
slower = graph.op_duration * (1 + 0.1 * (graph.ops.device == 0))
print(f"zb-v what-if: {run(graph).makespan:.4f} s -> {run(graph, op_durations=slower).makespan:.4f} s "
      "with device 0 10% slower")
