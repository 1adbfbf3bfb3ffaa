"""Schedule validation: typed violations, never an exception for a bad table.

Checks, in order: fused ops (parts of the kinds their rule lists, all of one device, none
needing another's output); ops out of range; duplicates; each op on the device its placement
(and the microbatch's replica) says; completeness (F, and B or I+W, for every
stage-microbatch, less what a frozen stage drops; an offload with its reload; a fused op's
parts count); ops a frozen stage does not run; mixed backward kinds; local order (a device
waiting on an op it runs later); cross-device deadlock (the ops that wait on each other in a
cycle); optional memory limit in in-flight stage-microbatches per device.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipesched.errors import PipeschedError
from pipesched.ops import Op, OpKind
from pipesched.ordering import walk
from pipesched.rules import TRAINS, Rules
from pipesched.schedule import Schedule
from pipesched.wording import counted

# Violation kinds
OUT_OF_RANGE = "out-of-range"
DUPLICATE = "duplicate"
PLACEMENT = "placement"
MISSING = "missing"
MIXED_BACKWARD = "mixed-backward"
LOCAL_ORDER = "local-order"
DEADLOCK = "deadlock"
MEMORY = "memory"
FROZEN = "frozen"
FUSED = "fused"


@dataclass(frozen=True)
class Violation:
    """One problem with a schedule: its kind, a sentence, and the ops and device involved."""

    kind: str
    message: str
    ops: tuple[Op, ...] = ()
    device: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def validate(schedule: Schedule, *, activation_limit: int | None = None) -> list[Violation]:
    """All violations of ``schedule`` (empty list: valid).

    >>> from pipesched.generators import generate
    >>> validate(generate("1f1b", 4, 8))
    []
    """
    found = _structure(schedule)
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


def _fused(schedule: Schedule) -> list[Violation]:
    """Fused entries whose parts do not fit their rule, lie on another device, or need each
    other's output."""
    found: list[Violation] = []
    for device, ops in enumerate(schedule.device_ops):
        for op in ops:
            if not op.parts:
                continue
            if op.kind not in schedule.rules.fused_kinds:
                found.append(Violation(FUSED, f"{op} on device {device}: {op.kind} is not a fused kind of the rules",
                                       (op,), device))
                continue
            problem = schedule.rules.fused_problem(op)
            if problem is not None:
                found.append(Violation(FUSED, f"{op} on device {device}: {problem}", (op,), device))
                continue
            owners = {schedule.device_of(part.stage, part.microbatch) for part in op.parts
                      if 0 <= part.stage < schedule.num_stages and 0 <= part.microbatch < schedule.num_microbatches}
            if len(owners) > 1:
                found.append(Violation(FUSED, f"{op} on device {device}: its parts belong to devices "
                                              f"{', '.join(map(str, sorted(owners)))}; fuse ops of one device only",
                                       (op,), device))
            for part in op.parts:
                if part.kind not in schedule.rules.by_kind:
                    continue
                inner = [pred for pred in schedule.predecessors(part) if pred in op.parts]
                if inner:
                    found.append(Violation(FUSED, f"{op} on device {device}: {part} needs {inner[0]}'s output, so "
                                                  "the two cannot run at once; run them as separate ops", (op,), device))
    return found


def _structure(schedule: Schedule) -> list[Violation]:
    found: list[Violation] = _fused(schedule)
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
            found += _completeness(counts, stage, mb, schedule.rules, schedule.roles[stage])
    return found


def _completeness(counts: Counter, stage: int, mb: int, rules: Rules, role: str = TRAINS) -> list[Violation]:
    """A stage-microbatch must run exactly one of the sets of kinds its stage's role accepts
    (F and B, or F, I and W, less what a frozen stage drops; an offload with its reload):
    report the ops a frozen stage does not run, the missing ops of the closest set(s), or a
    mix of two sets."""
    present = frozenset(rule.kind for rule in rules if counts[Op(stage, rule.kind, mb)] > 0)
    accepted = rules.accepted_for(role)
    if present in accepted:
        return []

    def ops(kinds: frozenset[OpKind]) -> tuple[Op, ...]:
        return tuple(Op(stage, rule.kind, mb) for rule in rules if rule.kind in kinds)

    dropped = present - rules.kinds_for(role)
    if dropped:
        return [Violation(
            FROZEN,
            f"stage {stage} is frozen ({role}): it does not run {' and '.join(map(str, ops(dropped)))}; "
            f"its stage-microbatches run {rules.describe_complete(role)}",
            ops(dropped))]
    candidates = [kinds for kinds in accepted if present <= kinds]
    if not candidates:
        return [Violation(
            MIXED_BACKWARD,
            f"stage {stage} microbatch {mb} mixes ops of different complete sets "
            f"({', '.join(map(str, ops(present)))}); run {rules.describe_complete(role)}",
            ops(present))]
    # the closest complete set first; the others as alternatives
    # (the others, with offload ops or a split backward, counted after the next closest)
    options = [ops(kinds - present) for kinds in sorted(candidates, key=lambda kinds: len(kinds - present))]
    text = " and ".join(map(str, options[0])) + (" is missing" if len(options[0]) == 1 else " are missing")
    if len(options) > 1:
        text += f" (or {' and '.join(map(str, options[1]))}"
        text += f", or {counted(len(options) - 2, 'other complete set')})" if len(options) > 2 else ")"
    # ops present beyond what every complete set has say which set this one was meant to be
    specific = ops(present - frozenset.intersection(*rules.complete_for(role)))
    if specific:
        text += f" (its {' and '.join(map(str, specific))} {'is' if len(specific) == 1 else 'are'} present)"
    return [Violation(MISSING, text, options[0])]


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
    from pipesched.slots import held_after_each_op  # numpy: imported only for this check

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
