"""The rules of op kinds, in one table read by everything else.

For every op kind: which ops it needs (on its own stage and on the neighbour stages), which
of those inputs cross a stage boundary as a message (an activation going forward, a
gradient going back), what it costs (a ``StageCosts`` field), and what it does to the
memory its stage-microbatch holds. The schedule's data dependencies, the validator, the
slot table, the simulator's compiled task graph, the memory trace, the communication pass
and the greedy generators all read this table; a new kind (a fused pair, an offload, a
decode step) is one more entry plus the generators that emit it.

Memory. A stage-microbatch's activations are M_B bytes (``StageCosts.activation_bytes``)
from the start of its F. A full backward B frees all of them when it ends. A split backward
frees them in two parts: I frees what only the input gradient needed (``input_frees`` x
M_B) and W, which still needs the layer inputs, frees the rest, M_W = (1 - input_frees) x
M_B; I also leaves the gradients W consumes (the output gradient of every weight matmul,
K = ``StageCosts.kept_for_w_bytes``), held from I's end to W's. Each kind's effect is
``whole x M_B + input_part x input_frees x M_B + kept x K`` bytes, at the start of the op
(an allocation: the forward builds its activations up) or at its end (a free). Counted in stage-microbatches in flight (M_B = 1, input_frees = 0), F adds one and
the op that ends the backward (B, or W when split) takes it back.

Fused kinds. A kind with ``parts`` is a fused op (``OVERLAP_F_B``: one forward and one
backward of the same device running at once, DualPipe's F&B): one entry of a device's table
made of plain ops of the listed kinds, in that order. It has no needs, messages or memory
effect of its own: it needs what its parts need (the union, less what one part would take
from the other, which a fused op may not do), sends what its parts send once it ends, and
changes memory as its parts do (the forward's allocation when it starts, the backward's
frees when it ends). It holds its device for its ``cost``: ``StageCosts.fused_time``, the
parts' times less the part that overlaps. Completeness counts its parts.

Dependencies (the default table):

    F(s, mb)    needs F(s-1, mb)                  the activation it consumes
    I(s, mb)    needs F(s, mb) and I/B(s+1, mb)   its own activations and the output gradient
    B(s, mb)    needs F(s, mb) and I/B(s+1, mb)
    W(s, mb)    needs I(s, mb)                    the layer inputs and output gradient I kept

A need outside the model (stage -1 or S) is no need: stage 0's F reads the batch, the last
stage's backward starts from the loss. Every stage-microbatch runs exactly one of the
``complete`` sets of kinds: {F, B} or {F, I, W}.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from pipesched.errors import PipeschedError
from pipesched.ops import OVERLAP_F_B, B, F, I, Op, OpKind, W

# messages that cross a stage boundary
ACTIVATION = "activation"  # F(s) -> F(s+1): the hidden state, output_bytes[s]
GRADIENT = "gradient"  # I/B(s+1) -> I/B(s): the gradient of that hidden state, output_bytes[s]

# when a memory effect happens
AT_START, AT_END = "start", "end"


class Need(NamedTuple):
    """One input of an op: the op of ``kinds`` (the first the schedule has) on stage
    ``stage + offset`` of the same microbatch; ``message`` names what crosses the boundary
    when that op runs on another device (None: a same-stage input, always local)."""

    offset: int
    kinds: tuple[OpKind, ...]
    message: str | None = None


class MemoryEffect(NamedTuple):
    """Bytes = ``whole`` x M_B + ``input_part`` x input_frees x M_B + ``kept`` x K, at ``at``."""

    whole: float = 0.0
    input_part: float = 0.0
    at: str = AT_END
    kept: float = 0.0

    def bytes(self, activation: float, input_frees: float, kept_for_w: float = 0.0) -> float:
        return (self.whole + self.input_part * input_frees) * activation + self.kept * kept_for_w


@dataclass(frozen=True)
class KindRule:
    """Everything pipesched knows about one op kind."""

    kind: OpKind  # its letter (an OpKind; a plain one-letter str works for experiments)
    summary: str
    needs: tuple[Need, ...]
    cost: str  # what its duration is per stage: StageCosts.times(cost)
    memory: MemoryEffect = MemoryEffect()  # noqa: RUF009 - an immutable NamedTuple
    ends_weight_gradient: bool = False  # after it the stage-microbatch's weight gradient is complete
    # a fused kind: the kinds its parts may have, one tuple per part, in order (empty: a plain kind)
    parts: tuple[tuple[OpKind, ...], ...] = ()

    @property
    def fused(self) -> bool:
        return bool(self.parts)


@dataclass(frozen=True)
class Rules:
    """A table of op kinds and the sets of kinds a complete stage-microbatch runs."""

    kinds: tuple[KindRule, ...]
    complete: tuple[frozenset[OpKind], ...]
    by_kind: dict[OpKind, KindRule] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_kind", {rule.kind: rule for rule in self.kinds})
        if len(self.by_kind) != len(self.kinds):
            raise PipeschedError("rules: two entries for one op kind")

    def __getitem__(self, kind: OpKind) -> KindRule:
        try:
            return self.by_kind[kind]
        except KeyError:
            known = ", ".join(str(rule.kind) for rule in self.kinds)
            raise PipeschedError(f"op kind={kind!s}: not in the rules; known kinds: {known}") from None

    def __iter__(self) -> Iterator[KindRule]:
        return iter(self.kinds)

    def __len__(self) -> int:
        return len(self.kinds)

    def index(self, kind: OpKind) -> int:
        """Position of ``kind`` in the table: the small integer stored in arrays."""
        return self.kinds.index(self[kind])

    @cached_property
    def letters(self) -> tuple[str, ...]:
        return tuple(str(rule.kind) for rule in self.kinds)

    @cached_property
    def fused_kinds(self) -> frozenset[OpKind]:
        """The kinds whose ops are made of parts (never stored as an op row)."""
        return frozenset(rule.kind for rule in self.kinds if rule.fused)

    @cached_property
    def max_needs(self) -> int:
        return max((len(rule.needs) for rule in self.kinds), default=0)

    def with_kind(self, rule: KindRule, *, complete: tuple[frozenset[OpKind], ...] | None = None) -> Rules:
        """A new table with ``rule`` added (and other complete sets, when given)."""
        return Rules((*self.kinds, rule), self.complete if complete is None else complete)

    def sends(self, kind: OpKind) -> tuple[tuple[int, str], ...]:
        """(stage offset of the consumer, message) of each input ``kind`` produces for a
        neighbour stage: F sends its activation to s+1, I and B their gradient to s-1."""
        found = {(-need.offset, need.message): None for rule in self.kinds for need in rule.needs
                 if need.message is not None and kind in need.kinds}
        return tuple(found)

    def units_delta(self, kind: OpKind) -> float:
        """Change of stage-microbatches in flight an op of ``kind`` makes (M_B = 1, and the
        input part freed at I counted as still held until W); a fused kind makes none of its
        own: count its parts (``Op.atoms``)."""
        return self[kind].memory.bytes(1.0, 0.0)

    def fused_problem(self, op: Op) -> str | None:
        """Why the fused ``op``'s parts do not fit its kind's rule (None when they do)."""
        rule = self[op.kind]
        if not rule.fused:
            return None
        if len(op.parts) != len(rule.parts) or any(part.kind not in kinds
                                                      for part, kinds in zip(op.parts, rule.parts, strict=False)):
            wanted = ";".join("|".join(map(str, kinds)) for kinds in rule.parts)
            return f"its parts must be of kinds ({wanted}) in that order"
        return None

    def describe_complete(self) -> str:
        """What a complete stage-microbatch runs: 'one F and either one B or one I and one W'."""
        common = frozenset.intersection(*self.complete)

        def ones(kinds: frozenset[OpKind]) -> str:
            return " and ".join(f"one {kind}" for kind in self._ordered(kinds))

        options = [ones(kinds - common) for kinds in self.complete if kinds - common]
        text = ones(common)
        if options:
            text += (" and " if text else "") + ("either " + " or ".join(options) if len(options) > 1 else options[0])
        return text

    def _ordered(self, kinds: frozenset[OpKind]) -> list[OpKind]:
        return [rule.kind for rule in self.kinds if rule.kind in kinds]


# the backward that produces stage s's input gradient: I when the table splits it, else B
_GRADIENT_SOURCE = Need(+1, (I, B), GRADIENT)

RULES = Rules(
    kinds=(
        KindRule(F, "forward", needs=(Need(-1, (F,), ACTIVATION),), cost="forward",
                 memory=MemoryEffect(whole=+1.0, at=AT_START)),
        KindRule(I, "backward for inputs", needs=(Need(0, (F,)), _GRADIENT_SOURCE), cost="backward_input",
                 memory=MemoryEffect(input_part=-1.0, kept=+1.0, at=AT_END)),
        KindRule(W, "backward for weights", needs=(Need(0, (I,)),), cost="backward_weight",
                 memory=MemoryEffect(whole=-1.0, input_part=+1.0, kept=-1.0, at=AT_END), ends_weight_gradient=True),
        KindRule(B, "full backward (I then W)", needs=(Need(0, (F,)), _GRADIENT_SOURCE), cost="backward",
                 memory=MemoryEffect(whole=-1.0, at=AT_END), ends_weight_gradient=True),
        # fused kinds last (see "Fused kinds" above)
        KindRule(OVERLAP_F_B, "a forward and a backward of one device at once (DualPipe's F&B)", needs=(),
                 cost="forward_backward", parts=((F,), (B, I))),
    ),
    complete=(frozenset({F, B}), frozenset({F, I, W})),
)
