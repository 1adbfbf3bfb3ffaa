"""Where a schedule's bubble comes from: every idle gap of every device's compute stream,
split into what it waited for.

A device's idle time is the part of the timeline's span (``Timeline.makespan``, from its
first op's start) in which its compute stream runs nothing. Each gap is classified by the op
that ends it and the cause of that op's start (``pipesched.waits``):

- warm-up and cool-down: before the device's first op, after its last one;
- exposed communication: the part of a gap during which the transfer that carries the
  op's input (activation or gradient from another device) is in flight;
- memory waits: in a gap ended by an op that waited for an op of its device's host link
  (its activations reloaded from host memory: an ``R`` op under the default rules), the
  part after its other input was there (the time ``metrics.offload_exposed`` counts);
- dependency stalls: the rest (waiting for a producing op that has not ended yet).

The four parts of every gap sum to its length, so the parts of a timeline sum to its total
idle time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.timeline import Timeline
from pipesched.waits import WAIT_DEPENDENCY, WAIT_TRANSFER, row_dependencies, waited_for

# the parts of a bubble, in the order of BubbleBreakdown.parts' columns
WARMUP_COOLDOWN, DEPENDENCY_STALL, EXPOSED_COMMUNICATION, MEMORY_WAIT = 0, 1, 2, 3
BUBBLE_PARTS = ("warm-up and cool-down", "dependency stalls", "exposed communication", "memory waits")


@dataclass(frozen=True)
class BubbleBreakdown:
    """Every idle gap of the timeline's compute streams (times in its unit, absolute like
    the timeline's), and how long each waited for what."""

    device: np.ndarray  # int64 per gap
    start: np.ndarray  # float64 per gap
    end: np.ndarray  # float64 per gap
    row: np.ndarray  # int64 per gap: the op row that ends it (-1: the device's cool-down)
    parts: np.ndarray  # float64 (gaps, 4): time of each BUBBLE_PARTS part in the gap

    @property
    def totals(self) -> np.ndarray:
        """Time of each part over every gap of every device (float64, 4)."""
        return self.parts.sum(axis=0) if len(self.parts) else np.zeros(len(BUBBLE_PARTS))

    @property
    def idle(self) -> float:
        """Idle compute time summed over devices."""
        return float(self.totals.sum())

    def shares(self) -> dict[str, float]:
        """Each part's share of the idle time (zeros without idle time)."""
        idle = self.idle
        return {name: float(value / idle) if idle > 0 else 0.0
                for name, value in zip(BUBBLE_PARTS, self.totals.tolist(), strict=True)}


def bubble_breakdown(timeline: Timeline) -> BubbleBreakdown:
    """The idle gaps of ``timeline`` and their parts (module docstring)."""
    begin, finish = timeline.origin, timeline.origin + timeline.makespan
    device, start, end, row, edge = _gaps(timeline, begin, finish)
    parts = np.zeros((len(start), len(BUBBLE_PARTS)))
    length = end - start
    parts[edge, WARMUP_COOLDOWN] = length[edge]
    inner = ~edge
    waits = waited_for(timeline)
    head = timeline.op_entry.astype(np.int64) if timeline.op_entry is not None else np.arange(len(timeline))
    ending = head[np.where(inner, row, 0)]
    cause = np.where(inner, waits.cause[ending], -1)
    ref = np.maximum(waits.ref[ending].astype(np.int64), 0)
    table = timeline.transfers
    # exposed communication: the part of the gap in which the awaited transfer flies
    carried_in = cause == WAIT_TRANSFER
    flying = np.zeros(len(start))
    if carried_in.any():
        t = ref[carried_in]
        flying[carried_in] = np.clip(np.minimum(end[carried_in], table.end[t])
                                     - np.maximum(start[carried_in], table.start[t]), 0.0, None)
    # memory waits: the part after the op's other input (from the stage after) was there
    on_op = cause == WAIT_DEPENDENCY  # ref is an op row (a transfer row for WAIT_TRANSFER)
    # an op a compute op needs from its device's host link brings activations back (a reload)
    reload = on_op & ~timeline.on_compute[np.where(on_op, ref, 0)]
    memory = np.zeros(len(start))
    if reload.any():
        deps = row_dependencies(timeline)
        waiting = ending[reload]
        carried, delivery = deps.carried[waiting], deps.delivery[waiting]
        arrived = np.where(delivery >= 0, table.end[np.maximum(delivery, 0)] if len(table) else -np.inf,
                           timeline.op_end[np.maximum(carried, 0)])
        other = np.where(carried >= 0, np.maximum(start[reload], arrived), start[reload])
        memory[reload] = np.clip(end[reload] - other, 0.0, None)
    parts[inner, EXPOSED_COMMUNICATION] = flying[inner]
    parts[inner, MEMORY_WAIT] = memory[inner]
    parts[inner, DEPENDENCY_STALL] = length[inner] - flying[inner] - memory[inner]
    return BubbleBreakdown(device, start, end, row, parts)


def _gaps(timeline: Timeline, begin: float, finish: float):
    """Per gap of every device's compute stream: device, start, end, the row that ends it
    (-1 for the cool-down) and whether it is the device's warm-up or cool-down."""
    found = []
    for device in range(timeline.num_devices):
        rows = timeline.rows_of_device(device)
        starts, ends = timeline.op_start[rows], timeline.op_end[rows]
        # the busy union: a gap opens wherever an op starts after every earlier op ended
        reached = np.maximum.accumulate(np.concatenate(([begin], ends)))
        opens = starts > reached[:-1]
        first = np.zeros(len(rows), np.bool_)
        first[:1] = True
        found.append((np.full(int(opens.sum()), device), reached[:-1][opens], starts[opens], rows[opens], first[opens]))
        if finish > reached[-1]:
            found.append((np.array([device]), reached[-1:], np.array([finish]), np.array([-1]), np.array([True])))
    if not found:
        return (np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.bool_))
    device, start, end, row, edge = (np.concatenate(column) for column in zip(*found, strict=True))
    return (device.astype(np.int64), start.astype(np.float64), end.astype(np.float64), row.astype(np.int64),
            edge.astype(np.bool_))
