"""One point simulated in full: the timeline and every metric, and its JSON shape (what
``pipesched simulate --json`` prints)."""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.experiments.point import Point
from pipesched.experiments.setup import SimulationSetup
from pipesched.metrics import Metrics, allreduce_per_device, summarize
from pipesched.passes.offload import check_host_memory
from pipesched.schedule import Schedule
from pipesched.simulate import Network, compile_graph, run
from pipesched.timeline import Timeline
from pipesched.variability.distribution import Distribution, monte_carlo


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

    def to_dict(self) -> dict:
        schedule, timeline, metrics = self.schedule, self.timeline, self.metrics
        path = timeline.simulation.critical_path
        training = metrics.training
        assert training is not None
        variability = {} if self.distribution is None else {"variability": self.distribution.to_dict()}
        return {
            "schedule": schedule.name,
            "p": schedule.num_devices,
            "m": schedule.num_microbatches,
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
            "peak_memory_bytes": list(metrics.peak_memory),
            "memory_capacity_bytes": list(timeline.memory.capacity) if timeline.memory.capacity else None,
            "host_peak_memory_bytes": list(training.host_peak_bytes),
            "host_memory_capacity_bytes": (list(timeline.host_memory.capacity)
                                           if timeline.host_memory is not None and timeline.host_memory.capacity
                                           else None),
            "out_of_memory": list(metrics.out_of_memory),
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
        }


def simulate_point(point: Point) -> Simulation:
    """Simulate ``point`` (level 3) and compute every metric of its timeline; with its
    variability, the Monte Carlo distribution too (on the same compiled graph)."""
    schedule = point.build_schedule()
    setup = point.setup()
    network = setup.network_for(schedule)
    graph = compile_graph(schedule, setup.costs_for(schedule), network, contention=point.contention,
                          overlap=point.overlap)
    timeline = run(graph)
    check_host_memory(timeline.host_memory, str(point.offload))
    distribution = monte_carlo(graph, point.variability) if point.variability is not None else None
    peaks = setup.peak_flops_per_device(network)
    metrics = summarize(timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                        flops_per_iteration=setup.flops_per_iteration(schedule.num_microbatches, schedule),
                        peak_flops=peaks[: schedule.num_devices] if peaks is not None else None)
    return Simulation(point, schedule, setup, network, timeline, metrics, distribution)
