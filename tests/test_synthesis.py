"""Schedule synthesis: the solver's schedules are valid, the simulator agrees with the
solver, they are optimal where every op order can be tried, and they keep the memory cap."""

from __future__ import annotations

import dataclasses
import doctest
import functools
import importlib
import itertools
import json
import math

import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.ops import B, F, I, O, Op, R, W
from pipesched.schedule import Placement, Schedule
from pipesched.search.baseline import best_family
from pipesched.search.list_scheduling import inputs_of, list_schedule, rules
from pipesched.search.local_search import improve
from pipesched.search.plans import Plan, evaluate, fits, in_microbatch_order
from pipesched.search.problem import IntegerProblem, SynthesisProblem
from pipesched.search.synthesis import synthesize
from pipesched.simulate import Network, simulate
from pipesched.validation import validate

INF = math.inf


def uneven(p: int, *, static: float = 0.0, input_frees: float = 0.5) -> StageCosts:
    """Stage costs that differ per stage and per kind, on a 0.25 s grid (exact for the solver)."""
    return StageCosts(
        input_frees=input_frees,
        forward=tuple(1.0 + 0.25 * (s % 3) for s in range(p)),
        backward_input=tuple(1.5 - 0.25 * (s % 2) for s in range(p)),
        backward_weight=tuple(0.75 + 0.25 * (s % 2) for s in range(p)),
        activation_bytes=(4.0,) * p,
        output_bytes=(1.0,) * p,
        static_bytes=(static,) * p,
    )


def interleavings(chains: list[list[Op]]):
    """Every merge of the chains that keeps each chain's order."""
    chains = [c for c in chains if c]
    if not chains:
        yield ()
        return
    for i, chain in enumerate(chains):
        rest = [*chains[:i], chain[1:], *chains[i + 1:]]
        for tail in interleavings(rest):
            yield (chain[0], *tail)


def in_order(ops: tuple[Op, ...]) -> bool:
    """Each microbatch's own ops in F -> I -> W (F -> B) order."""
    seen = set()
    for op in ops:
        if op.kind is not F and (op.microbatch, F) not in seen:
            return False
        if op.kind is W and (op.microbatch, I) not in seen:
            return False
        seen.add((op.microbatch, op.kind))
    return True


def brute_force(costs: StageCosts, network: Network, m: int, *, limit: float | None, split: bool,
                recompute_options=(frozenset(),), fifo: bool = False) -> float:
    """The fastest schedule over every per-device op order (each stage-microbatch's own
    F -> I -> W or F -> B kept; microbatches in any order, or with ``fifo`` each kind in
    microbatch order) and every recompute choice, each timed by the simulator without
    contention; inf when none fits."""
    p = costs.num_stages
    kinds = (F, I, W) if split else (F, B)
    if fifo:
        per_device = [[t for t in interleavings([[Op(s, k, mb) for mb in range(m)] for k in kinds]) if in_order(t)]
                      for s in range(p)]
    else:
        per_device = [list(interleavings([[Op(s, k, mb) for k in kinds] for mb in range(m)])) for s in range(p)]
    best = INF
    for recompute in recompute_options:
        stage_costs = costs.checkpointed(sorted(recompute))
        for tables in itertools.product(*per_device):
            schedule = Schedule("brute", Placement.one_per_device(p), m, tables)
            try:
                timeline = simulate(schedule, stage_costs, network, contention=False)
            except PipeschedError:
                continue  # the tables deadlock
            if limit is None or max(timeline.memory.peak) <= limit * (1 + 1e-9):
                best = min(best, timeline.makespan)
    return best


def check_result(result, costs: StageCosts, network: Network, limit: float | None) -> None:
    """What every synthesized schedule must satisfy."""
    schedule = result.schedule
    assert validate(schedule) == []
    assert schedule.placement == Placement.one_per_device(costs.num_stages)
    timeline = simulate(schedule, costs.checkpointed(result.recompute), network, contention=False)
    assert timeline.makespan == pytest.approx(result.makespan_s, rel=1e-12)
    assert result.lower_bound_s <= result.makespan_s * (1 + 1e-12)
    if limit is not None:
        assert max(timeline.memory.peak) <= limit * (1 + 1e-9)


