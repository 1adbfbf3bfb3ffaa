"""``evaluate(point, levels) -> Record``: one experiment point at the requested levels.

Levels:

- ``formula`` (level 1): the family's closed form (``pipesched.generators.formula``).
- ``table`` (level 2): the idealized slot table of the generated schedule (F = I = W = 1 by
  default, or the point's slot costs).
- ``sim`` (level 3): the communication-aware simulation with the workload's stage costs,
  links, contention and memory (``pipesched.simulate``), and with ``dp`` > 1 the gradient
  all-reduce of the data-parallel pipelines; throughput counts all ``dp`` pipelines.

Units. Formula and table times are in slots of a 1F1B stage op: a schedule with S stages on
p devices runs ops of 1/S of the model, so its slot counts are scaled by p / S (an
interleaved chunk op with v = 2 is half a slot). Their memory is the worst device's peak
in-flight activations in 1F1B-stage units (``activation_units``); ``peak_inflight`` keeps
the count in the schedule's own stages. Simulated times are seconds and memory is the
worst device's peak bytes (parameters, gradients, optimizer state and activations).

Steady state. For an asynchronous family (PipeDream, PipeDream-2BW), and for every family
with ``Point.steady_state`` (zero bubble's optimizer post-validation), the table and sim
levels run ``STEADY_ITERATIONS`` iterations back to back (``pipesched.simulate.iterations``)
and report the steady-state iteration: the mean iteration between the first and the last, its bubble
(idle over devices x that time), its throughput, and for the sim level the peak memory of
the whole run (an asynchronous family's extra weight versions included). They also report
the staleness (the most updates a forward's weights are behind a synchronous run) and the
weight versions a stage keeps. The formula level is the family's closed form: for an
asynchronous family its steady state (the busiest device's work), for the others one
iteration, steady state asked or not.

Costs. ``Point.fb_cost`` sets what an overlapped pair (a fused op) costs at every level. A
family that plans with the stage costs (zb-1p, zb-2p) is built from the slot costs for the
formula and table levels and from the workload's own costs at the sim level
(``Point.build_schedule``).

A point that cannot be built (Chimera needs an even p, ...) or simulated with its costs
gives a Record with ``error`` set instead of results: grids report it as skipped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

from pipesched.costs import StageCosts
from pipesched.defaults import DEFAULTS
from pipesched.enums import Level, MemoryUnit, TimeUnit
from pipesched.errors import PipeschedError, require
from pipesched.experiments.point import Point
from pipesched.experiments.setup import SimulationSetup
from pipesched.generators import formula, get_family
from pipesched.metrics import (
    IterationWork,
    TrainingWork,
    bubble_ratio,
    communication_per_device,
    rates,
    timeline_work,
    training_work,
)
from pipesched.passes.offload import check_host_memory
from pipesched.schedule import Schedule
from pipesched.simulate import TaskGraph, compile_graph, run
from pipesched.simulate.graph import with_network
from pipesched.simulate.iterations import (
    SteadyState,
    compile_iterations,
    run_iterations,
    steady_state,
)
from pipesched.simulate.network import Network
from pipesched.slots import (
    inflight_per_device,
    one_f_one_b_units,
    slot_table,
    table_costs,
    table_metrics,
)
from pipesched.timeline import Timeline
from pipesched.variability.distribution import Distribution, monte_carlo

LEVELS = tuple(Level)
# iterations run back to back for a steady state
STEADY_ITERATIONS = DEFAULTS.steady_iterations
# op rows of the graphs a process keeps from a search's bound to the point's evaluation
# (about 60 bytes each); beyond them the oldest go and their points compile again
KEPT_OPS = 2_000_000


@dataclass(frozen=True)
class LevelResult:
    """One schedule at one level: what every level reports. Each level has its own type
    (``FormulaResult``, ``TableResult``, ``SimulatedResult``) with its units and the fields
    only it reports; what a level does not report reads None (its class attributes)."""

    schedule: str
    iteration_time: float  # in the level's time unit
    bubble_ratio: float  # idle / (devices x iteration time)
    peak_memory: float  # worst device, in the level's memory unit
    rank: int = 0
    previous_rank: int | None = None  # rank at the level before, None at the first level
    asynchronous: bool = False  # the family trains without a flush (PipeDream)

    level: ClassVar[Level]
    time_unit: ClassVar[TimeUnit]  # slot (1F1B stage ops) or s
    memory_unit: ClassVar[MemoryUnit]  # 1F1B-stage activations or bytes
    json_keys: ClassVar[dict[str, str]]  # field -> its JSON key, where the key names the unit
    # what a level does not report, as the commands read it of every level: None (or no steady state)
    steady_state: ClassVar[bool] = False
    staleness: ClassVar[int | None] = None
    mean_staleness: ClassVar[float | None] = None
    weight_versions: ClassVar[int | None] = None
    mfu: ClassVar[float | None] = None
    hfu: ClassVar[float | None] = None
    out_of_memory: ClassVar[bool | None] = None
    training: ClassVar[TrainingWork | None] = None

    @property
    def rank_changed(self) -> bool:
        return self.previous_rank is not None and self.previous_rank != self.rank

    def to_dict(self) -> dict:
        """The level's fields under the JSON keys every command shares (README "JSON
        output": the unit in the key, ``max_`` for the worst device, ``any_`` for some
        device, ``json_keys``); the training work per device is ``training``'s own dict."""
        flat = {"schedule": self.schedule, "level": self.level}
        flat |= {name: value for name, value in asdict(self).items() if name not in ("schedule", "training")}
        return {self.json_keys.get(name, name): value for name, value in flat.items()} | {
            "rank_changed": self.rank_changed}


