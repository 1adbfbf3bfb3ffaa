"""The prediction check: how far the simulator is from real runs.

For each schedule: profile its stages in isolation, simulate it with those costs (plus the
runtime's per-op overhead and the measured link between ranks), run it for real, and
compare the predicted iteration time with the measured median step time. The error is
signed, (predicted - measured) / measured; the ranking agrees when sorting the schedules by
predicted time gives the same order as sorting them by measured time.

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
from pathlib import Path

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.model.spec import ModelSpec
from pipesched.render.pairing import Comparison
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
from pipesched.simulate.graph import TaskGraph
from pipesched.timeline import Timeline
from pipesched.variability.distribution import Distribution, Spread

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
        """The measured step times' spread (p50 is their median)."""
        return Spread.of(np.asarray(self.run.step_times))

    @property
    def predicted_s(self) -> float:
        return self.predicted.makespan

    @property
    def measured_s(self) -> float:
        return self.run.step_time

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


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
    def ranking_agrees(self) -> bool:
        return self.predicted_order == self.measured_order

    @property
    def rank_correlation(self) -> float:
        """Kendall's tau between predicted and measured times: 1 when every pair of
        schedules is ordered alike, -1 when every pair is swapped (1 with one schedule)."""
        return kendall_tau([row.predicted_s for row in self.rows], [row.measured_s for row in self.rows])

    def timeline_pairs(self) -> list[tuple[Timeline, Timeline]]:
        """(predicted, measured) per schedule, for overlaid views."""
        return [(row.predicted, row.run.timeline) for row in self.rows]

    def to_dict(self, *, model: str, p: int, m: int) -> dict:
        """The JSON shape of ``pipesched check --json``."""
        return {
            "model": model, "p": p, "m": m,
            "rows": [{"schedule": row.schedule.name, "runtime": row.run.runtime, "predicted_s": row.predicted_s,
                      "measured_s": row.measured_s, "error": row.error, "step_times_s": list(row.run.step_times),
                      "measured_spread": row.measured_spread.to_dict("_s"),
                      "predicted_distribution": None if row.spread is None else {
                          "samples": row.spread.samples, **row.spread.time.to_dict("_s")}}
                     for row in self.rows],
            "median_abs_error": self.median_abs_error, "ranking_agrees": self.ranking_agrees,
            "rank_correlation": self.rank_correlation,
            "predicted_order": list(self.predicted_order), "measured_order": list(self.measured_order),
            "latency_s": self.link.latency, "bandwidth_bytes_per_s": self.link.bandwidth,
            "per_op_overhead_s": self.overhead_s,
        }

    def comparisons(self) -> list[Comparison]:
        """Per schedule: the prediction, the median measured step and every step's time."""
        return [Comparison(row.predicted, row.run.timeline, tuple(row.run.step_times)) for row in self.rows]

    def summary_rows(self) -> list[dict[str, object]]:
        """One flat row per schedule, for the comparison page's table (times in ms)."""
        return [{"schedule": row.schedule.name, "runtime": row.run.runtime,
                 "predicted ms": round(row.predicted_s * 1e3, 3), "measured ms": round(row.measured_s * 1e3, 3),
                 "error": f"{row.error:+.1%}", "steps": len(row.run.step_times),
                 "step spread ms": round((max(row.run.step_times) - min(row.run.step_times)) * 1e3, 3),
                 **({} if row.spread is None else {
                     "predicted p50 / p99 ms": f"{row.spread.time.p50 * 1e3:.3f} / {row.spread.time.p99 * 1e3:.3f}",
                     "predicted spread ms": round((row.spread.time.max - row.spread.time.min) * 1e3, 3)})}
                for row in self.rows]

    def write_views(self, *, html: str | None = None, trace: str | None = None, title: str = "") -> list[Path]:
        """The comparison page and the two-processes-per-device trace; the paths written."""
        from pipesched.render.views import write_comparison_views

        return write_comparison_views(self.comparisons(), html=html, trace=trace, summary=self.summary_rows(),
                                      title=title)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-a of two equally long sequences (pairs tied in either count as 0).

    >>> kendall_tau([1, 2, 3], [10, 30, 20])
    0.3333333333333333
    """
    n = len(a)
    if n < 2:
        return 1.0
    score = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            score += ((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j]))
    return score / (n * (n - 1) / 2)


def check_schedules(schedules: Sequence[Schedule], model: ModelSpec, *, options: RunOptions | None = None,
                    runtime: str = "auto", link: LinkProfile | None = None,
                    overhead_s: dict[str, float] | None = None, repeats: int = 10,
                    on_status: StatusCallback | None = None) -> CheckReport:
    """Predict, run and compare every schedule (all with the same number of devices).

    ``repeats``: profile rounds of every stage, spread over the measured steps. ``link`` and
    ``overhead_s`` (runtime -> seconds) reuse earlier measurements instead of taking them again.
    ``on_status`` receives status lines while ranks run (see ``launch``).
    """
    from pipesched.simulate import Network, compile_graph, run

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
        costs = add_op_overhead(stage_costs_from_timings(timings, dtype=options.dtype), overheads[used])
        graph = compile_graph(schedule, costs, network)
        rows.append(CheckRow(schedule, costs, run(graph), result,
                             spread=predicted_spread(graph, timings, overhead_s=overheads[used])))
    return CheckReport(rows=tuple(rows), link=link, overhead_s=overheads)


def predicted_spread(graph: TaskGraph, timings: Sequence[StageTiming], *, overhead_s: float = 0.0,
                     samples: int = CHECK_SAMPLES) -> Distribution | None:
    """The prediction's distribution when every op draws its time from its stage's profiled
    repeats (each plus the per-op overhead, as the costs count them); None without repeats."""
    from pipesched.variability.distribution import monte_carlo
    from pipesched.variability.measured import MeasuredFactors
    from pipesched.variability.model import Variability

    seconds = [timing.repeat_seconds(offset_s=overhead_s) for timing in timings]
    if not all(seconds):
        return None
    factors = MeasuredFactors.from_seconds(seconds, source="the check's profile")
    return monte_carlo(graph, Variability(measured=factors, samples=samples))