# --- the solver against the simulator ----------------------------------------------------
def test_solver_makespan_equals_the_simulators_on_grid_costs() -> None:
    costs = uneven(3)
    network = Network.uniform(3, latency=0.5, bandwidth=2.0)  # delay 0.5 + 1 B / 2 B/s = 1 s
    result = synthesize(costs, network, 4, memory_limit=12.0, time_limit=10)
    check_result(result, costs, network, 12.0)
    assert result.status == "optimal" and result.method == "solver"
    assert result.makespan_s == pytest.approx(result.solver_makespan_s, abs=result.time_unit_s)
    assert result.gap == pytest.approx(0.0, abs=1e-12)


def test_off_grid_costs_differ_from_the_solver_by_at_most_a_unit_per_critical_task() -> None:
    costs = StageCosts(forward=(0.0123, 0.0171, 0.0142), backward_input=(0.0201, 0.0177, 0.0263),
                       backward_weight=(0.0111, 0.0093, 0.0124), activation_bytes=(3e9, 3e9, 3e9),
                       output_bytes=(1.6e7, 1.6e7, 0.0))
    network = Network.uniform(3, latency=2e-5, bandwidth=5e10)
    result = synthesize(costs, network, 5, memory_limit=9e9, time_limit=10)
    check_result(result, costs, network, 9e9)
    path = len(result.timeline.simulation.critical_path)
    # durations and delays are rounded down to the grid: the true schedule is never faster
    # than the solver's, and slower by less than one unit per task on its critical path
    assert result.solver_makespan_s <= result.makespan_s + 1e-12
    assert result.makespan_s - result.solver_makespan_s <= path * result.time_unit_s


# --- optimality, checked by trying every op order -----------------------------------------
@pytest.mark.parametrize(
    ("p", "m", "split", "latency", "limit"),
    [
        (2, 2, True, 0.0, 4.0),  # one microbatch in flight
        (2, 2, True, 0.5, 6.0),  # I frees half: one and a half in flight
        (2, 2, True, 0.25, None),
        (3, 2, False, 0.5, 4.0),
        (3, 2, False, 0.0, None),
    ],
)
@pytest.mark.slow
def test_solver_is_optimal_over_every_op_order(p, m, split, latency, limit) -> None:
    costs, network = uneven(p), Network.uniform(p, latency=latency, bandwidth=INF)
    result = synthesize(costs, network, m, memory_limit=limit, split_backward=split, time_limit=10)
    check_result(result, costs, network, limit)
    optimum = brute_force(costs, network, m, limit=limit, split=split)
    assert result.status == "optimal"
    assert result.makespan_s == pytest.approx(optimum, rel=1e-12)
    assert result.lower_bound_s <= optimum * (1 + 1e-12)


# I frees 3 of 4 B, W the last one; under a cap of 5 B a second F may start once the first
# microbatch's I has ended, a third once enough I and W have (the memory rule's literals)
PARTIAL = (uneven(2, input_frees=0.75), Network.uniform(2, latency=0.5, bandwidth=INF), 3)


@functools.cache
def partial_optimum(limit: float) -> float:
    # every order with each kind in microbatch order (the relabelling test below shows that
    # loses nothing); 42 orders per device
    return brute_force(*PARTIAL, limit=limit, split=True, fifo=True)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["counting", "reservoir"])
def test_partial_frees_at_i_are_counted_exactly(rule) -> None:
    costs, network, m = PARTIAL
    result = synthesize(costs, network, m, memory_limit=5.0, time_limit=10, memory_rule=rule)
    check_result(result, costs, network, 5.0)
    assert result.status == "optimal"
    assert result.makespan_s == pytest.approx(partial_optimum(5.0), rel=1e-12)
    assert partial_optimum(5.0) < partial_optimum(4.0)  # the extra byte counts


# I frees 3 of 4 B but leaves 2 B of gradients for W (kept_for_w_bytes): I's end raises the
# level by 1 B, so the level can peak as an I ends, not only as an F starts
KEPT = (dataclasses.replace(uneven(2, input_frees=0.75), kept_for_w_bytes=(5.0, 5.0)),
        Network.uniform(2, latency=0.5, bandwidth=INF), 3)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["counting", "reservoir"])
