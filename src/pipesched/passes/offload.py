"""Activation offload: a table with offload (O) and reload (R) ops on the devices' host links.

For each stage-microbatch the policy chooses (``OffloadPolicy``), ``offload`` inserts into
its device's table an O right after its forward (the activations go to host memory once
they are built) and an R before the backward that needs them. Host-link ops run on their
own stream beside the compute stream, in table order, each issued when the compute op
before it in the table has ended (``pipesched.simulate.graph``): an R placed ``prefetch``
compute ops ahead of its backward overlaps those ops, so it hides its transfer when they
last longer than it; with ``prefetch`` 0 it starts only when the op before the backward
ends (no overlap, and the device holds the activations of one stage-microbatch at a time).

Stages with no backward (frozen, with every stage before them frozen) keep no activations
and are not offloaded.

>>> from pipesched.generators import generate
>>> table = offload(generate("gpipe", 2, 3), OffloadPolicy(stages=(0,)))
>>> [str(op) for op in table.device_ops[0]]
['0F0', '0O0', '0F1', '0O1', '0R0', '0F2', '0O2', '0R1', '0B0', '0R2', '0B1', '0B2']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesched.errors import PipeschedError, require
from pipesched.indices import format_indices, parse_indices
from pipesched.ops import B, F, I, O, Op, R
from pipesched.rules import FORWARD_ONLY
from pipesched.schedule import Schedule
from pipesched.timeline import MemoryTrace
from pipesched.units import GiB


@dataclass(frozen=True)
class OffloadPolicy:
    """Which stage-microbatches offload their activations, and how early they come back.

    stages: the stages that offload (None: every stage).
    fraction: of each such stage's microbatches, spread evenly (1: all; 0.5: every other).
    prefetch: compute ops of its device a reload may overlap before its backward.
    """

    stages: tuple[int, ...] | None = None
    fraction: float = 1.0
    prefetch: int = 1

    def __post_init__(self) -> None:
        require(math.isfinite(self.fraction) and 0 < self.fraction <= 1, "offload", self.fraction,
                "give a fraction of the microbatches in (0, 1]")
        require(isinstance(self.prefetch, int) and self.prefetch >= 0, "prefetch", self.prefetch,
                "give a whole number of compute ops >= 0")
        if self.stages is not None:
            object.__setattr__(self, "stages", tuple(sorted({int(s) for s in self.stages})))

    @classmethod
    def parse(cls, text: str, num_stages: int) -> OffloadPolicy:
        """``all``, a fraction of every stage's microbatches (``0.5``), or stages (``0-3,6``).

        >>> OffloadPolicy.parse("0.25", 4).fraction, OffloadPolicy.parse("1-2", 4).stages
        (0.25, (1, 2))
        """
        value = str(text).strip()
        if value == "all":
            return cls()
        if "." in value:
            try:
                fraction = float(value)
            except ValueError:
                fraction = math.nan
            if not 0 < fraction <= 1:
                raise PipeschedError(f"offload={value[:40]}: a fraction of the microbatches must be in (0, 1]; "
                                     "or give stages like 0-3, or all")
            return cls(fraction=fraction)
        return cls(stages=parse_indices(value, field="offload", count=num_stages, what="stages"))

    def chooses(self, stage: int, microbatch: int) -> bool:
        """Whether stage-microbatch (stage, microbatch) offloads."""
        if self.stages is not None and stage not in self.stages:
            return False
        return math.floor((microbatch + 1) * self.fraction) > math.floor(microbatch * self.fraction)

    def describe(self) -> str:
        where = "every stage" if self.stages is None else f"stages {format_indices(self.stages)}"
        share = "" if self.fraction == 1 else f", {self.fraction:g} of the microbatches"
        return f"offload {where}{share}"


def offload(schedule: Schedule, policy: OffloadPolicy) -> Schedule:
    """``schedule`` with an offload and a reload for each stage-microbatch ``policy``
    chooses (see the module docstring).

    Raises PipeschedError when the table already offloads or the policy names a stage
    outside the schedule.
    """
    require(not any(op.kind in (O, R) for _, op in schedule.ops()), "schedule", schedule.name,
            "already offloads; give the table without offload ops")
    if policy.stages is not None:
        outside = [s for s in policy.stages if s >= schedule.num_stages]
        require(not outside, "offload stage", outside[0] if outside else "",
                f"{schedule.name} has stages 0..{schedule.num_stages - 1}")
    rows = []
    for ops in schedule.device_ops:
        position = {op: index for index, op in enumerate(ops)}
        before: dict[int, list[Op]] = {}  # table index -> host-link ops inserted before it
        for index, op in enumerate(ops):
            if op.kind is not F or schedule.roles[op.stage] == FORWARD_ONLY:
                continue
            if not policy.chooses(op.stage, op.microbatch):
                continue
            backward = next((position[b] for b in (Op(op.stage, I, op.microbatch), Op(op.stage, B, op.microbatch))
                             if b in position), None)
            if backward is None:
                continue
            before.setdefault(index + 1, []).append(Op(op.stage, O, op.microbatch))
            reload_at = max(index + 1, backward - policy.prefetch)
            before.setdefault(reload_at, []).append(Op(op.stage, R, op.microbatch))
        row: list[Op] = []
        for index in range(len(ops) + 1):
            # at one point of the table, offloads go first: they free device memory
            row.extend(sorted(before.get(index, ()), key=lambda op: op.kind is R))
            if index < len(ops):
                row.append(ops[index])
        rows.append(tuple(row))
    return schedule.with_ops(tuple(rows))


def check_host_memory(host_memory: MemoryTrace | None, policy: str) -> None:
    """Raise PipeschedError when the offloads of some device hold more host memory than its
    host has (``host_memory``: a timeline's host trace, with capacities when known)."""
    if host_memory is None or host_memory.capacity is None:
        return
    for device, (peak, capacity) in enumerate(zip(host_memory.peak, host_memory.capacity, strict=True)):
        if peak > capacity:
            raise PipeschedError(
                f"offload={policy}: device {device}'s offloaded activations need {peak / GiB:.2f} GiB of host memory "
                f"at once, its host has {capacity / GiB:.2f} GiB; offload fewer stages or microbatches, or give more "
                "host memory (host_memory in the cluster file, --host-memory)")
