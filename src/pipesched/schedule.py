"""Schedule: per-device ordered op tables plus the placement of stages onto devices."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pipesched.enums import Role
from pipesched.errors import PipeschedError, require, shorten
from pipesched.limits import MAX_AMOUNT, MAX_DEVICES, MAX_ITERATIONS, MAX_MICROBATCHES, check_count
from pipesched.ops import I, Op, W
from pipesched.rules import RULES, Rules, stage_roles


@dataclass(frozen=True)
class Placement:
    """Where each model stage runs.

    ``replicas[r][s]`` is the device of stage ``s`` in replica ``r``. Most schedules have one
    replica. Bidirectional schedules (Chimera, DualPipe) keep a second full copy of the model
    laid out in the opposite direction: each model stage then lives on two devices, each
    microbatch goes through one replica (``Schedule.route``), and the replicas' gradients are
    all-reduced at the end of the iteration.

    >>> Placement.looped(2, 2).replicas
    ((0, 1, 0, 1),)
    >>> Placement.vshape(2).replicas
    ((0, 1, 1, 0),)
    """

    num_devices: int
    replicas: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        require(self.num_devices >= 1, "devices", self.num_devices, "must be at least 1")
        require(len(self.replicas) >= 1, "placement", "[]", "needs at least one replica")
        stages = len(self.replicas[0])
        require(stages >= 1, "stages", stages, "must be at least 1")
        for replica in self.replicas:
            require(
                len(replica) == stages,
                "placement",
                replica,
                f"every replica must place all {stages} stages",
            )
            for device in replica:
                require(
                    0 <= device < self.num_devices,
                    "placement device",
                    device,
                    f"must be in 0..{self.num_devices - 1}",
                )

    @property
    def num_stages(self) -> int:
        return len(self.replicas[0])

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    def device(self, stage: int, replica: int = 0) -> int:
        return self.replicas[replica][stage]

    def stages_on(self, device: int, replica: int = 0) -> tuple[int, ...]:
        """Stages that replica ``replica`` keeps on ``device``, in stage order."""
        return tuple(s for s, d in enumerate(self.replicas[replica]) if d == device)

    # --- the common layouts -------------------------------------------------------------
    @classmethod
    def one_per_device(cls, p: int) -> Placement:
        """Stage s on device s."""
        return cls(p, (tuple(range(p)),))

    @classmethod
    def looped(cls, p: int, v: int) -> Placement:
        """Interleaved chunks: stage s on device s mod p (Megatron's virtual pipeline)."""
        return cls(p, (tuple(s % p for s in range(p * v)),))

    @classmethod
    def zigzag(cls, p: int, chunks: int) -> Placement:
        """Stage s of chunk c = s // p goes down the devices for even c and up for odd c.

        chunks=2 is the V shape (stage s and 2p-1-s share device s); Hanayo with w waves
        uses 2w chunks.
        """
        stages = []
        for s in range(p * chunks):
            chunk, position = divmod(s, p)
            stages.append(position if chunk % 2 == 0 else p - 1 - position)
        return cls(p, (tuple(stages),))

    @classmethod
    def vshape(cls, p: int) -> Placement:
        """V shape: stages s and 2p-1-s on device s (ZB-V, V-Half, V-Min, DualPipeV)."""
        return cls.zigzag(p, 2)

    @classmethod
    def bidirectional(cls, p: int, stages_per_device: int = 1) -> Placement:
        """Two replicas in opposite directions (Chimera, DualPipe).

        Replica 0 runs down: stage s on device s // k. Replica 1 runs up: stage s on device
        p-1 - s // k, where k = stages_per_device.
        """
        k = stages_per_device
        down = tuple(s // k for s in range(p * k))
        up = tuple(p - 1 - s // k for s in range(p * k))
        return cls(p, (down, up))


@dataclass(frozen=True)
class WeightUpdates:
    """How an asynchronous table (PipeDream's families) updates its weights: each stage
    steps them once per ``update_every`` consecutive microbatches, keeps ``versions[s]``
    weight versions on stage s, and every batch runs on weights ``delay`` updates behind the
    newest (PipeDream-2BW: 1)."""

    update_every: int  # microbatches per weight update
    versions: tuple[int, ...]  # weight versions each stage keeps
    delay: int = 0  # updates behind the newest weights

    def to_dict(self) -> dict[str, object]:
        return {"update_every": self.update_every, "versions": list(self.versions), "delay": self.delay}


@dataclass(frozen=True)
class Execution:
    """What the simulation reads of a table beyond its ops (``Schedule.execution``; the
    ``execution`` object of a schedule file, see ``Execution.from_dict``).

    microbatch_fraction: the size of the table's microbatches as a fraction of the
        microbatch its costs describe (1; 0.5 for Chimera's backward halving, whose table
        runs each microbatch as two halves: ``StageCosts.of_microbatch_fraction``).
    iterations: the iterations the table holds, its microbatches split evenly among them
        (an asynchronous family's continuous order; a steady-state run's repeated table).
    recompute_stages: stages run with a stage checkpoint (``pipesched synthesize
        --allow-recompute``): each keeps only its input and redoes its forward in its
        backward, so it is simulated on ``StageCosts.checkpointed`` costs.
    offload_stages: stages whose activations the table offloads (its O and R ops, as
        ``pipesched synthesize --allow-offload`` chose them).
    updates: the weight updates of an asynchronous table (None: synchronous, flushed).
    microbatch_scales: per microbatch of the table, its size against the table's mean
        microbatch (the costs times ``microbatch_fraction``), as (compute, tokens): F, I and
        B take ``compute`` times their cost, W and the messages ``tokens`` times theirs
        (TeraPipe's token slices, whose attention grows with their position); empty: all 1.
    """

    microbatch_fraction: float = 1.0
    iterations: int = 1
    recompute_stages: tuple[int, ...] = ()
    offload_stages: tuple[int, ...] = ()
    updates: WeightUpdates | None = None
    microbatch_scales: tuple[tuple[float, float], ...] = ()

    @property
    def asynchronous(self) -> bool:
        """True for a table without a flush between its iterations (weights in versions)."""
        return self.updates is not None

    def iteration_microbatches(self, num_microbatches: int) -> float:
        """The (whole-size) microbatches of one iteration of a table of ``num_microbatches``:
        their number times their fraction, over the iterations the table holds (Chimera's
        backward halving: 2m half-size ones make m; PipeDream's k iterations of m make m)."""
        return num_microbatches * self.microbatch_fraction / self.iterations

    def to_dict(self) -> dict[str, object]:
        """The entries that differ from a plain synchronous table (``from_dict`` reads them)."""
        found: dict[str, object] = {}
        if self.microbatch_fraction != 1.0:
            found["microbatch_fraction"] = self.microbatch_fraction
        if self.iterations != 1:
            found["iterations"] = self.iterations
        if self.recompute_stages:
            found["recompute_stages"] = list(self.recompute_stages)
        if self.offload_stages:
            found["offload_stages"] = list(self.offload_stages)
        if self.updates is not None:
            found["updates"] = self.updates.to_dict()
        if self.microbatch_scales:
            found["microbatch_scales"] = [list(pair) for pair in self.microbatch_scales]
        return found

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, num_stages: int, num_microbatches: int,
                  field_name: str = "execution") -> Execution:
        """The execution a file's ``execution`` object describes (the keys ``to_dict``
        writes), checked against the table's stages and microbatches; errors name
        ``field_name.key``."""
        unknown = sorted(set(data) - set(EXECUTION_KEYS))
        require(not unknown, field_name, unknown[0] if unknown else "",
                f"unknown key; give only {', '.join(EXECUTION_KEYS)}")
        updates = data.get("updates")
        found = cls(
            microbatch_fraction=_fraction(data.get("microbatch_fraction", 1.0), f"{field_name}.microbatch_fraction"),
            iterations=check_count(f"{field_name}.iterations", data.get("iterations", 1), MAX_ITERATIONS),
            recompute_stages=_stages(data.get("recompute_stages", []), f"{field_name}.recompute_stages", num_stages),
            offload_stages=_stages(data.get("offload_stages", []), f"{field_name}.offload_stages", num_stages),
            updates=None if updates is None else _updates(updates, f"{field_name}.updates", num_stages),
            microbatch_scales=_scales(data.get("microbatch_scales", []), f"{field_name}.microbatch_scales",
                                      num_microbatches),
        )
        found.check(num_stages, num_microbatches, field_name)
        return found

    def check(self, num_stages: int, num_microbatches: int, field_name: str = "execution") -> None:
        """Raise PipeschedError unless this execution fits a table of ``num_stages`` stages
        and ``num_microbatches`` microbatches."""
        _fraction(self.microbatch_fraction, f"{field_name}.microbatch_fraction")
        check_count(f"{field_name}.iterations", self.iterations, MAX_ITERATIONS)
        require(num_microbatches % self.iterations == 0, f"{field_name}.iterations", self.iterations,
                f"the table's {num_microbatches} microbatches must split into whole iterations; give a divisor "
                f"of {num_microbatches}")
        _stages(self.recompute_stages, f"{field_name}.recompute_stages", num_stages)
        _stages(self.offload_stages, f"{field_name}.offload_stages", num_stages)
        if self.updates is not None:
            _updates(self.updates.to_dict(), f"{field_name}.updates", num_stages)
        _scales(self.microbatch_scales, f"{field_name}.microbatch_scales", num_microbatches)


# the keys of a schedule file's ``execution`` object (``Execution.to_dict``)
EXECUTION_KEYS = ("microbatch_fraction", "iterations", "recompute_stages", "offload_stages", "updates",
                  "microbatch_scales")


def _fraction(value: object, field_name: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1
    require(ok, field_name, str(value), "give a fraction of the costs' microbatch in (0, 1]")
    return float(value)  # type: ignore[arg-type]


def _scales(value: object, field_name: str, num_microbatches: int) -> tuple[tuple[float, float], ...]:
    """Per-microbatch (compute, tokens) scales: none, or one finite pair >= 0 per microbatch."""
    if isinstance(value, list | tuple) and not value:
        return ()
    valid = isinstance(value, list | tuple) and len(value) == num_microbatches and all(
        isinstance(pair, list | tuple) and len(pair) == 2 and all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= MAX_AMOUNT
            for x in pair) for pair in value)
    require(valid, field_name, shorten(value),
            f"give one [compute, tokens] pair of numbers >= 0 per microbatch ({num_microbatches})")
    return tuple((float(a), float(b)) for a, b in value)  # type: ignore[union-attr,misc]


def _stages(value: object, field_name: str, num_stages: int) -> tuple[int, ...]:
    """Distinct stage numbers, sorted."""
    valid = isinstance(value, list | tuple) and len(value) <= num_stages and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < num_stages for s in value)
    require(valid and len(set(value)) == len(value), field_name, str(value),  # type: ignore[arg-type]
            f"give a list of distinct stage numbers 0..{num_stages - 1}")
    return tuple(sorted(value))  # type: ignore[arg-type]


def _updates(value: object, field_name: str, num_stages: int) -> WeightUpdates:
    require(isinstance(value, Mapping) and set(value) <= {"update_every", "versions", "delay"}
            and {"update_every", "versions"} <= set(value), field_name, str(value),
            "give an object with update_every, versions (one per stage) and delay")
    versions = value["versions"]  # type: ignore[index]
    require(isinstance(versions, list | tuple) and len(versions) == num_stages, f"{field_name}.versions",
            str(versions), f"give one weight-version count per stage ({num_stages})")
    return WeightUpdates(
        check_count(f"{field_name}.update_every", value["update_every"], MAX_MICROBATCHES),  # type: ignore[index]
        tuple(check_count(f"{field_name}.versions", x, MAX_DEVICES, what="weight versions") for x in versions),
        check_count(f"{field_name}.delay", value.get("delay", 0), MAX_MICROBATCHES, minimum=0))  # type: ignore[union-attr]


SYNCHRONOUS = Execution()


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule as data: one ordered op sequence per device.

    ``device_ops[d]`` lists the compute ops device ``d`` runs, in order. Time is not part of a
    schedule: the slot table (level 2) and the simulator (level 3) give ops their times. An
    entry may be a fused op (``(0F1;1B0)OVERLAP_F_B``): its parts run at once as one op;
    ``ops()``, ``num_ops`` and ``op_set`` count the plain ops (a fused entry's parts).

    ``route[mb]`` is the replica that microbatch ``mb`` goes through (all 0 with one replica).
    ``params`` records the generator's parameters (``p``, ``m``, ``v``, ...) for display only.
    ``execution`` holds what the simulation reads beyond the ops (``Execution``: the
    microbatch fraction, the iterations the table holds, stage checkpoints, offloaded stages,
    asynchronous weight updates).
    ``rules`` is the table of op kinds the ops are read with (``pipesched.rules.RULES``).
    ``frozen`` names the stages whose layers are all frozen: they compute no weight
    gradient, and the rules' stage roles say which ops each stage runs
    (``pipesched.rules.stage_roles``; ``pipesched.passes.freeze`` makes such a table).
    """

    name: str
    placement: Placement
    num_microbatches: int
    device_ops: tuple[tuple[Op, ...], ...]
    route: tuple[int, ...] = ()
    params: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)
    rules: Rules = field(default=RULES, compare=False, hash=False, repr=False)
    frozen: frozenset[int] = frozenset()
    execution: Execution = field(default=SYNCHRONOUS, compare=False, hash=False)

    def __post_init__(self) -> None:
        require(self.num_microbatches >= 1, "microbatches", self.num_microbatches, "must be at least 1")
        object.__setattr__(self, "frozen", frozenset(int(stage) for stage in self.frozen))
        outside = sorted(stage for stage in self.frozen if not 0 <= stage < self.placement.num_stages)
        require(not outside, "frozen stage", outside[0] if outside else "",
                f"the schedule has stages 0..{self.placement.num_stages - 1}")
        require(
            len(self.device_ops) == self.placement.num_devices,
            "devices",
            len(self.device_ops),
            f"the placement has {self.placement.num_devices} devices; give one op row per device",
        )
        if not self.route:
            object.__setattr__(self, "route", (0,) * self.num_microbatches)
        require(
            len(self.route) == self.num_microbatches,
            "route",
            len(self.route),
            f"needs one replica index per microbatch ({self.num_microbatches})",
        )
        for replica in self.route:
            if not 0 <= replica < self.placement.num_replicas:
                raise PipeschedError(
                    f"route={replica}: replica index must be in 0..{self.placement.num_replicas - 1}"
                )
        self.execution.check(self.num_stages, self.num_microbatches)

    # --- sizes ---------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def num_devices(self) -> int:
        return self.placement.num_devices

    @property
    def microbatch_fraction(self) -> float:
        """The size of this table's microbatches as a fraction of the microbatch its costs
        describe (``Execution.microbatch_fraction``)."""
        return self.execution.microbatch_fraction

    @property
    def recompute_stages(self) -> tuple[int, ...]:
        """The stages this table runs with a stage checkpoint (``Execution.recompute_stages``)."""
        return self.execution.recompute_stages

    @property
    def iteration_microbatches(self) -> float:
        """The (whole-size) microbatches of one iteration (``Execution.iteration_microbatches``)."""
        return self.execution.iteration_microbatches(self.num_microbatches)

    @property
    def num_ops(self) -> int:
        """Plain ops (a fused entry counts its parts)."""
        if self.has_fused_ops:
            return sum(len(ops) for ops in self.device_atoms)
        return sum(len(ops) for ops in self.device_ops)

    @cached_property
    def has_fused_ops(self) -> bool:
        return any(op.parts for ops in self.device_ops for op in ops)

    @cached_property
    def device_atoms(self) -> tuple[tuple[Op, ...], ...]:
        """Per device, its plain ops in order (each fused entry replaced by its parts)."""
        if not self.has_fused_ops:
            return self.device_ops
        return tuple(tuple(atom for op in ops for atom in op.atoms) for ops in self.device_ops)

    def device_of(self, stage: int, microbatch: int) -> int:
        """The device that runs ``stage`` for ``microbatch`` (replicas follow the route)."""
        return self.placement.replicas[self.route[microbatch]][stage]

    def ops(self) -> Iterator[tuple[int, Op]]:
        """Every (device, plain op) pair, device by device, in table order (a fused entry
        gives its parts)."""
        for device, ops in enumerate(self.device_atoms):
            for op in ops:
                yield device, op

    @cached_property
    def op_set(self) -> frozenset[Op]:
        """The plain ops (fused entries' parts included)."""
        return frozenset(op for ops in self.device_atoms for op in ops)

    def __getstate__(self) -> dict[str, object]:
        """Pickles (for worker processes) carry the fields, not the derived caches."""
        return {name: value for name, value in self.__dict__.items()
                if name not in ("derived", "op_set", "splits_backward")}

    @cached_property
    def derived(self) -> dict[str, object]:
        """Values computed once from this immutable schedule by the modules that need them
        (op columns, dependency rows), keyed by what they are."""
        return {}

    @cached_property
    def roles(self) -> tuple[Role, ...]:
        """What each stage does in the backward, from the frozen stages (``stage_roles``)."""
        return stage_roles(self.num_stages, self.frozen)

    @cached_property
    def splits_backward(self) -> bool:
        """True when some backward is split into I and W (zero-bubble style)."""
        return any(op.kind is I or op.kind is W for _, op in self.ops())

    def predecessors(self, op: Op) -> tuple[Op, ...]:
        """Data dependencies of ``op`` (not the device order), as the rules say: for each of
        its needs, the op of the needed kind on the needed stage (the first kind of the need
        that this table has; a need outside the model is no need).

        A fused op needs what its parts need from outside it.

        >>> from pipesched.generators import generate
        >>> [str(op) for op in generate("zb-h1", 2, 2).predecessors(Op.parse("0I1"))]
        ['0F1', '1I1']
        """
        if op.parts:
            outside = [pred for part in op.parts for pred in self.predecessors(part) if pred not in op.parts]
            return tuple(dict.fromkeys(outside))
        found = []
        for need in self.rules[op.kind].needs:
            stage, step = op.stage + need.offset, op.step + need.step_offset
            if not 0 <= stage < self.num_stages or step < 0 or self._runs_nothing(stage, op.microbatch, step):
                continue
            kinds = need.kinds
            kind = kinds[0]
            if len(kinds) > 1:
                kind = next((k for k in kinds if Op(stage, k, op.microbatch, step=step) in self.op_set), kind)
            found.append(Op(stage, kind, op.microbatch, step=step))
        return tuple(found)

    def _runs_nothing(self, stage: int, microbatch: int, step: int) -> bool:
        """Whether the stage-microbatch runs no op where the rules let it (an empty complete
        set: a serving batch on the stages of another instance); a need of it is then none."""
        if frozenset() not in self.rules.complete:
            return False
        return not any(Op(stage, rule.kind, microbatch, step=step) in self.op_set for rule in self.rules)

    def with_ops(self, device_ops: tuple[tuple[Op, ...], ...], *, name: str | None = None,
                 frozen: frozenset[int] | None = None, params: Mapping[str, object] | None = None,
                 execution: Execution | None = None) -> Schedule:
        """A copy with other op tables (for passes: Schedule -> Schedule), and other frozen
        stages, parameters or execution when given."""
        return Schedule(
            name=name or self.name,
            placement=self.placement,
            num_microbatches=self.num_microbatches,
            device_ops=tuple(tuple(ops) for ops in device_ops),
            route=self.route,
            params=dict(self.params if params is None else params),
            rules=self.rules,
            frozen=self.frozen if frozen is None else frozen,
            execution=self.execution if execution is None else execution,
        )

