"""ZB-2p: the zero-bubble paper's automatic schedule under twice 1F1B's activation memory (Qi et al.,
ICLR 2024, section 3.1).

The heuristic runs on the setup's own per-stage F, I, W costs and link latency (see
``zb_greedy``): a stage-microbatch holds M_B from its F until its I and M_W from its I until
its W, and every device holds at most 2p M_B. With that room the paper reports almost no bubble.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate
from pipesched.generators.zero_bubble import automatic_formula, automatic_schedule, zb_h2_formula
from pipesched.schedule import Schedule


def zb_2p(p: int, m: int, *, costs: StageCosts | None = None, latency: float = 0.0,
          activation_limit: float | None = None, m_w: float | None = None) -> Schedule:
    """The heuristic's tables: ``costs`` per stage (default F = I = W = 1), ``latency`` between
    neighbouring stages, ``activation_limit`` in units of M_B (default 2p), ``m_w`` = M_W / M_B
    (default 1 - costs.input_frees).

    >>> [str(op) for op in zb_2p(2, 3).device_ops[1]]
    ['1F0', '1I0', '1F1', '1I1', '1F2', '1I2', '1W0', '1W1', '1W2']
    """
    return automatic_schedule("zb-2p", p, m, default_limit=2 * p, costs=costs, latency=latency,
                              activation_limit=activation_limit, m_w=m_w)


def zb_2p_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    return automatic_formula(zb_h2_formula(p, m, v, c), "ZB-H2", "idles exactly this from m = 2p-1 on, at most this below")


FAMILY = Family(
    name="zb-2p",
    summary="zero bubble's automatic schedule at twice 1F1B memory (2p M_B), from the stage costs",
    constraints="p >= 2, m >= 1; activation_limit >= 1 (units of M_B), m_w in [0, 1], latency >= 0",
    build=lambda p, m, *, v=None, **options: zb_2p(p, m, **options),
    formula=zb_2p_formula,
    options=("costs", "latency", "activation_limit", "m_w"),
    plans_with_costs=True,
)
