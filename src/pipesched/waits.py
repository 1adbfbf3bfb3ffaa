"""Why each op started when it did: the event whose end released it.

An op starts once its device is free (the previous op on the device ended; for an offload
or reload on the device's host link, the previous op there or the compute op that issues
it) and its inputs are there: each of its needs (the rules' ``Need`` rows of its kind,
``pipesched.dependencies``) ended, or, for a need from another device, the transfer that
carries it arrived. The cause is the latest of these; on a tie the transfer or data
dependency is named, since it explains more than "the device was busy", and among needs a
same-stage one before one from a neighbour stage.

Everything here works on whole columns (numpy), so a timeline of a million ops takes
about a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.dependencies import RowIndex, need_rows, rule_arrays
from pipesched.rules import Rules
from pipesched.timeline import Timeline

# cause codes, stored in Waits.cause
WAIT_NONE, WAIT_DEPENDENCY, WAIT_TRANSFER, WAIT_DEVICE = 0, 1, 2, 3
WAIT_NAMES = ("nothing", "dependency", "transfer", "device")
# tie order: a transfer explains most, then the producing op, then the device order
_PRIORITY = np.array([-1, 1, 2, 0])


@dataclass(frozen=True)
class Waits:
    """One entry per op row of the timeline."""

    cause: np.ndarray  # int8, WAIT_* code
    ref: np.ndarray  # int32: op row (dependency, device), transfer row (transfer), -1 (nothing)
    ready: np.ndarray  # float64: when that cause ended (nan for nothing)


@dataclass(frozen=True)
class RowDependencies:
    """The data dependencies of a timeline's rows, as row numbers (-1: none), from the rules.

    ``need[r, j]`` is the row of op row r's j-th need (its kind's ``Need`` rows, in order);
    ``need_delivery[r, j]`` the transfer that brought it (-1: same device, no message, or no
    transfers recorded). ``carried[r]`` is the first need whose output reaches row r from
    another stage (F(s-1)'s activation for F(s), the gradient of stage s+1's backward for
    I/B(s)), ``delivery[r]`` its transfer; ``local[r]`` the first need on its own stage (F(s)
    or R(s) for I/B(s), I(s) for W(s), F(s) for O(s), O(s) for R(s)). ``consumer[t]`` is the
    op row transfer row t feeds and ``producer[t]`` the op row whose output it carries (-1
    for all-reduces).
    """

    need: np.ndarray  # int64 (n, N)
    need_delivery: np.ndarray  # int64 (n, N)
    same_stage: np.ndarray  # bool (n, N): the need lies on the op's own stage
    consumer: np.ndarray  # int64 per transfer
    producer: np.ndarray  # int64 per transfer

    @property
    def carried(self) -> np.ndarray:
        return _first(self.need, ~self.same_stage)

    @property
    def local(self) -> np.ndarray:
        return _first(self.need, self.same_stage)

    @property
    def delivery(self) -> np.ndarray:
        return _first(self.need_delivery, ~self.same_stage)


def _first(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per row, the first of ``values`` >= 0 among the columns ``where`` marks (-1: none)."""
    usable = where & (values >= 0)
    column = np.argmax(usable, axis=1)
    found = values[np.arange(values.shape[0]), column] if values.shape[1] else np.full(values.shape[0], -1)
    return np.where(usable.any(axis=1), found, -1).astype(np.int64)


def row_dependencies(timeline: Timeline) -> RowDependencies:
    """Row-level data dependencies of ``timeline`` (the rules' needs, ``Schedule.predecessors``)."""
    rules = timeline.schedule.rules
    arrays = rule_arrays(rules)
    stage, kind = timeline.op_stage.astype(np.int64), timeline.op_kind.astype(np.int64)
    microbatch = timeline.op_microbatch.astype(np.int64)
    stages = timeline.schedule.num_stages
    need = need_rows(stage, kind, microbatch, num_stages=stages,
                     num_microbatches=timeline.schedule.num_microbatches, rules=rules).astype(np.int64)
    width = need.shape[1]
    same_stage = (arrays.need_offset[kind] == 0) & (np.arange(width) < arrays.need_count[kind][:, None])
    index = RowIndex.of(stage, kind, microbatch, num_stages=stages,
                        num_microbatches=timeline.schedule.num_microbatches, num_kinds=len(rules))
    consumer, slot = _consumers(timeline, rules, index)
    need_delivery = np.full(need.shape, -1, np.int64)
    fed = consumer >= 0
    need_delivery[consumer[fed], slot[fed]] = np.flatnonzero(fed)
    producer = np.where(fed, need[np.maximum(consumer, 0), np.maximum(slot, 0)], -1) if len(consumer) else consumer
    return RowDependencies(need, need_delivery, same_stage, consumer, producer)


