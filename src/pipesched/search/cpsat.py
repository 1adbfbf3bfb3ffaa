"""The CP-SAT model of schedule synthesis, as a job shop (OR-Tools' job-shop sample).

Machines are devices (stage s on device s); jobs are microbatches; each op is an interval on
its device. In the order the code builds it:

    data         op lengths and transfer delays on the time grid, memory on its grid
    variables    an interval per op; with recompute allowed, a yes/no per stage that
                 lengthens its I (or B) by the forward and shrinks what F keeps; with
                 offload allowed, a yes/no per stage and optional O and R intervals on
                 its device's host link (O after F, R before the backward)
    constraints  no overlap per device; F -> I -> W on a stage; F(s) -> F(s+1) and
                 I/B(s+1) -> I/B(s) with the link's delay; each kind in microbatch order
                 on every stage (``plans`` says why that loses nothing); activation memory
                 per device under the cap (``_memory``: precedences, plus counted frees or
                 a reservoir where I frees part of a microbatch and W the rest)
    objective    the makespan, never below ``IntegerProblem.lower_bound``
    solve        from a hint (the best known plan, replayed on the grid)
    extract      each device's ops sorted by start time, an O or R after the last
                 compute op that ended before it starts (where the simulator issues it)

OR-Tools is an optional extra, imported when a model is built.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from pipesched.enums import SolverStatus
from pipesched.errors import PipeschedError, require
from pipesched.ops import B, F, I, O, Op, OpKind, R, W
from pipesched.rules import AT_END, AT_START, HOST_TRANSFER, RULES
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

    status: SolverStatus
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


def fits_grid(ip: IntegerProblem, plan: Plan) -> bool:
    """Whether ``plan`` keeps every device within its cap on the memory grid."""
    for s, ops in enumerate(plan.device_ops):
        grid = ip.memory[s]
        if grid.cap is None:
            continue
        choice = 1 if s in plan.recompute else 0
        level = 0
        for op in ops:
            level += grid.change(op.kind, choice)
            if level > grid.cap:
                return False
    return True


MEMORY_RULES = ("counting", "reservoir")


def solve(ip: IntegerProblem, *, hint: Plan | None = None, time_limit: float = 10.0,
          workers: int | None = None, memory_rule: str = "counting") -> SolverOutcome:
    """Minimise the makespan of ``ip`` within ``time_limit`` seconds, starting from ``hint``
    (``memory_rule``: how the memory cap is written, see ``_memory``)."""
    cp_model = _cp_model()
    began = time.perf_counter()
    require(memory_rule in MEMORY_RULES, "memory_rule", memory_rule, f"choose one of {', '.join(MEMORY_RULES)}")
    # --- data
    p, m, kinds = ip.num_stages, ip.num_microbatches, ip.kinds
    backward, last = (I, W) if ip.problem.split_backward else (B, B)
    hint_starts = grid_starts(ip, hint) if hint is not None else {}
    horizon = _horizon(ip, hint, hint_starts)

    model = cp_model.CpModel()
    # --- variables: a recompute choice per stage, an interval per op
    recompute = [model.new_bool_var(f"recompute_{s}") if ip.problem.allow_recompute else None for s in range(p)]
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

    # an offload choice per stage whose cap binds: an O after each forward and an R before
    # each backward, optional intervals on the device's host link (one transfer at a time)
    offload = [model.new_bool_var(f"offload_{s}") if ip.host_transfer and ip.memory[s].cap is not None else None
               for s in range(p)]
    for s, choice in enumerate(offload):
        if choice is None:
            continue
        if recompute[s] is not None:
            model.add_bool_or([~choice, ~recompute[s]])  # offload or recompute, not both
        host_link = []
        for k in range(m):
            for kind in (O, R):
                op = Op(s, kind, k)
                start[op] = model.new_int_var(0, horizon, f"start_{op}")
                end[op] = model.new_int_var(0, horizon, f"end_{op}")
                interval[op] = model.new_optional_interval_var(start[op], ip.host_transfer[s], end[op], choice,
                                                               f"op_{op}")
                host_link.append(interval[op])
            model.add(start[Op(s, O, k)] >= end[Op(s, F, k)]).only_enforce_if(choice)
            model.add(start[Op(s, R, k)] >= end[Op(s, O, k)]).only_enforce_if(choice)
            model.add(end[Op(s, R, k)] <= start[Op(s, backward, k)]).only_enforce_if(choice)
            if k:  # in microbatch order, as the forwards and backwards
                for kind in (O, R):
                    model.add(start[Op(s, kind, k)] >= end[Op(s, kind, k - 1)]).only_enforce_if(choice)
        model.add_no_overlap(host_link)

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
    ended = {}
    for s in range(p):
        for (k, kind, j), literal in _memory(model, ip, s, start, end, recompute[s], memory_rule,
                                             offload[s]).items():
            ended[(Op(s, F, k), Op(s, kind, j))] = literal

    # --- objective
    makespan = model.new_int_var(ip.lower_bound, horizon, "makespan")
    for s in range(p):
        model.add(makespan >= end[Op(s, last, m - 1)])
    model.minimize(makespan)

    # --- solve, from the hint: every variable gets the value the hint's plan gives it
    if hint is not None:
        ends = {op: t + _length(ip, op.kind, op.stage, op.stage in hint.recompute) for op, t in hint_starts.items()}
        for op, value in hint_starts.items():
            if op in start:
                model.add_hint(start[op], value)
                model.add_hint(end[op], ends[op])
        for s, choice in enumerate(recompute):
            if choice is not None:
                model.add_hint(choice, s in hint.recompute)
        for s, choice in enumerate(offload):
            if choice is not None:
                model.add_hint(choice, s in hint.offload)
        for (forward, op), literal in ended.items():
            model.add_hint(literal, ends[op] <= hint_starts[forward])
        model.add_hint(makespan, max(ends.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit - (time.perf_counter() - began))
    # probing every literal of the memory rule in presolve can outlast the time limit; and
    # a reservoir expanded into precedence literals costs O(events^2) booleans per device
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.expand_reservoir_constraints = False
    if workers is not None:
        solver.parameters.num_workers = workers
    code = solver.solve(model)

    # --- extract
    names = {cp_model.OPTIMAL: SolverStatus.OPTIMAL, cp_model.FEASIBLE: SolverStatus.FEASIBLE,
             cp_model.INFEASIBLE: SolverStatus.INFEASIBLE}
    status = names.get(code, SolverStatus.UNKNOWN)
    seconds = time.perf_counter() - began
    if status == SolverStatus.INFEASIBLE:
        # only within the horizon, which a hint that misses the grid's cap may have set too
        # tight: the bound says nothing more than the problem's own
        return SolverOutcome(status, None, None, ip.lower_bound, seconds)
    bound = max(ip.lower_bound, math.ceil(solver.best_objective_bound - 1e-6))
    if status == SolverStatus.UNKNOWN:
        return SolverOutcome(status, None, None, bound, seconds)
    offloaded = frozenset(s for s, choice in enumerate(offload) if choice is not None and solver.value(choice))
    tables = tuple(_table(s, kinds, m, s in offloaded, solver.value, start, end) for s in range(p))
    chosen = frozenset(s for s, choice in enumerate(recompute) if choice is not None and solver.value(choice))
    return SolverOutcome(status, Plan(tables, chosen, source="solver", offload=offloaded), int(solver.objective_value),
                         bound, seconds)


def _table(s: int, kinds: tuple[OpKind, ...], m: int, offloads: bool, value, start: dict, end: dict) -> tuple[Op, ...]:
    """Device s's table from the solver's times: its compute ops by start, and each host-link
    op after the last compute op that ended by its start (where the simulator issues it: when
    the compute op before it in the table ends)."""
    compute = sorted((Op(s, kind, k) for kind in kinds for k in range(m)), key=lambda op: value(start[op]))
    if not offloads:
        return tuple(compute)
    ends = [value(end[op]) for op in compute]  # ascending: a device's compute ops do not overlap
    host = sorted((Op(s, kind, k) for kind in (O, R) for k in range(m)), key=lambda op: value(start[op]))
    after: dict[int, list[Op]] = {}
    for op in host:
        after.setdefault(bisect.bisect_right(ends, value(start[op])), []).append(op)
    table: list[Op] = [*after.get(0, ())]
    for index, op in enumerate(compute, start=1):
        table.append(op)
        table.extend(after.get(index, ()))
    return tuple(table)


def _horizon(ip: IntegerProblem, hint: Plan | None, hint_starts: dict[Op, int]) -> int:
    """A makespan the optimum does not exceed, in time units: the hint's, when it keeps the
    memory grid's caps; else every op one after the other, each waiting for its transfers."""
    if hint is not None and fits_grid(ip, hint):
        makespan = max(t + _length(ip, op.kind, op.stage, op.stage in hint.recompute) for op, t in hint_starts.items())
    else:
        p, m = ip.num_stages, ip.num_microbatches
        makespan = m * (sum(max(ip.duration[k][s], ip.recomputed[k][s]) for k in ip.kinds for s in range(p))
                        + sum(ip.activation_delay) + sum(ip.gradient_delay))
    return max(makespan, ip.lower_bound)


