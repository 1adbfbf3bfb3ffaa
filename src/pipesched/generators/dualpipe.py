"""DualPipe (DeepSeek-V3 technical report; deepseek-ai/DualPipe): two pipelines run in
opposite directions over the same devices, each carrying half the microbatches.

Device r holds stage r of the forward-direction replica (replica 0: stage s on device s) and
stage p-1-r of the reverse replica (replica 1: stage s on device p-1-s), so every device keeps
two stages' parameters (2x the parameters of one pipeline), and the two replicas' gradients
are all-reduced at the end of the iteration. Microbatches 0..m/2-1 go forward, m/2..m-1 in
reverse.

Each device runs the eight phases of DualPipe's ``step()``. Phase 0 is the direction in
which the device sits in the first half of the pipeline, phase 1 the other one; ``h`` is
the device's distance from the nearer end (min(r, p-1-r)) and ``half = p/2``:

1. ``2(half-h-1)`` forwards of phase 0 (warm-up)
2. ``h+1`` pairs F0 F1
3. ``half-h-1`` rounds I1 W1 F1 (zero-bubble split: the input gradient leaves first)
4. ``m/2 - p + h + 1`` rounds (F0&B1) (F1&B0): the steady phase of overlapped pairs; the
   middle devices run their first F0, B1 one after the other instead
5. ``half-h-1`` rounds B1 (F1&B0)
6. ``h+1`` rounds B1 B0, switching to split backwards (I, W deferred) half-way
7. ``half-h-1`` rounds W I0
8. ``h+1`` deferred W

Deferred weight gradients run first in, first out. An overlapped pair ``F&B`` (one forward
and one full backward of the other direction computing at once, each hiding the other's
communication) is one fused op of the table, ``(0F7;7B13)OVERLAP_F_B`` as PyTorch writes it:
it starts when both of its inputs have arrived, holds the device for the pair's time
(``StageCosts.fused_time``: F + B unless told how much overlaps) and sends both results when
it ends. ``fused=False`` writes each pair as its forward then its backward, two ops (the
table without the overlap, to compare against).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.generators.base import Family, FormulaEstimate, check_sizes, switch
from pipesched.ops import B, F, I, Op, OpKind, W
from pipesched.schedule import Placement, Schedule

# A phase of one device (0: its first-half direction, 1: the other), mapped to an op
PhaseOp = Callable[[int, OpKind, int], Op]


def dual_program(half: int, n: int, h: int, op_of: PhaseOp, *, fused: bool = True) -> list[Op]:
    """One device's ops under DualPipe's eight phases.

    ``half`` is the number of devices in one half of the (possibly folded) pipeline, ``n``
    the microbatches per phase, ``h`` the device's position in its half (0 = an end).
    ``op_of(phase, kind, microbatch)`` names the op. Each overlapped F&B pair is one fused
    op, or with ``fused=False`` its forward followed by its backward.
    """
    program = _DualProgram(op_of, fused)
    outer = half - h - 1  # phases that shrink toward the middle of the pipeline
    inner = h + 1  # phases that grow toward the middle
    program.warm_up(outer, inner)
    program.steady(n - 2 * half + h + 1, outer, middle=h == half - 1)
    program.drain(outer, inner, odd=h % 2 == 1)
    return program.ops


class _DualProgram:
    """One device's table as it is written: the next microbatch of each phase to run
    forward and backward, and the weight gradients owed (oldest first)."""

    def __init__(self, op_of: PhaseOp, fused: bool) -> None:
        self.op_of, self.fused = op_of, fused
        self.ops: list[Op] = []
        self.forwards = [0, 0]  # next microbatch to run forward, per phase
        self.backwards = [0, 0]  # next microbatch to run backward (B or I), per phase
        self.deferred: deque[Op] = deque()  # weight gradients owed, oldest first

    def forward(self, phase: int) -> None:
        self.ops.append(self.op_of(phase, F, self.forwards[phase]))
        self.forwards[phase] += 1

    def backward(self, phase: int, *, split: bool = False) -> None:
        mb = self.backwards[phase]
        self.backwards[phase] += 1
        if split:
            self.ops.append(self.op_of(phase, I, mb))
            self.deferred.append(self.op_of(phase, W, mb))
        else:
            self.ops.append(self.op_of(phase, B, mb))

    def weight(self) -> None:
        if self.deferred:
            self.ops.append(self.deferred.popleft())

    def overlapped(self, forward_phase: int, backward_phase: int) -> None:
        first = len(self.ops)
        self.forward(forward_phase)
        self.backward(backward_phase)
        if self.fused:
            self.ops[first:] = [Op.fused(*self.ops[first:])]

    def warm_up(self, outer: int, inner: int) -> None:
        """Phases 1 to 3: warm-up forwards of phase 0, forwards of both phases, then the
        first backwards of phase 1, split so the gradient leaves before W runs."""
        for _ in range(2 * outer):
            self.forward(0)
        for _ in range(inner):
            self.forward(0)
            self.forward(1)
        for _ in range(outer):
            self.backward(1, split=True)
            self.weight()
            self.forward(1)

    def steady(self, pairs: int, outer: int, *, middle: bool) -> None:
        """Phases 4 and 5: overlapped forward/backward pairs of opposite phases (a middle
        device runs its first pair unoverlapped: it shortens the bubble), then phase 1
        drains while phase 0 still takes forwards."""
        for i in range(pairs):
            if i == 0 and middle:
                self.forward(0)
                self.backward(1)
            else:
                self.overlapped(0, 1)
            self.overlapped(1, 0)
        for _ in range(outer):
            self.backward(1)
            self.overlapped(1, 0)

    def drain(self, outer: int, inner: int, *, odd: bool) -> None:
        """Phases 6 to 8: the last backwards of both phases (the second half defers W to
        fill the drain, from phase 1's on an odd device, phase 0's on an even one), the
        deferred W interleaved with the last phase-0 input gradients, then the W still owed."""
        split = False
        for i in range(inner):
            if i == inner // 2 and odd:
                split = True
            self.backward(1, split=split)
            if i == inner // 2 and not odd:
                split = True
            self.backward(0, split=split)
        for _ in range(outer):
            self.weight()
            self.backward(0, split=True)
        for _ in range(inner):
            self.weight()


def _check(p: int, m: int) -> None:
    check_sizes(p, m)
    require(p % 2 == 0, "p", p, "DualPipe needs an even number of devices (two half pipelines)")
    require(m % 2 == 0, "m", m, "DualPipe needs an even number of microbatches (half go each way)")
    require(
        m >= 2 * p, "m", m, f"DualPipe needs m >= 2p = {2 * p} (at least p microbatches each way)"
    )


def _programs(p: int, m: int, fused: bool) -> list[list[Op]]:
    half, n = p // 2, m // 2
    programs = []
    for r in range(p):
        second_half = r >= half

        def op_of(
            phase: int, kind: OpKind, mb: int, r: int = r, second_half: bool = second_half
        ) -> Op:
            direction = phase ^ second_half  # 0: forward replica, 1: reverse replica
            if direction == 0:
                return Op(r, kind, mb)
            return Op(p - 1 - r, kind, n + mb)

        programs.append(dual_program(half, n, min(r, p - 1 - r), op_of, fused=fused))
    return programs


def dualpipe(p: int, m: int, *, fused: bool = True) -> Schedule:
    """DualPipe's tables: p devices (even), m microbatches (even, m >= 2p).

    >>> s = dualpipe(2, 4)
    >>> [str(op) for op in s.device_ops[0]]
    ['0F0', '1F2', '0F1', '1B2', '(1F3;0B0)OVERLAP_F_B', '1B3', '0I1', '0W1']
    >>> s.route
    (0, 0, 1, 1)
    """
    fused = switch(fused, "fused")
    _check(p, m)
    return Schedule(
        "dualpipe",
        Placement.bidirectional(p),
        m,
        tuple(tuple(ops) for ops in _programs(p, m, fused)),
        route=tuple(0 if mb < m // 2 else 1 for mb in range(m)),
        params=dual_params(p, m, fused),
    )


def dual_params(p: int, m: int, fused: bool) -> dict[str, int]:
    """A DualPipe table's parameters: p and m, and ``fused: 0`` where its pairs are two ops."""
    return {"p": p, "m": m} if fused else {"p": p, "m": m, "fused": 0}