def test_gradients_kept_for_w_are_counted_exactly(rule) -> None:
    costs, network, m = KEPT
    optimum = {limit: brute_force(costs, network, m, limit=limit, split=True, fifo=True) for limit in (9.0, 10.0)}
    assert optimum[9.0] > optimum[10.0]  # the kept gradients bind
    result = synthesize(costs, network, m, memory_limit=9.0, time_limit=10, memory_rule=rule)
    check_result(result, costs, network, 9.0)
    assert result.status == "optimal"
    assert result.makespan_s == pytest.approx(optimum[9.0], rel=1e-12)
    # the solver's own model counts them: its optimum is the true one, so is its bound
    assert result.solver_makespan_s == pytest.approx(optimum[9.0], rel=1e-12)
    assert result.lower_bound_s == pytest.approx(optimum[9.0], rel=1e-12)


@pytest.mark.slow
def test_recompute_decisions_are_optimal_and_keep_the_cap() -> None:
    # stage activations 4 B, kept input 1 B: a cap of 5 B holds one microbatch without
    # recompute, or several with it (at the price of a second forward in I)
    costs, network = uneven(2), Network.uniform(2, latency=0.0, bandwidth=INF)
    every = [frozenset(c) for r in range(3) for c in itertools.combinations(range(2), r)]
    result = synthesize(costs, network, 2, memory_limit=5.0, allow_recompute=True, time_limit=10)
    check_result(result, costs, network, 5.0)
    optimum = brute_force(costs, network, 2, limit=5.0, split=True, recompute_options=every)
    without = brute_force(costs, network, 2, limit=5.0, split=True)
    assert result.status == "optimal"
    assert result.makespan_s == pytest.approx(optimum, rel=1e-12)
    assert optimum < without  # recompute pays off here, and the solver takes it
    assert result.recompute
    # a checkpointed stage keeps its 1-byte input and its I redoes its forward (uneven(2):
    # F = 1, 1.25 s; I = 1.5, 1.25 s; 4 bytes of activations)
    chosen = set(result.recompute)
    assert result.costs.backward_input == tuple(i + f if s in chosen else i
                                                for s, (f, i) in enumerate([(1.0, 1.5), (1.25, 1.25)]))
    assert result.costs.activation_bytes == tuple(1.0 if s in chosen else 4.0 for s in range(2))
    assert result.costs.backward_weight == costs.backward_weight


def test_recompute_lets_a_cap_below_one_microbatch_work() -> None:
    costs, network = uneven(2), Network.uniform(2, latency=0.0, bandwidth=INF)
    with pytest.raises(PipeschedError, match=r"memory_limit=3.*allow recompute"):
        synthesize(costs, network, 3, memory_limit=3.0, time_limit=5)
    result = synthesize(costs, network, 3, memory_limit=3.0, allow_recompute=True, time_limit=5)
    check_result(result, costs, network, 3.0)
    assert result.recompute == (0, 1)



