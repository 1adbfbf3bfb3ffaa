"""The best built-in schedule family for a synthesis problem: what the solver must beat.

Candidates are the registered families whose table puts one stage on each device and has
the problem's backward form (I and W, or B), as generated, and, for families that take
per-stage costs and a memory limit (the zero-bubble heuristic), generated with the
problem's costs and the in-flight count the cap allows. With recompute allowed each is also
tried with every stage recomputed. Each is simulated with free channels; the fastest that
fits the cap wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.schedule import Placement, Schedule
from pipesched.search.plans import Evaluation, Plan, evaluate, fits, in_microbatch_order
from pipesched.search.problem import SynthesisProblem


@dataclass(frozen=True, eq=False)
class Baseline:
    """A built-in family's schedule under the problem's cap.

    family: its name; options: what it was generated with (besides p and m);
    evaluation: its simulation (with free channels).
    """

    family: str
    options: dict[str, object]
    evaluation: Evaluation

    @property
    def makespan(self) -> float:
        return self.evaluation.makespan

    @property
    def label(self) -> str:
        """``zb-h1`` or ``zb-h1 (activation_limit=4, costs, stage checkpoints 0-7)``."""
        shown = [f"{k}={v}" if k != "costs" else k for k, v in self.options.items()]
        if self.evaluation.plan.recompute:
            shown.append(f"stage checkpoints {_stages(self.evaluation.plan.recompute)}")
        return f"{self.family} ({', '.join(shown)})" if shown else self.family


def _stages(stages: frozenset[int]) -> str:
    ordered = sorted(stages)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def in_flight_allowed(problem: SynthesisProblem) -> int | None:
    """Stage-microbatches every device can hold under the cap (None: no cap); at most m, all
    there are of its one stage (a larger memory limit builds the same table)."""
    if problem.memory_limit is None:
        return None
    m = problem.num_microbatches
    counts = []
    for s in range(problem.num_stages):
        activation = problem.costs.activation_bytes[s]
        budget = problem.activation_budget(s)
        counts.append(m if activation <= 0 else min(m, int(budget // activation)))
    return max(1, min(counts))


def candidates(problem: SynthesisProblem) -> list[tuple[str, dict[str, object], Schedule]]:
    """(family, options, schedule) of every candidate (see the module docstring)."""
    p, m = problem.num_stages, problem.num_microbatches
    limit = in_flight_allowed(problem)
    found = []
    for name, family in FAMILIES.items():
        if family.asynchronous:
            continue  # no flushed iteration to compare with
        variants: list[dict[str, object]] = [{}]
        if "costs" in family.options and "activation_limit" in family.options:
            variants.append({"costs": problem.costs, **({"activation_limit": limit} if limit is not None else {})})
        for options in variants:
            try:
                schedule = generate(name, p, m, **options)
            except PipeschedError:
                continue
            # the problem's microbatches, one stage per device (TeraPipe's token slices are
            # microbatches of their own, not the problem's)
            if (schedule.placement == Placement.one_per_device(p) and schedule.num_microbatches == m
                    and schedule.splits_backward == problem.split_backward):
                found.append((name, dict(options), schedule))
    return found


def best_family(problem: SynthesisProblem) -> Baseline | None:
    """The fastest fitting candidate (see the module docstring), or None when none fits."""
    every_stage = frozenset(range(problem.num_stages))
    best: Baseline | None = None
    for name, options, schedule in candidates(problem):
        for recompute in (frozenset(), every_stage) if problem.allow_recompute else (frozenset(),):
            plan = Plan(in_microbatch_order(schedule.device_ops), recompute, source=name)
            evaluation = evaluate(problem, plan)
            if fits(problem, evaluation) and (best is None or evaluation.makespan < best.makespan):
                best = Baseline(name, options, evaluation)
    return best
