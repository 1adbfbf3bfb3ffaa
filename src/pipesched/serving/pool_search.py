"""Placing a pool's models: AlpaServe's greedy placement against the simulator, and the
baselines it is measured against (one model per device group, round-robin).

Greedy (AlpaServe's "greedy selection" of model replicas against the simulator): from an
empty pool, add the one replica that raises the pool's SLO attainment most, simulated: a
model onto a group that holds others (together, or as a swap group), or onto a new group of
one of its TP x PP shapes cut from the free devices (the first free run of tp x pp ranks
starting at a multiple of tp x pp, so a group stays inside a node); stop when no addition
raises it (an unplaced model's first replica counts as a gain while it lowers nothing).
The partition into groups of mixed shapes comes out of the search. A group's run depends
only on its devices, its models and which of each model's requests reach it, so each
group's result is kept by that key and a candidate re-simulates only the groups it changes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipesched.errors import PipeschedError
from pipesched.serving.placement import (
    DeviceGroup,
    PoolPlacement,
    admits,
    empty_groups,
    footprint,
    run_groups,
)
from pipesched.serving.pool import PoolSpec
from pipesched.serving.results import meets_slos, request_latencies

PLACEMENTS = ("greedy", "dedicated", "round-robin")


class Scores:
    """The pool's SLO attainment of placements, each group's run simulated once per key."""

    def __init__(self, pool: PoolSpec) -> None:
        self.pool = pool
        self.runs = 0  # group runs simulated
        self._met: dict[tuple, dict[int, int] | None] = {}

    def group(self, placement: PoolPlacement, g: int) -> dict[int, int] | None:
        """Requests meeting their SLOs per model of group g (None: the group cannot serve them)."""
        group = placement.groups[g]
        key = (group.first_rank, group.tp, group.pp, group.models, group.swapped,
               tuple((placement.replicas(m).index(g), len(placement.replicas(m))) for m in group.models))
        if key not in self._met:
            self._met[key] = self._simulate(placement, g)
        return self._met[key]

    def _simulate(self, placement: PoolPlacement, g: int) -> dict[int, int] | None:
        self.runs += 1
        try:
            pooled = run_groups(self.pool, placement, [g])
        except PipeschedError:
            return None
        run = pooled.run
        ttft, tpot = request_latencies(run.trace.arrived_at, run.first_token_at, run.finished_at, run.token_offsets)
        met = {}
        for m in placement.groups[g].models:
            traffic, mine = self.pool.models[m], pooled.model == m
            met[m] = int(meets_slos(ttft[mine], tpot[mine], traffic.slo_ttft_s, traffic.slo_tpot_s).sum())
        return met

    def score(self, placement: PoolPlacement) -> tuple[int, int] | None:
        """(requests meeting their SLOs, models placed); None when a group cannot serve its share."""
        met = 0
        for g, group in enumerate(placement.groups):
            if group.models:
                counts = self.group(placement, g)
                if counts is None:
                    return None
                met += sum(counts.values())
        placed = len({m for group in placement.groups for m in group.models})
        return met, placed

    def attainment(self, placement: PoolPlacement) -> float:
        score = self.score(placement)
        total = sum(len(m.trace) for m in self.pool.models)
        return score[0] / total if score and total else 0.0


def shapes(pool: PoolSpec) -> tuple[tuple[int, int], ...]:
    """Every (TP, PP) shape some model allows that the pool has devices for, smallest first."""
    found = {shape for traffic in pool.models for shape in traffic.shapes
             if shape[0] * shape[1] <= pool.cluster.num_devices}
    return tuple(sorted(found, key=lambda shape: (shape[0] * shape[1], shape)))


def check_placeable(pool: PoolSpec) -> None:
    """Every model fits some group of a shape it allows (alone, with its minimum KV cache)."""
    for m, traffic in enumerate(pool.models):
        fits = any(footprint(pool, m, empty_groups(pool, tp, pp)[0]) is not None
                   for tp, pp in traffic.shapes if tp * pp <= pool.cluster.num_devices)
        if not fits:
            allowed = ", ".join(f"{tp}x{pp}" for tp, pp in traffic.shapes)
            raise PipeschedError(f"model={traffic.name}: {traffic.model.name} fits no device group of its shapes "
                                 f"({allowed}) on {pool.cluster.name} with its weights, workspace and one request "
                                 "of its longest context; allow larger TPxPP shapes or give a larger pool")


def greedy(pool: PoolSpec, scores: Scores | None = None) -> PoolPlacement:
    """The greedy placement (module docstring)."""
    scores = scores or Scores(pool)
    placement = PoolPlacement("greedy", ())
    current = scores.score(placement)
    while True:
        best = None
        for candidate in _candidates(pool, placement):
            score = scores.score(candidate)
            if score is not None and (best is None or score > best[0]):
                best = (score, candidate)
        if best is None or best[0] <= current:
            return placement
        current, placement = best


def _candidates(pool: PoolSpec, placement: PoolPlacement) -> list[PoolPlacement]:
    """``placement`` with one more replica: each model on each group that admits it, or on a
    new group of each of its shapes."""
    out = []
    for m, traffic in enumerate(pool.models):
        for g, group in enumerate(placement.groups):
            if (group.tp, group.pp) not in traffic.shapes:
                continue
            swapped = admits(pool, group, m, swap=True)
            if swapped is not None:
                out.append(placement.placing(g, m, swapped))
        for tp, pp in traffic.shapes:
            group = _free_group(pool, placement, tp, pp)
            if group is not None and footprint(pool, m, group) is not None:
                out.append(placement.adding(DeviceGroup(group.first_rank, tp, pp, (m,))))
    return out


def _free_group(pool: PoolSpec, placement: PoolPlacement, tp: int, pp: int) -> DeviceGroup | None:
    """The first free run of ``tp x pp`` ranks from a multiple of ``tp x pp``; None when none."""
    size = tp * pp
    taken = np.zeros(pool.cluster.num_devices, np.bool_)
    for group in placement.groups:
        taken[group.first_rank:group.first_rank + group.size] = True
    for first in range(0, pool.cluster.num_devices - size + 1, size):
        if not taken[first:first + size].any():
            return DeviceGroup(first, tp, pp)
    return None


def dedicated(pool: PoolSpec, scores: Scores | None = None) -> PoolPlacement:
    """One model per device group: the pool's devices split evenly between the models (the
    first get one more when they do not divide), each share cut into replicas of the
    model's smallest shape that fits it."""
    n, count = pool.cluster.num_devices, len(pool.models)
    groups, rank = [], 0
    for m in range(count):
        end = rank + n // count + (1 if m < n % count else 0)
        shape = _smallest_fitting(pool, m, rank)
        while shape is not None:
            tp, pp = shape
            first = -(-rank // tp) * tp  # a stage's tensor-parallel group starts on a multiple of tp
            if first + tp * pp > end or footprint(pool, m, DeviceGroup(first, tp, pp)) is None:
                break
            groups.append(DeviceGroup(first, tp, pp, (m,)))
            rank = first + tp * pp
        rank = end
    return PoolPlacement("dedicated", tuple(groups))


def _smallest_fitting(pool: PoolSpec, m: int, rank: int) -> tuple[int, int] | None:
    for tp, pp in sorted(pool.models[m].shapes, key=lambda shape: (shape[0] * shape[1], shape)):
        first = -(-rank // tp) * tp
        if first + tp * pp <= pool.cluster.num_devices and footprint(pool, m, DeviceGroup(first, tp, pp)):
            return tp, pp
    return None


def round_robin(pool: PoolSpec, scores: Scores | None = None) -> PoolPlacement:
    """The models dealt in turn onto groups of one shape, each to the next group (cyclically)
    it fits on together with the models there, round after round until none fits; the shape
    of the best attainment."""
    scores = scores or Scores(pool)
    return _best(scores, [_round_robin(pool, shape) for shape in shapes(pool)], "round-robin")


def _round_robin(pool: PoolSpec, shape: tuple[int, int]) -> PoolPlacement:
    placement = PoolPlacement("round-robin", empty_groups(pool, *shape))
    allowed = [m for m, traffic in enumerate(pool.models) if shape in traffic.shapes]
    turn, placed = 0, True
    while placed:
        placed = False
        for m in allowed:
            for step in range(len(placement.groups)):
                g = (turn + step) % len(placement.groups)
                if admits(pool, placement.groups[g], m, swap=False) is False:
                    placement, turn, placed = placement.placing(g, m, False), g + 1, True
                    break
    return placement


def _best(scores: Scores, placements: list[PoolPlacement], method: str) -> PoolPlacement:
    """The placement of the highest score (the first on a tie); an empty one when none."""
    best, best_score = PoolPlacement(method, ()), (0, 0)
    for placement in placements:
        score = scores.score(placement)
        if score is not None and score > best_score:
            best, best_score = placement, score
    return best


PLACE: dict[str, Callable[..., PoolPlacement]] = {"greedy": greedy, "dedicated": dedicated,
                                                  "round-robin": round_robin}


def place(pool: PoolSpec, method: str, scores: Scores | None = None) -> PoolPlacement:
    """``pool`` placed by ``method`` (``PLACEMENTS``)."""
    return PLACE[method](pool, scores)