def test_a_stage_checkpoint_changes_only_what_it_recomputes_and_keeps_every_other_field() -> None:
    costs = StageCosts(forward=(1.0, 2.0, 3.0), backward_input=(4.0, 5.0, 6.0), backward_weight=(0.5, 0.5, 0.5),
                       activation_bytes=(100.0, 200.0, 300.0), output_bytes=(7.0, 8.0, 9.0),
                       backward=(4.4, 5.4, 6.4), static_bytes=(10.0, 20.0, 30.0), grad_bytes=(1.0, 2.0, 3.0),
                       input_frees=0.25, kept_for_w_bytes=(11.0, 12.0, 13.0), frozen=(False, False, True),
                       recompute_s=(0.1, 0.2, 0.3), forward_backward=(4.0, 5.0, 6.0), fb_cost=0.75)
    done = costs.checkpointed([0, 2])
    # stages 0 and 2: I and B redo F (1 s, 3 s), which is recompute time; they keep their
    # input only: stage 0 the embedding output (7 B), stage 2 stage 1's output (8 B)
    assert done.backward_input == (5.0, 5.0, 9.0)
    assert done.backward == (5.4, 5.4, 9.4)
    assert done.recompute_s == (1.1, 0.2, 3.3)
    assert done.activation_bytes == (7.0, 200.0, 8.0)
    # everything else as it was
    assert done.forward == (1.0, 2.0, 3.0) and done.backward_weight == (0.5, 0.5, 0.5)
    assert done.output_bytes == (7.0, 8.0, 9.0) and done.static_bytes == (10.0, 20.0, 30.0)
    assert done.grad_bytes == (1.0, 2.0, 3.0) and done.kept_for_w_bytes == (11.0, 12.0, 13.0)
    assert done.input_frees == 0.25 and done.frozen == (False, False, True)
    assert done.forward_backward == (4.0, 5.0, 6.0) and done.fb_cost == 0.75 and done.unit == "s"
    # without recompute times known, only the checkpointed stages have some
    assert StageCosts.uniform(2, forward=2.0).checkpointed([1]).recompute_s == (0.0, 2.0)
    with pytest.raises(PipeschedError, match="recompute_stages"):
        costs.checkpointed([3])


def test_the_solver_counts_the_gradients_a_checkpointed_stage_leaves_for_w() -> None:
    # 4 B of activations (1 B kept with a checkpoint) and 3 B of gradients I leaves for W:
    # a checkpointed microbatch still holds 1 + 3 B between I and W
    costs = dataclasses.replace(uneven(2), kept_for_w_bytes=(3.0, 3.0))
    network = Network.uniform(2, latency=0.0, bandwidth=INF)
    problem = SynthesisProblem(costs, network, 2, (4.0, 4.0), allow_recompute=True)
    assert problem.recomputed.kept_for_w_bytes == (3.0, 3.0)
    result = synthesize(costs, network, 2, memory_limit=4.0, allow_recompute=True, time_limit=5)
    check_result(result, costs, network, 4.0)
    timeline = simulate(result.schedule, result.costs, network, contention=False)
    assert max(timeline.memory.peak) <= 4.0 * (1 + 1e-9)
    # one microbatch needs 1 - 0.5 + 3 = 3.5 B as I ends, even checkpointed: a 3-byte cap is
    # refused before any search
    with pytest.raises(PipeschedError, match=r"memory_limit=3: stage 0 needs 3\.5 bytes for one microbatch"):
        SynthesisProblem(costs, network, 2, (3.0, 3.0), allow_recompute=True)

# --- the memory cap --------------------------------------------------------------------
def test_a_binding_cap_is_kept_and_costs_time() -> None:
    costs, network = uneven(4, static=10.0), Network.uniform(4, latency=0.1, bandwidth=INF)
    free = synthesize(costs, network, 8, time_limit=10)
    capped = synthesize(costs, network, 8, memory_limit=10.0 + 2 * 4.0, time_limit=10)
    check_result(capped, costs, network, 18.0)
    assert max(free.timeline.memory.peak) > 18.0  # the cap binds ...
    assert max(capped.timeline.memory.peak) <= 18.0  # ... and holds
    assert capped.makespan_s > free.makespan_s


def test_one_f_one_b_memory_target_p4_m8_is_optimal_and_matches_zb_h1() -> None:
    costs = StageCosts.uniform(4)
    network = Network.uniform(4, latency=0.0, bandwidth=INF)
    result = synthesize(costs, network, 8, memory_limit=4.0, time_limit=10)
    check_result(result, costs, network, 4.0)
    zb_h1 = simulate(generate("zb-h1", 4, 8), costs, network, contention=False).makespan
    assert result.status == "optimal"
    assert result.makespan_s <= zb_h1
    assert result.baseline is not None and result.baseline.makespan == zb_h1


@pytest.mark.parametrize(("limit", "fragment"), [(5.0, "below the 10 bytes of parameters"),
                                                  (12.0, "needs 14 bytes for one microbatch")])
def test_impossible_caps_are_refused(limit, fragment) -> None:
    costs = uneven(2, static=10.0)
    with pytest.raises(PipeschedError, match=fragment):
        synthesize(costs, Network.uniform(2, latency=0.0, bandwidth=INF), 2, memory_limit=limit)


