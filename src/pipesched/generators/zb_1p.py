"""ZB-1p: the zero-bubble paper's automatic schedule under 1F1B's activation memory (Qi et al.,
ICLR 2024, section 3.1).

The heuristic runs on the setup's own per-stage F, I, W costs and link latency (see
``zb_greedy``): a stage-microbatch holds M_B from its F until its I and M_W from its I until
its W, and every device holds at most p M_B, what 1F1B's first device holds. The paper reports it close to ZB-H1's bubble, a third of 1F1B's when F = I = W.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate
from pipesched.generators.zero_bubble import automatic_formula, automatic_schedule, zb_h1_formula
from pipesched.schedule import Schedule


def zb_1p(p: int, m: int, *, costs: StageCosts | None = None, latency: float = 0.0,
          activation_limit: float | None = None, m_w: float | None = None) -> Schedule:
    """The heuristic's tables: ``costs`` per stage (default F = I = W = 1), ``latency`` between
    neighbouring stages, ``activation_limit`` in units of M_B (default p), ``m_w`` = M_W / M_B
    (default 1 - costs.input_frees).

    >>> [str(op) for op in zb_1p(2, 3).device_ops[1]]
    ['1F0', '1I0', '1F1', '1I1', '1W0', '1F2', '1I2', '1W1', '1W2']
    """
    return automatic_schedule("zb-1p", p, m, default_limit=p, costs=costs, latency=latency,
                              activation_limit=activation_limit, m_w=m_w)


def zb_1p_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    return automatic_formula(zb_h1_formula(p, m, v, c), "ZB-H1", "idles exactly this")


FAMILY = Family(
    name="zb-1p",
    summary="zero bubble's automatic schedule at 1F1B memory (p M_B), from the stage costs",
    constraints="p >= 2, m >= 1; activation_limit >= 1 (units of M_B), m_w in [0, 1], latency >= 0",
    build=lambda p, m, *, v=None, **options: zb_1p(p, m, **options),
    formula=zb_1p_formula,
    options=("costs", "latency", "activation_limit", "m_w"),
    plans_with_costs=True,
)
