"""The CP-SAT model of schedule synthesis, as a job shop (OR-Tools' job-shop sample).

Machines are devices (stage s on device s); jobs are microbatches; each op is an interval on
its device. In the order the code builds it:

    data         op lengths and transfer delays on the time grid, memory on its grid
    variables    an interval per op; with recompute allowed, a yes/no per stage that
                 lengthens its I (or B) by the forward and shrinks what F keeps
    constraints  no overlap per device; F -> I -> W on a stage; F(s) -> F(s+1) and
                 I/B(s+1) -> I/B(s) with the link's delay; each kind in microbatch order
                 on every stage (``plans`` says why that loses nothing); a reservoir per
                 device for activation memory under the cap
    objective    the makespan, never below ``IntegerProblem.lower_bound``
    solve        from a hint (the best known plan, replayed on the grid)
    extract      each device's ops sorted by start time

OR-Tools is an optional extra, imported when a model is built.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError
from pipesched.ops import B, F, I, Op, OpKind, W
from pipesched.search.plans import Plan, to_schedule
from pipesched.search.problem import IntegerProblem
from pipesched.simulate import simulate

INSTALL_HINT = "pip install 'pipesched[solver]'"


def require_solver() -> None:
    """Raise PipeschedError (how to install it) unless OR-Tools can be imported."""
    _cp_model()


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise PipeschedError(f"solver=ortools: not installed; {INSTALL_HINT}") from None
    return cp_model


@dataclass(frozen=True)
class SolverOutcome:
    """What CP-SAT returned.

    status: "optimal", "feasible", "infeasible" or "unknown" (no answer within the limit).
    plan: the schedule it found (None without one). objective, bound: makespan of its
    answer and the proven lower bound, in time units. seconds: wall time of the solve.
    """

    status: str
    plan: Plan | None
    objective: int | None
    bound: int
    seconds: float


def grid_starts(ip: IntegerProblem, plan: Plan) -> dict[Op, int]:
    """Start time of every op of ``plan`` on the time grid (the simulator on grid costs)."""
    schedule = to_schedule(ip.problem, plan)
    timeline = simulate(schedule, ip.unit_costs(sorted(plan.recompute)), ip.unit_network(), contention=False)
    starts = np.rint(timeline.op_start).astype(np.int64).tolist()
    return {timeline.op(row): starts[row] for row in range(len(timeline))}


def solve(ip: IntegerProblem, *, hint: Plan | None = None, time_limit: float = 10.0,
          workers: int | None = None) -> SolverOutcome:
    """Minimise the makespan of ``ip`` within ``time_limit`` seconds, starting from ``hint``."""
    cp_model = _cp_model()
    began = time.perf_counter()
    # --- data
    p, m, kinds = ip.num_stages, ip.num_microbatches, ip.kinds
    backward = I if ip.problem.split_backward else B
    last = W if ip.problem.split_backward else B
    hint_starts = grid_starts(ip, hint) if hint is not None else None
    hint_makespan = None
    if hint is not None:
        hint_makespan = max(hint_starts[op] + _length(ip, op.kind, op.stage, op.stage in hint.recompute)
                            for op in hint_starts)
    serial = sum(max(ip.duration[k][s], ip.recomputed[k][s]) for k in kinds for s in range(p)) * m
    horizon = hint_makespan if hint_makespan is not None else serial + m * (
        sum(ip.activation_delay) + sum(ip.gradient_delay))
    horizon = max(horizon, ip.lower_bound)

    model = cp_model.CpModel()
    # --- variables: a recompute choice per stage, an interval per op
    recompute = [model.new_bool_var(f"recompute_{s}") if ip.problem.allow_recompute else None
                 for s in range(p)]
    start: dict[Op, object] = {}
    end: dict[Op, object] = {}
    interval: dict[Op, object] = {}
    for s in range(p):
        for kind in kinds:
            base = ip.duration[kind][s]
            extra = ip.recomputed[kind][s] - base
            length = base + extra * recompute[s] if recompute[s] is not None and extra else base
            for k in range(m):
                op = Op(s, kind, k)
                start[op] = model.new_int_var(0, horizon, f"start_{op}")
                end[op] = model.new_int_var(0, horizon, f"end_{op}")
                interval[op] = model.new_interval_var(start[op], length, end[op], f"op_{op}")

    # --- constraints
    for s in range(p):
        # one op at a time on each device
        model.add_no_overlap([interval[Op(s, kind, k)] for kind in kinds for k in range(m)])
        for k in range(m):
            # a stage-microbatch's own ops in order: F, then I, then W (or F then B)
            for before, after in itertools.pairwise(kinds):
                model.add(start[Op(s, after, k)] >= end[Op(s, before, k)])
            # each kind in microbatch order on every stage
            if k + 1 < m:
                for kind in kinds:
                    model.add(start[Op(s, kind, k + 1)] >= end[Op(s, kind, k)])
    for s in range(p - 1):
        for k in range(m):
            # the activation goes down, the gradient comes back, each over the link
            model.add(start[Op(s + 1, F, k)] >= end[Op(s, F, k)] + ip.activation_delay[s])
            model.add(start[Op(s, backward, k)] >= end[Op(s + 1, backward, k)] + ip.gradient_delay[s])
    for s in range(p):
        _memory(model, ip, s, start, end, recompute[s])

    # --- objective
    makespan = model.new_int_var(ip.lower_bound, max(horizon, ip.lower_bound), "makespan")
    for s in range(p):
        model.add(makespan >= end[Op(s, last, m - 1)])
    model.minimize(makespan)

    # --- solve, from the hint
    if hint is not None:
        for op, value in hint_starts.items():
            model.add_hint(start[op], value)
            model.add_hint(end[op], value + _length(ip, op.kind, op.stage, op.stage in hint.recompute))
        for s, choice in enumerate(recompute):
            if choice is not None:
                model.add_hint(choice, s in hint.recompute)
        model.add_hint(makespan, hint_makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit - (time.perf_counter() - began))
    # the reservoirs run as propagators: expanding them into precedence literals costs
    # O(events^2) booleans per device, and presolve alone then outlasts the time limit
    solver.parameters.expand_reservoir_constraints = False
    if workers is not None:
        solver.parameters.num_workers = workers
    code = solver.solve(model)

    # --- extract
    names = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}
    status = names.get(code, "unknown")
    seconds = time.perf_counter() - began
    if status not in ("optimal", "feasible"):
        return SolverOutcome(status, None, None, ip.lower_bound, seconds)
    tables = []
    for s in range(p):
        ops = [Op(s, kind, k) for kind in kinds for k in range(m)]
        tables.append(tuple(sorted(ops, key=lambda op: solver.value(start[op]))))
    chosen = frozenset(s for s, choice in enumerate(recompute) if choice is not None and solver.value(choice))
    bound = max(ip.lower_bound, int(np.ceil(solver.best_objective_bound - 1e-6)))
    return SolverOutcome(status, Plan(tuple(tables), chosen, source="solver"), int(solver.objective_value),
                         bound, seconds)


def _length(ip: IntegerProblem, kind: OpKind, stage: int, recomputed: bool) -> int:
    return (ip.recomputed if recomputed else ip.duration)[kind][stage]


def _memory(model, ip: IntegerProblem, s: int, start: dict, end: dict, recompute) -> None:
    """Activation memory of device s: F allocates as it starts, I frees its share as it ends,
    W the rest (B all); the level stays within the cap at every instant."""
    grid = ip.memory[s]
    m = ip.num_microbatches
    if grid.cap is None:
        return
    split = ip.problem.split_backward
    # the choices (0: keep, 1: recompute) whose activations can outgrow the cap
    choices = [c for c in ((0, 1) if recompute is not None else (0,))
               if grid.alloc[c] > 0 and m * grid.alloc[c] > grid.cap]
    for choice in choices:
        # with room for c microbatches, F(k) waits for the backward of k - c at least (its I
        # when I frees part: the W that free the rest come later)
        c = grid.cap // grid.alloc[choice]
        waits_for = I if split and grid.frees_at_i[choice] > 0 else (W if split else B)
        for k in range(c, m):
            rule = model.add(start[Op(s, F, k)] >= end[Op(s, waits_for, k - c)])
            if recompute is not None:
                rule.only_enforce_if(recompute if choice else ~recompute)
    # that is the whole rule unless I frees a part and W the rest: then a reservoir
    if all(not split or grid.frees_at_i[c] in (0, grid.alloc[c]) for c in choices):
        return
    times, changes, actives = [], [], []
    for choice in choices:
        active = True if recompute is None else (recompute if choice else ~recompute)
        alloc, at_i = grid.alloc[choice], grid.frees_at_i[choice]
        for k in range(m):
            times += [start[Op(s, F, k)], end[Op(s, I, k)], end[Op(s, W, k)]]
            changes += [alloc, -at_i, at_i - alloc]
            actives += [active] * 3
    model.add_reservoir_constraint_with_active(times, changes, actives, 0, grid.cap)
