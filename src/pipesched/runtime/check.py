"""The prediction check: how far the simulator is from real runs.

For each schedule: profile its stages in isolation, simulate it with those costs (plus the
runtime's per-op overhead and the measured link between ranks), run it for real, and
compare the predicted iteration time with the measured median step time. The error is
signed, (predicted - measured) / measured (``pairing.prediction_error``, the one
sign of the terminal, ``--json`` and the comparison page): positive when the prediction is
longer than the run, negative when the run is slower than predicted.

Three figures per schedule, one story:

- predicted: the simulation with every op at the median of its profiled repeats (plus the
  per-op overhead); the timeline the comparison page draws on top;
- predicted p50 / p99: the same simulation, same costs, over ``CHECK_SAMPLES`` Monte Carlo
  iterations in which every op draws its time independently from its stage's repeats,
  each repeat as a factor over their median (median 1: with equal repeats every sample is
  the prediction). Slow repeats of different ops add up in a sample, so with repeats
  spread by other work on the cores p50 tends to lie above the prediction;
- measured: the median step (``timeline.median_step``), whose timeline the page draws below.

The ranking. Two schedules' measured medians are told apart when their difference is
larger than the interquartile range of the step times of each of them: then the pair is
judged, and it agrees when the predictions order it alike. Kendall's tau is taken over the
judged pairs; with none judged the verdict is "too noisy to judge" (no tau); a schedule
measured on one step has no spread, so its pairs are never judged.

The stage profile is taken in the same launch as the run: every rank times the F, I, W and
B of its own stages in a loop, outside any pipeline, all ranks at once, in rounds between
the measured steps (``RunOptions.profile_repeats``). So the profile sees the cores as the
steps do (on a shared or virtual machine their speed drifts within seconds), yet nothing
measured in the pipelined steps goes into the prediction. A stage kept twice (Chimera's and DualPipe's
replicas) gets the median of its two copies' timings.

Spread. Every profiled repeat is kept: their factors over the median (per op kind and
stage, ``pipesched.variability.measured``) drive a Monte Carlo run of the prediction
(``CHECK_SAMPLES`` iterations), whose distribution is reported beside the spread of the
measured step times.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.model.spec import ModelSpec
from pipesched.pairing import Comparison, prediction_error
from pipesched.runtime.launch import StatusCallback
from pipesched.runtime.profile import (
    LinkProfile,
    StageTiming,
    add_op_overhead,
    median_timing,
    profile_link,
    profile_overhead,
    stage_costs_from_timings,
)
from pipesched.runtime.runs import (
    RunOptions,
    RunResult,
    check_capacity,
    check_memory,
    choose_runtime,
    run_schedules,
    stage_partition,
)
from pipesched.schedule import Schedule
from pipesched.simulate import compile_graph, run
from pipesched.simulate.graph import TaskGraph
from pipesched.simulate.network import Network
from pipesched.timeline import Timeline
from pipesched.variability.distribution import Distribution, Spread, monte_carlo
from pipesched.variability.measured import MeasuredFactors
from pipesched.variability.model import Variability

# Monte Carlo iterations of each prediction, drawn from the profiled repeats
CHECK_SAMPLES = 2000


@dataclass(frozen=True)
class CheckRow:
    """One schedule: its prediction and its real run."""

    schedule: Schedule
    costs: StageCosts  # what the prediction used
    predicted: Timeline  # simulated (source "simulated")
    run: RunResult  # measured
    spread: Distribution | None = None  # the prediction with the profiled repeats' variability

    @property
    def measured_spread(self) -> Spread:
        """The measured step times' spread (percentiles interpolated between steps)."""
        return Spread.of(np.asarray(self.run.step_times))

    @property
    def measured_iqr(self) -> float | None:
        """Interquartile range of the measured step times, seconds (None with one step)."""
        return interquartile_range(self.run.step_times)

    @property
    def predicted_s(self) -> float:
        return self.predicted.makespan

    @property
    def measured_s(self) -> float:
        return self.run.step_time

    @property
    def error(self) -> float:
        """The prediction error, (predicted - measured) / measured (``prediction_error``)."""
        return prediction_error(self.predicted_s, self.measured_s)