def _length(ip: IntegerProblem, kind: OpKind, stage: int, recomputed: bool) -> int:
    if RULES[kind].cost == HOST_TRANSFER:  # an offload or reload: the stage's activations over its host link
        return ip.host_transfer[stage]
    return (ip.recomputed if recomputed else ip.duration)[kind][stage]


def _memory(model, ip: IntegerProblem, s: int, start: dict, end: dict, recompute, rule: str,
            offload=None) -> dict:
    """Activation memory of device s within its cap, on the memory grid.

    Every amount is an op's rule (``MemoryGrid.change``, the rules' memory effects): F(k) allocates ``alloc`` as it starts; I frees ``at_i`` as it ends but leaves ``kept``
    (the gradients W needs) and W frees the rest (B all). When I frees more than it leaves,
    only F raises the level, so the cap holds at every instant when it holds as each F
    starts; with each kind in microbatch order, the level then is
    alloc (k + 1) - at_i nI - (alloc - at_i) nW, where nI and nW count the I and W that
    have ended. An op of a freeing kind that has not ended holds at least its own share
    and all it frees later: at most cap // that of them are pending, so the older ones must
    have ended (a precedence). Then, rule "counting": for each recent one a literal says it
    ended before F(k) started, and the literals must count enough freed memory; rule
    "reservoir": CP-SAT's reservoir constraint over every allocation and free (the textbook
    form; slower, see the synthesis benchmark). When I's end raises the level (it leaves
    more than it frees, as the default model's layers do), the level can peak as an I ends
    too: the reservoir, exact at every event, is used whatever the rule; and so it is when
    the stage may offload (``offload``, its literal): an O frees the activations as it ends
    and its R takes them back as it starts. Returns the literals, keyed (k, kind, j)
    for "op (s, kind, j) ends before F(s, k) starts".
    """
    grid = ip.memory[s]
    m = ip.num_microbatches
    ended: dict[tuple[int, OpKind, int], object] = {}
    if grid.cap is None:
        return ended

    def ended_before(k: int, kind: OpKind, j: int):
        """A literal that forces op (s, kind, j) to end before F(s, k) starts."""
        if (k, kind, j) not in ended:
            literal = model.new_bool_var(f"{s}{kind}{j}_ends_before_{s}F{k}")
            model.add(start[Op(s, F, k)] >= end[Op(s, kind, j)]).only_enforce_if(literal)
            ended[(k, kind, j)] = literal
        return ended[(k, kind, j)]

    reservoir: tuple[list, list, list] = ([], [], [])  # event times, level changes, active literals
    for choice in (0, 1) if recompute is not None else (0,):
        first, *later = ip.kinds  # the allocating op, then the ops that free (or keep) its memory
        alloc = grid.change(first, choice)
        # kind -> (units it frees, units a microbatch still holds until it has run), from the
        # rules' memory effects along one microbatch's ops; and the level's peak along them
        frees, level = {}, alloc
        for kind in later:
            frees[kind] = (-grid.change(kind, choice), level)
            level += grid.change(kind, choice)
        peak = grid.peak(ip.kinds, choice)
        if alloc == 0 or m * peak <= grid.cap:
            continue
        when = [] if recompute is None else [recompute if choice else ~recompute]
        pending = {kind: grid.cap // held for kind, (share, held) in frees.items() if share > 0}
        # the level peaks also as a later op ends (I keeping more for W than it frees), or as
        # a reload starts: only the reservoir checks those
        events_only = peak > alloc or (offload is not None and choice == 0)
        partial = events_only
        for k in range(0 if events_only else m):
            need = alloc * (k + 1) - grid.cap  # units the ended ops must have freed by F(k)
            if need <= 0:
                continue
            counted = 0
            for kind, most in pending.items():
                if k - most >= 0:
                    # the ops of this kind up to k - most have ended: in order, the last of them
                    model.add(start[Op(s, first, k)] >= end[Op(s, kind, k - most)]).only_enforce_if(when)
                    counted += frees[kind][0] * (k - most + 1)
            if counted >= need:
                continue
            partial = True
            if rule == "counting" and not events_only:
                freed = [frees[kind][0] * ended_before(k, kind, j)
                         for kind, most in pending.items() for j in range(max(0, k - most + 1), k)]
                model.add(sum(freed) >= need - counted).only_enforce_if(when)
        if (rule == "reservoir" or events_only) and partial:
            active = True if recompute is None else when[0]
            _reservoir_events(reservoir, ip, s, choice, start, end, active, offload if choice == 0 else None)
    if reservoir[0]:
        model.add_reservoir_constraint_with_active(*reservoir, 0, grid.cap)
    return ended


def _reservoir_events(reservoir: tuple[list, list, list], ip: IntegerProblem, s: int, choice: int, start: dict,
                      end: dict, active, offload) -> None:
    """Add device s's memory events to ``reservoir`` (times, level changes, literals): each
    op of every microbatch changes the level by its rule's effect on the grid, at its start
    or its end; with ``offload`` (its literal; offloading excludes recompute, so only under
    choice 0) each O and R moves the activations too."""
    grid = ip.memory[s]
    times = {AT_START: start, AT_END: end}
    moves = (O, R) if offload is not None else ()
    for k in range(ip.num_microbatches):
        for kind in (*ip.kinds, *moves):
            op = Op(s, kind, k)
            reservoir[0].append(times[RULES[kind].memory.at][op])
            reservoir[1].append(grid.change(kind, choice))
            reservoir[2].append(offload if kind in moves else active)
