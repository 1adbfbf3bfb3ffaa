"""Quick start: generate two schedules, check them, and compare them at all three levels on
a Llama-3-8B-like model over two 8-GPU H100 nodes.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import pipesched
from pipesched.model import pipeline_ranks
from pipesched.simulate import Network, simulate

P, M = 4, 16
model = pipesched.load_model("llama3-8b")
cluster = pipesched.load_cluster("4x8-h100")
settings = pipesched.TrainingSettings(micro_batch_size=1, seq_len=4096, tensor_parallel=8)

for name in ("1f1b", "zb-v"):
    schedule = pipesched.generate(name, P, M)
    assert pipesched.validate(schedule) == [], name

    # level 1: closed form; level 2: idealized slot table (F = I = W = 1 slot)
    estimate = pipesched.formula(name, P, M)
    table = pipesched.table_metrics(schedule)

    # level 3: layer-wise costs on the cluster, one pipeline device per node (tensor parallel 8)
    costs = pipesched.build_stage_costs(model, schedule.placement, cluster, settings, method="balanced")
    network = Network.from_cluster(cluster, ranks=pipeline_ranks(schedule.placement, cluster, 8))
    timeline = simulate(schedule, costs, network)
    metrics = pipesched.summarize(timeline, micro_batch_size=1, seq_len=4096)

    print(f"{name:5}  formula bubble {estimate.bubble_ratio:.3f}  table bubble {table.bubble_ratio:.3f}  "
          f"simulated {metrics.iteration_time:.3f} s, bubble {metrics.bubble_ratio:.3f}, "
          f"peak memory {max(metrics.peak_memory) / 2**30:.1f} GiB")
