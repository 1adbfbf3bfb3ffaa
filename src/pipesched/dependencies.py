"""A schedule's ops as columns and their data dependencies as rows, from the rules.

Everything that works on whole tables (the simulator's compiled graph, the communication
pass, the slot table, critical paths, the report's "waited for") reads dependencies from
here, and here they come from the rules table (``pipesched.rules``): op ``x`` needs, for
each need of its kind, the row of the op of the needed kind on the needed stage of the same
microbatch (-1 when the need lies outside the model).

Rows are plain ops. A fused table entry (``(0F1;1B0)OVERLAP_F_B``) is stored as its parts,
one row each, consecutive in table order; ``OpArrays.entry_head`` ties them together, so
completeness, dependencies, messages and memory effects are the parts' own, and only the
timing (``pipesched.simulate.graph``) and the drawing treat the entry as one op.

Both are computed once per schedule and kept with it (``Schedule.derived``): a schedule is
immutable, and a grid of experiments evaluates one schedule under many costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import TypeVar

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.limits import MAX_GRID_CELLS
from pipesched.ops import Op
from pipesched.rules import AT_START, ROLES, STREAMS, TRANSFER_KIND_NAMES, Rules
from pipesched.schedule import Schedule
from pipesched.validation import fused_violations, structure_violations

NO_MESSAGE = -1
# the step column of a table whose rules read no step: numba compiles the index loops for
# None without the step code
_NO_STEPS = None
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class OpArrays:
    """The ops of a schedule as columns, rows in table order."""

    device: np.ndarray  # int32
    stage: np.ndarray  # int32
    kind: np.ndarray  # int8, index into the schedule's rules
    microbatch: np.ndarray  # int32
    device_offsets: np.ndarray  # int64 (D+1): device d owns rows offsets[d]:offsets[d+1]
    # fused entries (None when the table has none): the row of the first part of the table
    # entry each row belongs to (itself for a plain op), and that entry's kind (rules index)
    entry_head: np.ndarray | None = None  # int32
    entry_kind: np.ndarray | None = None  # int8
    # each row's step index (``Op.step``); None when the rules read no step (all 0)
    step: np.ndarray | None = None  # int32

    @property
    def num_steps(self) -> int:
        """Steps per stage-microbatch the rows span (1 without steps)."""
        return 1 if self.step is None or not len(self) else int(self.step.max()) + 1

    def __len__(self) -> int:
        return int(self.stage.shape[0])

    @property
    def fused(self) -> bool:
        return self.entry_head is not None

    def entry_kinds(self) -> np.ndarray:
        """The kind of the table entry each row belongs to (rules index): a fused entry's
        kind on each of its parts' rows, a plain op's own kind."""
        return self.kind if self.entry_kind is None else self.entry_kind

    def tails(self) -> np.ndarray:
        """Rows that are a later part of a fused entry (bool per row)."""
        if self.entry_head is None:
            return np.zeros(len(self), np.bool_)
        return self.entry_head != np.arange(len(self), dtype=self.entry_head.dtype)


@dataclass(frozen=True, eq=False)
class RuleArrays:
    """The rules table as small arrays for compiled code (kinds indexed as in the table)."""

    need_count: np.ndarray  # int64 (K,)
    need_offset: np.ndarray  # int64 (K, N): stage offset of each need
    need_step_offset: np.ndarray  # int64 (K, N): step offset of each need (Op.step)
    need_alternatives: np.ndarray  # int64 (K, N, A): kind indices, first present wins; -1 pads
    need_message: np.ndarray  # int64 (K, N): transfer kind code (timeline.ACTIVATION...) or -1
    memory_at_start: np.ndarray  # bool (K,)
    ends_weight_gradient: np.ndarray  # bool (K,)
    # per stage role (rows: rules.ROLES) and kind: the role's accepted sets and memory effects
    accepted_masks: np.ndarray  # int64 (roles, C'): bit k set = kind k in that set; -1 pads
    role_whole: np.ndarray  # float64 (roles, K)
    role_input_part: np.ndarray  # float64 (roles, K)
    role_kept: np.ndarray  # float64 (roles, K)
    role_per_step: np.ndarray  # float64 (roles, K): coefficient of step x M_B
    role_at_start: np.ndarray  # bool (roles, K)
    role_host: np.ndarray  # float64 (roles, K): coefficient of M_B in host memory
    role_host_at_start: np.ndarray  # bool (roles, K)
    stream: np.ndarray  # int8 (K,): index into rules.STREAMS


def role_index(roles: tuple[str, ...]) -> np.ndarray:
    """Each stage's role as its row in the role arrays (int64)."""
    return np.array([ROLES.index(role) for role in roles], np.int64)


