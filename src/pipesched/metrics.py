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
- iteration time: of a timeline of several iterations back to back, the steady-state
  iteration (``Timeline.iteration_time``); busy time, bubbles, communication and rates are
  then those of one such iteration.
- throughput (``throughput``, the one rule every command uses): samples per second = d x m
  x micro-batch size / iteration time, with d the data-parallel pipeline replicas and m the
  (whole) microbatches of one iteration (``iteration_microbatches``); tokens per second =
  samples x sequence length.
- MFU (model FLOPs utilization, as PaLM and Megatron-LM define it): the model FLOPs of one
  iteration (forward and backward of every sample, 6N + attention per token: no recompute)
  over iteration time x devices x peak FLOP/s per device. HFU (hardware FLOPs utilization):
  the same with the FLOPs the devices execute, recompute included; the two differ by the
  recomputed forward work. With d replicas of p devices of t tensor-parallel ranks this is
  d x one pipeline's FLOPs over d x p x t devices' peak, the same as one pipeline's: callers
  give one pipeline's figures (``utilization``).
- communication of device d: the union of the intervals in which a transfer it sends or
  receives (or an all-reduce it takes part in) is in flight. Exposed communication is the
  part of it during which d does not compute; hidden communication is the part that
  overlaps d's compute (its compute stream: the offloads and reloads on its host link run
  beside it and neither hide nor expose communication). A blocking runtime (simulated
  without overlap) holds a device in its send and receive batches longer than its
  transfers fly: a sender waits for its receiver to post. There exposed communication is what blocks: the time each step of compute
  (``pipesched.simulate.blocking``) starts after both the op before it and every op whose
  output the step reads have ended (its batch: transfers, rendezvous, busy channels), plus
  the device's last batch after its last op. The wait for data not yet produced stays
  bubble.
- peak memory per device and out-of-memory flags: from the timeline's memory trace.
- training work per device (``training_work``): its frozen stages and their roles, the
  seconds of recompute inside its backward ops (``StageCosts.recompute_s``), the
  stage-microbatches it offloads and the bytes they move, the time its host link is busy,
  the time its compute stream waits for reloads beyond everything else it waited for
  (exposed offload time), and the peak of its host memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

from pipesched.dependencies import dependencies
from pipesched.enums import TimeUnit
from pipesched.errors import require
from pipesched.ops import O
from pipesched.simulate.blocking import step_heads
from pipesched.simulate.critical import CriticalPath, critical_path
from pipesched.timeline import ALLREDUCE, Timeline
from pipesched.waits import row_dependencies


def iteration_time(timeline: Timeline) -> float:
    """One (steady-state) iteration's time (``Timeline.iteration_time``)."""
    return timeline.iteration_time


def bubble_ratio(timeline: Timeline) -> float:
    """Idle compute time over (devices x iteration time), of one (steady-state) iteration."""
    return timeline.iteration_bubble_ratio()


def _idle_per_device(timeline: Timeline) -> np.ndarray:
    """Idle compute time of each device in one (steady-state) iteration."""
    return np.maximum(timeline.iteration_time - timeline.iteration_busy_per_device(), 0.0)


def bubble_per_device(timeline: Timeline) -> np.ndarray:
    """idle(d) / iteration time for each device."""
    total = timeline.iteration_time
    idle = _idle_per_device(timeline)
    return idle / total if total > 0 else np.zeros_like(idle)


def bubble_over_work(timeline: Timeline) -> float:
    """Idle compute time over busy compute time, summed over devices."""
    busy = timeline.iteration_busy_per_device().sum()
    return float(_idle_per_device(timeline).sum() / busy) if busy > 0 else 0.0


@dataclass(frozen=True)
class IterationWork:
    """What one iteration trains and computes: what throughput and utilization are rates of."""

    microbatches: float  # whole microbatches of one iteration of one pipeline (the user's m)
    micro_batch_size: int = 1  # samples per microbatch
    replicas: int = 1  # data-parallel pipelines, each training its own microbatches
    seq_len: int | None = None  # tokens per sample; None: no token rate
    model_flops: float | None = None  # one pipeline's model FLOPs per iteration (no recompute)
    hardware_flops: float | None = None  # one pipeline's executed FLOPs per iteration (recompute included)
    peak_flops: tuple[float, ...] | None = None  # peak FLOP/s of each device of one pipeline


