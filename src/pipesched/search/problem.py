"""The synthesis problem: one stage per device, m identical microbatches, a memory cap.

In seconds and bytes (``SynthesisProblem``) and on the integer grids the solver works on
(``IntegerProblem``). The model is the simulator's with free channels
(``simulate(..., contention=False)``):

- op durations: F, and I and W (split backward) or B (full backward), from StageCosts;
- a transfer between the devices of stages s and s+1 takes ``latency + bytes / bandwidth``
  of their link: the activation ``output_bytes[s]`` down after F(s), its gradient (the same
  size) back after I/B(s+1); it waits for no other transfer (no channel contention);
- memory per device: the stage's static bytes, plus ``activation_bytes[s]`` allocated when
  F(s, mb) starts and freed when its backward ends: all at B's end, or ``input_frees`` of
  it at I's end and the rest at W's end.

Recompute (an optional decision per stage): a stage checkpoint, ``StageCosts.checkpointed``:
the stage keeps only its input, one boundary tensor (``output_bytes[s-1]``; stage 0 counts
``output_bytes[0]``, the embedding output), from F to the end of its backward, and its I
(or B) runs the forward again first; the gradients I leaves for W are held as without it.
The decision is per stage, not per stage-microbatch, so that the simulator, whose costs are
per stage, replays the solver's schedule exactly; a schedule names its checkpointed stages
(``Schedule.recompute_stages``), and the simulator of a workload applies the same transform
to them (``SimulationSetup.costs_for``).

Integer grids. Time: one unit is the longest op / ``resolution`` (1000 by default); every
duration and delay is rounded down to whole units (exact when it lies on the grid, as with
F = I = W), an op never below one unit. Rounding down keeps the solver's bound a lower bound
of the true optimum; the simulator then times the solver's op order with the true
durations. Memory: per device, the exact common divisor of the activation amounts in bytes
(F's allocation and I's share), so the cap means what it means to the simulator.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_SYNTHESIS_OPS
from pipesched.ops import B, F, I, Op, OpKind, W
from pipesched.rules import RULES, TRAINS, Rules
from pipesched.simulate.network import Network

# default time resolution: units the longest op spans when no coarser exact grid exists
TIME_RESOLUTION = 10_000
# most units the horizon (every op and transfer one after the other) may span: the solver's
# times and their sums stay far inside int64 however long the transfers are against the ops
# (a slow link's delays coarsen the grid instead)
MAX_TIME_UNITS = 2**50
# memory: most units one allocation may span (the solver's sums stay far inside int64), and
# the units of the largest allocation when no common divisor gives fewer
MAX_MEMORY_UNITS = 2**40
MEMORY_RESOLUTION = 1_000_000
# relative slack for comparing bytes computed two ways (a cap of exactly p activations)
BYTES_TOLERANCE = 1e-9


def stage_microbatch_kinds(*, split_backward: bool) -> tuple[OpKind, ...]:
    """The op kinds of every stage-microbatch, in the rules' (dependency) order: the rules'
    complete set of a trained stage with the backward split (F, I, W) or not (F, B). The
    optional groups (offload) are the solver's own decision, and a kind a rules table adds
    is not modelled: the solver's intervals, transfers and host-link ops are written for
    these kinds' roles (``search/cpsat.py``).

    >>> [str(kind) for kind in stage_microbatch_kinds(split_backward=True)]
    ['F', 'I', 'W']
    """
    complete = next(kinds for kinds in RULES.complete_for(TRAINS) if (I in kinds) == split_backward)
    return tuple(rule.kind for rule in RULES if rule.kind in complete)


def check_size(p: int, m: int, *, split_backward: bool) -> None:
    """Refuse sizes the synthesis cannot hold (before anything is built for them)."""
    require(p >= 1, "p", p, "needs at least 1 pipeline device")
    require(m >= 1, "m", m, "needs at least 1 microbatch")
    ops = p * m * len(stage_microbatch_kinds(split_backward=split_backward))
    require(ops <= MAX_SYNTHESIS_OPS, "size", f"p{p} x m{m}",
            f"{ops:,} ops, over the {MAX_SYNTHESIS_OPS:,} synthesis handles; lower p or m")


@dataclass(frozen=True, eq=False)
class SynthesisProblem:
    """What to schedule, in seconds and bytes.

    costs: one row per stage; stage s runs on device s.
    network: the links; only latency and bandwidth matter (no contention).
    num_microbatches: m.
    memory_limit: bytes per device, static bytes included; None for no cap.
    split_backward: I and W ops (True) or one B op per stage-microbatch.
    allow_recompute: the solver may recompute stages (see the module docstring).
    allow_offload: the solver may offload stages' activations to host memory over each
    device's host link (``Network.host_bandwidth``), as ``pipesched.passes.offload`` does:
    an O after each forward, an R before each backward; a stage offloads or recomputes,
    not both.
    """

    costs: StageCosts
    network: Network
    num_microbatches: int
    memory_limit: tuple[float, ...] | None = None
    split_backward: bool = True
    allow_recompute: bool = False
    allow_offload: bool = False

    def __post_init__(self) -> None:
        p = self.costs.num_stages
        check_size(p, self.num_microbatches, split_backward=self.split_backward)
        require(self.network.num_devices >= p, "devices", self.network.num_devices,
                f"the network has fewer devices than the {p} stages; use a bigger cluster")
        if self.allow_offload:
            missing = [d for d in range(p) if not self.network.has_host_link(d)]
            require(not missing, "allow_offload", f"device {missing[0] if missing else ''}",
                    "has no host link to offload over; give the devices one (--host-bandwidth, or a cluster "
                    "whose devices have one), or drop --allow-offload")
        if self.memory_limit is not None:
            require(len(self.memory_limit) == p, "memory_limit", f"{len(self.memory_limit)} values",
                    f"give one limit per device ({p})")
            for d, limit in enumerate(self.memory_limit):
                require(math.isfinite(limit) and limit > 0, f"memory_limit[device {d}]", limit,
                        "must be a finite number of bytes > 0")
            self._check_one_microbatch_fits()

    def _check_one_microbatch_fits(self) -> None:
        for d, limit in enumerate(self.memory_limit or ()):
            static = self.costs.static(d)
            if static > limit * (1 + BYTES_TOLERANCE):
                raise PipeschedError(
                    f"memory_limit={limit:.6g}: below the {static:.6g} bytes of parameters, gradients and "
                    f"optimizer state of stage {d}; give at least that much, or more stages")
            need = self.smallest_activation(d)
            if static + need > limit * (1 + BYTES_TOLERANCE):
                hint = "" if self.allow_recompute else ", or allow recompute"
                raise PipeschedError(
                    f"memory_limit={limit:.6g}: stage {d} needs {static + need:.6g} bytes for one microbatch "
                    f"in flight ({static:.6g} static + {need:.6g} activations and gradients kept for W); raise the "
                    f"limit{hint}")

    def smallest_activation(self, stage: int) -> float:
        """The most bytes one microbatch in flight holds at once on ``stage``, with recompute
        if allowed and smaller: its ops' memory effects in dependency order (F's
        activations; with a split backward, what I leaves for W beyond the share it frees)."""
        variants = (self.costs, self.recomputed) if self.allow_recompute else (self.costs,)
        return min(self._one_microbatch(costs, stage) for costs in variants)

    def _one_microbatch(self, costs: StageCosts, stage: int) -> float:
        kept = costs.kept_for_w_bytes[stage] if costs.kept_for_w_bytes is not None else 0.0
        held = most = 0.0
        for kind in self.kinds:
            held += RULES[kind].memory.bytes(costs.activation_bytes[stage], costs.input_frees, kept)
            most = max(most, held)
        return most

    @cached_property
    def recomputed(self) -> StageCosts:
        """The costs with every stage recomputed."""
        return self.costs.checkpointed(range(self.num_stages))

    @property
    def num_stages(self) -> int:
        return self.costs.num_stages

    @cached_property
    def kinds(self) -> tuple[OpKind, ...]:
        """The op kinds of every stage-microbatch (``stage_microbatch_kinds``)."""
        return stage_microbatch_kinds(split_backward=self.split_backward)

    def duration(self, kind: OpKind, stage: int, *, recompute: bool = False) -> float:
        """Seconds of one op, with or without recompute on its stage."""
        return (self.recomputed if recompute else self.costs).duration(Op(stage, kind, 0))

    def host_transfer(self, stage: int) -> float:
        """Seconds of one offload or reload of a stage-microbatch's activations over its
        device's host link (as ``pipesched.simulate.graph.op_durations`` counts it)."""
        network = self.network
        latency = network.host_latency[stage] if network.host_latency is not None else 0.0
        return latency + self.costs.activation_bytes[stage] / network.host_bandwidth[stage]

    def delay(self, source: int, stage: int) -> float:
        """Seconds from an op of stage ``source`` ending until its output is on ``stage``: an
        activation down, a gradient up (0 on the same stage)."""
        if source == stage:
            return 0.0
        return self.network.transfer_time(source, stage, self.costs.output_bytes[min(source, stage)])

    def activation_delay(self, stage: int) -> float:
        """Seconds from F(stage)'s end until its activation reaches stage + 1."""
        return self.network.transfer_time(stage, stage + 1, self.costs.output_bytes[stage])

    def gradient_delay(self, stage: int) -> float:
        """Seconds from the backward of stage + 1 until its gradient reaches ``stage``."""
        return self.network.transfer_time(stage + 1, stage, self.costs.output_bytes[stage])

    def activation_budget(self, stage: int) -> float | None:
        """Bytes left for activations on the device of ``stage`` (None: no cap)."""
        if self.memory_limit is None:
            return None
        return self.memory_limit[stage] - self.costs.static(stage)


