"""The critical path: the chain of ops and transfers that determined the end of an iteration.

Each task on the chain started exactly when the task before it on the chain ended: that task
was either a data predecessor (an op, or the transfer that carried its data) or the task
that held a resource it needed (the previous op on its device, the previous transfer on a
channel). The simulator records that binding task for every task; for other timelines (the
slot table, a measured run) ``critical_path`` finds it from the times. A measured op starts
some time after the op it waited for ends (its input wait, its launch), so on a measured
timeline the chain's tasks follow each other with those gaps between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.dependencies import need_rows
from pipesched.timeline import TRANSFER_KIND_NAMES, Source, Timeline


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
    timelines the path is traced back from the last op to end, by one rule: each step goes
    to the op this one waited for last, the candidate (its data predecessors by the rules'
    needs, then the previous op of its device's stream) whose end is the latest at or before
    this op's start (``tolerance`` x the makespan allowed either way; ties: a data predecessor
    first). On a slot table that op ended exactly when this one started, and the walk stops
    at an op whose start no candidate's end meets. A measured op starts after its input wait
    and its launch, never exactly at a predecessor's end: there the latest candidate binds
    whatever the gap since its end, so the path reaches back to the iteration's first op.
    Transfers are not traced: a slot table has none and a measured op's start already
    follows its input's arrival.
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
    # on a measured timeline any gap since the binding op's end is its wait and launch
    any_gap = timeline.source == Source.MEASURED
    chain = [int(np.argmax(timeline.op_end))]
    seen = set(chain)
    while True:
        binding = _binding(chain[-1], [*(int(r) for r in needs[chain[-1]] if r >= 0), int(previous[chain[-1]])],
                           timeline, slack=slack, any_gap=any_gap)
        if binding is None or binding in seen:
            break
        chain.append(binding)
        seen.add(binding)
    rows = np.asarray(chain[::-1], np.int64)
    return CriticalPath(np.zeros(rows.shape[0], bool), rows)


def _binding(row: int, candidates: list[int], timeline: Timeline, *, slack: float, any_gap: bool) -> int | None:
    """The candidate op ``row`` waited for last (see ``critical_path``), or None."""
    start = timeline.op_start[row]
    best, best_end = None, -np.inf
    for candidate in candidates:
        if candidate < 0:
            continue
        end = timeline.op_end[candidate]
        if end <= start + slack and end > best_end:
            best, best_end = candidate, end
    if best is None or (not any_gap and start - best_end > slack):
        return None
    return best
