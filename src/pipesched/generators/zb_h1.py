"""ZB-H1: zero-bubble's memory-efficient handcrafted schedule (Qi et al., ICLR 2024, 2.1).

1F1B with the backward split into I and W: device d delays its W by d microbatches, so every
device holds p microbatches like 1F1B's first device, and the input gradients run back up
the pipeline without waiting for W. The bubble shrinks to (p-1)(F+I-W), a third of 1F1B's
when F = I = W.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family
from pipesched.generators.zero_bubble import one_stage_schedule, zb_h1_formula
from pipesched.schedule import Schedule


def zb_h1(p: int, m: int, *, costs: StageCosts | None = None,
          activation_limit: int | None = None) -> Schedule:
    """Device d: p-d warm-up forwards, then I / (W) / F, holding at most p microbatches.

    With ``costs`` (per-stage F/I/W) or ``activation_limit`` (in-flight stage-microbatches per
    device, default p) the zero-bubble heuristic builds the table instead.

    >>> [str(op) for op in zb_h1(2, 3).device_ops[1]]
    ['1F0', '1I0', '1F1', '1I1', '1W0', '1F2', '1I2', '1W1', '1W2']
    """
    return one_stage_schedule(
        "zb-h1", p, m, warmup=[p - d for d in range(p)], delay=list(range(p)), default_limit=p,
        costs=costs, activation_limit=activation_limit
    )


FAMILY = Family(
    name="zb-h1",
    summary="zero bubble, 1F1B memory: split backward, W deferred into the drain",
    constraints="p >= 2, m >= 1; activation_limit >= 1",
    build=lambda p, m, *, v=None, **options: zb_h1(p, m, **options),
    formula=zb_h1_formula,
    options=("costs", "activation_limit"),
)
