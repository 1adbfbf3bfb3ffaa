"""What a schedule is simulated on: stage costs and a network for its placement.

Two sources:

- a model on a cluster (``SimulationSetup.from_model``): the model package partitions the
  model into the schedule's stages (``partition``: uniform, balanced, memory-aware, or a
  Megatron layout string) and costs them on the cluster's devices
  (``pipesched.model.build_stage_costs``); pipeline device d runs on cluster rank d x t
  (t = tensor-parallel degree, ``pipesched.model.pipeline_ranks``), so the rest of each
  tensor-parallel group sits beside it on the same node. ``latency`` / ``bandwidth``, when
  given, replace every link between pipeline devices (a what-if on the cluster's network);
- measured stage costs and a network (``SimulationSetup.from_costs``). A schedule with k
  times more stages than the costs (v chunks per device) splits each cost row into k equal
  chunks: times, activation, parameter and gradient bytes divided by k, output bytes
  unchanged (a chunk boundary carries the same hidden state as a stage boundary).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.model.hardware import Cluster
from pipesched.model.spec import ModelSpec, TrainingSettings
from pipesched.schedule import Schedule
from pipesched.simulate.network import Network

PARTITION_METHODS = ("uniform", "balanced", "memory")


def describe_model_setup(model: str, cluster: str, settings: TrainingSettings, *, measured: bool,
                         pipeline: str = "") -> str:
    """"MODEL on CLUSTER[, PIPELINE], micro-batch ...": the settings are left out for a model
    with measured layer costs, whose micro-batch, sequence length and recompute are the
    measurement's."""
    line = f"{model}{' (measured layers)' if measured else ''} on {cluster}" + (f", {pipeline}" if pipeline else "")
    if measured:
        return line
    return (f"{line}, micro-batch {settings.micro_batch_size} x {settings.seq_len} tokens, "
            f"tensor parallel {settings.tensor_parallel}, recompute {settings.recompute}")


