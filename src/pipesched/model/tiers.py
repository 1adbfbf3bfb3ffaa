"""The memory tiers below a device and the links between them: device memory (``Tier.DEVICE``),
host memory (``Tier.HOST``) and disk (``Tier.DISK``), the one model of where bytes live and
what moving them costs that offloading, swapping, residency and reload all read.

A device's tiers come from its ``DeviceSpec``: device memory ``memory_bytes``; host memory
``host_memory_bytes`` over the host link (``host_bandwidth`` host -> device,
``host_write_bandwidth`` device -> host, the same when 0); disk ``disk_bytes`` behind host
memory (``disk_read_bandwidth``, ``disk_write_bandwidth``). Moving n bytes over one link
takes ``n / bandwidth``; disk <-> device goes through host memory, its two links in a
pipeline, so the slower sets the rate. Moving within a tier is free.

>>> from pipesched.model.hardware import DeviceSpec
>>> d = DeviceSpec("d", 1e14, 16e9, 3e11, host_bandwidth=10e9, host_memory_bytes=200e9,
...                host_write_bandwidth=2e9, disk_read_bandwidth=0.5e9, disk_bytes=1e12)
>>> move_seconds(d, 10e9, Tier.HOST, Tier.DEVICE), move_seconds(d, 10e9, Tier.DEVICE, Tier.HOST)
(1.0, 5.0)
>>> move_seconds(d, 1e9, Tier.DISK, Tier.DEVICE), tier_capacity(d, Tier.DISK)
(2.0, 1000000000000.0)
"""

from __future__ import annotations

import math

from pipesched.enums import Tier
from pipesched.errors import PipeschedError
from pipesched.model.hardware import DeviceSpec

TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)  # fastest first


def tier_capacity(device: DeviceSpec, tier: Tier) -> float:
    """Bytes ``tier`` holds for ``device`` (0: the device has no such tier)."""
    if tier is Tier.DEVICE:
        return device.memory_bytes
    if tier is Tier.HOST:
        return device.host_memory_bytes if device.host_bandwidth > 0 else 0.0
    return device.disk_bytes if device.disk_read_bandwidth > 0 else 0.0


def link_bandwidth(device: DeviceSpec, src: Tier, dst: Tier) -> float:
    """Bytes/s of a move from ``src`` to ``dst`` (adjacent or not; inf within a tier, 0 when
    either tier is missing)."""
    if src is dst:
        return math.inf
    host_read = device.host_bandwidth
    host_write = device.host_write_bandwidth or device.host_bandwidth
    disk_read = device.disk_read_bandwidth
    disk_write = device.disk_write_bandwidth or device.disk_read_bandwidth
    rates = {
        (Tier.HOST, Tier.DEVICE): host_read,
        (Tier.DEVICE, Tier.HOST): host_write,
        (Tier.DISK, Tier.HOST): disk_read,
        (Tier.HOST, Tier.DISK): disk_write,
        (Tier.DISK, Tier.DEVICE): min(disk_read, host_read),
        (Tier.DEVICE, Tier.DISK): min(host_write, disk_write),
    }
    return rates[(src, dst)]


def move_seconds(device: DeviceSpec, nbytes: float, src: Tier, dst: Tier) -> float:
    """Seconds to move ``nbytes`` from ``src`` to ``dst`` for ``device`` (0 within a tier);
    a move to or from a tier the device lacks is refused."""
    if src is dst or nbytes <= 0:
        return 0.0
    bandwidth = link_bandwidth(device, src, dst)
    if bandwidth <= 0:
        missing = src if tier_capacity(device, src) == 0 and src is not Tier.DEVICE else dst
        raise PipeschedError(f"device={device.name}: it has no {missing} tier to move bytes {src} -> {dst}; give "
                             f"the device host_bandwidth and host_memory (host) or disk_read_bandwidth and disk (disk)")
    return nbytes / bandwidth