def memory_deltas(schedule: Schedule, ops: OpArrays, costs: StageCosts) -> tuple[np.ndarray, np.ndarray]:
    """Device bytes each op row of ``schedule`` changes, and whether at its start (else at
    its end): its stage role's memory effect (``rules.MemoryEffect``: whole x M_B +
    input_part x input_frees x M_B + kept x K) on its stage's activation bytes M_B and
    gradients kept for W, K. The one count of the simulator and of a plan's device peaks.
    A table with no frozen stage has every op in the role of a stage that trains."""
    arrays = rule_arrays(schedule.rules)
    kinds = ops.kind.astype(np.int64)
    activation = np.asarray(costs.activation_bytes, np.float64)[ops.stage]
    role = role_index(schedule.roles)[ops.stage] if schedule.frozen else 0
    delta = (arrays.role_whole[role, kinds] + arrays.role_input_part[role, kinds] * costs.input_frees) * activation
    if ops.step is not None:
        delta += arrays.role_per_step[role, kinds] * ops.step * activation
    if costs.kept_for_w_bytes is not None:
        delta += arrays.role_kept[role, kinds] * np.asarray(costs.kept_for_w_bytes, np.float64)[ops.stage]
    return delta, arrays.role_at_start[role, kinds]


def rule_arrays(rules: Rules) -> RuleArrays:
    """``rules`` as arrays (cached on the rules value)."""
    cached = rules.__dict__.get("_arrays")
    if cached is not None:
        return cached
    index = {rule.kind: k for k, rule in enumerate(rules)}
    kinds, needs = len(rules), max(rules.max_needs, 1)
    alternatives = max((len(need.kinds) for rule in rules for need in rule.needs), default=1)
    count = np.zeros(kinds, np.int64)
    offset = np.zeros((kinds, needs), np.int64)
    step_offset = np.zeros((kinds, needs), np.int64)
    alt = np.full((kinds, needs, alternatives), -1, np.int64)
    message = np.full((kinds, needs), NO_MESSAGE, np.int64)
    for k, rule in enumerate(rules):
        count[k] = len(rule.needs)
        for j, need in enumerate(rule.needs):
            offset[k, j] = need.offset
            step_offset[k, j] = need.step_offset
            for a, kind in enumerate(need.kinds):
                alt[k, j, a] = index[kind]
            if need.message is not None:
                message[k, j] = TRANSFER_KIND_NAMES.index(need.message)
    accepted = [[sum(1 << index[kind] for kind in kinds_set) for kinds_set in rules.accepted_for(role)]
                for role in ROLES]
    accepted_masks = np.full((len(ROLES), max(len(row) for row in accepted)), -1, np.int64)
    for r, row in enumerate(accepted):
        accepted_masks[r, : len(row)] = row
    effects = [[rules.memory_for(rule.kind, role) for rule in rules] for role in ROLES]

    def per_role(value) -> np.ndarray:
        return np.array([[value(effect) for effect in row] for row in effects])

    arrays = RuleArrays(
        need_count=count,
        need_offset=offset,
        need_step_offset=step_offset,
        need_alternatives=alt,
        need_message=message,
        memory_at_start=np.array([rule.memory.at == AT_START for rule in rules], np.bool_),
        ends_weight_gradient=np.array([rule.ends_weight_gradient for rule in rules], np.bool_),
        accepted_masks=accepted_masks,
        role_whole=per_role(lambda e: e.whole).astype(np.float64),
        role_input_part=per_role(lambda e: e.input_part).astype(np.float64),
        role_kept=per_role(lambda e: e.kept).astype(np.float64),
        role_per_step=per_role(lambda e: e.per_step).astype(np.float64),
        role_at_start=per_role(lambda e: e.at == AT_START).astype(np.bool_),
        role_host=per_role(lambda e: e.host).astype(np.float64),
        role_host_at_start=per_role(lambda e: e.host_at == AT_START).astype(np.bool_),
        stream=np.array([STREAMS.index(rule.stream) for rule in rules], np.int8),
    )
    rules.__dict__["_arrays"] = arrays  # a derived view of an immutable table
    return arrays


