"""ZB-H2: zero-bubble's handcrafted zero-bubble schedule (Qi et al., ICLR 2024, 2.2).

Device d runs 2(p-d)-1 warm-up forwards, filling the wait for the first input gradient, and
defers W to keep every device busy from its first op to its last. It holds up to 2p-1
microbatches, about twice 1F1B's activations.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family
from pipesched.generators.zero_bubble import one_stage_schedule, zb_h2_formula
from pipesched.schedule import Schedule


def zb_h2(p: int, m: int, *, costs: StageCosts | None = None,
          activation_limit: int | None = None) -> Schedule:
    """Device d: 2(p-d)-1 warm-up forwards, then I / (W) / F, holding at most 2p-1.

    With ``costs`` (per-stage F/I/W) or ``activation_limit`` (in-flight stage-microbatches per
    device, default 2p-1) the zero-bubble heuristic builds the table instead.

    >>> [str(op) for op in zb_h2(2, 3).device_ops[0]]
    ['0F0', '0F1', '0F2', '0I0', '0W0', '0I1', '0W1', '0I2', '0W2']
    """
    return one_stage_schedule(
        "zb-h2", p, m, warmup=[2 * (p - d) - 1 for d in range(p)], delay=[2 * d for d in range(p)],
        default_limit=2 * p - 1,
        costs=costs, activation_limit=activation_limit,
    )


FAMILY = Family(
    name="zb-h2",
    summary="zero bubble inside each device's span, with up to 2p-1 microbatches in flight",
    constraints="p >= 2, m >= 1; activation_limit >= 1",
    build=lambda p, m, *, v=None, **options: zb_h2(p, m, **options),
    formula=zb_h2_formula,
    options=("costs", "activation_limit"),
)