# the JSON keys of the levels counted in slots and 1F1B-stage activations
_SLOT_KEYS = {"iteration_time": "iteration_time_slots", "peak_memory": "peak_activation_units"}


@dataclass(frozen=True)
class _SlotResult(LevelResult):
    """Levels 1 and 2: slots of a 1F1B stage op, 1F1B-stage activations, and the
    stage-microbatches in flight."""

    peak_inflight: int | None = None  # stage-microbatches in the schedule's stages

    time_unit: ClassVar[TimeUnit] = TimeUnit.SLOT
    memory_unit: ClassVar[MemoryUnit] = MemoryUnit.ACTIVATION_UNITS
    json_keys: ClassVar[dict[str, str]] = _SLOT_KEYS


@dataclass(frozen=True)
class FormulaResult(_SlotResult):
    """Level 1, the family's closed form."""

    exact: bool | None = None  # the closed form is exact at these sizes

    level: ClassVar[Level] = Level.FORMULA


@dataclass(frozen=True)
class TableResult(_SlotResult):
    """Level 2, the slot table; in the steady state, the weights' staleness and versions."""

    steady_state: bool = False  # the steady-state iteration of iterations back to back
    staleness: int | None = None  # steady state: the most updates a forward's weights are behind
    mean_staleness: float | None = None  # steady state: the mean over the steady iterations' forwards
    weight_versions: int | None = None  # steady state: the most weight versions a stage keeps

    level: ClassVar[Level] = Level.TABLE


@dataclass(frozen=True)
class SimulatedResult(LevelResult):
    """Level 3, the simulation: seconds and bytes, rates, communication, memory, training
    work, the Monte Carlo spread, and in the steady state the weights' staleness."""

    throughput_samples_per_s: float | None = None
    throughput_tokens_per_s: float | None = None  # with a sequence length
    mfu: float | None = None  # with a model: model FLOPs utilization (no recompute)
    hfu: float | None = None  # with a model: hardware FLOPs utilization (recompute included)
    exposed_comm_s: float | None = None  # worst device's exposed communication
    out_of_memory: bool | None = None  # some device's peak exceeds its capacity
    host_peak_memory: float | None = None  # worst device's host bytes of offloaded activations
    training: TrainingWork | None = None  # frozen, recomputed and offloaded work per device
    # with variability: the Monte Carlo iteration time (seconds)
    mean_s: float | None = None
    std_s: float | None = None
    p99_s: float | None = None
    steady_state: bool = False  # the steady-state iteration of iterations back to back
    staleness: int | None = None  # steady state: the most updates a forward's weights are behind
    mean_staleness: float | None = None  # steady state: the mean over the steady iterations' forwards
    weight_versions: int | None = None  # steady state: the most weight versions a stage keeps

    level: ClassVar[Level] = Level.SIM
    time_unit: ClassVar[TimeUnit] = TimeUnit.SECONDS
    memory_unit: ClassVar[MemoryUnit] = MemoryUnit.BYTES
    json_keys: ClassVar[dict[str, str]] = {
        "iteration_time": "iteration_time_s", "peak_memory": "max_peak_memory_bytes",
        "exposed_comm_s": "max_exposed_comm_s", "host_peak_memory": "max_host_peak_memory_bytes",
        "out_of_memory": "any_out_of_memory"}


