"""Chrome / Perfetto trace (the JSON trace event format) of one or several timelines.

Layout in the viewer:
- one process per device (``pid``), named ``<schedule> · device <d>``;
- in it, thread 1 ``compute`` with one complete event (``ph: X``) per op, and one thread
  per communication channel the device sends on, with one complete event per transfer;
- after the devices, one process ``<schedule> · critical path`` whose one thread repeats
  the ops and transfers of the critical path (``simulate.critical_path``) in time order;
- every op and transfer names itself in ``args.event`` (``op 12``: op row 12, ``transfer
  3``; prefixed ``t1 `` and so on for the second timeline of a trace), says whether it is on
  the critical path (``args.critical``) and, for an op, what it waited for: in words
  (``waited for``) and as the event that released it (``waited for event``, absent for the
  ops that start the iteration); a transfer names the op that produced its data and the op
  that consumes it (``producer``, ``consumer``; absent for an all-reduce);
- flow arrows (``ph: s`` then ``ph: f``, same ``id``, bound to the enclosing slices), by
  category: ``send`` from each producing op to its transfer, ``dependency`` from each
  transfer to the op that receives it (a timeline without transfers, the slot table, gets
  ``dependency`` flows from each producing op to its consumer on another device instead),
  and ``same device`` from an op to a later op on its own device that needs its output
  (F to its backward, I to W, F to an offload, an offload to its reload);
- counter tracks (``ph: C``) ``memory`` per device when the timeline has a memory trace,
  ``memory capacity`` beside it when the device's capacity is known, and an instant event
  (``ph: i``) ``out of memory`` each time a device's memory passes its capacity.

A prediction and a measurement of the same schedule (``comparison_trace_document``) go in
one file as two processes per device, side by side in the viewer: ``<schedule> · device
<d> · predicted`` and ``... · measured``, each on its own iteration clock.

Timestamps are microseconds from the start of the iteration. Slot tables have no real
time: one slot is drawn as 1000 us, and ``otherData`` says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import Stream, TimeUnit
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_TRACE_TASKS
from pipesched.render.style import LISTED_REQUESTS, TRANSFER_NAMES, device_names, kind_styles
from pipesched.render.waits import wait_texts
from pipesched.simulate.critical import critical_path
from pipesched.timeline import Timeline
from pipesched.waits import WAIT_NONE, WAIT_TRANSFER, row_dependencies, waited_for

# microseconds per timeline unit
MICROSECONDS = {TimeUnit.SECONDS: 1e6, TimeUnit.SLOT: 1000.0}
COMPUTE_TID = 1
# flow categories: a transfer (or a cross-device input) to its consumer, a producing op to
# its transfer, an op to the later op of its own device that needs its output
FLOW_CATEGORY = "dependency"
SEND_CATEGORY = "send"
LOCAL_CATEGORY = "same device"
CRITICAL_CATEGORY = "critical path"


def trace_document(timelines: Sequence[Timeline]) -> dict:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "otherData": {...}}``."""
    require(len(timelines) >= 1, "timelines", 0, "give at least one timeline to trace")
    check_trace_size(timelines)
    events: list[dict] = []
    next_pid = 1
    flow_ids = iter(range(1, 1 << 62))
    several = len(timelines) > 1
    for index, timeline in enumerate(timelines):
        require(timeline.unit in MICROSECONDS, "unit", timeline.unit, "timeline unit must be 's' or 'slot'")
        pids = [next_pid + d for d in range(timeline.num_devices)]
        events.extend(_timeline_events(timeline, pids=pids, critical_pid=next_pid + timeline.num_devices,
                                       flow_ids=flow_ids, prefix=f"t{index} " if several else ""))
        next_pid += timeline.num_devices + 1
    return _document(events, timelines)


