"""Devices, links and clusters: the hardware the simulator places a schedule on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.errors import require
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_SECONDS,
    MIN_EFFICIENCY,
    check_amount,
    check_name,
    check_rate,
)
from pipesched.model.kernel_tables import kernel_tables


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator, and every assumption the cost model makes about it.

    The defaults after the first four fields give the plain roofline of a device nothing
    more is known about: no tile quantization (one 1 x 1 tile per compute unit), unfused
    attention, no fixed costs, no fragmentation. The presets (``pipesched.model.devices``)
    set them with their sources.
    """

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_bytes: float  # device memory capacity, bytes
    memory_bandwidth: float  # bytes/s
    # achievable fraction of peak of a matmul whose output tiles fill every compute unit in
    # every wave (a large square matmul reaches it less its last partial wave)
    matmul_efficiency: float = 0.7
    # achievable fraction of memory bandwidth for memory-bound kernels
    bandwidth_efficiency: float = 0.8
    # --- matmul shape (pipesched.model.kernels): output tiles run on compute units in waves
    sm_count: int = 1  # streaming multiprocessors (compute units) that run output tiles at once
    matmul_tiles: tuple[tuple[int, int], ...] = ((1, 1),)  # (rows, columns) of the output tiles the GEMM library picks from
    kernel_overhead_s: float = 0.0  # fixed device time per kernel: launch gap, prologue, epilogue tail, seconds
    # --- fused (flash) attention, causal; 0 efficiency = unfused attention with the scores in memory
    flash_forward_efficiency: float = 0.0  # fraction of peak of the forward kernel on long sequences
    flash_backward_efficiency: float = 0.0  # same for the backward kernel (2.5 x the forward FLOPs)
    flash_block: int = 128  # query rows and key rows of one attention tile
    flash_tile_overhead: float = 0.0  # fixed work per query tile in the forward (load Q, rescale, write O), in key-tile visits
    flash_backward_tile_overhead: float = 0.0  # same in the backward (accumulate and write dQ, dK, dV)
    # --- weight gradients: elements moved per weight-gradient element when W adds its result
    # into the existing gradient (3: read both, write one; 0: fused into the GEMM epilogue)
    grad_accumulation_traffic: float = 0.0
    # --- fixed costs of a pipeline (seconds)
    op_overhead_s: float = 0.0  # every pipeline op F, I, W or B: its first launch, stream sync, runtime bookkeeping
    transfer_setup_s: float = 0.0  # every point-to-point transfer, on top of the link latency: posting it, matching it
    # --- memory: bytes the allocator holds per byte of activations (fragmentation, caching)
    memory_fragmentation: float = 1.0
    # --- the host link activation offloads use (PCIe, or NVLink-C2C on Grace superchips)
    host_bandwidth: float = 0.0  # bytes/s between device memory and pinned host memory, per direction; 0 = no host link
    host_memory_bytes: float = 0.0  # host memory the device's offloaded activations may fill, bytes
    # --- the memory tiers below the device (pipesched.model.tiers: offloading, swapping, reload)
    host_write_bandwidth: float = 0.0  # bytes/s device -> host when it differs from host_bandwidth; 0 = host_bandwidth
    disk_read_bandwidth: float = 0.0  # bytes/s disk -> host memory; 0 = no disk tier
    disk_write_bandwidth: float = 0.0  # bytes/s host memory -> disk; 0 = disk_read_bandwidth
    disk_bytes: float = 0.0  # disk the device's offloaded state may fill, bytes; 0 = none
    # --- FP8 tensor cores (training's --dtype fp8: the linear layers' matmuls at this rate)
    fp8_peak_flops: float = 0.0  # dense FP8 FLOP/s; 0 = no FP8 tensor cores
    # the FP8 GEMM library's published rates by shape (pipesched/data/kernels/NAME.csv,
    # pipesched.model.kernel_tables) that FP8 matmuls run at instead of matmul_efficiency
    # and the tile model; "" = the FP8 peak at matmul_efficiency, as the 16-bit matmuls
    fp8_gemm_table: str = ""
    # --- compute beside communication (pipesched.model.phases): the share of the compute
    # units the communication kernels take while they run beside compute, which then runs
    # on the rest (DeepSeek-V3 gives 20 of 132 SMs to its all-to-all kernels); 0 = none
    comm_sm_fraction: float = 0.0
    # FLOP/s the host's cores reach on a decode step's attention over a KV cache held in host
    # memory (FlexGen's compute delegation: the cache is not moved to the device); 0 = none
    host_attention_flops: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name), "device name", repr(self.name), "give the device a name")
        check_name("device name", self.name)
        check_rate(f"{self.name}.peak_flops", self.peak_flops, unit="FLOP/s")
        check_amount(f"{self.name}.memory_bytes", self.memory_bytes, above_minimum=True, unit="bytes")
        check_rate(f"{self.name}.memory_bandwidth", self.memory_bandwidth)
        # the rates the costs divide by are rate x efficiency: at least MIN_RATE x MIN_EFFICIENCY
        for field_name in ("matmul_efficiency", "bandwidth_efficiency"):
            value = getattr(self, field_name)
            require(isinstance(value, int | float) and not isinstance(value, bool) and MIN_EFFICIENCY <= value <= 1,
                    f"{self.name}.{field_name}", value, f"must be in [{MIN_EFFICIENCY:g}, 1]")
        for field_name in ("flash_forward_efficiency", "flash_backward_efficiency"):
            value = getattr(self, field_name)
            require(value == 0 or MIN_EFFICIENCY <= value <= 1, f"{self.name}.{field_name}", value,
                    f"must be 0 (unfused attention) or in [{MIN_EFFICIENCY:g}, 1]")
        require((self.flash_forward_efficiency > 0) == (self.flash_backward_efficiency > 0),
                f"{self.name}.flash_backward_efficiency", self.flash_backward_efficiency,
                "give both flash efficiencies or neither")
        require(isinstance(self.sm_count, int) and self.sm_count >= 1, f"{self.name}.sm_count", self.sm_count,
                "must be a positive integer")
        require(isinstance(self.flash_block, int) and self.flash_block >= 1, f"{self.name}.flash_block",
                self.flash_block, "must be a positive integer")
        tiles = tuple(tuple(int(x) for x in tile) for tile in self.matmul_tiles)
        require(len(tiles) >= 1 and all(len(t) == 2 and min(t) >= 1 for t in tiles), f"{self.name}.matmul_tiles",
                self.matmul_tiles, "give one or more (rows, columns) pairs of positive integers")
        object.__setattr__(self, "matmul_tiles", tiles)
        for field_name in ("kernel_overhead_s", "flash_tile_overhead", "flash_backward_tile_overhead",
                           "grad_accumulation_traffic",
                           "op_overhead_s", "transfer_setup_s"):
            value = getattr(self, field_name)
            require(math.isfinite(value) and value >= 0, f"{self.name}.{field_name}", value,
                    "must be a finite number >= 0")
            check_amount(f"{self.name}.{field_name}", value,
                         limit=MAX_SECONDS if field_name.endswith("_s") else MAX_AMOUNT)
        check_rate(f"{self.name}.host_bandwidth", self.host_bandwidth, zero=True)  # 0: no host link
        require(math.isfinite(self.host_memory_bytes) and self.host_memory_bytes >= 0,
                f"{self.name}.host_memory_bytes", self.host_memory_bytes, "must be a finite number >= 0 (0: none)")
        for field_name in ("host_write_bandwidth", "disk_read_bandwidth", "disk_write_bandwidth",
                           "host_attention_flops"):
            check_rate(f"{self.name}.{field_name}", getattr(self, field_name), zero=True)
        check_rate(f"{self.name}.fp8_peak_flops", self.fp8_peak_flops, unit="FLOP/s", zero=True)
        require(self.fp8_gemm_table == "" or self.fp8_gemm_table in kernel_tables(), f"{self.name}.fp8_gemm_table",
                self.fp8_gemm_table, f"give a built-in kernel table ({', '.join(kernel_tables())}) or \"\" for none")
        require(math.isfinite(self.disk_bytes) and self.disk_bytes >= 0,
                f"{self.name}.disk_bytes", self.disk_bytes, "must be a finite number >= 0 (0: none)")
        require(isinstance(self.comm_sm_fraction, int | float) and 0 <= self.comm_sm_fraction < 1,
                f"{self.name}.comm_sm_fraction", self.comm_sm_fraction,
                "must be in [0, 1): the share of compute units communication kernels take")
        require(math.isfinite(self.memory_fragmentation) and self.memory_fragmentation >= 1,
                f"{self.name}.memory_fragmentation", self.memory_fragmentation, "must be a number >= 1")


