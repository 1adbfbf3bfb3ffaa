"""What real training runs do to a schedule, in Python: frozen layers, per-stage recompute
and activation offload, each simulated on Llama-3-8B over 4 H100s (tensor parallel 2).

Prints one line per case: the iteration time, device 0's peak memory, the stages the table
runs as frozen, and the host memory the offloads hold.
"""

from __future__ import annotations

from pipesched.experiments import Point
from pipesched.experiments.simulation import simulate_point

GiB = 2.0**30

base = Point("zb-h1", p=4, m=8, model="llama3-8b", cluster="1x8-h100", tp=2)
cases = {
    "plain": base,
    # the embedding and the first 16 blocks do not train: the stages holding only them run
    # their forward alone, and the balanced partition gives them more layers
    "frozen": base.replace(frozen_layers="0-16"),
    # full recompute on the first stage only, where the most microbatches wait
    "recompute": base.replace(recompute="full:0,none"),
    # every stage-microbatch of stage 0 goes to host memory over PCIe and comes back
    "offload": base.replace(offload="0"),
}
for name, point in cases.items():
    result = simulate_point(point)
    work = result.metrics.training
    print(f"{name:<10} {result.metrics.iteration_time:.4f} s  device 0 peak {result.metrics.peak_memory[0] / GiB:.1f} GiB"
          f"  frozen stages {sorted(result.schedule.frozen)}  host peak {work.host_peak_bytes[0] / GiB:.1f} GiB")
