"""Clusters from YAML files or presets.

A cluster file lists node groups, the intra-node link and the inter-node link::

    name: 4x8-h100
    nodes:                        # node groups, in rank order
      - count: 4                  # identical nodes in this group (default 1)
        devices_per_node: 8
        device: h100-sxm          # a device preset, or a mapping (below)
      # a node with mixed devices lists them instead, one entry per rank:
      # - devices: [h100-sxm, h100-sxm, a100-80gb, a100-80gb]
    intra_node:                   # per direction, between two ranks of one node (NVLink)
      bandwidth: 450 GB/s
      latency: 3 us
    inter_node:                   # per direction, through one NIC (InfiniBand / RoCE)
      bandwidth: 400 Gb/s
      latency: 5 us
    nic_per_device: true          # one NIC per rank (default); false: one NIC per node, shared

Quantities take a unit (``GB/s``, ``Gb/s``, ``GiB``, ``us``, ``TFLOP/s``) or are bare numbers
in bytes, bytes/s, seconds and FLOP/s. A device mapping either names a preset to adjust
(``{preset: h100-sxm, matmul_efficiency: 0.8}``) or defines a device::

    device: {name: my-gpu, peak_flops: 500 TFLOP/s, memory: 96 GiB, memory_bandwidth: 4 TB/s}

The time model's assumptions (``pipesched.model.devices`` gives their sources) can be
set the same way: ``sm_count``, ``kernel_overhead`` (a time), ``flash_forward_efficiency``,
``flash_backward_efficiency``, ``flash_tile_overhead``, ``flash_backward_tile_overhead``,
``grad_accumulation_traffic``, ``memory_fragmentation``, ``comm_sm_fraction`` (the share of
compute units communication kernels take beside compute), the host link activation offloads
use (``host_bandwidth``, a rate; ``host_memory``, bytes; 0 for none), the tiers below it
that offloading and swapping use (``host_write_bandwidth`` when the way back is slower,
``disk_read_bandwidth``, ``disk_write_bandwidth``, ``disk_space``: see ``pipesched.model.tiers``), the host's
attention over a KV cache it holds (``host_attention_flops``, FLOP/s: ``serve offline``'s compute
delegation), and the fixed costs
``op_overhead`` and ``transfer_setup`` (times, as ``pipesched profile`` measures them)::

    device: {preset: h200, op_overhead: 35 us, transfer_setup: 12 us, flash_forward_efficiency: 0.355,
             flash_backward_efficiency: 0.335}

A link may carry how NCCL's collectives run over it (``pipesched.model.collectives``; by
default the H100 NVLink calibration inside a node and the NDR InfiniBand one across)::

    intra_node:
      bandwidth: 450 GB/s
      latency: 3 us
      collectives:               # any of these; the rest from the default
        fabric: nvlink           # nvlink, pcie, infiniband, ethernet (the tree runs on the last two)
        base_latency: [6.6 us, 14 us, 8.4 us]   # once per collective: LL, LL128, Simple
        step_latency: [0.6 us, 1.9 us, 0.65 us] # per algorithm step
        efficiency: 0.82         # achieved bus bandwidth / the link's bandwidth (Simple)
        protocol_bandwidth: [0.25, 0.92, 1.0]   # of Simple's bus bandwidth
        ramp: 3 MB               # message at which the bandwidth reaches 2/3 of its peak
        switch_bandwidth: 0.61   # NVLink SHARP all-reduce: algorithm bandwidth / link; 0: none
        switch_min_ranks: 5
        switch_ramp: 40 MB
        switch_latency: 25 us
        p2p_efficiency: 0.68     # all-to-all and send/recv bytes / the link's bandwidth; 0: efficiency
        peer_latency: 0.3 us     # per all-to-all peer beyond the first (the sends overlap)

``pipesched profile --collectives`` writes such a link from measurements.

Ranks are numbered node by node. ``pipesched/data/clusters/`` holds the presets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from pipesched.errors import PipeschedError, invalid, require, shorten, suggest
from pipesched.io.files import names_a_path, read_text
from pipesched.io.yaml_text import load_yaml
from pipesched.limits import MAX_CLUSTER_RANKS, check_count, check_name, check_rate
from pipesched.model.collectives import INFINIBAND_NDR, NVLINK_H100
from pipesched.model.devices import load_device
from pipesched.model.hardware import PROTOCOLS, Cluster, CollectiveCalibration, DeviceSpec, LinkSpec
from pipesched.model.units import parse_quantity

# Links assumed when a cluster is built from a device name alone (``--device``): NVLink 4
# (450 GB/s per direction) inside a node of 8, 400 Gb/s InfiniBand per device across nodes,
# each with NCCL's collectives calibrated on it (``pipesched.model.collectives``).
NVLINK = LinkSpec(bandwidth=450e9, latency=3e-6, collectives=NVLINK_H100)
INFINIBAND_400G = LinkSpec(bandwidth=50e9, latency=5e-6, collectives=INFINIBAND_NDR)
# the calibration a cluster file's link gets when it gives none
_DEFAULT_CALIBRATION = {"intra_node": NVLINK_H100, "inter_node": INFINIBAND_NDR}
_CALIBRATION_TIMES = ("base_latency", "step_latency")  # per-protocol lists of times
_CALIBRATION_KEYS = {"fabric", "efficiency", "protocol_bandwidth", "ramp", "switch_bandwidth", "switch_min_ranks",
                     "switch_ramp", "switch_latency", "p2p_efficiency", "peer_latency", *_CALIBRATION_TIMES}

_CLUSTER_KEYS = {"name", "nodes", "intra_node", "inter_node", "nic_per_device"}
_NODE_KEYS = {"count", "devices_per_node", "device", "devices"}
# device fields given as plain numbers, and those given as times (YAML key -> DeviceSpec field)
_NUMBER_KEYS = ("matmul_efficiency", "bandwidth_efficiency", "flash_forward_efficiency", "flash_backward_efficiency",
                "flash_tile_overhead", "flash_backward_tile_overhead", "grad_accumulation_traffic",
                "memory_fragmentation", "comm_sm_fraction")
_TIME_KEYS = {"kernel_overhead": "kernel_overhead_s", "op_overhead": "op_overhead_s",
              "transfer_setup": "transfer_setup_s"}
# the memory tiers below the device: rates (YAML key -> DeviceSpec field), and the disk's bytes
_TIER_RATE_KEYS = {"host_write_bandwidth": "host_write_bandwidth", "disk_read_bandwidth": "disk_read_bandwidth",
                   "disk_write_bandwidth": "disk_write_bandwidth"}
_DEVICE_KEYS = {"preset", "name", "peak_flops", "fp8_peak_flops", "fp8_gemm_table", "memory", "memory_bandwidth", "sm_count",
                "host_bandwidth", "host_memory", "disk_space", "host_attention_flops", *_TIER_RATE_KEYS, *_NUMBER_KEYS,
                *_TIME_KEYS}


def _preset_dir():
    return resources.files("pipesched") / "data" / "clusters"


def cluster_presets() -> tuple[str, ...]:
    """Names of the built-in clusters."""
    return tuple(sorted(entry.name.removesuffix(".yaml") for entry in _preset_dir().iterdir()
                        if entry.name.endswith(".yaml")))


def load_cluster(name_or_path: str) -> Cluster:
    """A cluster preset by name, or a cluster YAML file.

    >>> load_cluster("4x8-h100").num_devices
    32
    """
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or names_a_path(name_or_path, cluster_presets()):
        return parse_cluster(read_text(path, "cluster"), source=str(path))
    if name_or_path in cluster_presets():
        text = (_preset_dir() / f"{name_or_path}.yaml").read_text(encoding="utf-8")
        return parse_cluster(text, source=name_or_path)
    raise PipeschedError(f"cluster={shorten(name_or_path)!r}: unknown cluster preset and no such file"
                         f"{suggest(name_or_path, cluster_presets())}; known presets: {', '.join(cluster_presets())}")


def parse_cluster(text: str, *, source: str = "cluster") -> Cluster:
    """Build a Cluster from the YAML text described in the module docstring."""
    data = load_yaml(text, field="cluster", source=source)
    require(isinstance(data, dict), "cluster", source, "must be a YAML mapping with nodes, intra_node, inter_node")
    _check_keys(data, _CLUSTER_KEYS, "cluster")
    for key in ("nodes", "intra_node", "inter_node"):
        require(key in data, "cluster", source, f"is missing '{key}'; see the cluster file format in the docs")
    nodes = data["nodes"]
    require(isinstance(nodes, list) and len(nodes) > 0, "nodes", nodes, "must be a non-empty list of node groups")
    devices: list[DeviceSpec] = []
    node_of: list[int] = []
    node = 0
    for index, group in enumerate(nodes):
        for node_devices in _node_group(group, f"nodes[{index}]", room=MAX_CLUSTER_RANKS - len(devices)):
            devices.extend(node_devices)
            node_of.extend([node] * len(node_devices))
            node += 1
    nic_per_device = data.get("nic_per_device", True)
    require(isinstance(nic_per_device, bool), "nic_per_device", nic_per_device, "must be true or false")
    return Cluster(
        name=check_name("cluster.name", data.get("name", Path(source).stem or "cluster")),
        devices=tuple(devices),
        node_of=tuple(node_of),
        intra_node=_link(data["intra_node"], "intra_node"),
        inter_node=_link(data["inter_node"], "inter_node"),
        nic_per_device=nic_per_device,
    )


def homogeneous_cluster(device: DeviceSpec, num_devices: int, *, devices_per_node: int = 8,
                        intra_node: LinkSpec = NVLINK, inter_node: LinkSpec = INFINIBAND_400G) -> Cluster:
    """``num_devices`` identical devices, ``devices_per_node`` per node.

    >>> homogeneous_cluster(load_device("h100-sxm"), 16).node_of[8]
    1
    """
    check_count("devices", num_devices, MAX_CLUSTER_RANKS, what="devices of a cluster")
    check_count("devices_per_node", devices_per_node, MAX_CLUSTER_RANKS, what="devices of a cluster")
    return Cluster(
        name=f"{num_devices}x{device.name}",
        devices=(device,) * num_devices,
        node_of=tuple(rank // devices_per_node for rank in range(num_devices)),
        intra_node=intra_node,
        inter_node=inter_node,
    )


def _check_keys(data: Mapping, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise invalid(f"{where}.{unknown[0]}", data[unknown[0]], f"unknown key; known keys: {', '.join(sorted(known))}")


def _node_group(group: object, where: str, *, room: int) -> list[list[DeviceSpec]]:
    """The nodes of one group; ``room``: devices the cluster may still take (its limit)."""
    require(isinstance(group, dict), where, group, "must be a mapping with device/devices_per_node or devices")
    _check_keys(group, _NODE_KEYS, where)
    count = group.get("count", 1)
    require(isinstance(count, int) and not isinstance(count, bool) and count >= 1, f"{where}.count", count,
            "must be a positive integer")
    if "devices" in group:
        require("device" not in group and "devices_per_node" not in group, where, "devices",
                "give either a devices list or device + devices_per_node, not both")
        listed = group["devices"]
        require(isinstance(listed, list) and len(listed) > 0, f"{where}.devices", listed,
                "must be a non-empty list of devices")
        per_node = len(listed)
    else:
        require("device" in group, where, group, "needs 'device' (with devices_per_node) or 'devices'")
        per_node = group.get("devices_per_node", 1)
        require(isinstance(per_node, int) and not isinstance(per_node, bool) and per_node >= 1,
                f"{where}.devices_per_node", per_node, "must be a positive integer")
    if count * per_node > room:  # checked before any device is built
        raise PipeschedError(f"{where}: {shorten(count)} nodes x {shorten(per_node)} devices: over the limit of "
                             f"{MAX_CLUSTER_RANKS:,} devices of a cluster; give fewer nodes or devices")
    if "devices" in group:
        node = [_device(entry, f"{where}.devices[{i}]") for i, entry in enumerate(group["devices"])]
    else:
        node = [_device(group["device"], f"{where}.device")] * per_node
    return [list(node) for _ in range(count)]


def _device(entry: object, where: str) -> DeviceSpec:
    if isinstance(entry, str):
        return load_device(entry)
    require(isinstance(entry, dict), where, entry, "must be a device preset name or a mapping")
    _check_keys(entry, _DEVICE_KEYS, where)
    if "preset" in entry:
        base = load_device(check_name(f"{where}.preset", entry["preset"]))
    else:
        for key in ("name", "peak_flops", "memory", "memory_bandwidth"):
            require(key in entry, where, entry.get("name", "device"), f"is missing '{key}' (or name a preset)")
        base = DeviceSpec(check_name(f"{where}.name", entry["name"]), 1.0, 1.0, 1.0)
    changes: dict[str, object] = {}
    if "name" in entry:
        changes["name"] = check_name(f"{where}.name", entry["name"])
    if "peak_flops" in entry:
        changes["peak_flops"] = parse_quantity(entry["peak_flops"], "flops", f"{where}.peak_flops")
    if "fp8_peak_flops" in entry:
        changes["fp8_peak_flops"] = parse_quantity(entry["fp8_peak_flops"], "flops", f"{where}.fp8_peak_flops")
    if "fp8_gemm_table" in entry:  # a built-in kernel table's name, or "" for the FP8 peak x matmul_efficiency
        require(isinstance(entry["fp8_gemm_table"], str), f"{where}.fp8_gemm_table", entry["fp8_gemm_table"],
                "give a kernel table's name, or \"\" for none")
        changes["fp8_gemm_table"] = entry["fp8_gemm_table"]
    if "memory" in entry:
        changes["memory_bytes"] = parse_quantity(entry["memory"], "bytes", f"{where}.memory")
    if "memory_bandwidth" in entry:
        changes["memory_bandwidth"] = parse_quantity(entry["memory_bandwidth"], "bandwidth", f"{where}.memory_bandwidth")
    if "host_bandwidth" in entry:
        changes["host_bandwidth"] = parse_quantity(entry["host_bandwidth"], "bandwidth", f"{where}.host_bandwidth")
    if "host_memory" in entry:
        changes["host_memory_bytes"] = parse_quantity(entry["host_memory"], "bytes", f"{where}.host_memory")
    for key, field_name in _TIER_RATE_KEYS.items():
        if key in entry:
            changes[field_name] = parse_quantity(entry[key], "bandwidth", f"{where}.{key}")
    if "disk_space" in entry:
        changes["disk_bytes"] = parse_quantity(entry["disk_space"], "bytes", f"{where}.disk_space")
    if "host_attention_flops" in entry:  # FLOP/s of the host's attention over a cache in host memory
        changes["host_attention_flops"] = parse_quantity(entry["host_attention_flops"], "flops",
                                                         f"{where}.host_attention_flops")
    for key in _NUMBER_KEYS:
        if key in entry:
            value = entry[key]
            require(isinstance(value, int | float) and not isinstance(value, bool), f"{where}.{key}", value,
                    "must be a number")
            changes[key] = float(value)
    for key, field_name in _TIME_KEYS.items():
        if key in entry:
            changes[field_name] = parse_quantity(entry[key], "time", f"{where}.{key}")
    if "sm_count" in entry:
        value = entry["sm_count"]
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{where}.sm_count", value,
                "must be a positive integer")
        changes["sm_count"] = value
    return dataclasses.replace(base, **changes)


def _link(entry: object, where: str) -> LinkSpec:
    require(isinstance(entry, dict), where, entry, "must be a mapping with bandwidth and latency")
    _check_keys(entry, {"bandwidth", "latency", "collectives"}, where)
    require("bandwidth" in entry, where, entry, "is missing 'bandwidth' (for example 450 GB/s)")
    bandwidth = parse_quantity(entry["bandwidth"], "bandwidth", f"{where}.bandwidth")
    latency = parse_quantity(entry.get("latency", 0.0), "time", f"{where}.latency")
    check_rate(f"{where}.bandwidth", bandwidth)
    calibration = _calibration(entry.get("collectives", {}), f"{where}.collectives", _DEFAULT_CALIBRATION[where])
    return LinkSpec(bandwidth=bandwidth, latency=latency, collectives=calibration)


def _calibration(entry: object, where: str, base: CollectiveCalibration) -> CollectiveCalibration:
    """A link's collective calibration: ``base`` with the keys ``entry`` gives (as
    ``pipesched profile --collectives`` writes them)."""
    require(isinstance(entry, dict), where, entry, "must be a mapping of calibration constants")
    _check_keys(entry, _CALIBRATION_KEYS, where)
    changes: dict[str, object] = {}
    for key in _CALIBRATION_TIMES:
        if key in entry:
            values = entry[key]
            require(isinstance(values, list) and len(values) == len(PROTOCOLS), f"{where}.{key}", values,
                    f"give a list of {len(PROTOCOLS)} times, one per protocol ({', '.join(PROTOCOLS)})")
            changes[key] = tuple(parse_quantity(v, "time", f"{where}.{key}[{i}]") for i, v in enumerate(values))
    for key in ("efficiency", "switch_bandwidth", "protocol_bandwidth", "p2p_efficiency"):
        if key in entry:
            value = entry[key]
            numbers = value if key == "protocol_bandwidth" and isinstance(value, list) else [value]
            require(all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers), f"{where}.{key}",
                    value, "must be a number" if key != "protocol_bandwidth" else
                    f"give a list of {len(PROTOCOLS)} shares, one per protocol ({', '.join(PROTOCOLS)})")
            changes[key] = tuple(numbers) if key == "protocol_bandwidth" else float(value)
    for key in ("ramp", "switch_ramp"):
        if key in entry:
            changes[f"{key}_bytes"] = parse_quantity(entry[key], "bytes", f"{where}.{key}")
    for key in ("switch_latency", "peer_latency"):
        if key in entry:
            changes[key] = parse_quantity(entry[key], "time", f"{where}.{key}")
    if "switch_min_ranks" in entry:
        changes["switch_min_ranks"] = entry["switch_min_ranks"]
    if "fabric" in entry:
        changes["fabric"] = check_name(f"{where}.fabric", entry["fabric"])
    return dataclasses.replace(base, **changes)
