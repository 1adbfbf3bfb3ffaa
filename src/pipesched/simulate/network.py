"""Network: the links between a pipeline's devices, as the simulator sees them.

A transfer of ``n`` bytes from device ``a`` to device ``b`` costs
``latency[a, b] + n / bandwidth[a, b]`` seconds when it has its link to itself. Which
transfers compete for a link is the engine's business (``pipesched.simulate.engine``); the
network only says which node each device sits on and whether the devices of a node share
one network interface (NIC) for inter-node traffic.

Pipeline device ``d`` runs on cluster rank ``ranks[d]``: with tensor parallelism of degree
t, ``pipesched.model.pipeline_ranks`` gives ranks ``0, t, 2t, ...`` (each pipeline device is
the first rank of its tensor-parallel group, whose other ranks split its layers), so a
pipeline of 8 on 4 nodes of 8 ranks with t = 4 puts 2 stages on each node.

Data parallelism (``DataParallel``): the simulated pipeline is one of d identical replicas;
each of its devices sums its gradients with its d-1 peers (the same device of the other
replicas) by a collective whose levels (``pipesched.model.collectives``) come from where
the peers sit on the cluster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError, require
from pipesched.limits import MIN_RATE, check_rate
from pipesched.model.collectives import (
    CollectiveLevel,
    allreduce_seconds,
    group_levels,
    reduce_scatter_seconds,
)
from pipesched.model.hardware import Cluster, CollectiveCalibration


@dataclass(frozen=True)
class DataParallel:
    """The d data-parallel replicas of the pipeline, as each pipeline device's gradients see
    them: after its last weight-gradient op of a stage, device k sums that stage's gradients
    with its d-1 peers by a collective over ``levels[k]`` (innermost first). With a sharded
    optimizer (ZeRO-1) it reduce-scatters the gradients and all-gathers the updated
    parameters instead of all-reducing the gradients.
    """

    size: int  # d, pipeline replicas
    levels: tuple[tuple[CollectiveLevel, ...], ...]  # per pipeline device: its group's rings, innermost first
    leaves_node: tuple[bool, ...]  # per pipeline device: its group spans nodes (its traffic goes through the NIC)
    sharded_optimizer: bool = False  # ZeRO-1: reduce-scatter gradients, all-gather parameters
    gather_ratio: float = 0.5  # parameter bytes all-gathered per gradient byte reduced (bf16 weights, fp32 gradients)

    def __post_init__(self) -> None:
        require(isinstance(self.size, int) and self.size >= 1, "dp", self.size, "must be a whole number >= 1")
        require(len(self.levels) == len(self.leaves_node), "levels", len(self.levels),
                f"give one entry per device ({len(self.leaves_node)})")

    def seconds(self, device: int, nbytes: float, *, inner: CollectiveLevel | None = None) -> float:
        """Seconds of device ``device``'s collective on ``nbytes`` of gradients; ``inner``: a
        ring inside the pipeline first (the two replicas of a Chimera or DualPipe stage)."""
        levels = ((inner,) if inner is not None else ()) + self.levels[device]
        if not self.sharded_optimizer:
            return allreduce_seconds(nbytes, levels)
        return reduce_scatter_seconds(nbytes, levels) + reduce_scatter_seconds(nbytes * self.gather_ratio, levels)

    @classmethod
    def from_cluster(cls, cluster: Cluster, groups: Sequence[Sequence[int]], *, concurrent: int = 1,
                     sharded_optimizer: bool = False, gather_ratio: float = 0.5) -> DataParallel:
        """Each pipeline device's group of cluster ranks (``pipesched.model.data_parallel_groups``);
        ``concurrent``: the tensor-parallel ranks that reduce their own shards beside it."""
        return cls(
            size=len(groups[0]) if groups else 1,
            levels=tuple(group_levels(cluster, group, concurrent=concurrent) for group in groups),
            leaves_node=tuple(len({cluster.node_of[r] for r in group}) > 1 for group in groups),
            sharded_optimizer=sharded_optimizer,
            gather_ratio=gather_ratio,
        )

    @classmethod
    def uniform(cls, num_devices: int, size: int, *, latency: float, bandwidth: float,
                sharded_optimizer: bool = False, gather_ratio: float = 0.5) -> DataParallel:
        """Every group one ring of ``size`` ranks on links of ``latency`` and ``bandwidth``."""
        level = (CollectiveLevel(size, latency, bandwidth),)
        return cls(size, (level,) * num_devices, (size > 1,) * num_devices, sharded_optimizer, gather_ratio)

    def with_links(self, latency: float | None, bandwidth: float | None) -> DataParallel:
        """These groups with every level's latency and/or bandwidth replaced: plain rings of
        the figures given (a measured link, ``--latency`` and ``--bandwidth``), no calibration."""
        def replaced(level: CollectiveLevel) -> CollectiveLevel:
            return CollectiveLevel(level.ranks, level.latency if latency is None else latency,
                                   level.bandwidth if bandwidth is None else bandwidth)

        return dataclasses.replace(self, levels=tuple(tuple(replaced(x) for x in device) for device in self.levels))


@dataclass(frozen=True, eq=False)
class Network:
    """Point-to-point links between ``num_devices`` pipeline devices.

    latency[a, b]: seconds before the first byte of a transfer a -> b arrives.
    bandwidth[a, b]: bytes/s of the link a -> b (``inf`` for a free link).
    node_of[d]: the node of device d; transfers between nodes leave through a NIC.
    shared_nic: True when all devices of a node share one NIC (its sends queue on the node's
        egress and its receives on the node's ingress); False when each device has its own.
    capacity: device memory in bytes (the out-of-memory check), or None when unknown.
    peak_flops: dense FLOP/s of each device (for MFU), or None when unknown.
    ranks: cluster rank of each pipeline device (names in timelines and reports).
    name: where the network came from (a cluster name, "uniform").
    host_bandwidth: bytes/s of each device's link to host memory, per direction (PCIe or
        NVLink-C2C: what activation offloads and reloads move over; 0 = no host link), or
        None when no device has one.
    host_latency: seconds each offload or reload pays on top (None: 0).
    host_capacity: host-memory bytes each device may fill with offloaded activations, or
        None when unknown.
    data_parallel: the data-parallel replicas' gradient collectives, or None (one pipeline).
    collectives: how NCCL's collectives run over the links inside a node and across nodes
        (``LinkSpec.collectives``: the two replicas of a Chimera or DualPipe stage
        all-reduce over them); None times them as plain rings of latency and bandwidth.
    """

    latency: np.ndarray  # float64 (D, D), seconds
    bandwidth: np.ndarray  # float64 (D, D), bytes/s
    node_of: tuple[int, ...]
    shared_nic: bool = False
    capacity: tuple[float, ...] | None = None  # bytes per device
    peak_flops: tuple[float, ...] | None = None  # FLOP/s per device
    ranks: tuple[int, ...] = ()
    name: str = "network"
    host_bandwidth: tuple[float, ...] | None = None  # bytes/s per device, 0 = none
    host_latency: tuple[float, ...] | None = None  # seconds per device
    host_capacity: tuple[float, ...] | None = None  # bytes per device
    data_parallel: DataParallel | None = None
    collectives: tuple[CollectiveCalibration | None, CollectiveCalibration | None] = (None, None)  # inside, across

    def __post_init__(self) -> None:
        latency = np.array(self.latency, dtype=np.float64)
        bandwidth = np.array(self.bandwidth, dtype=np.float64)
        n = len(self.node_of)
        require(n >= 1, "devices", n, "a network needs at least one device")
        require(latency.shape == (n, n), "latency", f"shape {latency.shape}", f"give a {n} x {n} matrix")
        require(bandwidth.shape == (n, n), "bandwidth", f"shape {bandwidth.shape}", f"give a {n} x {n} matrix")
        off_diagonal = ~np.eye(n, dtype=bool)
        bad_latency = latency[off_diagonal]
        if bad_latency.size and not (np.all(np.isfinite(bad_latency)) and np.all(bad_latency >= 0)):
            value = bad_latency[~(np.isfinite(bad_latency) & (bad_latency >= 0))][0]
            raise PipeschedError(f"latency={value}: must be a finite number >= 0 seconds")
        bad_bandwidth = bandwidth[off_diagonal]
        if bad_bandwidth.size and not np.all(bad_bandwidth >= MIN_RATE):
            check_rate("bandwidth", float(bad_bandwidth[~(bad_bandwidth >= MIN_RATE)][0]), infinite=True)
        # a device never sends to itself: zero cost on the diagonal
        np.fill_diagonal(latency, 0.0)
        np.fill_diagonal(bandwidth, math.inf)
        latency.setflags(write=False)
        bandwidth.setflags(write=False)
        object.__setattr__(self, "latency", latency)
        object.__setattr__(self, "bandwidth", bandwidth)
        if not self.ranks:
            object.__setattr__(self, "ranks", tuple(range(n)))
        require(len(self.ranks) == n, "ranks", len(self.ranks), f"give one rank per device ({n})")
        for field_name in ("capacity", "peak_flops", "host_bandwidth", "host_latency", "host_capacity"):
            values = getattr(self, field_name)
            if values is not None:
                require(len(values) == n, field_name, f"{len(values)} values", f"give one value per device ({n})")
        for field_name in ("host_bandwidth", "host_latency", "host_capacity"):
            values = getattr(self, field_name)
            if values is not None:
                values = tuple(float(v) for v in values)
                bad = [v for v in values if not (v >= 0 and (math.isfinite(v) or field_name == "host_bandwidth"))]
                require(not bad, field_name, bad[0] if bad else "", "must be numbers >= 0")
                if field_name == "host_bandwidth":  # 0: no host link
                    for value in values:
                        check_rate(field_name, value, infinite=True, zero=True)
                object.__setattr__(self, field_name, values)
        if self.data_parallel is not None:
            require(len(self.data_parallel.levels) == n, "data_parallel", f"{len(self.data_parallel.levels)} groups",
                    f"give one group per device ({n})")

    @property
    def replicas(self) -> int:
        """Data-parallel pipeline replicas (1: this pipeline alone)."""
        return 1 if self.data_parallel is None else self.data_parallel.size

    @property
    def num_devices(self) -> int:
        return len(self.node_of)

    @property
    def num_nodes(self) -> int:
        return max(self.node_of) + 1

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from ``src`` to ``dst`` with the link to itself."""
        if src == dst:
            return 0.0
        return float(self.latency[src, dst] + nbytes / self.bandwidth[src, dst])

    def device_name(self, device: int) -> str:
        return f"rank {self.ranks[device]}"

    def pair_level(self, a: int, b: int) -> CollectiveLevel:
        """The ring of devices ``a`` and ``b`` (the two replicas of a stage) on their link."""
        calibration = self.collectives[0 if self.node_of[a] == self.node_of[b] else 1]
        return CollectiveLevel(2, float(self.latency[a, b]), float(self.bandwidth[a, b]), calibration)

    # --- constructors ---------------------------------------------------------------------
    def has_host_link(self, device: int) -> bool:
        return self.host_bandwidth is not None and self.host_bandwidth[device] > 0

    @classmethod
    def uniform(cls, num_devices: int, *, latency: float, bandwidth: float, host_bandwidth: float | None = None,
                host_latency: float = 0.0, host_capacity: float | None = None) -> Network:
        """Every pair of devices joined by an equal, private link (each device its own node);
        with ``host_bandwidth`` (bytes/s, per direction) each device also has a link of that
        rate and ``host_latency`` seconds to ``host_capacity`` bytes of host memory.

        >>> Network.uniform(2, latency=1e-5, bandwidth=1e9).transfer_time(0, 1, 1e6)
        0.00101
        """
        require(num_devices >= 1, "devices", num_devices, "must be at least 1")
        require(math.isfinite(latency) and latency >= 0, "latency", latency, "must be a finite number >= 0 seconds")
        check_rate("bandwidth", bandwidth, infinite=True)
        if host_bandwidth is not None:
            check_rate("host_bandwidth", host_bandwidth, infinite=True)
        require(math.isfinite(host_latency) and host_latency >= 0, "host_latency", host_latency,
                "must be a finite number >= 0 seconds")
        shape = (num_devices, num_devices)

        def each(value: float | None) -> tuple[float, ...] | None:
            return None if value is None else (float(value),) * num_devices

        return cls(
            latency=np.full(shape, float(latency)),
            bandwidth=np.full(shape, float(bandwidth)),
            node_of=tuple(range(num_devices)),
            name="uniform",
            host_bandwidth=each(host_bandwidth),
            host_latency=each(host_latency) if host_bandwidth is not None else None,
            host_capacity=each(host_capacity),
        )

    @classmethod
    def from_cluster(cls, cluster: Cluster, *, ranks: Sequence[int] | None = None,
                     data_parallel: DataParallel | None = None) -> Network:
        """The links between ``ranks`` of ``cluster`` (default: every rank, in order).

        Ranks on one node use the cluster's intra-node link; ranks on different nodes its
        inter-node link, through one NIC per rank or one per node (``cluster.nic_per_device``).
        A transfer's latency includes the set-up of its slower end
        (``DeviceSpec.transfer_setup_s``, see ``Cluster.latency``). Each device's host link
        is its preset's (``DeviceSpec.host_bandwidth``, ``host_memory_bytes``); an offload
        pays its ``transfer_setup_s`` like any transfer.
        """
        chosen = tuple(range(cluster.num_devices)) if ranks is None else tuple(int(r) for r in ranks)
        require(len(chosen) >= 1, "ranks", "[]", "give at least one rank")
        for rank in chosen:
            require(0 <= rank < cluster.num_devices, "rank", rank,
                    f"cluster {cluster.name} has ranks 0..{cluster.num_devices - 1}")
        require(len(set(chosen)) == len(chosen), "ranks", list(chosen), "each rank may hold one pipeline device")
        # ``Cluster.latency`` and ``Cluster.link`` of every pair, as matrices
        nodes = np.array([cluster.node_of[r] for r in chosen])
        same = nodes[:, None] == nodes[None, :]
        setup = np.array([float(cluster.devices[r].transfer_setup_s) for r in chosen], np.float64)
        intra, inter = cluster.intra_node, cluster.inter_node
        latency = (np.where(same, float(intra.latency), float(inter.latency))
                   + np.maximum(setup[:, None], setup[None, :]))
        bandwidth = np.where(same, float(intra.bandwidth), float(inter.bandwidth))
        # renumber the nodes that hold pipeline devices 0, 1, ...
        node_ids: dict[int, int] = {}
        for rank in chosen:
            node_ids.setdefault(cluster.node_of[rank], len(node_ids))
        devices = [cluster.devices[r] for r in chosen]
        return cls(
            latency=latency,
            bandwidth=bandwidth,
            node_of=tuple(node_ids[cluster.node_of[r]] for r in chosen),
            shared_nic=not cluster.nic_per_device,
            capacity=tuple(float(d.memory_bytes) for d in devices),
            peak_flops=tuple(float(d.peak_flops) for d in devices),
            ranks=chosen,
            name=cluster.name,
            host_bandwidth=tuple(float(d.host_bandwidth) for d in devices),
            host_latency=tuple(float(d.transfer_setup_s) for d in devices),
            host_capacity=tuple(float(d.host_memory_bytes) for d in devices),
            collectives=(intra.collectives, inter.collectives),
            data_parallel=data_parallel,
        )

