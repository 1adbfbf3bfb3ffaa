"""GPipe: all forwards, then all backwards (Huang et al., 2019)."""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.ops import B, F, Op
from pipesched.schedule import Placement, Schedule


def gpipe(p: int, m: int) -> Schedule:
    """Device d runs F(d, 0..m-1), then B(d, 0..m-1) in the same microbatch order.

    >>> [str(op) for op in gpipe(2, 2).device_ops[1]]
    ['1F0', '1F1', '1B0', '1B1']
    """
    check_sizes(p, m)
    device_ops = tuple(
        tuple(Op(d, F, mb) for mb in range(m)) + tuple(Op(d, B, mb) for mb in range(m))
        for d in range(p)
    )
    return Schedule("gpipe", Placement.one_per_device(p), m, device_ops, params={"p": p, "m": m})


def flushed_formula(p: int, m: int, c: StageCosts, peak: int) -> FormulaEstimate:
    """A pipeline flushed every iteration, one stage per device: every device idles
    (p-1)(F+B), the fill and drain, and works m(F+B); ``peak`` microbatches' activations
    held (exact)."""
    return FormulaEstimate(
        idle=(p - 1) * (c.f + c.b),
        work=m * (c.f + c.b),
        peak_inflight=peak,
        activation_units=peak,
        exact=True,
    )


def gpipe_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    # the fill and drain; all m activations held
    return flushed_formula(p, m, c, m)


FAMILY = Family(
    name="gpipe",
    summary="all forwards then all backwards; holds every microbatch's activations",
    constraints="p >= 2, m >= 1",
    build=lambda p, m, *, v=None: gpipe(p, m),
    formula=gpipe_formula,
)
