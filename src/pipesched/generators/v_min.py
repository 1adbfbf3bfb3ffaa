"""V-Min: a V-shape schedule with about a third of 1F1B's activation memory ("Pipeline
Parallelism with Controllable Memory", Qi et al., NeurIPS 2024), built from its repeating
building block (see v_blocks)."""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate
from pipesched.generators.v_blocks import block_min
from pipesched.generators.v_controllable import block_v_formula, block_v_schedule
from pipesched.schedule import Schedule


def v_min(p: int, m: int) -> Schedule:
    """Device d holds stages d and 2p-1-d; the block's lifespans keep about 2p/3 + 2 chunk
    activations (p/3 + 1 1F1B stages) in flight.

    >>> [str(op) for op in v_min(2, 2).device_ops[0]]
    ['0F0', '0F1', '3F0', '3I0', '3W0', '0I0', '0W0', '3F1', '3I1', '3W1', '0I1', '0W1']
    """
    return block_v_schedule("v-min", block_min, p, m)


def v_min_peak(p: int, m: int) -> int:
    """In-flight chunk activations on the worst device: the block's, or 2 per microbatch."""
    return min(2 * ((p + 1) // 3) + 2, 2 * m)


def v_min_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op. The paper's bubble for V-Min is about 2p/(3m)
    of the work, i.e. idle about (4p/3)(F+I+W): two thirds of 1F1B's in whole-stage units."""
    return block_v_formula(4 * p * (c.f + c.i + c.w) / 3, v_min_peak(p, m), m, c, "4p-7 and 4p")


FAMILY = Family(
    name="v-min",
    summary="V placement, about a third of 1F1B's activation memory, bubble about 2/3 of 1F1B's",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: v_min(p, m),
    formula=v_min_formula,
    chunks=2,
)