def fused_pair_time(c: StageCosts) -> float:
    """F&B of the closed forms: the slowest stage's forward and full backward overlapped."""
    if c.forward_backward is not None:
        return max(max(c.forward_backward), c.f, c.b)
    return c.fused_time(0, c.f, c.b)


def dual_estimate(half: int, n: int, c: StageCosts, *, fused: bool, stages_per_device_work: float,
                  peak: int, units: float, note: str) -> FormulaEstimate:
    """DualPipe's published bubble (half-1)(F&B + B - 3W) for the eight-phase program with
    ``half`` devices per half and ``n`` microbatches per phase. The worst device (the middle
    one) runs 2n - 2 half - 1 overlapped pairs, each F + B - F&B shorter than its two ops.
    The table equals it when I = F and W <= F (for any overlap); at F = I = W it is the
    published figure. Unfused (``fused=False``: each pair two ops) the table idles less than
    the figure, which is then an upper estimate."""
    fb = fused_pair_time(c) if fused else c.f + c.b
    pairs = 2 * n - 2 * half - 1 if fused else 0
    exact = fused and c.i == c.f and c.w <= c.f
    return FormulaEstimate(
        idle=max(0.0, (half - 1) * (fb + c.b - 3 * c.w)),
        work=stages_per_device_work - pairs * (c.f + c.b - fb),
        peak_inflight=peak,
        activation_units=units,
        exact=exact,
        note=note + ("" if fused else "; unfused pairs: the table idles less than this"),
    )


def dualpipe_formula(p: int, m: int, v: int, c: StageCosts, *, fused: bool = True) -> FormulaEstimate:
    # DualPipe's README: bubble (p/2-1)(F&B + B - 3W), activations p+1 stage-microbatches,
    # 2x parameters; every device runs two stages x m/2 microbatches
    return dual_estimate(p // 2, m // 2, c, fused=switch(fused, "fused"), stages_per_device_work=m * (c.f + c.b),
                         peak=p + 1, units=p + 1,
                         note="DualPipe's published bubble; 2x parameters (two replicas, gradients all-reduced)")


FAMILY = Family(
    name="dualpipe",
    summary="two opposite pipelines with overlapped forward/backward pairs (DeepSeek)",
    constraints="p even, m even, m >= 2p; 2x parameters; fused = 1 (pairs as fused ops) or 0",
    build=lambda p, m, *, v=None, **options: dualpipe(p, m, **options),
    formula=dualpipe_formula,
    options=("fused",),
    formula_options=("fused",),
)
