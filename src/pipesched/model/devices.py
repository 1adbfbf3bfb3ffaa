"""Accelerator presets: dense 16-bit peak FLOP/s, memory capacity and memory bandwidth from
the vendors' data sheets (SXM/OAM parts).

Achievable efficiencies default to DeviceSpec's (70% of peak for large matmuls, 80% of
memory bandwidth); the H200 uses 80% because an 8192^3 bf16 matmul was measured there at
about 790 TFLOP/s. Override them with ``dataclasses.replace`` or the CLI's
``--matmul-efficiency`` and ``--bandwidth-efficiency``.

``cpu`` is a nominal multi-core server CPU (AVX-512 FMA, DDR5): rough numbers that only make
CPU runs of the ``tiny`` and ``small`` models comparable in order of magnitude. Measure the
real machine for anything more.
"""

from __future__ import annotations

from types import MappingProxyType

from pipesched.errors import PipeschedError, shorten, suggest
from pipesched.model.hardware import DeviceSpec

GiB = 2.0**30
GB = 1e9

DEVICES: MappingProxyType[str, DeviceSpec] = MappingProxyType({
    spec.name: spec
    for spec in (
        DeviceSpec("a100-40gb", peak_flops=312e12, memory_bytes=40 * GiB, memory_bandwidth=1.555e12),
        DeviceSpec("a100-80gb", peak_flops=312e12, memory_bytes=80 * GiB, memory_bandwidth=2.039e12),
        DeviceSpec("h100-sxm", peak_flops=989e12, memory_bytes=80 * GiB, memory_bandwidth=3.35e12),
        DeviceSpec("h200", peak_flops=989e12, memory_bytes=141 * GB, memory_bandwidth=4.8e12,
                   matmul_efficiency=0.8),
        DeviceSpec("b200", peak_flops=2.25e15, memory_bytes=180 * GB, memory_bandwidth=8e12),
        DeviceSpec("mi300x", peak_flops=1307e12, memory_bytes=192 * GB, memory_bandwidth=5.3e12),
        DeviceSpec("cpu", peak_flops=1e12, memory_bytes=64 * GiB, memory_bandwidth=100e9,
                   matmul_efficiency=0.5, bandwidth_efficiency=0.6),
    )
})


def load_device(name: str) -> DeviceSpec:
    """A device preset by name; the error lists the known names.

    >>> load_device("h100-sxm").memory_bytes / 2**30
    80.0
    """
    try:
        return DEVICES[name]
    except KeyError:
        raise PipeschedError(f"device={shorten(name)!r}: unknown device preset{suggest(name, DEVICES)}; "
                             f"known presets: {', '.join(DEVICES)}") from None
