"""Memory over time on each device, in bytes.

static: parameters, gradients and optimizer state of every stage a device holds (each
    replica's copy counts: Chimera and DualPipe keep two), there the whole iteration.
activations: ``activation_bytes[s]`` allocated when F(s, mb) starts (the forward builds
    them up), freed when the backward of (s, mb) ends: all of them at B; a split backward
    frees ``input_frees`` of them at I and the rest at W (W still needs the layer inputs).
kept for W: a split backward's I also leaves ``kept_for_w_bytes[s]`` of gradients (the
    output gradient of every weight matmul) that its W consumes: held from I's end to W's.

Communication buffers (received tensors waiting for their consumer, sent ones waiting for
their transfer) are not counted; allocator fragmentation is in the activation bytes of
model-derived costs (``DeviceSpec.memory_fragmentation``). On one device the ops run
one after another in table order, so the events (F's start, I/W/B's end) are already in
time order: a free at the end of an op comes before an allocation at the start of the next.
The device's trace starts at time 0 with its static bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.schedule import Schedule
from pipesched.simulate.lowering import KIND_B, KIND_F, KIND_I, KIND_W, OpArrays
from pipesched.timeline import MemoryTrace


@njit(cache=True)
def _steps(device_offsets, kind, stage, op_start, op_end, share, activation, kept_share, kept, static):
    """Both step arrays: device d's trace is the slice [offsets[d] + d, offsets[d+1] + d + 1),
    a starting point at time 0 holding its static bytes, then one step per op."""
    num_devices = device_offsets.shape[0] - 1
    size = device_offsets[-1] + num_devices
    times = np.empty(size, np.float64)
    values = np.empty(size, np.float64)
    for d in range(num_devices):
        j = device_offsets[d] + d
        times[j] = 0.0
        held = static[d]
        values[j] = held
        for x in range(device_offsets[d], device_offsets[d + 1]):
            j += 1
            # F allocates as it starts; I, W and B free as they end
            times[j] = op_start[x] if kind[x] == KIND_F else op_end[x]
            held += share[kind[x]] * activation[stage[x]] + kept_share[kind[x]] * kept[stage[x]]
            values[j] = held
    return times, values


def static_per_device(schedule: Schedule, costs: StageCosts) -> tuple[float, ...]:
    """Bytes of parameters, gradients and optimizer state each device holds."""
    held = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            held[device] += costs.static(stage)
    return tuple(held)


def memory_trace(
    schedule: Schedule,
    ops: OpArrays,
    op_start: np.ndarray,
    op_end: np.ndarray,
    costs: StageCosts,
    *,
    capacity: Sequence[float] | None = None,
) -> MemoryTrace:
    """The step functions of memory in use per device, from the op times of a timeline."""
    if capacity is not None:
        capacity = tuple(float(c) for c in capacity)
        require(len(capacity) == schedule.num_devices, "memory_capacity", f"{len(capacity)} values",
                f"give one capacity per device ({schedule.num_devices})")
    activation = np.asarray(costs.activation_bytes, dtype=np.float64)
    # fraction of a stage-microbatch's activations each kind allocates (+) or frees (-)
    share = np.empty(4)
    share[KIND_F] = 1.0
    share[KIND_I] = -costs.input_frees
    share[KIND_W] = costs.input_frees - 1.0
    share[KIND_B] = -1.0
    # gradients kept from I to W: I adds them, W frees them
    kept = np.asarray(costs.kept_for_w_bytes if costs.kept_for_w_bytes is not None else
                      (0.0,) * costs.num_stages, dtype=np.float64)
    kept_share = np.zeros(4)
    kept_share[KIND_I] = 1.0
    kept_share[KIND_W] = -1.0
    static = static_per_device(schedule, costs)
    times, values = _steps(ops.device_offsets, ops.kind, ops.stage, op_start, op_end, share,
                           activation, kept_share, kept, np.asarray(static, np.float64))
    bounds = (ops.device_offsets + np.arange(schedule.num_devices + 1)).tolist()
    per_device_times = tuple(times[lo:hi] for lo, hi in itertools.pairwise(bounds))
    per_device_values = tuple(values[lo:hi] for lo, hi in itertools.pairwise(bounds))
    return MemoryTrace(per_device_times, per_device_values, static, capacity=capacity, unit="bytes")