def split_stage_costs(costs: StageCosts, num_stages: int) -> StageCosts:
    """``costs`` for a schedule with ``num_stages`` stages (a multiple of the cost rows).

    >>> split = split_stage_costs(StageCosts.uniform(2, forward=2.0), 4)
    >>> split.forward, split.num_stages
    ((1.0, 1.0, 1.0, 1.0), 4)
    """
    if costs.num_stages == num_stages:
        return costs
    if num_stages % costs.num_stages:
        raise PipeschedError(
            f"stage_costs={costs.num_stages} stages: the schedule has {num_stages} stages; give "
            f"{num_stages} cost rows, or a number of rows that divides {num_stages}"
        )
    k = num_stages // costs.num_stages

    def chunks(values: tuple[float, ...] | None, *, divide: bool = True) -> tuple[float, ...] | None:
        if values is None:
            return None
        return tuple(values[s // k] / (k if divide else 1) for s in range(num_stages))

    return StageCosts(
        forward=chunks(costs.forward),
        backward_input=chunks(costs.backward_input),
        backward_weight=chunks(costs.backward_weight),
        activation_bytes=chunks(costs.activation_bytes),
        output_bytes=chunks(costs.output_bytes, divide=False),
        backward=chunks(costs.backward),
        static_bytes=chunks(costs.static_bytes),
        grad_bytes=chunks(costs.grad_bytes),
        input_frees=costs.input_frees,
        unit=costs.unit,
        kept_for_w_bytes=chunks(costs.kept_for_w_bytes),
        forward_backward=chunks(costs.forward_backward),
        fb_cost=costs.fb_cost,
    )


def check_links(latency: float | None, bandwidth: float | None) -> None:
    if latency is not None:
        require(math.isfinite(latency) and latency >= 0, "latency", latency, "must be a finite number >= 0 seconds")
    if bandwidth is not None:
        require(bandwidth > 0, "bandwidth", bandwidth, "must be > 0 bytes/s (use inf for free links)")


@dataclass(frozen=True, eq=False)
class SimulationSetup:
    """Stage costs and a network for any schedule (see the module docstring)."""

    description: str
    costs: StageCosts | None = None
    network: Network | None = None  # a fixed network; else uniform links of the two below
    latency: float | None = None  # seconds: uniform links for given costs, or every link of the cluster
    bandwidth: float | None = None  # bytes/s, likewise
    model: ModelSpec | None = None
    cluster: Cluster | None = None
    settings: TrainingSettings | None = None
    partition: str = "balanced"  # a PARTITION_METHODS entry or a Megatron layout string
    micro_batch_size: int = 1
    seq_len: int | None = None
    # costs and networks already built, by placement: they depend on nothing else here
    _built: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_costs(cls, costs: StageCosts, *, latency: float = 0.0, bandwidth: float = math.inf,
                   network: Network | None = None, micro_batch_size: int = 1, seq_len: int | None = None,
                   description: str | None = None) -> SimulationSetup:
        """Measured costs on ``network``, or on uniform links of ``latency`` seconds and
        ``bandwidth`` bytes/s between every pair of devices (default: free links)."""
        check_links(latency, bandwidth)
        if description is None:
            description = (f"given stage costs on {network.name}" if network is not None else
                           f"given stage costs, links {latency:g} s + bytes / {bandwidth:g} B/s")
        return cls(description=description, costs=costs, network=network, latency=latency, bandwidth=bandwidth,
                   micro_batch_size=micro_batch_size, seq_len=seq_len)

    @classmethod
    def from_model(cls, model: ModelSpec, cluster: Cluster, settings: TrainingSettings, *,
                   partition: str = "balanced", latency: float | None = None,
                   bandwidth: float | None = None, description: str | None = None) -> SimulationSetup:
        """``model`` (a ModelSpec) on ``cluster`` with TrainingSettings ``settings``."""
        check_links(latency, bandwidth)
        if partition not in PARTITION_METHODS:
            from pipesched.partition import parse_layout

            parse_layout(partition, model.layer_kinds)  # a bad layout string fails here, naming the problem
        return cls(
            description=description or f"{model.name} on {cluster.name}",
            model=model,
            cluster=cluster,
            settings=settings,
            partition=partition,
            latency=latency,
            bandwidth=bandwidth,
            micro_batch_size=settings.micro_batch_size,
            seq_len=settings.seq_len,
        )

    def costs_for(self, schedule: Schedule) -> StageCosts:
        if self.partition == "memory" and self.costs is None:
            return self._costs_for(schedule)  # depends on the schedule's in-flight counts
        key = ("costs", schedule.placement)
        if key not in self._built:
            self._built[key] = self._costs_for(schedule)
        return self._built[key]

    def _costs_for(self, schedule: Schedule) -> StageCosts:
        if self.costs is not None:
            return split_stage_costs(self.costs, schedule.num_stages)
        from pipesched.model import build_stage_costs

        if self.partition in PARTITION_METHODS:
            return build_stage_costs(self.model, schedule.placement, self.cluster, self.settings,
                                     method=self.partition,
                                     schedule=schedule if self.partition == "memory" else None)
        from pipesched.partition import parse_layout

        layout = parse_layout(self.partition, self.model.layer_kinds, num_stages=schedule.num_stages)
        return build_stage_costs(self.model, schedule.placement, self.cluster, self.settings, partition=layout)

    def network_for(self, schedule: Schedule) -> Network:
        key = ("network", schedule.placement)
        if key not in self._built:
            self._built[key] = self._network_for(schedule)
        return self._built[key]

    def _network_for(self, schedule: Schedule) -> Network:
        if self.cluster is not None:
            from pipesched.model import pipeline_ranks

            ranks = pipeline_ranks(schedule.placement, self.cluster, self.settings.tensor_parallel)
            return _cluster_network(self.cluster, ranks, self.latency, self.bandwidth)
        if self.network is not None:
            return self.network
        return Network.uniform(schedule.num_devices, latency=self.latency or 0.0,
                               bandwidth=math.inf if self.bandwidth is None else self.bandwidth)

    def flops_per_iteration(self, num_microbatches: int) -> float | None:
        """Model FLOPs of one iteration (for MFU), when a model is known."""
        if self.model is None:
            return None
        from pipesched.model import model_flops_per_iteration

        return model_flops_per_iteration(self.model, self.settings, num_microbatches)

    def peak_flops_per_device(self, network: Network) -> tuple[float, ...] | None:
        """Peak FLOP/s behind each pipeline device: its tensor-parallel group's."""
        if network.peak_flops is None:
            return None
        group = self.settings.tensor_parallel if self.settings is not None else 1
        return tuple(peak * group for peak in network.peak_flops)


@functools.lru_cache(maxsize=256)
def _cluster_network(cluster: Cluster, ranks: tuple[int, ...], latency: float | None,
                     bandwidth: float | None) -> Network:
    """The links between ``ranks`` of ``cluster`` (immutable, so shared by every schedule on
    the same ranks), with every link's latency and/or bandwidth replaced when given."""
    network = Network.from_cluster(cluster, ranks=ranks)
    if latency is None and bandwidth is None:
        return network
    return _with_links(network, latency, bandwidth)


def _with_links(network: Network, latency: float | None, bandwidth: float | None) -> Network:
    """``network`` with every link's latency and/or bandwidth replaced."""
    shape = network.latency.shape
    return Network(
        latency=np.full(shape, latency) if latency is not None else network.latency,
        bandwidth=np.full(shape, bandwidth) if bandwidth is not None else network.bandwidth,
        node_of=network.node_of, shared_nic=network.shared_nic, capacity=network.capacity,
        peak_flops=network.peak_flops, ranks=network.ranks,
        name=f"{network.name} (links {'' if latency is None else f'{latency:g} s'}"
             f"{', ' if latency is not None and bandwidth is not None else ''}"
             f"{'' if bandwidth is None else f'{bandwidth:g} B/s'})",
    )