def _consumers(timeline: Timeline, rules: Rules, index: RowIndex) -> tuple[np.ndarray, np.ndarray]:
    """Per transfer row, the op row it feeds and which of that op's needs it carries (-1, -1
    for a collective). A transfer of message kind c from stage s feeds an op on stage
    s - offset of a kind with a need (offset, message c); transfers with the same key go to
    such needs in the rules' order."""
    table = timeline.transfers
    consumer = np.full(len(table), -1, np.int64)
    slot = np.full(len(table), -1, np.int64)
    if not len(table):
        return consumer, slot
    arrays = rule_arrays(rules)
    t_stage, t_mb = table.stage.astype(np.int64), table.microbatch.astype(np.int64)
    width = max(arrays.need_offset.shape[1], 1)
    taken = np.zeros(len(timeline) * width, np.bool_)  # (op row, need) already fed
    for k, rule in enumerate(rules):
        for j, need in enumerate(rule.needs):
            if need.message is None:
                continue
            open_rows = np.flatnonzero((consumer < 0) & (table.kind == arrays.need_message[k, j]))
            rows = index.lookup(t_stage[open_rows] - need.offset, k, t_mb[open_rows])
            open_rows, rows = open_rows[rows >= 0], rows[rows >= 0]
            key = rows * width + j
            # one transfer per need: the first open one of each key, if that need is not fed yet
            _, first = np.unique(key, return_index=True)
            first = first[~taken[key[first]]]
            taken[key[first]] = True
            consumer[open_rows[first]] = rows[first]
            slot[open_rows[first]] = j
    return consumer, slot


def waited_for(timeline: Timeline) -> Waits:
    """The cause of every op's start time (see the module docstring)."""
    n = len(timeline)
    deps = row_dependencies(timeline)
    previous = np.full(n, -1, np.int64)
    for device in range(timeline.num_devices):
        for compute in (True, False):
            rows = timeline.rows_of_device(device, compute=compute)
            previous[rows[1:]] = rows[:-1]

    end = timeline.op_end
    device = timeline.op_device
    on_host = ~timeline.on_compute
    if on_host.any():
        # a host-link op is also held by the compute op before it in its device's table
        # (rows are in table order), which issues it: the later of the two is its device cause
        last_compute = np.where(on_host, -1, np.arange(n))
        np.maximum.accumulate(last_compute, out=last_compute)
        issuer = np.where(on_host & (last_compute >= 0) & (device[np.maximum(last_compute, 0)] == device),
                          last_compute, -1)
        later = (issuer >= 0) & ((previous < 0) | (end[np.maximum(issuer, 0)] > end[np.maximum(previous, 0)]))
        previous = np.where(later, issuer, previous)
    time, code, ref = _candidates(timeline, deps, previous)
    if timeline.op_entry is not None:
        # a fused op waits for the inputs of all its parts: its later parts' inputs count
        # for its first part (the row that holds the device)
        tails = np.flatnonzero(~timeline.drawn())
        heads = timeline.op_entry[tails].astype(np.int64)
        for column in range(1, time.shape[1]):
            later = time[tails, column] > time[heads, column]
            time[heads[later], column] = time[tails[later], column]
            code[heads[later], column] = code[tails[later], column]
            ref[heads[later], column] = ref[tails[later], column]

    latest = time.max(axis=1, initial=-np.inf)
    tolerance = 1e-9 * max(timeline.makespan, 1e-30)
    tied = time >= (latest - tolerance)[:, None]
    choice = np.argmax(np.where(tied, _PRIORITY[code], -2), axis=1)
    picked = np.arange(n)
    found = np.isfinite(latest)
    return Waits(
        cause=np.where(found, code[picked, choice], WAIT_NONE).astype(np.int8),
        ref=np.where(found, ref[picked, choice], -1).astype(np.int32),
        ready=np.where(found, time[picked, choice], np.nan),
    )


def _candidates(timeline: Timeline, deps: RowDependencies, previous: np.ndarray):
    """(time, code, ref) per row and candidate column: column 0 the previous op on the
    device, then the op's same-stage needs, then those from other stages (each arriving with
    its transfer when one delivered it), in the order of its kind's needs."""
    n, width = deps.need.shape
    # each need's column: same-stage needs first, the others after the most any kind has
    local_rank = np.cumsum(deps.same_stage, axis=1) - 1
    other_rank = np.cumsum(~deps.same_stage, axis=1) - 1
    locals_wide = int(deps.same_stage.sum(axis=1).max(initial=0))
    column = np.where(deps.same_stage, 1 + local_rank, 1 + locals_wide + other_rank)
    columns = 1 + locals_wide + int((~deps.same_stage).sum(axis=1).max(initial=0))
    time = np.full((n, columns), -np.inf)
    code = np.zeros((n, columns), np.int64)
    ref = np.full((n, columns), -1, np.int64)
    end, device = timeline.op_end, timeline.op_device
    present = previous >= 0
    time[present, 0], code[present, 0], ref[present, 0] = end[previous[present]], WAIT_DEVICE, previous[present]
    for j in range(width):
        rows, target = deps.need[:, j], column[:, j]
        present = np.flatnonzero(rows >= 0)
        at = target[present]
        time[present, at], code[present, at], ref[present, at] = end[rows[present]], WAIT_DEPENDENCY, rows[present]
        # an input from another device arrives with its transfer
        delivered = deps.need_delivery[present, j]
        crossed = (delivered >= 0) & (device[rows[present]] != device[present])
        hit, at, via = present[crossed], at[crossed], delivered[crossed]
        time[hit, at], code[hit, at], ref[hit, at] = timeline.transfers.end[via], WAIT_TRANSFER, via
    return time, code, ref
