"""A prediction and a measurement of the same schedule, op by op: which measured row is each
predicted op's counterpart, and how far it moved.

Both timelines hold every op of the schedule once, but in different row orders (a
simulated timeline follows the table, a measured one the order the ops really ran), so ops
are matched by identity: (device, stage, kind, microbatch). Times are taken from each
timeline's own start (its first op), so a run that began at some clock reading lines up
with a simulation that begins at 0.

The prediction error, one sign everywhere (the check's terminal table, ``--json``, the
comparison page): error = (predicted - measured) / measured (``prediction_error``),
positive when the prediction is longer than the run (it over-predicts), negative when the
run is slower than predicted. Differences take the same sign, predicted - measured.

Deviation of an op: ``duration`` = predicted duration - measured duration (the op's own
error); ``start`` = predicted start - measured start (what the ops before it accumulated);
``relative`` = the duration's prediction error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import require
from pipesched.timeline import Timeline


def prediction_error(predicted: float | np.ndarray, measured: float | np.ndarray) -> float | np.ndarray:
    """(predicted - measured) / measured: the one sign of every prediction error (the module
    docstring); floats or arrays (nan where ``measured`` is not above 0)."""
    predicted, measured = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        error = np.where(measured > 0, (predicted - measured) / measured, np.nan)
    return float(error) if error.ndim == 0 else error


# the timelines part at the first op whose measured start is off its predicted start by
# more than this share of the predicted iteration time
PARTING_SHARE = 0.05


@dataclass(frozen=True)
class Comparison:
    """One schedule's predicted timeline, its measured one, and the measured step times."""

    predicted: Timeline
    measured: Timeline
    step_times: tuple[float, ...] = ()  # seconds, every measured step
    # seconds: the prediction's Monte Carlo p50 and p99 (every op drawn from its profiled
    # repeats), beside the deterministic prediction ``predicted.makespan``; None without repeats
    predicted_p50: float | None = None
    predicted_p99: float | None = None

    def __post_init__(self) -> None:
        require(self.predicted.schedule.name == self.measured.schedule.name, "measured",
                self.measured.schedule.name, f"must be a run of {self.predicted.schedule.name}")
        require(self.predicted.unit == self.measured.unit, "measured", self.measured.unit,
                f"must be in the predicted timeline's unit ({self.predicted.unit})")


@dataclass(frozen=True)
class Deviations:
    """Per predicted op row: its measured counterpart and the differences (timeline unit)."""

    partner: np.ndarray  # int64, measured row of each predicted row, -1 when it did not run
    predicted_start: np.ndarray  # float64, from the predicted timeline's start
    measured_start: np.ndarray  # float64, from the measured timeline's start (nan without partner)
    predicted_duration: np.ndarray
    measured_duration: np.ndarray
    start: np.ndarray  # predicted - measured start
    duration: np.ndarray  # predicted - measured duration

    @property
    def relative(self) -> np.ndarray:
        """Each op's duration error, (predicted - measured) / measured (nan where the
        measured duration is 0 or missing)."""
        return prediction_error(self.predicted_duration, self.measured_duration)

    def largest(self, count: int) -> np.ndarray:
        """Predicted rows with a counterpart, by decreasing absolute duration deviation (ties:
        row order), at most ``count`` of them."""
        rows = np.flatnonzero(self.partner >= 0)
        order = np.lexsort((rows, -np.abs(self.duration[rows])))
        return rows[order][:count]


    def parting(self, span: float, share: float = PARTING_SHARE) -> int:
        """The predicted row, earliest by predicted start (ties: row order), whose measured
        start is off its predicted start by more than ``share`` x ``span``; -1 if none."""
        off = np.flatnonzero((self.partner >= 0) & (np.abs(np.nan_to_num(self.start)) > share * span))
        if not len(off):
            return -1
        return int(off[np.lexsort((off, self.predicted_start[off]))][0])


@dataclass(frozen=True)
class KindError:
    """The duration error of one op kind: (predicted - measured) / measured, per op."""

    kind: int  # position in rules.RULES
    count: int  # ops of the kind with a counterpart and a measured duration above 0
    mean: float  # mean relative error
    median: float  # median relative error
    total: float  # predicted - measured duration summed over the kind's ops (timeline unit)


def kind_errors(predicted: Timeline, found: Deviations) -> list[KindError]:
    """Per op kind of the prediction (its ``op_kind``), in kind order, how far the measured
    durations are from the predicted ones."""
    relative = found.relative
    rows = []
    for kind in np.unique(predicted.op_kind).tolist():
        mine = (predicted.op_kind == kind) & (found.partner >= 0)
        shares = relative[mine & ~np.isnan(relative)]
        if not len(shares):
            continue
        rows.append(KindError(int(kind), len(shares), float(shares.mean()), float(np.median(shares)),
                              float(np.nansum(found.duration[mine]))))
    return rows


def _keys(timeline: Timeline, sizes: tuple[int, int, int]) -> np.ndarray:
    """One int64 per op row: (device, stage, kind, microbatch) in mixed radix."""
    stages, kinds, microbatches = sizes
    return ((timeline.op_device.astype(np.int64) * stages + timeline.op_stage) * kinds
            + timeline.op_kind) * microbatches + timeline.op_microbatch


def partners(predicted: Timeline, measured: Timeline) -> np.ndarray:
    """The measured row of each predicted row's op (same device, stage, kind, microbatch), or
    -1 where the measurement lacks it."""
    both = (predicted, measured)
    sizes = tuple(1 + max(int(column(t).max(initial=0)) for t in both)
                  for column in (lambda t: t.op_stage, lambda t: t.op_kind, lambda t: t.op_microbatch))
    wanted, have = _keys(predicted, sizes), _keys(measured, sizes)
    partner = np.full(len(wanted), -1, np.int64)
    if not len(have):
        return partner
    order = np.argsort(have, kind="stable")
    position = np.minimum(np.searchsorted(have[order], wanted), len(order) - 1)
    found = have[order][position] == wanted
    partner[found] = order[position[found]]
    return partner


def deviations(predicted: Timeline, measured: Timeline) -> Deviations:
    """How far each op of ``measured`` lies from its prediction (see the module docstring)."""
    partner = partners(predicted, measured)
    has = partner >= 0
    taken = np.where(has, partner, 0)

    def measured_column(values: np.ndarray) -> np.ndarray:
        return np.where(has, values[taken], np.nan) if len(measured) else np.full(len(partner), np.nan)

    predicted_start = predicted.op_start - predicted.origin
    predicted_duration = predicted.op_end - predicted.op_start
    measured_start = measured_column(measured.op_start - measured.origin)
    measured_duration = measured_column(measured.op_end - measured.op_start)
    return Deviations(partner, predicted_start, measured_start, predicted_duration, measured_duration,
                      predicted_start - measured_start, predicted_duration - measured_duration)


def comparison_pairs(comparisons: Sequence[Comparison]) -> list[tuple[Timeline, Timeline]]:
    """(predicted, measured) of each comparison."""
    return [(c.predicted, c.measured) for c in comparisons]
