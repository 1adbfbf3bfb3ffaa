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


@dataclass
class _Variables:
    """The model's variables: an interval per op (its start and end on the time grid), and
    a yes/no per stage to recompute and to offload (None where the stage has no choice)."""

    start: dict[Op, object]
    end: dict[Op, object]
    interval: dict[Op, object]
    recompute: list
    offload: list


def solve(ip: IntegerProblem, *, hint: Plan | None = None, time_limit: float = 10.0,
          workers: int | None = None, memory_rule: str = "counting") -> SolverOutcome:
    """Minimise the makespan of ``ip`` within ``time_limit`` seconds, starting from ``hint``
    (``memory_rule``: how the memory cap is written, see ``_memory``)."""
    cp_model = _cp_model()
    began = time.perf_counter()
    require(memory_rule in MEMORY_RULES, "memory_rule", memory_rule, f"choose one of {', '.join(MEMORY_RULES)}")
    hint_starts = grid_starts(ip, hint) if hint is not None else {}
    horizon = _horizon(ip, hint, hint_starts)
    model = cp_model.CpModel()
    v = _op_intervals(model, ip, horizon)
    _offload_intervals(model, ip, horizon, v)
    _order_constraints(model, ip, v)
    ended = _memory_literals(model, ip, v, memory_rule)
    makespan = _makespan(model, ip, v, horizon)
    if hint is not None:
        _add_hint(model, ip, v, hint, hint_starts, ended, makespan)
    solver = _solver(cp_model, max(0.05, time_limit - (time.perf_counter() - began)), workers)
    code = solver.solve(model)
    return _outcome(cp_model, solver, code, ip, v, began)


def _backward_kinds(ip: IntegerProblem) -> tuple[OpKind, OpKind]:
    """The kind a gradient leaves a stage by, and a stage's last kind: (I, W) split, (B, B) not."""
    return (I, W) if ip.problem.split_backward else (B, B)


def _op_intervals(model, ip: IntegerProblem, horizon: int) -> _Variables:
    """A recompute choice per stage and an interval per compute op, recompute lengthening it."""
    recompute = [model.new_bool_var(f"recompute_{s}") if ip.problem.allow_recompute else None
                 for s in range(ip.num_stages)]
    v = _Variables({}, {}, {}, recompute, [None] * ip.num_stages)
    for s in range(ip.num_stages):
        for kind in ip.kinds:
            base = ip.duration[kind][s]
            extra = ip.recomputed[kind][s] - base
            length = base + extra * recompute[s] if recompute[s] is not None and extra else base
            for k in range(ip.num_microbatches):
                op = Op(s, kind, k)
                v.start[op] = model.new_int_var(0, horizon, f"start_{op}")
                v.end[op] = model.new_int_var(0, horizon, f"end_{op}")
                v.interval[op] = model.new_interval_var(v.start[op], length, v.end[op], f"op_{op}")
    return v


def _offload_intervals(model, ip: IntegerProblem, horizon: int, v: _Variables) -> None:
    """An offload choice per stage whose cap binds: an O after each forward and an R before
    each backward, optional intervals on the device's host link (one transfer at a time)."""
    v.offload = [model.new_bool_var(f"offload_{s}") if ip.host_transfer and ip.memory[s].cap is not None else None
                 for s in range(ip.num_stages)]
    for s, choice in enumerate(v.offload):
        if choice is None:
            continue
        if v.recompute[s] is not None:
            model.add_bool_or([~choice, ~v.recompute[s]])  # offload or recompute, not both
        host_link = [_host_transfers(model, ip, horizon, v, Op(s, F, k), choice) for k in range(ip.num_microbatches)]
        model.add_no_overlap([interval for pair in host_link for interval in pair])


def _host_transfers(model, ip: IntegerProblem, horizon: int, v: _Variables, forward: Op, choice) -> tuple:
    """The O and R of ``forward``'s microbatch, under ``choice``: O after F, R after O and
    before the backward, each in microbatch order. Returns their two intervals."""
    s, k = forward.stage, forward.microbatch
    intervals = []
    for kind in (O, R):
        op = Op(s, kind, k)
        v.start[op] = model.new_int_var(0, horizon, f"start_{op}")
        v.end[op] = model.new_int_var(0, horizon, f"end_{op}")
        v.interval[op] = model.new_optional_interval_var(v.start[op], ip.host_transfer[s], v.end[op], choice,
                                                         f"op_{op}")
        intervals.append(v.interval[op])
    backward = _backward_kinds(ip)[0]
    start, end = v.start, v.end
    model.add(start[Op(s, O, k)] >= end[forward]).only_enforce_if(choice)
    model.add(start[Op(s, R, k)] >= end[Op(s, O, k)]).only_enforce_if(choice)
    model.add(end[Op(s, R, k)] <= start[Op(s, backward, k)]).only_enforce_if(choice)
    if k:  # in microbatch order, as the forwards and backwards
        for kind in (O, R):
            model.add(start[Op(s, kind, k)] >= end[Op(s, kind, k - 1)]).only_enforce_if(choice)
    return tuple(intervals)


