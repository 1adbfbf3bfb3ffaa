"""ZB-V: zero-bubble's V-shape schedule (Qi et al., ICLR 2024, section 6), the table PyTorch's
``ScheduleZBVZeroBubble`` builds.

Each device holds two chunks placed as a V: stage d (down) and stage 2p-1-d (up), so a
microbatch's forward goes down the devices and comes back up, and its last stage runs on
device 0 like its first. With F = I = W the table has no bubble inside any device's span and
holds 1F1B's activation memory (2p half-size stages on device 0).
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, per_stage_costs
from pipesched.generators.v_greedy import v_greedy
from pipesched.generators.zero_bubble import check_activation_limit
from pipesched.limits import MAX_V_HEURISTIC_DEVICES, check_count
from pipesched.ops import F, I, Op, W
from pipesched.schedule import Placement, Schedule


def handcrafted_zb_v(p: int, m: int) -> tuple[tuple[Op, ...], ...]:
    """The paper's ZB-V, phase by phase. Built for max(m, 2p-1) microbatches (the fewest
    that fill the V), then ops of microbatches >= m are dropped, as PyTorch does."""
    n = max(m, 2 * p - 1)
    return tuple(_device_table(d, p, m, n) for d in range(p))


def _device_table(d: int, p: int, m: int, n: int) -> tuple[Op, ...]:
    """Device d's ops: its down chunk is stage d, its up chunk stage 2p-1-d; built for n
    microbatches, those >= m dropped."""
    down, up = d, 2 * p - 1 - d
    # warm-up: down forwards until the first microbatch can come back up to this device
    warm = 2 * (p - d) - 1
    ops = [Op(down, F, mb) for mb in range(warm)]
    for k in range(d):
        ops += (Op(up, F, k), Op(down, F, warm + k))
    # the first up-chunk backwards, each completed with its W at once
    for k in range(p - d):
        ops += (Op(up, F, d + k), Op(up, I, k), Op(up, W, k))
    # ops placed so far per kind and chunk; each W follows its I at once until the
    # cool-down, so a chunk has placed as many W as I
    f_down, f_up, i_down, i_up = warm + d, p, 0, p - d
    # steady state: F/I/W of the down chunk, then of the up chunk; once every count has
    # reached m, every later op is of a microbatch the table drops (with m << p the
    # V is filled for 2p - 1), so the rest is not built
    while (f_up < f_down or f_down < n) and min(f_down, f_up, i_down, i_up) < m:
        if f_down < n:
            ops.append(Op(down, F, f_down))
            f_down += 1
        ops += (Op(down, I, i_down), Op(down, W, i_down), Op(up, F, f_up), Op(up, I, i_up), Op(up, W, i_up))
        i_down, f_up, i_up = i_down + 1, f_up + 1, i_up + 1
    if min(f_down, f_up, i_down, i_up) < m:
        # cool-down: input gradients first, W deferred to the end
        w_down, w_up = i_down, i_up
        for _ in range(d):
            ops += (Op(down, I, i_down), Op(up, I, i_up))
            i_down, i_up = i_down + 1, i_up + 1
        for _ in range(p - d):
            ops += (Op(down, I, i_down), Op(down, W, w_down))
            i_down, w_down = i_down + 1, w_down + 1
        ops.extend(Op(up, W, mb) for mb in range(w_up, i_up))
        ops.extend(Op(down, W, mb) for mb in range(w_down, i_down))
    # with n = m no op is of a dropped microbatch: a count never passes the forwards' n
    return tuple(op for op in ops if op.microbatch < m) if n > m else tuple(ops)


def zb_v(p: int, m: int, *, costs: StageCosts | None = None,
         activation_limit: int | None = None) -> Schedule:
    """The handcrafted ZB-V; with ``costs`` (per stage of the 2p) or ``activation_limit``
    (in-flight stage-microbatches per device, default 2p) the zero-bubble V heuristic
    builds the table instead.

    >>> [str(op) for op in zb_v(2, 3).device_ops[1]]
    ['1F0', '2F0', '1F1', '2F1', '2I0', '2W0', '1F2', '1I0', '1W0', '2F2', '2I1', '2W1', '1I1', '2I2', '1I2', '1W1', '2W2', '1W2']
    """
    check_sizes(p, m)
    placement = Placement.vshape(p)
    if costs is None and activation_limit is None:
        return Schedule("zb-v", placement, m, handcrafted_zb_v(p, m), params={"p": p, "m": m})
    limit = 2 * p if activation_limit is None else activation_limit
    # device 0 holds both chunks of the first microbatch until its up-chunk backward: the V
    # needs two in flight; below 2p the heuristic trades bubble for memory
    check_activation_limit(limit, 2, "zb-v")
    check_count("p", p, MAX_V_HEURISTIC_DEVICES, what="devices the zb-v heuristic plans (drop --set costs and "
                "activation_limit for the handcrafted ZB-V)")
    tables = v_greedy(p, m, per_stage_costs(costs, 2 * p, "zb-v"), limit)
    if tables is None:
        raise PipeschedError(
            f"activation_limit={limit}: the zb-v heuristic found no schedule for p={p}, m={m}; "
            f"raise the limit or use v-half / v-min for less memory"
        )
    return Schedule(
        "zb-v", placement, m, tuple(tuple(ops) for ops in tables),
        params={"p": p, "m": m, "activation_limit": limit, "heuristic": True},
    )


def zb_v_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op (half a 1F1B stage). With m >= 2p-1 and
    F = I = W every device is busy from its first op to its last; the iteration spans the
    (p-1)F by which the last device starts late. With fewer microbatches the V is not full
    and each missing one costs 2F. Device 0 holds 2p chunks = p 1F1B stages."""
    peak = min(2 * p, 2 * m)
    equal = c.f == c.i == c.w
    return FormulaEstimate(
        idle=max(p - 1, 4 * p - 2 - 2 * m) * c.f,
        work=2 * m * (c.f + c.i + c.w),
        peak_inflight=peak,
        activation_units=peak / 2,
        exact=equal,
        note="times in slots of one chunk op" if equal else (
            "times in slots of one chunk op; exact for F = I = W, otherwise an approximation: the "
            "table idles at least (p-1)F and less than twice this form taken in units of F+I+W"
        ),
    )


FAMILY = Family(
    name="zb-v",
    summary="zero bubble on a V placement (2 chunks per device) with 1F1B's memory",
    constraints="p >= 2, m >= 1; activation_limit >= 2",
    build=lambda p, m, *, v=None, **options: zb_v(p, m, **options),
    formula=zb_v_formula,
    chunks=2,
    options=("costs", "activation_limit"),
)
