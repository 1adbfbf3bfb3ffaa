"""Parameter freezing: a table with the ops its frozen stages do not run left out.

A stage whose layers are all frozen computes no weight gradient; a stage with every stage
before it frozen needs no input gradient either, and then runs no backward at all
(``pipesched.rules.stage_roles``). ``freeze`` keeps, on every device and in the family's
order, the ops each stage's role runs (``Rules.kinds_for``): W and the weight half of B go
from frozen stages (a B there costs what I costs), every backward from forward-only
stages; a fused pair keeps the parts that still run. The ops that remain move up on their device: the table is an order, not a grid.

>>> from pipesched.generators import generate
>>> frozen = freeze(generate("zb-h1", 2, 2), {0})
>>> [str(op) for op in frozen.device_ops[0]], sorted(frozen.frozen)
(['0F0', '0F1'], [0])
"""

from __future__ import annotations

from collections.abc import Iterable

from pipesched.errors import require
from pipesched.ops import Op
from pipesched.rules import stage_roles
from pipesched.schedule import Schedule


def freeze(schedule: Schedule, frozen: Iterable[int]) -> Schedule:
    """``schedule`` with the stages ``frozen`` frozen (see the module docstring).

    Raises PipeschedError for a stage outside the schedule, or when ``schedule`` already
    freezes a stage that ``frozen`` leaves out (its dropped ops cannot come back).
    """
    stages = frozenset(int(stage) for stage in frozen)
    outside = sorted(stage for stage in stages if not 0 <= stage < schedule.num_stages)
    require(not outside, "frozen stage", outside[0] if outside else "",
            f"{schedule.name} has stages 0..{schedule.num_stages - 1}")
    thawed = sorted(schedule.frozen - stages)
    require(not thawed, "frozen stage", thawed[0] if thawed else "",
            f"{schedule.name} is already frozen there; freeze the family's own table instead")
    if stages == schedule.frozen:
        return schedule
    roles = stage_roles(schedule.num_stages, stages)
    runs = {role: schedule.rules.kinds_for(role) for role in set(roles)}

    def kept(op: Op) -> Op | None:
        # a fused pair keeps the parts that still run: both (still a pair), one (a plain op), or none
        parts = tuple(part for part in op.atoms if part.kind in runs[roles[part.stage]])
        if not op.parts:
            return op if parts else None
        return Op.fused(*parts, kind=op.kind) if len(parts) > 1 else (parts[0] if parts else None)

    rows = tuple(tuple(op for op in map(kept, ops) if op is not None) for ops in schedule.device_ops)
    return schedule.with_ops(rows, frozen=stages)