def time_unit(values: Sequence[float], *, longest: float, resolution: int) -> float:
    """The solver's time step: the longest op spans at least ``resolution`` steps; when
    every value is a whole multiple of some longest / n (n up to 10 x resolution), the step
    divides that, so every value lies on the grid.

    >>> time_unit([1.5, 0.25, 1.0], longest=1.5, resolution=10)  # 0.25 / 2: 12 steps
    0.125
    >>> time_unit([1.0, 1 / 3, 0.1], longest=1.0, resolution=10)  # 1 / 30: 30 steps
    0.03333333333333333
    """
    scaled = np.asarray([v for v in values if v > 0], dtype=np.float64) / longest
    counts = np.arange(1, 10 * resolution + 1, dtype=np.float64)
    units = scaled[None, :] * counts[:, None]
    whole = np.all(np.abs(units - np.round(units)) <= 1e-6, axis=1)
    if not whole.any():
        return longest / resolution
    n = int(counts[np.argmax(whole)])
    return longest / (n * math.ceil(resolution / n))


def fraction_gcd(values: Sequence[Fraction]) -> Fraction:
    """The largest step of which every value is a whole multiple.

    >>> fraction_gcd([Fraction(3, 2), Fraction(1, 1)])
    Fraction(1, 2)
    """
    def pair(a: Fraction, b: Fraction) -> Fraction:
        return Fraction(math.gcd(a.numerator * b.denominator, b.numerator * a.denominator),
                        a.denominator * b.denominator)

    return functools.reduce(pair, values)