# NCCL's protocols, in the order of every per-protocol tuple of a CollectiveCalibration:
# LL (8-byte stores with a flag: lowest latency, a quarter of the bandwidth), LL128 (128-byte
# lines with a flag) and Simple (large chunks behind a fence: the full bandwidth).
PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class CollectiveCalibration:
    """How NCCL's collectives run over one kind of link (``pipesched.model.collectives``).

    A collective with protocol p costs ``base_latency[p]`` once, ``step_latency[p]`` per
    algorithm step, and its bytes at the achieved bus bandwidth: the link's bandwidth x
    ``efficiency`` x ``protocol_bandwidth[p]``, ramping with the message as
    (B + ramp) / (B + 2 ramp) of it (half at small messages, all of it at B >> ramp).
    An all-reduce may reduce in the switch (NVLink SHARP) at ``switch_bandwidth`` x the
    link's bandwidth of algorithm bandwidth, from ``switch_min_ranks`` ranks on, ramping the
    same way with ``switch_ramp_bytes``, after Simple's launch and ``switch_latency``.
    Point-to-point traffic (all-to-all, send/recv) is no collective algorithm: its bytes go
    at ``p2p_efficiency`` of the link's bandwidth (0: ``efficiency``), and an all-to-all's
    sends to its peers are posted at once, so they overlap: one step of latency and
    ``peer_latency`` more per peer beyond the first (the cost of posting each send).
    """

    fabric: str = "nvlink"  # the link's kind, as reports name it: nvlink, pcie, infiniband, ethernet
    base_latency: tuple[float, float, float] = (6.6e-6, 14e-6, 8.4e-6)  # seconds once per collective (LL, LL128, Simple)
    step_latency: tuple[float, float, float] = (0.6e-6, 1.9e-6, 3.4e-6)  # seconds per step (LL, LL128, Simple)
    efficiency: float = 0.82  # achieved bus bandwidth of the Simple protocol / the link's bandwidth
    protocol_bandwidth: tuple[float, float, float] = (0.25, 0.92, 1.0)  # bus bandwidth of LL, LL128, Simple / Simple's
    ramp_bytes: float = 0.0  # bytes per rank at which the achieved bandwidth is 2/3 of its peak; 0 = no ramp
    switch_bandwidth: float = 0.0  # algorithm bandwidth of an in-switch all-reduce / the link's bandwidth; 0 = none
    switch_min_ranks: int = 5  # the least ranks the in-switch all-reduce runs on
    switch_ramp_bytes: float = 0.0  # ramp_bytes of the in-switch all-reduce; 0 = no ramp
    switch_latency: float = 0.0  # seconds the in-switch all-reduce adds to Simple's launch
    p2p_efficiency: float = 0.0  # achieved bandwidth of all-to-all and send/recv bytes / the link's; 0 = efficiency
    peer_latency: float = 0.0  # seconds each all-to-all peer beyond the first adds to its one step

    def __post_init__(self) -> None:
        check_name("collectives.fabric", self.fabric)
        for field_name in ("base_latency", "step_latency", "protocol_bandwidth"):
            value = tuple(getattr(self, field_name))
            require(len(value) == len(PROTOCOLS) and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                         and math.isfinite(x) for x in value),
                    f"collectives.{field_name}", list(value), f"give {len(PROTOCOLS)} numbers, one per protocol "
                    f"({', '.join(PROTOCOLS)})")
            object.__setattr__(self, field_name, tuple(float(x) for x in value))
        for field_name in ("base_latency", "step_latency"):
            require(all(0 <= x <= MAX_SECONDS for x in getattr(self, field_name)), f"collectives.{field_name}",
                    list(getattr(self, field_name)), f"must be seconds in [0, {MAX_SECONDS:g}]")
        require(all(MIN_EFFICIENCY <= x <= 1 for x in self.protocol_bandwidth), "collectives.protocol_bandwidth",
                list(self.protocol_bandwidth), f"must be shares in [{MIN_EFFICIENCY:g}, 1]")
        require(isinstance(self.efficiency, int | float) and MIN_EFFICIENCY <= self.efficiency <= 1,
                "collectives.efficiency", self.efficiency, f"must be in [{MIN_EFFICIENCY:g}, 1]")
        require(isinstance(self.switch_bandwidth, int | float) and 0 <= self.switch_bandwidth <= 2,
                "collectives.switch_bandwidth", self.switch_bandwidth, "must be in [0, 2] (0: no in-switch reduction)")
        require(isinstance(self.switch_min_ranks, int) and not isinstance(self.switch_min_ranks, bool)
                and 2 <= self.switch_min_ranks <= 1024, "collectives.switch_min_ranks", self.switch_min_ranks,
                "must be a whole number in [2, 1024]")
        check_amount("collectives.ramp_bytes", self.ramp_bytes, unit="bytes")
        check_amount("collectives.switch_ramp_bytes", self.switch_ramp_bytes, unit="bytes")
        check_amount("collectives.switch_latency", self.switch_latency, limit=MAX_SECONDS, unit="seconds")
        require(isinstance(self.p2p_efficiency, int | float) and (self.p2p_efficiency == 0
                                                                  or MIN_EFFICIENCY <= self.p2p_efficiency <= 1),
                "collectives.p2p_efficiency", self.p2p_efficiency,
                f"must be in [{MIN_EFFICIENCY:g}, 1] (0: the efficiency of the collectives)")
        check_amount("collectives.peer_latency", self.peer_latency, limit=MAX_SECONDS, unit="seconds")

    @property
    def point_to_point_efficiency(self) -> float:
        """Achieved bandwidth of point-to-point bytes (all-to-all, send/recv) / the link's."""
        return self.p2p_efficiency or self.efficiency


