"""Monte Carlo over a compiled task graph: many iterations with sampled durations, their
iteration-time, bubble and memory distributions, what sets the iteration time (sensitivity),
and schedules compared on common random numbers.

Each batch of samples is drawn (``pipesched.variability.sampling``) and run by
``pipesched.simulate.run_batch`` in one compiled loop, with the critical path of every
sample counted: nothing is lowered again.

Figures:

- iteration time per sample; mean, standard deviation, standard error of the mean, and
  percentiles p50 / p90 / p99 (numpy's default: linear between order statistics).
- bubble per sample: idle over (devices x iteration time) = 1 - the sample's summed op
  durations / (devices x its iteration time), as ``Timeline.bubble_ratio``.
- peak memory: with one queue per device the memory events of a device come in program
  order whatever the durations, so its peak is the same in every sample (reported as
  constant); a graph with more queues than devices is rerun per sample for it.
- sensitivity: for each task, the share of samples in which it lies on the critical path;
  per stage, device, op kind and link, the mean time its tasks spend on the critical path
  over the mean iteration time (``critical_share``: scaling the group's durations by
  1 + e moves the mean iteration time by about e x critical_share), and the number of its
  tasks on the path per sample. A fused entry counts as one task of its fused kind.
- iterations back to back (a steady state, an asynchronous family's table): the iteration
  time of a sample is its steady-state iteration (``simulate.iterations``: the mean
  iteration between the first and the last, from each iteration's end in that sample), its
  bubble is over that, and the critical shares are of the whole run's critical path over
  the whole run's mean time.

Why the mean is not below the deterministic iteration time: without channel contention the
service order is fixed, and the iteration time is a longest path, a maximum of sums of
durations: a convex function of them. With mean-1 factors, Jensen's inequality gives
E[T(d x f)] >= T(d x E[f]) = T(d). A sample mean estimates it with a standard error; on
the samples themselves T(mean of the sampled durations) <= mean of T holds exactly. With
contention a channel serves its transfers in completion order, which the durations change:
the iteration time is not convex then, and jitter can find a better order than the
deterministic run's ties did (the mean may fall below it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipesched.dependencies import entry_of_row
from pipesched.limits import check_sampled_work
from pipesched.simulate import run, run_batch
from pipesched.simulate.graph import TaskGraph
from pipesched.simulate.iterations import Iterations
from pipesched.timeline import ALLREDUCE, steady_iteration_time
from pipesched.variability.model import Variability
from pipesched.variability.sampling import Sampler

# samples drawn and run at once: at most BATCH_SAMPLES, and at most BATCH_VALUES durations
# (8 bytes each) in one batch, so a large table draws fewer samples at a time
BATCH_SAMPLES = 1024
BATCH_VALUES = 2**23
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Spread:
    """Summary of one distribution of samples."""

    mean: float
    std: float
    stderr: float  # standard error of the mean
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray) -> Spread:
        values = np.asarray(values, np.float64)
        std = float(values.std(ddof=1)) if values.size > 1 else 0.0
        p50, p90, p99 = (float(x) for x in np.percentile(values, PERCENTILES))
        return cls(float(values.mean()), std, std / np.sqrt(values.size), p50, p90, p99, float(values.min()),
                   float(values.max()))

    def to_dict(self, suffix: str = "") -> dict[str, float]:
        return {f"{name}{suffix}": getattr(self, name) for name in
                ("mean", "std", "stderr", "p50", "p90", "p99", "min", "max")}


@dataclass(frozen=True)
class Influence:
    """How much a group of tasks (a stage, device, op kind or link) sets the iteration time."""

    group: str  # "stage", "device", "kind" or "link"
    name: int | str  # its stage or device number, kind letter, or link "a->b" / "a<->b"
    critical_share: float  # mean time on the critical path / mean iteration time
    on_path: float  # its tasks on the critical path per sample

    def to_dict(self) -> dict[str, object]:
        return {self.group: self.name, "critical_share": self.critical_share, "on_path_per_sample": self.on_path}


@dataclass(frozen=True, eq=False)
class Distribution:
    """A Monte Carlo run of one graph (see the module docstring)."""

    variability: Variability
    deterministic: float  # iteration time with the compiled durations, in the graph's unit
    makespan: np.ndarray  # (samples,)
    bubble: np.ndarray  # (samples,)
    peak_memory: np.ndarray  # (samples, devices), or (1, devices) when constant
    memory_constant: bool
    influences: tuple[Influence, ...]  # largest critical share first, per group kind
    critical_ops: tuple[tuple[str, int, float], ...] = field(default=())  # (op, device, share of samples), top first

    @property
    def samples(self) -> int:
        return int(self.makespan.shape[0])

    @property
    def time(self) -> Spread:
        return Spread.of(self.makespan)

    def to_dict(self) -> dict[str, object]:
        """The ``variability`` object of ``simulate --json``."""
        time = self.time
        memory: dict[str, object] = {"constant": self.memory_constant}
        if self.memory_constant:
            memory["bytes"] = self.peak_memory[0].tolist()
        else:
            memory["mean_bytes"] = self.peak_memory.mean(axis=0).tolist()
            memory["p99_bytes"] = np.percentile(self.peak_memory, 99, axis=0).tolist()
            memory["max_bytes"] = self.peak_memory.max(axis=0).tolist()
        groups: dict[str, list[dict[str, object]]] = {}
        for influence in self.influences:
            groups.setdefault(influence.group + "s", []).append(influence.to_dict())
        return {
            "samples": self.samples,
            "seed": self.variability.seed,
            "model": self.variability.describe(),
            "deterministic_s": self.deterministic,
            "mean_s": time.mean, "std_s": time.std, "stderr_s": time.stderr,
            "p50_s": time.p50, "p90_s": time.p90, "p99_s": time.p99, "min_s": time.min, "max_s": time.max,
            "bubble": Spread.of(self.bubble).to_dict(),
            "peak_memory": memory,
            "sensitivity": {**groups, "ops": [{"op": op, "device": device, "share_of_samples": share}
                                              for op, device, share in self.critical_ops]},
        }


def monte_carlo(graph: TaskGraph | Iterations, variability: Variability, *, top_ops: int = 10) -> Distribution:
    """``variability.samples`` iterations of ``graph`` with sampled durations. Given several
    iterations back to back (``simulate.iterations``: a steady state, an asynchronous
    family), each sample's iteration time is its steady-state iteration and its bubble is
    over that; the critical shares are of the whole run's critical path."""
    compiled = graph if isinstance(graph, Iterations) else None
    graph = compiled.graph if compiled is not None else graph
    check_sampled_work(variability.samples, graph.num_ops + graph.num_transfers)
    samples = _Samples.of(graph, variability.samples, compiled)
    samples.run(Sampler(graph, variability, iterations=compiled))
    deterministic = run(graph)
    with np.errstate(divide="ignore", invalid="ignore"):
        bubble = np.where(samples.makespan > 0, 1.0 - samples.busy / (graph.num_devices * samples.makespan), 0.0)
    peak_memory = (np.asarray([deterministic.memory.peak], np.float64) if samples.peaks is None
                   else np.asarray(samples.peaks, np.float64))
    counts = _entries_only(graph, samples.counts)
    return Distribution(
        variability=variability,
        deterministic=_deterministic(graph, samples.groups, deterministic.makespan),
        makespan=samples.makespan,
        bubble=bubble,
        peak_memory=peak_memory,
        memory_constant=samples.peaks is None,
        influences=_influences(graph, counts, samples.seconds, samples.whole),
        critical_ops=_top_ops(graph, counts[: graph.num_ops], variability.samples, top_ops),
    )


