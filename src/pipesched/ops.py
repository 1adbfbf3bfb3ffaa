"""Op kinds and the Op value type, with PyTorch's compact text form (``2F0``, ``3I1``, and
``(0F1;1B0)OVERLAP_F_B`` for a fused pair)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from pipesched.errors import PipeschedError

if TYPE_CHECKING:
    from pipesched.rules import Rules


class OpKind(StrEnum):
    """What a compute op does for one microbatch on one stage.

    The one-letter values are those of ``torch.distributed.pipelining``'s ``_ComputationType``.
    """

    FORWARD = "F"
    # backward for inputs: the gradient the previous stage waits for
    BACKWARD_INPUT = "I"
    # backward for weights: may be deferred to fill bubbles (zero-bubble schedules)
    BACKWARD_WEIGHT = "W"
    # full backward = I then W fused in one op
    BACKWARD = "B"
    # activation offload: move the stage-microbatch's activations to host memory after its
    # forward, on the device's host link (a stream beside the compute stream)
    OFFLOAD = "O"
    # bring them back before the backward that needs them, on the same host link
    RELOAD = "R"
    # two ops of one device computing at once, each hiding the other's communication
    # (DualPipe's F&B: one microbatch's forward with another's backward); an Op of this
    # kind carries its halves as ``parts``
    OVERLAP_F_B = "OVERLAP_F_B"

    def __str__(self) -> str:
        return self.value


F = OpKind.FORWARD
I = OpKind.BACKWARD_INPUT  # noqa: E741 - the letter is the domain's name for it
W = OpKind.BACKWARD_WEIGHT
B = OpKind.BACKWARD
O = OpKind.OFFLOAD  # noqa: E741 - the letter is the domain's name for it
R = OpKind.RELOAD
OVERLAP_F_B = OpKind.OVERLAP_F_B

# a kind's name is letters and underscores; an optional ".STEP" suffix: the step index of a
# stepped kind's op (a decode step), absent at 0
_OP_TEXT = re.compile(r"^(\d+)([A-Za-z_]+)(\d+)(?:\.(\d+))?$")
_FUSED_TEXT = re.compile(r"^\(([^()]*)\)([A-Za-z_]+)$")
# a fused op's stage and microbatch: it has neither, its parts have them (PyTorch writes -1)
NO_INDEX = -1


class Op(NamedTuple):
    """One compute op: (stage, kind, microbatch). Its text form is ``f"{stage}{kind}{mb}"``.

    ``step`` is a third coordinate for kinds that run several times per stage-microbatch (a
    decode step of a request: step t appends the t-th token); 0 for every training kind, and
    then absent from the text. A step op's text is ``f"{stage}{kind}{mb}.{step}"``.

    A fused op (kind ``OVERLAP_F_B``) is one entry of a device's table made of ``parts``,
    plain ops of that device that run at once; it has no stage or microbatch of its own
    (both ``NO_INDEX``). Its text is PyTorch's: the parts in brackets, then the kind.

    >>> Op.parse("3I1")
    Op(stage=3, kind=<OpKind.BACKWARD_INPUT: 'I'>, microbatch=1)
    >>> str(Op(0, F, 12))
    '0F12'
    >>> pair = Op.fused(Op(0, F, 1), Op(1, B, 0))
    >>> str(pair), Op.parse(str(pair)) == pair
    ('(0F1;1B0)OVERLAP_F_B', True)
    >>> str(Op(2, F, 0, step=3)), Op.parse("2F0.3").step
    ('2F0.3', 3)
    """

    stage: int
    kind: OpKind
    microbatch: int
    parts: tuple[Op, ...] = ()
    step: int = 0

    def __repr__(self) -> str:
        fields = f"stage={self.stage!r}, kind={self.kind!r}, microbatch={self.microbatch!r}"
        extra = f", parts={self.parts!r}" if self.parts else ""
        return f"Op({fields}{extra}{f', step={self.step!r}' if self.step else ''})"

    def __str__(self) -> str:
        if self.parts:
            return f"({';'.join(map(str, self.parts))}){self.kind}"
        return f"{self.stage}{self.kind}{self.microbatch}{f'.{self.step}' if self.step else ''}"

    @property
    def atoms(self) -> tuple[Op, ...]:
        """The plain ops this entry runs: its parts when fused, else itself."""
        return self.parts or (self,)

    @classmethod
    def fused(cls, *parts: Op, kind: OpKind = OVERLAP_F_B) -> Op:
        """One table entry running ``parts`` (plain ops, in order) at once."""
        for part in parts:
            if part.parts:
                raise PipeschedError(f"op={part}: a fused op's parts are plain ops like 0F1 or 1B0")
        if len(parts) < 2:
            raise PipeschedError(f"op={cls(NO_INDEX, kind, NO_INDEX, tuple(parts))}: a fused op has two or more parts")
        return cls(NO_INDEX, kind, NO_INDEX, tuple(parts))

    @classmethod
    def parse(cls, text: str, rules: Rules | None = None) -> Op:
        """Parse ``2F0`` or ``(0F1;1B0)OVERLAP_F_B`` text naming a kind of ``rules`` (None: the
        default table's, every OpKind); raise PipeschedError naming the token otherwise, an
        UnknownKindError when it is well formed but its kind is not one of the rules'."""
        kinds, fused_kinds = (_KINDS, _FUSED_KINDS) if rules is None else (rules.kinds_by_name, rules.fused_kinds)
        token = text.strip()
        match = _OP_TEXT.match(token)
        if match is not None:
            kind = kinds.get(match.group(2))
            if kind is None or kind in fused_kinds:
                raise UnknownKindError(text, match.group(2), kinds, fused_kinds, fused=False)
            step = int(match.group(4)) if match.group(4) else 0
            return cls(int(match.group(1)), kind, int(match.group(3)), step=step)
        fused = _FUSED_TEXT.match(token)
        if fused is not None:
            kind = kinds.get(fused.group(2))
            if kind is None or kind not in fused_kinds:
                raise UnknownKindError(text, fused.group(2), kinds, fused_kinds, fused=True)
            parts = tuple(cls.parse(part, rules) for part in fused.group(1).split(";"))
            return cls.fused(*parts, kind=kind)
        raise PipeschedError(
            f"op={text!r}: not an op; write STAGE KIND MICROBATCH like 2F0, 3I1, 3W1 or 1B0 (0O1, 0R1 for an "
            "offload and its reload), or a fused pair like (0F1;1B0)OVERLAP_F_B"
        )


class UnknownKindError(PipeschedError):
    """Op text of the right form whose kind the rules do not know as such: ``reason`` says
    which kinds they know."""

    def __init__(self, text: str, name: str, kinds: Mapping[str, OpKind], fused_kinds: frozenset[OpKind], *,
                 fused: bool) -> None:
        plain = ", ".join(str(kind) for kind in kinds.values() if kind not in fused_kinds)
        joined = ", ".join(str(kind) for kind in kinds.values() if kind in fused_kinds) or "none"
        if name not in kinds:
            self.reason = f"{name} is not a kind of the rules; their kinds: {plain} (fused: {joined})"
        elif fused:
            self.reason = f"{name} is not a fused kind; the rules' fused kinds: {joined}"
        else:
            self.reason = f"{name} is a fused kind; write its parts in brackets, like (0F1;1B0){name}"
        super().__init__(f"op={text!r}: not an op; {self.reason}")


# the kinds op text names without rules: every OpKind (the kinds of rules.RULES)
_KINDS: Mapping[str, OpKind] = {kind.value: kind for kind in OpKind}
_FUSED_KINDS = frozenset({OVERLAP_F_B})

