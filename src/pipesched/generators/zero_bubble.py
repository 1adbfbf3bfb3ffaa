"""What the zero-bubble families share (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024): the split backward (I = input gradient, W = weight gradient), their options (per-stage
F/I/W costs, a link latency and a memory limit), the handcrafted ZB-H1 / ZB-H2 tables and
the paper's automatic schedules ZB-1p / ZB-2p.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import FormulaEstimate, check_sizes, per_stage_costs
from pipesched.generators.zb_greedy import Memory, zb_greedy
from pipesched.limits import check_family_option
from pipesched.ops import F, I, Op, W
from pipesched.schedule import Placement, Schedule


def check_activation_limit(activation_limit: int, smallest: int, family: str) -> None:
    """A memory limit must be a whole number of stage-microbatches the heuristic can use."""
    require(
        isinstance(activation_limit, int) and not isinstance(activation_limit, bool),
        "activation_limit",
        activation_limit,
        "give a whole number of in-flight stage-microbatches per device",
    )
    require(
        activation_limit >= smallest,
        "activation_limit",
        activation_limit,
        f"too small for {family} to make progress; the smallest that works here is {smallest}",
    )


def handcrafted_tables(p: int, m: int, *, warmup: list[int], delay: list[int]) -> tuple[tuple[Op, ...], ...]:
    """The paper's handcrafted one-stage-per-device schedules (its figure 3).

    Device d runs ``warmup[d]`` forwards, then for each microbatch k its I, the W of
    microbatch k - ``delay[d]`` (once there is one), and its next forward while any is left;
    the W still owed close the iteration. Deferring W lets the input gradients run back up
    the pipeline without waiting; device d then holds warmup[d] + delay[d] microbatches (at most m).
    """
    tables = []
    for d in range(p):
        first = min(warmup[d], m)
        ops = [Op(d, F, mb) for mb in range(first)]
        for k in range(m):
            ops.append(Op(d, I, k))
            if k >= delay[d]:
                ops.append(Op(d, W, k - delay[d]))
            if first + k < m:
                ops.append(Op(d, F, first + k))
        # cool-down: the W deferred past the last I
        ops.extend(Op(d, W, k) for k in range(max(0, m - delay[d]), m))
        tables.append(tuple(ops))
    return tuple(tables)


def one_stage_schedule(
    name: str,
    p: int,
    m: int,
    *,
    warmup: list[int],
    delay: list[int],
    default_limit: int,
    costs: StageCosts | None,
    activation_limit: int | None,
) -> Schedule:
    """ZB-H1 / ZB-H2: the handcrafted table, or the heuristic when costs or a memory limit
    are given (the handcrafted tables assume F = I = W and their own memory)."""
    check_sizes(p, m)
    if costs is None and activation_limit is None:
        tables = handcrafted_tables(p, m, warmup=warmup, delay=delay)
        params: dict[str, object] = {"p": p, "m": m}
    else:
        limit = default_limit if activation_limit is None else activation_limit
        # one in flight always works: F, I, W of a microbatch before the next F
        check_activation_limit(limit, 1, name)
        # memory in stage-microbatches: F takes one, W gives it back (M_W = M_B)
        memory = Memory(limit=limit, m_w=1.0)
        tables = tuple(tuple(ops) for ops in zb_greedy(m, per_stage_costs(costs, p, name), memory))
        params = {"p": p, "m": m, "activation_limit": limit, "heuristic": True}
    return Schedule(name, Placement.one_per_device(p), m, tables, params=params)


def _number(value: object, name: str, low: float, high: float, fix: str) -> float:
    require(
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        and low <= value <= high,
        name,
        value,
        fix,
    )
    return float(value)


DEFAULT_INPUT_FREES = 0.5


def automatic_schedule(
    name: str,
    p: int,
    m: int,
    *,
    default_limit: int,
    costs: StageCosts | None,
    latency: object,
    activation_limit: object | None,
    m_w: object | None,
) -> Schedule:
    """ZB-1p / ZB-2p: the paper's heuristic on the stage costs, the link latency and a memory
    limit in units of M_B (default ``default_limit``: p for ZB-1p, 2p for ZB-2p). M_W / M_B
    defaults to what the costs' I leaves for W, 1 - input_frees."""
    check_sizes(p, m)
    per_stage = per_stage_costs(costs, p, name)
    delay = float(check_family_option("latency", latency))  # type: ignore[arg-type]
    limit = default_limit if activation_limit is None else _number(
        check_family_option("activation_limit", activation_limit), "activation_limit", 1.0, math.inf,
        "give the activation memory per device in units of M_B (one microbatch's F), at least 1")
    # without costs: W keeps half a microbatch's activations (StageCosts' default input_frees)
    frees = costs.input_frees if costs is not None else DEFAULT_INPUT_FREES
    weight_share = 1.0 - frees if m_w is None else float(check_family_option("m_w", m_w))  # type: ignore[arg-type]
    memory = Memory(limit=float(limit), m_w=weight_share)
    tables = tuple(tuple(ops) for ops in zb_greedy(m, per_stage, memory, latency=delay))
    params = {"p": p, "m": m, "activation_limit": limit, "m_w": weight_share, "latency": delay}
    return Schedule(name, Placement.one_per_device(p), m, tables, params=params)


def _equal(c: StageCosts) -> bool:
    return c.f == c.i == c.w


def _approximation_note(p: int, m: int, c: StageCosts) -> str:
    low = (p - 1) * c.f
    high = (p - 1 + max(0, p - m)) * (c.f + c.b)
    return (
        f"exact for F = I = W; with these costs an approximation: the table idles between "
        f"(p-1)F = {low:g} and (p-1+max(0,p-m))(F+B) = {high:g}"
    )


def zb_h1_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """ZB-H1: the paper's idle (p-1)(F+I-W), never less than the (p-1)F by which the last
    device starts late; fewer microbatches than devices add (p-m)F. Peak p, like 1F1B."""
    return FormulaEstimate(
        idle=(p - 1) * max(c.f, c.f + c.i - c.w) + max(0, p - m) * c.f,
        work=m * (c.f + c.i + c.w),
        peak_inflight=min(p, m),
        activation_units=min(p, m),
        exact=_equal(c),
        note="" if _equal(c) else _approximation_note(p, m, c),
    )


def zb_h2_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """ZB-H2: no bubble inside any device's span once m >= 2p-1; the iteration still spans
    the (p-1)F by which the last device starts late. With fewer microbatches the deep warm-up
    is cut short and every two missing microbatches cost one more F. Peak 2p-1."""
    return FormulaEstimate(
        idle=(p - 1) * c.f + max(0, 2 * p - 1 - m) // 2 * c.f,
        work=m * (c.f + c.i + c.w),
        peak_inflight=min(2 * p - 1, m),
        activation_units=min(2 * p - 1, m),
        exact=_equal(c),
        note=(
            "idle over the whole iteration; the paper's zero bubble counts each device from "
            "its first to its last op"
        ) if _equal(c) else _approximation_note(p, m, c),
    )


def automatic_formula(handcrafted: FormulaEstimate, family: str, meets: str) -> FormulaEstimate:
    """ZB-1p / ZB-2p: the heuristic's tables have no closed form of their own; the paper
    compares them with the handcrafted schedule of the same memory."""
    return replace(handcrafted, exact=False, note=(
        f"{family}'s form: the heuristic's table has none of its own; at F = I = W without "
        f"latency it {meets}; its activations stay within its memory limit in M_B, so with "
        "M_W < M_B more microbatches than the peak shown can wait for their W"))
