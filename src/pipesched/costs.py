"""StageCosts: what one microbatch costs on each stage; the one cost type of pipesched.

The same type feeds every level and every tool: the closed forms (level 1) read its F, I,
W of a stage, the slot table (level 2) runs on slot costs (``StageCosts.slots``: F = I = W
= 1 slot unless told, one stage-microbatch of activations), the simulator (level 3), the
greedy generators, the solver and the Monte Carlo engine run on per-stage seconds and bytes
derived from a model + partition + device (``pipesched.model``), read from a stage-cost CSV
(``pipesched.io.stage_costs``), or measured (``pipesched.runtime``).

Every field is declared once, in ``COST_FIELDS``: what it means, per stage or for all
stages, what its values are, how it scales with the microbatch's size, with a stage
checkpoint, when a stage is split into chunks, in the slot table and in a fused pair, and
its column in the stage-cost CSV. Every transform below (and the CSV and JSON forms) reads
that declaration, so a new field is one entry there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from functools import cached_property
from numbers import Integral

from pipesched.enums import TimeUnit
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_AMOUNT, MAX_SECONDS, MAX_STAGES, check_amount, check_count
from pipesched.ops import Op, OpKind
from pipesched.rules import HOST_TRANSFER, RULES, Rules

SECONDS, SLOTS = TimeUnit.SECONDS, TimeUnit.SLOT


class Quantity(StrEnum):
    """What a cost field's values are."""

    TIME = "time"  # seconds, or slots of the idealized table (``StageCosts.unit``)
    BYTES = "bytes"  # bytes (stage-microbatches for slot costs)
    FRACTION = "fraction"  # a share in [0, 1]
    RATIO = "ratio"  # an overlapped pair's time over the sum of its parts' times, in [0.5, 1]
    FLAG = "flag"  # True or False (1 or 0 in a file)
    UNIT = "unit"  # the unit of the times: SECONDS or SLOTS


class Checkpoint(StrEnum):
    """What a stage checkpoint (``StageCosts.checkpointed``) makes of a field on its stage."""

    KEEP = "keep"
    REDO = "redo"  # grows by the stage's forward: the backward redoes it first
    BOUNDARY = "boundary"  # the stage's input boundary tensor: all the checkpoint keeps from F


class Chunks(StrEnum):
    """What a per-stage field is on each of k equal chunks of a stage (``StageCosts.in_chunks``)."""

    DIVIDE = "divide"  # 1/k of the stage's
    # the stage's: a chunk boundary carries the stage boundary's tensor; a chunk of a frozen
    # stage is frozen
    KEEP = "keep"


class Fusion(StrEnum):
    """What a field is to a fused pair (an ``OVERLAP_F_B`` op: a forward and a backward at once)."""

    PART = "part"  # an op's time: the pair's is its parts' sum less the overlap (``fused_time``)
    PAIR = "pair"  # what the pair itself costs: replaced by a given ratio (``with_pair_cost``)
    NONE = "none"  # not a time of the pair (sizes are the parts': memory and messages)


class Slot(Enum):
    """A field's value in the slot table (``StageCosts.in_slots``) when it is no constant."""

    GIVEN = "given"  # the given costs' (op lengths in slots, the pair's cost)


@dataclass(frozen=True)
class CostField:
    """One field of StageCosts: its meaning and how every transform treats it.

    absent: what the field means when not given (None): for ``absent_is_zero`` fields, zero
    on every stage. slot: its value in the slot table: ``Slot.GIVEN``, a constant (on every
    stage for a per-stage field), or None (not there)."""

    name: str
    meaning: str
    quantity: Quantity
    column: str = ""  # its column in the stage-cost CSV (default: its name)
    per_stage: bool = True  # one value per stage; else one value for all stages
    required: bool = False  # always given (a column every stage-cost file has)
    per_microbatch: bool = False  # scales linearly with the microbatch's size
    checkpoint: Checkpoint = Checkpoint.KEEP
    chunks: Chunks = Chunks.DIVIDE
    slot: object = None
    fusion: Fusion = Fusion.NONE
    absent: str = ""
    absent_is_zero: bool = False

    def __post_init__(self) -> None:
        if not self.column:
            object.__setattr__(self, "column", self.name)