def test_sizes_are_bounded_before_anything_is_built() -> None:
    with pytest.raises(PipeschedError, match="size=p64 x m1024"):
        synthesize(StageCosts.uniform(64), Network.uniform(64, latency=0.0, bandwidth=INF), 1024)


def test_without_a_solver_answer_the_heuristics_give_the_schedule_and_the_bound_stays(monkeypatch) -> None:
    # what happens at sizes the solver cannot close: it returns a bound but no schedule
    from pipesched.search import synthesis
    from pipesched.search.cpsat import SolverOutcome

    costs, network = uneven(4), Network.uniform(4, latency=0.3, bandwidth=INF)
    grid = IntegerProblem.build(SynthesisProblem(costs, network, 6, (12.0,) * 4))
    monkeypatch.setattr(synthesis, "solve", lambda ip, **_: SolverOutcome("unknown", None, None, ip.lower_bound, 0.0))
    result = synthesize(costs, network, 6, memory_limit=12.0, time_limit=2.0)
    check_result(result, costs, network, 12.0)
    assert result.status == "feasible" and result.solver_status == "unknown"
    assert result.method in ("local search", "list scheduling", result.baseline.family)
    assert result.makespan_s <= result.baseline.makespan
    assert result.lower_bound_s == pytest.approx(grid.lower_bound * grid.time_unit)


# --- the pieces ----------------------------------------------------------------------------
def _one_pattern(schedule: Schedule) -> bool:
    """One replica, and each stage runs the same op kinds for every microbatch (DualPipeV
    fuses some backwards into B and splits others)."""
    kinds_of = {}
    for _, op in schedule.ops():
        kinds_of.setdefault((op.stage, op.microbatch), set()).add(op.kind)
    by_stage = {}
    for (stage, _), kinds in kinds_of.items():
        by_stage.setdefault(stage, set()).add(frozenset(kinds))
    return schedule.placement.num_replicas == 1 and all(len(v) == 1 for v in by_stage.values())


@pytest.mark.parametrize("name", [n for n in FAMILIES if _one_pattern(generate(n, 4, 8))])
def test_microbatch_order_relabelling_keeps_times_and_memory(name) -> None:
    schedule = generate(name, 4, 8)
    p = schedule.num_stages
    costs = StageCosts(forward=tuple(1.0 + 0.1 * s for s in range(p)), backward_input=(1.3,) * p,
                       backward_weight=tuple(0.7 + 0.05 * s for s in range(p)),
                       activation_bytes=tuple(2.0 + s for s in range(p)), output_bytes=(1.0,) * p)
    network = Network.uniform(4, latency=0.3, bandwidth=4.0)
    relabelled = schedule.with_ops(in_microbatch_order(schedule.device_ops))
    before = simulate(schedule, costs, network, contention=False)
    after = simulate(relabelled, costs, network, contention=False)
    assert validate(relabelled) == []
    assert after.makespan == pytest.approx(before.makespan, rel=1e-12)
    assert after.memory.peak == pytest.approx(before.memory.peak, rel=1e-12)


def test_every_list_scheduling_rule_gives_a_valid_plan_within_the_cap() -> None:
    costs, network = uneven(4), Network.uniform(4, latency=0.2, bandwidth=INF)
    problem = SynthesisProblem(costs, network, 6, (14.0,) * 4)
    tried = 0
    for priority, in_flight, recompute in rules(problem):
        plan = list_schedule(problem, priority=priority, in_flight=in_flight, recompute=recompute)
        assert plan is not None
        schedule = Schedule("list", Placement.one_per_device(4), 6, plan.device_ops)
        assert validate(schedule) == []
        assert fits(problem, evaluate(problem, plan))
        tried += 1
    assert tried >= 6


