"""Schedule synthesis: the fastest one-stage-per-device schedule under a memory cap.

``synthesize`` runs, within one time limit:

1. the baseline: the best built-in family under the cap (``baseline``);
2. memory-aware list scheduling with several priority rules (``list_scheduling``);
3. the CP-SAT model (``cpsat``), warm-started from the best of 1 and 2; its bound is the
   lower bound reported;
4. when the solver does not prove optimality: local search from the best schedule so far
   (``local_search``), for the time left.

Every candidate is timed by the simulator with free channels
(``simulate(schedule, costs, network, contention=False)``): the solver models each
transfer's latency and bandwidth but not transfers queueing behind each other on a link,
so the makespan reported is the contention-free one; simulate the schedule with contention
to see what queueing adds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pipesched.costs import StageCosts
from pipesched.enums import SolverStatus
from pipesched.errors import PipeschedError
from pipesched.limits import MAX_TIMEOUT_S, check_amount
from pipesched.schedule import Execution, Schedule
from pipesched.search.baseline import Baseline, best_family
from pipesched.search.cpsat import SolverOutcome, require_solver, solve
from pipesched.search.list_scheduling import list_schedule, rules
from pipesched.search.local_search import improve
from pipesched.search.plans import Evaluation, evaluate, fits, to_schedule
from pipesched.search.problem import (
    TIME_RESOLUTION,
    IntegerProblem,
    SynthesisProblem,
)
from pipesched.simulate.network import Network
from pipesched.timeline import Timeline

# share of the time left that the solver gets; local search has the rest if it is needed
SOLVER_SHARE = 0.8
# share of the time limit list scheduling may use before the solver starts
LIST_SCHEDULING_SHARE = 0.1


@dataclass(frozen=True, eq=False)
class SynthesisResult:
    """A synthesized schedule and how good it is.

    schedule: one stage per device; its params name the stages it checkpoints
        (``Schedule.recompute_stages``). costs: the problem's costs with those checkpoints
        applied (``StageCosts.checkpointed``), what ``simulate(schedule, costs, ...)`` needs.
    timeline: its simulation with free channels (what the solver models).
    status: "optimal" (the solver proved no order beats it on its time grid) or "feasible".
    method: what made the schedule: "solver", "local search", "list scheduling", or the
        baseline family when nothing beat it.
    makespan_s: its iteration time, seconds (the simulator's).
    lower_bound_s: no schedule is faster: the solver's bound on its grid, durations rounded
        down. With ``memory_exact`` false (activation shares that are no whole number of
        the memory grid's units) it holds for a cap lower by less than one unit (a byte
        for whole-byte sizes) per microbatch in flight.
    solver_status, solver_makespan_s: what the solver returned (its own answer's makespan
        on its grid, None without one).
    seconds: wall time of the whole synthesis.
    baseline: the best built-in family under the same cap (None when none fits).
    recompute: stages with a stage checkpoint (they keep their input and redo their forward
        in the backward); offload: stages that offload their activations to host memory
        (their O and R ops are in the schedule).
    time_unit_s: the solver's time grid step; time_exact: every duration and delay lies on
        it (then "optimal" holds for the true durations too, not only on the grid).
    memory_exact, memory_limit: see lower_bound_s; bytes per device (None: no cap).
    """

    schedule: Schedule
    costs: StageCosts
    timeline: Timeline
    status: SolverStatus
    method: str
    makespan_s: float
    lower_bound_s: float
    solver_status: SolverStatus
    solver_makespan_s: float | None
    seconds: float
    baseline: Baseline | None
    recompute: tuple[int, ...]
    time_unit_s: float
    time_exact: bool
    memory_exact: bool
    memory_limit: tuple[float, ...] | None
    offload: tuple[int, ...] = ()

    @property
    def gap(self) -> float:
        """(makespan - lower bound) / makespan."""
        return (self.makespan_s - self.lower_bound_s) / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def speedup_over_baseline(self) -> float | None:
        """The best built-in family's makespan over this one's (1 when both take no time);
        None when no family fits."""
        if self.baseline is None:
            return None
        return self.baseline.makespan / self.makespan_s if self.makespan_s > 0 else 1.0

    def to_dict(self) -> dict:
        """The JSON form (``pipesched synthesize --json``)."""
        baseline = None
        if self.baseline is not None:
            baseline = {"family": self.baseline.family, "label": self.baseline.label,
                        "makespan_s": self.baseline.makespan,
                        "peak_memory_bytes": list(self.baseline.evaluation.peak_memory)}
        return {
            "status": self.status,
            "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "seconds": self.seconds,
            "baseline": baseline,
            "speedup_over_baseline": self.speedup_over_baseline,
            "method": self.method,
            "solver_status": self.solver_status,
            "solver_makespan_s": self.solver_makespan_s,
            "time_unit_s": self.time_unit_s,
            "time_exact": self.time_exact,
            "memory_exact": self.memory_exact,
            "p": self.schedule.num_devices,
            "m": self.schedule.num_microbatches,
            "backward": "split" if self.schedule.splits_backward else "full",
            "recompute_stages": list(self.recompute),
            "offload_stages": list(self.offload),
            "host_peak_memory_bytes": list(self.timeline.host_memory.peak) if self.timeline.host_memory else None,
            "memory_limit_bytes": list(self.memory_limit) if self.memory_limit is not None else None,
            "peak_memory_bytes": list(self.timeline.memory.peak),
            "contention": False,
        }


def synthesize(
    costs: StageCosts,
    network: Network,
    num_microbatches: int,
    *,
    memory_limit: float | Sequence[float] | None = None,
    split_backward: bool = True,
    allow_recompute: bool = False,
    allow_offload: bool = False,
    time_limit: float = 10.0,
    resolution: int = TIME_RESOLUTION,
    workers: int | None = None,
    memory_rule: str = "counting",
    seed: int = 0,
) -> SynthesisResult:
    """The fastest schedule found for ``costs`` (stage s on device s) on ``network`` with
    ``num_microbatches`` microbatches, within ``time_limit`` seconds.

    memory_limit: bytes per device (one value for all, or one per device), static bytes
        included; None for no cap.
    split_backward: I and W ops (True) or one B per stage-microbatch.
    allow_recompute: let the solver recompute stages (see ``search.problem``).
    allow_offload: let the solver offload stages' activations over the devices' host links
        (``network.host_bandwidth``; see ``search.problem``).
    resolution: time units the longest op spans on the solver's grid.
    workers: CP-SAT search workers (default: its own choice).
    memory_rule: how the solver writes the memory cap, "counting" or "reservoir" (the same
        rule; see ``search.cpsat``).
    seed: of the local search's move order.

    >>> from pipesched.costs import StageCosts
    >>> from pipesched.simulate import Network
    >>> result = synthesize(StageCosts.uniform(2), Network.uniform(2, latency=0.0, bandwidth=1.0), 2,
    ...                     memory_limit=1.0, time_limit=5.0)
    >>> result.status, result.makespan_s, result.lower_bound_s
    ('optimal', 10.0, 10.0)
    """
    began = time.perf_counter()
    require_solver()
    check_amount("time_limit", time_limit, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")
    p = costs.num_stages
    if memory_limit is not None:
        limits = (float(memory_limit),) * p if isinstance(memory_limit, int | float) else tuple(map(float, memory_limit))
    else:
        limits = None
    problem = SynthesisProblem(costs, network, num_microbatches, limits, split_backward=split_backward,
                               allow_recompute=allow_recompute, allow_offload=allow_offload)
    grid = IntegerProblem.build(problem, resolution=resolution)

    baseline = best_family(problem)
    best = _best_start(problem, baseline, deadline=began + LIST_SCHEDULING_SHARE * time_limit)
    left = time_limit - (time.perf_counter() - began)
    outcome = solve(grid, hint=best.plan if best is not None else None, time_limit=SOLVER_SHARE * left,
                    workers=workers, memory_rule=memory_rule)
    # proven: the solver closed its model and its plan fits as the simulator counts memory
    proven = False
    if outcome.plan is not None:
        found = evaluate(problem, outcome.plan)
        proven = outcome.status == SolverStatus.OPTIMAL and fits(problem, found)
        if fits(problem, found) and (best is None or found.makespan <= best.makespan):
            best = found
    if best is None:
        raise PipeschedError(f"memory_limit={_bytes(limits)}: no schedule found that fits; raise the limit"
                             f"{'' if allow_recompute else ' or allow recompute'}, or give more time")
    if not proven:
        best = improve(problem, best, seconds=time_limit - (time.perf_counter() - began), seed=seed)
    return _result(problem, grid, best, outcome, baseline, began, proven=proven)


def _best_start(problem: SynthesisProblem, baseline: Baseline | None, *, deadline: float) -> Evaluation | None:
    """The fastest fitting plan of the baseline and the list-scheduling rules."""
    best = baseline.evaluation if baseline is not None else None
    for priority, in_flight, recompute in rules(problem):
        if best is not None and time.perf_counter() > deadline:
            break
        plan = list_schedule(problem, priority=priority, in_flight=in_flight, recompute=recompute)
        if plan is None:
            continue
        candidate = evaluate(problem, plan)
        if fits(problem, candidate) and (best is None or candidate.makespan < best.makespan):
            best = candidate
    return best


def _bytes(limits: tuple[float, ...] | None) -> str:
    if limits is None:
        return "none"
    return f"{limits[0]:.6g}" if len(set(limits)) == 1 else ",".join(f"{x:.6g}" for x in limits)


def _result(problem: SynthesisProblem, grid: IntegerProblem, best: Evaluation, outcome: SolverOutcome,
            baseline: Baseline | None, began: float, *, proven: bool) -> SynthesisResult:
    plan = best.plan
    method = plan.source
    # ops rounded up to one unit may each have lengthened the solver's makespan by a unit
    lower_bound = min(max(0, outcome.bound - grid.raised_ops) * grid.time_unit, best.makespan)
    recompute = tuple(sorted(plan.recompute))
    params: dict[str, object] = {"p": problem.num_stages, "m": problem.num_microbatches,
                                 "solver": outcome.status, "method": method}
    offload = tuple(sorted(plan.offload))
    execution = Execution(recompute_stages=recompute, offload_stages=offload)
    schedule = to_schedule(problem, plan, name="synthesized", params=params, execution=execution)
    return SynthesisResult(
        schedule=schedule,
        costs=problem.costs.checkpointed(recompute),
        timeline=best.timeline,
        status=SolverStatus.OPTIMAL if proven else SolverStatus.FEASIBLE,
        method=method,
        makespan_s=best.makespan,
        lower_bound_s=lower_bound,
        solver_status=outcome.status,
        solver_makespan_s=outcome.objective * grid.time_unit if outcome.objective is not None else None,
        seconds=time.perf_counter() - began,
        baseline=baseline,
        recompute=recompute,
        time_unit_s=grid.time_unit,
        time_exact=grid.exact_time,
        memory_exact=grid.memory_exact,
        memory_limit=problem.memory_limit,
        offload=offload,
    )
