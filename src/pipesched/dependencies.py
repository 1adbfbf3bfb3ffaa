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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import TypeVar

import numpy as np
from numba import njit

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.rules import AT_START, ROLES, STREAMS, TRANSFER_KIND_NAMES, Rules
from pipesched.schedule import Schedule

NO_MESSAGE = -1
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
    need_alternatives: np.ndarray  # int64 (K, N, A): kind indices, first present wins; -1 pads
    need_message: np.ndarray  # int64 (K, N): transfer kind code (timeline.ACTIVATION...) or -1
    complete_masks: np.ndarray  # int64 (C,): bit k set = kind k in that complete set
    memory_whole: np.ndarray  # float64 (K,)
    memory_input_part: np.ndarray  # float64 (K,)
    memory_kept: np.ndarray  # float64 (K,): coefficient of the gradients kept from I to W
    memory_at_start: np.ndarray  # bool (K,)
    ends_weight_gradient: np.ndarray  # bool (K,)
    # per stage role (rows: rules.ROLES) and kind: the role's accepted sets and memory effects
    accepted_masks: np.ndarray  # int64 (roles, C'): bit k set = kind k in that set; -1 pads
    role_whole: np.ndarray  # float64 (roles, K)
    role_input_part: np.ndarray  # float64 (roles, K)
    role_kept: np.ndarray  # float64 (roles, K)
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
    alt = np.full((kinds, needs, alternatives), -1, np.int64)
    message = np.full((kinds, needs), NO_MESSAGE, np.int64)
    for k, rule in enumerate(rules):
        count[k] = len(rule.needs)
        for j, need in enumerate(rule.needs):
            offset[k, j] = need.offset
            for a, kind in enumerate(need.kinds):
                alt[k, j, a] = index[kind]
            if need.message is not None:
                message[k, j] = TRANSFER_KIND_NAMES.index(need.message)
    masks = np.array([sum(1 << index[kind] for kind in kinds_set) for kinds_set in rules.complete], np.int64)
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
        need_alternatives=alt,
        need_message=message,
        complete_masks=masks,
        memory_whole=np.array([rule.memory.whole for rule in rules], np.float64),
        memory_input_part=np.array([rule.memory.input_part for rule in rules], np.float64),
        memory_kept=np.array([rule.memory.kept for rule in rules], np.float64),
        memory_at_start=np.array([rule.memory.at == "start" for rule in rules], np.bool_),
        ends_weight_gradient=np.array([rule.ends_weight_gradient for rule in rules], np.bool_),
        accepted_masks=accepted_masks,
        role_whole=per_role(lambda e: e.whole).astype(np.float64),
        role_input_part=per_role(lambda e: e.input_part).astype(np.float64),
        role_kept=per_role(lambda e: e.kept).astype(np.float64),
        role_at_start=per_role(lambda e: e.at == AT_START).astype(np.bool_),
        role_host=per_role(lambda e: e.host).astype(np.float64),
        role_host_at_start=per_role(lambda e: e.host_at == AT_START).astype(np.bool_),
        stream=np.array([STREAMS.index(rule.stream) for rule in rules], np.int8),
    )
    rules.__dict__["_arrays"] = arrays  # a derived view of an immutable table
    return arrays


def _kind_lookup(rules: Rules) -> np.ndarray:
    """Kind index of each ASCII letter of the rules' kinds."""
    table = np.full(256, -1, np.int8)
    for k, rule in enumerate(rules):
        if not rule.fused:  # fused entries are stored as their parts
            table[ord(str(rule.kind))] = k
    return table


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
    # kinds are one-letter strings: join them and map the letters through a lookup table
    letters = "".join(map(itemgetter(1), flat)).encode("ascii")
    del flat
    if len(letters) != n:
        raise PipeschedError(f"schedule={schedule.name}: op kinds must be one letter each")
    kind = _kind_lookup(schedule.rules)[np.frombuffer(letters, np.uint8)]
    if n and kind.min() < 0:
        bad = chr(letters[int(np.argmax(kind < 0))])
        raise PipeschedError(f"op kind={bad}: not in the schedule's rules ({', '.join(schedule.rules.letters)})")
    too_big = int(np.iinfo(np.int32).max)
    if n and (stage.max() > too_big or microbatch.max() > too_big):
        raise PipeschedError(f"schedule={schedule.name}: a stage or microbatch index over {too_big:,}")
    device = np.repeat(np.arange(schedule.num_devices, dtype=np.int32), lengths)
    ops = OpArrays(device, stage.astype(np.int32), kind, microbatch.astype(np.int32), offsets)
    if not fused:
        return ops
    return _with_entries(schedule, ops)


