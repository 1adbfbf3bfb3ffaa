"""V-Half: a V-shape schedule with about half of 1F1B's activation memory ("Pipeline
Parallelism with Controllable Memory", Qi et al., NeurIPS 2024), built from its repeating
building block (see v_blocks)."""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.v_blocks import block_half, block_schedule
from pipesched.schedule import Placement, Schedule


def v_half(p: int, m: int) -> Schedule:
    """Device d holds stages d and 2p-1-d; the block's lifespans keep about p+2 chunk
    activations (p/2 + 1 1F1B stages) in flight.

    >>> [str(op) for op in v_half(2, 2).device_ops[0]]
    ['0F0', '0F1', '3F0', '3I0', '3W0', '3F1', '0I0', '3I1', '3W1', '0W0', '0I1', '0W1']
    """
    check_sizes(p, m)
    tables = block_schedule(block_half(p), m)
    return Schedule("v-half", Placement.vshape(p), m, tuple(tuple(ops) for ops in tables),
                    params={"p": p, "m": m})


def v_half_peak(p: int, m: int) -> int:
    """In-flight chunk activations on the worst device: the block's, or 2 per microbatch."""
    return min(2 * (p // 2) + 2, 2 * m)


def v_half_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op. The paper's bubble for V-Half is about p/(2m)
    of the work, i.e. idle about p(F+I+W): half of 1F1B's in whole-stage units."""
    peak = v_half_peak(p, m)
    return FormulaEstimate(
        idle=p * (c.f + c.i + c.w),
        work=2 * m * (c.f + c.i + c.w),
        peak_inflight=peak,
        activation_units=peak / 2,
        exact=False,
        note=(
            "times in slots of one chunk op; idle is the paper's approximation (with F = I = W "
            "the table idles between 3p-7 and 3p F once m >= 2p, at most 4p F with fewer "
            "microbatches); the peak is exact for this building block"
        ),
    )


FAMILY = Family(
    name="v-half",
    summary="V placement, about half of 1F1B's activation memory, small bubble",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: v_half(p, m),
    formula=v_half_formula,
    chunks=2,
)