def _order_constraints(model, ip: IntegerProblem, v: _Variables) -> None:
    """One op at a time per device, a stage-microbatch's ops in kind order, each kind in
    microbatch order, and the transfers between neighbouring stages with their delays."""
    p, m, kinds = ip.num_stages, ip.num_microbatches, ip.kinds
    start, end = v.start, v.end
    for s in range(p):
        model.add_no_overlap([v.interval[Op(s, kind, k)] for kind in kinds for k in range(m)])
        for k in range(m):
            # a stage-microbatch's own ops in order: F, then I, then W (or F then B)
            for before, after in itertools.pairwise(kinds):
                model.add(start[Op(s, after, k)] >= end[Op(s, before, k)])
            if k + 1 < m:
                for kind in kinds:
                    model.add(start[Op(s, kind, k + 1)] >= end[Op(s, kind, k)])
    backward = _backward_kinds(ip)[0]
    for s in range(p - 1):
        for k in range(m):
            # the activation goes down, the gradient comes back, each over the link
            model.add(start[Op(s + 1, F, k)] >= end[Op(s, F, k)] + ip.activation_delay[s])
            model.add(start[Op(s, backward, k)] >= end[Op(s + 1, backward, k)] + ip.gradient_delay[s])


def _memory_literals(model, ip: IntegerProblem, v: _Variables, memory_rule: str) -> dict[tuple[Op, Op], object]:
    """Every device's memory cap (``_memory``); returns its literals keyed (F(s, k), op) for
    "op ends before F(s, k) starts"."""
    ended = {}
    for s in range(ip.num_stages):
        for (k, kind, j), literal in _memory(model, ip, s, v.start, v.end, v.recompute[s], memory_rule,
                                             v.offload[s]).items():
            ended[(Op(s, F, k), Op(s, kind, j))] = literal
    return ended


def _makespan(model, ip: IntegerProblem, v: _Variables, horizon: int):
    """The objective: the end of the last op on every stage, never below the lower bound."""
    makespan = model.new_int_var(ip.lower_bound, horizon, "makespan")
    last = _backward_kinds(ip)[1]
    for s in range(ip.num_stages):
        model.add(makespan >= v.end[Op(s, last, ip.num_microbatches - 1)])
    model.minimize(makespan)
    return makespan


def _add_hint(model, ip: IntegerProblem, v: _Variables, hint: Plan, hint_starts: dict[Op, int],
              ended: dict[tuple[Op, Op], object], makespan) -> None:
    """Every variable gets the value the hint's plan gives it."""
    ends = {op: t + _length(ip, op.kind, op.stage, op.stage in hint.recompute) for op, t in hint_starts.items()}
    for op, value in hint_starts.items():
        if op in v.start:
            model.add_hint(v.start[op], value)
            model.add_hint(v.end[op], ends[op])
    for choices, chosen in ((v.recompute, hint.recompute), (v.offload, hint.offload)):
        for s, choice in enumerate(choices):
            if choice is not None:
                model.add_hint(choice, s in chosen)
    for (forward, op), literal in ended.items():
        model.add_hint(literal, ends[op] <= hint_starts[forward])
    model.add_hint(makespan, max(ends.values()))


def _solver(cp_model, seconds: float, workers: int | None):
    """A CP-SAT solver limited to ``seconds`` of wall time."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    # probing every literal of the memory rule in presolve can outlast the time limit; and
    # a reservoir expanded into precedence literals costs O(events^2) booleans per device
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.expand_reservoir_constraints = False
    if workers is not None:
        solver.parameters.num_workers = workers
    return solver


def _outcome(cp_model, solver, code, ip: IntegerProblem, v: _Variables, began: float) -> SolverOutcome:
    """The solver's answer: its status, bound and the plan read from its values."""
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
    offloaded = frozenset(s for s, choice in enumerate(v.offload) if choice is not None and solver.value(choice))
    chosen = frozenset(s for s, choice in enumerate(v.recompute) if choice is not None and solver.value(choice))
    tables = tuple(_table(s, ip.kinds, ip.num_microbatches, s in offloaded, solver.value, v.start, v.end)
                   for s in range(ip.num_stages))
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
    cap = _DeviceCap(model, ip, s, start, end)
    if cap.grid.cap is None:
        return cap.ended
    reservoir: tuple[list, list, list] = ([], [], [])  # event times, level changes, active literals
    for choice in (0, 1) if recompute is not None else (0,):
        when = [] if recompute is None else [recompute if choice else ~recompute]
        needs_events = cap.constrain_choice(choice, when, rule, offload)
        if needs_events:
            active = True if recompute is None else when[0]
            _reservoir_events(reservoir, ip, s, choice, start, end, active, offload if choice == 0 else None)
    if reservoir[0]:
        model.add_reservoir_constraint_with_active(*reservoir, 0, cap.grid.cap)
    return cap.ended


