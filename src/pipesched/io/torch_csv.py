"""PyTorch's schedule CSV (``torch.distributed.pipelining``): one row per rank, one cell per
time step, cells like ``0F0``, ``3I1``, ``3W1``, ``1B0``, empty when idle.

Export writes the compute-only format that ``_PipelineScheduleRuntime._load_csv`` reads,
and the compute+comms format (``dumps_comms``: the communication pass's actions, cells like
``0SEND_F1`` and ``1RECV_F1``, one per action, as ``_load_csv(format="compute_comms")``
reads and ``_dump_csv`` writes). Import reads compute-only files and PyTorch's
compute+comms dumps: as a schedule (``loads``: communication actions such as ``SEND_F``,
``RECV_B``, ``UNSHARD``, ``REDUCE_GRAD`` are dropped; an overlapped pair
``(0F1;1B0)OVERLAP_F_B`` is one fused op both ways), or with its sends and receives
(``loads_comms``).
"""

from __future__ import annotations

import csv
import io as _io
import re
from typing import TYPE_CHECKING

from pipesched.errors import PipeschedError, shorten
from pipesched.io.grid import infer_placement
from pipesched.io.layout import step_rows
from pipesched.io.op_tokens import check_op_count, read_op
from pipesched.limits import MAX_DEVICES, check_table_size
from pipesched.ops import O, Op, R
from pipesched.schedule import Schedule

if TYPE_CHECKING:
    from pipesched.passes.communication import CommSchedule

_COMM_ACTION = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*$")
_SEND_RECV = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)$")


def _check_expressible(schedule: Schedule) -> None:
    if schedule.placement.num_replicas > 1:
        raise PipeschedError(
            f"schedule={schedule.name}: its stages live on two devices as replicas, which PyTorch's "
            "CSV cannot express (one rank per stage); save it as grid text or JSON instead"
        )
    if any(op.kind in (O, R) for _, op in schedule.ops()):
        raise PipeschedError(f"schedule={schedule.name}: PyTorch's CSV has no offload or reload actions; "
                             "save it as grid text or JSON instead")
    if schedule.frozen:
        raise PipeschedError(f"schedule={schedule.name}: PyTorch's CSV cannot mark frozen stages; "
                             "save it as grid text or JSON instead")


def _write(rows: list[list[str]]) -> str:
    buffer = _io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerows(rows)
    return buffer.getvalue()


def dumps(schedule: Schedule) -> str:
    """Compute-only CSV; raises PipeschedError when PyTorch cannot express the placement."""
    _check_expressible(schedule)
    return _write([["" if op is None else str(op) for op in row] for row in step_rows(schedule)])


def dumps_comms(comms: CommSchedule) -> str:
    """Compute+comms CSV: each device's actions from the communication pass, one per cell."""
    _check_expressible(comms.schedule)
    return _write(comms.text_rows())


def loads_comms(text: str, *, source: str = "<csv>", name: str = "custom") -> CommSchedule:
    """A compute+comms CSV as the schedule of its compute ops with its sends and receives
    (the peer of each is the device of the stage it goes to or comes from)."""
    from pipesched.passes.communication import CommSchedule, Message, Recv, Send
    from pipesched.timeline import ACTIVATION, GRADIENT

    schedule = loads(text, source=source, name=name)
    owner = schedule.placement.replicas[0]
    actions: list[tuple] = []
    for number, cells in enumerate(csv.reader(_io.StringIO(text)), start=1):
        if number > schedule.num_devices:
            break
        row: list = []
        for column, raw in enumerate(cells, start=1):
            cell = raw.strip()
            comm = _SEND_RECV.match(cell)
            if comm is None:
                row.extend(_parse_cell(cell, source, number, column))
                continue
            stage, what, mb = int(comm.group(1)), comm.group(2), int(comm.group(3))
            kind = ACTIVATION if what.endswith("_F") else GRADIENT
            # SEND names the producing stage, RECV the consuming one
            producer = stage if what.startswith("SEND") else stage - (1 if kind == ACTIVATION else -1)
            message = Message(kind, producer, mb)
            peer_stage = message.to_stage if what.startswith("SEND") else producer
            if not 0 <= peer_stage < schedule.num_stages:
                raise PipeschedError(f"{source}:{number}:{column}: {cell!r} names stage {peer_stage}, outside the "
                                     f"schedule's stages 0..{schedule.num_stages - 1}")
            row.append((Send if what.startswith("SEND") else Recv)(message, owner[peer_stage]))
        actions.append(tuple(row))
    actions += [()] * (schedule.num_devices - len(actions))
    return CommSchedule(schedule, tuple(actions))


def loads(text: str, *, source: str = "<csv>", name: str = "custom") -> Schedule:
    rows: list[list[Op]] = []
    ops_read = 0
    reader = csv.reader(_io.StringIO(text))
    try:
        for number, cells in enumerate(reader, start=1):
            if number > MAX_DEVICES:  # trailing empty rows are fine; more ranks are not
                if any(cell.strip() for cell in cells):
                    raise PipeschedError(f"{source}:{number}: more than {MAX_DEVICES:,} rows, over the limit of "
                                         "pipeline devices; PyTorch's CSV has one row of actions per rank")
                continue
            ops: list[Op] = []
            for column, cell in enumerate(cells, start=1):
                ops.extend(_parse_cell(cell.strip(), source, number, column))
            rows.append(ops)
            ops_read += len(ops)
            check_op_count(ops_read, source)
    except csv.Error as exc:
        raise PipeschedError(f"{source}:{reader.line_num}: not a CSV row PyTorch writes ({shorten(str(exc))})") from None
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise PipeschedError(f"{source}: no rows; PyTorch's CSV has one row of actions per rank")
    seen = [atom for row in rows for op in row for atom in op.atoms]
    num_stages = max(op.stage for op in seen) + 1
    num_microbatches = max(op.microbatch for op in seen) + 1
    check_table_size(num_stages, num_microbatches)
    placement = infer_placement(rows, num_stages, source)
    return Schedule(name, placement, num_microbatches, tuple(tuple(r) for r in rows))


def _parse_cell(cell: str, source: str, line: int, column: int) -> list[Op]:
    if not cell or _COMM_ACTION.match(cell):
        return []
    return [read_op(cell, where=f"{source}:{line}:{column}", label="action",
                    hint="cells are like 0F0, 3I1, 3W1, 1B0, (0F1;1B0)OVERLAP_F_B (or PyTorch comm actions)")]
