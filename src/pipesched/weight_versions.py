"""Weight versions and staleness, measured on a timeline of several iterations.

A stage updates its weights once per *update batch* of ``update_every`` consecutive
microbatches (the iteration's m for synchronous and PipeDream-2BW training, 1 for
PipeDream), when the batch's last weight-gradient op on the stage ends (W, or B when the
backward is not split). Every microbatch of a batch runs its forward and its backward with
the weights the stage had when the batch's first forward there started (weight stashing), so:

- version of batch b on stage s: the number of the stage's updates that had ended when the
  batch's first forward on s started, or, for a family that trains with a fixed delay d
  (PipeDream-2BW: d = 1, every batch on the weights one update behind), b - d;
- staleness of batch b on stage s: b minus that version, the updates a synchronous run would
  have applied first and this one had not (0 for a flushed pipeline, p - s - 1 on stage s for
  PipeDream in steady state, 1 for PipeDream-2BW);
- versions a stage keeps: the most distinct versions in use at once when a new batch
  starts: the stashed weights of every batch still in flight on it, the new batch's, and
  the newest weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.dependencies import rule_arrays
from pipesched.errors import require
from pipesched.rules import AT_START
from pipesched.timeline import Timeline


@dataclass(frozen=True)
class WeightVersions:
    """Versions and staleness of one multi-iteration timeline (see the module docstring)."""

    update_every: int  # microbatches per weight update
    versions: tuple[int, ...]  # per stage: the most weight versions in use at once
    staleness: tuple[tuple[int, ...], ...]  # [stage][batch]: updates behind a synchronous run
    steady_from_batch: int  # the first batch of the steady state (of the second iteration)

    @property
    def max_staleness(self) -> int:
        return max((max(row, default=0) for row in self.staleness), default=0)

    @property
    def mean_staleness(self) -> float:
        """Mean over the steady state's batches and stages (after the first iteration)."""
        values = [x for row in self.staleness for x in row[self.steady_from_batch:]]
        if not values:
            values = [x for row in self.staleness for x in row]
        return float(np.mean(values)) if values else 0.0

    def to_dict(self) -> dict:
        return {"update_every": self.update_every, "versions": list(self.versions),
                "max_staleness": self.max_staleness, "mean_staleness": self.mean_staleness,
                "staleness_per_stage": [max(row, default=0) for row in self.staleness]}


def weight_versions(timeline: Timeline, *, update_every: int, delay: int = 0,
                    iteration_microbatches: int | None = None) -> WeightVersions:
    """Versions and staleness of every stage of ``timeline`` with one weight update per
    ``update_every`` microbatches and a fixed ``delay`` (0: the newest weights;
    ``iteration_microbatches``, when given, marks where the steady state begins: the second
    iteration).

    >>> from pipesched.generators import generate
    >>> from pipesched.slots import slot_table
    >>> found = weight_versions(slot_table(generate("pipedream", 3, 6, iterations=2)), update_every=1)
    >>> found.versions, [max(row) for row in found.staleness]
    ((3, 2, 1), [2, 1, 0])
    """
    require(isinstance(update_every, int) and update_every >= 1, "update_every", update_every,
            "give a whole number of microbatches per weight update")
    rules = timeline.schedule.rules
    arrays = rule_arrays(rules)
    forward = np.array([rule.memory.at == AT_START and rule.memory.whole > 0 for rule in rules], np.bool_)
    ends = arrays.ends_weight_gradient
    batch_of = timeline.op_microbatch.astype(np.int64) // update_every
    batches = int(batch_of.max(initial=-1)) + 1
    versions: list[int] = []
    staleness: list[tuple[int, ...]] = []
    stages = timeline.schedule.num_stages
    # per (stage, batch): when its first forward starts and when its update (its last
    # weight-gradient op) ends
    key = timeline.op_stage.astype(np.int64) * max(batches, 1) + batch_of
    kinds = timeline.op_kind
    first_forwards = np.full(stages * max(batches, 1), np.inf)
    np.minimum.at(first_forwards, key[forward[kinds]], timeline.op_start[forward[kinds]])
    updates_of = np.full(stages * max(batches, 1), -np.inf)
    np.maximum.at(updates_of, key[ends[kinds]], timeline.op_end[ends[kinds]])
    first_forwards = first_forwards.reshape(stages, max(batches, 1))
    updates_of = updates_of.reshape(stages, max(batches, 1))
    for stage in range(stages):
        first_forward, update = first_forwards[stage], updates_of[stage]
        present = np.isfinite(first_forward) & np.isfinite(update)
        starts, updates = first_forward[present], update[present]
        index = np.flatnonzero(present)
        # updates ended by each batch's first forward (a tolerance for equal float times)
        tolerance = 1e-12 * max(float(np.abs(updates).max(initial=0.0)), 1.0)
        newest = np.searchsorted(np.sort(updates), starts + tolerance, side="right")
        version = np.minimum(newest, np.maximum(index - delay, 0)) if delay else newest
        staleness.append(tuple(int(x) for x in index - version))
        versions.append(_most_versions_held(starts, updates, version, newest, tolerance))
    steady = (iteration_microbatches // update_every) if iteration_microbatches else 0
    return WeightVersions(update_every, tuple(versions), tuple(staleness), steady)


def _most_versions_held(starts: np.ndarray, updates: np.ndarray, version: np.ndarray, newest: np.ndarray,
                        tolerance: float) -> int:
    """The most weight versions a stage holds as one of its batches starts: the versions of
    the batches in flight then (started, their update not yet done; the batch itself
    included) and the newest weights."""
    if not len(starts):
        return 1
    # in_flight[b, j]: batch j is in flight when batch b starts
    in_flight = (starts[None, :] <= starts[:, None]) & (updates[None, :] > starts[:, None] + tolerance)
    np.fill_diagonal(in_flight, True)
    held = np.concatenate([np.where(in_flight, version[None, :], -1), newest[:, None]], axis=1)
    held.sort(axis=1)
    distinct = 1 + np.count_nonzero(np.diff(held, axis=1), axis=1) - (held[:, 0] < 0)
    return max(1, int(distinct.max()))
