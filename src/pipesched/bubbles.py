"""Where a schedule's bubble comes from: every idle gap of every device's compute stream,
split into what it waited for.

A device's idle time is the part of the timeline's span (``Timeline.makespan``, from its
first op's start) in which its compute stream runs nothing. Each gap is classified by the op
that ends it and the cause of that op's start (``pipesched.render.waits``):

- warm-up and cool-down: before the device's first op, after its last one;
- exposed communication: the part of a gap during which the transfer that carries the
  op's input (activation or gradient from another device) is in flight;
- memory waits: in a gap ended by an op that waited for its activations to be reloaded
  from host memory (an ``R`` op), the part after its other input was there (the time
  ``metrics.offload_exposed`` counts);
- dependency stalls: the rest (waiting for a producing op that has not ended yet).

The four parts of every gap sum to its length, so the parts of a timeline sum to its total
idle time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.ops import KIND_INDEX, R
from pipesched.render.waits import WAIT_DEPENDENCY, WAIT_TRANSFER, dependencies, waited_for
from pipesched.timeline import Timeline

# the parts of a bubble, in the order of BubbleBreakdown.parts' columns
WARMUP_COOLDOWN, DEPENDENCY_STALL, EXPOSED_COMMUNICATION, MEMORY_WAIT = 0, 1, 2, 3
BUBBLE_PARTS = ("warm-up and cool-down", "dependency stalls", "exposed communication", "memory waits")
_R = KIND_INDEX[R]


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
    waits = waited_for(timeline)
    deps = dependencies(timeline)
    head = timeline.op_entry.astype(np.int64) if timeline.op_entry is not None else np.arange(len(timeline))
    begin, finish = timeline.origin, timeline.origin + timeline.makespan
    table = timeline.transfers
    # (device, start, end, row ending it or -1, is it the device's warm-up or cool-down)
    gaps: list[tuple[int, float, float, int, bool]] = []
    for device in range(timeline.num_devices):
        rows = timeline.rows_of_device(device)
        # the busy union: a gap opens wherever an op starts after every earlier op ended
        reached = begin
        for k, row in enumerate(rows.tolist()):
            start = float(timeline.op_start[row])
            if start > reached:
                gaps.append((device, reached, start, row, k == 0))
            reached = max(reached, float(timeline.op_end[row]))
        if finish > reached:
            gaps.append((device, reached, finish, -1, True))
    device = np.array([g[0] for g in gaps], np.int64)
    start = np.array([g[1] for g in gaps], np.float64)
    end = np.array([g[2] for g in gaps], np.float64)
    row = np.array([g[3] for g in gaps], np.int64)
    parts = np.zeros((len(gaps), len(BUBBLE_PARTS)))
    for k, (_, g0, g1, r, edge) in enumerate(gaps):
        if edge:
            parts[k, WARMUP_COOLDOWN] = g1 - g0
            continue
        r = int(head[r])
        cause, ref = int(waits.cause[r]), int(waits.ref[r])
        if cause == WAIT_TRANSFER:
            flying = max(0.0, min(g1, float(table.end[ref])) - max(g0, float(table.start[ref])))
            parts[k, EXPOSED_COMMUNICATION] = flying
            parts[k, DEPENDENCY_STALL] = (g1 - g0) - flying
        elif cause == WAIT_DEPENDENCY and int(timeline.op_kind[ref]) == _R:
            # waiting for the reload only once its other input (from the stage after) is there
            other = g0
            carried = int(deps.carried[r])
            if carried >= 0:
                delivery = int(deps.delivery[r])
                other = max(other, float(table.end[delivery] if delivery >= 0 else timeline.op_end[carried]))
            memory = max(0.0, g1 - min(other, g1))
            parts[k, MEMORY_WAIT] = memory
            parts[k, DEPENDENCY_STALL] = (g1 - g0) - memory
        else:
            parts[k, DEPENDENCY_STALL] = g1 - g0
    return BubbleBreakdown(device, start, end, row, parts)