def comparison_trace_document(pairs: Sequence[tuple[Timeline, Timeline]]) -> dict:
    """Predicted and measured timelines of each schedule as one trace: per schedule, from
    its first process ``k``, process ``k + 2d`` is device d's prediction and ``k + 2d + 1``
    its measurement, then the prediction's and the measurement's critical paths (module
    docstring)."""
    require(len(pairs) >= 1, "timelines", 0, "give at least one predicted and measured pair to trace")
    check_trace_size([timeline for pair in pairs for timeline in pair])
    events: list[dict] = []
    next_pid = 1
    flow_ids = iter(range(1, 1 << 62))
    tags = iter(range(2 * len(pairs)))
    for predicted, measured in pairs:
        for timeline in (predicted, measured):
            require(timeline.unit in MICROSECONDS, "unit", timeline.unit, "timeline unit must be 's' or 'slot'")
        devices = max(predicted.num_devices, measured.num_devices)
        for side, (timeline, suffix) in enumerate(((predicted, " · predicted"), (measured, " · measured"))):
            pids = [next_pid + 2 * d + side for d in range(timeline.num_devices)]
            events.extend(_timeline_events(timeline, pids=pids, critical_pid=next_pid + 2 * devices + side,
                                           flow_ids=flow_ids, suffix=suffix, prefix=f"t{next(tags)} "))
        next_pid += 2 * devices + 2
    return _document(events, [t for pair in pairs for t in pair])


def check_trace_size(timelines: Sequence[Timeline]) -> None:
    """Refuse a trace of more than MAX_TRACE_TASKS ops and transfers, before its events are built."""
    tasks = sum(len(timeline) + len(timeline.transfers) for timeline in timelines)
    if tasks > MAX_TRACE_TASKS:
        raise PipeschedError(f"trace={tasks:,} ops and transfers: over the limit of {MAX_TRACE_TASKS:,} one trace "
                             "draws; trace a smaller table (lower p, m or v), or draw it with --png")


def render_comparison_trace(pairs: Sequence[tuple[Timeline, Timeline]]) -> str:
    """``comparison_trace_document`` as compact JSON text."""
    return json.dumps(comparison_trace_document(pairs), separators=(",", ":"))


def _document(events: list[dict], timelines: Sequence[Timeline]) -> dict:
    units = sorted({t.unit for t in timelines})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "pipesched",
            "time unit": "; ".join(
                "timestamps in microseconds" if unit == TimeUnit.SECONDS else "1 slot = 1000 us (slot tables have no real time)"
                for unit in units
            ),
            "schedules": ", ".join(f"{t.schedule.name} ({t.source})" for t in timelines),
        },
    }


def render_trace(timelines: Sequence[Timeline]) -> str:
    """The trace as compact JSON text."""
    return json.dumps(trace_document(timelines), separators=(",", ":"))


def _timeline_events(timeline: Timeline, *, pids: Sequence[int], critical_pid: int, flow_ids, suffix: str = "",
                     prefix: str = "") -> list[dict]:
    """The events of one timeline, device d in process ``pids[d]`` named ``<schedule> ·
    device <d><suffix>``, its critical path in process ``critical_pid``; event names in
    ``args.event`` start with ``prefix``."""
    per_unit = MICROSECONDS[timeline.unit]
    origin = timeline.origin

    def stamp(time: float) -> float:
        return round((time - origin) * per_unit, 3)

    pid_of = list(pids)
    threads = _Threads.of(timeline)
    path = critical_path(timeline)
    deps = row_dependencies(timeline)
    events = _process_names(timeline, pid_of, suffix) + _thread_names(timeline, threads, pid_of)
    ops = _op_slices(timeline, threads, pid_of, stamp, prefix)
    sends = _transfer_slices(timeline, threads, pid_of, stamp, prefix)
    events += _op_events(timeline, ops, sends, path)
    events += _transfer_events(timeline, sends, ops, deps, path)
    events += _flows(timeline, deps, ops, sends, flow_ids)
    events += _critical_track(timeline, path, critical_pid, ops, sends, suffix)
    events += _counters(timeline, pid_of, stamp)
    return events


