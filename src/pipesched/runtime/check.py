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
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.model.spec import ModelSpec
from pipesched.runtime.launch import StatusCallback
from pipesched.runtime.profile import (
    LinkProfile,
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
from pipesched.timeline import Timeline


@dataclass(frozen=True)
class CheckRow:
    """One schedule: its prediction and its real run."""

    schedule: Schedule
    costs: StageCosts  # what the prediction used
    predicted: Timeline  # simulated (source "simulated")
    run: RunResult  # measured

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
    from pipesched.simulate import Network, simulate

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
    for schedule, run, used in zip(schedules, runs, runtimes, strict=True):
        assert run.stage_timings is not None
        timings = [median_timing(run.stage_timings[stage]) for stage in range(schedule.num_stages)]
        costs = add_op_overhead(stage_costs_from_timings(timings, dtype=options.dtype), overheads[used])
        rows.append(CheckRow(schedule, costs, simulate(schedule, costs, network), run))
    return CheckReport(rows=tuple(rows), link=link, overhead_s=overheads)
