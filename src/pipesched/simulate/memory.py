"""Memory over time on each device, from a compiled graph and the times of one run.

static: parameters, gradients and optimizer state of every stage a device holds (each
    replica's copy counts: Chimera and DualPipe keep two), there the whole iteration.
activations: each op changes them by its kind's rule (``pipesched.rules``): F allocates
    its stage-microbatch's activations as it starts (the forward builds them up), B frees
    them all when it ends; a split backward frees ``input_frees`` of them when I ends and
    the rest when W ends (W still needs the layer inputs).
kept for W: a split backward's I also leaves ``kept_for_w_bytes[s]`` of gradients (the
    output gradient of every weight matmul) that its W consumes: held from I's end to W's.

Communication buffers (received tensors waiting for their consumer, sent ones waiting for
their transfer) are not counted; allocator fragmentation is in the activation bytes of
model-derived costs (``DeviceSpec.memory_fragmentation``). On one queue the ops run one
after another in program order, so a device with one queue has its events (allocations at
starts, frees at ends) already in time order: a free at the end of an op comes before an
allocation at the start of the next. The device's trace starts at time 0 with its static
bytes. Slot costs (one unit of activations per stage-microbatch, nothing freed at I) make
the same trace count stage-microbatches in flight.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from numba import njit

from pipesched.errors import require
from pipesched.simulate.graph import TaskGraph
from pipesched.timeline import MemoryTrace


@njit(cache=True)
def _steps(device_offsets, op_start, op_end, delta, at_start, static):
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
            times[j] = op_start[x] if at_start[x] else op_end[x]
            held += delta[x]
            values[j] = held
    return times, values


def memory_trace(graph: TaskGraph, op_start: np.ndarray, op_end: np.ndarray, *,
                 capacity: Sequence[float] | None = None, unit: str = "bytes") -> MemoryTrace:
    """The step functions of memory in use per device, from the op times of one run."""
    num_devices = graph.num_devices
    if capacity is not None:
        capacity = tuple(float(c) for c in capacity)
        require(len(capacity) == num_devices, "memory_capacity", f"{len(capacity)} values",
                f"give one capacity per device ({num_devices})")
    offsets = graph.ops.device_offsets
    times, values = _steps(offsets, op_start, op_end, graph.memory_delta, graph.memory_at_start,
                           np.asarray(graph.static_bytes, np.float64))
    bounds = (offsets + np.arange(num_devices + 1)).tolist()
    per_device_times = tuple(times[lo:hi] for lo, hi in itertools.pairwise(bounds))
    per_device_values = tuple(values[lo:hi] for lo, hi in itertools.pairwise(bounds))
    return MemoryTrace(per_device_times, per_device_values, graph.static_bytes, capacity=capacity, unit=unit)


def peak_memory(graph: TaskGraph) -> np.ndarray:
    """Each device's peak, as the trace of any run of ``graph`` shows it, without running it:
    a device's ops run one after another on its queue in program order, so the trace's
    values do not depend on the times (see the module docstring)."""
    offsets = graph.ops.device_offsets
    zeros = np.zeros(graph.num_ops)
    _, values = _steps(offsets, zeros, zeros, graph.memory_delta, graph.memory_at_start,
                       np.asarray(graph.static_bytes, np.float64))
    starts = offsets[:-1] + np.arange(graph.num_devices)
    return np.maximum.reduceat(values, starts)
