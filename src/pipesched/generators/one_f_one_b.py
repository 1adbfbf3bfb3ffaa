"""1F1B (PipeDream-Flush): warm-up forwards, then one forward / one backward, then drain."""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, switch
from pipesched.generators.gpipe import flushed_formula
from pipesched.generators.overlap import with_overlapped_pairs
from pipesched.ops import B, F, Op
from pipesched.schedule import Placement, Schedule


def one_f_one_b(p: int, m: int, *, fused: bool = False) -> Schedule:
    """Device d runs min(p-d, m) warm-up forwards, then alternates B and F, then drains.
    ``fused``: each steady-state B and the F after it as one overlapped pair (Megatron-Core's
    expert-parallel overlap, ``pipesched.generators.overlap``).

    >>> [str(op) for op in one_f_one_b(2, 3).device_ops[0]]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    check_sizes(p, m)
    device_ops = []
    for d in range(p):
        warmup = min(p - d, m)  # forwards in flight before the first backward arrives
        ops = [Op(d, F, mb) for mb in range(warmup)]
        # steady state: each backward frees a slot for the next forward
        for mb in range(m - warmup):
            ops.append(Op(d, B, mb))
            ops.append(Op(d, F, warmup + mb))
        # cool-down: the remaining backwards
        ops.extend(Op(d, B, mb) for mb in range(m - warmup, m))
        device_ops.append(tuple(ops))
    schedule = Schedule("1f1b", Placement.one_per_device(p), m, tuple(device_ops), params={"p": p, "m": m})
    return with_overlapped_pairs(schedule, backward_first=True) if switch(fused, "fused") else schedule


def one_f_one_b_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    # same bubble as GPipe; device d holds at most p-d microbatches, device 0 holds min(p, m)
    return flushed_formula(p, m, c, min(p, m))


FAMILY = Family(
    name="1f1b",
    summary="one-forward-one-backward: GPipe's bubble with at most p microbatches in flight",
    constraints="p >= 2, m >= 1; fused = 1: steady-state B and F as overlapped pairs (Megatron's EP overlap; "
                "each pair then waits for the next stage's: it pays with virtual stages, interleaved-1f1b)",
    build=lambda p, m, *, v=None, **options: one_f_one_b(p, m, **options),
    formula=one_f_one_b_formula,
    options=("fused",),
)
