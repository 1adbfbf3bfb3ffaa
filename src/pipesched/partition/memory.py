"""Activation memory a schedule implies for a partition: in-flight counts and device peaks.

A stage-microbatch's activations are held from its F until the op that ends its backward
(B, or W when the backward is split into I and W): the rules' count of stage-microbatches
in flight (``pipesched.rules.Rules.units_delta``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesched.schedule import Placement, Schedule


def inflight_per_stage(schedule: Schedule) -> list[int]:
    """Peak number of microbatches of each stage held at once on one device.

    With two replicas (Chimera, DualPipe) the worse of the two copies counts.

    >>> from pipesched.generators import generate
    >>> inflight_per_stage(generate("1f1b", 4, 8))
    [4, 3, 2, 1]
    """
    peaks = [0] * schedule.num_stages
    for ops in schedule.device_atoms:  # a fused op's parts, in order
        held = [0.0] * schedule.num_stages
        for op in ops:
            held[op.stage] += schedule.rules.units_delta(op.kind)
            peaks[op.stage] = max(peaks[op.stage], round(held[op.stage]))
    return peaks


def stage_instances_per_device(placement: Placement) -> list[int]:
    """How many stage copies each device holds (all replicas).

    >>> stage_instances_per_device(Placement.looped(2, 2))
    [2, 2]
    """
    counts = [0] * placement.num_devices
    for replica in placement.replicas:
        for device in replica:
            counts[device] += 1
    return counts


def device_peak_bytes(schedule: Schedule, activation_bytes: Sequence[float],
                      static_bytes: Sequence[float]) -> list[float]:
    """Peak memory of every device: the static bytes of all stage copies it holds plus the
    largest sum of activations it holds at once, walking its ops in order."""
    static = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            static[device] += static_bytes[stage]
    peaks = []
    for device, ops in enumerate(schedule.device_atoms):
        held = peak = 0.0
        for op in ops:
            held += schedule.rules.units_delta(op.kind) * activation_bytes[op.stage]
            peak = max(peak, held)
        peaks.append(static[device] + peak)
    return peaks
