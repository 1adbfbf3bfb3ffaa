"""One point simulated in full: the timeline and every metric, and its JSON shape (what
``pipesched simulate --json`` prints).

In the steady state (an asynchronous family, or ``Point.steady_state``) the timeline holds
every iteration run back to back, and the metrics are those of one steady-state iteration:
its time (the mean between the first and the last), bubbles and busy time per device, throughput and MFU,
communication divided by the iterations; peak memory and the critical path are the whole
run's. ``steady`` keeps the iterations' ends, the staleness and the weight versions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError
from pipesched.experiments.evaluate import (
    STEADY_ITERATIONS,
    in_steady_state,
    sim_schedule,
    with_fb_cost,
)
from pipesched.experiments.point import Point
from pipesched.experiments.setup import SimulationSetup
from pipesched.metrics import Metrics, allreduce_per_device, summarize
from pipesched.passes.offload import check_host_memory
from pipesched.schedule import Schedule
from pipesched.simulate import Network, compile_graph, run
from pipesched.simulate.iterations import SteadyState, steady_state
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
    setup = point.setup()
    schedule = sim_schedule(point, setup)
    network = setup.network_for(schedule)
    setup = point.setup()
    schedule = sim_schedule(point, setup)
    network = setup.network_for(schedule)
    costs = with_fb_cost(setup.costs_for(schedule), point.fb_cost)
    peaks = setup.peak_flops_per_device(network)
    peak_flops = peaks[: schedule.num_devices] if peaks is not None else None
    flops = setup.flops_per_iteration(point.m, schedule)
    if not in_steady_state(point):
        graph = compile_graph(schedule, costs, network, contention=point.contention, overlap=point.overlap)
        timeline = run(graph)
        check_host_memory(timeline.host_memory, str(point.offload))
        distribution = monte_carlo(graph, point.variability) if point.variability is not None else None
        metrics = summarize(timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                            flops_per_iteration=flops, peak_flops=peak_flops)
        return Simulation(point, schedule, setup, network, timeline, metrics, distribution=distribution)
    if point.variability is not None:
        raise PipeschedError("variability: Monte Carlo runs of a steady state are not modelled; drop "
                             "--steady-state (or the variability options)")
    found = steady_state(schedule, costs, network, iterations=STEADY_ITERATIONS, steady=point.steady_state,
                         contention=point.contention, overlap=point.overlap)
    timeline = found.timeline
    whole = summarize(timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len)
    return Simulation(point, found.timeline.schedule, setup, network, timeline,
                      steady_metrics(found, whole, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                                     microbatches=point.m, flops_per_iteration=flops, peak_flops=peak_flops),
                      steady=found)

def steady_metrics(found: SteadyState, whole: Metrics, *, micro_batch_size: int, seq_len: int | None,
                   microbatches: int, flops_per_iteration: float | None, peak_flops) -> Metrics:
    """The metrics of one steady-state iteration (see the module docstring) from those of
    the whole run."""
    time = found.iteration_time
    k = found.iterations.iterations
    busy = found.busy_per_iteration
    idle = np.maximum(time - busy, 0.0)
    samples = microbatches * micro_batch_size / time if time > 0 else 0.0
    utilization = None
    if flops_per_iteration is not None and peak_flops is not None and time > 0:
        utilization = flops_per_iteration / (time * float(np.sum(peak_flops)))
    return dataclasses.replace(
        whole, iteration_time=time, bubble_ratio=found.bubble_ratio,
        bubble_over_work=float(idle.sum() / busy.sum()) if busy.sum() > 0 else 0.0,
        bubble_per_device=tuple(float(x) for x in (idle / time if time > 0 else idle)),
        busy_per_device=tuple(float(x) for x in busy), throughput_samples_per_s=samples,
        throughput_tokens_per_s=samples * seq_len if seq_len else None, mfu=utilization,
        exposed_comm=tuple(x / k for x in whole.exposed_comm), hidden_comm=tuple(x / k for x in whole.hidden_comm),
    )
