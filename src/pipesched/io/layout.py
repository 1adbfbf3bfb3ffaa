"""The text layout shared by the grid and CSV formats: every op takes one time step, idle steps
are empty. This is how PyTorch lays out ``pipeline_order`` (one action per step, ``None`` when
idle), so our CSV rows line up the way its own dumps do."""

from __future__ import annotations

from pipesched.errors import PipeschedError
from pipesched.limits import MAX_GRID_CELLS
from pipesched.ops import Op
from pipesched.ordering import walk
from pipesched.schedule import Schedule


def step_rows(schedule: Schedule) -> list[list[Op | None]]:
    """One row per device; ``None`` marks an idle step. A table that is not valid or deadlocks, or whose
    layout would hold more than MAX_GRID_CELLS steps in all, is laid out compactly (no idle
    steps) so it can still be written and inspected."""
    try:
        result = walk(schedule, lambda op: 1.0)
    except PipeschedError:  # not a valid table (validate reports why): no time steps
        return [list(ops) for ops in schedule.device_ops]
    if result.stuck is not None or _cells(schedule, result.start) > MAX_GRID_CELLS:
        return [list(ops) for ops in schedule.device_ops]
    rows: list[list[Op | None]] = []
    row_index = 0
    for ops in schedule.device_ops:
        row: list[Op | None] = []
        for op in ops:
            step = int(result.start[row_index])
            row.extend([None] * (step - len(row)))
            row.append(op)
            row_index += 1
        rows.append(row)
    return rows


def _cells(schedule: Schedule, start) -> int:
    """Steps of the layout over all devices: each row runs to its last op."""
    cells, row_index = 0, 0
    for ops in schedule.device_ops:
        row_index += len(ops)
        if ops:
            cells += int(start[row_index - 1]) + 1
    return cells
