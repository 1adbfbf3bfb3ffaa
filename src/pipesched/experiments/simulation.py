"""One point simulated in full: the timeline and every metric, and its JSON shape (what
``pipesched simulate --json`` prints).

In the steady state (an asynchronous family, or ``Point.steady_state``) the timeline holds
every iteration run back to back, and the metrics are those of one steady-state iteration
(``pipesched.metrics.summarize``): its time (the mean between the first and the last),
bubbles and busy time per device, throughput, MFU and HFU, communication divided by the
iterations; peak memory, the critical path and the training work are the whole run's.
``steady`` keeps the iterations' ends, the staleness and the weight versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.experiments.evaluation import run_sim
from pipesched.experiments.point import Point
from pipesched.experiments.setup import SimulationSetup
from pipesched.metrics import Metrics, allreduce_per_device, iteration_microbatches, summarize
from pipesched.schedule import Schedule
from pipesched.simulate import Network
from pipesched.simulate.iterations import SteadyState
from pipesched.timeline import Timeline
from pipesched.variability.distribution import Distribution


@dataclass(frozen=True, eq=False)
class Simulation:
    """A point's schedule simulated on its workload, with its metrics."""

    point: Point
    schedule: Schedule
    setup: SimulationSetup
    network: Network
    timeline: Timeline
    metrics: Metrics
    distribution: Distribution | None = None  # with the point's variability: the Monte Carlo run
    steady: SteadyState | None = None  # iterations back to back (see the module docstring)

    def to_dict(self) -> dict:
        schedule, timeline, metrics = self.schedule, self.timeline, self.metrics
        path = timeline.simulation.critical_path
        training = metrics.training
        assert training is not None
        variability = {} if self.distribution is None else {"variability": self.distribution.to_dict()}
        return {
            "schedule": schedule.name,
            "p": schedule.num_devices,
            "m": _whole(iteration_microbatches(timeline)),  # of one iteration, as the user gave it
            "num_stages": schedule.num_stages,
            "setup": self.setup.description,
            "ranks": list(self.network.ranks[: schedule.num_devices]),
            "contention": self.point.contention,
            "overlap": self.point.overlap,
            "blocking_steps": timeline.simulation.blocking_steps,
            "dp": self.network.replicas,
            "zero": self.point.zero,
            "iteration_time_s": metrics.iteration_time,
            "bubble_ratio": metrics.bubble_ratio,
            "bubble_over_work": metrics.bubble_over_work,
            "bubble_per_device": list(metrics.bubble_per_device),
            "throughput_samples_per_s": metrics.throughput_samples_per_s,
            "throughput_tokens_per_s": metrics.throughput_tokens_per_s,
            "mfu": metrics.mfu,
            "hfu": metrics.hfu,
            "peak_memory_bytes": list(metrics.peak_memory),
            "max_peak_memory_bytes": max(metrics.peak_memory),
            "memory_capacity_bytes": list(timeline.memory.capacity) if timeline.memory.capacity else None,
            "host_peak_memory_bytes": list(training.host_peak_bytes),
            "host_memory_capacity_bytes": (list(timeline.host_memory.capacity)
                                           if timeline.host_memory is not None and timeline.host_memory.capacity
                                           else None),
            "out_of_memory": list(metrics.out_of_memory),
            "any_out_of_memory": any(metrics.out_of_memory),
            "exposed_comm_s": list(metrics.exposed_comm),
            "hidden_comm_s": list(metrics.hidden_comm),
            "critical_path": {
                "ops": metrics.critical_path_ops,
                "transfers": metrics.critical_path_transfers,
                "compute_s": metrics.critical_path_compute,
                "comm_s": metrics.critical_path_comm,
                "length": len(path),
            },
            "allreduce_s": allreduce_per_device(timeline).tolist(),
            "optimizer_step_s": list(timeline.simulation.optimizer_step),
            "num_ops": len(timeline),
            "num_transfers": len(timeline.transfers),
            "frozen_stages": sorted(schedule.frozen),
            "training_per_device": {
                "frozen_stages": [list(stages) for stages in training.frozen_stages],
                "recompute_s": list(training.recompute_s),
                "offloaded": list(training.offloaded),
                "offloaded_bytes": list(training.offloaded_bytes),
                "host_link_busy_s": list(training.host_link_busy_s),
                "offload_exposed_s": list(training.offload_exposed_s),
            },
            **variability,
            "steady_state": self.steady.to_dict() if self.steady is not None else None,
        }


def simulate_point(point: Point) -> Simulation:
    """Simulate ``point`` (level 3) and compute every metric of its timeline; with its
    variability, the Monte Carlo distribution too (on the same compiled graph)."""
    done = run_sim(point)
    work = done.work(point)
    metrics = summarize(done.timeline, micro_batch_size=work.micro_batch_size, seq_len=work.seq_len,
                        flops_per_iteration=work.model_flops, hardware_flops_per_iteration=work.hardware_flops,
                        peak_flops=work.peak_flops)
    return Simulation(point, done.timeline.schedule, done.setup, done.network, done.timeline, metrics,
                      distribution=done.distribution, steady=done.steady)


def _whole(count: float) -> int | float:
    """A count as an int when it is whole (JSON prints 8, not 8.0)."""
    return int(count) if float(count).is_integer() else count
