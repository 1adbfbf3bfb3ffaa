"""Looped BFS: breadth-first pipeline parallelism (Lamy-Poirier, 2022), as PyTorch's
``ScheduleLoopedBFS`` builds it.

Like interleaved 1F1B each device holds v chunks (stage s on device s mod p), but a device
runs every microbatch through its earlier chunk before moving on ("breadth first"): all
forwards chunk by chunk, then all backwards, last chunk first and last microbatch first.
"""

from __future__ import annotations

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes
from pipesched.generators.interleaved import looped_formula
from pipesched.ops import B, F, Op
from pipesched.schedule import Placement, Schedule


def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    """Device d: F of stages d, d+p, ... for microbatches 0..m-1, then B in reverse.

    >>> [str(op) for op in looped_bfs(2, 2, 2).device_ops[0]]
    ['0F0', '0F1', '2F0', '2F1', '2B1', '2B0', '0B1', '0B0']
    """
    check_sizes(p, m)
    require(v >= 2, "v", v, "looped-bfs needs at least 2 chunks per device; use gpipe for v=1")
    device_ops = []
    for d in range(p):
        stages = range(d, p * v, p)
        # forward phase: each chunk takes the whole batch before the next chunk starts
        ops = [Op(s, F, mb) for s in stages for mb in range(m)]
        # backward phase: last chunk first, newest microbatch first
        ops += [Op(s, B, mb) for s in reversed(stages) for mb in reversed(range(m))]
        device_ops.append(tuple(ops))
    return Schedule(
        "looped-bfs",
        Placement.looped(p, v),
        m,
        tuple(device_ops),
        params={"p": p, "m": m, "v": v},
    )


def looped_bfs_formula(p: int, m: int, v: int, c: StageCosts) -> FormulaEstimate:
    """Slot costs are those of one chunk op. Fill and drain cost (p-1)(F+B) as in GPipe; with
    m < p each of the v-1 chunk changes also waits (p-m)(F+B) for the first microbatch to
    come round. Every device holds all v m chunk activations at the end of the forwards."""
    return looped_formula(p, m, v, c, v * m, m)


FAMILY = Family(
    name="looped-bfs",
    summary="breadth-first looped pipeline: v chunks per device, GPipe-like memory",
    constraints="p >= 2, m >= 1, v >= 2",
    build=lambda p, m, *, v=2: looped_bfs(p, m, v),
    formula=looped_bfs_formula,
    chunks=None,
    default_v=2,
)
