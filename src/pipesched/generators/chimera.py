"""Chimera (Li & Hoefler, SC'21): two pipelines in opposite directions merged on one set of
devices.

The "down" replica puts stage s on device s, the "up" replica puts it on device p-1-s, so each
device holds two stages (2x the parameters of one pipeline, and the replicas' gradients are
all-reduced at the end). Microbatches 0..m/2-1 go down, m/2..m-1 go up. Backwards are full (B).

A basic unit schedules p microbatches, p/2 each way. Each device has a primary direction (the
one whose stage on it is in the first half of its pipeline: down on devices 0..p/2-1, up on
the others) and a secondary one. With a = p/2 - (the primary stage) and b = p/2 - a, a device
runs, as the paper's runtime does:

- warm-up: a forwards of its primary direction;
- b pairs (secondary forward, primary forward);
- a pairs (secondary forward, secondary backward);
- b pairs (primary backward, secondary backward);
- drain: a primary backwards.

m > p concatenates units: the a primary backwards still owed by one unit alternate with the
a warm-up forwards of the next. Plain concatenation leaves gaps when B != F, which grow with
each unit. Forward doubling (the paper's remedy, on by default) runs units of 2p microbatches
in which every forward above is two microbatches' forwards back to back (a forward cell as
long as a backward when B = 2F), and the last phase has p/2 more backward pairs; an odd number
of p-microbatch units starts with one basic unit. It doubles the activations in flight (2p
instead of p). Backward halving (the paper's other remedy, ``backward_halving=1``) keeps
the activations of p microbatches instead: each microbatch runs as two halves, with
forward doubling over the 2m halves, so a forward cell is one whole microbatch's forward
and a backward cell half a microbatch's backward (as long as a forward when B = 2F). Its
table has 2m half-size microbatches (``Schedule.microbatch_fraction`` 0.5: the costs of
each are half the microbatch's, scaled linearly).
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, switch
from pipesched.ops import B, F, Op
from pipesched.schedule import SYNCHRONOUS, Execution, Placement, Schedule

DOWN, UP = 0, 1


def _check(p: int, m: int) -> None:
    check_sizes(p, m)
    require(
        p % 2 == 0,
        "p",
        p,
        "Chimera needs an even number of devices (p/2 microbatches each way per unit)",
    )
    require(
        m % p == 0,
        "m",
        m,
        f"Chimera concatenates basic units of p={p} microbatches; give m a multiple of {p}",
    )


def unit_sizes(p: int, m: int, *, forward_doubling: bool) -> list[int]:
    """Forwards per forward cell in each unit: 1 for a basic unit (p microbatches), 2 for a
    forward-doubled one (2p microbatches).

    >>> unit_sizes(4, 20, forward_doubling=True), unit_sizes(4, 8, forward_doubling=False)
    ([1, 2, 2], [1, 1])
    """
    units = m // p
    if not forward_doubling or units == 1:
        return [1] * units
    return [1] * (units % 2) + [2] * (units // 2)


def table_shape(p: int, m: int, v: int, options: dict[str, object]) -> tuple[int, int]:
    """p stages (two replicas on the p devices); 2m half-size microbatches with backward halving."""
    return p, 2 * m if switch(options.get("backward_halving", 0), "backward_halving") else m


def chimera(p: int, m: int, *, forward_doubling: object = 1, backward_halving: object = 0) -> Schedule:
    """Chimera's tables for p devices (even) and m microbatches (a multiple of p);
    ``forward_doubling=0`` concatenates basic units instead; ``backward_halving=1`` runs
    each microbatch as two halves (2m half-size microbatches in the table, forward doubling
    over them: see the module docstring).

    >>> s = chimera(2, 2)
    >>> [[str(op) for op in ops] for ops in s.device_ops]
    [['0F0', '1F1', '1B1', '0B0'], ['0F1', '1F0', '1B0', '0B1']]
    >>> halved = chimera(2, 2, backward_halving=1)
    >>> halved.num_microbatches, halved.microbatch_fraction
    (4, 0.5)
    """
    _check(p, m)
    doubling = switch(forward_doubling, "forward_doubling")
    halving = switch(backward_halving, "backward_halving")
    require(not (halving and not doubling), "backward_halving", 1,
            "backward halving is forward doubling over half-size microbatches; drop forward_doubling=0")
    runs = 2 * m if halving else m  # microbatches of the table
    half = runs // 2
    route = tuple(DOWN if mb < half else UP for mb in range(runs))
    units = unit_sizes(p, runs, forward_doubling=doubling)
    params: dict[str, object] = {"p": p, "m": m, "forward_doubling": int(doubling and max(units) == 2)}
    if halving:
        params.update(backward_halving=1)
    return Schedule(
        "chimera",
        Placement.bidirectional(p),
        runs,
        tuple(_device_ops(p, runs, d, units) for d in range(p)),
        route=route,
        params=params,
        execution=Execution(microbatch_fraction=0.5) if halving else SYNCHRONOUS,
    )


def _device_ops(p: int, m: int, device: int, units: list[int]) -> tuple[Op, ...]:
    """One device's order over the given units (each direction's forwards, and backwards,
    in microbatch order)."""
    half_p, half_m = p // 2, m // 2
    stage = {DOWN: device, UP: p - 1 - device}
    primary, secondary = (DOWN, UP) if device < half_p else (UP, DOWN)
    a = half_p - stage[primary]  # warm-up forwards of the primary direction
    b = half_p - a
    first = {DOWN: 0, UP: half_m}
    forwards = {DOWN: 0, UP: 0}
    backwards = {DOWN: 0, UP: 0}
    ops: list[Op] = []

    def forward(direction: int, count: int) -> None:
        for _ in range(count):
            ops.append(Op(stage[direction], F, first[direction] + forwards[direction]))
            forwards[direction] += 1

    def backward(direction: int) -> None:
        ops.append(Op(stage[direction], B, first[direction] + backwards[direction]))
        backwards[direction] += 1

    for index, k in enumerate(units):
        for _ in range(a):
            if index:
                backward(primary)  # owed by the previous unit
            forward(primary, k)
        for _ in range(b):
            forward(secondary, k)
            forward(primary, k)
        for _ in range(a):
            forward(secondary, k)
            backward(secondary)
        for _ in range(b + (k - 1) * half_p):
            backward(primary)
            backward(secondary)
    for _ in range(a):
        backward(primary)
    return tuple(ops)


def chimera_idle(p: int, m: int, c: StageCosts, *, forward_doubling: bool = True) -> float:
    """Idle time of every device in Chimera's table (all devices idle the same).

    A basic unit idles (p-2) max(F, B): the paper's p/2-1 forward and p/2-1 backward bubbles
    as cells of the longer op. Each further concatenated unit adds (p-2)|B-F|. With forward
    doubling a doubled unit idles (p/2-1) max(2F, F+B, 2(B-F)) and each further one adds
    (p-2)(max(0, F-B) + max(0, B-2F)): nothing when F <= B <= 2F.
    """
    units = m // p
    bubbles = p / 2 - 1
    longer = max(c.f, c.b)
    if not forward_doubling or units == 1:
        return bubbles * (2 * longer + (units - 1) * 2 * abs(c.b - c.f))
    per_doubled_unit = 2 * (max(0.0, c.f - c.b) + max(0.0, c.b - 2 * c.f))
    if units % 2:
        return bubbles * (2 * longer + units // 2 * per_doubled_unit)
    first = max(2 * c.f, c.f + c.b, 2 * (c.b - c.f))
    return bubbles * (first + (units // 2 - 1) * per_doubled_unit)


def chimera_formula(p: int, m: int, v: int, c: StageCosts, *, forward_doubling: bool = True,
                    backward_halving: bool = False) -> FormulaEstimate:
    # forward doubling from m = 2p on unless switched off; exact for every F, B
    doubling = switch(forward_doubling, "forward_doubling")
    if switch(backward_halving, "backward_halving"):
        # forward doubling over 2m half-size microbatches: the activations of p whole ones
        halves = chimera_formula(p, 2 * m, v, c.of_microbatch_fraction(0.5), forward_doubling=True)
        return FormulaEstimate(
            idle=halves.idle, work=halves.work, peak_inflight=halves.peak_inflight,
            activation_units=halves.activation_units / 2, exact=True,
            note="2x parameters (two replicas, gradients all-reduced); backward halving: 2m half-size "
                 "microbatches, costs scaled linearly",
        )
    doubled = doubling and m >= 2 * p
    peak = 2 * p if doubled else p  # device p/2-1 holds p/2 (x2 when doubled) each way
    return FormulaEstimate(
        idle=chimera_idle(p, m, c, forward_doubling=doubling),
        work=m * (c.f + c.b),  # two stages x m/2 microbatches per device
        peak_inflight=peak,
        activation_units=peak,
        exact=True,
        note="2x parameters (two replicas, gradients all-reduced)"
        + ("; forward doubling: 2x activations" if doubled else ""),
    )


FAMILY = Family(
    name="chimera",
    summary="two opposite pipelines (model replicas) merged, forward doubling for m > p",
    constraints="p even, m a multiple of p; 2x parameters; forward_doubling=0|1, backward_halving=0|1",
    build=lambda p, m, *, v=None, **options: chimera(p, m, **options),
    formula=chimera_formula,
    options=("forward_doubling", "backward_halving"),
    formula_options=("forward_doubling", "backward_halving"),
    shape=table_shape,
)