def test_local_search_improves_a_poor_start_and_keeps_the_cap() -> None:
    costs, network = uneven(3), Network.uniform(3, latency=0.0, bandwidth=INF)
    problem = SynthesisProblem(costs, network, 4, (12.0,) * 3)
    # GPipe's order holds every microbatch at once: with one in flight, start from F, I, W
    # of each microbatch in turn
    slow = Plan(tuple(tuple(Op(s, k, mb) for mb in range(4) for k in (F, I, W)) for s in range(3)))
    start = evaluate(problem, slow)
    better = improve(problem, start, seconds=3.0)
    assert better.makespan < start.makespan
    assert fits(problem, better)
    assert validate(Schedule("ls", Placement.one_per_device(3), 4, better.plan.device_ops)) == []


def test_baseline_is_the_fastest_fitting_one_stage_family() -> None:
    costs, network = uneven(4), Network.uniform(4, latency=0.1, bandwidth=INF)
    problem = SynthesisProblem(costs, network, 8, (16.0,) * 4)
    baseline = best_family(problem)
    times = {}
    for name in ("1f1b", "gpipe", "zb-h1", "zb-h2"):
        timeline = simulate(generate(name, 4, 8), costs, network, contention=False)
        if max(timeline.memory.peak) <= 16.0 and generate(name, 4, 8).splits_backward:
            times[name] = timeline.makespan
    assert baseline is not None
    assert baseline.makespan <= min(times.values())


def test_the_lower_bound_holds_for_the_heuristics_too() -> None:
    costs, network = uneven(4), Network.uniform(4, latency=0.3, bandwidth=INF)
    problem = SynthesisProblem(costs, network, 6, (12.0,) * 4)
    grid = IntegerProblem.build(problem)
    bound = grid.lower_bound * grid.time_unit
    for priority, in_flight, recompute in rules(problem):
        plan = list_schedule(problem, priority=priority, in_flight=in_flight, recompute=recompute)
        assert evaluate(problem, plan).makespan >= bound - 1e-12


@pytest.mark.parametrize("name", ["problem", "plans", "synthesis"])
def test_docstring_examples_run(name) -> None:
    result = doctest.testmod(importlib.import_module(f"pipesched.search.{name}"))
    assert result.failed == 0 and result.attempted >= 1


# --- offload decisions ---------------------------------------------------------------------
# I frees 3 of 4 B; offloading stage 0's activations over a 4 B/s host link (1 s a transfer)
OFFLOAD = (uneven(2, input_frees=0.75), 3)


def _host(bandwidth: float | None) -> Network:
    return Network.uniform(2, latency=0.5, bandwidth=INF, host_bandwidth=bandwidth)


@pytest.mark.slow
def test_offload_is_a_decision_that_beats_the_cap_without_it() -> None:
    costs, m = OFFLOAD
    network = _host(4.0)
    without = synthesize(costs, network, m, memory_limit=8.0, time_limit=10)
    with_offload = synthesize(costs, network, m, memory_limit=8.0, time_limit=10, allow_offload=True)
    for result in (without, with_offload):
        check_result(result, costs, network, 8.0)
        assert result.status == "optimal"
    assert without.offload == () and without.makespan_s == pytest.approx(brute_force(costs, network, m, limit=8.0,
                                                                                      split=True, fifo=True))
    assert with_offload.offload == (0,)
    assert with_offload.makespan_s < without.makespan_s  # 12 s against 13.5 s
    assert with_offload.solver_makespan_s == pytest.approx(with_offload.makespan_s, rel=1e-9)
    kinds = {op.kind for ops in with_offload.schedule.device_ops for op in ops}
    assert {O, R} <= kinds and with_offload.to_dict()["offload_stages"] == [0]


def test_a_slow_host_link_is_not_worth_offloading_over() -> None:
    costs, m = OFFLOAD
    network = _host(0.25)  # 16 s a transfer
    result = synthesize(costs, network, m, memory_limit=8.0, time_limit=10, allow_offload=True)
    check_result(result, costs, network, 8.0)
    assert result.status == "optimal" and result.offload == ()


@pytest.mark.slow
def test_solver_offload_plans_that_break_the_cap_as_run_are_never_claimed() -> None:
    # the solver may time a forward after an offload has freed memory, but the compute stream
    # runs the forward as soon as it can: such plans are dropped, the bound stays a bound
    costs, m = OFFLOAD
    network = _host(4.0)
    result = synthesize(costs, network, m, memory_limit=5.0, time_limit=10, allow_offload=True)
    check_result(result, costs, network, 5.0)
    assert result.lower_bound_s <= brute_force(costs, network, m, limit=5.0, split=True, fifo=True) * (1 + 1e-12)


