"""Compare schedule families at three levels and see where their ranking changes.

Levels:

- ``formula`` (level 1): each family's closed form (``pipesched.generators.formula``).
- ``table`` (level 2): the idealized slot table of the generated schedule, F = I = W = 1.
- ``sim`` (level 3): the communication-aware simulation with real stage costs, links,
  contention and memory (``pipesched.simulate``).

Units. Formula and table times are in slots of a 1F1B stage op: a schedule with S stages on
p devices runs ops of 1/S of the model, so its slot counts are scaled by p / S (an
interleaved chunk op with v = 2 is half a slot). Their memory is the worst device's peak
in-flight activations in 1F1B-stage units (``activation_units``); ``peak_inflight`` keeps
the count in the schedule's own stages. Simulated times are seconds and memory is the
worst device's peak bytes (parameters, gradients, optimizer state and activations).

Ranks are by iteration time within a level (1 = fastest; equal times share a rank). A
schedule's rank "changes" at a level when it differs from its rank at the level before.
Families that cannot be built at the requested sizes (Chimera needs an even p, ...) or
simulated with the given costs are listed as skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.generators import FAMILIES, formula, generate, get_family
from pipesched.metrics import communication_per_device, mfu, throughput
from pipesched.schedule import Schedule
from pipesched.simulate import Network, simulate
from pipesched.simulate.setup import DEFAULT_SCENARIO, Scenario, SimulationSetup
from pipesched.slot_table import slot_table, table_metrics
from pipesched.timeline import Timeline

LEVELS = ("formula", "table", "sim")
Progress = Callable[[int, int, str], None]  # (done, total, what runs next)


@dataclass(frozen=True)
class LevelResult:
    """One schedule at one level."""

    schedule: str
    level: str
    iteration_time: float
    time_unit: str  # "slot" (1F1B stage ops) or "s"
    bubble_ratio: float  # idle / (devices x iteration time)
    peak_memory: float  # worst device
    memory_unit: str  # "1F1B-stage activations" or "bytes"
    rank: int = 0
    previous_rank: int | None = None  # rank at the level before, None at the first level
    peak_inflight: int | None = None  # formula/table: stage-microbatches in the schedule's stages
    exact: bool | None = None  # formula: the closed form is exact at these sizes
    throughput_samples_per_s: float | None = None  # sim
    throughput_tokens_per_s: float | None = None  # sim, with a sequence length
    mfu: float | None = None  # sim, with a model
    exposed_comm_s: float | None = None  # sim: worst device's exposed communication
    out_of_memory: bool | None = None  # sim: some device's peak exceeds its capacity

    @property
    def rank_changed(self) -> bool:
        return self.previous_rank is not None and self.previous_rank != self.rank


@dataclass(frozen=True)
class Comparison:
    """Results of ``compare``: one LevelResult per compared schedule and level."""

    p: int
    m: int
    v: int | None
    levels: tuple[str, ...]
    results: tuple[LevelResult, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (schedule, reason)
    setup: str = ""  # what the sim level ran on
    settings: dict = field(default_factory=dict)
    # with keep_timelines: each compared schedule's timeline at its last timed level
    # (simulated when "sim" is compared, else the slot table), for pictures and reports
    timelines: tuple[Timeline, ...] = field(default=(), compare=False, repr=False)

    @property
    def schedules(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for result in self.results:
            seen.setdefault(result.schedule, None)
        return tuple(seen)

    def result(self, schedule: str, level: str) -> LevelResult | None:
        return next((r for r in self.results if r.schedule == schedule and r.level == level), None)

    def ranking(self, level: str) -> list[str]:
        """Schedules from fastest to slowest at ``level``."""
        rows = [r for r in self.results if r.level == level]
        return [r.schedule for r in sorted(rows, key=lambda r: (r.rank, r.schedule))]

    def rank_changes(self) -> list[LevelResult]:
        """The results whose rank differs from the level before."""
        return [r for r in self.results if r.rank_changed]

    def to_records(self) -> list[dict]:
        """Flat rows, one per schedule and level (for tables, JSON and the HTML report)."""
        return [{**asdict(r), "rank_changed": r.rank_changed} for r in self.results]

    def to_wide_records(self) -> list[dict]:
        """One row per schedule with every level side by side (time, bubble, memory, rank),
        in the order of the last level's ranking; ``rank changes`` lists where it moved.
        Memory is peak GiB at the sim level and peak in-flight activations in 1F1B-stage
        units ("act.") at the formula and table levels."""
        rows = []
        for name in self.ranking(self.levels[-1]):
            row: dict[str, object] = {"schedule": name}
            moves = []
            for level in self.levels:
                r = self.result(name, level)
                unit = "s" if r.time_unit == "s" else "slots"
                row[f"{level} time ({unit})"] = round(r.iteration_time, 6)
                row[f"{level} bubble"] = round(r.bubble_ratio, 4)
                if r.memory_unit == "bytes":
                    row[f"{level} GiB"] = round(r.peak_memory / 2**30, 2)
                    row[f"{level} fits"] = "no (OOM)" if r.out_of_memory else "yes"
                else:
                    row[f"{level} act."] = r.peak_memory
                row[f"{level} rank"] = r.rank
                if r.rank_changed:
                    moves.append(f"{level}: {r.previous_rank} -> {r.rank}")
            row["rank changes"] = "; ".join(moves) or "-"
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {
            "p": self.p,
            "m": self.m,
            "v": self.v,
            "levels": list(self.levels),
            "setup": self.setup,
            "settings": self.settings,
            "records": self.to_records(),
            "skipped": [{"schedule": name, "reason": reason} for name, reason in self.skipped],
        }


def compare(
    schedules: Sequence[str] | None = None,
    *,
    p: int,
    m: int,
    v: int | None = None,
    levels: Sequence[str] = LEVELS,
    setup: SimulationSetup | None = None,
    costs: StageCosts | None = None,
    network: Network | None = None,
    scenario: Scenario | None = None,
    contention: bool = True,
    overlap: bool = True,
    progress: Progress | None = None,
    keep_timelines: bool = False,
) -> Comparison:
    """Compare ``schedules`` (family names; default all) at p devices and m microbatches.

    ``v`` goes to the families that take a chunk count; the others use their own. The sim
    level runs on one of: ``setup``; ``costs`` (per-stage costs, split into chunks for
    families with more stages) on ``network`` (default: free links); a ``scenario``'s model
    and cluster. Without any, on the default scenario's model and cluster
    (``pipesched.simulate.setup.DEFAULT_SCENARIO``).

    >>> result = compare(["gpipe", "1f1b"], p=4, m=8, levels=("formula", "table"))
    >>> [(r.schedule, r.level, r.iteration_time, r.rank) for r in result.results]
    [('gpipe', 'formula', 33.0, 1), ('gpipe', 'table', 33.0, 1), ('1f1b', 'formula', 33.0, 1), ('1f1b', 'table', 33.0, 1)]
    """
    levels = tuple(levels)
    for level in levels:
        require(level in LEVELS, "levels", level, f"choose from {', '.join(LEVELS)}")
    require(len(levels) >= 1, "levels", "''", f"give at least one of {', '.join(LEVELS)}")
    names = list(schedules) if schedules else list(FAMILIES)
    for name in names:
        get_family(name)  # unknown names fail here, listing the known ones
    sources = [name for name, given in (("setup", setup), ("costs", costs), ("scenario", scenario)) if given is not None]
    require(len(sources) <= 1, "sim_setup", "+".join(sources), "give one of setup, costs or scenario")
    if costs is not None:
        setup = SimulationSetup.from_costs(costs, network=network)
    elif scenario is not None:
        setup = SimulationSetup.from_scenario(scenario)
    if "sim" in levels and setup is None:
        setup = SimulationSetup.from_scenario(DEFAULT_SCENARIO)
    total = len(names) * len(levels)
    done = 0
    results: dict[str, list[LevelResult]] = {}
    skipped: list[tuple[str, str]] = []
    cached_costs: dict = {}
    kept: list[Timeline] = []
    for name in names:
        if progress is not None:
            progress(done, total, name)
        family = get_family(name)
        chunks = v if family.chunks is None else None
        try:
            schedule = generate(name, p, m, v=chunks)
        except PipeschedError as exc:
            skipped.append((name, str(exc)))
            done += len(levels)
            continue
        rows = []
        try:
            for level in levels:
                if progress is not None:
                    progress(done, total, f"{name} ({level})")
                row, timeline = _evaluate(level, name, schedule, chunks, setup, cached_costs,
                                          contention=contention, overlap=overlap)
                rows.append(row)
                done += 1
            if keep_timelines:
                timeline = timeline if timeline is not None else slot_table(schedule)
                kept.append(timeline)
        except PipeschedError as exc:
            skipped.append((name, f"{level}: {exc}"))
            done += len(levels) - len(rows)
            continue
        results[name] = rows
    if progress is not None:
        progress(total, total, "done")
    ranked = _rank(results, levels)
    return Comparison(
        p=p,
        m=m,
        v=v,
        levels=levels,
        results=ranked,
        skipped=tuple(skipped),
        setup=setup.description if (setup is not None and "sim" in levels) else "",
        settings={"contention": contention, "overlap": overlap},
        timelines=tuple(kept),
    )


def _evaluate(level: str, name: str, schedule: Schedule, v: int | None, setup: SimulationSetup | None,
              cached_costs: dict, *, contention: bool, overlap: bool) -> tuple[LevelResult, Timeline | None]:
    """One level's result, and the timeline it produced (None for the formula level)."""
    p, m = schedule.num_devices, schedule.num_microbatches
    # slots of this schedule's ops -> slots of a 1F1B stage op
    scale = schedule.num_devices / schedule.num_stages
    if level == "formula":
        est = formula(name, p, m, v=v)
        return LevelResult(name, level, est.makespan * scale, "slot", est.bubble_ratio,
                           float(est.activation_units), "1F1B-stage activations",
                           peak_inflight=int(est.peak_inflight), exact=est.exact), None
    if level == "table":
        timeline = slot_table(schedule)
        table = table_metrics(schedule, timeline=timeline)
        return LevelResult(name, level, table.makespan * scale, "slot", table.bubble_ratio,
                           float(table.activation_units), "1F1B-stage activations",
                           peak_inflight=max(table.peak_inflight)), timeline
    assert setup is not None
    placement = schedule.placement
    if placement not in cached_costs:
        cached_costs[placement] = setup.costs_for(schedule)
    network = setup.network_for(schedule)
    timeline = simulate(schedule, cached_costs[placement], network, contention=contention, overlap=overlap)
    samples, tokens = throughput(timeline, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len)
    flops = setup.flops_per_iteration(m)
    peaks = setup.peak_flops_per_device(network)
    utilization = None
    if flops is not None and peaks is not None:
        utilization = mfu(timeline, flops_per_iteration=flops, peak_flops=peaks[: schedule.num_devices])
    exposed, _ = communication_per_device(timeline)
    memory = timeline.memory
    return LevelResult(
        name, level, timeline.makespan, "s", timeline.bubble_ratio(), max(memory.peak), "bytes",
        throughput_samples_per_s=samples, throughput_tokens_per_s=tokens, mfu=utilization,
        exposed_comm_s=float(exposed.max()), out_of_memory=any(memory.out_of_memory),
    ), timeline


def _rank(results: dict[str, list[LevelResult]], levels: tuple[str, ...]) -> tuple[LevelResult, ...]:
    """Competition ranks (1, 2, 2, 4) by iteration time per level, and each schedule's rank at
    the level before."""
    rank_of: dict[tuple[str, str], int] = {}
    for index, level in enumerate(levels):
        times = sorted((rows[index].iteration_time, name) for name, rows in results.items())
        for name, rows in results.items():
            mine = rows[index].iteration_time
            # equal within rounding: 1e-9 relative
            faster = sum(1 for t, _ in times if t < mine * (1 - 1e-9))
            rank_of[(name, level)] = faster + 1
    ranked = []
    for name, rows in results.items():
        for index, row in enumerate(rows):
            previous = rank_of[(name, levels[index - 1])] if index > 0 else None
            ranked.append(replace(row, rank=rank_of[(name, row.level)], previous_rank=previous))
    return tuple(ranked)


__all__ = ["LEVELS", "Comparison", "LevelResult", "compare"]