def kind_column(ops: Sequence[Op], rules: Rules) -> np.ndarray:
    """The kind of each of ``ops`` (any length of name) as its index in ``rules`` (int8; -1
    for a kind the table lacks or a fused kind, whose ops are stored as their parts).

    Kinds are matched by identity first (an op's kind is one of the table's own values), a
    vector compare per kind of the table; only what that misses is looked up by name."""
    ids = np.fromiter(map(id, map(itemgetter(1), ops)), np.int64, len(ops))
    column = np.full(len(ops), -1, np.int8)
    plain = [(k, rule.kind) for k, rule in enumerate(rules) if not rule.fused]
    for k, kind in plain:
        column[ids == id(kind)] = k
    unmatched = np.flatnonzero(column < 0)
    if unmatched.size:
        by_name = {str(kind): k for k, kind in plain}
        column[unmatched] = [by_name.get(str(ops[row][1]), -1) for row in unmatched.tolist()]
    return column


def derived(schedule: Schedule, key: str, build: Callable[[Schedule], T]) -> T:
    """``build(schedule)``, computed once per schedule and kept in ``schedule.derived``."""
    cache = schedule.derived
    if key not in cache:
        cache[key] = build(schedule)
    return cache[key]


def op_arrays(schedule: Schedule) -> OpArrays:
    """The schedule's ops as columns (computed once per schedule; no per-op objects)."""
    return derived(schedule, "op_arrays", _op_arrays)


