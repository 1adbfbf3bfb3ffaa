"""The V schedules of controllable memory ("Pipeline Parallelism with Controllable Memory",
Qi et al., NeurIPS 2024): V-Half (about half of 1F1B's activation memory) and V-Min (about
a third), each a V-shape table repeating its building block (see v_blocks), with one closed
form; they differ in the block and its bubble."""

from __future__ import annotations

from collections.abc import Callable

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.v_blocks import block_half, block_min, block_schedule
from pipesched.schedule import Placement, Schedule


def block_v_schedule(name: str, block: Callable[[int], object], p: int, m: int) -> Schedule:
    """Family ``name``'s tables: device d holds stages d and 2p-1-d, its ops the building
    block ``block(p)`` repeated over m microbatches."""
    check_sizes(p, m)
    tables = block_schedule(block(p), m)
    return Schedule(name, Placement.vshape(p), m, tuple(tuple(ops) for ops in tables),
                    params={"p": p, "m": m})


def block_v_formula(idle: float, peak: int, m: int, c: StageCosts, idle_range: str) -> FormulaEstimate:
    """The closed form in slots of one chunk op: the paper's ``idle``, 2m chunk ops of each
    kind, ``peak`` chunk activations in flight (exact for the block); ``idle_range``: what
    the table idles with F = I = W once m >= 2p, as the note says."""
    return FormulaEstimate(
        idle=idle,
        work=2 * m * (c.f + c.i + c.w),
        peak_inflight=peak,
        activation_units=peak / 2,
        exact=False,
        note=(
            "times in slots of one chunk op; idle is the paper's approximation (with F = I = W "
            f"the table idles between {idle_range} F once m >= 2p, at most 4p F with fewer "
            "microbatches); the peak is exact for this building block"
        ),
    )


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


FAMILY_HALF = Family(
    name="v-half",
    summary="V placement, about half of 1F1B's activation memory, small bubble",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: v_half(p, m),
    formula=v_half_formula,
    chunks=2,
)


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


FAMILY_MIN = Family(
    name="v-min",
    summary="V placement, about a third of 1F1B's activation memory, bubble about 2/3 of 1F1B's",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: v_min(p, m),
    formula=v_min_formula,
    chunks=2,
)