@dataclass(frozen=True)
class CheckReport:
    rows: tuple[CheckRow, ...]
    link: LinkProfile
    overhead_s: dict[str, float] = field(default_factory=dict)  # runtime -> per-op overhead

    @property
    def median_abs_error(self) -> float:
        return float(statistics.median(abs(row.error) for row in self.rows))

    @property
    def predicted_order(self) -> tuple[str, ...]:
        return tuple(row.schedule.name for row in sorted(self.rows, key=lambda r: r.predicted_s))

    @property
    def measured_order(self) -> tuple[str, ...]:
        return tuple(row.schedule.name for row in sorted(self.rows, key=lambda r: r.measured_s))

    @property
    def pairs(self) -> tuple[PairVerdict, ...]:
        """Every pair of schedules, judged or too noisy (see the module docstring)."""
        return tuple(judge_pair(a, b) for k, a in enumerate(self.rows) for b in self.rows[k + 1:])

    @property
    def judged(self) -> tuple[PairVerdict, ...]:
        return tuple(pair for pair in self.pairs if pair.judged)

    @property
    def too_noisy(self) -> bool:
        """Whether no pair of schedules could be judged (never with one schedule)."""
        return len(self.rows) > 1 and not self.judged

    @property
    def ranking_agrees(self) -> bool | None:
        """Whether the prediction orders every judged pair as measured (None: too noisy)."""
        if self.too_noisy:
            return None
        return all(pair.agrees for pair in self.judged)

    @property
    def rank_correlation(self) -> float | None:
        """Kendall's tau over the judged pairs: 1 when each is ordered alike, -1 when each is
        swapped, a predicted tie counting 0 (1 with one schedule; None when too noisy)."""
        if self.too_noisy:
            return None
        judged = self.judged
        return sum(pair.concordance for pair in judged) / len(judged) if judged else 1.0

    @property
    def ranking_verdict(self) -> str:
        """One line: whether the ranking agrees, over how many pairs, or that it cannot say."""
        total = len(self.pairs)
        if total == 0:
            return "one schedule: no ranking to judge"
        if self.too_noisy:
            return (f"too noisy to judge: the measured step times' spread is larger than the difference between "
                    f"the medians for {'the pair' if total == 1 else f'all {total} pairs'}")
        judged = len(self.judged)
        noisy = "" if judged == total else f"; {total - judged} of {total} pairs too noisy to judge"
        return (f"ranking agrees: {'yes' if self.ranking_agrees else 'no'}, Kendall's tau "
                f"{self.rank_correlation:+.2f} over {judged} judged pair{'' if judged == 1 else 's'}{noisy}")

    def timeline_pairs(self) -> list[tuple[Timeline, Timeline]]:
        """(predicted, measured) per schedule, for overlaid views."""
        return [(row.predicted, row.run.timeline) for row in self.rows]

    def to_dict(self, *, model: str, p: int, m: int) -> dict:
        """The JSON shape of ``pipesched check --json``."""
        return {
            "model": model, "p": p, "m": m,
            "rows": [{"schedule": row.schedule.name, "runtime": row.run.runtime, "predicted_s": row.predicted_s,
                      "measured_s": row.measured_s, "error": row.error, "step_times_s": list(row.run.step_times),
                      "measured_spread": {**row.measured_spread.to_dict("_s"), "iqr_s": row.measured_iqr},
                      "predicted_distribution": None if row.spread is None else {
                          "samples": row.spread.samples, **row.spread.time.to_dict("_s")}}
                     for row in self.rows],
            "median_abs_error": self.median_abs_error, "ranking_agrees": self.ranking_agrees,
            "rank_correlation": self.rank_correlation, "ranking_verdict": self.ranking_verdict,
            "pairs": [pair.to_dict() for pair in self.pairs],
            "predicted_order": list(self.predicted_order), "measured_order": list(self.measured_order),
            "latency_s": self.link.latency, "bandwidth_bytes_per_s": self.link.bandwidth,
            "per_op_overhead_s": self.overhead_s,
        }

    def comparisons(self) -> list[Comparison]:
        """Per schedule: the prediction, the median measured step and every step's time."""
        return [Comparison(row.predicted, row.run.timeline, tuple(row.run.step_times),
                           predicted_p50=None if row.spread is None else row.spread.time.p50,
                           predicted_p99=None if row.spread is None else row.spread.time.p99)
                for row in self.rows]

    def summary_rows(self) -> list[dict[str, object]]:
        """One flat row per schedule, for the comparison page's table (times in ms); its error
        is ``error``'s, as the page states every difference: predicted - measured."""
        return [{"schedule": row.schedule.name, "runtime": row.run.runtime,
                 "predicted ms": round(row.predicted_s * 1e3, 3),
                 "measured (median step, drawn) ms": round(row.measured_s * 1e3, 3),
                 "error": f"{row.error:+.1%}",
                 "steps": len(row.run.step_times),
                 "step spread ms": round((max(row.run.step_times) - min(row.run.step_times)) * 1e3, 3),
                 "step IQR ms": "-" if row.measured_iqr is None else round(row.measured_iqr * 1e3, 3),
                 **({} if row.spread is None else {
                     "predicted p50 / p99 ms": f"{row.spread.time.p50 * 1e3:.3f} / {row.spread.time.p99 * 1e3:.3f}",
                     "predicted spread ms": round((row.spread.time.max - row.spread.time.min) * 1e3, 3)})}
                for row in self.rows]


@dataclass(frozen=True)
class PairVerdict:
    """Two schedules' measured medians against the spread of their step times."""

    faster: str  # by measured median step time
    slower: str
    difference_s: float  # slower's median - faster's median
    spread_s: float | None  # the larger interquartile range of the two (None: one has one step)
    concordance: int  # 1: the prediction puts ``faster`` first too, 0: it ties them, -1: it swaps them

    @property
    def agrees(self) -> bool:
        return self.concordance == 1

    @property
    def judged(self) -> bool:
        """The difference is larger than the spread of either schedule's step times."""
        return self.spread_s is not None and self.difference_s > self.spread_s

    def to_dict(self) -> dict[str, object]:
        return {"faster": self.faster, "slower": self.slower, "difference_s": self.difference_s,
                "spread_s": self.spread_s, "judged": self.judged, "prediction_agrees": self.agrees}