@dataclass(frozen=True)
class Record:
    """What ``evaluate`` found for one point: a result per level, or why there is none."""

    point: Point
    results: tuple[LevelResult, ...] = ()
    error: str | None = None  # the level and reason when the point could not be evaluated
    setup: str = ""  # what the sim level ran on
    # the timeline of the last timed level (simulated, else the slot table), when asked for
    timeline: Timeline | None = field(default=None, compare=False, repr=False)
    # the sim level's Monte Carlo run, when the point has a variability
    distribution: Distribution | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def result(self, level: str) -> LevelResult | None:
        return next((r for r in self.results if r.level == level), None)


def check_levels(levels: Sequence[str]) -> tuple[Level, ...]:
    levels = tuple(levels)
    require(len(levels) >= 1, "levels", "''", f"give at least one of {', '.join(LEVELS)}")
    for level in levels:
        require(level in LEVELS, "levels", level, f"unknown level; choose from {', '.join(LEVELS)}")
    return tuple(Level(level) for level in levels)


def evaluate(point: Point, levels: Sequence[str] = LEVELS, *, keep_timeline: bool = False) -> Record:
    """``point`` at each of ``levels`` (see the module docstring).

    >>> record = evaluate(Point("1f1b", p=4, m=8), levels=("formula", "table"))
    >>> [(r.level, r.iteration_time, r.peak_inflight) for r in record.results]
    [('formula', 33.0, 4), ('table', 33.0, 4)]
    """
    levels = check_levels(levels)
    kept = take_graph(point) if Level.SIM in levels else None
    try:
        # the table of levels 1 and 2 (a kept graph's point was built by the search's bound)
        schedule = None if kept is not None and set(levels) == {Level.SIM} else point.build_schedule()
    except PipeschedError as exc:
        return Record(point, error=str(exc))
    results: list[LevelResult] = []
    timeline: Timeline | None = None
    distribution: Distribution | None = None
    setup = ""
    for level in levels:
        try:
            if level == Level.FORMULA:
                results.append(_formula(point, schedule))
            elif level == Level.TABLE:
                row, timeline = _table(point, schedule)
                results.append(row)
            else:
                row, timeline, setup, distribution = _simulated(point, schedule, kept)
                results.append(row)
        except PipeschedError as exc:
            return Record(point, error=f"{level}: {exc}")
    if keep_timeline and timeline is None:
        timeline = slot_table(schedule, slot_costs(point))
    return Record(point, tuple(results), setup=setup, timeline=timeline if keep_timeline else None,
                  distribution=distribution)


def _scale(schedule) -> float:
    """Slots of this schedule's ops -> slots of a 1F1B stage op."""
    return one_f_one_b_units(schedule)


def slot_costs(point: Point) -> StageCosts:
    """The F, I, W (and F&B) of levels 1 and 2: the point's slot costs, default 1 slot each."""
    costs = point.slot_costs if point.slot_costs is not None else StageCosts.slots()
    return with_fb_cost(costs, point.fb_cost)


def with_fb_cost(costs: StageCosts, fb_cost: float | None) -> StageCosts:
    """``costs`` with an overlapped pair costing ``fb_cost`` x (F + B) (None: unchanged; a
    given fb_cost replaces a measured fb column)."""
    return costs if fb_cost is None else costs.with_pair_cost(fb_cost)


def _asynchronous(point: Point) -> bool:
    if point.schedule is not None:
        return point.schedule.execution.asynchronous

    return get_family(point.family).asynchronous