class _DeviceCap:
    """The memory cap of device s under one recompute choice at a time (see ``_memory``);
    ``ended`` keeps the literals "op (s, kind, j) ends before F(s, k) starts" by (k, kind, j)."""

    def __init__(self, model, ip: IntegerProblem, s: int, start: dict, end: dict):
        self.model, self.ip, self.s, self.start, self.end = model, ip, s, start, end
        self.grid = ip.memory[s]
        self.ended: dict[tuple[int, OpKind, int], object] = {}

    def ended_before(self, k: int, kind: OpKind, j: int):
        """A literal that forces op (s, kind, j) to end before F(s, k) starts."""
        if (k, kind, j) not in self.ended:
            literal = self.model.new_bool_var(f"{self.s}{kind}{j}_ends_before_{self.s}F{k}")
            self.model.add(self.start[Op(self.s, F, k)] >= self.end[Op(self.s, kind, j)]).only_enforce_if(literal)
            self.ended[(k, kind, j)] = literal
        return self.ended[(k, kind, j)]

    def frees(self, choice: int) -> dict[OpKind, tuple[int, int]]:
        """kind -> (units it frees, units a microbatch still holds until it has run), from
        the rules' memory effects along one microbatch's ops after the allocating one."""
        first, *later = self.ip.kinds
        frees, level = {}, self.grid.change(first, choice)
        for kind in later:
            frees[kind] = (-self.grid.change(kind, choice), level)
            level += self.grid.change(kind, choice)
        return frees

    def constrain_choice(self, choice: int, when: list, rule: str, offload) -> bool:
        """Write the cap under ``choice`` (enforced if ``when``) as precedences, and with rule
        "counting" as counted literals. Returns whether the reservoir must check it too."""
        first = self.ip.kinds[0]  # the allocating op
        alloc = self.grid.change(first, choice)
        peak = self.grid.peak(self.ip.kinds, choice)
        if alloc == 0 or self.ip.num_microbatches * peak <= self.grid.cap:
            return False
        frees = self.frees(choice)
        pending = {kind: self.grid.cap // held for kind, (share, held) in frees.items() if share > 0}
        # the level peaks also as a later op ends (I keeping more for W than it frees), or as
        # a reload starts: only the reservoir checks those
        events_only = peak > alloc or (offload is not None and choice == 0)
        partial = events_only
        for k in range(0 if events_only else self.ip.num_microbatches):
            need = alloc * (k + 1) - self.grid.cap  # units the ended ops must have freed by F(k)
            if need <= 0:
                continue
            counted = self.force_oldest_ended(k, frees, pending, when)
            if counted < need:
                partial = True
                if rule == "counting":
                    self.count_freed(k, need - counted, frees, pending, when)
        return (rule == "reservoir" or events_only) and partial

    def force_oldest_ended(self, k: int, frees: dict, pending: dict, when: list) -> int:
        """Force the ops of each freeing kind up to k - pending to end before F(k) (in
        microbatch order, the last of them); returns the units they free."""
        s, first = self.s, self.ip.kinds[0]
        counted = 0
        for kind, most in pending.items():
            if k - most >= 0:
                self.model.add(self.start[Op(s, first, k)] >= self.end[Op(s, kind, k - most)]).only_enforce_if(when)
                counted += frees[kind][0] * (k - most + 1)
        return counted

    def count_freed(self, k: int, short: int, frees: dict, pending: dict, when: list) -> None:
        """The recent ops that may still run: the literals of those that ended before F(k)
        must count the ``short`` units the older ones did not free."""
        freed = [frees[kind][0] * self.ended_before(k, kind, j)
                 for kind, most in pending.items() for j in range(max(0, k - most + 1), k)]
        self.model.add(sum(freed) >= short).only_enforce_if(when)


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
