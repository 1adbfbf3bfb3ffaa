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

Several moves at once (the loads and stores of one step of a block schedule) share links:
``link_seconds`` routes each over the adjacent links it crosses (``LINKS``: each direction of
the host link and of the disk is its own) and gives each link's busy time; moves on
different links overlap, so the moves take the busiest link's time (``links_seconds``).

>>> busy = link_seconds(d, [(1e9, Tier.DISK, Tier.DEVICE), (10e9, Tier.HOST, Tier.DEVICE)])
>>> float(busy[(Tier.HOST, Tier.DEVICE)]), float(busy[(Tier.DISK, Tier.HOST)])
(1.1, 2.0)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import numpy as np

from pipesched.enums import Tier
from pipesched.errors import PipeschedError
from pipesched.model.hardware import DeviceSpec

TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)  # fastest first
# the links between adjacent tiers, one per direction (each runs beside the others)
LINKS = ((Tier.HOST, Tier.DEVICE), (Tier.DEVICE, Tier.HOST), (Tier.DISK, Tier.HOST), (Tier.HOST, Tier.DISK))


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


def route(src: Tier, dst: Tier) -> tuple[tuple[Tier, Tier], ...]:
    """The adjacent links (``LINKS``) a move from ``src`` to ``dst`` crosses, in order.

    >>> [f"{a} -> {b}" for a, b in route(Tier.DEVICE, Tier.DISK)]
    ['device memory -> host memory', 'host memory -> disk']
    """
    if src is dst:
        return ()
    path = [src]
    step = 1 if TIERS.index(dst) > TIERS.index(src) else -1
    while path[-1] is not dst:
        path.append(TIERS[TIERS.index(path[-1]) + step])
    return tuple(itertools.pairwise(path))


def link_seconds(device: DeviceSpec, moves: Iterable[tuple[float | np.ndarray, Tier, Tier]]) -> dict:
    """Each adjacent link's busy seconds (``LINKS`` -> seconds, a float or an array like the
    bytes) under ``moves``, (bytes, source, destination) each, all at once: a move's bytes
    cross every link of its ``route``; a link no move uses is 0. A move over a missing link
    is refused as ``move_seconds`` refuses it."""
    busy: dict = dict.fromkeys(LINKS, 0.0)
    for nbytes, src, dst in moves:
        if src is dst or not np.any(np.asarray(nbytes) > 0):
            continue
        for link in route(src, dst):
            bandwidth = link_bandwidth(device, *link)
            if bandwidth <= 0:
                move_seconds(device, 1.0, *link)  # raises: the tier is missing
            busy[link] = busy[link] + np.asarray(nbytes, np.float64) / bandwidth
    return busy


def links_seconds(device: DeviceSpec, moves: Iterable[tuple[float | np.ndarray, Tier, Tier]]):
    """Seconds of ``moves`` overlapped on their links: the busiest link's time
    (``link_seconds``)."""
    busy = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in link_seconds(device, moves).values()))
    return np.maximum.reduce(busy)