def in_steady_state(point: Point) -> bool:
    """Whether the table and sim levels run iterations back to back for ``point``."""
    return point.steady_state or _asynchronous(point)


def _formula(point: Point, schedule) -> FormulaResult:

    if point.schedule is not None:
        raise PipeschedError(f"schedule={point.family}: a schedule file has no closed form; compare it at the "
                             "table and sim levels")
    # the costs a heuristic plans with (its ``costs`` option) are the slot costs the closed form takes
    options = {key: value for key, value in point.family_options().items() if key != "costs"}
    est = formula(point.family, point.p, point.m, v=point.v, costs=slot_costs(point), **options)
    if point.trains_differently:
        # the closed forms know neither frozen stages nor offloads: the plain family's, not exact
        est = replace(est, exact=False, note="the closed form of the family without freezing or offload")
    return FormulaResult(point.family, est.makespan * _scale(schedule), est.bubble_ratio, float(est.activation_units),
                         peak_inflight=int(est.peak_inflight), exact=est.exact, asynchronous=_asynchronous(point))


def _table(point: Point, schedule) -> tuple[TableResult, Timeline]:

    costs = slot_costs(point)
    if in_steady_state(point):
        repeated = point.build_schedule(iterations=STEADY_ITERATIONS)
        found = steady_state(repeated, table_costs(repeated, costs), None, iterations=STEADY_ITERATIONS,
                             steady=point.steady_state)
        peaks = inflight_per_device(repeated)
        return TableResult(point.family, found.iteration_time * _scale(schedule), found.bubble_ratio,
                           max(peaks) * one_f_one_b_units(schedule) * schedule.microbatch_fraction,
                           peak_inflight=max(peaks), **_steady_fields(point, found)), found.timeline
    timeline = slot_table(schedule, costs)
    table = table_metrics(schedule, timeline=timeline)
    return TableResult(point.family, table.makespan * _scale(schedule), table.bubble_ratio,
                       float(table.activation_units), peak_inflight=max(table.peak_inflight)), timeline


def _steady_fields(point: Point, found) -> dict:
    weights = found.weights
    return {"steady_state": True, "asynchronous": _asynchronous(point), "staleness": weights.max_staleness,
            "mean_staleness": weights.mean_staleness, "weight_versions": max(weights.versions)}


def _trains_differently(schedule: Schedule, costs, point: Point) -> bool:
    """Whether a sim run has frozen, offloaded or recomputed work to report (a schedule
    file may freeze stages the point does not name)."""
    return point.trains_differently or bool(schedule.frozen) or costs.recompute_s is not None


def sim_schedule(point: Point, setup, built: Schedule | None = None) -> Schedule:
    """The schedule the sim level runs: built with the workload's costs when the family plans
    with them, and of several iterations for an asynchronous family; else ``built`` (the
    table of levels 1 and 2) when given."""
    if built is not None and not point.sim_table_differs:
        return built
    return point.build_schedule(setup, iterations=STEADY_ITERATIONS if _asynchronous(point) else None)


def keep_graph(point: Point, graph: TaskGraph) -> None:
    """Keep ``graph`` (the point's sim-level graph compiled with free communication, by a
    search's bound) for the point's evaluation in this process (``take_graph``), the
    oldest dropped beyond ``KEPT_OPS`` op rows."""
    take_graph(point)
    _KEPT.graphs[point] = graph
    _KEPT.ops += graph.num_ops
    while _KEPT.ops > KEPT_OPS and len(_KEPT.graphs) > 1:
        _KEPT.ops -= _KEPT.graphs.popitem(last=False)[1].num_ops


def take_graph(point: Point) -> TaskGraph | None:
    """The graph kept for ``point`` (see ``keep_graph``), once; None when none is."""
    graph = _KEPT.graphs.pop(point, None)
    if graph is not None:
        _KEPT.ops -= graph.num_ops
    return graph


@dataclass
class _Kept:
    """The graphs kept in this process, oldest first, and their op rows."""

    graphs: OrderedDict[Point, TaskGraph] = field(default_factory=OrderedDict)
    ops: int = 0


_KEPT = _Kept()