@dataclass(frozen=True, eq=False)
class MemoryGrid:
    """One device's activation memory in whole units of ``unit`` bytes.

    alloc, frees_at_i: units F allocates and I frees (W frees ``alloc - frees_at_i``; B all
    of it), without and with recompute. kept: units of gradients I leaves for W
    (``StageCosts.kept_for_w_bytes``), held from I's end to W's end; when they outweigh I's
    share, I's end raises the level. cap: units the device may hold, None when the cap
    never binds. exact: every amount is a whole number of units; otherwise allocations
    were rounded up and I's share down, by less than a unit each (see ``_memory_grid``).
    """

    unit: float  # bytes
    alloc: tuple[int, int]  # (kept, recomputed)
    frees_at_i: tuple[int, int]
    cap: int | None
    exact: bool = True
    kept: tuple[int, int] = (0, 0)

    def change(self, kind: OpKind, choice: int = 0, rules: Rules = RULES) -> int:
        """Units an op of ``kind`` adds to (or, negative, frees from) its device's level on
        this grid, without (``choice`` 0) or with (1) recompute: its rule's memory effect."""
        return round(rules[kind].memory.amount(self.alloc[choice], self.frees_at_i[choice], self.kept[choice]))

    def peak(self, kinds: tuple[OpKind, ...], choice: int = 0, rules: Rules = RULES) -> int:
        """The most units one microbatch holds along its ops ``kinds`` (in dependency order)."""
        return max(itertools.accumulate(self.change(kind, choice, rules) for kind in kinds), default=0)


