"""Interleaved 1F1B: Megatron-LM's virtual pipeline (Narayanan et al., 2021), as PyTorch's
``ScheduleInterleaved1F1B`` builds it.

Each device holds v model chunks (looped placement: stage s on device s mod p). Microbatches
go through the chunks in rounds: a round of microbatches runs forward through chunk 0, then
through chunk 1, and so on ("depth first"); backwards mirror that with the chunks reversed.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, switch
from pipesched.generators.overlap import with_overlapped_pairs
from pipesched.ops import B, F, Op
from pipesched.schedule import Placement, Schedule


def round_sizes(p: int, m: int) -> list[int]:
    """Microbatches per round: PyTorch's flexible rounds, ``max(1, m // p)`` of them.

    PyTorch needs m to be a multiple of the round count; here the first ``m % rounds`` rounds
    take one microbatch more instead, so every m >= 1 works. When PyTorch accepts m the
    rounds are the same.

    >>> round_sizes(4, 8), round_sizes(4, 3), round_sizes(4, 10), round_sizes(4, 9)
    ([4, 4], [3], [5, 5], [5, 4])
    """
    rounds = max(1, m // p)
    base, extra = divmod(m, rounds)
    return [base + 1] * extra + [base] * (rounds - extra)


def chunk_order(p: int, m: int, v: int) -> list[tuple[int, int]]:
    """(chunk, microbatch) in the order every device runs its forwards.

    >>> chunk_order(2, 2, 2)
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    order: list[tuple[int, int]] = []
    first = 0
    for size in round_sizes(p, m):
        for chunk in range(v):
            order.extend((chunk, mb) for mb in range(first, first + size))
        first += size
    return order


def interleaved_1f1b(p: int, m: int, v: int = 2, *, fused: bool = False) -> Schedule:
    """Device d: warm-up forwards, then one forward and one backward in turn, then drain.
    ``fused``: each steady-state F and the B after it as one overlapped pair (Megatron-Core's
    expert-parallel overlap, ``pipesched.generators.overlap``).

    The warm-up is ``(v-1) x round + 2 (p-1-d)`` forwards (capped at all ``v m``): enough for
    the first microbatch to reach the last chunk and for its gradient to come back.

    >>> [str(op) for op in interleaved_1f1b(2, 2, 2).device_ops[1]]
    ['1F0', '1F1', '3F0', '3B0', '3F1', '3B1', '1B0', '1B1']
    """
    check_sizes(p, m)
    require(v >= 2, "v", v, "interleaved-1f1b needs at least 2 chunks per device; use 1f1b for v=1")
    forwards = chunk_order(p, m, v)
    # backwards follow the same rounds with the chunks reversed (last chunk first)
    backwards = [(v - 1 - chunk, mb) for chunk, mb in forwards]
    first_round = round_sizes(p, m)[0]
    total = v * m
    device_ops = []
    for d in range(p):
        warmup = min((v - 1) * first_round + 2 * (p - 1 - d), total)

        def forward(index: int, d: int = d) -> Op:
            chunk, mb = forwards[index]
            return Op(chunk * p + d, F, mb)

        def backward(index: int, d: int = d) -> Op:
            chunk, mb = backwards[index]
            return Op(chunk * p + d, B, mb)

        # warm-up: forwards only
        ops = [forward(k) for k in range(warmup)]
        # steady state: the next forward, then the oldest backward
        for k in range(total - warmup):
            ops.append(forward(warmup + k))
            ops.append(backward(k))
        # cool-down: the backwards still owed
        ops.extend(backward(k) for k in range(total - warmup, total))
        device_ops.append(tuple(ops))
    schedule = Schedule(
        "interleaved-1f1b",
        Placement.looped(p, v),
        m,
        tuple(device_ops),
        params={"p": p, "m": m, "v": v},
    )
    return with_overlapped_pairs(schedule, backward_first=False) if switch(fused, "fused") else schedule


def looped_formula(p: int, m: int, v: int, c: StageCosts, peak: int, activation_units: float) -> FormulaEstimate:
    """A looped (chunk s on device s mod p) schedule's closed form, in chunk-op slots: idle
    the fill and drain (p-1)(F+B), plus (p-m)(F+B) at each of the v-1 chunk changes when
    m < p; work v m (F+B); ``peak`` chunk activations in flight, ``activation_units`` stages'."""
    return FormulaEstimate(
        idle=(p - 1) * (c.f + c.b) + (v - 1) * max(0, p - m) * (c.f + c.b),
        work=v * m * (c.f + c.b),
        peak_inflight=peak,
        activation_units=activation_units,
        exact=True,
        note="times in slots of one chunk op (divide by v for whole-stage ops)",
    )


def interleaved_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op (a stage of this schedule).

    Idle is the 1F1B fill and drain counted in chunk ops, (p-1)(F+B): in units of a whole
    1F1B stage op that is the familiar (p-1)(F+B)/v. With fewer microbatches than devices
    (one round of m < p) each of the v-1 chunk changes also waits (p-m)(F+B) for the round
    to come back. Device 0 holds its warm-up ``(v-1) x round + 2(p-1)`` chunk forwards plus
    one: ``p + (p-1)/v`` 1F1B stages when rounds are p microbatches.
    """
    first_round = round_sizes(p, m)[0]
    peak = min((v - 1) * first_round + 2 * (p - 1) + 1, v * m)
    return looped_formula(p, m, v, c, peak, peak / v)


FAMILY = Family(
    name="interleaved-1f1b",
    summary="Megatron's virtual pipeline: v chunks per device, 1F1B over rounds of microbatches",
    constraints="p >= 2, m >= 1, v >= 2; fused = 1: steady-state F and B as overlapped pairs (Megatron's EP overlap)",
    build=lambda p, m, *, v=2, **options: interleaved_1f1b(p, m, v, **options),
    formula=interleaved_formula,
    chunks=None,
    default_v=2,
    options=("fused",),
)