@dataclass
class _Samples:
    """What the samples of one graph gave, filled batch by batch: per sample the iteration
    time (``makespan``), the whole run's time, the busy time per iteration (summed over
    devices), and the peak memory of every device (``peaks``; None when the durations
    cannot change it); per op and transfer row, how often it was critical and its seconds
    on the critical path. ``groups``, ``rounds``: the iterations back to back."""

    graph: TaskGraph
    groups: tuple[np.ndarray, np.ndarray, int] | None
    rounds: int
    makespan: np.ndarray
    whole: np.ndarray
    busy: np.ndarray
    counts: np.ndarray
    seconds: np.ndarray
    peaks: list | None

    @classmethod
    def of(cls, graph: TaskGraph, total: int, compiled: Iterations | None) -> _Samples:
        rows = graph.num_ops + graph.num_transfers
        return cls(graph, compiled.groups if compiled is not None else None,
                   compiled.iterations if compiled is not None else 1,
                   np.empty(total), np.empty(total), np.empty(total), np.zeros(rows, np.int64), np.zeros(rows),
                   None if _memory_is_fixed(graph) else [])

    def run(self, sampler: Sampler) -> None:
        """Draw and run every sample, in batches of at most BATCH_VALUES durations."""
        graph, total = self.graph, len(self.makespan)
        batch = max(1, min(BATCH_SAMPLES, BATCH_VALUES // max(graph.num_ops + graph.num_transfers, 1)))
        for first in range(0, total, batch):
            count = min(batch, total - first)
            ops, transfers = sampler.draw(count)
            self.record(slice(first, first + count), ops, transfers)

    def record(self, rows: slice, ops: np.ndarray, transfers: np.ndarray | None) -> None:
        """Run one batch of sampled durations and keep what it gave in ``rows``."""
        result = run_batch(self.graph, ops, transfers, critical=True, groups=self.groups)
        self.whole[rows] = result.makespan
        self.makespan[rows] = result.makespan if self.groups is None else steady_iteration_time(result.group_end)
        self.busy[rows] = ops.sum(axis=1) / self.rounds
        self.counts += np.concatenate([result.critical_ops, result.critical_transfers])
        self.seconds += np.concatenate([result.critical_op_seconds, result.critical_transfer_seconds])
        if self.peaks is not None:
            for i in range(len(ops)):
                timeline = run(self.graph, op_durations=ops[i],
                               transfer_durations=None if transfers is None else transfers[i])
                self.peaks.append(timeline.memory.peak)


def _deterministic(graph: TaskGraph, groups: tuple[np.ndarray, np.ndarray, int] | None, makespan: float) -> float:
    """The iteration time with the compiled durations: ``makespan``, or the steady-state
    iteration of a graph of several iterations."""
    if groups is None:
        return makespan
    ends = run_batch(graph, graph.op_duration[None, :], groups=groups).group_end
    return float(steady_iteration_time(ends)[0])


def _entries_only(graph: TaskGraph, counts: np.ndarray) -> np.ndarray:
    """Critical-path counts per task with a fused entry counted once, on its first part (its
    other parts end with it and take no time)."""
    ops = graph.ops
    if not ops.fused:
        return counts
    counts = counts.copy()
    counts[: graph.num_ops][ops.tails()] = 0
    return counts


def _memory_is_fixed(graph: TaskGraph) -> bool:
    """Whether every device runs its ops on one queue in table order (so the order of its
    memory events, and its peak, does not depend on durations)."""
    return (graph.queue_offsets.shape[0] == graph.num_devices + 1
            and bool(np.array_equal(graph.op_queue, graph.ops.device)))


def _influences(graph: TaskGraph, counts: np.ndarray, seconds: np.ndarray,
                makespan: np.ndarray) -> tuple[Influence, ...]:
    n, samples = graph.num_ops, makespan.shape[0]
    total = float(makespan.sum()) or 1.0
    ops = graph.ops
    letters = graph.schedule.rules.letters
    groups: list[tuple[str, np.ndarray, list, np.ndarray, np.ndarray]] = [
        ("stage", ops.stage, list(range(graph.schedule.num_stages)), counts[:n], seconds[:n]),
        ("device", ops.device, list(range(graph.num_devices)), counts[:n], seconds[:n]),
        ("kind", ops.entry_kinds(), list(letters), counts[:n], seconds[:n]),
    ]
    if graph.num_transfers:
        d = graph.num_devices
        link = graph.tr_src.astype(np.int64) * d + graph.tr_dst
        reduces = graph.tr_kind == ALLREDUCE
        link[reduces] += d * d
        names = [f"{a}->{b}" for a in range(d) for b in range(d)] + [f"{a}<->{b}" for a in range(d) for b in range(d)]
        groups.append(("link", link, names, counts[n:], seconds[n:]))
    found: list[Influence] = []
    for group, key, names, count, time in groups:
        size = len(names)
        on_path = np.bincount(key, weights=count, minlength=size) / samples
        share = np.bincount(key, weights=time, minlength=size) / total
        present = np.bincount(key, minlength=size) > 0
        rows = [Influence(group, names[k], float(share[k]), float(on_path[k])) for k in np.flatnonzero(present)]
        found += sorted(rows, key=lambda r: -r.critical_share)
    return tuple(found)


def _top_ops(graph: TaskGraph, counts: np.ndarray, samples: int, top: int) -> tuple[tuple[str, int, float], ...]:
    """The ``top`` table entries most often on the critical path: (entry, device, share of
    samples); a fused entry is named whole (``counts`` hold it on its first part)."""
    order = np.argsort(-counts, kind="stable")[:top]
    rows = []
    for row in order.tolist():
        if counts[row] == 0:
            break
        entry = entry_of_row(graph.schedule, graph.ops, row)
        rows.append((str(entry), int(graph.ops.device[row]), float(counts[row] / samples)))
    return tuple(rows)


@dataclass(frozen=True)
class PairedComparison:
    """Schedules compared on common random numbers (sample i of each drawn from the same
    streams: ``pipesched.variability.sampling``)."""

    names: tuple[str, ...]  # by mean iteration time, fastest first
    mean: tuple[float, ...]
    p99: tuple[float, ...]
    fastest: tuple[float, ...]  # share of samples in which each is the fastest (ties shared)
    beats_next: tuple[float | None, ...]  # share of samples in which each is faster than the next by mean
    flip_share: float  # share of samples whose order of the schedules differs from the order by mean

    def to_dict(self) -> dict[str, object]:
        return {
            "rows": [{"schedule": name, "rank": k + 1, "mean_s": self.mean[k], "p99_s": self.p99[k],
                      "fastest_probability": self.fastest[k], "faster_than_next": self.beats_next[k]}
                     for k, name in enumerate(self.names)],
            "ranking_flip_share": self.flip_share,
        }


def paired_comparison(names: Sequence[str], makespans: Sequence[np.ndarray]) -> PairedComparison:
    """Rank schedules by mean iteration time; per sample, which is fastest and whether the
    order differs from the order by mean. Every array holds the same samples in order."""
    table = np.vstack([np.asarray(m, np.float64) for m in makespans])  # (schedules, samples)
    means = table.mean(axis=1)
    order = np.argsort(means, kind="stable")
    table = table[order]
    best = table.min(axis=0)
    # ties within rounding share the win
    winners = table <= best * (1 + 1e-12)
    fastest = (winners / winners.sum(axis=0)).mean(axis=1)
    beats = [float(np.mean(table[k] < table[k + 1])) for k in range(len(order) - 1)] + [None]
    flips = np.any(np.diff(table, axis=0) < 0, axis=0) if len(order) > 1 else np.zeros(table.shape[1], bool)
    return PairedComparison(
        names=tuple(names[k] for k in order),
        mean=tuple(float(x) for x in means[order]),
        p99=tuple(float(np.percentile(row, 99)) for row in table),
        fastest=tuple(float(x) for x in fastest),
        beats_next=tuple(beats),
        flip_share=float(flips.mean()),
    )
