"""Figures of one iteration, from a Timeline (slot table, simulation or measured run).

Definitions (times in the timeline's unit: slots or seconds):

- iteration time: from the first op's start to the last op's or transfer's end
  (``Timeline.makespan``).
- busy(d): compute time of device d; idle(d) = iteration time - busy(d).
- bubble ratio: sum of idle over (devices x iteration time), the fraction of the devices'
  time spent not computing; per device idle(d) / iteration time. ``bubble_over_work`` is
  sum of idle over sum of busy (the form the zero-bubble and Megatron papers use).
- critical path: the chain of ops and transfers that determined the end
  (``pipesched.simulate.critical``).
- throughput: samples per second = d x microbatches x micro-batch size / iteration time,
  with d the data-parallel pipeline replicas the simulation modelled (1 for one pipeline);
  tokens per second = samples x sequence length.
- MFU (model FLOPs utilization): the model FLOPs of one iteration (forward and backward of
  every sample) over iteration time x devices x peak FLOP/s per device. With d replicas
  of p devices of t tensor-parallel ranks this is d x one pipeline's FLOPs over d x p x t
  devices' peak, the same as one pipeline's: callers give one pipeline's figures.
- communication of device d: the union of the intervals in which a transfer it sends or
  receives (or an all-reduce it takes part in) is in flight. Exposed communication is the
  part of it during which d does not compute; hidden communication is the part that
  overlaps d's compute.
- peak memory per device and out-of-memory flags: from the timeline's memory trace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

from pipesched.errors import require
from pipesched.simulate.critical import CriticalPath, critical_path
from pipesched.timeline import Timeline


def iteration_time(timeline: Timeline) -> float:
    return timeline.makespan


def bubble_ratio(timeline: Timeline) -> float:
    """Idle compute time over (devices x iteration time)."""
    return timeline.bubble_ratio()


def bubble_per_device(timeline: Timeline) -> np.ndarray:
    """idle(d) / iteration time for each device."""
    total = timeline.makespan
    idle = timeline.idle_per_device()
    return idle / total if total > 0 else np.zeros_like(idle)


def bubble_over_work(timeline: Timeline) -> float:
    """Idle compute time over busy compute time, summed over devices."""
    busy = timeline.busy_per_device().sum()
    return float(timeline.idle_per_device().sum() / busy) if busy > 0 else 0.0


def throughput(timeline: Timeline, *, micro_batch_size: int = 1, seq_len: int | None = None) -> tuple[float, float | None]:
    """(samples per second, tokens per second or None without ``seq_len``) of the pipeline
    and its data-parallel replicas (``SimulationInfo.replicas``)."""
    require(micro_batch_size >= 1, "micro_batch_size", micro_batch_size, "must be at least 1")
    total = timeline.makespan
    if total <= 0:
        return 0.0, (0.0 if seq_len else None)
    replicas = timeline.simulation.replicas if timeline.simulation is not None else 1
    samples = replicas * timeline.schedule.num_microbatches * micro_batch_size / total
    return samples, (samples * seq_len if seq_len else None)


def mfu(timeline: Timeline, *, flops_per_iteration: float, peak_flops: float | list[float] | tuple[float, ...]) -> float:
    """Model FLOPs utilization: useful FLOPs / (iteration time x summed device peak).

    ``peak_flops`` is one device's peak or one value per device.
    """
    peaks = np.broadcast_to(np.asarray(peak_flops, dtype=np.float64), (timeline.num_devices,))
    capacity = timeline.makespan * float(peaks.sum())
    return flops_per_iteration / capacity if capacity > 0 else 0.0


@njit(cache=True)
def _union_length(starts, ends):
    """Total length of the union of intervals sorted by start."""
    total = 0.0
    current_start = -np.inf
    current_end = -np.inf
    for k in range(starts.shape[0]):
        if starts[k] > current_end:
            if current_end > current_start:
                total += current_end - current_start
            current_start = starts[k]
            current_end = ends[k]
        elif ends[k] > current_end:
            current_end = ends[k]
    if current_end > current_start:
        total += current_end - current_start
    return total


@njit(cache=True)
def _overlap_with_busy(starts, ends, busy_starts, busy_ends):
    """Length of (union of intervals sorted by start) intersected with the disjoint, sorted
    busy intervals."""
    total = 0.0
    j = 0
    current_start = -np.inf
    current_end = -np.inf
    num_busy = busy_starts.shape[0]
    # merge the communication intervals, then walk the busy intervals along each merged one
    for k in range(starts.shape[0] + 1):
        if k < starts.shape[0] and starts[k] <= current_end:
            if ends[k] > current_end:
                current_end = ends[k]
            continue
        if current_end > current_start:
            while j < num_busy and busy_ends[j] <= current_start:
                j += 1
            i = j
            while i < num_busy and busy_starts[i] < current_end:
                lo = max(current_start, busy_starts[i])
                hi = min(current_end, busy_ends[i])
                if hi > lo:
                    total += hi - lo
                i += 1
        if k < starts.shape[0]:
            current_start = starts[k]
            current_end = ends[k]
    return total


def communication_per_device(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) communication time of each device (see the module docstring)."""
    num_devices = timeline.num_devices
    exposed = np.zeros(num_devices)
    hidden = np.zeros(num_devices)
    transfers = timeline.transfers
    if not len(transfers):
        return exposed, hidden
    # every device's transfers (as sender, receiver or all-reduce member) by start, then index
    both = transfers.dst_device != transfers.src_device
    index = np.concatenate([np.arange(len(transfers)), np.flatnonzero(both)])
    device_of = np.concatenate([transfers.src_device, transfers.dst_device[both]])
    order = index[np.lexsort((index, transfers.start[index], device_of))]
    bounds = np.searchsorted(np.sort(device_of), np.arange(num_devices + 1))
    starts, ends = transfers.start[order], transfers.end[order]
    # every device's ops by start time (a stable sort: ties keep row order)
    rows = np.lexsort((timeline.op_start, timeline.op_device))
    row_bounds = np.searchsorted(timeline.op_device[rows], np.arange(num_devices + 1))
    busy_starts, busy_ends = timeline.op_start[rows], timeline.op_end[rows]
    for device in range(num_devices):
        lo, hi = bounds[device], bounds[device + 1]
        if lo == hi:
            continue
        first, last = row_bounds[device], row_bounds[device + 1]
        overlap = _overlap_with_busy(starts[lo:hi], ends[lo:hi], busy_starts[first:last], busy_ends[first:last])
        union = _union_length(starts[lo:hi], ends[lo:hi])
        hidden[device] = overlap
        exposed[device] = union - overlap
    return exposed, hidden


