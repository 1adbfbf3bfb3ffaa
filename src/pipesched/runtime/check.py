"""The prediction check: how far the simulator is from real runs.

For each schedule: profile its stages in isolation (plus the runtime's per-op overhead and
the link between ranks), simulate it with those costs, run it for real, and compare the
predicted iteration time with the measured median step time. The error is signed,
(predicted - measured) / measured; the ranking agrees when sorting the schedules by
predicted time gives the same order as sorting them by measured time.

Nothing measured in the runs being predicted goes into the prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.errors import require
from pipesched.model.spec import ModelSpec
from pipesched.runtime.profile import (
    LinkProfile,
    ProfileOptions,
    add_op_overhead,
    profile_link,
    profile_overhead,
    profile_stages,
)
from pipesched.runtime.runs import (
    RunOptions,
    RunResult,
    check_capacity,
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

    def timeline_pairs(self) -> list[tuple[Timeline, Timeline]]:
        """(predicted, measured) per schedule, for overlaid views."""
        return [(row.predicted, row.run.timeline) for row in self.rows]


def profile_options_for(options: RunOptions, *, repeats: int = 10) -> ProfileOptions:
    """Profile exactly what the run executes: same shapes, dtype, device and threads."""
    return ProfileOptions(micro_batch_size=options.micro_batch_size, seq_len=options.seq_len, dtype=options.dtype,
                          device=options.device_kind, seed=options.seed, threads=options.threads, repeats=repeats)


def check_schedules(schedules: Sequence[Schedule], model: ModelSpec, *, options: RunOptions | None = None,
                    runtime: str = "auto", link: LinkProfile | None = None,
                    overhead_s: dict[str, float] | None = None, repeats: int = 10) -> CheckReport:
    """Predict, run and compare every schedule (all with the same number of devices).

    ``link`` and ``overhead_s`` reuse earlier measurements instead of profiling them again.
    """
    from pipesched.simulate import Network, simulate

    options = options or RunOptions()
    require(len(schedules) >= 1, "schedules", 0, "give at least one schedule")
    num_ranks = schedules[0].num_devices
    check_capacity(num_ranks, options.backend)
    runtimes = [choose_runtime(schedule, runtime) for schedule in schedules]
    partitions = [stage_partition(model, schedule.num_stages) for schedule in schedules]
    overheads = dict(overhead_s or {})
    for used in sorted(set(runtimes) - set(overheads)):
        overheads[used] = profile_overhead(runtime=used, backend=options.backend, timeout_s=options.timeout_s)
    if link is None:
        link = profile_link(backend=options.backend, timeout_s=options.timeout_s)
    profile = profile_options_for(options, repeats=repeats)
    bare = profile_stages(model, partitions, profile)
    costs = [add_op_overhead(c, overheads[r]) for c, r in zip(bare, runtimes, strict=True)]
    network = Network.uniform(num_ranks, latency=link.latency, bandwidth=link.bandwidth)
    predicted = [simulate(schedule, c, network) for schedule, c in zip(schedules, costs, strict=True)]
    runs = run_schedules(schedules, model, options=options, runtime=runtime, partitions=partitions)
    rows = tuple(CheckRow(s, c, p, r) for s, c, p, r in zip(schedules, costs, predicted, runs, strict=True))
    return CheckReport(rows=rows, link=link, overhead_s=overheads)