def _op_arrays(schedule: Schedule) -> OpArrays:
    fused = schedule.has_fused_ops
    rows = schedule.device_atoms if fused else schedule.device_ops
    lengths = np.fromiter((len(ops) for ops in rows), np.int64, schedule.num_devices)
    offsets = np.zeros(schedule.num_devices + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    flat = list(itertools.chain.from_iterable(rows))
    stage = np.fromiter(map(itemgetter(0), flat), np.int64, n)
    microbatch = np.fromiter(map(itemgetter(2), flat), np.int64, n)
    kind = kind_column(flat, schedule.rules)
    if n and kind.min() < 0:
        bad = flat[int(np.argmax(kind < 0))].kind
        raise PipeschedError(f"op kind={bad}: not in the schedule's rules ({', '.join(schedule.rules.letters)})")
    del flat
    too_big = int(np.iinfo(np.int32).max)
    if n and (stage.max() > too_big or microbatch.max() > too_big):
        raise PipeschedError(f"schedule={schedule.name}: a stage or microbatch index over {too_big:,}")
    device = np.repeat(np.arange(schedule.num_devices, dtype=np.int32), lengths)
    step = _steps(schedule, rows, n) if schedule.rules.stepped else None
    ops = OpArrays(device, stage.astype(np.int32), kind, microbatch.astype(np.int32), offsets, step=step)
    if not fused:
        return ops
    return _with_entries(schedule, ops)


def _steps(schedule: Schedule, rows, n: int) -> np.ndarray:
    """Each row's step (``Op.step``), bounded so that the index of (stage, microbatch, step,
    kind) stays within ``limits.MAX_GRID_CELLS``."""
    step = np.fromiter((op.step for op in itertools.chain.from_iterable(rows)), np.int64, n)
    if n and step.min() < 0:
        raise PipeschedError(f"step={int(step.min())}: an op's step index is 0 or more")
    cells = schedule.num_stages * schedule.num_microbatches * len(schedule.rules)
    most = max(MAX_GRID_CELLS // max(cells, 1), 1)
    if n and step.max() >= most:
        raise PipeschedError(f"step={int(step.max())}: at most {most - 1} for a table of {schedule.num_stages} stages "
                             f"and {schedule.num_microbatches} microbatches; run fewer steps")
    return step.astype(np.int32)


def _with_entries(schedule: Schedule, ops: OpArrays) -> OpArrays:
    """``ops`` with the fused entries' columns (whether each entry fits its rule is
    ``fused_violations``')."""
    head = np.arange(len(ops), dtype=np.int32)
    entry_kind = ops.kind.copy()
    row = 0
    for op in itertools.chain.from_iterable(schedule.device_ops):
        if op.parts:
            count = len(op.parts)
            head[row:row + count] = row
            # a kind the rules lack keeps its parts' kinds (``fused_violations`` reports it)
            if op.kind in schedule.rules.by_kind:
                entry_kind[row:row + count] = schedule.rules.index(op.kind)
            row += count
        else:
            row += 1
    return OpArrays(ops.device, ops.stage, ops.kind, ops.microbatch, ops.device_offsets, head, entry_kind, ops.step)


# index pass codes per op row
_OUT_OF_RANGE, _MISPLACED = 1, 2  # 0: in range, on its device


@njit(cache=True)
def _index_ops(device, stage, kind, microbatch, step, num_steps, num_stages, m, num_kinds, replicas, route,
               accepted_masks, stage_role):
    """row_of[((stage * m + mb) * steps + step) * K + kind] -> op row (-1 if absent; the
    first of duplicates; ``step`` None when every op is at step 0, ``num_steps`` 1),
    and where the table breaks the rules that ``validate.structure_violations`` words: per
    row, out of range or off its placement's device (``place``) and a repeat of an earlier
    row (``repeat``); per stage-microbatch, kinds that are not exactly one of the sets its
    stage's role accepts, over all its steps (``incomplete``)."""
    n = stage.shape[0]
    row_of = np.full(num_stages * m * num_steps * num_kinds, -1, np.int32)
    place = np.zeros(n, np.int8)
    repeat = np.zeros(n, np.bool_)
    for x in range(n):
        s = stage[x]
        mb = microbatch[x]
        if s < 0 or s >= num_stages or mb < 0 or mb >= m:
            place[x] = _OUT_OF_RANGE
            continue
        if replicas[route[mb], s] != device[x]:
            place[x] = _MISPLACED
        key = (s * m + mb) * num_kinds + kind[x]
        if step is not None:
            key = ((s * m + mb) * num_steps + step[x]) * num_kinds + kind[x]
        if row_of[key] >= 0:
            repeat[x] = True
        else:
            row_of[key] = x
    incomplete = np.zeros(num_stages * m, np.bool_)
    for sm in range(num_stages * m):
        mask = 0
        for t in range(num_steps):
            base = (sm * num_steps + t) * num_kinds
            for k in range(num_kinds):
                if row_of[base + k] >= 0:
                    mask |= 1 << k
        matched = False
        masks = accepted_masks[stage_role[sm // m]]
        for c in range(masks.shape[0]):
            if masks[c] == mask:
                matched = True
        incomplete[sm] = not matched
    return row_of, place, repeat, incomplete


def _index_pass(schedule: Schedule, ops: OpArrays):
    arrays = rule_arrays(schedule.rules)
    replicas = np.asarray(schedule.placement.replicas, dtype=np.int64)
    route = np.asarray(schedule.route, dtype=np.int64)
    return _index_ops(ops.device, ops.stage, ops.kind, ops.microbatch, ops.step, ops.num_steps, schedule.num_stages,
                      schedule.num_microbatches, len(schedule.rules), replicas, route, arrays.accepted_masks,
                      role_index(schedule.roles))


@njit(cache=True)
def _need_rows(stage, kind, microbatch, step, num_steps, row_of, num_stages, m, num_kinds,
               need_count, need_offset, need_step_offset, need_alternatives):
    """(n, N) rows of each op's needs; -1 where a need lies outside the model (or before
    step 0) or is absent. ``step`` is None when every op is at step 0."""
    n = stage.shape[0]
    width = need_offset.shape[1]
    rows = np.full((n, width), -1, np.int32)
    for x in range(n):
        k = kind[x]
        for j in range(need_count[k]):
            s = stage[x] + need_offset[k, j]
            if s < 0 or s >= num_stages:
                continue
            base = (s * m + microbatch[x]) * num_kinds
            if step is not None:
                t = step[x] + need_step_offset[k, j]
                if t < 0 or t >= num_steps:
                    continue
                base = ((s * m + microbatch[x]) * num_steps + t) * num_kinds
            for a in range(need_alternatives.shape[2]):
                alt = need_alternatives[k, j, a]
                if alt < 0:
                    break
                found = row_of[base + alt]
                if found >= 0:
                    rows[x, j] = found
                    break
    return rows


@dataclass(frozen=True, eq=False)
class RowIndex:
    """Op rows given as columns in any order (a timeline's, a measured run's), keyed by
    (stage, microbatch, kind index): ``row_of[(stage * m + mb) * K + kind]`` (-1: absent)."""

    row_of: np.ndarray  # int32
    num_stages: int
    num_microbatches: int  # m: the schedule's, or more when a row names a later microbatch
    num_kinds: int

    @classmethod
    def of(cls, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, *, num_stages: int,
           num_microbatches: int, num_kinds: int) -> RowIndex:
        """The index of these rows; rows naming ops outside the model are left out."""
        m = max(num_microbatches, int(microbatch.max(initial=-1)) + 1)
        row_of = np.full(num_stages * m * num_kinds, -1, np.int32)
        inside = (stage >= 0) & (stage < num_stages) & (microbatch >= 0)
        rows = np.flatnonzero(inside)
        row_of[(stage[rows].astype(np.int64) * m + microbatch[rows]) * num_kinds + kind[rows]] = rows
        return cls(row_of, num_stages, m, num_kinds)

    def lookup(self, stage: np.ndarray, kind: np.ndarray | int, microbatch: np.ndarray) -> np.ndarray:
        """The row of each (stage, kind, microbatch), -1 where absent or outside the model."""
        inside = (stage >= 0) & (stage < self.num_stages) & (microbatch >= 0) & (microbatch < self.num_microbatches)
        keys = (np.where(inside, stage, 0).astype(np.int64) * self.num_microbatches
                + np.where(inside, microbatch, 0)) * self.num_kinds + kind
        return np.where(inside, self.row_of[keys], -1).astype(np.int64)


def need_rows(stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, *, num_stages: int,
              num_microbatches: int, rules: Rules) -> np.ndarray:
    """For op rows given as columns in any order (a measured timeline's, say): the row of
    each of their needs, (n, N), -1 for none. Rows naming ops outside the model are ignored."""
    arrays = rule_arrays(rules)
    index = RowIndex.of(stage, kind, microbatch, num_stages=num_stages, num_microbatches=num_microbatches,
                        num_kinds=len(rules))
    return _need_rows(stage.astype(np.int64), kind.astype(np.int64), microbatch.astype(np.int64), _NO_STEPS, 1,
                      index.row_of, num_stages, index.num_microbatches, index.num_kinds, arrays.need_count,
                      arrays.need_offset, arrays.need_step_offset, arrays.need_alternatives)


@dataclass(frozen=True, eq=False)
class Dependencies:
    """A valid schedule's ops and, for each op row, the rows it needs.

    ``need_row[x, j]``: the op row of op x's j-th need (-1: none). ``need_message[x, j]``:
    the transfer kind of that input (``timeline.ACTIVATION`` or ``GRADIENT``) when it comes
    from another device, else -1.
    """

    schedule: Schedule
    ops: OpArrays
    need_row: np.ndarray  # int32 (n, N)
    need_message: np.ndarray  # int8 (n, N)

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(consumer rows, producer rows, message kinds) of every data dependency, consumer
        rows ascending."""
        consumer, slot = np.nonzero(self.need_row >= 0)
        return (consumer.astype(np.int32), self.need_row[consumer, slot].astype(np.int32),
                self.need_message[consumer, slot])


def dependencies(schedule: Schedule) -> Dependencies:
    """The ops and dependency rows of ``schedule`` (computed once per schedule).

    Raises PipeschedError naming the first op that makes the table unusable (out of range,
    a duplicate, off its device, or an incomplete stage-microbatch); ``pipesched.validate``
    gives the full report.
    """
    return derived(schedule, "dependencies", _dependencies)


def _dependencies(schedule: Schedule) -> Dependencies:
    ops = op_arrays(schedule)
    if ops.fused:
        problems = fused_violations(schedule)
        if problems:
            raise problems[0].error()
    rules = schedule.rules
    arrays = rule_arrays(rules)
    row_of, place, repeat, incomplete = _index_pass(schedule, ops)
    if place.any() or repeat.any() or incomplete.any():
        raise structure_violations(schedule)[0].error()
    rows = _need_rows(ops.stage, ops.kind, ops.microbatch, ops.step, ops.num_steps, row_of, schedule.num_stages,
                      schedule.num_microbatches, len(rules), arrays.need_count, arrays.need_offset,
                      arrays.need_step_offset, arrays.need_alternatives)
    message = arrays.need_message.astype(np.int8)[ops.kind]
    remote = (rows >= 0) & (ops.device[np.maximum(rows, 0)] != ops.device[:, None])
    message[~remote] = NO_MESSAGE
    return Dependencies(schedule, ops, rows, message)


def entry_of_row(schedule: Schedule, ops: OpArrays, row: int):
    """The table entry (an Op, fused or plain) that op row ``row`` belongs to."""
    device = int(ops.device[row])
    position = int(ops.device_offsets[device])
    for op in schedule.device_ops[device]:
        if position + len(op.atoms) > row:
            return op
        position += len(op.atoms)
    raise IndexError(row)
