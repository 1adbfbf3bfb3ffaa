"""The critical path: the chain of ops and transfers that determined the end of an iteration.

Each task on the chain started exactly when the task before it on the chain ended: that task
was either a data predecessor (an op, or the transfer that carried its data) or the task
that held a resource it needed (the previous op on its device, the previous transfer on a
channel). The simulator records that binding task for every task; for other timelines (the
slot table, a measured run) ``critical_path`` finds it from the times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.dependencies import need_rows
from pipesched.timeline import TRANSFER_KIND_NAMES, Timeline


@dataclass(frozen=True, eq=False)
class CriticalPath:
    """Tasks on the critical path in time order: ``row[k]`` indexes the timeline's ops, or
    its transfers where ``is_transfer[k]``."""

    is_transfer: np.ndarray  # bool
    row: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.row.shape[0])

    def compute_time(self, timeline: Timeline) -> float:
        """Time the path spends in compute ops."""
        rows = self.row[~self.is_transfer]
        return float((timeline.op_end[rows] - timeline.op_start[rows]).sum())

    def transfer_time(self, timeline: Timeline) -> float:
        """Time the path spends in transfers (communication on the critical path)."""
        rows = self.row[self.is_transfer]
        return float((timeline.transfers.end[rows] - timeline.transfers.start[rows]).sum())

    def describe(self, timeline: Timeline) -> list[str]:
        """One line per task: what it is, where, when."""
        lines = []
        transfers = timeline.transfers
        for is_transfer, row in zip(self.is_transfer.tolist(), self.row.tolist(), strict=True):
            if is_transfer:
                kind = TRANSFER_KIND_NAMES[int(transfers.kind[row])]
                what = (f"{kind} stage {int(transfers.stage[row])} mb {int(transfers.microbatch[row])} "
                        f"device {int(transfers.src_device[row])} -> {int(transfers.dst_device[row])}")
                start, end = transfers.start[row], transfers.end[row]
            else:
                what = f"{timeline.op(row)} on device {int(timeline.op_device[row])}"
                start, end = timeline.op_start[row], timeline.op_end[row]
            lines.append(f"{what}: {start:.6g} .. {end:.6g} {timeline.unit}")
        return lines


def from_binder(chain: np.ndarray, num_ops: int) -> CriticalPath:
    """A CriticalPath from the engine's task ids (ops 0..N-1, transfers N + t)."""
    is_transfer = chain >= num_ops
    return CriticalPath(is_transfer, np.where(is_transfer, chain - num_ops, chain).astype(np.int64))


def critical_path(timeline: Timeline, *, tolerance: float = 1e-9) -> CriticalPath:
    """The critical path of ``timeline``.

    A simulated timeline carries it (``timeline.simulation.critical_path``). For other
    timelines the path is traced back from the last op to end: each step goes to the op
    that ended when this one started (within ``tolerance`` x the makespan), a data
    predecessor first (the rules' needs), else the previous op of the device's stream. Transfers are
    not traced there: a slot table has none and a measured run's ops already include their
    waits.
    """
    if timeline.simulation is not None:
        return timeline.simulation.critical_path
    n = len(timeline)
    if n == 0:
        return CriticalPath(np.zeros(0, bool), np.zeros(0, np.int64))

    needs = need_rows(timeline.op_stage, timeline.op_kind, timeline.op_microbatch,
                      num_stages=timeline.schedule.num_stages, num_microbatches=timeline.schedule.num_microbatches,
                      rules=timeline.schedule.rules)
    # the previous op on the same device, by start time
    previous = np.full(n, -1, np.int64)
    for device in range(timeline.num_devices):
        for compute in (True, False):
            rows = timeline.rows_of_device(device, compute=compute)
            previous[rows[1:]] = rows[:-1]
    slack = tolerance * max(timeline.makespan, 1.0)
    chain = [int(np.argmax(timeline.op_end))]
    while True:
        row = chain[-1]
        start = timeline.op_start[row]
        candidates = [*(int(r) for r in needs[row] if r >= 0), int(previous[row])]
        binding = next(
            (c for c in candidates if c >= 0 and abs(timeline.op_end[c] - start) <= slack), None
        )
        if binding is None:
            break
        chain.append(binding)
    rows = np.asarray(chain[::-1], np.int64)
    return CriticalPath(np.zeros(rows.shape[0], bool), rows)