@dataclass(frozen=True)
class _Threads:
    """Which thread each op and transfer row goes on. Slices on one thread must not
    overlap, so overlapping ops (an overlapped F&B pair) or transfers sharing a channel go
    to extra lanes: threads "compute 2", "send ... 2". A device's host-link ops (offloads,
    reloads) have their own thread, "host link"."""

    tid: dict[tuple[int, int, int], int]  # (device, channel or HOST_CHANNEL or -1: compute, lane) -> tid
    op: list[int]  # tid of each op row
    transfer: list[int]  # tid of each transfer row

    @classmethod
    def of(cls, timeline: Timeline) -> _Threads:
        table = timeline.transfers
        on_host = ~timeline.on_compute
        op_lane = _lanes(timeline.op_device.astype(np.int64) * 2 + on_host, timeline.op_start, timeline.op_end)
        transfer_group = table.src_device.astype(np.int64) * (1 + int(table.channel.max(initial=0))) + table.channel
        transfer_lane = _lanes(transfer_group, table.start, table.end)
        threads: dict[tuple[int, int, int], int] = {}
        for device in range(timeline.num_devices):
            lanes = int(op_lane[(timeline.op_device == device) & ~on_host].max(initial=0)) + 1
            for lane in range(lanes):
                threads[(device, -1, lane)] = COMPUTE_TID + lane
            mine = (timeline.op_device == device) & on_host
            for lane in range(int(op_lane[mine].max(initial=-1)) + 1):
                threads[(device, HOST_CHANNEL, lane)] = COMPUTE_TID + lanes + lane
        for src, channel, lane in sorted(set(zip(table.src_device.tolist(), table.channel.tolist(),
                                                  transfer_lane.tolist(), strict=True))):
            threads[(src, channel, lane)] = 1 + max(tid for (d, _, _), tid in threads.items() if d == src)
        op_tid = [threads[(d, HOST_CHANNEL if host else -1, lane)] for d, lane, host in
                  zip(timeline.op_device.tolist(), op_lane.tolist(), on_host.tolist(), strict=True)]
        transfer_tid = [threads[(s, c, lane)] for s, c, lane in
                        zip(table.src_device.tolist(), table.channel.tolist(), transfer_lane.tolist(), strict=True)]
        return cls(threads, op_tid, transfer_tid)


def _process_names(timeline: Timeline, pid_of: list[int], suffix: str) -> list[dict]:
    """One process per device, ``<schedule> · device <d><suffix>``, sorted by its pid."""
    events = []
    names = device_names(timeline)
    for device, pid in enumerate(pid_of):
        events += [
            _meta("process_name", pid, 0, name=f"{timeline.schedule.name} · {names[device]}{suffix}"),
            _meta("process_sort_index", pid, 0, sort_index=pid),
        ]
    return events


def _thread_names(timeline: Timeline, threads: _Threads, pid_of: list[int]) -> list[dict]:
    """Each thread's name (``compute``, ``host link``, ``send <channel>``; a later lane's
    number after it) and its place in the device's process."""
    table = timeline.transfers
    events = []
    for (device, channel, lane), tid in threads.tid.items():
        if channel == HOST_CHANNEL:
            label = Stream.HOST_LINK
        elif channel < 0:
            label = Stream.COMPUTE
        else:
            label = "send " + (table.channel_names[channel] if channel < len(table.channel_names)
                               else f"channel {channel}")
        label += f" {lane + 1}" if lane else ""
        events += [
            _meta("thread_name", pid_of[device], tid, name=label),
            _meta("thread_sort_index", pid_of[device], tid, sort_index=tid),
        ]
    return events


def _op_names(timeline: Timeline) -> list[str]:
    """The op text of each row, 2F0 as everywhere in pipesched (the kind's letter in the
    timeline's rules); a fused op's first part carries the fused op's text, its later parts
    (no duration) their own."""
    letters = kind_styles(timeline.schedule.rules).letters
    names = [f"{s}{letters[k]}{mb}" for s, k, mb in zip(timeline.op_stage.tolist(), timeline.op_kind.tolist(),
                                                         timeline.op_microbatch.tolist(), strict=True)]
    for row in np.flatnonzero(timeline.box_kind != timeline.op_kind).tolist():
        names[row] = str(timeline.entry(row))
    return names


