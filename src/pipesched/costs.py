"""StageCosts: what one microbatch costs on each stage; the input of the slot table and the
simulator. Derived from a model + partition + device (pipesched.model), read from a
stage-cost CSV, or measured (pipesched.runtime)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipesched.errors import require
from pipesched.ops import B, F, I, Op, W


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


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs of one microbatch; index = stage. Times in seconds (or slots), sizes in
    bytes.

    forward, backward_input, backward_weight: F, I and W durations; a full backward B costs
    ``backward[s]`` when given, else backward_input + backward_weight.
    activation_bytes: activations kept from F until the backward frees them.
    output_bytes: the tensor F sends to the next stage (its gradient comes back the same size).
    static_bytes: parameters + gradients + optimizer state of the stage (there all iteration).
    grad_bytes: gradient bytes the stage's replicas all-reduce (Chimera, DualPipe).
    input_frees: fraction of activation_bytes an I frees; W frees the rest (zero-bubble
    schedules keep the inputs W needs).
    kept_for_w_bytes: gradients an I computes that its W still needs (the output gradient of
    every weight matmul), allocated when I ends and freed when W ends; None = nothing.
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

    def __post_init__(self) -> None:
        n = len(self.forward)
        require(n >= 1, "stages", n, "stage costs need at least one stage")
        for name in ("forward", "backward_input", "backward_weight", "activation_bytes",
                     "output_bytes", "backward", "static_bytes", "grad_bytes", "kept_for_w_bytes"):
            values = getattr(self, name)
            if values is None:
                continue
            require(len(values) == n, name, f"{len(values)} values", f"give one value per stage ({n})")
            object.__setattr__(self, name, _floats(values, name))
        require(0.0 <= self.input_frees <= 1.0, "input_frees", self.input_frees, "must be in [0, 1]")

    @property
    def num_stages(self) -> int:
        return len(self.forward)

    def full_backward(self, stage: int) -> float:
        if self.backward is not None:
            return self.backward[stage]
        return self.backward_input[stage] + self.backward_weight[stage]

    def duration(self, op: Op) -> float:
        """Compute time of one op."""
        if op.kind is F:
            return self.forward[op.stage]
        if op.kind is I:
            return self.backward_input[op.stage]
        if op.kind is W:
            return self.backward_weight[op.stage]
        assert op.kind is B
        return self.full_backward(op.stage)

    def static(self, stage: int) -> float:
        return self.static_bytes[stage] if self.static_bytes is not None else 0.0

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
    ) -> StageCosts:
        """Equal costs on every stage (the slot table's unit costs by default)."""
        def each(x: float) -> tuple[float, ...]:
            return (x,) * num_stages

        return cls(each(forward), each(backward_input), each(backward_weight),
                   each(activation_bytes), each(output_bytes))