@dataclass(frozen=True, eq=False)
class SimRun:
    """The sim level's run of a point: what it ran on and the timeline it gave (every
    iteration back to back in the steady state, with ``steady``)."""

    setup: SimulationSetup
    schedule: Schedule
    network: Network
    timeline: Timeline
    steady: SteadyState | None = None
    distribution: Distribution | None = None  # with the point's variability: the Monte Carlo run

    def work(self, point: Point) -> IterationWork:
        """What one iteration trains and computes: its microbatches on the data-parallel
        pipelines, the workload's sizes, one pipeline's model and hardware FLOPs and its
        devices' peak FLOP/s (``pipesched.metrics``)."""
        setup, schedule = self.setup, self.schedule
        peaks = setup.peak_flops_per_device(self.network)
        return timeline_work(self.timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                             model_flops=setup.flops_per_iteration(point.m, schedule),
                             hardware_flops=setup.flops_per_iteration(point.m, schedule, hardware=True),
                             peak_flops=peaks[: schedule.num_devices] if peaks is not None else None)


def run_sim(point: Point, built: Schedule | None = None, kept: TaskGraph | None = None) -> SimRun:
    """Simulate ``point`` (level 3): one iteration, with its Monte Carlo run when it has a
    variability, or its steady state (see the module docstring). ``built``: the point's table
    of levels 1 and 2, run when the sim level's is the same; ``kept``: its graph compiled
    with free communication (by a search's bound), which takes the network."""
    setup = point.setup()
    schedule = kept.schedule if kept is not None else sim_schedule(point, setup, built)
    network = setup.network_for(schedule)
    if kept is not None:
        graph = with_network(kept, network, contention=point.contention, overlap=point.overlap)
        return _ran(point, setup, schedule, network, graph)
    costs = with_fb_cost(setup.costs_for(schedule), point.fb_cost)
    if in_steady_state(point):
        compiled = compile_iterations(schedule, costs, network, iterations=STEADY_ITERATIONS,
                                      steady=point.steady_state, contention=point.contention, overlap=point.overlap)
        found = run_iterations(compiled)
        distribution = monte_carlo(compiled, point.variability) if point.variability is not None else None
        return SimRun(setup, schedule, network, found.timeline, steady=found, distribution=distribution)
    return _ran(point, setup, schedule, network,
                compile_graph(schedule, costs, network, contention=point.contention, overlap=point.overlap))


def _ran(point: Point, setup: SimulationSetup, schedule: Schedule, network: Network, graph: TaskGraph) -> SimRun:
    """One iteration of ``graph`` run, with the point's Monte Carlo run on it."""
    timeline = run(graph)
    check_host_memory(timeline.host_memory, str(point.offload))
    distribution = monte_carlo(graph, point.variability) if point.variability is not None else None
    return SimRun(setup, schedule, network, timeline, distribution=distribution)


def _simulated(point: Point, schedule: Schedule | None,
               kept: TaskGraph | None) -> tuple[SimulatedResult, Timeline, str, Distribution | None]:
    done = run_sim(point, schedule, kept)
    timeline, distribution = done.timeline, done.distribution
    spread = {} if distribution is None else {"mean_s": distribution.time.mean, "std_s": distribution.time.std,
                                              "p99_s": distribution.time.p99}
    steady = _steady_fields(point, done.steady) if done.steady is not None else {}
    costs = done.setup.costs_for(done.schedule)
    found_rates = rates(timeline.iteration_time, done.work(point))
    exposed, _ = communication_per_device(timeline)
    memory = timeline.memory
    row = SimulatedResult(
        point.family, timeline.iteration_time, bubble_ratio(timeline), max(memory.peak),
        throughput_samples_per_s=found_rates.samples_per_s, throughput_tokens_per_s=found_rates.tokens_per_s,
        mfu=found_rates.mfu, hfu=found_rates.hfu, exposed_comm_s=float(exposed.max()) / timeline.iterations,
        out_of_memory=any(memory.out_of_memory),
        host_peak_memory=max(timeline.host_memory.peak) if timeline.host_memory is not None else 0.0,
        training=(training_work(timeline) if not steady and _trains_differently(done.schedule, costs, point)
                  else None),
        **spread, **steady,
    )
    return row, timeline, done.setup.description, distribution