def _op_slices(timeline: Timeline, threads: _Threads, pid_of: list[int], stamp, prefix: str) -> _Slices:
    return _Slices(_op_names(timeline), [f"{prefix}op {row}" for row in range(len(timeline))],
                   [pid_of[d] for d in timeline.op_device.tolist()], threads.op,
                   [stamp(t) for t in timeline.op_start.tolist()], [stamp(t) for t in timeline.op_end.tolist()])


def _transfer_slices(timeline: Timeline, threads: _Threads, pid_of: list[int], stamp, prefix: str) -> _Slices:
    """Transfers on their sender's channel thread, named by kind and microbatch (``activation
    mb3``; an all-reduce by its kind alone)."""
    table = timeline.transfers
    names = [f"{TRANSFER_NAMES[kind]} mb{mb}" if mb >= 0 else TRANSFER_NAMES[kind]
             for kind, mb in zip(table.kind.tolist(), table.microbatch.tolist(), strict=True)]
    return _Slices(names, [f"{prefix}transfer {row}" for row in range(len(table))],
                   [pid_of[d] for d in table.src_device.tolist()], threads.transfer,
                   [stamp(t) for t in table.start.tolist()], [stamp(t) for t in table.end.tolist()])


def _on_path(path, count: int, *, transfers: bool) -> list[bool]:
    """Whether each op (or transfer) row is on the critical path."""
    critical = np.zeros(count, bool)
    critical[path.row[path.is_transfer if transfers else ~path.is_transfer]] = True
    return critical.tolist()


def _op_events(timeline: Timeline, ops: _Slices, sends: _Slices, path) -> list[dict]:
    """One complete event per op, in row order, in its kind's category (the kind's name in
    the timeline's rules), with what it waited for in words and as an event."""
    styles = kind_styles(timeline.schedule.rules)
    waits = waited_for(timeline)
    wait_words = wait_texts(timeline, waits)
    waited_event = [None if code == WAIT_NONE else (sends.event if code == WAIT_TRANSFER else ops.event)[ref]
                    for code, ref in zip(waits.cause.tolist(), waits.ref.tolist(), strict=True)]
    kinds, stages, microbatches = (timeline.box_kind.tolist(), timeline.op_stage.tolist(),
                                   timeline.op_microbatch.tolist())
    critical = _on_path(path, len(timeline), transfers=False)
    batches = batch_texts(timeline)
    events = []
    for row in range(len(timeline)):
        kind = kinds[row]
        events.append({
            "name": ops.name[row],
            "cat": styles.names[kind],
            "ph": "X",
            "ts": ops.start[row],
            "dur": round(ops.end[row] - ops.start[row], 3),
            "pid": ops.pid[row],
            "tid": ops.tid[row],
            "args": {
                "event": ops.event[row],
                "stage": stages[row],
                "microbatch": microbatches[row],
                "kind": styles.letters[kind],
                "critical": critical[row],
                "waited for": wait_words[row],
                **({"waited for event": waited_event[row]} if waited_event[row] is not None else {}),
                **(batches[microbatches[row]] if batches else {}),
            },
        })
    return events


def batch_texts(timeline: Timeline) -> list[dict]:
    """Per microbatch of a serving timeline, what its iteration batched (empty for any other
    timeline): the run's batch number, its instance, its requests (the first LISTED_REQUESTS
    trace rows), prefill tokens, decodes and the KV tokens they read."""
    info = timeline.serving
    if info is None:
        return []
    found = []
    for mb in range(len(info.batch)):
        members = info.members[info.offsets[mb]:info.offsets[mb + 1]]
        found.append({"batch": int(info.batch[mb]), "instance": int(info.instance[mb]),
                      "requests": int(members.size), "request rows": members[:LISTED_REQUESTS].tolist(),
                      "prefill tokens": int(info.prefill_tokens[mb]), "decodes": int(info.decodes[mb]),
                      "kv tokens read": int(info.kv_tokens[mb])})
    return found


