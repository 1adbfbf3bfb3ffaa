"""What every schedule family provides: a pure generator and its closed-form (level 1) model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.limits import FAMILY_OPTIONS, check_family_option
from pipesched.schedule import Schedule

# (p, m, v, options) -> (stages, microbatches) of the table a family builds
TableShape = Callable[[int, int, int, dict[str, object]], tuple[int, int]]


def plain_shape(p: int, m: int, v: int, options: dict[str, object]) -> tuple[int, int]:
    """p x v stages and m microbatches: the table of a family whose options do not size it."""
    return p * v, m


@dataclass(frozen=True)
class FormulaEstimate:
    """Level 1: a family's closed form at (p, m, v) with the F, I, W of a stage (slots).

    Definitions (used everywhere in pipesched):
    - B is the full backward, B = I + W.
    - idle: bubble time of one device per iteration (the closed forms give the worst device).
    - work: useful compute time of one device per iteration.
    - makespan = work + idle.
    - bubble_ratio = idle / makespan (bubble over iteration time);
      bubble_over_work = idle / work (the form the zero-bubble and Megatron papers use).
    - peak_inflight: stage-microbatches whose activations are held at once on the worst
      device, counted in this schedule's stages (an interleaved stage is a 1/v chunk);
      activation_units rescales it to units of a 1F1B stage (num_devices / num_stages of
      the model), so families with different chunk counts compare directly.
    - exact: the closed form is exact for these sizes (not an approximation).
    """

    idle: float
    work: float
    peak_inflight: float
    activation_units: float
    exact: bool
    note: str = ""

    @property
    def makespan(self) -> float:
        return self.work + self.idle

    @property
    def bubble_ratio(self) -> float:
        return self.idle / self.makespan if self.makespan > 0 else 0.0

    @property
    def bubble_over_work(self) -> float:
        return self.idle / self.work if self.work > 0 else 0.0


@dataclass(frozen=True)
class Family:
    """A registered schedule family.

    build(p, m, *, v=..., **options) -> Schedule is a pure function.
    formula(p, m, v, costs, **options) -> FormulaEstimate is the family's level-1 model; it
    takes the options of ``formula_options`` (those that change the closed form).
    chunks: stages per device (fixed) or None when the family takes v.
    options: names of extra keyword options build accepts (e.g. ``waves``, ``costs``).
    asynchronous: the family runs iterations back to back without a flush (PipeDream): its
    levels describe the steady state (see ``pipesched.generators.pipedream``).
    plans_with_costs: the table comes from a heuristic on the stage costs (zb-1p, zb-2p):
    comparisons and simulations build it from their workload's costs.
    takes_v: ``-v`` sets its chunk count (``chunks`` is None), in every command.
    shape: the stages and microbatches of the table at (p, m, v) with the given options
    (checked options; Hanayo's waves set its stages, PipeDream's iterations and Chimera's
    backward halving its microbatches), bounded before the table is built.
    """

    name: str
    summary: str
    constraints: str
    build: Callable[..., Schedule]
    formula: Callable[..., FormulaEstimate]
    chunks: int | None = 1
    default_v: int = 1
    options: tuple[str, ...] = field(default=())
    formula_options: tuple[str, ...] = field(default=())
    asynchronous: bool = False
    plans_with_costs: bool = False
    shape: TableShape = plain_shape

    @property
    def takes_v(self) -> bool:
        """Whether ``-v`` sets this family's chunk count: the one rule every command reads."""
        return self.chunks is None

    def __post_init__(self) -> None:
        undeclared = sorted(set(self.options) - set(FAMILY_OPTIONS))
        require(not undeclared, "option", undeclared[:1], "declare its bounds in limits.FAMILY_OPTIONS")

    def check_options(self, options: dict[str, object]) -> None:
        """Raise PipeschedError naming the first option this family does not take, or the
        first whose value is out of its bounds (``limits.FAMILY_OPTIONS``)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise PipeschedError(f"option={unknown[0]}: {self.name} does not take it; it takes "
                                 f"{', '.join(self.options) or 'no options'}")
        for name in sorted(options):
            check_family_option(name, options[name])

    def resolve_v(self, v: int | None) -> int:
        """The chunk count to use: the family's fixed one, or the user's v (default_v)."""
        if self.chunks is not None:
            require(
                v is None or v == self.chunks,
                "v",
                v,
                f"{self.name} always uses {self.chunks} stage(s) per device; drop -v",
            )
            return self.chunks
        return self.default_v if v is None else v


def switch(value: object, name: str) -> bool:
    """An on/off family option (``--set forward_doubling=0``): 1 or 0."""
    return bool(check_family_option(name, value))


def check_sizes(p: int, m: int, *, min_p: int = 2) -> None:
    """The constraints every family shares."""
    require(p >= min_p, "p", p, f"needs at least {min_p} pipeline devices")
    require(m >= 1, "m", m, "needs at least 1 microbatch")


def per_stage_costs(costs: StageCosts | None, num_stages: int, family: str) -> StageCosts:
    """The F, I, W costs a cost-aware generator (the greedy heuristics) plans with: one
    entry per stage of its schedule; one row of costs applies to every stage, and None
    means F = I = W = 1 slot."""
    if costs is None:
        costs = StageCosts.slots()
    if not isinstance(costs, StageCosts):
        raise PipeschedError(f"costs={type(costs).__name__}: give a StageCosts (e.g. StageCosts.slots(1, 2, 1))")
    return costs.broadcast(num_stages, family=family)