def _memory_grid(problem: SynthesisProblem, stage: int) -> MemoryGrid:
    """The unit is the largest of which every amount (F's allocation, I's share, with and
    without recompute) is a whole multiple; when that is too fine (I's share of an odd
    fraction), a divisor of the allocations that the largest spans at least a million
    times, with I's share rounded down; failing both, a millionth of the largest
    allocation."""
    costs = problem.costs
    f = Fraction(costs.input_frees)
    full, kept = Fraction(costs.activation_bytes[stage]), Fraction(problem.recomputed.activation_bytes[stage])
    allocs = [a for a in ((full, kept) if problem.allow_recompute else (full,)) if a > 0]
    if not allocs:
        return MemoryGrid(1.0, (0, 0), (0, 0), None)
    shares = [f * a for a in allocs if f * a > 0]
    kept_bytes = (_kept(costs, stage), _kept(problem.recomputed, stage)) if problem.split_backward else (0, 0)
    shares += [k for k in kept_bytes if k > 0]
    unit = fraction_gcd(allocs + shares)
    if max(allocs) / unit > MAX_MEMORY_UNITS:
        common = fraction_gcd(allocs)
        unit = common / math.ceil(MEMORY_RESOLUTION * common / max(allocs))
    if max(allocs) / unit > MAX_MEMORY_UNITS:
        unit = max(allocs) / MEMORY_RESOLUTION
    # allocations round up and I's share down: the solver never sees less memory in use
    alloc = (math.ceil(full / unit), math.ceil(kept / unit))
    frees = (min(math.floor(f * full / unit), alloc[0]), min(math.floor(f * kept / unit), alloc[1]))
    held_for_w = (math.ceil(kept_bytes[0] / unit), math.ceil(kept_bytes[1] / unit))
    exact = all((a / unit).denominator == 1 for a in allocs + shares)
    budget = problem.activation_budget(stage)
    cap = None if budget is None else math.floor(Fraction(budget) * (1 + Fraction(BYTES_TOLERANCE)) / unit)
    grid = MemoryGrid(float(unit), alloc, frees, cap, exact, held_for_w)
    most = max(grid.peak(problem.kinds, choice) for choice in (0, 1))
    if cap is not None and problem.num_microbatches * most <= cap:
        return dataclasses.replace(grid, cap=None)  # every microbatch fits at once
    return grid


def _kept(costs, stage: int) -> Fraction:
    return Fraction(costs.kept_for_w_bytes[stage]) if costs.kept_for_w_bytes is not None else Fraction(0)