def _transfer_events(timeline: Timeline, sends: _Slices, ops: _Slices, deps, path) -> list[dict]:
    """One complete event per transfer, on the sender's channel thread, naming the ops that
    produce and consume its data."""
    table = timeline.transfers
    critical = _on_path(path, len(table), transfers=True)
    # a serving timeline's KV-cache moves carry one request each
    requests = (timeline.serving.transfer_request.tolist() if timeline.serving is not None
                else [-1] * len(table))
    events = []
    for row in range(len(table)):
        src, dst = int(table.src_device[row]), int(table.dst_device[row])
        producer, consumer = int(deps.producer[row]), int(deps.consumer[row])
        events.append({
            "name": sends.name[row],
            "cat": "transfer",
            "ph": "X",
            "ts": sends.start[row],
            "dur": round(sends.end[row] - sends.start[row], 3),
            "pid": sends.pid[row],
            "tid": sends.tid[row],
            "args": {"event": sends.event[row], "src device": src, "dst device": dst, "stage": int(table.stage[row]),
                     "microbatch": int(table.microbatch[row]), "bytes": float(table.nbytes[row]),
                     "critical": critical[row],
                     **({"request": requests[row]} if requests[row] >= 0 else {}),
                     **({"producer": ops.event[producer]} if producer >= 0 else {}),
                     **({"consumer": ops.event[consumer]} if consumer >= 0 else {})},
        })
    return events


@dataclass(frozen=True)
class _Slices:
    """Where each op (or transfer) row sits in the trace: its name, event name
    (``args.event``), process, thread, start and end in microseconds."""

    name: list[str]
    event: list[str]
    pid: list[int]
    tid: list[int]
    start: list[float]
    end: list[float]

    def middle(self, row: int) -> float:
        return (self.start[row] + self.end[row]) / 2


def _flows(timeline: Timeline, deps, ops: _Slices, sends: _Slices, flow_ids) -> list[dict]:
    """Flow arrows, each an ``s`` inside the sending slice and an ``f`` inside the receiving
    one (timestamps at slice middles so they bind to the enclosing slice unambiguously).
    Arrows start and end on the drawn slice of a fused op: the row of its first part."""
    head = (timeline.op_entry.astype(np.int64) if timeline.op_entry is not None
            else np.arange(len(timeline), dtype=np.int64))
    device = timeline.op_device
    # (category, sender slices, sender row, receiver slices, receiver row, flow name)
    arrows: list[tuple[str, _Slices, int, _Slices, int, str]] = []
    if len(timeline.transfers):
        for transfer, (producer, consumer) in enumerate(zip(deps.producer.tolist(), deps.consumer.tolist(),
                                                            strict=True)):
            if producer >= 0:
                arrows.append((SEND_CATEGORY, ops, int(head[producer]), sends, transfer,
                               f"sends {sends.name[transfer]}"))
            if consumer >= 0:
                arrows.append((FLOW_CATEGORY, sends, transfer, ops, int(head[consumer]),
                               f"to {ops.name[int(head[consumer])]}"))
    else:
        crossing = np.flatnonzero((deps.carried >= 0) & (device[np.maximum(deps.carried, 0)] != device))
        for row, producer in zip(crossing.tolist(), deps.carried[crossing].tolist(), strict=True):
            arrows.append((FLOW_CATEGORY, ops, int(head[producer]), ops, int(head[row]),
                           f"to {ops.name[int(head[row])]}"))
    for inputs in (deps.local, deps.carried):
        near = np.flatnonzero((inputs >= 0) & (device[np.maximum(inputs, 0)] == device)
                              & (head[np.maximum(inputs, 0)] != head))
        for row, producer in zip(near.tolist(), inputs[near].tolist(), strict=True):
            arrows.append((LOCAL_CATEGORY, ops, int(head[producer]), ops, int(head[row]),
                           f"to {ops.name[int(head[row])]}"))
    events = []
    for category, sender, source, receiver, target, name in arrows:
        flow = next(flow_ids)
        events.append({"name": name, "cat": category, "ph": "s", "id": flow,
                       "ts": round(sender.middle(source), 3), "pid": sender.pid[source], "tid": sender.tid[source]})
        events.append({"name": name, "cat": category, "ph": "f", "bp": "e", "id": flow,
                       "ts": round(receiver.middle(target), 3), "pid": receiver.pid[target],
                       "tid": receiver.tid[target]})
    return events