@dataclass(frozen=True)
class Rates:
    """Throughput and utilization of one iteration (see the module docstring)."""

    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    hfu: float | None


def iteration_microbatches(timeline: Timeline) -> float:
    """Whole microbatches of one iteration of ``timeline`` (the span its iteration time
    measures): its table's microbatches x their size (half-size ones count half) over the
    iterations it ran back to back (``Timeline.iterations``).

    >>> from pipesched.generators import generate
    >>> from pipesched.simulate.iterations import steady_state
    >>> from pipesched.costs import StageCosts
    >>> found = steady_state(generate("pipedream", 4, 8, iterations=4), StageCosts.slots().broadcast(4))
    >>> found.timeline.schedule.num_microbatches, iteration_microbatches(found.timeline)
    (32, 8.0)
    """
    schedule = timeline.schedule
    return schedule.num_microbatches * schedule.microbatch_fraction / timeline.iterations


def throughput(iteration_time: float, *, microbatches: float, micro_batch_size: int = 1, replicas: int = 1,
               seq_len: int | None = None) -> tuple[float, float | None]:
    """(samples per second, tokens per second or None without ``seq_len``): ``replicas``
    pipelines each training ``microbatches`` x ``micro_batch_size`` samples per iteration.

    >>> throughput(2.0, microbatches=8, micro_batch_size=2, replicas=4, seq_len=10)
    (32.0, 320.0)
    """
    require(micro_batch_size >= 1, "micro_batch_size", micro_batch_size, "must be at least 1")
    require(replicas >= 1, "replicas", replicas, "must be at least 1")
    if iteration_time <= 0:
        return 0.0, (0.0 if seq_len else None)
    samples = replicas * microbatches * micro_batch_size / iteration_time
    return samples, (samples * seq_len if seq_len else None)


def utilization(iteration_time: float, *, flops_per_iteration: float,
                peak_flops: float | list[float] | tuple[float, ...], devices: int | None = None) -> float:
    """FLOPs of one iteration over (iteration time x the devices' summed peak FLOP/s): MFU
    with model FLOPs, HFU with hardware FLOPs. ``peak_flops`` is one value per device, or
    one device's peak with ``devices`` devices."""
    peaks = np.asarray(peak_flops, dtype=np.float64)
    if peaks.ndim == 0:
        peaks = np.full(devices or 1, float(peaks))
    capacity = iteration_time * float(peaks.sum())
    return flops_per_iteration / capacity if capacity > 0 else 0.0


def rates(iteration_time: float, work: IterationWork) -> Rates:
    """Throughput, MFU and HFU of an iteration of ``iteration_time`` seconds of ``work``."""
    samples, tokens = throughput(iteration_time, microbatches=work.microbatches, micro_batch_size=work.micro_batch_size,
                                 replicas=work.replicas, seq_len=work.seq_len)

    def of(flops: float | None) -> float | None:
        if flops is None or work.peak_flops is None:
            return None
        return utilization(iteration_time, flops_per_iteration=flops, peak_flops=work.peak_flops)

    return Rates(samples, tokens, of(work.model_flops), of(work.hardware_flops))