def allreduce_per_device(timeline: Timeline) -> np.ndarray:
    """Seconds (or slots) each device spends in gradient all-reduces: between stage replicas
    (Chimera, DualPipe) and with its data-parallel peers."""
    from pipesched.timeline import ALLREDUCE

    transfers = timeline.transfers
    total = np.zeros(timeline.num_devices)
    reduces = np.flatnonzero(transfers.kind == ALLREDUCE)
    length = transfers.end[reduces] - transfers.start[reduces]
    np.add.at(total, transfers.src_device[reduces], length)
    pair = transfers.dst_device[reduces] != transfers.src_device[reduces]
    np.add.at(total, transfers.dst_device[reduces][pair], length[pair])
    return total


@dataclass(frozen=True)
class Metrics:
    """The figures of one timeline; times in ``unit``, memory in ``memory_unit``."""

    unit: str
    iteration_time: float
    bubble_ratio: float
    bubble_over_work: float
    bubble_per_device: tuple[float, ...]
    busy_per_device: tuple[float, ...]
    throughput_samples_per_s: float | None
    throughput_tokens_per_s: float | None
    mfu: float | None
    exposed_comm: tuple[float, ...]  # per device
    hidden_comm: tuple[float, ...]  # per device
    critical_path_ops: int  # compute ops on the critical path
    critical_path_transfers: int
    critical_path_compute: float
    critical_path_comm: float
    peak_memory: tuple[float, ...] | None  # per device
    memory_unit: str | None
    out_of_memory: tuple[bool, ...] | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    timeline: Timeline,
    *,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    flops_per_iteration: float | None = None,
    peak_flops: float | list[float] | tuple[float, ...] | None = None,
) -> Metrics:
    """Every metric of ``timeline``. Throughput needs seconds; MFU also needs the model's
    FLOPs per iteration and the devices' peak FLOP/s."""
    seconds = timeline.unit == "s"
    samples, tokens = throughput(timeline, micro_batch_size=micro_batch_size, seq_len=seq_len) if seconds else (None, None)
    utilization = None
    if seconds and flops_per_iteration is not None and peak_flops is not None:
        utilization = mfu(timeline, flops_per_iteration=flops_per_iteration, peak_flops=peak_flops)
    exposed, hidden = communication_per_device(timeline)
    path: CriticalPath = critical_path(timeline)
    memory = timeline.memory
    return Metrics(
        unit=timeline.unit,
        iteration_time=timeline.makespan,
        bubble_ratio=bubble_ratio(timeline),
        bubble_over_work=bubble_over_work(timeline),
        bubble_per_device=tuple(float(x) for x in bubble_per_device(timeline)),
        busy_per_device=tuple(float(x) for x in timeline.busy_per_device()),
        throughput_samples_per_s=samples,
        throughput_tokens_per_s=tokens,
        mfu=utilization,
        exposed_comm=tuple(float(x) for x in exposed),
        hidden_comm=tuple(float(x) for x in hidden),
        critical_path_ops=int((~path.is_transfer).sum()),
        critical_path_transfers=int(path.is_transfer.sum()),
        critical_path_compute=path.compute_time(timeline),
        critical_path_comm=path.transfer_time(timeline),
        peak_memory=memory.peak if memory is not None else None,
        memory_unit=memory.unit if memory is not None else None,
        out_of_memory=memory.out_of_memory if memory is not None else None,
    )


__all__ = [
    "Metrics",
    "allreduce_per_device",
    "bubble_over_work",
    "bubble_per_device",
    "bubble_ratio",
    "communication_per_device",
    "critical_path",
    "iteration_time",
    "mfu",
    "summarize",
    "throughput",
]
