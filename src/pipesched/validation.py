"""Schedule validation: typed violations, never an exception for a bad table.

Checks, in order, every rule from the rules table: the structure, in one pass
(``structure_violations``: fused ops whose parts break their rule, lie on two devices or
need each other's output; ops out of range, off the device their placement and the
microbatch's replica say, duplicates; stage-microbatches that do not run exactly one
complete set of kinds, less what a frozen stage drops, an offload with its reload); local
order (a device waiting on an op it runs later); cross-device deadlock (the ops that wait on
each other in a cycle, from the one walk of ``pipesched.ordering``); optional memory limit
in in-flight stage-microbatches per device. A command that needs a valid table
(``pipesched.dependencies``, which finds the same problems with compiled code) raises the
first of these violations as one line (``Violation.error``). No numpy is loaded here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipesched.errors import PipeschedError
from pipesched.ops import Op
from pipesched.ordering import walk
from pipesched.rules import Rules, held_after_each_op
from pipesched.schedule import Schedule
from pipesched.wording import counted

# what is wrong with a table (Violation.kind)
OUT_OF_RANGE = "out-of-range"
DUPLICATE = "duplicate"
PLACEMENT = "placement"
MISSING = "missing"
MIXED_BACKWARD = "mixed-backward"
FROZEN = "frozen"
FUSED = "fused"
# what to run for the whole list, in an error that names the first violation
FULL_REPORT = "run `pipesched validate` on the schedule for the full report"


@dataclass(frozen=True)
class Violation:
    """One problem with a schedule: its kind, a sentence, the ops and device involved, and
    as a one-line error: ``subject`` (``field=value``) and ``detail`` (the fix)."""

    kind: str
    message: str
    ops: tuple[Op, ...] = ()
    device: int | None = None
    subject: str = ""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    def error(self) -> PipeschedError:
        """This violation as the error of a command that needs a valid table."""
        if not self.subject:
            return PipeschedError(f"schedule: {self.message}; {FULL_REPORT}")
        return PipeschedError(f"{self.subject}: {self.detail}; {FULL_REPORT}")


def _about_op(kind: str, op: Op, detail: str, device: int | None = None) -> Violation:
    return Violation(kind, f"{op} {detail}", (op,), device, f"op={op}", detail)


LOCAL_ORDER = "local-order"
DEADLOCK = "deadlock"
MEMORY = "memory"


def validate(schedule: Schedule, *, activation_limit: int | None = None) -> list[Violation]:
    """All violations of ``schedule`` (empty list: valid).

    >>> from pipesched.generators import generate
    >>> validate(generate("1f1b", 4, 8))
    []
    """
    found = structure_violations(schedule)
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


def structure_violations(schedule: Schedule) -> list[Violation]:
    """What is wrong with ``schedule``'s ops, in one pass over them (plain Python, so that
    checking a schedule loads no numpy; ``pipesched.dependencies`` finds the same problems
    with compiled code and raises the first of these): fused entries that break their rule;
    each op out of range or off the device its placement (and its microbatch's replica)
    says, in table order; each op that appears more than once; each stage-microbatch that
    does not run exactly one of the sets of kinds its stage's role accepts."""
    found = fused_violations(schedule)
    counts = Counter(op for _, op in schedule.ops())
    last_stage, last_mb = schedule.num_stages - 1, schedule.num_microbatches - 1
    for device, op in schedule.ops():
        if not (0 <= op.stage <= last_stage and 0 <= op.microbatch <= last_mb):
            found.append(_about_op(OUT_OF_RANGE, op, f"on device {device} names stage {op.stage} / microbatch "
                                   f"{op.microbatch}; the schedule has stages 0..{last_stage} and microbatches "
                                   f"0..{last_mb}", device))
            continue
        expected = schedule.device_of(op.stage, op.microbatch)
        if expected != device:
            found.append(_about_op(PLACEMENT, op, f"is on device {device}, but the placement puts it on device "
                                   f"{expected} (stage {op.stage}, microbatch {op.microbatch})", device))
    found += [_about_op(DUPLICATE, op, f"appears {count} times") for op, count in sorted(counts.items()) if count > 1]
    rules = schedule.rules
    # completeness counts kinds per stage-microbatch, over all its steps (decode steps)
    kinds = Counter(Op(op.stage, op.kind, op.microbatch) for op in counts) if rules.stepped else counts
    for stage in range(schedule.num_stages):
        accepted = rules.accepted_for(schedule.roles[stage])
        for mb in range(schedule.num_microbatches):
            present = frozenset(rule.kind for rule in rules if kinds[Op(stage, rule.kind, mb)] > 0)
            if present not in accepted:
                found.append(completeness(present, stage, mb, rules, schedule.roles[stage]))
    return found


def completeness(present: frozenset, stage: int, mb: int, rules: Rules, role: str) -> Violation:
    """Why a stage-microbatch that runs the kinds ``present`` is not complete: it must run
    exactly one of the sets of kinds its stage's role accepts (F and B, or F, I and W, less
    what a frozen stage drops; an offload with its reload). Names the ops a frozen stage does
    not run, the missing ops of the closest set(s), or a mix of two sets."""

    def ops(kinds: frozenset) -> tuple[Op, ...]:
        return tuple(Op(stage, rule.kind, mb) for rule in rules if rule.kind in kinds)

    def found(kind: str, message: str, involved: tuple[Op, ...]) -> Violation:
        fix = f"{message}; a stage-microbatch of stage {stage} needs {rules.describe_complete(role)}"
        return Violation(kind, message, involved, None, f"stage_microbatch={stage},{mb}", fix)

    dropped = present - rules.kinds_for(role)
    if dropped:
        return found(FROZEN, f"stage {stage} is frozen ({role}): it does not run "
                             f"{' and '.join(map(str, ops(dropped)))}; its stage-microbatches run "
                             f"{rules.describe_complete(role)}", ops(dropped))
    candidates = [kinds for kinds in rules.accepted_for(role) if present <= kinds]
    if not candidates:
        return found(MIXED_BACKWARD, f"stage {stage} microbatch {mb} mixes ops of different complete sets "
                                     f"({', '.join(map(str, ops(present)))}); run {rules.describe_complete(role)}",
                     ops(present))
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
    return found(MISSING, text, options[0])


def fused_violations(schedule: Schedule) -> list[Violation]:
    """Fused entries of an unknown kind, whose parts do not fit their rule, lie on another
    device, or need each other's output."""
    found: list[Violation] = []
    rules = schedule.rules
    for device, ops in enumerate(schedule.device_ops):
        for op in ops:
            if not op.parts:
                continue
            if op.kind not in rules.fused_kinds:
                found.append(_fused(op, device, f"{op.kind} is not a fused kind of the rules"))
                continue
            problem = rules.fused_problem(op)
            if problem is not None:
                found.append(_fused(op, device, problem))
                continue
            owners = {schedule.device_of(part.stage, part.microbatch) for part in op.parts
                      if 0 <= part.stage < schedule.num_stages and 0 <= part.microbatch < schedule.num_microbatches}
            if len(owners) > 1:
                found.append(_fused(op, device, f"its parts belong to devices {', '.join(map(str, sorted(owners)))}; "
                                                "fuse ops of one device only"))
            for part in op.parts:
                if part.kind not in rules.by_kind:
                    continue
                inner = [pred for pred in schedule.predecessors(part) if pred in op.parts]
                if inner:
                    found.append(_fused(op, device, f"its part {part} needs the output of {inner[0]}, so the two "
                                                    "cannot run at once; run them as separate ops"))
    return found


def _fused(op: Op, device: int, detail: str) -> Violation:
    return Violation(FUSED, f"{op} on device {device}: {detail}", (op,), device, f"op={op}", detail)


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
