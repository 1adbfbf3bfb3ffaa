"""Op kinds and the Op value type, with PyTorch's compact text form (``2F0``, ``3I1``)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import NamedTuple

from pipesched.errors import PipeschedError


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

    def __str__(self) -> str:
        return self.value


F = OpKind.FORWARD
I = OpKind.BACKWARD_INPUT  # noqa: E741 - the letter is the domain's name for it
W = OpKind.BACKWARD_WEIGHT
B = OpKind.BACKWARD
O = OpKind.OFFLOAD  # noqa: E741 - the letter is the domain's name for it
R = OpKind.RELOAD

# Fixed order used wherever kinds are stored as small integers (arrays, timelines); the
# order of the default rules table (``pipesched.rules.RULES``).
KIND_ORDER: tuple[OpKind, ...] = (F, I, W, B, O, R)
KIND_INDEX: dict[OpKind, int] = {kind: index for index, kind in enumerate(KIND_ORDER)}

_OP_TEXT = re.compile(r"^(\d+)([FIWBOR])(\d+)$")


class Op(NamedTuple):
    """One compute op: (stage, kind, microbatch). Its text form is ``f"{stage}{kind}{mb}"``.

    >>> Op.parse("3I1")
    Op(stage=3, kind=<OpKind.BACKWARD_INPUT: 'I'>, microbatch=1)
    >>> str(Op(0, F, 12))
    '0F12'
    """

    stage: int
    kind: OpKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse ``2F0`` style text; raise PipeschedError naming the token otherwise."""
        match = _OP_TEXT.match(text.strip())
        if match is None:
            raise PipeschedError(
                f"op={text!r}: not an op; write STAGE KIND MICROBATCH like 2F0, 3I1, 3W1, 1B0 (or 0O1, 0R1 for an offload and its reload)"
            )
        return cls(int(match.group(1)), OpKind(match.group(2)), int(match.group(3)))

