"""Level 2: the idealized slot table. Ops take whole slots (F, I, W lengths; B = I + W), data
moves for free, each device runs its table in order. Gives the classic grid picture."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError
from pipesched.generators.base import SlotCosts
from pipesched.ops import KIND_INDEX, B, F, I, Op, W
from pipesched.ordering import walk
from pipesched.schedule import Schedule
from pipesched.timeline import Timeline


def slot_duration(costs: SlotCosts):
    lengths = {F: costs.f, I: costs.i, W: costs.w, B: costs.b}
    return lambda op: lengths[op.kind]


def slot_table(schedule: Schedule, costs: SlotCosts | None = None) -> Timeline:
    """The unit-time timeline of ``schedule`` (source "table", unit "slot").

    Raises PipeschedError if the tables deadlock; validate first for the full report.
    """
    costs = costs or SlotCosts()
    result = walk(schedule, slot_duration(costs))
    if result.stuck is not None:
        cycle = result.stuck.cycle or result.stuck.waits
        detail = "; ".join(f"device {d} waits at {head} for {missing}" for d, head, missing in cycle)
        raise PipeschedError(f"schedule={schedule.name}: the tables deadlock ({detail}); run `pipesched validate` for the report")
    rows = [(d, op) for d, op in schedule.ops()]
    return Timeline(
        schedule=schedule,
        source="table",
        unit="slot",
        op_device=np.fromiter((d for d, _ in rows), np.int32, len(rows)),
        op_stage=np.fromiter((op.stage for _, op in rows), np.int32, len(rows)),
        op_kind=np.fromiter((KIND_INDEX[op.kind] for _, op in rows), np.int8, len(rows)),
        op_microbatch=np.fromiter((op.microbatch for _, op in rows), np.int32, len(rows)),
        op_start=np.asarray(result.start, dtype=np.float64),
        op_end=np.asarray(result.end, dtype=np.float64),
        meta={"slot_costs": costs},
    )


def held_after_each_op(ops: Sequence[Op]) -> Iterator[tuple[Op, int]]:
    """(op, stage-microbatches of activations held right after it) along one device's table.

    An F allocates its stage-microbatch's activations; the op that ends its backward frees
    them (B, or W when the backward is split into I and W). Table order is time order on
    one device.
    """
    held = 0
    for op in ops:
        if op.kind is F:
            held += 1
        elif op.kind is B or op.kind is W:
            held -= 1
        yield op, held


def inflight_per_device(schedule: Schedule) -> list[int]:
    """Peak stage-microbatches whose activations each device holds at once."""
    return [max((held for _, held in held_after_each_op(ops)), default=0) for ops in schedule.device_ops]


@dataclass(frozen=True)
class TableMetrics:
    """Level-2 figures of one schedule (times in slots)."""

    makespan: float
    bubble_ratio: float  # idle / (devices x makespan)
    bubble_over_work: float  # idle / busy, summed over devices
    idle_per_device: tuple[float, ...]
    peak_inflight: tuple[int, ...]  # per device, stage-microbatches
    activation_units: float  # worst device's peak x devices / stages (units of a 1F1B stage)


def table_metrics(schedule: Schedule, costs: SlotCosts | None = None, *,
                  timeline: Timeline | None = None) -> TableMetrics:
    """Level-2 figures; pass ``timeline`` when the slot table of ``schedule`` (with the same
    costs) is already at hand."""
    timeline = timeline if timeline is not None else slot_table(schedule, costs)
    idle = timeline.idle_per_device()
    busy = timeline.busy_per_device()
    peaks = inflight_per_device(schedule)
    return TableMetrics(
        makespan=timeline.makespan,
        bubble_ratio=timeline.bubble_ratio(),
        bubble_over_work=float(idle.sum() / busy.sum()) if busy.sum() > 0 else 0.0,
        idle_per_device=tuple(float(x) for x in idle),
        peak_inflight=tuple(peaks),
        activation_units=max(peaks) * schedule.num_devices / schedule.num_stages,
    )


def grid_cells(timeline: Timeline) -> list[list[Op | None]]:
    """The classic grid: one row per device, one cell per unit slot (None = idle).

    An op of length k slots fills k cells. Needs integral slot times.
    """
    total = round(timeline.makespan)
    cells: list[list[Op | None]] = [[None] * total for _ in range(timeline.num_devices)]
    for row in range(len(timeline)):
        first, last = round(timeline.op_start[row]), round(timeline.op_end[row])
        for slot in range(first, last):
            cells[int(timeline.op_device[row])][slot] = timeline.op(row)
    return cells