COST_FIELDS: tuple[CostField, ...] = (
    CostField("forward", "F: the forward's time", Quantity.TIME, required=True, per_microbatch=True,
              slot=Slot.GIVEN, fusion=Fusion.PART),
    CostField("backward_input", "I: the backward for inputs' time", Quantity.TIME, required=True, per_microbatch=True,
              checkpoint=Checkpoint.REDO, slot=Slot.GIVEN, fusion=Fusion.PART),
    CostField("backward_weight", "W: the backward for weights' time", Quantity.TIME, required=True,
              per_microbatch=True, slot=Slot.GIVEN, fusion=Fusion.PART),
    CostField("activation_bytes", "M_B: activations kept from F until the backward frees them", Quantity.BYTES,
              required=True, per_microbatch=True, checkpoint=Checkpoint.BOUNDARY, slot=1.0),
    CostField("output_bytes", "the tensor F sends to the next stage (its gradient comes back the same size)",
              Quantity.BYTES, required=True, per_microbatch=True, chunks=Chunks.KEEP, slot=0.0),
    CostField("backward", "B: the full backward's time", Quantity.TIME, per_microbatch=True,
              checkpoint=Checkpoint.REDO, slot=Slot.GIVEN, fusion=Fusion.PART, absent="I + W"),
    CostField("static_bytes", "parameters + gradients + optimizer state of the stage (there all iteration)",
              Quantity.BYTES, absent="none", absent_is_zero=True),
    CostField("grad_bytes", "gradient bytes the stage's copies all-reduce", Quantity.BYTES,
              absent="static_bytes x 4 / 18 (``pipesched.simulate.graph.gradient_bytes``)"),
    CostField("input_frees", "the share of M_B an I frees; W frees the rest, M_W = (1 - input_frees) x M_B",
              Quantity.FRACTION, per_stage=False, slot=0.0),
    CostField("kept_for_w_bytes", "gradients an I computes that its W still needs, held from I's end to W's",
              Quantity.BYTES, per_microbatch=True, absent="none", absent_is_zero=True),
    CostField("unit", "the unit of the times: seconds, or slots of the idealized table", Quantity.UNIT,
              per_stage=False, slot=SLOTS),
    CostField("frozen", "all the stage's layers are frozen (no weight gradient: ``pipesched.rules.stage_roles``)",
              Quantity.FLAG, chunks=Chunks.KEEP, absent="every stage trains"),
    CostField("recompute_s", "the part of I (and B) that redoes the forward (activation recompute)", Quantity.TIME,
              per_microbatch=True, checkpoint=Checkpoint.REDO, absent="not known (reports count none)",
              absent_is_zero=True),
    CostField("forward_backward", "time of an overlapped pair whose forward runs the stage (measured, or computed "
              "from the layers' phases: pipesched.model.phases)", Quantity.TIME,
              column="fb", per_microbatch=True, slot=Slot.GIVEN, fusion=Fusion.PAIR,
              absent="fb_cost x (F + B)"),
    CostField("fb_cost", "without forward_backward: a pair's time over the sum of its parts' (1: no overlap)",
              Quantity.RATIO, per_stage=False, slot=Slot.GIVEN, fusion=Fusion.PAIR),
)
FIELDS: Mapping[str, CostField] = {spec.name: spec for spec in COST_FIELDS}
PER_STAGE = tuple(spec.name for spec in COST_FIELDS if spec.per_stage)
_PER_STAGE_FLAGS = tuple((spec.name, spec.quantity is Quantity.FLAG) for spec in COST_FIELDS if spec.per_stage)
_PER_MICROBATCH = tuple(spec.name for spec in COST_FIELDS if spec.per_microbatch)
# the slot table's fields (``StageCosts.in_slots``): given, a constant, or one on every stage
_SLOT_GIVEN = tuple(spec.name for spec in COST_FIELDS if spec.slot is Slot.GIVEN)
_SLOT_SCALARS = {spec.name: spec.slot for spec in COST_FIELDS
                 if spec.slot is not Slot.GIVEN and (spec.slot is None or not spec.per_stage)}
