"""Hanayo (Liu et al., SC'23): wave-like pipeline parallelism on one model copy.

The model is cut into 2w chunks of p stages for w waves, laid out as a zigzag: chunk c goes
down the devices (stage c*p + k on device k) when c is even and back up (on device p-1-k)
when c is odd, so a microbatch flows down and up the devices w times and every turn stays on
one device. Each device holds 2w stages. Unlike Chimera there is no second replica: the "up"
direction is the next part of the same model.

Order of the tables: the 2w*p-stage pipeline is scheduled as 1F1B with one device per stage
(forward 1, full backward 2 time units, the default slot costs), and the stages are folded
onto their zigzag devices, each device taking its stages' ops in the order of their start
times in that deep pipeline (on ties, forwards first, then the later stage). Folding keeps
every dependency ahead of its op, so the tables never deadlock.

One wave (the V shape, the default) holds about as many activations as 1F1B: 2p+1
half-stage microbatches on the worst device once m > p. Each further wave lowers the bubble
and raises the activations held: stage s keeps min(m, 2wp - s) microbatches in flight.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.one_f_one_b import one_f_one_b
from pipesched.ops import B, F, Op
from pipesched.ordering import walk
from pipesched.schedule import Placement, Schedule

# time units of the deep pipeline that orders the tables (forward 1, full backward 2)
_ORDER_DURATION = {F: 1.0, B: 2.0}


def hanayo(p: int, m: int, *, waves: int = 1) -> Schedule:
    """Hanayo's tables for p devices, m microbatches and ``waves`` waves (2*waves chunks).

    >>> s = hanayo(2, 2)
    >>> s.placement.replicas
    ((0, 1, 1, 0),)
    >>> [str(op) for op in s.device_ops[0]]
    ['0F0', '0F1', '3F0', '3B0', '3F1', '3B1', '0B0', '0B1']
    """
    check_sizes(p, m)
    require(waves >= 1, "waves", waves, "Hanayo needs at least 1 wave")
    chunks = 2 * waves
    stages = chunks * p
    placement = Placement.zigzag(p, chunks)
    deep = one_f_one_b(stages, m)  # stage s on its own virtual device s
    timing = walk(deep, lambda op: _ORDER_DURATION[op.kind])
    keyed: list[list[tuple[tuple[float, bool, int], Op]]] = [[] for _ in range(p)]
    for row, (_, op) in enumerate(deep.ops()):
        keyed[placement.device(op.stage)].append(
            ((float(timing.start[row]), op.kind is not F, -op.stage), op)
        )
    device_ops = tuple(tuple(op for _, op in sorted(ops)) for ops in keyed)
    return Schedule(
        "hanayo",
        placement,
        m,
        device_ops,
        params={"p": p, "m": m, "waves": waves},
    )


def waves_of(v: int) -> int:
    """The CLI's chunk count ``-v`` is 2 x waves for Hanayo."""
    require(
        v >= 2 and v % 2 == 0,
        "v",
        v,
        "Hanayo has 2 chunks per wave: give an even v = 2 x waves (v=2 is one wave)",
    )
    return v // 2


def hanayo_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    # Interleaved form with v = 2w chunk stages per device: idle (p-1)(F+B) in chunk times,
    # bubble ratio (p-1)/(v m + p - 1); activations: the deep 1F1B holds min(m, vp - s) on
    # stage s, summed over the stages a device holds, worst device.
    waves_of(v)
    stages = v * p
    placement = Placement.zigzag(p, v)
    peak = max(sum(min(m, stages - s) for s in placement.stages_on(d)) for d in range(p))
    return FormulaEstimate(
        idle=(p - 1) * (c.f + c.b),
        work=v * m * (c.f + c.b),
        peak_inflight=peak,
        activation_units=peak / v,
        exact=v == 2 and c.f == c.b and m >= 2 * p,
        note=(
            "peak exact; idle is the interleaved form with 2w chunks: with B >= F and "
            "m >= 2p one wave idles exactly 2(p-1)B chunk slots (the form when F = B), more "
            "waves up to 1.7x the form; m < 2p up to v x the form"
        ),
    )


FAMILY = Family(
    name="hanayo",
    summary="wave-like zigzag of 2w chunks per device (v = 2 x waves), one model copy",
    constraints="p >= 2, m >= 1, v even (v = 2 x waves; default 2 = one wave)",
    build=lambda p, m, *, v=2: hanayo(p, m, waves=waves_of(v)),
    formula=hanayo_formula,
    chunks=None,
    default_v=2,
)