def test_offload_needs_a_host_link(cli, tmp_path) -> None:
    costs, m = OFFLOAD
    with pytest.raises(PipeschedError, match=r"^allow_offload=device 0: has no host link"):
        synthesize(costs, _host(None), m, memory_limit=8.0, allow_offload=True)
    table = tmp_path / "costs.csv"
    table.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                     "0,1,1.5,0.75,4,1\n1,1.25,1.25,1,4,1\n")
    result = cli("synthesize", "-p", "2", "-m", "3", "--stage-costs", str(table), "--latency", "0.5",
                 "--memory-limit", "8", "--allow-offload", "--time-limit", "5")
    assert result.code == 2 and "allow_offload" in result.err and "Traceback" not in result.err
    result = cli("synthesize", "-p", "2", "-m", "3", "--stage-costs", str(table), "--latency", "0.5",
                 "--memory-limit", "8", "--allow-offload", "--host-bandwidth", "4", "--time-limit", "5",
                 "-o", str(tmp_path / "s.txt"), "--json")
    assert result.code == 0, result
    assert json.loads(result.out)["offload_stages"] == [0]
    again = cli("simulate", str(tmp_path / "s.txt"), "--stage-costs", str(table), "--latency", "0.5",
                "--host-bandwidth", "4", "--no-contention", "--json")
    assert json.loads(again.out)["iteration_time_s"] == pytest.approx(json.loads(result.out)["makespan_s"])


def test_list_scheduling_counts_the_gradients_kept_for_w_as_the_simulator_does() -> None:
    # KEPT: F allocates 4 B, I frees 3 B but keeps 5 B of gradients for W (+2 B), W frees the
    # remaining 1 B and the 5 B (-6 B): each device's level along its table, worked by hand
    costs, network, m = KEPT
    change = {F: 4.0, I: 2.0, W: -6.0}
    problem = SynthesisProblem(costs, network, m, (9.0, 9.0))
    plans = [list_schedule(problem, priority=priority, in_flight=in_flight, recompute=recompute)
             for priority, in_flight, recompute in rules(problem)]
    assert any(plan is not None for plan in plans)
    for plan in filter(None, plans):
        peaks = [max(itertools.accumulate(change[op.kind] for op in ops)) for ops in plan.device_ops]
        evaluation = evaluate(problem, plan)
        assert evaluation.peak_memory == pytest.approx(peaks)  # the simulator's count is the same
        assert max(peaks) <= 9.0 and fits(problem, evaluation)  # and the cap holds, kept gradients included


@pytest.mark.parametrize("split", [True, False])
def test_list_scheduling_waits_for_the_inputs_the_rules_need(split) -> None:
    # worked by hand from the model (problem's docstring): F waits for the forward before it
    # plus the activation's link time, the backward for its own F and the gradient of the
    # stage after it plus the link time back, W for its own I; none past the first or last stage
    p = 3
    problem = SynthesisProblem(uneven(p), Network.uniform(p, latency=0.2, bandwidth=4.0), 4, split_backward=split)
    down = [problem.network.transfer_time(s, s + 1, problem.costs.output_bytes[s]) for s in range(p - 1)]
    up = [problem.network.transfer_time(s + 1, s, problem.costs.output_bytes[s]) for s in range(p - 1)]
    backward = I if split else B
    expected = {F: [(), ((F, 0, down[0]),), ((F, 1, down[1]),)],
                backward: [((F, 0, 0.0), (backward, 1, up[0])), ((F, 1, 0.0), (backward, 2, up[1])), ((F, 2, 0.0),)]}
    if split:
        expected[W] = [((I, s, 0.0),) for s in range(p)]
    assert problem.kinds == ((F, I, W) if split else (F, B))
    assert {kind: [inputs_of(problem, kind, s) for s in range(p)] for kind in problem.kinds} == expected
