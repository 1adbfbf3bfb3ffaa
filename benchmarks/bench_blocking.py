"""The blocking runtime (``--no-overlap``) on the A100 case of the cluster-scale issue: GPT
models on 4 nodes of 8 A100 (NVLink inside a node, one 200 Gb/s NIC per GPU), 1F1B and
interleaved 1F1B, overlapped against blocking.

    python benchmarks/bench_blocking.py

For each case: the overlapped iteration time, the blocking one and its slowdown, the
batches the blocking runtime ran (one op per step, or a forward and a backward per step),
and the worst device's exposed communication under each. Uses only the public library,
so the same script measures any version of the engine.
"""

from __future__ import annotations

from pipesched.errors import PipeschedError
from pipesched.experiments import Point
from pipesched.metrics import communication_per_device
from pipesched.model.clusters import parse_cluster
from pipesched.simulate import simulate

CLUSTER = parse_cluster("""
name: 4x8-a100
nodes:
  - count: 4
    devices_per_node: 8
    device: a100-80gb
intra_node:
  bandwidth: 300 GB/s
  latency: 3 us
inter_node:
  bandwidth: 200 Gb/s
  latency: 5 us
nic_per_device: true
""")

# (model, pipeline devices p, tensor parallel t): p x t = 32 GPUs
CASES = (("gpt3-1.3b", 8, 4), ("gpt3-6.7b", 8, 4), ("gpt3-13b", 16, 2), ("gpt3-13b", 8, 4))
SCHEDULES = (("1f1b", None), ("interleaved-1f1b", 2))


def main() -> None:
    print(f"{'model':10s} {'p':>3s} {'t':>2s} {'schedule':18s} {'overlap s':>10s} {'blocking s':>11s} "
          f"{'slowdown':>9s} {'batches':>8s} {'exposed ms (overlap / blocking)':>32s}")
    for model, p, t in CASES:
        for family, v in SCHEDULES:
            point = Point(family, p=p, m=4 * p, v=v, model=model, cluster=CLUSTER, tp=t, seq_len=2048)
            schedule = point.build_schedule()
            setup = point.setup()
            costs, network = setup.costs_for(schedule), setup.network_for(schedule)
            overlapped = simulate(schedule, costs, network)
            try:
                blocking = simulate(schedule, costs, network, overlap=False)
            except PipeschedError as exc:
                print(f"{model:10s} {p:3d} {t:2d} {family:18s} {overlapped.makespan:10.4f}  blocking: {exc}")
                continue
            steps = getattr(blocking.simulation, "blocking_steps", None) or "-"
            exposed = (1e3 * communication_per_device(overlapped)[0].max(),
                       1e3 * communication_per_device(blocking)[0].max())
            print(f"{model:10s} {p:3d} {t:2d} {family:18s} {overlapped.makespan:10.4f} {blocking.makespan:11.4f} "
                  f"{blocking.makespan / overlapped.makespan - 1:+9.1%} {steps:>8s} "
                  f"{exposed[0]:15.1f} / {exposed[1]:8.1f}")


if __name__ == "__main__":
    main()
