"""Memory over time on each device, from a compiled graph and the times of one run.

static: parameters, gradients and optimizer state of every stage a device holds (each
    replica's copy counts: Chimera and DualPipe keep two), there the whole iteration.
activations: each op changes them by its kind's rule (``pipesched.rules``): F allocates
    its stage-microbatch's activations as it starts (the forward builds them up), B frees
    them all when it ends; a split backward frees ``input_frees`` of them when I ends and
    the rest when W ends (W still needs the layer inputs).
kept for W: a split backward's I also leaves ``kept_for_w_bytes[s]`` of gradients (the
    output gradient of every weight matmul) that its W consumes: held from I's end to W's.

host memory: an offload's copy of a stage-microbatch's activations, from the start of its
    offload to the end of its reload (``host_memory_trace``, a trace per device of the
    host bytes its offloads hold; 0 at time 0).

Communication buffers (received tensors waiting for their consumer, sent ones waiting for
their transfer) are not counted; allocator fragmentation is in the activation bytes of
model-derived costs (``DeviceSpec.memory_fragmentation``). On one queue the ops run one
after another in program order, so a device with one queue has its events (allocations at
starts, frees at ends) already in time order: a free at the end of an op comes before an
allocation at the start of the next. The device's trace starts at time 0 with its static
bytes. Slot costs (one unit of activations per stage-microbatch, nothing freed at I) make
the same trace count stage-microbatches in flight. A device with a second queue (a host
link) has its events sorted by time, ties in table order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from numba import njit

from pipesched.enums import MemoryUnit
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
                 capacity: Sequence[float] | None = None, unit: str = MemoryUnit.BYTES) -> MemoryTrace:
    """The step functions of memory in use per device, from the op times of one run."""
    return _trace(graph, op_start, op_end, graph.memory_delta, graph.memory_at_start,
                  np.asarray(graph.static_bytes, np.float64), capacity=capacity, unit=unit)


def host_memory_trace(graph: TaskGraph, op_start: np.ndarray, op_end: np.ndarray, *,
                      capacity: Sequence[float] | None = None, unit: str = MemoryUnit.BYTES) -> MemoryTrace | None:
    """The step functions of the host memory each device's offloaded activations hold, or
    None when nothing is offloaded. One step per offload and reload."""
    if not graph.offloads:
        return None
    assert graph.host_delta is not None and graph.host_at_start is not None
    moves = np.flatnonzero(graph.host_delta != 0)
    device = graph.ops.device[moves]
    offsets = np.searchsorted(device, np.arange(graph.num_devices + 1)).astype(np.int64)
    return _trace(graph, op_start[moves], op_end[moves], graph.host_delta[moves], graph.host_at_start[moves],
                  np.zeros(graph.num_devices), capacity=capacity, unit=unit, offsets=offsets, sort=True)


def _trace(graph: TaskGraph, op_start: np.ndarray, op_end: np.ndarray, delta: np.ndarray, at_start: np.ndarray,
           static: np.ndarray, *, capacity: Sequence[float] | None, unit: str, offsets: np.ndarray | None = None,
           sort: bool | None = None) -> MemoryTrace:
    """Step functions from per-row changes grouped by device (``offsets``, default the op
    rows'); sorted by time within each device when the device's rows may run out of order
    (several queues)."""
    num_devices = graph.num_devices
    if capacity is not None:
        capacity = tuple(float(c) for c in capacity)
        require(len(capacity) == num_devices, "memory_capacity", f"{len(capacity)} values",
                f"give one capacity per device ({num_devices})")
    offsets = graph.ops.device_offsets if offsets is None else offsets
    if sort if sort is not None else graph.side_queues > 0:
        # events in time order per device (rows are grouped by device); ties keep row order
        when = np.where(at_start, op_start, op_end)
        device = np.repeat(np.arange(num_devices), np.diff(offsets))
        order = np.lexsort((np.arange(when.shape[0]), when, device))
        op_start, op_end, delta, at_start = op_start[order], op_end[order], delta[order], at_start[order]
    times, values = _steps(offsets, op_start, op_end, delta, at_start, static)
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
