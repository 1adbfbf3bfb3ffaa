"""DualPipeV: DualPipe cut in half (deepseek-ai/DualPipe; PyTorch's ``ScheduleDualPipeV``).

One copy of the model in 2p stages laid out as a V: device d holds stage d (going down) and
stage 2p-1-d (coming back up), so the parameters are not doubled. Each device runs the eight
phases of DualPipe (see ``pipesched.generators.dualpipe``) with phase 0 = its down stage,
phase 1 = its up stage, all m microbatches through both, and ``h`` = its device index.
The F, B pairs of the steady phase run overlapped, each one fused op
(``(0F3;3B1)OVERLAP_F_B``, PyTorch's ``OVERLAP_F_B`` action); ``fused=False`` writes each as
two ops.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, switch
from pipesched.generators.dualpipe import dual_estimate, dual_params, dual_program
from pipesched.ops import Op, OpKind
from pipesched.schedule import Placement, Schedule


def _check(p: int, m: int) -> None:
    check_sizes(p, m)
    require(
        m >= 2 * p, "m", m, f"DualPipeV needs m >= 2p = {2 * p} (at least one microbatch per stage)"
    )


def _programs(p: int, m: int, fused: bool) -> list[list[Op]]:
    programs = []
    for d in range(p):
        stages = (d, 2 * p - 1 - d)  # phase 0: down the V, phase 1: back up

        def op_of(phase: int, kind: OpKind, mb: int, stages: tuple[int, int] = stages) -> Op:
            return Op(stages[phase], kind, mb)

        programs.append(dual_program(p, m, d, op_of, fused=fused))
    return programs


def dualpipev(p: int, m: int, *, fused: bool = True) -> Schedule:
    """DualPipeV's tables for p devices (2p stages) and m >= 2p microbatches.

    >>> ops = [str(op) for op in dualpipev(2, 4).device_ops[0]]
    >>> ops[:7]  # warm-up F0 F0, then F0 F1, then I1 W1 F1 (split backward)
    ['0F0', '0F1', '0F2', '3F0', '3I0', '3W0', '3F1']
    >>> ops[7:9]  # steady phase: overlapped pairs (F0&B1) (F1&B0)
    ['(0F3;3B1)OVERLAP_F_B', '(3F2;0B0)OVERLAP_F_B']
    >>> ops[9:]  # B1 (F1&B0), then B1 and split B0, deferred W
    ['3B2', '(3F3;0B1)OVERLAP_F_B', '3B3', '0I2', '0W2', '0I3', '0W3']
    """
    fused = switch(fused, "fused")
    _check(p, m)
    return Schedule(
        "dualpipev",
        Placement.vshape(p),
        m,
        tuple(tuple(ops) for ops in _programs(p, m, fused)),
        params=dual_params(p, m, fused),
    )


def dualpipev_formula(p: int, m: int, v: int, c: StageCosts, *, fused: bool = True) -> FormulaEstimate:
    # DualPipe's README with PP = 2p stages: bubble (p-1)(F&B + B - 3W) in stage (half-chunk)
    # times, activations 2p+1 stage-microbatches; every device runs two stages x m microbatches
    return dual_estimate(p, m, c, fused=switch(fused, "fused"), stages_per_device_work=2 * m * (c.f + c.b),
                         peak=2 * p + 1, units=(2 * p + 1) / 2,
                         note="DualPipe's published bubble for 2p stages, in chunk-op times")


FAMILY = Family(
    name="dualpipev",
    summary="DualPipe folded into a V: one model copy, overlapped forward/backward pairs",
    constraints="p >= 2, m >= 2p; fused = 1 (pairs as fused ops) or 0",
    chunks=2,
    build=lambda p, m, *, v=None, **options: dualpipev(p, m, **options),
    formula=dualpipev_formula,
    options=("fused",),
    formula_options=("fused",),
)