_SLOT_PER_STAGE = tuple((spec.name, spec.slot) for spec in COST_FIELDS
                        if spec.slot is not Slot.GIVEN and spec.slot is not None and spec.per_stage)
# the times an op kind's rule may name (``StageCosts.times``): an op's own duration
TIMES = tuple(spec.name for spec in COST_FIELDS if spec.quantity is Quantity.TIME and spec.fusion is Fusion.PART)
# each quantity's bounds in a file or a JSON value, and its words for a message
BOUNDS = {Quantity.TIME: (0.0, MAX_SECONDS), Quantity.BYTES: (0.0, MAX_AMOUNT), Quantity.FRACTION: (0.0, 1.0),
          Quantity.RATIO: (0.5, 1.0)}
WORDS = {Quantity.TIME: "seconds", Quantity.BYTES: "bytes", Quantity.FRACTION: "a fraction in [0, 1]",
         Quantity.RATIO: "a pair's time over F + B in [0.5, 1]", Quantity.FLAG: "1 for a stage whose layers are all "
         "frozen, else 0", Quantity.UNIT: f"{SECONDS!r} or {SLOTS!r}"}


def _floats(values: Sequence[float], field_name: str) -> tuple[float, ...]:
    out = tuple(map(float, values))
    if all(map(math.isfinite, out)) and min(out, default=0.0) >= 0:
        return out  # the common case, checked in one pass; else the first bad stage is named
    for stage, value in enumerate(out):
        require(
            math.isfinite(value) and value >= 0,
            f"{field_name}[stage {stage}]",
            value,
            "must be a finite number >= 0",
        )
    return out


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs of one microbatch; index = stage. Times in ``unit`` (seconds, or slots
    of the idealized table), sizes in bytes (stage-microbatches for slot costs). What each
    field means, and how it is read, written and transformed: ``COST_FIELDS``. A full
    backward B costs ``backward[s]`` when given, else backward_input + backward_weight; an
    overlapped pair (a fused ``OVERLAP_F_B`` op) costs ``fused_time``.
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
    forward_backward: tuple[float, ...] | None = None
    fb_cost: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.forward)
        require(n >= 1, "stages", n, "stage costs need at least one stage")
        for name, flags in _PER_STAGE_FLAGS:
            values = getattr(self, name)
            if values is None:
                continue
            require(len(values) == n, name, f"{len(values)} values", f"give one value per stage ({n})")
            object.__setattr__(self, name, tuple(bool(flag) for flag in values) if flags else _floats(values, name))
        require(0.0 <= self.input_frees <= 1.0, "input_frees", self.input_frees, "must be in [0, 1]")
        require(self.unit in (SECONDS, SLOTS), "unit", self.unit, f"must be {SECONDS!r} or {SLOTS!r}")
        require(math.isfinite(self.fb_cost) and 0.5 <= self.fb_cost <= 1.0, "fb_cost", self.fb_cost,
                "an overlapped pair's time over F + B must be in [0.5, 1] (1: no overlap)")

    @property
    def num_stages(self) -> int:
        return len(self.forward)

    def stage_values(self, name: str) -> tuple:
        """The per-stage values of field ``name``, zeros when not given and it is then zero
        (``CostField.absent_is_zero``)."""
        values = getattr(self, name)
        if values is None and FIELDS[name].absent_is_zero:
            return (0.0,) * self.num_stages
        return values

    # --- transforms: each reads COST_FIELDS, so none forgets a field -----------------------
    def of_microbatch_fraction(self, fraction: float) -> StageCosts:
        """The costs of a microbatch ``fraction`` of the size these describe (Chimera's
        backward halving runs half-size microbatches), scaled linearly: every per-microbatch
        field (``CostField.per_microbatch``: the times and the activation, output and kept
        bytes) times ``fraction``; parameters, gradients and optimizer state unchanged. Small
        microbatches run matmuls less efficiently than this assumes: cost them at that size
        (``-b``) for the real figure.

        >>> StageCosts.uniform(1, forward=2.0, activation_bytes=4.0).of_microbatch_fraction(0.5).activation_bytes
        (2.0,)
        """
        require(math.isfinite(fraction) and 0.0 < fraction <= 1.0, "microbatch_fraction", fraction,
                "must be in (0, 1]")
        if fraction == 1.0:
            return self
        scaled = [name for name in _PER_MICROBATCH if getattr(self, name) is not None]
        return replace(self, **{name: tuple(x * fraction for x in getattr(self, name)) for name in scaled})

    def checkpointed(self, stages: Sequence[int]) -> StageCosts:
        """These costs with a stage checkpoint on ``stages`` (what ``synthesize
        --allow-recompute`` decides per stage, and what a schedule's ``recompute_stages``
        asks the simulator for): such a stage keeps only its input from F to the end of its
        backward, one boundary tensor (``output_bytes[s - 1]``; stage 0 the embedding's
        output, ``output_bytes[0]``), and its I and B redo its whole forward first
        (``recompute_s`` grows by F): ``CostField.checkpoint``. Every other field is kept:
        the gradients I leaves for W (``kept_for_w_bytes``), parameters, frozen stages, pair
        costs. The recomputed activations live inside the backward op only, as with the
        model's full recompute.

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
        # what a checkpointed stage s makes of a field's value v there
        change = {Checkpoint.REDO: lambda s, v: v + self.forward[s],
                  Checkpoint.BOUNDARY: lambda s, v: self.output_bytes[max(s - 1, 0)]}
        changed = {}
        for spec in COST_FIELDS:
            values = self.stage_values(spec.name) if spec.per_stage else None
            if spec.checkpoint is not Checkpoint.KEEP and values is not None:
                rule = change[spec.checkpoint]
                changed[spec.name] = tuple(rule(s, v) if s in chosen else v for s, v in enumerate(values))
        return replace(self, **changed)

    def map_stages(self, transform: Callable[[str, tuple], tuple]) -> StageCosts:
        """These costs with every per-stage field given (the times, the sizes, ``frozen``)
        replaced by ``transform(name, values)``, the rest kept: one transform for each way
        of changing the stages (``broadcast``, ``in_chunks``), so none drops a field.

        >>> StageCosts.uniform(2, forward=2.0).map_stages(lambda name, v: v[:1]).forward
        (2.0,)
        """
        return replace(self, **{name: transform(name, getattr(self, name))
                                for name in PER_STAGE if getattr(self, name) is not None})

    def broadcast(self, num_stages: int, *, family: str = "the schedule") -> StageCosts:
        """These costs for ``num_stages`` stages: one row is repeated for every stage; a
        table of ``num_stages`` rows is itself. (Splitting a model stage into chunks divides
        its costs: that is ``in_chunks``.)"""
        if self.num_stages == num_stages:
            return self
        require(
            self.num_stages == 1,
            "costs",
            f"{self.num_stages} stages",
            f"{family} here has {num_stages} stages; give one cost row per stage, or one row for all",
        )
        return self.map_stages(lambda _name, values: values * num_stages)

    def in_chunks(self, k: int) -> StageCosts:
        """These costs with each stage split into ``k`` equal chunks, in order (stage s's
        chunks are stages s k .. s k + k - 1): each field as ``CostField.chunks`` says (the
        times and sizes divided by k; the output bytes and frozen flags kept).

        >>> StageCosts.uniform(1, forward=2.0, output_bytes=3.0).in_chunks(2).output_bytes
        (3.0, 3.0)
        """
        def chunks(name: str, values: tuple) -> tuple:
            keep = FIELDS[name].chunks is Chunks.KEEP
            return tuple(values[s // k] if keep else values[s // k] / k for s in range(self.num_stages * k))

        return self if k == 1 else self.map_stages(chunks)

    def in_slots(self) -> StageCosts:
        """These costs as the slot table runs them (``CostField.slot``): the op lengths (in
        slots) and the pair's cost given; one unit of activations per stage-microbatch held
        from its F until the op that ends its backward (none freed at I), free messages,
        nothing else.

        >>> StageCosts.uniform(2, forward=2.0, activation_bytes=8.0).in_slots().activation_bytes
        (1.0, 1.0)
        """
        n = self.num_stages
        given = {name: getattr(self, name) for name in _SLOT_GIVEN}
        return StageCosts(**given, **_SLOT_SCALARS, **{name: (value,) * n for name, value in _SLOT_PER_STAGE})

    def with_pair_cost(self, fb_cost: float) -> StageCosts:
        """These costs with an overlapped pair costing ``fb_cost`` x (F + B): every field of
        the pair's own cost (``Fusion.PAIR``) replaced, a measured pair time dropped.

        >>> StageCosts.slots().with_pair_cost(0.75).fused_time(0, 2.0, 2.0)
        3.0
        """
        return replace(self, **{spec.name: fb_cost if spec.quantity is Quantity.RATIO else None
                                for spec in COST_FIELDS if spec.fusion is Fusion.PAIR})

    def with_op_overhead(self, seconds: float) -> StageCosts:
        """These costs with a fixed cost of ``seconds`` added to every op's time (a runtime's
        per-op overhead): each per-stage time of an op (F, I, W, B, a pair) given.

        >>> StageCosts.uniform(1).with_op_overhead(0.5).full_backward(0)
        3.0
        """
        ops = [spec.name for spec in COST_FIELDS if spec.quantity is Quantity.TIME and spec.fusion is not Fusion.NONE]
        return replace(self, **{name: tuple(v + seconds for v in getattr(self, name))
                                for name in ops if getattr(self, name) is not None})

    def for_roles(self, roles: Sequence[str], rules: Rules = RULES) -> StageCosts:
        """These costs with the time of each kind a stage's role does not run at zero (W on
        frozen stages, I and W on stages with no backward: ``Rules.kinds_for``), what a
        cost-aware generator plans a frozen table with; a full backward is then I + W."""
        require(len(roles) == self.num_stages, "roles", f"{len(roles)} values",
                f"give one role per stage ({self.num_stages})")
        runs = [rules.kinds_for(role) for role in roles]
        dropped = {}
        for rule in rules:
            spec = FIELDS.get(rule.cost)
            if spec is not None and spec.required and spec.quantity is Quantity.TIME:
                dropped[rule.cost] = tuple(v if rule.kind in runs[s] else 0.0
                                           for s, v in enumerate(getattr(self, rule.cost)))
        derived = {spec.name: None for spec in COST_FIELDS
                   if spec.quantity is Quantity.TIME and spec.fusion is Fusion.PART and not spec.required}
        return replace(self, **dropped, **derived)

    # --- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """The JSON form: every given field by name (per-stage fields as lists; flags as
        booleans); ``from_dict`` reads it back to equal costs."""
        out: dict[str, object] = {}
        for spec in COST_FIELDS:
            value = getattr(self, spec.name)
            if value is not None:
                out[spec.name] = list(value) if spec.per_stage else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, field: str = "costs") -> StageCosts:
        """Costs from their JSON form (``to_dict``), every value bounded as a file's is."""
        if not isinstance(data, Mapping):
            raise PipeschedError(f"{field}={str(data)[:40]!r}: give an object of cost fields")
        unknown = sorted(set(data) - set(FIELDS))
        require(not unknown, f"{field}.{unknown[0] if unknown else ''}", "given",
                f"not a cost field; the fields are {', '.join(FIELDS)}")
        missing = [spec.name for spec in COST_FIELDS if spec.required and spec.name not in data]
        require(not missing, f"{field}.{missing[0] if missing else ''}", "missing", "give one value per stage")
        return cls(**{name: _json_value(FIELDS[name], value, f"{field}.{name}") for name, value in data.items()})

    # --- what the ops cost ----------------------------------------------------------------
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
        """Every stage costs the same (the closed forms are then about these costs): each
        per-stage time and size the same on every stage."""
        return all(len(set(getattr(self, spec.name) or (0.0,))) == 1
                   for spec in COST_FIELDS if spec.per_stage and spec.quantity is not Quantity.FLAG)

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
    def from_times(cls, times: Mapping[str, Sequence[float]]) -> StageCosts:
        """Op times only (no memory, free messages): each field of ``times`` (by name, one
        value per stage) given, every other required field zero.

        >>> StageCosts.from_times({"forward": (1.0, 2.0), "backward": (2.0, 4.0)}).full_backward(1)
        4.0
        """
        require(bool(times), "times", "none", "give at least the forward's time per stage")
        stages = len(next(iter(times.values())))
        zeros = {spec.name: (0.0,) * stages for spec in COST_FIELDS if spec.required}
        return cls(**(zeros | dict(times)))

    @classmethod
    def slots(cls, f: float = 1.0, i: float = 1.0, w: float = 1.0, *, stages: int = 1,
              fb_cost: float = 1.0) -> StageCosts:
        """The idealized table's costs: F, I and W slot lengths (a full backward B = I + W),
        the same on every stage; each stage-microbatch holds one unit of activations from F
        until the op that ends its backward (B, or W when split), so memory counts
        stage-microbatches in flight (``in_slots``).

        >>> StageCosts.slots().b, StageCosts.slots(1, 2, 1).num_stages
        (2.0, 1)
        """
        costs = cls.uniform(stages, forward=f, backward_input=i, backward_weight=w).in_slots()
        return costs if fb_cost == costs.fb_cost else replace(costs, fb_cost=fb_cost)

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


