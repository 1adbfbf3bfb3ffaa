"""Hanayo (Liu et al., SC'23): wave-like pipeline parallelism on one model copy.

The model is cut into 2w chunks of p stages for w waves, laid out as a zigzag: chunk c goes
down the devices (stage c*p + k on device k) when c is even and back up (on device p-1-k)
when c is odd, so a microbatch flows down and up the devices w times and every turn stays on
one device. Each device holds 2w stages. Unlike Chimera there is no second replica: the "up"
direction is the next part of the same model.

One wave (the default), the wave order: forward waves run down and up the V, microbatch k
reaching stage s at "time" s + k, and backward waves run back, reaching stage s at
(2p-1-s) + 2k (a backward is twice a forward in the slot convention). Each device takes its
forwards, and its backwards, in the order the waves reach it; it runs
``min(3p-1, m+1) + d`` forwards first (device d), then one backward and one forward in turn,
then the backwards left. No device idles between its first and last op except while it
waits for a wave, and from m = 2p-1 on the table idles (p-1) max(2F, F+B, 2B-F) per device:
interleaved 1F1B's (p-1)(F+B) with v = 2 when F <= B <= 2F. It holds more activations than
interleaved 1F1B: up to 4p-2 half-stage microbatches on the turning device (2p-1 stages' worth).

More waves: the 2w*p-stage pipeline is scheduled as 1F1B with one device per stage (forward
1, full backward 2 time units) and the stages are folded onto their zigzag devices, each
device taking its stages' ops in the order of their start times in that deep pipeline (on
ties, forwards first, then the later stage). The one-wave order does not carry over: with
more chunks per device its 1F1B turn deadlocks unless the warm-up grows with w^2 p, far more
memory than the fold. The fold idles (p-1) chunk forwards more than interleaved 1F1B with
2w chunks at F = I = W.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.one_f_one_b import one_f_one_b
from pipesched.limits import check_family_option
from pipesched.ops import B, F, Op
from pipesched.ordering import walk
from pipesched.schedule import Placement, Schedule

# time units of the deep pipeline that orders the tables of several waves (forward 1, full
# backward 2)
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
    _check_waves(waves)
    placement = Placement.zigzag(p, 2 * waves)
    device_ops = _wave_order(p, m, placement) if waves == 1 else _folded_order(p, m, placement)
    return Schedule(
        "hanayo",
        placement,
        m,
        device_ops,
        params={"p": p, "m": m, "waves": waves},
    )


def warmup_forwards(p: int, m: int, device: int) -> int:
    """Forwards device ``device`` runs before its first backward in the one-wave order."""
    return min(min(3 * p - 1, m + 1) + device, 2 * m)


def _wave_order(p: int, m: int, placement: Placement) -> tuple[tuple[Op, ...], ...]:
    stages = placement.num_stages
    tables = []
    for device in range(p):
        held = placement.stages_on(device)
        # the forward wave reaches stage s with microbatch k at s + k (the later stage first
        # on a tie); the backward wave reaches it at (2p-1-s) + 2k
        forwards = [op for *_, op in sorted(
            (s + k, -s, Op(s, F, k)) for s in held for k in range(m))]
        backwards = [op for *_, op in sorted(
            (stages - 1 - s + 2 * k, s, Op(s, B, k)) for s in held for k in range(m))]
        warmup = warmup_forwards(p, m, device)
        ops = forwards[:warmup]
        # steady state: each backward frees room for the next forward; then drain
        for index, backward in enumerate(backwards):
            ops.append(backward)
            if warmup + index < len(forwards):
                ops.append(forwards[warmup + index])
        tables.append(tuple(ops))
    return tuple(tables)


def _folded_order(p: int, m: int, placement: Placement) -> tuple[tuple[Op, ...], ...]:
    deep = one_f_one_b(placement.num_stages, m)  # stage s on its own virtual device s
    timing = walk(deep, lambda op: _ORDER_DURATION[op.kind])
    keyed: list[list[tuple[tuple[float, bool, int], Op]]] = [[] for _ in range(p)]
    for row, (_, op) in enumerate(deep.ops()):
        keyed[placement.device(op.stage)].append(
            ((float(timing.start[row]), op.kind is not F, -op.stage), op)
        )
    return tuple(tuple(op for _, op in sorted(ops)) for ops in keyed)


def waves_of(v: int) -> int:
    """The CLI's chunk count ``-v`` is 2 x waves for Hanayo."""
    require(
        v >= 2 and v % 2 == 0,
        "v",
        v,
        "Hanayo has 2 chunks per wave: give an even v = 2 x waves (v=2 is one wave)",
    )
    return v // 2


