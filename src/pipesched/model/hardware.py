"""Devices, links and clusters: the hardware the simulator places a schedule on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.errors import require
from pipesched.limits import MAX_SECONDS, check_amount, check_name


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_bytes: float  # device memory capacity, bytes
    memory_bandwidth: float  # bytes/s
    # achievable fraction of peak for large matmuls (documented default, overridable)
    matmul_efficiency: float = 0.7
    # achievable fraction of memory bandwidth for memory-bound kernels
    bandwidth_efficiency: float = 0.8

    def __post_init__(self) -> None:
        require(bool(self.name), "device name", repr(self.name), "give the device a name")
        check_name("device name", self.name)
        for field_name in ("peak_flops", "memory_bytes", "memory_bandwidth"):
            check_amount(f"{self.name}.{field_name}", getattr(self, field_name), above_minimum=True)
        for field_name in ("matmul_efficiency", "bandwidth_efficiency"):
            value = getattr(self, field_name)
            require(isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1,
                    f"{self.name}.{field_name}", value, "must be in (0, 1]")


@dataclass(frozen=True)
class LinkSpec:
    """A communication link: a transfer of n bytes takes latency + n / bandwidth when alone."""

    bandwidth: float  # bytes/s, per direction
    latency: float  # seconds

    def __post_init__(self) -> None:
        require(isinstance(self.bandwidth, int | float) and self.bandwidth > 0, "bandwidth", self.bandwidth,
                "must be > 0 bytes/s (use inf for free links)")
        require(isinstance(self.latency, int | float) and math.isfinite(self.latency) and 0 <= self.latency <= MAX_SECONDS,
                "latency", self.latency, f"must be a finite number of seconds in [0, {MAX_SECONDS:g}]")

    def transfer_time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Cluster:
    """Ranks grouped into nodes. Rank r is ``devices[r]`` on node ``node_of[r]``.

    Ranks on one node talk over ``intra_node`` (NVLink-like, one link per direction per rank
    pair); ranks on different nodes go over ``inter_node``, through one NIC per rank
    (``nic_per_device=True``) or one NIC shared by the whole node.
    """

    name: str
    devices: tuple[DeviceSpec, ...]
    node_of: tuple[int, ...]
    intra_node: LinkSpec
    inter_node: LinkSpec
    nic_per_device: bool = True

    def __post_init__(self) -> None:
        require(len(self.devices) >= 1, "devices", 0, "a cluster needs at least one device")
        require(
            len(self.node_of) == len(self.devices),
            "node_of",
            len(self.node_of),
            f"give one node index per device ({len(self.devices)})",
        )

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]

    def link(self, src: int, dst: int) -> LinkSpec:
        return self.intra_node if self.same_node(src, dst) else self.inter_node
