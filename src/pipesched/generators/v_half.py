"""V-Half: a V-shape schedule with about half of 1F1B's activation memory ("Pipeline
Parallelism with Controllable Memory", Qi et al., NeurIPS 2024), built from its repeating
building block (see v_blocks)."""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate
from pipesched.generators.v_blocks import block_half
from pipesched.generators.v_controllable import block_v_formula, block_v_schedule
from pipesched.schedule import Schedule


def v_half(p: int, m: int) -> Schedule:
    """Device d holds stages d and 2p-1-d; the block's lifespans keep about p+2 chunk
    activations (p/2 + 1 1F1B stages) in flight.

    >>> [str(op) for op in v_half(2, 2).device_ops[0]]
    ['0F0', '0F1', '3F0', '3I0', '3W0', '3F1', '0I0', '3I1', '3W1', '0W0', '0I1', '0W1']
    """
    return block_v_schedule("v-half", block_half, p, m)


def v_half_peak(p: int, m: int) -> int:
    """In-flight chunk activations on the worst device: the block's, or 2 per microbatch."""
    return min(2 * (p // 2) + 2, 2 * m)


def v_half_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op. The paper's bubble for V-Half is about p/(2m)
    of the work, i.e. idle about p(F+I+W): half of 1F1B's in whole-stage units."""
    return block_v_formula(p * (c.f + c.i + c.w), v_half_peak(p, m), m, c, "3p-7 and 3p")


FAMILY = Family(
    name="v-half",
    summary="V placement, about half of 1F1B's activation memory, small bubble",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: v_half(p, m),
    formula=v_half_formula,
    chunks=2,
)
