"""Schedule validation: typed violations, never an exception for a bad table.

Checks, in order: fused ops (parts of the kinds their rule lists, all of one device, none
needing another's output); then the one index pass of ``pipesched.dependencies`` (ops out
of range, off the device their placement and the microbatch's replica say, duplicates,
stage-microbatches that do not run exactly one complete set of kinds, less what a frozen
stage drops, an offload with its reload); local order (a device waiting on an op it runs
later); cross-device deadlock (the ops that wait on each other in a cycle); optional memory
limit in in-flight stage-microbatches per device. A command that needs a valid table
raises the first of the same violations (``Violation.error``).
"""

from __future__ import annotations

from collections import Counter

from pipesched.dependencies import (
    DUPLICATE,
    FROZEN,
    FUSED,
    MISSING,
    MIXED_BACKWARD,
    OUT_OF_RANGE,
    PLACEMENT,
    Violation,
    fused_violations,
    index_violations,
)
from pipesched.errors import PipeschedError
from pipesched.ops import Op
from pipesched.ordering import walk
from pipesched.rules import held_after_each_op
from pipesched.schedule import Schedule
from pipesched.wording import counted

# Violation kinds beyond the index pass's
LOCAL_ORDER = "local-order"
DEADLOCK = "deadlock"
MEMORY = "memory"
__all__ = ["DEADLOCK", "DUPLICATE", "FROZEN", "FUSED", "LOCAL_ORDER", "MEMORY", "MISSING", "MIXED_BACKWARD",
           "OUT_OF_RANGE", "PLACEMENT", "REPORTED_VIOLATIONS", "Violation", "format_report", "require_valid",
           "validate"]


def validate(schedule: Schedule, *, activation_limit: int | None = None) -> list[Violation]:
    """All violations of ``schedule`` (empty list: valid).

    >>> from pipesched.generators import generate
    >>> validate(generate("1f1b", 4, 8))
    []
    """
    found = fused_violations(schedule) + index_violations(schedule)
    if not found:
        found += _order(schedule)
    if activation_limit is not None:
        found += _memory(schedule, activation_limit)
    return found


def require_valid(schedule: Schedule, source: str) -> Schedule:
    """``schedule`` if it has no violation; else a PipeschedError naming ``source`` (the
    file it came from) and its first violation."""
    violations = validate(schedule)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise PipeschedError(f"schedule_file={source}: not a valid schedule: {violations[0]}{more}; run "
                             "`pipesched validate` on it for the full report")
    return schedule


def _order(schedule: Schedule) -> list[Violation]:
    position = {atom: (device, index) for device, ops in enumerate(schedule.device_ops)
                for index, op in enumerate(ops) for atom in op.atoms}
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
    found = []
    for device, ops in enumerate(schedule.device_atoms):
        for op, held in held_after_each_op(ops, schedule.rules, schedule.roles):
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
    lines = [f"{schedule.name}: {counted(len(violations), 'violation')}"]
    lines += [f"  {v}" for v in shown]
    if len(violations) > len(shown):
        rest = Counter(v.kind for v in violations[len(shown):])
        lines.append(f"  ... and {len(violations) - len(shown)} more: "
                     + ", ".join(f"{count} {kind}" for kind, count in sorted(rest.items())))
    marked = {op for v in shown for op in v.ops}
    lines.append("")

    def hit(op: Op) -> bool:
        return op in marked or any(atom in marked for atom in op.atoms)

    for device, ops in enumerate(schedule.device_ops):
        cells = [f">{op}<" if hit(op) else str(op) for op in ops]
        flag = "   <-- ERROR HERE" if any(hit(op) for op in ops) else ""
        lines.append(f"d{device}: {' '.join(cells)}{flag}")
    return "\n".join(lines)
