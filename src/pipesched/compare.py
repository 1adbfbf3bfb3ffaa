"""Compare schedule families at three levels and see where their ranking changes.

A comparison is a grid over the experiments layer (``pipesched.experiments``): one point per
family at the same sizes and workload, evaluated at the requested levels
(``experiments.evaluation`` defines them and their units), then ranked per level.

Ranks are by iteration time within a level (1 = fastest; equal times share a rank) among
the schedules that fit in memory, then the ones out of memory (``RANKING``; only the sim
level knows memory capacity). A schedule's rank "changes" at a level when it differs from
its rank at the level before.
Families that cannot be built at the requested sizes (Chimera needs an even p, ...) or
simulated with the given costs are listed as skipped with the reason.

Each family runs at its own settings. ``v`` sets the chunk count of the families that take
one (``Family.takes_v``, as in every command: interleaved, looped, Hanayo with v = 2 x
waves); the others keep their own (V shapes: 2). Options apply to every compared family
that takes them (``waves=2``), or to one family when prefixed with its name
(``hanayo.waves=2``, ``chimera.forward_doubling=0``), which wins over the unprefixed one.
Asynchronous families (PipeDream) are compared in their steady state, beside the others'
one iteration (or their steady state too, with ``steady_state`` on the workload).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.defaults import DEFAULTS
from pipesched.enums import Level, MemoryUnit, TimeUnit
from pipesched.errors import PipeschedError
from pipesched.experiments.evaluation import LEVELS, LevelResult, check_levels
from pipesched.experiments.grids import Mapper, evaluate_all, rank
from pipesched.experiments.point import Point, points_for
from pipesched.generators import FAMILIES
from pipesched.timeline import Timeline
from pipesched.units import GiB
from pipesched.variability.distribution import Distribution, PairedComparison, paired_comparison

Progress = Callable[[int, int, str], None]  # (done, total, what runs next)
# how each level ranks its schedules (``experiments.grids.rank_key``)
RANKING = "by iteration time, the schedules that fit in memory before those out of memory (sim level)"


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
    # with a variability: the schedules' Monte Carlo runs on common random numbers, ranked by mean
    variability: PairedComparison | None = None
    distributions: tuple[tuple[str, Distribution], ...] = field(default=(), compare=False, repr=False)

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
        return [r.to_dict() for r in self.results]

    def to_wide_records(self) -> list[dict]:
        """One row per schedule with every level side by side (time, bubble, MFU and HFU
        with a model, memory, rank), in the order of the last level's ranking; ``rank changes`` lists where it moved.
        Memory is peak GiB at the sim level and peak in-flight activations in 1F1B-stage
        units ("act.") at the formula and table levels."""
        rows = []
        for name in self.ranking(self.levels[-1]):
            row: dict[str, object] = {"schedule": name}
            moves = []
            for level in self.levels:
                r = self.result(name, level)
                unit = "s" if r.time_unit == TimeUnit.SECONDS else "slots"
                row[f"{level} time ({unit})"] = round(r.iteration_time, 6)
                row[f"{level} bubble"] = round(r.bubble_ratio, 4)
                if r.mfu is not None:
                    row[f"{level} MFU"] = round(r.mfu, 4)
                    row[f"{level} HFU"] = round(r.hfu, 4)
                if r.memory_unit == MemoryUnit.BYTES:
                    row[f"{level} GiB"] = round(r.peak_memory / GiB, 2)
                    row[f"{level} fits"] = "no (OOM)" if r.out_of_memory else "yes"
                else:
                    row[f"{level} act."] = r.peak_memory
                row[f"{level} rank"] = r.rank
                if r.staleness is not None and (r.asynchronous or r.staleness):
                    row[f"{level} staleness"] = r.staleness
                    row[f"{level} weight versions"] = r.weight_versions
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
            "ranking": RANKING,
            "records": self.to_records(),
            "skipped": [{"schedule": name, "reason": reason} for name, reason in self.skipped],
            # frozen, recomputed and offloaded work per device, by schedule (sim level)
            "training_per_device": {r.schedule: r.training.to_dict() for r in self.results
                                    if r.level == Level.SIM and r.training is not None and r.training.any},
            **({"variability": {"samples": self.distributions[0][1].samples,
                                "model": self.distributions[0][1].variability.describe(),
                                **self.variability.to_dict()}} if self.variability is not None else {}),
        }


def compare(
    schedules: Sequence[str] | None = None,
    *,
    p: int = DEFAULTS.p,
    m: int = DEFAULTS.m,
    v: int | None = None,
    levels: Sequence[str] = LEVELS,
    workload: Point | None = None,
    costs: StageCosts | None = None,
    progress: Progress | None = None,
    keep_timelines: bool = False,
    mapper: Mapper = builtins.map,
) -> Comparison:
    """Compare ``schedules`` (family names; default all) at p devices and m microbatches.

    ``v`` goes to the families that take a chunk count; the others use their own. The sim
    level runs on ``workload`` (a template Point: its model, cluster, sizes, partition,
    links, slot costs and engine settings; its family is ignored), or on ``costs``
    (per-stage costs, split into chunks for families with more stages, on free links).
    Without either, on the default scenario (``pipesched.experiments.DEFAULTS``). With the
    workload's ``variability``, the sim level also runs each schedule's Monte Carlo, every
    schedule on the same random streams (``pipesched.variability.sampling``: sample i of
    each sees the same factors for the same op kind, chunk, device and microbatch, the same
    links and the same random stragglers), and ranks them by mean: the share of samples in
    which each is fastest and how often the order flips.

    >>> result = compare(["gpipe", "1f1b"], p=4, m=8, levels=("formula", "table"))
    >>> [(r.schedule, r.level, r.iteration_time, r.rank) for r in result.results]
    [('gpipe', 'formula', 33.0, 1), ('gpipe', 'table', 33.0, 1), ('1f1b', 'formula', 33.0, 1), ('1f1b', 'table', 33.0, 1)]
    """
    levels = check_levels(levels)
    if workload is not None and workload.variability is not None and Level.SIM not in levels:
        raise PipeschedError(f"levels={','.join(levels)}: variability (--jitter, --straggler, ...) is drawn at the "
                             "sim level; add sim to the levels")
    names = list(schedules) if schedules else list(FAMILIES)
    if workload is None:
        workload = Point(stage_costs=costs) if costs is not None else Point()
    elif costs is not None:
        workload = workload.replace(stage_costs=costs)
    # family options (``workload.options``) reach the families that take them
    points = points_for(workload, names, p=p, m=m, v=v)
    total = len(points) * len(levels)
    if progress is not None:
        progress(0, total, names[0] if names else "done")
    records = []
    for index, record in enumerate(evaluate_all(points, levels, mapper=mapper, keep_timelines=keep_timelines)):
        records.append(record)
        if progress is not None:
            following = names[index + 1] if index + 1 < len(names) else "done"
            progress((index + 1) * len(levels), total, following)
    ranked = rank(records, levels)
    results = tuple(result for record in ranked for result in record.results)
    setup = next((record.setup for record in records if record.setup), "")
    drawn = tuple((record.point.family, record.distribution) for record in ranked if record.distribution is not None)
    paired = paired_comparison([name for name, _ in drawn], [d.makespan for _, d in drawn]) if drawn else None
    return Comparison(
        p=p,
        m=m,
        v=v,
        levels=levels,
        results=results,
        skipped=tuple((record.point.family, record.error) for record in records if not record.ok),
        setup=setup if Level.SIM in levels else "",
        settings={"contention": workload.contention, "overlap": workload.overlap,
                  "steady_state": workload.steady_state, "fb_cost": workload.fb_cost},
        timelines=tuple(record.timeline for record in ranked if keep_timelines),
        variability=paired,
        distributions=drawn,
    )


__all__ = ["LEVELS", "RANKING", "Comparison", "LevelResult", "compare"]
