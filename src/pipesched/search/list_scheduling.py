"""Memory-aware list scheduling: per-device op orders built forward in time by priority rules.

Each device keeps each op kind in microbatch order (``plans`` says why that loses nothing),
so at any moment it has at most one candidate per kind: its next F, I and W (or F and B).
A candidate is ready when its data has arrived (the rules' needs: each op it needs ended,
plus the link's delay from another stage), when the device's memory stays within the cap
after it (the rules' memory effects: an F's activations, an I's gradients kept for W beyond
the share it frees) and, for an F, when the device holds fewer than ``in_flight``
stage-microbatches. The device that can start an op earliest runs, among its candidates
that could start then, the first kind in its priority order (non-delay list scheduling);
then the next device, until every op is placed. Several rules (every priority order, every
in-flight limit the cap allows) are tried; the simulator (free channels) judges them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from pipesched.costs import StageCosts
from pipesched.ops import Op, OpKind
from pipesched.rules import RULES
from pipesched.search.plans import Plan
from pipesched.search.problem import BYTES_TOLERANCE, SynthesisProblem


def list_schedule(problem: SynthesisProblem, *, priority: tuple[OpKind, ...], in_flight: int,
                  recompute: frozenset[int] = frozenset()) -> Plan | None:
    """One rule's plan, or None when the rule gets stuck (the cap leaves no ready op)."""
    p, m = problem.num_stages, problem.num_microbatches
    costs = problem.costs.checkpointed(sorted(recompute))
    kinds = problem.kinds
    # a stage-microbatch is in flight from its first kind (F) until its last (W, or B) ends
    opens, closes = kinds[0], kinds[-1]
    rank = {kind: priority.index(kind) for kind in kinds}
    length = {kind: [costs.duration(Op(s, kind, 0)) for s in range(p)] for kind in kinds}
    inputs = {kind: [inputs_of(problem, kind, s) for s in range(p)] for kind in kinds}
    # bytes each op adds to its device's level (negative: frees), the rules' memory effect:
    # F allocates as it starts, I frees its share but keeps the gradients W needs, W and B
    # free the rest as they end; an op that raises the level runs only within the budget
    kept = costs.kept_for_w_bytes or (0.0,) * p
    change = {kind: [RULES[kind].memory.bytes(costs.activation_bytes[s], costs.input_frees, kept[s])
                     for s in range(p)] for kind in kinds}
    room = [None if (x := problem.activation_budget(s)) is None else x * (1 + BYTES_TOLERANCE) for s in range(p)]
    placed = [dict.fromkeys(kinds, 0) for _ in range(p)]
    free_at = [0.0] * p
    held = [0.0] * p  # activation bytes in use after the device's placed ops
    # end[kind][s][k]: when op (s, kind, k) ends, None until placed
    end = {kind: [[None] * m for _ in range(p)] for kind in kinds}
    tables: list[list[Op]] = [[] for _ in range(p)]

    def ready(s: int, kind: OpKind) -> float | None:
        """When device s's next op of ``kind`` has its data (None: not yet known, or the
        rule forbids it now)."""
        k = placed[s][kind]
        if k >= m:
            return None
        if room[s] is not None and change[kind][s] > 0 and held[s] + change[kind][s] > room[s]:
            return None
        if kind == opens and k - placed[s][closes] >= in_flight:
            return None
        # the latest arrival of its inputs: each needed op's end plus the link's delay
        arrival = 0.0
        for need, source, delay in inputs[kind][s]:
            ended = end[need][source][k]
            if ended is None:
                return None
            arrival = max(arrival, ended + delay)
        return arrival

    def choice(s: int) -> tuple[float, OpKind] | None:
        """Device s's earliest start and, among the ops that could start then, the first
        kind in priority order."""
        best = None
        for kind in kinds:
            t = ready(s, kind)
            if t is None:
                continue
            key = (max(t, free_at[s]), rank[kind])
            if best is None or key < best[0]:
                best = (key, kind)
        return None if best is None else (best[0][0], best[1])

    # a placement changes what its own device and its two neighbours can do next
    pending = [choice(s) for s in range(p)]
    for _ in range(p * m * len(kinds)):
        s = min((d for d in range(p) if pending[d] is not None), key=lambda d: pending[d][0], default=None)
        if s is None:
            return None
        begins, kind = pending[s]
        k = placed[s][kind]
        end[kind][s][k] = free_at[s] = begins + length[kind][s]
        placed[s][kind] = k + 1
        held[s] += change[kind][s]
        tables[s].append(Op(s, kind, k))
        for d in (s - 1, s, s + 1):
            if 0 <= d < p:
                pending[d] = choice(d)
    return Plan(tuple(tuple(t) for t in tables), recompute, source="list scheduling")


def rules(problem: SynthesisProblem, *, limits: int = 8) -> Iterator[tuple[tuple[OpKind, ...], int, frozenset[int]]]:
    """Every priority order of the kinds, with up to ``limits`` in-flight limits spread
    from 1 to the most the cap could hold, without and (if allowed) with recompute on every
    stage."""
    p, m = problem.num_stages, problem.num_microbatches
    recomputes = [frozenset()]
    if problem.allow_recompute:
        recomputes.append(frozenset(range(p)))
    for recompute in recomputes:
        costs = problem.costs.checkpointed(sorted(recompute))
        most = m
        for s in range(p):
            budget, least = problem.activation_budget(s), _least_held(problem, costs, s)
            if budget is not None and least > 0:
                most = min(most, max(1, math.floor(budget / least * (1 + BYTES_TOLERANCE))))
        chosen = sorted({round(1 + i * (most - 1) / max(1, limits - 1)) for i in range(min(limits, most))})
        for priority in itertools.permutations(problem.kinds):
            for in_flight in chosen:
                yield priority, in_flight, recompute


def inputs_of(problem: SynthesisProblem, kind: OpKind, stage: int) -> tuple[tuple[OpKind, int, float], ...]:
    """What an op of ``kind`` on ``stage`` waits for, the rules' needs: (the needed op's kind,
    its stage, seconds from its end until its output is on ``stage``) per need the problem has
    (a need past the first or last stage, or on kinds the problem runs none of, is none)."""
    found = []
    for need in RULES[kind].needs:
        source = stage + need.offset
        present = [k for k in need.kinds if k in problem.kinds]
        if 0 <= source < problem.num_stages and present:
            found.append((present[0], source, problem.delay(source, stage)))
    return tuple(found)


def _least_held(problem: SynthesisProblem, costs: StageCosts, stage: int) -> float:
    """The fewest bytes a microbatch in flight on ``stage`` holds (from its first op until its
    last ends), along its ops' memory effects: with a split backward, after I the part W
    still needs and the gradients I kept for it."""
    kept = costs.kept_for_w_bytes[stage] if costs.kept_for_w_bytes is not None else 0.0
    levels = list(itertools.accumulate(RULES[kind].memory.bytes(costs.activation_bytes[stage], costs.input_frees,
                                                                 kept) for kind in problem.kinds[:-1]))
    return min(levels, default=0.0)
