"""PyTorch's schedule CSV (``torch.distributed.pipelining``): one row per rank, one cell per
time step, cells like ``0F0``, ``3I1``, ``3W1``, ``1B0``, empty when idle.

Export writes the compute-only format that ``_PipelineScheduleRuntime._load_csv`` reads.
Import reads compute-only files and PyTorch's compute+comms dumps: communication actions
(``SEND_F``, ``RECV_B``, ``UNSHARD``, ``REDUCE_GRAD``, ...) are dropped and an overlapped
pair ``(0F1;1B0)OVERLAP_F_B`` becomes its two ops in order.
"""

from __future__ import annotations

import csv
import io as _io
import re

from pipesched.errors import PipeschedError
from pipesched.io.grid import infer_placement
from pipesched.io.layout import step_rows
from pipesched.ops import Op
from pipesched.schedule import Schedule

_COMM_ACTION = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def dumps(schedule: Schedule) -> str:
    """Compute-only CSV; raises PipeschedError when PyTorch cannot express the placement."""
    if schedule.placement.num_replicas > 1:
        raise PipeschedError(
            f"schedule={schedule.name}: its stages live on two devices as replicas, which PyTorch's "
            "CSV cannot express (one rank per stage); save it as grid text or JSON instead"
        )
    buffer = _io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in step_rows(schedule):
        writer.writerow(["" if op is None else str(op) for op in row])
    return buffer.getvalue()


def loads(text: str, *, source: str = "<csv>", name: str = "custom") -> Schedule:
    rows: list[list[Op]] = []
    for number, cells in enumerate(csv.reader(_io.StringIO(text)), start=1):
        ops: list[Op] = []
        for column, cell in enumerate(cells, start=1):
            ops.extend(_parse_cell(cell.strip(), source, number, column))
        rows.append(ops)
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise PipeschedError(f"{source}: no rows; PyTorch's CSV has one row of actions per rank")
    seen = [op for row in rows for op in row]
    num_stages = max(op.stage for op in seen) + 1
    num_microbatches = max(op.microbatch for op in seen) + 1
    placement = infer_placement(rows, num_stages, source)
    return Schedule(name, placement, num_microbatches, tuple(tuple(r) for r in rows))


def _parse_cell(cell: str, source: str, line: int, column: int) -> list[Op]:
    if not cell or _COMM_ACTION.match(cell):
        return []
    overlap = _OVERLAP.match(cell)
    parts = overlap.group(1).split(";") if overlap else [cell]
    try:
        return [Op.parse(part) for part in parts]
    except PipeschedError:
        raise PipeschedError(
            f"{source}:{line}:{column}: bad action {cell!r}; cells are like 0F0, 3I1, 3W1, 1B0 (or PyTorch comm actions)"
        ) from None