def interquartile_range(values: Sequence[float]) -> float | None:
    """p75 - p25 (numpy's linear percentiles); None for fewer than two values.

    >>> interquartile_range([1.0, 2.0, 3.0, 4.0, 5.0])
    2.0
    """
    if len(values) < 2:
        return None
    low, high = np.percentile(np.asarray(values, np.float64), (25, 75))
    return float(high - low)


def judge_pair(a: CheckRow, b: CheckRow) -> PairVerdict:
    """Whether the measurement tells ``a`` and ``b`` apart, and whether the prediction
    orders them as measured (see the module docstring)."""
    faster, slower = (a, b) if a.measured_s <= b.measured_s else (b, a)
    spreads = (a.measured_iqr, b.measured_iqr)
    spread = None if None in spreads else max(spreads)
    concordance = int(np.sign(slower.predicted_s - faster.predicted_s))
    return PairVerdict(faster.schedule.name, slower.schedule.name, slower.measured_s - faster.measured_s, spread,
                       concordance)


def check_schedules(schedules: Sequence[Schedule], model: ModelSpec, *, options: RunOptions | None = None,
                    runtime: str = "auto", link: LinkProfile | None = None,
                    overhead_s: dict[str, float] | None = None, repeats: int = 10,
                    on_status: StatusCallback | None = None) -> CheckReport:
    """Predict, run and compare every schedule (all with the same number of devices).

    ``repeats``: profile rounds of every stage, spread over the measured steps. ``link`` and
    ``overhead_s`` (runtime -> seconds) reuse earlier measurements instead of taking them again.
    ``on_status`` receives status lines while ranks run (see ``launch``).
    """
    options = options or RunOptions()
    require(len(schedules) >= 1, "schedules", 0, "give at least one schedule")
    num_ranks = schedules[0].num_devices
    check_capacity(num_ranks, options.backend)
    partitions = [stage_partition(model, schedule.num_stages) for schedule in schedules]
    check_memory(model, list(zip(schedules, partitions, strict=True)), options)
    runtimes = [choose_runtime(schedule, runtime) for schedule in schedules]
    overheads = dict(overhead_s or {})
    for used in sorted(set(runtimes) - set(overheads)):
        overheads[used] = profile_overhead(runtime=used, backend=options.backend, model=model,
                                           micro_batch_size=options.micro_batch_size, seq_len=options.seq_len,
                                           dtype=options.dtype, timeout_s=options.timeout_s, on_status=on_status)
    if link is None:
        link = profile_link(backend=options.backend, timeout_s=options.timeout_s, on_status=on_status)
    runs = run_schedules(schedules, model, options=dataclasses.replace(options, profile_repeats=repeats),
                         runtime=runtime, partitions=partitions, on_status=on_status)
    network = Network.uniform(num_ranks, latency=link.latency, bandwidth=link.bandwidth)
    rows = []
    for schedule, result, used in zip(schedules, runs, runtimes, strict=True):
        assert result.stage_timings is not None
        timings = [median_timing(result.stage_timings[stage]) for stage in range(schedule.num_stages)]
        found = predict(schedule, timings, network, overhead_s=overheads[used], dtype=options.dtype)
        rows.append(CheckRow(schedule, found.costs, found.timeline, result, spread=found.spread))
    return CheckReport(rows=tuple(rows), link=link, overhead_s=overheads)


@dataclass(frozen=True)
class Prediction:
    """What a check predicts for one schedule (see the module docstring)."""

    costs: StageCosts  # the profiled medians plus the per-op overhead
    timeline: Timeline  # every op at its cost
    spread: Distribution | None  # the same costs, every op drawn from its repeats (None without repeats)


def predict(schedule: Schedule, timings: Sequence[StageTiming], network: Network, *, overhead_s: float = 0.0,
            dtype: str = "float32", samples: int = CHECK_SAMPLES) -> Prediction:
    """The prediction and its distribution from one profiled timing per stage: both from
    one compiled graph, so they share every cost."""
    costs = add_op_overhead(stage_costs_from_timings(timings, dtype=dtype), overhead_s)
    graph = compile_graph(schedule, costs, network)
    return Prediction(costs, run(graph), predicted_spread(graph, timings, overhead_s=overhead_s, samples=samples))


def predicted_spread(graph: TaskGraph, timings: Sequence[StageTiming], *, overhead_s: float = 0.0,
                     samples: int = CHECK_SAMPLES) -> Distribution | None:
    """The prediction's distribution when every op draws its time from its stage's profiled
    repeats (each plus the per-op overhead, as the costs count them), as factors over their
    median on the graph's own durations; None without repeats."""
    seconds = [timing.repeat_seconds(offset_s=overhead_s) for timing in timings]
    if not all(seconds):
        return None
    factors = MeasuredFactors.from_seconds(seconds, source="the check's profile")
    return monte_carlo(graph, Variability(measured=factors, samples=samples))
