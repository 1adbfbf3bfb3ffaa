"""Several iterations back to back: asynchronous pipelines (PipeDream, PipeDream-2BW) against
the flushed baseline, weight versions and staleness, zero bubble's optimizer
post-validation (``--steady-state``), and the per-family settings of a comparison."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipesched.compare import compare
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments import Point, evaluate
from pipesched.experiments.evaluation import sim_schedule
from pipesched.experiments.point import family_settings
from pipesched.generators import FAMILIES, formula, generate
from pipesched.simulate import Network, simulate
from pipesched.simulate.iterations import compile_iterations, steady_state
from pipesched.slots import slot_table, table_costs, table_metrics
from pipesched.weight_versions import weight_versions


def _slots(schedule, f=1.0, i=1.0, w=1.0):
    return table_costs(schedule, StageCosts.slots(f, i, w))


# --- asynchronous pipelines ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pipedream", "pipedream-2bw"])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (6, 6), (8, 32)])
@pytest.mark.parametrize(("f", "i", "w"), [(1, 1, 1), (1, 2, 1), (2, 1, 1)])
def test_async_steady_iteration_is_the_busiest_devices_work(name, p, m, f, i, w):
    schedule = generate(name, p, m, iterations=4)
    found = steady_state(schedule, _slots(schedule, f, i, w))
    assert found.iteration_time == pytest.approx(m * (f + i + w))
    assert found.iteration_time == pytest.approx(max(found.busy_per_iteration))
    assert found.bubble_ratio == pytest.approx(0.0, abs=1e-12)
    # the flushed baseline pays 1F1B's ramp every iteration
    flushed = steady_state(generate("pipedream-flush", p, m), _slots(schedule, f, i, w))
    assert flushed.iteration_time == pytest.approx((m + p - 1) * (f + i + w))


def test_async_steady_iteration_with_uneven_stages_is_the_slowest_stage():
    costs = StageCosts.uniform(4, forward=1.0, backward_input=1.0, backward_weight=1.0)
    costs = StageCosts((1.0, 1.0, 1.5, 1.0), costs.backward_input, costs.backward_weight, costs.activation_bytes,
                       costs.output_bytes)
    schedule = generate("pipedream", 4, 8, iterations=5)
    found = steady_state(schedule, costs, Network.uniform(4, latency=0.0, bandwidth=float("inf")))
    assert found.iteration_time == pytest.approx(8 * 3.5)
    assert found.iteration_time == pytest.approx(max(found.busy_per_iteration))


def test_weight_versions_and_staleness_of_each_family():
    p, m = 4, 8
    stashing = steady_state(generate("pipedream", p, m, iterations=4), _slots(generate("1f1b", p, m)))
    assert stashing.weights.versions == (4, 3, 2, 1)  # p - s on stage s
    assert [max(row) for row in stashing.weights.staleness] == [3, 2, 1, 0]  # p - s - 1 updates behind
    double = steady_state(generate("pipedream-2bw", p, m, iterations=4), _slots(generate("1f1b", p, m)))
    assert double.weights.versions == (2, 2, 2, 2)
    assert double.weights.max_staleness == 1 and double.weights.mean_staleness == 1.0
    flushed = steady_state(generate("pipedream-flush", p, m), _slots(generate("1f1b", p, m)))
    assert flushed.weights.versions == (1, 1, 1, 1) and flushed.weights.max_staleness == 0


def test_versions_are_in_the_memory_model():
    # one stage's weights (bf16) are static / 9 bytes: stage s keeps p - s - 1 extra copies
    static, activation = 9e9, 1e9
    costs = StageCosts.uniform(4, activation_bytes=activation)
    costs = StageCosts(costs.forward, costs.backward_input, costs.backward_weight, costs.activation_bytes,
                       costs.output_bytes, static_bytes=(static,) * 4)
    network = Network.uniform(4, latency=0.0, bandwidth=float("inf"))
    for name, extra in (("pipedream", (3, 2, 1, 0)), ("pipedream-2bw", (1, 1, 1, 1))):
        compiled = compile_iterations(generate(name, 4, 8, iterations=3), costs, network)
        assert compiled.graph.static_bytes == tuple(static + x * static / 9 for x in extra)
        found = steady_state(generate(name, 4, 8, iterations=3), costs, network)
        assert max(found.timeline.memory.peak) == pytest.approx(static + extra[0] * static / 9 + 4 * activation)


def test_too_few_weight_versions_are_refused(cli):
    with pytest.raises(PipeschedError, match=r"^versions=2: pipedream's 1F1B order keeps microbatches of 4"):
        generate("pipedream", 4, 8, versions=2)
    with pytest.raises(PipeschedError, match=r"^versions=1: pipedream-2bw's 1F1B order"):
        generate("pipedream-2bw", 4, 8, versions=1)
    assert generate("pipedream-2bw", 4, 8, versions=3).execution.updates.versions == (2, 2, 2, 2)
    result = cli("show", "pipedream-2bw", "-p", "4", "-m", "8", "--set", "versions=1")
    assert result.code == 2 and result.err.startswith("pipesched: error: versions=1:")
    assert result.err.count("\n") == 1 and not result.out


def test_async_table_is_one_continuous_order():
    table = generate("pipedream", 3, 4, iterations=2)
    assert table.num_microbatches == 8 and table.iteration_microbatches == 4
    assert table.device_ops == generate("1f1b", 3, 8).device_ops  # no ramp between iterations


# --- several iterations of a synchronous family ---------------------------------------------
@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v", "chimera", "dualpipe", "interleaved-1f1b"])
def test_flushed_iterations_repeat_the_single_iteration(name):
    schedule = generate(name, 4, 8)
    costs = _slots(schedule, 1, 2, 1)
    compiled = compile_iterations(schedule, costs, iterations=3)
    assert compiled.graph.num_ops == 3 * schedule.num_ops
    found = steady_state(schedule, costs, iterations=3)
    one = slot_table(schedule, StageCosts.slots(1, 2, 1)).makespan
    assert found.iteration_end == pytest.approx((one, 2 * one, 3 * one))
    # post-validation (each stage steps on its own) never waits longer than the flush
    steady = steady_state(schedule, costs, iterations=3, steady=True)
    assert steady.iteration_time <= found.iteration_time + 1e-9
    assert steady.weights.max_staleness == 0


def test_steady_state_overlaps_iterations_where_the_order_allows():
    # ZB-V's first device starts the next iteration's forwards before the last device ends
    schedule = generate("zb-v", 4, 8)
    flushed = steady_state(schedule, _slots(schedule), iterations=4)
    steady = steady_state(schedule, _slots(schedule), iterations=4, steady=True)
    assert steady.iteration_time < flushed.iteration_time


def test_replicated_stages_all_reduce_every_iteration():
    schedule = generate("chimera", 4, 8)
    costs = StageCosts((1.0,) * 4, (1.0,) * 4, (1.0,) * 4, (1.0,) * 4, (1e6,) * 4, static_bytes=(9e9,) * 4)
    network = Network.uniform(4, latency=0.01, bandwidth=1e9)
    one = simulate(schedule, costs, network)
    found = steady_state(schedule, costs, network, iterations=3)
    reduces = int(np.sum(found.timeline.transfers.kind == 2))
    assert reduces == 3 * int(np.sum(one.transfers.kind == 2))
    assert found.iteration_end[0] == pytest.approx(one.makespan)


def test_weight_versions_of_a_hand_timeline():
    timeline = slot_table(generate("1f1b", 3, 6))
    found = weight_versions(timeline, update_every=1)
    # one iteration of 1F1B read as PipeDream's per-microbatch updates
    assert found.versions == (3, 2, 1)


# --- levels and the command line -------------------------------------------------------------
def test_async_levels_report_the_steady_state():
    record = evaluate(Point("pipedream-2bw", p=4, m=8, stage_costs=StageCosts.uniform(1), latency=0.0))
    formula_level, table, sim = record.results
    assert formula_level.iteration_time == table.iteration_time == 24.0
    assert table.steady_state and sim.steady_state and table.asynchronous
    assert sim.iteration_time == pytest.approx(24.0 / 4)  # 4 stages of a 1-second model
    assert (table.staleness, table.weight_versions) == (1, 2)
    flushed = evaluate(Point("pipedream-flush", p=4, m=8, stage_costs=StageCosts.uniform(1))).results
    assert flushed[1].iteration_time == 33.0 and not flushed[1].steady_state


def test_steady_state_option_on_every_family():
    point = Point("zb-v", p=4, m=8, stage_costs=StageCosts.uniform(1), latency=0.0)
    plain = evaluate(point).results
    steady = evaluate(point.replace(steady_state=True)).results
    assert steady[0].iteration_time == plain[0].iteration_time  # the closed form: one iteration
    assert steady[1].steady_state and steady[1].iteration_time < plain[1].iteration_time
    assert steady[2].iteration_time < plain[2].iteration_time


def test_compare_shows_async_families_beside_the_others(cli, tmp_path):
    costs = tmp_path / "c.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,0\n")
    result = cli("compare", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--schedules",
                 "pipedream-flush,pipedream,pipedream-2bw,1f1b", "--json")
    assert result.code == 0, result.err
    records = {(r["schedule"], r["level"]): r for r in json.loads(result.out)["records"]}
    assert records["pipedream", "sim"]["staleness"] == 3 and records["pipedream", "sim"]["weight_versions"] == 4
    assert records["pipedream-flush", "sim"]["staleness"] is None
    assert records["pipedream", "table"]["iteration_time_slots"] < records["1f1b", "table"]["iteration_time_slots"]
    text = cli("compare", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--schedules", "pipedream,1f1b")
    assert "pipedream (async)" in text.out and "staleness 3 updates" in text.out


def test_simulate_steady_state_json(cli, tmp_path):
    costs = tmp_path / "c.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,0\n")
    result = cli("simulate", "zb-v", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--steady-state", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    steady = data["steady_state"]
    assert steady["mode"] == "steady" and steady["iterations"] == 4
    assert data["iteration_time_s"] == pytest.approx(steady["steady_iteration_time"])
    plain = json.loads(cli("simulate", "zb-v", "-p", "4", "-m", "8", "--stage-costs", str(costs), "--json").out)
    assert plain["steady_state"] is None and data["iteration_time_s"] < plain["iteration_time_s"]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "flag"), [("pipedream", []), ("pipedream-2bw", []), ("zb-v", ["--steady-state"])])
def test_every_label_shows_the_steady_state_iteration_and_the_users_m(cli, tmp_path, family, flag):
    # the terminal header, the summary table's title, the HTML metrics and the PNG title
    # speak of one steady-state iteration of m microbatches, not of the whole run drawn
    costs = tmp_path / "c.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,0\n")
    args = ["simulate", family, "-p", "4", "-m", "8", "--stage-costs", str(costs), *flag]
    data = json.loads(cli(*args, "--json").out)
    ends = data["steady_state"]["iteration_end"]
    time = (ends[-2] - ends[0]) / (len(ends) - 2)  # the mean iteration between the first and the last
    assert data["iteration_time_s"] == pytest.approx(time) and data["m"] == 8
    # the one cost row splits over the stages: each device computes m x (F + I + W) / p = 6 s
    # per iteration
    assert data["bubble_ratio"] == pytest.approx(1 - 6.0 / time, abs=1e-9)
    text = cli(*args, "--html", str(tmp_path / "r.html"), "--png", str(tmp_path / "r.png")).out
    header = text.splitlines()[0]
    assert f"steady-state iteration {time:.4g} s" in header and "m=8 back to back" in header
    assert f"bubble {data['bubble_ratio']:.1%}" in header
    assert f"{family}: p=4, m=8," in text
    page = (tmp_path / "r.html").read_text()
    row = re.search(r'id="metrics-table">.*?<tbody><tr[^>]*>(.*?)</tr>', page).group(1)
    values = re.findall(r'data-value="([^"]*)"', row)
    assert float(values[4]) == 8 and float(values[6]) == pytest.approx(time)
    assert float(values[7]) == pytest.approx(data["bubble_ratio"])


# --- zb-1p and zb-2p from the workload's costs --------------------------------------------------
def test_cost_planning_families_plan_with_the_workload(tmp_path):
    stage_costs = StageCosts((1.0, 1.0, 1.0, 2.0), (1.0, 1.0, 1.5, 1.0), (0.5, 0.5, 0.5, 0.5), (1.0,) * 4,
                             (1e6,) * 4, input_frees=0.75)
    point = Point("zb-1p", p=4, m=8, stage_costs=stage_costs, latency=0.1, bandwidth=1e8)
    built = sim_schedule(point, point.setup())
    assert built.params["latency"] == pytest.approx(0.1 + 1e6 / 1e8)
    assert built.params["m_w"] == pytest.approx(0.25)
    expected = generate("zb-1p", 4, 8, costs=stage_costs, latency=0.1 + 1e6 / 1e8, m_w=0.25)
    assert built.device_ops == expected.device_ops
    assert built.device_ops != generate("zb-1p", 4, 8).device_ops
    # the table level keeps the slot costs' table; an explicit option wins
    assert point.build_schedule().device_ops == generate("zb-1p", 4, 8).device_ops
    given = point.replace(options=(("latency", 0.0),))
    assert sim_schedule(given, given.setup()).params["latency"] == 0.0


# --- per-family settings of a comparison -------------------------------------------------------
def test_per_family_options_and_chunks():
    result = compare(["hanayo", "interleaved-1f1b", "chimera", "zb-v"], p=4, m=8, v=4, levels=("formula", "table"),
                     workload=Point(options=(("chimera.forward_doubling", 0), ("hanayo.waves", 2))))
    assert not result.skipped
    table = {r.schedule: r for r in result.results if r.level == "table"}
    assert table["interleaved-1f1b"].peak_inflight == max(table_metrics(generate("interleaved-1f1b", 4, 8, v=4))
                                                          .peak_inflight)
    form = {r.schedule: r for r in result.results if r.level == "formula"}
    assert form["chimera"].iteration_time == formula("chimera", 4, 8, forward_doubling=0).makespan
    assert form["hanayo"].iteration_time == formula("hanayo", 4, 8, waves=2).makespan * 4 / 16


@pytest.mark.parametrize(("args", "field"), [
    (["--set", "hanayo.foo=1"], "option=hanayo.foo"),
    (["--set", "chimera.waves=2"], "option=chimera.waves"),
    (["--set", "gpipe.waves=2"], "option=gpipe.waves"),
    (["--set", "waves=2", "--schedules", "1f1b,chimera"], "option=waves"),
    (["-v", "4", "--schedules", "chimera,zb-v"], "v=4"),
    (["--set", "fb_cost=0.3"], "fb_cost=0.3"),
])
def test_bad_settings_are_one_line_exit_2(cli, args, field):
    if "--schedules" not in args:
        args = [*args, "--schedules", "hanayo,chimera"]
    result = cli("compare", "-p", "4", "-m", "8", "--levels", "formula", *args)
    assert result.code == 2, result
    assert result.err.startswith(f"pipesched: error: {field}") and result.err.count("\n") == 1


def test_family_settings_prefer_the_prefixed_option():
    assert family_settings(["hanayo", "zb-v"], {"waves": 1, "hanayo.waves": 3}) == {"hanayo": {"waves": 3}, "zb-v": {}}


def test_formula_takes_family_options(cli):
    assert formula("hanayo", 4, 16, waves=2) == formula("hanayo", 4, 16, v=4)
    assert formula("dualpipev", 4, 8, fused=0).note.endswith("the table idles less than this")
    with pytest.raises(PipeschedError, match=r"^option=waves: chimera does not take it"):
        formula("chimera", 4, 8, waves=2)
    plain = cli("show", "chimera", "-p", "4", "-m", "16")
    unit = cli("show", "chimera", "-p", "4", "-m", "16", "--set", "forward_doubling=0")
    last = next(line for line in unit.out.splitlines() if line.startswith("# formula"))
    assert last != next(line for line in plain.out.splitlines() if line.startswith("# formula"))
    assert f"makespan {formula('chimera', 4, 16, forward_doubling=0).makespan:g}" in last
    fb = cli("show", "dualpipe", "-p", "4", "-m", "8", "--set", "fb_cost=0.8")
    assert fb.code == 0 and f"makespan {formula('dualpipe', 4, 8, costs=StageCosts.slots(fb_cost=0.8)).makespan:g}" in fb.out


def test_every_family_is_listed_with_its_kind():
    assert [name for name, family in FAMILIES.items() if family.asynchronous] == ["pipedream", "pipedream-2bw"]
    assert [name for name, family in FAMILIES.items() if family.plans_with_costs] == ["zb-1p", "zb-2p"]
    assert {name for name, family in FAMILIES.items() if family.takes_v} == {"interleaved-1f1b", "looped-bfs", "hanayo"}


@pytest.mark.parametrize(("filename", "name", "options"), [
    ("pipedream_p4_m4_k2.txt", "pipedream", {"iterations": 2}),
    ("pipedream-2bw_p4_m4_k2.txt", "pipedream-2bw", {"iterations": 2}),
    ("pipedream-flush_p4_m8.txt", "pipedream-flush", {}),
])
def test_golden_tables(golden, filename, name, options):
    from pipesched.io.grid import dumps
    from pipesched.validation import validate

    p, m = (4, 4) if options else (4, 8)
    schedule = generate(name, p, m, **options)
    assert validate(schedule) == []
    golden.check(filename, dumps(schedule))


@pytest.mark.parametrize("module", ["pipesched.weight_versions", "pipesched.simulate.iterations",
                                    "pipesched.generators.pipedream", "pipesched.generators.dualpipe",
                                    "pipesched.generators.dualpipev", "pipesched.generators", "pipesched.compare",
                                    "pipesched.ops", "pipesched.costs"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
