"""Per-stage F, I and W costs as the zero-bubble heuristics see them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.generators.base import SlotCosts
from pipesched.ops import F, I, OpKind


@dataclass(frozen=True)
class OpCosts:
    """Per-stage F, I and W durations of one microbatch (index = stage), as the heuristics
    see them."""

    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]

    def of(self, kind: OpKind, stage: int) -> float:
        if kind is F:
            return self.forward[stage]
        if kind is I:
            return self.backward_input[stage]
        return self.backward_weight[stage]


def op_costs(costs: StageCosts | SlotCosts | None, num_stages: int, family: str) -> OpCosts:
    """Per-stage costs from a StageCosts (one entry per stage of this schedule) or from
    SlotCosts (the same on every stage); None means F = I = W = 1."""
    if costs is None:
        costs = SlotCosts()
    if isinstance(costs, SlotCosts):
        for name in ("f", "i", "w"):
            value = getattr(costs, name)
            require(math.isfinite(value) and value >= 0, f"costs.{name}", value, "must be a finite number >= 0")
        return OpCosts((costs.f,) * num_stages, (costs.i,) * num_stages, (costs.w,) * num_stages)
    if isinstance(costs, StageCosts):
        require(
            costs.num_stages == num_stages,
            "costs",
            f"{costs.num_stages} stages",
            f"{family} here has {num_stages} stages; give one F/I/W cost per stage",
        )
        return OpCosts(costs.forward, costs.backward_input, costs.backward_weight)
    raise PipeschedError(f"costs={type(costs).__name__}: give a StageCosts or a SlotCosts")
