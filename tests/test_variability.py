"""Monte Carlo over durations: the duration models, the samples, their statistics, the
commands, and an independent sampler.

The mean is never below the deterministic iteration time without channel contention: the
engine's iteration time is then a longest path over a fixed graph, a maximum of sums of
durations, so it is convex in them; with mean-1 factors Jensen's inequality gives
E[T(d f)] >= T(d). On a finite sample it holds exactly once each op's sampled factors are
rescaled to a sample mean of exactly 1 (then the mean of T over the samples is at least T
of the mean durations, which is T(d)); the library's own samples are checked against it
within their standard error. With contention the order in which a channel serves its
transfers follows the durations, the iteration time is no longer convex in them, and the
mean can fall below (a test shows one such table).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.io.stage_costs import save_stage_costs
from pipesched.limits import MAX_CLUSTER_RANKS, MAX_NUMBER_CHARS
from pipesched.simulate import Network, compile_graph, run, run_batch, simulate
from pipesched.simulate.iterations import compile_iterations, run_iterations
from pipesched.variability import (
    MAX_SAMPLES,
    Sampler,
    Variability,
    monte_carlo,
    paired_comparison,
    parse_jitter,
    parse_repeats,
    repeats_csv,
)
from simulate_helpers import random_costs, random_valid_schedule


def graph_of(name: str, p: int = 4, m: int = 8, *, seed: int = 3, contention: bool = True, latency: float = 0.05,
             bandwidth: float = 20.0):
    schedule = generate(name, p, m)
    costs = random_costs(schedule.num_stages, seed)
    return compile_graph(schedule, costs, Network.uniform(p, latency=latency, bandwidth=bandwidth),
                         contention=contention)


# --- the duration models ------------------------------------------------------------------
def test_zero_jitter_gives_the_deterministic_run_in_every_sample():
    graph = graph_of("zb-h1")
    timeline = run(graph)
    result = monte_carlo(graph, Variability(jitter=parse_jitter("0"), samples=7))
    assert np.all(result.makespan == timeline.makespan)
    np.testing.assert_allclose(result.bubble, timeline.bubble_ratio(), rtol=1e-12)
    assert result.time.std == 0 and result.time.p99 == timeline.makespan
    assert result.memory_constant and result.peak_memory[0].tolist() == list(timeline.memory.peak)


def test_lognormal_factors_have_mean_one_and_the_cv_asked_for():
    graph = graph_of("1f1b")
    sampler = Sampler(graph, Variability(jitter=(("F", 0.3), ("link", 0.5)), samples=20_000, seed=5))
    ops, transfers = sampler.draw(20_000)
    forward = graph.ops.kind == generate("1f1b", 4, 8).rules.index("F")
    factors = ops[:, forward] / graph.op_duration[forward]
    assert factors.mean() == pytest.approx(1.0, abs=0.01)
    assert factors.std() / factors.mean() == pytest.approx(0.3, rel=0.03)
    # kinds without jitter keep their compiled durations
    np.testing.assert_array_equal(ops[:, ~forward], np.broadcast_to(graph.op_duration[~forward], ops[:, ~forward].shape))
    link = transfers / graph.tr_duration
    assert link.mean() == pytest.approx(1.0, abs=0.01)
    assert link.std() == pytest.approx(0.5, rel=0.05)


def test_samples_do_not_depend_on_batches_and_repeat_with_the_seed():
    graph = graph_of("interleaved-1f1b")
    variability = Variability(jitter=parse_jitter("0.2"), random_straggler=(0.1, 2.0), samples=30, seed=9)
    whole = Sampler(graph, variability).draw(30)
    sampler = Sampler(graph, variability)
    parts = [sampler.draw(10), sampler.draw(20)]
    np.testing.assert_array_equal(whole[0], np.vstack([parts[0][0], parts[1][0]]))
    np.testing.assert_array_equal(whole[1], np.vstack([parts[0][1], parts[1][1]]))
    again = monte_carlo(graph, variability).makespan
    np.testing.assert_array_equal(again, monte_carlo(graph, variability).makespan)
    assert not np.array_equal(again, monte_carlo(graph, dataclasses.replace(variability, seed=10)).makespan)


def scaled_device(costs: StageCosts, stages: set[int], factor: float) -> StageCosts:
    def scale(values):
        return tuple(v * factor if s in stages else v for s, v in enumerate(values))

    return dataclasses.replace(costs, forward=scale(costs.forward), backward_input=scale(costs.backward_input),
                               backward_weight=scale(costs.backward_weight))


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v"])
def test_a_straggler_equals_scaling_that_devices_costs(name):
    schedule = generate(name, 4, 8)
    costs = random_costs(schedule.num_stages, 4)
    network = Network.uniform(4, latency=0.05, bandwidth=20.0)
    graph = compile_graph(schedule, costs, network)
    held = {s for replica in schedule.placement.replicas for s, d in enumerate(replica) if d == 2}
    expected = simulate(schedule, scaled_device(costs, held, 1.7), network).makespan
    result = monte_carlo(graph, Variability(stragglers=((2, 1.7),), samples=3))
    np.testing.assert_allclose(result.makespan, expected, rtol=1e-12)
    # a random straggler that always strikes slows every device
    everyone = simulate(schedule, scaled_device(costs, set(range(schedule.num_stages)), 1.7), network).makespan
    always = monte_carlo(graph, Variability(random_straggler=(1.0, 1.7), samples=3))
    np.testing.assert_allclose(always.makespan, everyone, rtol=1e-12)


def test_a_slow_link_equals_a_network_with_that_link_slower():
    schedule = generate("1f1b", 4, 8)
    costs = random_costs(4, 2)
    latency, bandwidth = np.full((4, 4), 0.05), np.full((4, 4), 20.0)
    graph = compile_graph(schedule, costs, Network(latency=latency, bandwidth=bandwidth, node_of=(0, 0, 1, 1)))
    latency[1, 2] = latency[2, 1] = 0.15
    bandwidth[1, 2] = bandwidth[2, 1] = 20.0 / 3
    slower = simulate(schedule, costs, Network(latency=latency, bandwidth=bandwidth, node_of=(0, 0, 1, 1))).makespan
    result = monte_carlo(graph, Variability(slow_links=((1, 2, 3.0),), samples=2))
    np.testing.assert_allclose(result.makespan, slower, rtol=1e-12)


def test_measured_repeats_are_drawn_as_factors_of_their_median():
    text = repeats_csv([{"F": (2.0, 1.0, 3.0), "B": (1.0, 1.0)}, {"F": (4.0, 4.0, 4.0), "B": (2.0, 1.0, 3.0)}])
    factors = parse_repeats(text)
    assert factors.for_stages("F", 2)[0].tolist() == [0.5, 1.0, 1.5]
    # a schedule with twice the stages reads each file stage for two of its stages
    assert [a.tolist() for a in factors.for_stages("B", 4)] == [[1.0, 1.0]] * 2 + [[0.5, 1.0, 1.5]] * 2
    schedule = generate("gpipe", 2, 64)
    costs = StageCosts.uniform(2, forward=1.0, backward_input=0.5, backward_weight=0.5)
    graph = compile_graph(schedule, costs, Network.uniform(2, latency=0.0, bandwidth=float("inf")))
    ops, _ = Sampler(graph, Variability(measured=factors, samples=3000, seed=1)).draw(3000)
    first = graph.ops.stage == 0
    forward = graph.ops.kind == schedule.rules.index("F")
    values, counts = np.unique(ops[:, first & forward], return_counts=True)
    assert values.tolist() == [0.5, 1.0, 1.5]
    np.testing.assert_allclose(counts / counts.sum(), 1 / 3, atol=0.02)
    assert np.all(ops[:, ~first & forward] == 1.0)  # stage 1's F repeats are all equal


# --- the mean and the deterministic iteration time ----------------------------------------
# derandomized: the same examples every run, so the statistical check below (a mean within
# four standard errors) cannot fail by chance in one run and pass in the next
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(family=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "chimera"]),
       p=st.integers(2, 4), m=st.integers(1, 6), seed=st.integers(0, 10_000), cv=st.sampled_from([0.05, 0.3, 1.0]))
def test_the_mean_never_lies_below_the_deterministic_iteration_time(family, p, m, seed, cv):
    base = generate(family, 2 * (p // 2), 2 * (p // 2)) if family == "chimera" else generate(family, p, m)
    schedule = random_valid_schedule(base, seed)
    costs = random_costs(schedule.num_stages, seed)
    network = Network.uniform(schedule.num_devices, latency=0.05, bandwidth=3.0)
    graph = compile_graph(schedule, costs, network, contention=False)
    deterministic = run(graph).makespan
    variability = Variability(jitter=(("ops", cv), ("link", cv)), samples=200, seed=seed)
    ops, transfers = Sampler(graph, variability).draw(200)
    # exact: each op's and link's factors rescaled to a sample mean of 1 (Jensen, convexity)
    ops = ops / ops.mean(axis=0) * graph.op_duration
    transfers = transfers / transfers.mean(axis=0) * graph.tr_duration if graph.num_transfers else transfers
    assert run_batch(graph, ops, transfers).makespan.mean() >= deterministic * (1 - 1e-12)
    # the library's own samples: within four standard errors
    result = monte_carlo(graph, variability)
    assert result.time.mean >= result.deterministic - 4 * result.time.stderr - 1e-12


def test_with_contention_jitter_can_reorder_a_channel_and_beat_the_deterministic_run():
    # FIFO channels serve transfers in completion order: ties of the deterministic run break
    # by table order, and jitter may find a better order. Convexity (and Jensen) hold only
    # for a fixed order: without contention.
    schedule = random_valid_schedule(generate("zb-v", 4, 3), 0)
    costs = random_costs(schedule.num_stages, 0)
    network = Network.uniform(4, latency=0.05, bandwidth=3.0)
    variability = Variability(jitter=(("ops", 0.05), ("link", 0.05)), samples=400, seed=0)
    contended = monte_carlo(compile_graph(schedule, costs, network), variability)
    assert contended.time.mean < contended.deterministic - 3 * contended.time.stderr
    free = monte_carlo(compile_graph(schedule, costs, network, contention=False), variability)
    assert free.time.mean >= free.deterministic


# --- an independent sampler ---------------------------------------------------------------
def longest_path_sampler(schedule, costs, latency):
    """Per-op durations -> iteration time, by a longest path over the device order and the
    data dependencies (each remote input ``latency`` seconds late), in pure Python."""
    device_of = {op: d for d, op in schedule.ops()}
    order = [op for _, op in schedule.ops()]
    preds = {op: [(q, latency if device_of[q] != device_of[op] else 0.0) for q in schedule.predecessors(op)]
             for op in order}
    for ops in schedule.device_ops:
        for before, after in itertools.pairwise(ops):
            preds[after].append((before, 0.0))
    # a topological order: repeat until every op is placed
    placed, topo = set(), []
    while len(topo) < len(order):
        for op in order:
            if op not in placed and all(q in placed for q, _ in preds[op]):
                placed.add(op)
                topo.append(op)

    def makespan(duration):
        end = {}
        for op in topo:
            start = max((end[q] + delay for q, delay in preds[op]), default=0.0)
            end[op] = start + duration[op]
        return max(end.values())

    return makespan


def test_the_monte_carlo_mean_matches_an_independent_sampler():
    schedule = generate("1f1b", 3, 4)
    costs = random_costs(3, 11)
    cv, samples = 0.3, 3000
    graph = compile_graph(schedule, costs, Network.uniform(3, latency=0.05, bandwidth=float("inf")), contention=False)
    ours = monte_carlo(graph, Variability(jitter=(("ops", cv),), samples=samples, seed=2)).time
    sigma = math.sqrt(math.log1p(cv * cv))
    rng = np.random.default_rng(12345)
    makespan = longest_path_sampler(schedule, costs, 0.05)
    ops = [op for _, op in schedule.ops()]
    factors = rng.lognormal(-sigma * sigma / 2, sigma, size=(samples, len(ops)))
    theirs = np.array([makespan({op: costs.duration(op) * f for op, f in zip(ops, row, strict=True)})
                       for row in factors])
    error = math.hypot(ours.stderr, theirs.std(ddof=1) / math.sqrt(samples))
    assert abs(ours.mean - theirs.mean()) < 4 * error
    assert ours.mean > run(graph).makespan  # the deterministic run predicts low


# --- sensitivity and comparisons ----------------------------------------------------------
def test_a_straggling_device_sets_the_iteration_time():
    graph = graph_of("1f1b", seed=6)
    result = monte_carlo(graph, Variability(jitter=parse_jitter("0.05"), stragglers=((2, 3.0),), samples=300))
    devices = [i for i in result.influences if i.group == "device"]
    stages = [i for i in result.influences if i.group == "stage"]
    assert devices[0].name == 2 and stages[0].name == 2
    assert devices[0].critical_share > 0.5
    # the shares add up: every sample's critical path spans its iteration time
    total = sum(i.critical_share for i in devices) + sum(i.critical_share for i in result.influences
                                                         if i.group == "link")
    assert total == pytest.approx(1.0, rel=1e-9)
    assert result.critical_ops[0][2] == 1.0  # the first op is on every sample's path


def test_schedules_compared_on_common_random_numbers():
    one, gpipe = graph_of("1f1b"), graph_of("gpipe")
    variability = Variability(jitter=parse_jitter("0.3"), samples=400, seed=4)
    a, b = Sampler(one, variability).draw(5)[0], Sampler(gpipe, variability).draw(5)[0]
    # the first op of device 0 is F(0, 0) in both tables: the same factor in every sample
    np.testing.assert_array_equal(a[:, 0], b[:, 0])
    same = monte_carlo(one, variability).makespan
    paired = paired_comparison(["x", "y"], [same, same])
    assert paired.fastest == (0.5, 0.5) and paired.flip_share == 0.0
    mixed = paired_comparison(["slow", "fast"], [same + 1.0, same])
    assert mixed.names == ("fast", "slow") and mixed.fastest == (1.0, 0.0) and mixed.beats_next == (1.0, None)


# --- the commands -------------------------------------------------------------------------
@pytest.fixture
def cost_file(tmp_path):
    path = tmp_path / "costs.csv"
    save_stage_costs(StageCosts.uniform(4, forward=0.01, backward_input=0.01, backward_weight=0.01,
                                        activation_bytes=1e8, output_bytes=1e6), path)
    return str(path)


def test_simulate_jitter_zero_keeps_the_deterministic_time(cli, cost_file):
    result = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", cost_file, "--latency", "1e-4",
                 "--bandwidth", "1e9", "--jitter", "0", "--samples", "5", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    spread = data["variability"]
    assert spread["samples"] == 5
    assert spread["mean_s"] == spread["p50_s"] == spread["p99_s"] == data["iteration_time_s"]
    assert spread["std_s"] == 0
    assert spread["bubble"]["mean"] == pytest.approx(data["bubble_ratio"], rel=1e-12)
    assert spread["peak_memory"] == {"constant": True, "bytes": data["peak_memory_bytes"]}


def test_simulate_with_jitter_reports_the_distribution_and_what_sets_it(cli, cost_file):
    result = cli("simulate", "zb-h1", "-p", "4", "-m", "8", "--stage-costs", cost_file, "--latency", "1e-4",
                 "--bandwidth", "1e9", "--jitter", "F=0.1,I=0.1,W=0.2,link=0.3", "--straggler", "1:1.2",
                 "--samples", "300", "--seed", "3", "--json")
    assert result.code == 0, result
    spread = json.loads(result.out)["variability"]
    assert spread["p50_s"] <= spread["p90_s"] <= spread["p99_s"] <= spread["max_s"]
    assert spread["mean_s"] > json.loads(result.out)["iteration_time_s"]
    assert spread["sensitivity"]["devices"][0]["device"] == 1
    assert {"stages", "devices", "links", "kinds", "ops"} <= set(spread["sensitivity"])

def test_simulate_with_jitter_prints_the_distribution_and_draws_it(cli, cost_file, tmp_path):
    page = tmp_path / "one.html"
    text = cli("simulate", "zb-h1", "-p", "4", "-m", "8", "--stage-costs", cost_file, "--jitter", "0.1",
               "--samples", "50", "--no-timeline", "--html", str(page))
    assert text.code == 0, text
    assert "variability: 50 samples" in text.out and "what sets the iteration time" in text.out
    data = json.loads(page.read_text().split('id="report-data">')[1].split("</script>")[0])
    (row,) = data["distributions"]["rows"]
    assert row["name"] == "zb-h1" and row["samples"] == 50 and sum(row["counts"]) == 50 and row["fastest"] is None


def test_compare_ranks_by_mean_with_the_chance_of_being_fastest(cli, cost_file, tmp_path):
    page = tmp_path / "report.html"
    result = cli("compare", "--schedules", "1f1b,zb-h1,zb-v", "-p", "4", "-m", "8", "--stage-costs", cost_file,
                 "--jitter", "0.2", "--samples", "200", "--json", "--html", str(page))
    assert result.code == 0, result
    paired = json.loads(result.out)["variability"]
    rows = paired["rows"]
    assert [row["rank"] for row in rows] == [1, 2, 3]
    assert [row["mean_s"] for row in rows] == sorted(row["mean_s"] for row in rows)
    assert sum(row["fastest_probability"] for row in rows) == pytest.approx(1.0)
    assert 0.0 <= paired["ranking_flip_share"] <= 1.0
    assert all(row["p99_s"] >= row["mean_s"] for row in rows)
    text = page.read_text()
    assert 'id="distributions"' in text and '"distributions"' in text


@pytest.mark.parametrize(("flags", "fragments"), [
    (("--jitter", "-0.1"), ("jitter ops=-0.1", "coefficient of variation")),
    (("--jitter", "nan"), ("jitter ops=nan",)),
    (("--jitter", "F=0.1,X=0.2"), ("jitter=X", "unknown op kind")),
    (("--straggler", "2:0"), ("straggler factor=0", "factor > 0")),
    (("--straggler", "9:2"), ("straggler=9", "no such device")),
    (("--jitter", "0.1", "--samples", str(MAX_SAMPLES + 1)), (f"samples={MAX_SAMPLES + 1}", f"{MAX_SAMPLES:,}")),
    (("--jitter", "0.1", "--samples", "0"), ("samples=0",)),
    (("--random-straggler", "1.5:2"), ("random straggler probability=1.5",)),
    (("--slow-link", "1-1:2"), ("slow link=1-1",)),
    (("--jitter", "link:2-2=0.3"), ("jitter=2-2", "two different devices")),
    (("--random-straggler", "0.5"), ("random straggler=0.5", "PROBABILITY:SLOWDOWN")),
    (("--slow-link", "1-2:0"), ("slow link factor=0", "factor > 0")),
    (("--seed", "3"), ("seed=3", "--jitter")),
    (("--jitter-file", "missing.repeats.csv"), ("jitter_file=missing.repeats.csv",)),
    # numbers and device numbers are read by limits' one parser: bounded, one wording
    (("--straggler", "x:1.5"), ("straggler='x'", "not a whole number")),
    (("--slow-link", f"0-{MAX_CLUSTER_RANKS}:2"), (f"slow link={MAX_CLUSTER_RANKS}", "over the limit")),
    (("--jitter", "1" * (MAX_NUMBER_CHARS + 1)), ("jitter=", f"at most {MAX_NUMBER_CHARS}")),
])
def test_bad_variability_input_is_one_line(cli, cost_file, flags, fragments):
    result = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", cost_file, *flags)
    assert_one_line_error(result, *fragments)


def test_compare_needs_the_sim_level_for_variability(cli):
    result = cli("compare", "--schedules", "1f1b", "-p", "2", "-m", "4", "--levels", "formula", "--jitter", "0.1")
    assert_one_line_error(result, "levels=formula", "sim level")


def test_a_bad_repeats_file_is_one_line(cli, cost_file, tmp_path):
    path = tmp_path / "bad.repeats.csv"
    path.write_text("stage,kind,repeat,seconds\n0,F,0,-1\n")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", cost_file,
                              "--jitter-file", str(path)), "seconds=-1.0")
    with pytest.raises(PipeschedError, match="header"):
        parse_repeats("stage,kind,seconds\n")
    with pytest.raises(PipeschedError, match=f"seconds=.*at most {MAX_NUMBER_CHARS}"):
        parse_repeats(f"stage,kind,repeat,seconds\n0,F,0,{'1' * (MAX_NUMBER_CHARS + 1)}\n")
    with pytest.raises(PipeschedError, match="repeat='x': not a whole number"):
        parse_repeats("stage,kind,repeat,seconds\n0,F,x,1.0\n")


# --- fused entries and iterations back to back --------------------------------------------
def test_a_fused_entry_is_drawn_as_one_op_of_its_fused_kind():
    graph = graph_of("dualpipe")
    ops = graph.ops
    fused_letter = "OVERLAP_F_B"
    fused = graph.schedule.rules.index(fused_letter)
    tails = ops.tails()
    heads = (ops.entry_kind == fused) & ~tails
    assert heads.any() and tails.any()
    drawn, _ = Sampler(graph, Variability(jitter=((fused_letter, 0.3),), samples=4000, seed=2)).draw(4000)
    factors = drawn[:, heads] / graph.op_duration[heads]
    assert factors.mean() == pytest.approx(1.0, abs=0.02)
    assert factors.std() == pytest.approx(0.3, rel=0.05)
    # the entry's other parts take no time; every plain op keeps its compiled duration
    assert np.all(drawn[:, tails] == 0.0)
    np.testing.assert_array_equal(drawn[:, ~heads], np.broadcast_to(graph.op_duration[~heads], drawn[:, ~heads].shape))
    # jitter of the forward kind leaves the fused entries, whose first part is a forward, alone
    forward, _ = Sampler(graph, Variability(jitter=(("F", 0.3),), samples=50, seed=2)).draw(50)
    np.testing.assert_array_equal(forward[:, heads], np.broadcast_to(graph.op_duration[heads], (50, heads.sum())))


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_the_ops_most_on_the_critical_path_are_table_entries(name):
    graph = graph_of(name)
    schedule = graph.schedule
    result = monte_carlo(graph, Variability(jitter=parse_jitter("0.2"), samples=300, seed=1), top_ops=40)
    entries = {(str(op), device) for device, table in enumerate(schedule.device_ops) for op in table}
    named = [(op, device) for op, device, _ in result.critical_ops]
    assert set(named) <= entries and len(set(named)) == len(named)
    assert any("OVERLAP_F_B" in op for op, _ in named)
    # a fused entry is one task of its kind on the path, not one per part
    kinds = {i.name: i for i in result.influences if i.group == "kind"}
    assert "OVERLAP_F_B" in kinds
    parts = {op: share for op, _, share in result.critical_ops}
    assert all(0.0 < share <= 1.0 for share in parts.values())


def _steady_graph(name: str, p: int = 4, m: int = 8):
    schedule = generate(name, p, m, iterations=4) if FAMILIES[name].asynchronous else generate(name, p, m)
    costs = random_costs(schedule.num_stages, 5)
    return compile_iterations(schedule, costs, Network.uniform(p, latency=0.05, bandwidth=20.0), iterations=4)


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "pipedream", "pipedream-2bw"])
def test_a_steady_state_sample_is_the_mean_iteration_between_the_first_and_the_last(name):
    compiled = _steady_graph(name)
    graph, k = compiled.graph, compiled.iterations
    variability = Variability(jitter=parse_jitter("0.2"), random_straggler=(0.2, 1.5), samples=6, seed=3)
    result = monte_carlo(compiled, variability)
    ops, transfers = Sampler(graph, variability, iterations=compiled).draw(6)
    for i in range(6):
        timeline = run(graph, op_durations=ops[i], transfer_durations=None if transfers is None else transfers[i])
        # each iteration ends with its last op or transfer, from the run's first start
        ends = np.zeros(k)
        np.maximum.at(ends, compiled.op_iteration, timeline.op_end - timeline.origin)
        np.maximum.at(ends, compiled.transfer_iteration, timeline.transfers.end - timeline.origin)
        assert result.makespan[i] == pytest.approx((ends[k - 2] - ends[0]) / (k - 2), rel=1e-12)
    assert result.deterministic == pytest.approx(run_iterations(compiled).iteration_time, rel=1e-12)
    still = monte_carlo(compiled, Variability(jitter=parse_jitter("0"), samples=3))
    np.testing.assert_allclose(still.makespan, result.deterministic, rtol=1e-12)


def test_the_first_iteration_of_a_steady_state_shares_the_one_iterations_random_numbers():
    compiled = _steady_graph("1f1b")
    one = graph_of("1f1b", seed=5)
    variability = Variability(jitter=parse_jitter("0.3"), random_straggler=(0.3, 2.0), samples=5, seed=4)
    steady, _ = Sampler(compiled.graph, variability, iterations=compiled).draw(5)
    single, _ = Sampler(one, variability).draw(5)
    first = compiled.op_iteration == 0
    # iteration 0's rows are each device's first ops, in table order: the same factors
    steady_factors = steady[:, first] / compiled.graph.op_duration[first]
    np.testing.assert_allclose(steady_factors, single / one.op_duration, rtol=1e-12)
    later = compiled.op_iteration == 1
    assert not np.allclose(steady[:, later] / compiled.graph.op_duration[later], steady_factors)


def test_compare_with_jitter_ranks_every_family(cli, cost_file):
    result = cli("compare", "-p", "4", "-m", "8", "--stage-costs", cost_file, "--latency", "1e-4",
                 "--bandwidth", "1e9", "--jitter", "0.1", "--samples", "50", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    ranked = {row["schedule"] for row in data["variability"]["rows"]}
    assert ranked == set(FAMILIES), data.get("skipped")


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev", "pipedream", "pipedream-2bw"])
def test_compare_with_jitter_takes_fused_and_asynchronous_families(cli, cost_file, name):
    result = cli("compare", "--schedules", f"1f1b,{name}", "-p", "4", "-m", "8", "--stage-costs", cost_file,
                 "--jitter", "0.1", "--samples", "40", "--json")
    assert result.code == 0, result
    rows = json.loads(result.out)["variability"]["rows"]
    assert {row["schedule"] for row in rows} == {"1f1b", name}


def test_simulate_a_steady_state_with_jitter(cli, cost_file):
    result = cli("simulate", "zb-h1", "-p", "4", "-m", "8", "--stage-costs", cost_file, "--steady-state",
                 "--jitter", "0", "--samples", "4", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    spread = data["variability"]
    assert spread["mean_s"] == pytest.approx(data["steady_state"]["steady_iteration_time"], rel=1e-12)
    assert spread["deterministic_s"] == pytest.approx(data["iteration_time_s"], rel=1e-12)
