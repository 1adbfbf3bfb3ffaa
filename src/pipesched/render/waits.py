"""Why each op started when it did: the event whose end released it.

An op starts once its device is free (the previous op on the device ended) and its inputs
are there (each data predecessor ended, or, across devices, the transfer carrying its
activation or gradient arrived). The cause is the latest of these; on a tie the data
dependency is named, since it explains more than "the device was busy".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.ops import F, Op
from pipesched.timeline import ACTIVATION, GRADIENT, Timeline

# cause codes, stored in Waits.cause
WAIT_NONE, WAIT_DEPENDENCY, WAIT_TRANSFER, WAIT_DEVICE = 0, 1, 2, 3
WAIT_NAMES = ("nothing", "dependency", "transfer", "device")
# tie order: a transfer explains most, then the producing op, then the device order
_PRIORITY = {WAIT_TRANSFER: 2, WAIT_DEPENDENCY: 1, WAIT_DEVICE: 0}


@dataclass(frozen=True)
class Waits:
    """One entry per op row of the timeline."""

    cause: np.ndarray  # int8, WAIT_* code
    ref: np.ndarray  # int32: op row (dependency, device), transfer row (transfer), -1 (nothing)
    ready: np.ndarray  # float64: when that cause ended (nan for nothing)


def consumer(timeline: Timeline, transfer: int) -> Op | None:
    """The op that waits for transfer row ``transfer`` (None for collectives).

    An activation sent by stage s feeds F(s+1); a gradient sent by stage s feeds the
    backward of stage s-1 (I when the table splits it, else B).
    """
    table = timeline.transfers
    kind, stage, microbatch = int(table.kind[transfer]), int(table.stage[transfer]), int(table.microbatch[transfer])
    if kind == ACTIVATION:
        return Op(stage + 1, F, microbatch)
    if kind == GRADIENT and stage >= 1:
        return timeline.schedule.backward_op(stage - 1, microbatch)
    return None


def delivered_by(timeline: Timeline) -> dict[Op, int]:
    """Consumer op -> the transfer row that delivered its input."""
    return {
        op: row
        for row in range(len(timeline.transfers))
        if (op := consumer(timeline, row)) is not None
    }


def waited_for(timeline: Timeline) -> Waits:
    """The cause of every op's start time (see the module docstring)."""
    n = len(timeline)
    ops = [timeline.op(row) for row in range(n)]
    row_of = {op: row for row, op in enumerate(ops)}
    deliveries = delivered_by(timeline)
    previous = np.full(n, -1, np.int64)
    for device in range(timeline.num_devices):
        rows = timeline.rows_of_device(device)
        previous[rows[1:]] = rows[:-1]

    end = timeline.op_end
    transfer_end = timeline.transfers.end
    tolerance = 1e-9 * max(timeline.makespan, 1e-30)
    cause = np.zeros(n, np.int8)
    ref = np.full(n, -1, np.int32)
    ready = np.full(n, np.nan)
    for row, op in enumerate(ops):
        candidates: list[tuple[float, int, int]] = []
        if previous[row] >= 0:
            candidates.append((float(end[previous[row]]), WAIT_DEVICE, int(previous[row])))
        for pred in timeline.schedule.predecessors(op):
            pred_row = row_of.get(pred)
            if pred_row is None:
                continue
            carrier = deliveries.get(op)
            crosses = timeline.op_device[pred_row] != timeline.op_device[row]
            if crosses and carrier is not None and _carries(timeline, carrier, pred):
                candidates.append((float(transfer_end[carrier]), WAIT_TRANSFER, carrier))
            else:
                candidates.append((float(end[pred_row]), WAIT_DEPENDENCY, pred_row))
        if not candidates:
            continue
        latest = max(time for time, _, _ in candidates)
        tied = [c for c in candidates if c[0] >= latest - tolerance]
        time, code, target = max(tied, key=lambda c: _PRIORITY[c[1]])
        cause[row], ref[row], ready[row] = code, target, time
    return Waits(cause, ref, ready)


def _carries(timeline: Timeline, transfer: int, pred: Op) -> bool:
    """True when transfer row ``transfer`` moves the output of ``pred`` (not its other input)."""
    table = timeline.transfers
    expected = ACTIVATION if pred.kind is F else GRADIENT
    return int(table.kind[transfer]) == expected and int(table.stage[transfer]) == pred.stage