def timeline_work(timeline: Timeline, *, micro_batch_size: int = 1, seq_len: int | None = None,
                  model_flops: float | None = None, hardware_flops: float | None = None,
                  peak_flops: float | list[float] | tuple[float, ...] | None = None) -> IterationWork:
    """The work of one iteration of ``timeline``: its microbatches and its data-parallel
    replicas (``SimulationInfo.replicas``), with the given sizes and FLOPs."""
    replicas = timeline.simulation.replicas if timeline.simulation is not None else 1
    peaks = None
    if peak_flops is not None:
        peaks = tuple(float(x) for x in np.broadcast_to(np.asarray(peak_flops, dtype=np.float64),
                                                         (timeline.num_devices,)))
    return IterationWork(iteration_microbatches(timeline), micro_batch_size, replicas, seq_len,
                         model_flops, hardware_flops, peaks)


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


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals [starts, ends), in any order.

    >>> union_length(np.array([5.0, 0.0, 1.0]), np.array([6.0, 2.0, 3.0]))
    4.0
    """
    order = np.argsort(starts, kind="stable")
    return float(_union_length(np.ascontiguousarray(starts[order], np.float64),
                               np.ascontiguousarray(ends[order], np.float64)))


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
    transfers = timeline.transfers
    if not len(transfers):
        zeros = np.zeros(timeline.num_devices)
        return zeros, zeros.copy()
    # the compute stream's ops: a host link's offloads and reloads run beside them
    compute = timeline.on_compute
    exposed, hidden = _exposed_and_hidden(timeline.num_devices, transfers.src_device, transfers.dst_device,
                                          transfers.start, transfers.end, timeline.op_device[compute],
                                          timeline.op_start[compute], timeline.op_end[compute])
    if timeline.simulation is not None and not timeline.simulation.overlap:
        exposed = blocked_in_batches(timeline)
    return exposed, hidden


@njit(cache=True)
def _by_device(device, start, num_devices):
    """Row indices grouped by device (a counting sort), each group in start order, and the
    group offsets. Groups already in start order (a device's ops) are not sorted again."""
    n = device.shape[0]
    offsets = np.zeros(num_devices + 1, np.int64)
    for x in range(n):
        offsets[device[x] + 1] += 1
    for d in range(num_devices):
        offsets[d + 1] += offsets[d]
    fill = offsets[:-1].copy()
    rows = np.empty(n, np.int64)
    for x in range(n):
        rows[fill[device[x]]] = x
        fill[device[x]] += 1
    for d in range(num_devices):
        group = rows[offsets[d]:offsets[d + 1]]
        ordered = True
        for k in range(1, group.shape[0]):
            if start[group[k]] < start[group[k - 1]]:
                ordered = False
                break
        if not ordered:
            rows[offsets[d]:offsets[d + 1]] = group[np.argsort(start[group], kind="mergesort")]
    return rows, offsets


@njit(cache=True)
def _exposed_and_hidden(num_devices, src, dst, start, end, op_device, op_start, op_end):
    """Per device: the union of the intervals of the transfers it sends or receives, split
    into the part under its compute (hidden) and the rest (exposed)."""
    both = np.concatenate((src.astype(np.int64), dst.astype(np.int64)))
    starts = np.concatenate((start, start))
    ends = np.concatenate((end, end))
    comm, comm_at = _by_device(both, starts, num_devices)
    busy, busy_at = _by_device(op_device.astype(np.int64), op_start, num_devices)
    exposed = np.zeros(num_devices)
    hidden = np.zeros(num_devices)
    for d in range(num_devices):
        mine = comm[comm_at[d]:comm_at[d + 1]]
        if mine.shape[0] == 0:
            continue
        work = busy[busy_at[d]:busy_at[d + 1]]
        overlap = _overlap_with_busy(starts[mine], ends[mine], op_start[work], op_end[work])
        hidden[d] = overlap
        exposed[d] = _union_length(starts[mine], ends[mine]) - overlap
    return exposed, hidden


def blocked_in_batches(timeline: Timeline) -> np.ndarray:
    """Per device, the time a blocking runtime holds it in its send and receive batches
    beyond waiting for data to be produced (see the module docstring)."""
    n, origin = len(timeline), timeline.origin
    before = np.full(n, -1, np.int64)
    device_rows = [timeline.rows_of_device(device) for device in range(timeline.num_devices)]
    for rows in device_rows:
        before[rows[1:]] = rows[:-1]
    head = step_heads(timeline.schedule.rules, timeline.op_kind.astype(np.int64), before,
                      timeline.simulation.blocking_steps or "op")
    step_first = np.where(head, np.arange(n), before)
    # when the data of each step exist: its ops' producers outside the step have ended
    consumer, producer, _ = dependencies(timeline.schedule).edges
    outside = step_first[consumer] != producer
    ready = np.full(n, origin)
    np.maximum.at(ready, step_first[consumer[outside]], timeline.op_end[producer[outside]])
    finished = timeline.simulation.optimizer_step
    blocked = np.zeros(timeline.num_devices)
    for device, rows in enumerate(device_rows):
        if not rows.size:
            continue
        previous = np.concatenate([[origin], timeline.op_end[rows[:-1]]])
        waits = timeline.op_start[rows] - np.maximum(previous, ready[rows])
        # the last batch: the sends of the last step (and all-reduces) before the optimizer step
        blocked[device] = (float(np.clip(waits[head[rows]], 0.0, None).sum())
                           + max(0.0, finished[device] - timeline.op_end[rows[-1]]))
    return blocked


@dataclass(frozen=True)
class TrainingWork:
    """Frozen, recomputed and offloaded work per device (see the module docstring)."""

    frozen_stages: tuple[tuple[int, ...], ...]  # per device, its frozen stages
    frozen_roles: tuple[tuple[str, ...], ...]  # per device, the role of each of those stages
    recompute_s: tuple[float, ...]  # per device, forward time redone inside its backward ops
    offloaded: tuple[int, ...]  # per device, stage-microbatches offloaded
    offloaded_bytes: tuple[float, ...]  # per device, bytes moved to host memory (and back)
    host_link_busy_s: tuple[float, ...]  # per device, time its host link moves activations
    offload_exposed_s: tuple[float, ...]  # per device, compute waiting for reloads
    host_peak_bytes: tuple[float, ...]  # per device, most host memory its offloads hold

    @property
    def any(self) -> bool:
        """Whether anything is frozen, recomputed or offloaded."""
        return bool(any(self.frozen_stages) or any(self.recompute_s) or any(self.offloaded))

    def to_dict(self) -> dict:
        return asdict(self)


def offload_exposed(timeline: Timeline) -> np.ndarray:
    """Per device, the time its compute ops waited for reloads: for each backward whose
    activations came back from host memory, how much later than its other inputs and its
    device's previous op the reload ended."""
    exposed = np.zeros(timeline.num_devices)
    host = ~timeline.on_compute
    if not host.any():
        return exposed
    deps = row_dependencies(timeline)
    reloaded = np.flatnonzero((deps.local >= 0) & timeline.on_compute)
    reloaded = reloaded[host[deps.local[reloaded]]]
    if not reloaded.size:
        return exposed
    previous = np.full(len(timeline), -1, np.int64)
    for device in range(timeline.num_devices):
        rows = timeline.rows_of_device(device)
        previous[rows[1:]] = rows[:-1]
    ready = np.full(reloaded.shape[0], -np.inf)
    before = previous[reloaded]
    ready[before >= 0] = timeline.op_end[before[before >= 0]]
    carried = deps.carried[reloaded]
    delivery = deps.delivery[reloaded]
    arrives = np.where(delivery >= 0, timeline.transfers.end[np.maximum(delivery, 0)] if len(timeline.transfers) else 0.0,
                       timeline.op_end[np.maximum(carried, 0)])
    ready = np.where(carried >= 0, np.maximum(ready, arrives), ready)
    ready = np.maximum(ready, timeline.origin)
    wait = np.maximum(timeline.op_start[reloaded] - ready, 0.0)
    np.add.at(exposed, timeline.op_device[reloaded], wait)
    return exposed


def training_work(timeline: Timeline) -> TrainingWork:
    """Frozen, recomputed and offloaded work of each device of ``timeline``."""
    schedule, rules, count = timeline.schedule, timeline.schedule.rules, timeline.num_devices
    frozen_on = [sorted({stage for replica in schedule.placement.replicas for stage, d in enumerate(replica)
                         if d == device and stage in schedule.frozen}) for device in range(count)]
    offloads = np.array([rule.kind == O for rule in rules])[timeline.op_kind]
    # the ops whose time includes the forward redone by recompute: I, and B
    redo = np.array([rule.cost in ("backward_input", "backward") for rule in rules])[timeline.op_kind]
    host = ~timeline.on_compute
    costs = timeline.simulation.costs if timeline.simulation is not None else None
    recompute = np.zeros(count)
    moved = np.zeros(count)
    if costs is not None and costs.recompute_s is not None:
        np.add.at(recompute, timeline.op_device[redo], np.asarray(costs.recompute_s)[timeline.op_stage[redo]])
    if costs is not None:
        np.add.at(moved, timeline.op_device[offloads], np.asarray(costs.activation_bytes)[timeline.op_stage[offloads]])
    busy = np.bincount(timeline.op_device, weights=np.where(host, timeline.op_end - timeline.op_start, 0.0),
                       minlength=count)
    host_peaks = timeline.host_memory.peak if timeline.host_memory is not None else (0.0,) * count
    return TrainingWork(
        frozen_stages=tuple(tuple(stages) for stages in frozen_on),
        frozen_roles=tuple(tuple(schedule.roles[stage] for stage in stages) for stages in frozen_on),
        recompute_s=tuple(float(x) for x in recompute),
        offloaded=tuple(int(x) for x in np.bincount(timeline.op_device[offloads], minlength=count)),
        offloaded_bytes=tuple(float(x) for x in moved),
        host_link_busy_s=tuple(float(x) for x in busy),
        offload_exposed_s=tuple(float(x) for x in offload_exposed(timeline)),
        host_peak_bytes=tuple(float(x) for x in host_peaks),
    )


def allreduce_per_device(timeline: Timeline) -> np.ndarray:
    """Seconds (or slots) each device spends in gradient all-reduces: between stage replicas
    (Chimera, DualPipe) and with its data-parallel peers."""
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
    mfu: float | None  # model FLOPs utilization (no recompute)
    hfu: float | None  # hardware FLOPs utilization (recompute included)
    exposed_comm: tuple[float, ...]  # per device
    hidden_comm: tuple[float, ...]  # per device
    critical_path_ops: int  # compute ops on the critical path
    critical_path_transfers: int
    critical_path_compute: float
    critical_path_comm: float
    peak_memory: tuple[float, ...] | None  # per device
    memory_unit: str | None
    out_of_memory: tuple[bool, ...] | None
    training: TrainingWork | None = None  # frozen, recomputed and offloaded work per device

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    timeline: Timeline,
    *,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    flops_per_iteration: float | None = None,
    peak_flops: float | list[float] | tuple[float, ...] | None = None,
    hardware_flops_per_iteration: float | None = None,
) -> Metrics:
    """Every metric of one (steady-state) iteration of ``timeline``. Throughput needs
    seconds; MFU also needs the model FLOPs of one iteration (``flops_per_iteration``, no
    recompute) and the devices' peak FLOP/s, HFU the FLOPs they execute
    (``hardware_flops_per_iteration``). Peak memory and the critical path are the whole
    timeline's."""
    seconds = timeline.unit == TimeUnit.SECONDS
    time = timeline.iteration_time
    found = None
    if seconds:
        found = rates(time, timeline_work(timeline, micro_batch_size=micro_batch_size, seq_len=seq_len,
                                          model_flops=flops_per_iteration, hardware_flops=hardware_flops_per_iteration,
                                          peak_flops=peak_flops))
    exposed, hidden = communication_per_device(timeline)
    k = timeline.iterations
    path: CriticalPath = critical_path(timeline)
    memory = timeline.memory
    return Metrics(
        unit=timeline.unit,
        iteration_time=time,
        bubble_ratio=bubble_ratio(timeline),
        bubble_over_work=bubble_over_work(timeline),
        bubble_per_device=tuple(float(x) for x in bubble_per_device(timeline)),
        busy_per_device=tuple(float(x) for x in timeline.iteration_busy_per_device()),
        throughput_samples_per_s=found.samples_per_s if found is not None else None,
        throughput_tokens_per_s=found.tokens_per_s if found is not None else None,
        mfu=found.mfu if found is not None else None,
        hfu=found.hfu if found is not None else None,
        exposed_comm=tuple(float(x) / k for x in exposed),
        hidden_comm=tuple(float(x) / k for x in hidden),
        critical_path_ops=int((~path.is_transfer).sum()),
        critical_path_transfers=int(path.is_transfer.sum()),
        critical_path_compute=path.compute_time(timeline),
        critical_path_comm=path.transfer_time(timeline),
        peak_memory=memory.peak if memory is not None else None,
        memory_unit=memory.unit if memory is not None else None,
        out_of_memory=memory.out_of_memory if memory is not None else None,
        training=training_work(timeline),
    )


__all__ = [
    "IterationWork",
    "Metrics",
    "Rates",
    "TrainingWork",
    "allreduce_per_device",
    "blocked_in_batches",
    "bubble_over_work",
    "bubble_per_device",
    "bubble_ratio",
    "communication_per_device",
    "critical_path",
    "iteration_microbatches",
    "iteration_time",
    "offload_exposed",
    "rates",
    "summarize",
    "throughput",
    "timeline_work",
    "training_work",
    "utilization",
]