def _critical_track(timeline: Timeline, path, pid: int, ops: _Slices, sends: _Slices, suffix: str) -> list[dict]:
    """The critical path's tasks, in time order, on the one thread of process ``pid``; each
    names the op or transfer it repeats (``args.event``) and the device it ran on."""
    events = [_meta("process_name", pid, 0, name=f"{timeline.schedule.name} · critical path{suffix}"),
              _meta("process_sort_index", pid, 0, sort_index=pid),
              _meta("thread_name", pid, COMPUTE_TID, name="critical path")]
    for is_transfer, row in zip(path.is_transfer.tolist(), path.row.tolist(), strict=True):
        where, device = ((sends, int(timeline.transfers.src_device[row])) if is_transfer
                         else (ops, int(timeline.op_device[row])))
        events.append({"name": where.name[row], "cat": CRITICAL_CATEGORY, "ph": "X", "ts": where.start[row],
                       "dur": round(where.end[row] - where.start[row], 3), "pid": pid, "tid": COMPUTE_TID,
                       "args": {"event": where.event[row], "device": device}})
    return events


def _counters(timeline, pid_of, stamp) -> list[dict]:
    """Memory in use per device, one counter sample per step of the memory trace; host
    memory of offloaded activations likewise, as the counter ``host memory``. Where a
    device's capacity is known: a ``memory capacity`` counter (at the start and the end) and
    an ``out of memory`` instant each time its memory rises past the capacity."""
    events = []
    for name, memory in (("memory", timeline.memory), ("host memory", timeline.host_memory)):
        if memory is None:
            continue
        key = memory.unit
        for device, (times, values) in enumerate(zip(memory.times, memory.values, strict=True)):
            for time, value in zip(np.asarray(times).tolist(), np.asarray(values).tolist(), strict=True):
                events.append({"name": name, "ph": "C", "ts": stamp(time), "pid": pid_of[device],
                               "args": {key: value}})
    memory = timeline.memory
    if memory is None or memory.capacity is None:
        return events
    end = stamp(timeline.origin + timeline.makespan)
    for device, capacity in enumerate(memory.capacity):
        pid = pid_of[device]
        events += [{"name": "memory capacity", "ph": "C", "ts": ts, "pid": pid, "args": {memory.unit: capacity}}
                   for ts in (0.0, end)]
        values = np.asarray(memory.values[device], np.float64)
        over = values > capacity
        passes = np.flatnonzero(over & ~np.concatenate([[False], over[:-1]]))
        times = np.asarray(memory.times[device], np.float64)
        for step in passes.tolist():
            events.append({"name": "out of memory", "cat": "memory", "ph": "i", "s": "p",
                           "ts": stamp(float(times[step])), "pid": pid, "tid": COMPUTE_TID,
                           "args": {memory.unit: float(values[step]), "capacity": capacity,
                                    "over by": float(values[step] - capacity)}})
    return events


# the thread key of a device's host link (channels are >= 0, the compute stream -1)
HOST_CHANNEL = -2


def _lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lane of each interval within its group: the first lane free at its start (greedy
    interval partitioning), so intervals in one lane never overlap."""
    lane = np.zeros(len(start), np.int64)
    lane_ends: dict[int, list[float]] = {}
    for row in np.lexsort((end, start)).tolist():
        ends = lane_ends.setdefault(int(group[row]), [])
        free = next((k for k, busy_until in enumerate(ends) if busy_until <= start[row]), len(ends))
        if free == len(ends):
            ends.append(0.0)
        ends[free] = float(end[row])
        lane[row] = free
    return lane


def _meta(what: str, pid: int, tid: int, **args: object) -> dict:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": args}