def check_value(spec: CostField, value: object, where: str) -> object:
    """One value of field ``spec`` read from input, as StageCosts holds it: a number within
    its quantity's bounds, a flag of 0 or 1, or the unit's name; else a PipeschedError naming
    ``where`` (the field, or a file's line and column) and what to give."""
    words = WORDS[spec.quantity]
    if spec.quantity is Quantity.UNIT:
        if value not in (SECONDS, SLOTS):
            raise PipeschedError(f"{where}={str(value)[:40]!r}: give {words}")
        return value
    if not isinstance(value, int | float) or (isinstance(value, bool) and spec.quantity is not Quantity.FLAG):
        raise PipeschedError(f"{where}={str(value)[:40]!r}: not a number; give {words}")
    if spec.quantity is Quantity.FLAG:
        if value not in (0, 1):
            raise PipeschedError(f"{where}={value:g}: give {words}")
        return bool(value)
    low, high = BOUNDS[spec.quantity]
    if not math.isfinite(value) or value < 0:
        raise PipeschedError(f"{where}={value:g}: must be a finite number >= 0 ({words})")
    return check_amount(where, value, limit=high, minimum=low, unit=words)


def _json_value(spec: CostField, value: object, where: str) -> object:
    if not spec.per_stage:
        return check_value(spec, value, where)
    if value is None and not spec.required:
        return None
    if not isinstance(value, list | tuple):
        raise PipeschedError(f"{where}={str(value)[:40]!r}: give a list of one value per stage")
    check_count(where, len(value), MAX_STAGES, what="stages")
    return tuple(check_value(spec, item, f"{where}[{s}]") for s, item in enumerate(value))