def _with_entries(schedule: Schedule, ops: OpArrays) -> OpArrays:
    """``ops`` with the fused entries' columns; raises PipeschedError for a fused entry of an
    unknown kind or whose parts do not fit its rule."""
    head = np.arange(len(ops), dtype=np.int32)
    entry_kind = ops.kind.copy()
    row = 0
    for op in itertools.chain.from_iterable(schedule.device_ops):
        if op.parts:
            problem = schedule.rules.fused_problem(op)
            if problem is not None:
                raise PipeschedError(f"op={op}: {problem}; run `pipesched validate` on the schedule for the full report")
            count = len(op.parts)
            head[row:row + count] = row
            entry_kind[row:row + count] = schedule.rules.index(op.kind)
            row += count
        else:
            row += 1
    return OpArrays(ops.device, ops.stage, ops.kind, ops.microbatch, ops.device_offsets, head, entry_kind)


# problems the index check reports: (code, op row or stage-microbatch index)
OK, OUT_OF_RANGE, DUPLICATE, MISPLACED, INCOMPLETE, MUTUAL = range(6)


@njit(cache=True)
def _index_ops(device, stage, kind, microbatch, num_stages, m, num_kinds, replicas, route, accepted_masks,
               stage_role):
    """row_of[(stage * m + mb) * K + kind] -> op row (-1 if absent), and the first problem:
    an op out of range, off its placement's device, a duplicate, or a stage-microbatch whose
    kinds are not exactly one of the sets its stage's role accepts."""
    n = stage.shape[0]
    row_of = np.full(num_stages * m * num_kinds, -1, np.int32)
    for x in range(n):
        s = stage[x]
        mb = microbatch[x]
        if s < 0 or s >= num_stages or mb < 0 or mb >= m:
            return row_of, OUT_OF_RANGE, x
        if replicas[route[mb], s] != device[x]:
            return row_of, MISPLACED, x
        key = (s * m + mb) * num_kinds + kind[x]
        if row_of[key] >= 0:
            return row_of, DUPLICATE, x
        row_of[key] = x
    for sm in range(num_stages * m):
        mask = 0
        for k in range(num_kinds):
            if row_of[sm * num_kinds + k] >= 0:
                mask |= 1 << k
        matched = False
        masks = accepted_masks[stage_role[sm // m]]
        for c in range(masks.shape[0]):
            if masks[c] == mask:
                matched = True
        if not matched:
            return row_of, INCOMPLETE, sm
    return row_of, OK, -1


@njit(cache=True)
def _need_rows(stage, kind, microbatch, row_of, num_stages, m, num_kinds,
               need_count, need_offset, need_alternatives):
    """(n, N) rows of each op's needs; -1 where a need lies outside the model or is absent."""
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
            for a in range(need_alternatives.shape[2]):
                alt = need_alternatives[k, j, a]
                if alt < 0:
                    break
                found = row_of[base + alt]
                if found >= 0:
                    rows[x, j] = found
                    break
    return rows


def need_rows(stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, *, num_stages: int,
              num_microbatches: int, rules: Rules) -> np.ndarray:
    """For op rows given as columns in any order (a measured timeline's, say): the row of
    each of their needs, (n, N), -1 for none. Rows naming ops outside the model are ignored."""
    arrays = rule_arrays(rules)
    k = len(rules)
    m = max(num_microbatches, int(microbatch.max(initial=-1)) + 1)
    row_of = np.full(num_stages * m * k, -1, np.int32)
    inside = (stage >= 0) & (stage < num_stages) & (microbatch >= 0)
    rows = np.flatnonzero(inside)
    row_of[(stage[rows].astype(np.int64) * m + microbatch[rows]) * k + kind[rows]] = rows
    return _need_rows(stage.astype(np.int64), kind.astype(np.int64), microbatch.astype(np.int64), row_of,
                      num_stages, m, k, arrays.need_count, arrays.need_offset, arrays.need_alternatives)


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
    rules = schedule.rules
    arrays = rule_arrays(rules)
    m, num_stages, k = schedule.num_microbatches, schedule.num_stages, len(rules)
    replicas = np.asarray(schedule.placement.replicas, dtype=np.int64)
    route = np.asarray(schedule.route, dtype=np.int64)
    row_of, code, index = _index_ops(ops.device, ops.stage, ops.kind, ops.microbatch, num_stages, m, k,
                                     replicas, route, arrays.accepted_masks, role_index(schedule.roles))
    if code != OK:
        _raise_problem(schedule, ops, int(code), int(index))
    rows = _need_rows(ops.stage, ops.kind, ops.microbatch, row_of, num_stages, m, k,
                      arrays.need_count, arrays.need_offset, arrays.need_alternatives)
    if ops.entry_head is not None:
        inside = (rows >= 0) & (ops.entry_head[np.maximum(rows, 0)] == ops.entry_head[:, None])
        if inside.any():
            _raise_problem(schedule, ops, MUTUAL, int(np.argmax(inside.any(axis=1))))
    message = arrays.need_message.astype(np.int8)[ops.kind]
    remote = (rows >= 0) & (ops.device[np.maximum(rows, 0)] != ops.device[:, None])
    message[~remote] = NO_MESSAGE
    return Dependencies(schedule, ops, rows, message)


def _raise_problem(schedule: Schedule, ops: OpArrays, code: int, index: int) -> None:
    hint = "run `pipesched validate` on the schedule for the full report"
    if ops.entry_head is not None and code in (MISPLACED, MUTUAL):
        entry = entry_of_row(schedule, ops, index)
        if entry.parts:
            part = entry.parts[index - int(ops.entry_head[index])]
            if code == MUTUAL:
                raise PipeschedError(f"op={entry}: its part {part} needs the output of another part, so they cannot "
                                     f"run at once; run them as separate ops; {hint}")
            devices = sorted({schedule.device_of(p.stage, p.microbatch) for p in entry.parts
                              if 0 <= p.stage < schedule.num_stages and 0 <= p.microbatch < schedule.num_microbatches})
            raise PipeschedError(f"op={entry}: its parts belong to devices {', '.join(map(str, devices))}; fuse ops "
                                 f"of one device only; {hint}")
    if code == INCOMPLETE:
        stage, mb = divmod(index, schedule.num_microbatches)
        raise PipeschedError(
            f"stage_microbatch={stage},{mb}: needs {schedule.rules.describe_complete(schedule.roles[stage])}; {hint}"
        )
    text = f"{int(ops.stage[index])}{schedule.rules.letters[int(ops.kind[index])]}{int(ops.microbatch[index])}"
    if code == OUT_OF_RANGE:
        raise PipeschedError(
            f"op={text}: stage or microbatch out of range (stages 0..{schedule.num_stages - 1}, "
            f"microbatches 0..{schedule.num_microbatches - 1}); {hint}"
        )
    if code == DUPLICATE:
        raise PipeschedError(f"op={text}: appears more than once; {hint}")
    expected = schedule.device_of(int(ops.stage[index]), int(ops.microbatch[index]))
    raise PipeschedError(
        f"op={text}: on device {int(ops.device[index])} but the placement puts it on device {expected}; {hint}"
    )


def entry_of_row(schedule: Schedule, ops: OpArrays, row: int):
    """The table entry (an Op, fused or plain) that op row ``row`` belongs to."""
    device = int(ops.device[row])
    position = int(ops.device_offsets[device])
    for op in schedule.device_ops[device]:
        if position + len(op.atoms) > row:
            return op
        position += len(op.atoms)
    raise IndexError(row)