@dataclass(frozen=True)
class LinkSpec:
    """A communication link: a transfer of n bytes takes latency + n / bandwidth when alone.
    ``collectives``: how NCCL's collectives run over it; None times them as plain rings of
    the latency and bandwidth."""

    bandwidth: float  # bytes/s, per direction
    latency: float  # seconds
    collectives: CollectiveCalibration | None = None

    def __post_init__(self) -> None:
        check_rate("bandwidth", self.bandwidth, infinite=True)
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

    def __hash__(self) -> int:
        # a cache key several times per point of a sweep (stage plans, costs, networks):
        # hashing every device is most of the cost, and equal clusters agree on these
        return hash((self.name, self.node_of, self.intra_node, self.inter_node, self.nic_per_device, self.devices[0]))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]

    def link(self, src: int, dst: int) -> LinkSpec:
        return self.intra_node if self.same_node(src, dst) else self.inter_node

    def latency(self, src: int, dst: int) -> float:
        """Fixed seconds of one transfer src -> dst: the link's latency plus the set-up of the
        slower end (both post their half of the transfer at once)."""
        setup = max(self.devices[src].transfer_setup_s, self.devices[dst].transfer_setup_s)
        return self.link(src, dst).latency + setup

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` src -> dst with the link to itself (0 on one rank)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return self.latency(src, dst) + nbytes / self.link(src, dst).bandwidth
