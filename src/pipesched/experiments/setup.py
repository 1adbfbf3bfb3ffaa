"""What a schedule is simulated on: stage costs and a network for its placement.

Two sources:

- a model on a cluster (``SimulationSetup.from_model``): the model package partitions the
  model into the schedule's stages (``partition``: uniform, balanced, memory-aware, or a
  Megatron layout string) and costs them on the cluster's devices
  (``pipesched.model.build_stage_costs``); pipeline device d runs on cluster rank d x t
  (t = tensor-parallel degree, ``pipesched.model.pipeline_ranks``), so the rest of each
  tensor-parallel group sits beside it on the same node. With d data-parallel replicas
  (``data_parallel``) replica r holds ranks r p t .. (r+1) p t - 1, so each pipeline device's
  peers are ranks at stride p t (``pipesched.model.data_parallel_groups``), and the network
  carries their gradient collectives (``DataParallel``). ``latency`` / ``bandwidth``, when
  given, replace every link between pipeline devices and in their data-parallel groups (a
  what-if on the cluster's network);
- measured stage costs and a network (``SimulationSetup.from_costs``). A schedule with k
  times more stages than the costs (v chunks per device) splits each cost row into k equal
  chunks: times, activation, parameter and gradient bytes divided by k, output bytes
  unchanged (a chunk boundary carries the same hidden state as a stage boundary). Their
  data-parallel replicas reduce over the same uniform links, one ring each.

Either way, a schedule that names stage checkpoints (``Schedule.recompute_stages``, as
``synthesize`` writes them) runs its costs with them (``StageCosts.checkpointed``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require, shorten, suggest
from pipesched.indices import format_indices
from pipesched.limits import check_rate
from pipesched.model import data_parallel_groups, pipeline_ranks
from pipesched.model.hardware import Cluster
from pipesched.model.recompute import recompute_modes, uniform_mode
from pipesched.model.spec import ModelSpec, TrainingSettings
from pipesched.model.stages import METHODS, cached_plan, plan_stages
from pipesched.model.transformer import hardware_flops_per_iteration, model_flops_per_iteration
from pipesched.partition import format_layout
from pipesched.partition.layout import LETTERS, parse_layout
from pipesched.schedule import Placement, Schedule
from pipesched.simulate.network import DataParallel, Network

PARTITION_METHODS = METHODS  # a partitioner's method, or a Megatron layout string
_WORD = re.compile(r"[A-Za-z_-]+")


def check_partition(partition: str, layer_kinds: str | None = None) -> None:
    """``partition`` is a partition method or a Megatron layout string (read against the
    model's ``layer_kinds`` when given, naming the problem of a bad one); a word that is no
    layout (letters other than the layout's) is an unknown method, and the closest is named."""
    if partition in PARTITION_METHODS:
        return
    if _WORD.fullmatch(partition) and not set(partition) <= set(LETTERS):
        raise PipeschedError(f"partition={shorten(partition)!r}: unknown partition method"
                             f"{suggest(partition, PARTITION_METHODS)}; choose {', '.join(PARTITION_METHODS)}, or a "
                             "Megatron layout string like 'Et*9|(t*10|)*6,t*10L'")
    if layer_kinds is not None:
        parse_layout(partition, layer_kinds)


def describe_model_setup(model: str, cluster: str, settings: TrainingSettings, *, measured: bool,
                         pipeline: str = "", recompute: str | None = None, data_parallel: int = 1) -> str:
    """"MODEL on CLUSTER[, PIPELINE][, data parallel D], micro-batch ...": the settings are
    left out for a model with measured layer costs, whose micro-batch, sequence length and
    recompute are the measurement's. ``recompute`` (per-stage text) replaces the settings'
    mode; frozen layers are named."""
    line = f"{model}{' (measured layers)' if measured else ''} on {cluster}" + (f", {pipeline}" if pipeline else "")
    if data_parallel > 1:
        sharded = " (ZeRO-1 optimizer)" if settings.optimizer_shards > 1 else ""
        line += f", data parallel {data_parallel}{sharded}"
    frozen = f", frozen layers {format_indices(settings.frozen_layers)}" if settings.frozen_layers else ""
    if measured:
        return line + frozen
    experts = ""
    if settings.expert_parallel > 1:
        experts = f", expert parallel {settings.expert_parallel} (expert tensor parallel {settings.expert_tensor})"
    return (f"{line}, micro-batch {settings.micro_batch_size} x {settings.seq_len} tokens, "
            f"tensor parallel {settings.tensor_parallel}{experts}, recompute {recompute or settings.recompute}{frozen}")


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
    return costs.in_chunks(num_stages // costs.num_stages)


def check_links(latency: float | None, bandwidth: float | None) -> None:
    if latency is not None:
        require(math.isfinite(latency) and latency >= 0, "latency", latency, "must be a finite number >= 0 seconds")
    if bandwidth is not None:
        check_rate("bandwidth", bandwidth, infinite=True)


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
    data_parallel: int = 1  # pipeline replicas, each reducing its gradients with the others'
    recompute: str = "none"  # per-stage recompute text (pipesched.model.recompute)
    host_bandwidth: float | None = None  # bytes/s: every device's host link (uniform links, or a cluster override)
    host_memory: float | None = None  # bytes of host memory per device for offloaded activations, likewise
    # costs and networks already built, by placement: they depend on nothing else here
    _built: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_costs(cls, costs: StageCosts, *, latency: float = 0.0, bandwidth: float = math.inf,
                   network: Network | None = None, micro_batch_size: int = 1, seq_len: int | None = None,
                   description: str | None = None, host_bandwidth: float | None = None,
                   host_memory: float | None = None, data_parallel: int = 1) -> SimulationSetup:
        """Measured costs on ``network``, or on uniform links of ``latency`` seconds and
        ``bandwidth`` bytes/s between every pair of devices (default: free links), each
        device with a host link of ``host_bandwidth`` bytes/s to ``host_memory`` bytes when
        given (what activation offloads use)."""
        check_links(latency, bandwidth)
        require(network is None or data_parallel == 1, "data_parallel", data_parallel,
                "a given network carries its own data-parallel groups (Network.data_parallel); leave it 1")
        if description is None:
            description = (f"given stage costs on {network.name}" if network is not None else
                           f"given stage costs, links {latency:g} s + bytes / {bandwidth:g} B/s")
        return cls(description=description, costs=costs, network=network, latency=latency, bandwidth=bandwidth,
                   micro_batch_size=micro_batch_size, seq_len=seq_len, host_bandwidth=host_bandwidth,
                   host_memory=host_memory, data_parallel=data_parallel)

    @classmethod
    def from_model(cls, model: ModelSpec, cluster: Cluster, settings: TrainingSettings, *,
                   partition: str = "balanced", latency: float | None = None,
                   bandwidth: float | None = None, description: str | None = None, recompute: str | None = None,
                   host_bandwidth: float | None = None, host_memory: float | None = None,
                   data_parallel: int = 1) -> SimulationSetup:
        """``model`` (a ModelSpec) on ``cluster`` with TrainingSettings ``settings``;
        ``recompute`` may give each stage its own mode (``pipesched.model.recompute``);
        ``host_bandwidth`` / ``host_memory`` replace every device's host link; with
        ``data_parallel`` > 1 the pipeline is one of that many replicas."""
        check_links(latency, bandwidth)
        check_partition(partition, model.layer_kinds)
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
            recompute=recompute or settings.recompute,
            host_bandwidth=host_bandwidth,
            host_memory=host_memory,
            data_parallel=data_parallel,
        )

    def recompute_for(self, schedule: Schedule) -> tuple[str, ...] | None:
        """Each stage's recompute mode when the stages differ, else None (the settings' mode)."""
        if uniform_mode(self.recompute) is not None:
            return None
        return recompute_modes(self.recompute, schedule.num_stages)

    def costs_for(self, schedule: Schedule) -> StageCosts:
        """The costs ``schedule`` runs on: its placement's, with the stage checkpoints the
        table names (``Schedule.recompute_stages``, as ``synthesize`` writes them)."""
        if self.partition == "memory" and self.costs is None:
            costs = self._costs_for(schedule)  # depends on the schedule's in-flight counts
        else:
            key = ("costs", schedule.placement)
            if key not in self._built:
                self._built[key] = self._costs_for(schedule)
            costs = self._built[key]
        return costs.checkpointed(schedule.recompute_stages)

    def layout_for(self, schedule: Schedule) -> str | None:
        """The Megatron layout string of the partition ``schedule`` runs on (None for given
        stage costs): a schedule file that carries it is simulated on the same layers."""
        if self.model is None:
            return None
        return format_layout(self.plan_for(schedule).partition, self.model.layer_kinds)

    def _costs_for(self, schedule: Schedule) -> StageCosts:
        if self.costs is not None:
            return split_stage_costs(self.costs, schedule.num_stages)
        return self.plan_for(schedule).costs

    def plan_for(self, schedule: Schedule):
        """The model's stage plan for ``schedule`` (a ``pipesched.model.StagePlan``; plans of
        the uniform and balanced methods and of layout strings are cached)."""
        require(self.model is not None, "stage_costs", "given", "a plan needs a model; these are given stage costs")

        modes = self.recompute_for(schedule)
        if self.partition == "memory":
            return plan_stages(self.model, schedule.placement, self.cluster, self.settings, method="memory",
                               schedule=schedule, recompute=modes)
        if self.partition in PARTITION_METHODS:
            return cached_plan(self.model, schedule.placement, self.cluster, self.settings, self.partition, None,
                               None, modes)

        layout = parse_layout(self.partition, self.model.layer_kinds, num_stages=schedule.num_stages)
        return cached_plan(self.model, schedule.placement, self.cluster, self.settings, "balanced", layout, None,
                           modes)

    def network_for(self, schedule: Schedule) -> Network:
        """The network of ``schedule``'s placement (built once per placement)."""
        key = ("network", schedule.placement)
        if key not in self._built:
            self._built[key] = self._with_host(_network(self, schedule.placement))
        return self._built[key]

    def _with_host(self, network: Network) -> Network:
        """``network`` with the host-link overrides of this setup."""
        if self.host_bandwidth is None and self.host_memory is None:
            return network
        n = network.num_devices
        return dataclasses.replace(
            network,
            host_bandwidth=(self.host_bandwidth,) * n if self.host_bandwidth is not None else network.host_bandwidth,
            host_latency=network.host_latency or (0.0,) * n,
            host_capacity=(self.host_memory,) * n if self.host_memory is not None else network.host_capacity)

    def flops_per_iteration(self, num_microbatches: int, schedule: Schedule | None = None, *,
                            hardware: bool = False) -> float | None:
        """One pipeline's FLOPs of one iteration, when a model is known: its model FLOPs
        (for MFU: forward and backward of every sample, no recompute), or with ``hardware``
        what its devices execute (for HFU: recompute included). With ``schedule``, of the
        layers as its stages run them when they recompute differently or some layers are
        frozen."""
        if self.model is None:
            return None
        if schedule is not None and (self.recompute_for(schedule) is not None or self.settings.frozen_layers):
            plan = self.plan_for(schedule)
            per_rank = sum(layer.flops if hardware else layer.model_flops for stage in plan.layers for layer in stage)
            return per_rank * self.settings.tensor_parallel * num_microbatches
        count = hardware_flops_per_iteration if hardware else model_flops_per_iteration
        return count(self.model, self.settings, num_microbatches)

    def peak_flops_per_device(self, network: Network) -> tuple[float, ...] | None:
        """Peak FLOP/s behind each pipeline device: its tensor-parallel group's."""
        if network.peak_flops is None:
            return None
        group = self.settings.tensor_parallel if self.settings is not None else 1
        return tuple(peak * group for peak in network.peak_flops)


@functools.lru_cache(maxsize=1024)
def _cluster_network(cluster: Cluster, placement: Placement, tensor_parallel: int, replicas: int,
                     sharded_optimizer: bool, gather_ratio: float, latency: float | None,
                     bandwidth: float | None) -> Network:
    """The network of ``placement`` on ``cluster``: a pure function of hashable inputs (a
    search asks for it under every family, recompute mode and partition of a placement)."""
    ranks = pipeline_ranks(placement, cluster, tensor_parallel, data_parallel=replicas)
    groups = None
    if replicas > 1:
        groups = DataParallel.from_cluster(
            cluster, data_parallel_groups(placement, cluster, tensor_parallel, replicas),
            concurrent=tensor_parallel, sharded_optimizer=sharded_optimizer, gather_ratio=gather_ratio)
    network = Network.from_cluster(cluster, ranks=ranks, data_parallel=groups)
    if latency is None and bandwidth is None:
        return network
    return _with_links(network, latency, bandwidth)


def _network(setup: SimulationSetup, placement: Placement) -> Network:
    if setup.cluster is not None:
        settings = setup.settings
        return _cluster_network(setup.cluster, placement, settings.tensor_parallel, setup.data_parallel,
                                settings.optimizer_shards > 1,
                                settings.weight_bytes / settings.grad_bytes if settings.grad_bytes else 0.0,
                                setup.latency, setup.bandwidth)
    if setup.network is not None:
        return setup.network
    latency = setup.latency or 0.0
    bandwidth = math.inf if setup.bandwidth is None else setup.bandwidth
    groups = None
    if setup.data_parallel > 1:
        groups = DataParallel.uniform(placement.num_devices, setup.data_parallel, latency=latency, bandwidth=bandwidth)
    network = Network.uniform(placement.num_devices, latency=latency, bandwidth=bandwidth)
    return network if groups is None else dataclasses.replace(network, data_parallel=groups)


def _with_links(network: Network, latency: float | None, bandwidth: float | None) -> Network:
    """``network`` with every link's latency and/or bandwidth replaced."""
    shape = network.latency.shape
    return Network(
        latency=np.full(shape, latency) if latency is not None else network.latency,
        bandwidth=np.full(shape, bandwidth) if bandwidth is not None else network.bandwidth,
        node_of=network.node_of, shared_nic=network.shared_nic, capacity=network.capacity,
        peak_flops=network.peak_flops, ranks=network.ranks, host_bandwidth=network.host_bandwidth,
        host_latency=network.host_latency, host_capacity=network.host_capacity,
        data_parallel=None if network.data_parallel is None else network.data_parallel.with_links(latency, bandwidth),
        name=f"{network.name} (links {'' if latency is None else f'{latency:g} s'}"
             f"{', ' if latency is not None and bandwidth is not None else ''}"
             f"{'' if bandwidth is None else f'{bandwidth:g} B/s'})",
    )
