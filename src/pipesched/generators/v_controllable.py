"""The V schedules of controllable memory ("Pipeline Parallelism with Controllable Memory",
Qi et al., NeurIPS 2024): a V-shape table repeating one building block (see v_blocks), and
the closed form they share; V-Half and V-Min differ in the block and its bubble."""

from __future__ import annotations

from collections.abc import Callable

from pipesched.costs import StageCosts
from pipesched.generators.base import FormulaEstimate, check_sizes
from pipesched.generators.v_blocks import block_schedule
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
