"""Activation memory a schedule implies for a partition: in-flight counts and device peaks.

A stage-microbatch's activations are held from its F until the op that ends its backward
(B, or W when the backward is split into I and W): the rules' count of stage-microbatches
in flight (``pipesched.rules.Rules.units_delta``).
"""

from __future__ import annotations

import numpy as np

from pipesched.costs import StageCosts
from pipesched.dependencies import memory_deltas, op_arrays
from pipesched.schedule import Placement, Schedule


def inflight_per_stage(schedule: Schedule) -> list[int]:
    """Peak number of microbatches of each stage held at once on one device.

    With two replicas (Chimera, DualPipe) the worse of the two copies counts.

    >>> from pipesched.generators import generate
    >>> inflight_per_stage(generate("1f1b", 4, 8))
    [4, 3, 2, 1]
    """
    cache = schedule.derived
    if "inflight_per_stage" not in cache:
        ops = op_arrays(schedule)
        delta = _units(schedule, ops)
        peaks = np.zeros(schedule.num_stages, np.int64)
        for device in range(schedule.num_devices):
            rows = slice(int(ops.device_offsets[device]), int(ops.device_offsets[device + 1]))
            stages = ops.stage[rows]
            for stage in np.unique(stages).tolist():
                # held counts in table order: a running sum, as a device walks its ops
                held = np.cumsum(delta[rows][stages == stage])
                peaks[stage] = max(peaks[stage], round(float(held.max())))
        cache["inflight_per_stage"] = tuple(peaks.tolist())
    return list(cache["inflight_per_stage"])


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


def device_peak_bytes(schedule: Schedule, costs: StageCosts) -> list[float]:
    """Peak memory of every device as the simulator counts it: the static bytes of all stage
    copies it holds plus the most its ops hold at once, walking them in table order (one
    queue runs them in that order), each changing memory by its kind's rule
    (``pipesched.dependencies.memory_deltas``: the share of activations an I frees and the
    gradients it keeps for W included)."""
    static = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            static[device] += costs.static(stage)
    costs = costs.of_microbatch_fraction(schedule.microbatch_fraction)  # as the simulator runs it
    ops = op_arrays(schedule)
    delta, _ = memory_deltas(schedule, ops, costs)
    peaks = []
    for device in range(schedule.num_devices):
        held = np.cumsum(delta[int(ops.device_offsets[device]):int(ops.device_offsets[device + 1])])
        peaks.append(static[device] + max(0.0, float(held.max(initial=0.0))))
    return peaks


def _units(schedule: Schedule, ops) -> np.ndarray:
    """Change of stage-microbatches in flight of each op row, on its stage's role
    (``Rules.units_delta``: a frozen stage's ops keep what its role says)."""
    roles = list(dict.fromkeys(schedule.roles))
    per_role = np.array([[schedule.rules.units_delta(rule.kind, role) for rule in schedule.rules] for role in roles],
                        np.float64)
    stage_role = np.array([roles.index(role) for role in schedule.roles], np.int64)
    return per_role[stage_role[ops.stage], ops.kind]
