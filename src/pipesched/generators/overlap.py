"""Overlapped forward-backward pairs in a one-forward-one-backward table: Megatron-Core's
expert-parallel overlap (``--overlap-moe-expert-parallel-comm``) runs the steady state's
forward of one microbatch and backward of another as one merged step, so that one's
dispatch and combine all-to-alls run during the other's compute, as DualPipe's pairs do.

``with_overlapped_pairs`` fuses each device's adjacent ops of two different microbatches in
the steady state's order (1F1B: a backward, then the next forward; interleaved 1F1B: a
forward, then the oldest backward) into one ``OVERLAP_F_B`` op, left to right, each op in at
most one pair; a pair that would deadlock the table (its parts waiting on each other through
the other devices: interleaved 1F1B with few microbatches) stays two ops. A fused pair starts when both
its inputs have arrived and costs ``StageCosts.fused_time`` (the pair computed by
``pipesched.model.phases`` for stage costs built from a model). The warm-up and cool-down
keep their plain ops.
"""

from __future__ import annotations

import dataclasses

from pipesched.ops import B, F, Op
from pipesched.schedule import Schedule
from pipesched.validation import DEADLOCK, validate


def with_overlapped_pairs(schedule: Schedule, *, backward_first: bool) -> Schedule:
    """``schedule`` with its adjacent steady-state pairs fused (module docstring): a B then
    an F with ``backward_first``, else an F then a B; its parameters say ``fused: 1``.

    >>> from pipesched.generators.one_f_one_b import one_f_one_b
    >>> [str(op) for op in with_overlapped_pairs(one_f_one_b(2, 3), backward_first=True).device_ops[1]]
    ['1F0', '(1F1;1B0)OVERLAP_F_B', '(1F2;1B1)OVERLAP_F_B', '1B2']
    """
    order = (B, F) if backward_first else (F, B)
    fused = dataclasses.replace(schedule, device_ops=tuple(_paired(ops, order) for ops in schedule.device_ops),
                                params={**schedule.params, "fused": 1})
    while True:  # a pair whose parts wait on each other through the other devices runs as its two ops
        cycles = [v for v in validate(fused) if v.kind == DEADLOCK]
        if not cycles:
            return fused
        held = {op for violation in cycles for op in violation.ops if op.parts}
        if not held:
            return schedule
        fused = dataclasses.replace(fused, device_ops=tuple(
            tuple(part for op in ops for part in (op.parts if op in held else (op,))) for ops in fused.device_ops))


def _paired(ops: tuple[Op, ...], order: tuple) -> tuple[Op, ...]:
    out: list[Op] = []
    k = 0
    while k < len(ops):
        pair = ops[k:k + 2]
        if len(pair) == 2 and tuple(op.kind for op in pair) == order and not any(op.parts for op in pair) \
                and pair[0].microbatch != pair[1].microbatch:
            forward, backward = pair if order[0] is F else pair[::-1]
            out.append(Op.fused(forward, backward))
            k += 2
        else:
            out.append(ops[k])
            k += 1
    return tuple(out)
