"""Schedule validation: typed violations, never an exception for a bad table.

Checks, in order: ops out of range; duplicates; each op on the device its placement (and the
microbatch's replica) says; completeness (F, and B or I+W, for every stage-microbatch);
mixed backward kinds; local order (a device waiting on an op it runs later); cross-device
deadlock (the ops that wait on each other in a cycle); optional memory limit in in-flight
stage-microbatches per device.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipesched.ops import B, F, I, Op, W
from pipesched.ordering import walk
from pipesched.schedule import Schedule

# Violation kinds
OUT_OF_RANGE = "out-of-range"
DUPLICATE = "duplicate"
PLACEMENT = "placement"
MISSING = "missing"
MIXED_BACKWARD = "mixed-backward"
LOCAL_ORDER = "local-order"
DEADLOCK = "deadlock"
MEMORY = "memory"


@dataclass(frozen=True)
class Violation:
    """One problem with a schedule: its kind, a sentence, and the ops and device involved."""

    kind: str
    message: str
    ops: tuple[Op, ...] = ()
    device: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def validate(schedule: Schedule, *, memory_limit: int | None = None) -> list[Violation]:
    """All violations of ``schedule`` (empty list: valid).

    >>> from pipesched.generators import generate
    >>> validate(generate("1f1b", 4, 8))
    []
    """
    found = _structure(schedule)
    if not found:
        found += _order(schedule)
    if memory_limit is not None:
        found += _memory(schedule, memory_limit)
    return found


def _structure(schedule: Schedule) -> list[Violation]:
    found: list[Violation] = []
    counts = Counter(op for _, op in schedule.ops())
    for device, op in schedule.ops():
        if not (0 <= op.stage < schedule.num_stages and 0 <= op.microbatch < schedule.num_microbatches):
            found.append(Violation(
                OUT_OF_RANGE,
                f"{op} on device {device} names stage {op.stage} / microbatch {op.microbatch}; "
                f"the schedule has stages 0..{schedule.num_stages - 1} and microbatches 0..{schedule.num_microbatches - 1}",
                (op,), device))
            continue
        expected = schedule.device_of(op.stage, op.microbatch)
        if expected != device:
            found.append(Violation(
                PLACEMENT,
                f"{op} is on device {device} but the placement puts stage {op.stage} "
                f"(microbatch {op.microbatch}) on device {expected}",
                (op,), device))
    for op, count in sorted(counts.items()):
        if count > 1:
            found.append(Violation(DUPLICATE, f"{op} appears {count} times", (op,)))
    for stage in range(schedule.num_stages):
        for mb in range(schedule.num_microbatches):
            found += _completeness(counts, stage, mb)
    return found


def _completeness(counts: Counter, stage: int, mb: int) -> list[Violation]:
    has = {kind: counts[Op(stage, kind, mb)] > 0 for kind in (F, I, W, B)}
    found = []
    if not has[F]:
        found.append(Violation(MISSING, f"{Op(stage, F, mb)} is missing", (Op(stage, F, mb),)))
    if has[B] and (has[I] or has[W]):
        ops = tuple(Op(stage, k, mb) for k in (B, I, W) if has[k])
        found.append(Violation(
            MIXED_BACKWARD,
            f"stage {stage} microbatch {mb} has both a full backward B and split I/W ops; use B, or I and W",
            ops))
    elif not has[B]:
        if not has[I] and not has[W]:
            found.append(Violation(MISSING, f"{Op(stage, B, mb)} (or {Op(stage, I, mb)} and {Op(stage, W, mb)}) is missing",
                                   (Op(stage, B, mb),)))
        elif not has[I]:
            found.append(Violation(MISSING, f"{Op(stage, I, mb)} is missing (its W is present)", (Op(stage, I, mb),)))
        elif not has[W]:
            found.append(Violation(MISSING, f"{Op(stage, W, mb)} is missing (its I is present)", (Op(stage, W, mb),)))
    return found


def _order(schedule: Schedule) -> list[Violation]:
    position = {op: (device, index) for device, ops in enumerate(schedule.device_ops) for index, op in enumerate(ops)}
    found = []
    for device, ops in enumerate(schedule.device_ops):
        for index, op in enumerate(ops):
            for pred in schedule.predecessors(op):
                where = position[pred]
                if where[0] == device and where[1] > index:
                    found.append(Violation(
                        LOCAL_ORDER,
                        f"device {device} runs {op} (position {index}) before {pred} (position {where[1]}), which it needs",
                        (op, pred), device))
    if found:
        return found
    stuck = walk(schedule, lambda op: 1.0).stuck
    if stuck is None:
        return []
    cycle = stuck.cycle or stuck.waits
    chain = "; ".join(f"device {d} waits at {head} for {missing}" for d, head, missing in cycle)
    ops = tuple(op for _, head, missing in cycle for op in (head, missing))
    return [Violation(DEADLOCK, f"the devices wait on each other in a cycle: {chain}", ops)]


def _memory(schedule: Schedule, limit: int) -> list[Violation]:
    from pipesched.slot_table import held_after_each_op  # numpy: imported only for this check

    found = []
    for device, ops in enumerate(schedule.device_ops):
        for op, held in held_after_each_op(ops):
            if held > limit:
                found.append(Violation(
                    MEMORY,
                    f"device {device} holds {held} stage-microbatches of activations at {op}; the limit is {limit}",
                    (op,), device))
                break
    return found


# violations a report lists one by one (and marks in the table); the rest are counted by kind
REPORTED_VIOLATIONS = 50


def format_report(schedule: Schedule, violations: list[Violation]) -> str:
    """The violations (the first REPORTED_VIOLATIONS, then a count of the rest by kind),
    then the table with the ops involved marked ``>op<``."""
    shown = violations[:REPORTED_VIOLATIONS]
    lines = [f"{schedule.name}: {len(violations)} violation(s)"]
    lines += [f"  {v}" for v in shown]
    if len(violations) > len(shown):
        rest = Counter(v.kind for v in violations[len(shown):])
        lines.append(f"  ... and {len(violations) - len(shown)} more: "
                     + ", ".join(f"{count} {kind}" for kind, count in sorted(rest.items())))
    marked = {op for v in shown for op in v.ops}
    lines.append("")
    for device, ops in enumerate(schedule.device_ops):
        cells = [f">{op}<" if op in marked else str(op) for op in ops]
        flag = "   <-- ERROR HERE" if any(op in marked for op in ops) else ""
        lines.append(f"d{device}: {' '.join(cells)}{flag}")
    return "\n".join(lines)
