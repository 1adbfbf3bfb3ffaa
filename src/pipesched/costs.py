"""StageCosts: what one microbatch costs on each stage; the one cost type of pipesched.

The same type feeds every level and every tool: the closed forms (level 1) read its F, I,
W of a stage, the slot table (level 2) runs on slot costs (``StageCosts.slots``: F = I = W
= 1 slot unless told, one stage-microbatch of activations), the simulator (level 3), the
greedy generators, the solver and the Monte Carlo engine run on per-stage seconds and bytes
derived from a model + partition + device (``pipesched.model``), read from a stage-cost CSV
(``pipesched.io.stage_costs``), or measured (``pipesched.runtime``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from numbers import Integral

from pipesched.enums import TimeUnit
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_SECONDS, check_amount
from pipesched.ops import Op, OpKind
from pipesched.rules import HOST_TRANSFER, RULES

SECONDS, SLOTS = TimeUnit.SECONDS, TimeUnit.SLOT


def _floats(values: Sequence[float], field_name: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    for stage, value in enumerate(out):
        require(
            math.isfinite(value) and value >= 0,
            f"{field_name}[stage {stage}]",
            value,
            "must be a finite number >= 0",
        )
    return out


_PER_STAGE = ("forward", "backward_input", "backward_weight", "activation_bytes", "output_bytes",
              "backward", "static_bytes", "grad_bytes", "kept_for_w_bytes", "recompute_s", "forward_backward")
# the times an op kind's rule may name (``StageCosts.times``)
TIMES = ("forward", "backward_input", "backward_weight", "backward")


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs of one microbatch; index = stage. Times in ``unit`` (seconds, or slots
    of the idealized table), sizes in bytes (stage-microbatches for slot costs).

    forward, backward_input, backward_weight: F, I and W durations; a full backward B costs
    ``backward[s]`` when given, else backward_input + backward_weight.
    activation_bytes: activations kept from F until the backward frees them (M_B).
    output_bytes: the tensor F sends to the next stage (its gradient comes back the same size).
    static_bytes: parameters + gradients + optimizer state of the stage (there all iteration).
    grad_bytes: gradient bytes the stage's replicas all-reduce (Chimera, DualPipe).
    input_frees: fraction of activation_bytes an I frees; W frees the rest (zero-bubble
    schedules keep the inputs W needs): M_W = (1 - input_frees) x M_B.
    kept_for_w_bytes: gradients an I computes that its W still needs (the output gradient of
    every weight matmul), allocated when I ends and freed when W ends; None = nothing.
    frozen: per stage, True when all its layers are frozen (no weight gradient: see
    ``pipesched.rules.stage_roles``); None = every stage trains.
    recompute_s: the part of backward_input (and backward) that redoes the forward
    (activation recompute), per stage; None = not known (reports only).
    forward_backward, fb_cost: what an overlapped pair (a fused ``OVERLAP_F_B`` op: a
    forward and a backward of one device computing at once) costs; see ``fused_time``.
    """

    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    output_bytes: tuple[float, ...]
    backward: tuple[float, ...] | None = None
    static_bytes: tuple[float, ...] | None = None
    grad_bytes: tuple[float, ...] | None = None
    input_frees: float = 0.5
    kept_for_w_bytes: tuple[float, ...] | None = None
    unit: str = SECONDS
    frozen: tuple[bool, ...] | None = None
    recompute_s: tuple[float, ...] | None = None
    # measured time of an overlapped pair whose forward runs stage s (the ``fb`` column)
    forward_backward: tuple[float, ...] | None = None
    # without it: a pair's time over the sum of its parts' times (1: no overlap, F&B = F + B)
    fb_cost: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.forward)
        require(n >= 1, "stages", n, "stage costs need at least one stage")
        for name in _PER_STAGE:
            values = getattr(self, name)
            if values is None:
                continue
            require(len(values) == n, name, f"{len(values)} values", f"give one value per stage ({n})")
            object.__setattr__(self, name, _floats(values, name))
        if self.frozen is not None:
            require(len(self.frozen) == n, "frozen", f"{len(self.frozen)} values", f"give one value per stage ({n})")
            object.__setattr__(self, "frozen", tuple(bool(flag) for flag in self.frozen))
        require(0.0 <= self.input_frees <= 1.0, "input_frees", self.input_frees, "must be in [0, 1]")
        require(self.unit in (SECONDS, SLOTS), "unit", self.unit, f"must be {SECONDS!r} or {SLOTS!r}")
        require(math.isfinite(self.fb_cost) and 0.5 <= self.fb_cost <= 1.0, "fb_cost", self.fb_cost,
                "an overlapped pair's time over F + B must be in [0.5, 1] (1: no overlap)")

    @property
    def num_stages(self) -> int:
        return len(self.forward)

    def of_microbatch_fraction(self, fraction: float) -> StageCosts:
        """The costs of a microbatch ``fraction`` of the size these describe (Chimera's
        backward halving runs half-size microbatches), scaled linearly: every time and every
        per-microbatch size times ``fraction``; parameters, gradients and optimizer state
        unchanged. Small microbatches run matmuls less efficiently than this assumes: cost
        them at that size (``-b``) for the real figure."""
        require(math.isfinite(fraction) and 0.0 < fraction <= 1.0, "microbatch_fraction", fraction,
                "must be in (0, 1]")
        if fraction == 1.0:
            return self

        def scaled(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
            return None if values is None else tuple(x * fraction for x in values)

        return replace(self, forward=scaled(self.forward), backward_input=scaled(self.backward_input),
                       backward_weight=scaled(self.backward_weight), backward=scaled(self.backward),
                       activation_bytes=scaled(self.activation_bytes), output_bytes=scaled(self.output_bytes),
                       kept_for_w_bytes=scaled(self.kept_for_w_bytes), recompute_s=scaled(self.recompute_s),
                       forward_backward=scaled(self.forward_backward))

    def checkpointed(self, stages: Sequence[int]) -> StageCosts:
        """These costs with a stage checkpoint on ``stages`` (what ``synthesize
        --allow-recompute`` decides per stage, and what a schedule's ``recompute_stages``
        asks the simulator for): such a stage keeps only its input from F to the end of its
        backward, one boundary tensor (``output_bytes[s - 1]``; stage 0 the embedding's
        output, ``output_bytes[0]``), and its I and B redo its whole forward first
        (``recompute_s`` grows by F). Every other field is kept: the gradients I leaves for
        W (``kept_for_w_bytes``), parameters, frozen stages, pair costs. The recomputed
        activations live inside the backward op only, as with the model's full recompute.

        >>> c = StageCosts.uniform(2, activation_bytes=10.0, output_bytes=1.0).checkpointed([1])
        >>> c.backward_input, c.activation_bytes, c.full_backward(1), c.recompute_s
        ((1.0, 2.0), (10.0, 1.0), 3.0, (0.0, 1.0))
        """
        chosen = set(stages)
        for stage in chosen:
            require(isinstance(stage, Integral) and not isinstance(stage, bool) and 0 <= stage < self.num_stages,
                    "recompute_stages", stage, f"give stage numbers 0..{self.num_stages - 1}")
        if not chosen:
            return self

        def redo(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
            if values is None:
                return None
            return tuple(v + self.forward[s] if s in chosen else v for s, v in enumerate(values))

        return replace(
            self,
            backward_input=redo(self.backward_input),
            backward=redo(self.backward),
            activation_bytes=tuple(self.output_bytes[max(s - 1, 0)] if s in chosen else a
                                   for s, a in enumerate(self.activation_bytes)),
            recompute_s=redo(self.recompute_s or (0.0,) * self.num_stages),
        )

    def full_backward(self, stage: int) -> float:
        if self.backward is not None:
            return self.backward[stage]
        return self.backward_input[stage] + self.backward_weight[stage]

    def times(self, name: str) -> tuple[float, ...]:
        """Per-stage durations of the cost ``name`` an op kind's rule names (``forward``,
        ``backward_input``, ``backward_weight``, or ``backward``: the full backward)."""
        if name == "backward":
            return tuple(self.full_backward(s) for s in range(self.num_stages))
        if name not in TIMES:
            raise PipeschedError(f"cost={name!r}: not a time of StageCosts")
        return getattr(self, name)

    @cached_property
    def _times_by_kind(self) -> dict[OpKind, tuple[float, ...]]:
        return {rule.kind: self.times(rule.cost) for rule in RULES if rule.cost != HOST_TRANSFER and not rule.fused}

    def of(self, kind: OpKind, stage: int) -> float:
        """Duration of an op of ``kind`` on ``stage`` (as the default rules map kinds to
        compute costs; an offload's time depends on the host link: see
        ``pipesched.simulate.graph.op_durations``)."""
        times = self._times_by_kind.get(kind)
        if times is None:
            raise PipeschedError(f"kind={kind}: its time is not a stage cost (it moves activations over the host link)")
        return times[stage]

    @property
    def frozen_stages(self) -> frozenset[int]:
        """The stages whose layers are all frozen."""
        return frozenset(s for s, flag in enumerate(self.frozen or ()) if flag)

    def duration(self, op: Op) -> float:
        """Compute time of one op (a fused op: ``fused_time`` of its parts)."""
        if op.parts:
            forward, *rest = op.parts
            return self.fused_time(forward.stage, self.duration(forward), sum(self.duration(part) for part in rest))
        return self.of(op.kind, op.stage)

    def fused_time(self, forward_stage: int, forward: float, backward: float) -> float:
        """Time of an overlapped pair (F&B): a forward of ``forward`` on ``forward_stage``
        computing at once with a backward of ``backward`` (both in this cost's unit).

        The parts' sum less what overlaps: the measured pair time ``forward_backward`` of the
        forward's stage when given, else ``fb_cost`` x (F + B); never less than the longer
        part (one part cannot hide the other's own compute).

        >>> StageCosts.slots().fused_time(0, 1.0, 2.0), StageCosts.slots(fb_cost=0.75).fused_time(0, 2.0, 2.0)
        (3.0, 3.0)
        """
        longer = max(forward, backward)
        if self.forward_backward is not None:
            return max(self.forward_backward[forward_stage], longer)
        return max(self.fb_cost * (forward + backward), longer)

    def static(self, stage: int) -> float:
        return self.static_bytes[stage] if self.static_bytes is not None else 0.0

    # --- what the closed forms read: one stage's F, I, W --------------------------------
    @property
    def f(self) -> float:
        """F of the slowest stage (the closed forms assume every stage costs the same)."""
        return max(self.forward)

    @property
    def i(self) -> float:
        return max(self.backward_input)

    @property
    def w(self) -> float:
        return max(self.backward_weight)

    @property
    def b(self) -> float:
        return max(self.full_backward(s) for s in range(self.num_stages))

    @property
    def is_uniform(self) -> bool:
        """Every stage costs the same (the closed forms are then about these costs)."""
        return all(len(set(getattr(self, name) or (0.0,))) == 1 for name in _PER_STAGE)

    def map_stages(self, transform: Callable[[str, tuple], tuple]) -> StageCosts:
        """These costs with every per-stage field given (the times, the sizes, ``frozen``)
        replaced by ``transform(name, values)``, the rest kept: one transform for each way
        of changing the stages (``broadcast``, chunk splitting), so none drops a field.

        >>> StageCosts.uniform(2, forward=2.0).map_stages(lambda name, v: v[:1]).forward
        (2.0,)
        """
        return replace(self, **{name: transform(name, getattr(self, name))
                                for name in (*_PER_STAGE, "frozen") if getattr(self, name) is not None})

    def broadcast(self, num_stages: int, *, family: str = "the schedule") -> StageCosts:
        """These costs for ``num_stages`` stages: one row is repeated for every stage; a
        table of ``num_stages`` rows is itself. (Splitting a model stage into chunks divides
        its costs: that is ``pipesched.experiments.setup.split_stage_costs``.)"""
        if self.num_stages == num_stages:
            return self
        require(
            self.num_stages == 1,
            "costs",
            f"{self.num_stages} stages",
            f"{family} here has {num_stages} stages; give one cost row per stage, or one row for all",
        )

        return self.map_stages(lambda _name, values: values * num_stages)


    # --- constructors ---------------------------------------------------------------------
    @classmethod
    def uniform(
        cls,
        num_stages: int,
        *,
        forward: float = 1.0,
        backward_input: float = 1.0,
        backward_weight: float = 1.0,
        activation_bytes: float = 1.0,
        output_bytes: float = 0.0,
        unit: str = SECONDS,
    ) -> StageCosts:
        """Equal costs on every stage."""
        def each(x: float) -> tuple[float, ...]:
            return (x,) * num_stages

        return cls(each(forward), each(backward_input), each(backward_weight),
                   each(activation_bytes), each(output_bytes), unit=unit)

    @classmethod
    def slots(cls, f: float = 1.0, i: float = 1.0, w: float = 1.0, *, stages: int = 1,
              fb_cost: float = 1.0) -> StageCosts:
        """The idealized table's costs: F, I and W slot lengths (a full backward B = I + W),
        the same on every stage; each stage-microbatch holds one unit of activations from F
        until the op that ends its backward (B, or W when split), so memory counts
        stage-microbatches in flight.

        >>> StageCosts.slots().b, StageCosts.slots(1, 2, 1).num_stages
        (2.0, 1)
        """
        costs = cls.uniform(stages, forward=f, backward_input=i, backward_weight=w, unit=SLOTS)
        return StageCosts(costs.forward, costs.backward_input, costs.backward_weight,
                          costs.activation_bytes, costs.output_bytes, input_frees=0.0, unit=SLOTS, fb_cost=fb_cost)

    @classmethod
    def parse_slots(cls, text: str) -> StageCosts:
        """``"F,I,W"`` slot lengths (e.g. ``1,2,1``) as slot costs (``--set costs=...``)."""
        parts = [part.strip() for part in str(text).split(",")]
        try:
            values = [float(part) for part in parts]
        except ValueError:
            values = []
        # every op takes time: a zero-length op would make a table's makespan and bubbles meaningless
        if len(values) != 3 or not all(math.isfinite(v) and v > 0 for v in values):
            raise PipeschedError(
                f"costs={str(text)[:40]!r}: give F,I,W slot lengths like 1,1,1 or 1,2,1 (numbers > 0), "
                "or a stage-cost CSV file"
            )
        for kind, value in zip("FIW", values, strict=True):  # a slot is a duration: bounded like one
            check_amount(f"costs.{kind}", value, limit=MAX_SECONDS, unit="slots")
        return cls.slots(*values)