def resolve_waves(v: int, waves: int | None) -> int:
    """``waves`` (the option) or v = 2 x waves (the chunk count); v=2 is the default."""
    if waves is not None and v != 2:
        require(v == 2 * waves, "waves", waves, f"-v {v} means {waves_of(v)} waves; give one of -v and waves")
    if waves is not None:
        return _check_waves(waves)
    return waves_of(v)


def _check_waves(waves: object) -> int:
    return check_family_option("waves", waves)  # type: ignore[return-value]


def table_shape(p: int, m: int, v: int, options: dict[str, object]) -> tuple[int, int]:
    """2 x waves stages per device (``waves``, or v = 2 x waves), m microbatches."""
    waves = options.get("waves")
    return 2 * resolve_waves(v, waves if waves is None else _check_waves(waves)) * p, m


def _build(p: int, m: int, *, v: int = 2, waves: int | None = None) -> Schedule:
    return hanayo(p, m, waves=resolve_waves(v, waves))


def wave_idle(p: int, m: int, c: StageCosts) -> float:
    """Idle time of the worst device in the one-wave table, in chunk op times.

    m >= 2p-1: (p-1) max(2F, F+B, 2B-F). Fewer microbatches: the first ones pass alone,
    2(p-1)(F+B) at m = 1, each microbatch up to p taking 2 min(F, B) off, each further one F
    (when B > F) until the steady form.
    """
    steady = (p - 1) * max(2 * c.f, c.f + c.b, 2 * c.b - c.f)
    if m <= p:
        return 2 * (p - 1) * (c.f + c.b) - 2 * (m - 1) * min(c.f, c.b)
    ramp = 2 * (p - 1) * max(c.f, c.b) - (m - p) * (c.f if c.b > c.f else 0.0)
    return max(steady, ramp)


def hanayo_formula(p: int, m: int, v: int, c: StageCosts, *, waves: int | None = None) -> FormulaEstimate:
    waves = resolve_waves(v, waves)
    v = 2 * waves
    if waves == 1:
        peak = max(warmup_forwards(p, m, d) for d in range(p))
        return FormulaEstimate(
            idle=wave_idle(p, m, c),
            work=2 * m * (c.f + c.b),
            peak_inflight=peak,
            activation_units=peak / 2,
            exact=True,
            note="(p-1)(F+B) half-stage slots, interleaved 1F1B's bubble, when F <= B <= 2F and m >= 2p-1",
        )
    # interleaved form with v = 2w chunk stages per device: idle (p-1)(F+B) in chunk times;
    # activations: the deep 1F1B holds min(m, vp - s) on stage s, summed over the stages a
    # device holds, worst device
    stages = v * p
    placement = Placement.zigzag(p, v)
    peak = max(sum(min(m, stages - s) for s in placement.stages_on(d)) for d in range(p))
    return FormulaEstimate(
        idle=(p - 1) * (c.f + c.b),
        work=v * m * (c.f + c.b),
        peak_inflight=peak,
        activation_units=peak / v,
        exact=False,
        note=(
            "peak exact; idle is the interleaved form with 2w chunks; the folded table of "
            "several waves idles more: (p-1) chunk forwards more at F = I = W and m >= 2p, "
            "up to v x the form when m < 2p"
        ),
    )


FAMILY = Family(
    name="hanayo",
    summary="wave-like zigzag of 2w chunks per device (v = 2 x waves), one model copy",
    constraints="p >= 2, m >= 1, v even (v = 2 x waves; default 2 = one wave) or waves=w",
    build=_build,
    formula=hanayo_formula,
    chunks=None,
    default_v=2,
    options=("waves",),
    formula_options=("waves",),
    shape=table_shape,
)