@dataclass(frozen=True, eq=False)
class IntegerProblem:
    """The problem on integer grids (see the module docstring); stage s = device s.

    duration[kind][s], recomputed[kind][s]: op lengths in time units, without and with
    recompute (they differ for I and B). activation_delay[s], gradient_delay[s]: transfer
    times between stages s and s+1. raised_ops: ops shorter than one unit, counted as one
    unit (each can lengthen the solver's makespan by one unit at most).
    """

    problem: SynthesisProblem
    time_unit: float  # seconds
    exact_time: bool  # every duration and delay is a whole number of units
    duration: dict[OpKind, tuple[int, ...]]
    recomputed: dict[OpKind, tuple[int, ...]]
    activation_delay: tuple[int, ...]
    gradient_delay: tuple[int, ...]
    memory: tuple[MemoryGrid, ...]
    raised_ops: int
    host_transfer: tuple[int, ...] = ()  # an offload's or reload's length per stage (allow_offload)

    @classmethod
    def build(cls, problem: SynthesisProblem, *, resolution: int = TIME_RESOLUTION) -> IntegerProblem:
        require(isinstance(resolution, int) and 10 <= resolution <= 100_000, "resolution", resolution,
                "give the units the longest op spans, between 10 and 100000")
        p, m = problem.num_stages, problem.num_microbatches
        seconds = {kind: [problem.duration(kind, s) for s in range(p)] for kind in problem.kinds}
        redone = {kind: [problem.duration(kind, s, recompute=True) for s in range(p)] for kind in problem.kinds}
        activation = [problem.activation_delay(s) for s in range(p - 1)]
        gradient = [problem.gradient_delay(s) for s in range(p - 1)]
        ops = [x for v in (redone if problem.allow_recompute else seconds).values() for x in v]
        host = [problem.host_transfer(s) for s in range(p)] if problem.allow_offload else []
        values = [x for v in seconds.values() for x in v] + ops + activation + gradient + host
        serial = m * (sum(max(a, b) for kind in problem.kinds for a, b in zip(seconds[kind], redone[kind], strict=True))
                      + sum(activation) + sum(gradient) + 2 * sum(host))  # every op and transfer in turn
        unit = max(time_unit(values, longest=max(ops) or 1.0, resolution=resolution), serial / MAX_TIME_UNITS)

        def floor_units(x: float) -> int:
            # whole units, rounded down (a value on the grid up to float noise stays exact)
            units = x / unit
            return round(units) if abs(units - round(units)) <= 1e-6 else math.floor(units)

        def op_units(lengths: list[float]) -> tuple[int, ...]:
            return tuple(max(1, floor_units(x)) for x in lengths)

        return cls(
            problem=problem,
            time_unit=unit,
            exact_time=all(abs(x / unit - round(x / unit)) <= 1e-6 for x in values),
            duration={kind: op_units(v) for kind, v in seconds.items()},
            recomputed={kind: op_units(v) for kind, v in redone.items()},
            activation_delay=tuple(floor_units(x) for x in activation),
            gradient_delay=tuple(floor_units(x) for x in gradient),
            memory=tuple(_memory_grid(problem, s) for s in range(p)),
            raised_ops=m * sum(1 for v in seconds.values() for x in v if floor_units(x) < 1)
            + 2 * m * sum(1 for x in host if floor_units(x) < 1),
            host_transfer=op_units(host),
        )

    @property
    def memory_exact(self) -> bool:
        """Whether every device's memory grid is exact (see MemoryGrid)."""
        return all(grid.exact for grid in self.memory)

    @property
    def num_stages(self) -> int:
        return self.problem.num_stages

    @property
    def num_microbatches(self) -> int:
        return self.problem.num_microbatches

    @property
    def kinds(self) -> tuple[OpKind, ...]:
        return self.problem.kinds

    @cached_property
    def lower_bound(self) -> int:
        """A makespan no schedule beats, in units (recompute only adds time, so the
        durations without it give a bound for every choice):

        - a device: the forwards before its first op, its own work, and, with a full
          backward, the backward chain down to stage 0 after its last B;
        - the last microbatch: stage 0's earlier forwards, then its own F chain down, its
          backward chain up, and stage 0's W.
        """
        p, m = self.num_stages, self.num_microbatches
        fwd = self.duration[F]
        back = self.duration[I] if self.problem.split_backward else self.duration[B]
        head = [sum(fwd[s] + self.activation_delay[s] for s in range(d)) for d in range(p)]
        tail = [0 if self.problem.split_backward else
                sum(back[s] + self.gradient_delay[s] for s in range(d)) for d in range(p)]
        work = [m * sum(self.duration[kind][d] for kind in self.kinds) for d in range(p)]
        per_device = max(head[d] + work[d] + tail[d] for d in range(p))
        chain = (sum(fwd) + sum(self.activation_delay) + sum(back) + sum(self.gradient_delay)
                 + (self.duration[W][0] if self.problem.split_backward else 0))
        return max(per_device, (m - 1) * fwd[0] + chain)

    def seconds(self, units: float) -> float:
        return units * self.time_unit

    def unit_costs(self, recompute: Sequence[int] = ()) -> StageCosts:
        """The grid's op lengths as StageCosts in time units (no memory), to replay a table
        on the grid with the simulator."""
        chosen = set(recompute)
        p = self.num_stages

        def lengths(kind: OpKind) -> tuple[int, ...]:
            return tuple((self.recomputed if s in chosen else self.duration)[kind][s] for s in range(p))

        return StageCosts.from_times({RULES[kind].cost: lengths(kind) for kind in self.kinds})

    def unit_network(self) -> Network:
        """Links whose latency is the grid's transfer delay between neighbouring stages."""
        p = self.num_stages
        latency = np.zeros((p, p))
        for s in range(p - 1):
            latency[s, s + 1] = self.activation_delay[s]
            latency[s + 1, s] = self.gradient_delay[s]
        host = {}
        if self.host_transfer:  # an offload or a reload takes its grid length (no bytes on the grid)
            host = {"host_bandwidth": (math.inf,) * p, "host_latency": tuple(float(x) for x in self.host_transfer)}
        return Network(latency=latency, bandwidth=np.full((p, p), math.inf), node_of=tuple(range(p)),
                       name="grid", **host)
