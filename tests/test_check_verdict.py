"""The prediction check's verdicts on synthetic measurements: when the ranking can be judged
against the spread of the step times, which step is the median one, and the three
predicted figures (deterministic, Monte Carlo p50, what is drawn) from one set of costs.

A real `check` run on a loaded 2-core machine takes tens of seconds: one is kept, marked
slow; the logic is tested here on made-up step times.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import statistics
from html import escape

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.render.views import write_check_views
from pipesched.runtime.check import CheckReport, CheckRow, predict
from pipesched.runtime.profile import LinkProfile, StageTiming
from pipesched.runtime.runs import RunResult, median_step
from pipesched.simulate import Network, compile_graph, run_batch, simulate

LINK = LinkProfile("gloo", latency=1e-4, bandwidth=1e9, sizes=(), one_way_s=())
FREE = Network.uniform(2, latency=0.0, bandwidth=float("inf"))


def named(name: str):
    return dataclasses.replace(generate("1f1b", 2, 2), name=name)


def timeline_of(seconds: float, schedule):
    """A simulated timeline of ``schedule`` whose makespan is ``seconds``."""
    unit = simulate(schedule, StageCosts.uniform(2, forward=1.0, backward_input=1.0, backward_weight=1.0), FREE)
    scale = seconds / unit.makespan
    return simulate(schedule, StageCosts.uniform(2, forward=scale, backward_input=scale, backward_weight=scale), FREE)


def row(name: str, predicted: float, steps: tuple[float, ...]) -> CheckRow:
    """A schedule predicted at ``predicted`` seconds and measured at ``steps``."""
    schedule = named(name)
    measured = tuple(timeline_of(t, schedule) for t in steps)
    run = RunResult(schedule, "pytorch", "gloo", steps, measured[median_step(steps)], measured, ())
    return CheckRow(schedule, StageCosts.uniform(2), timeline_of(predicted, schedule), run)


def report(*rows: CheckRow) -> CheckReport:
    return CheckReport(rows=rows, link=LINK)


# --- the median step ------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [(3.0,), (5.0, 3.0), (5.0, 3.0, 4.0, 9.0), (2.0, 2.0, 1.0), (4.0, 1.0, 3.0, 2.0, 5.0)])
def test_the_median_step_is_a_measured_step_at_the_middle(steps):
    k = median_step(steps)
    at_most = sum(t <= steps[k] for t in steps)
    at_least = sum(t >= steps[k] for t in steps)
    # the lower middle: at least half the steps at or below it, more than half at or above it
    assert at_most >= len(steps) / 2 and at_least > len(steps) / 2
    assert steps[k] == statistics.median_low(steps)


def test_the_step_time_reported_is_the_drawn_steps():
    checked = row("a", 1.0, (1.0, 1.2, 1.1, 1.6))
    assert checked.measured_s == checked.run.timeline.makespan == pytest.approx(1.1)
    assert checked.measured_s in checked.run.step_times


# --- the ranking verdict ----------------------------------------------------------------------
def iqr(steps) -> float:
    ordered = sorted(steps)
    low, high = np.percentile(ordered, [25, 75])
    return high - low


def test_two_schedules_within_their_noise_are_too_noisy_to_judge():
    # medians 1.00 and 1.03; each schedule's steps spread over 0.2: no verdict, no tau
    noisy = report(row("a", 1.0, (0.9, 1.0, 1.1, 1.2)), row("b", 0.99, (0.93, 1.03, 1.13, 0.85)))
    a, b = noisy.rows
    assert abs(a.measured_s - b.measured_s) < max(iqr(a.run.step_times), iqr(b.run.step_times))
    assert noisy.too_noisy and noisy.ranking_agrees is None and noisy.rank_correlation is None
    assert noisy.ranking_verdict.startswith("too noisy to judge")
    data = noisy.to_dict(model="tiny", p=2, m=2)
    assert data["rank_correlation"] is None and data["ranking_agrees"] is None
    assert data["ranking_verdict"] == noisy.ranking_verdict and data["pairs"][0]["judged"] is False


def test_a_difference_beyond_both_spreads_is_judged():
    clear = report(row("a", 1.0, (1.0, 1.01, 0.99)), row("b", 2.0, (2.0, 2.02, 1.98)))
    assert not clear.too_noisy and clear.ranking_agrees is True and clear.rank_correlation == 1.0
    swapped = report(row("a", 2.0, (1.0, 1.01, 0.99)), row("b", 1.0, (2.0, 2.02, 1.98)))
    assert swapped.ranking_agrees is False and swapped.rank_correlation == -1.0
    assert "Kendall's tau -1.00 over 1 judged pair" in swapped.ranking_verdict


def test_one_step_has_no_spread_so_nothing_is_judged():
    single = report(row("a", 1.0, (1.0,)), row("b", 2.0, (5.0,)))
    assert single.too_noisy and single.rows[0].measured_iqr is None


def test_tau_is_taken_over_the_judged_pairs_only():
    rows = (row("a", 1.0, (1.0, 1.01, 0.99)), row("b", 1.5, (1.005, 1.015, 0.995)), row("c", 0.5, (3.0, 3.01, 2.99)))
    checked = report(*rows)
    # an independent count: each pair judged when the medians differ by more than both IQRs
    judged, score = 0, 0
    for x, y in itertools.combinations(rows, 2):
        measured = np.sign(y.measured_s - x.measured_s)
        if abs(y.measured_s - x.measured_s) > max(iqr(x.run.step_times), iqr(y.run.step_times)):
            judged += 1
            score += measured * np.sign(y.predicted_s - x.predicted_s)
    assert judged == 2 and len(checked.judged) == judged
    assert checked.rank_correlation == pytest.approx(score / judged)
    assert "1 of 3 pairs too noisy to judge" in checked.ranking_verdict


# --- the predictions: one set of costs --------------------------------------------------------
def timing(forward: float, backward: float, repeats: dict[str, tuple[float, ...]]) -> StageTiming:
    return StageTiming(forward=forward, backward_input=backward / 2, backward_weight=backward / 2, backward=backward,
                       activation_bytes=1e6, output_bytes=1e5, params=1000,
                       repeats=tuple((kind, times) for kind, times in repeats.items()))


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_without_noise_the_monte_carlo_median_is_the_prediction(scale):
    # every repeat of a kind equal: factors of exactly 1 over the costs the prediction uses,
    # whatever the repeats' own level (scale) is
    timings = [timing(0.01, 0.02, {"F": (0.01 * scale,) * 4, "B": (0.02 * scale,) * 4}),
               timing(0.012, 0.025, {"F": (0.012 * scale,) * 4, "B": (0.025 * scale,) * 4})]
    network = Network.uniform(2, latency=LINK.latency, bandwidth=LINK.bandwidth)
    found = predict(generate("1f1b", 2, 4), timings, network, overhead_s=2e-4, samples=50)
    assert np.all(found.spread.makespan == found.timeline.makespan)
    assert found.spread.time.p50 == found.timeline.makespan == found.spread.deterministic


def test_with_noise_each_op_draws_one_of_its_repeats():
    rng = np.random.default_rng(1)
    repeats = [{"F": tuple(0.01 * rng.lognormal(0, 0.5, 9)), "B": tuple(0.02 * rng.lognormal(0, 0.5, 9))}
               for _ in range(2)]
    timings = [timing(float(np.median(r["F"])), float(np.median(r["B"])), r) for r in repeats]
    network = Network.uniform(2, latency=LINK.latency, bandwidth=LINK.bandwidth)
    schedule, overhead, samples = generate("1f1b", 2, 4), 1e-4, 4000
    found = predict(schedule, timings, network, overhead_s=overhead, samples=samples)
    # the deterministic prediction: each kind's median repeat plus the overhead
    assert found.costs.forward[0] == pytest.approx(np.median(repeats[0]["F"]) + overhead)
    assert found.timeline.makespan == found.spread.deterministic
    # an independent Monte Carlo of the same rule: every op takes one of its stage's repeats
    # of its kind, uniformly at random, plus the overhead
    graph = compile_graph(schedule, found.costs, network)
    letters = schedule.rules.letters
    drawn = np.empty((samples, graph.num_ops))
    for k in range(graph.num_ops):
        times = np.asarray(repeats[int(graph.ops.stage[k])][letters[int(graph.ops.kind[k])]])
        drawn[:, k] = rng.choice(times, samples) + overhead
    independent = run_batch(graph, drawn).makespan
    assert found.spread.time.p50 == pytest.approx(float(np.median(independent)), rel=0.02)
    assert found.spread.time.mean == pytest.approx(float(independent.mean()), rel=0.02)


# --- the comparison page draws the reported step ----------------------------------------------
def test_the_page_marks_the_median_step_it_draws(tmp_path):
    checked = report(row("a", 1.0, (1.0, 1.3, 1.1, 1.6)), row("b", 2.0, (2.0, 2.2)))
    (page,) = write_check_views(checked, html=str(tmp_path / "check.html"), title="check")
    text = page.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)[1])
    for comparison, checked_row in zip(data["comparisons"], checked.rows, strict=True):
        scale = comparison["steps"][0] / checked_row.run.step_times[0]
        assert comparison["measuredTime"] == pytest.approx(checked_row.measured_s * scale)
        assert comparison["measuredTime"] in [pytest.approx(t) for t in comparison["steps"]]
    assert escape(checked.ranking_verdict) in text


# --- one real check, as a user types it -------------------------------------------------------
@pytest.mark.slow
def test_check_reports_the_drawn_median_step_and_a_verdict(cli, tmp_path):
    pytest.importorskip("torch")
    page = tmp_path / "check.html"
    result = cli("check", "--schedules", "gpipe,1f1b", "-p", "2", "-m", "4", "--model", "tiny", "-s", "16",
                 "--steps", "4", "--warmup", "1", "--html", str(page))
    assert result.code == 0, result.err
    assert "measured: the median step" in result.out
    shown = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                 page.read_text(), re.S)[1])["comparisons"]
    medians, spreads = [], []
    text = page.read_text()
    for k, comparison in enumerate(shown):
        # the prediction's p50-p99 band and the error per op kind are on the page
        assert 0 < comparison["predictedP50"] <= comparison["predictedP99"]
        assert f'id="kinds-{k}-table"' in text
        steps = comparison["steps"]
        assert len(steps) == 4 and comparison["measuredTime"] == statistics.median_low(steps)
        medians.append(comparison["measuredTime"])
        spreads.append(iqr(steps))
    judged = abs(medians[0] - medians[1]) > max(spreads)
    verdict = result.out.split("median |error|")[1]
    assert ("too noisy to judge" not in verdict and "Kendall's tau" in verdict) == judged


# --- one sign for the prediction error ------------------------------------------------------
def test_the_page_and_the_json_state_one_error(tmp_path):
    # predicted 1.0 s, measured median step 1.25 s: the prediction is 20% short of the run
    checked = report(row("a", 1.0, (1.25, 1.3, 1.1)), row("b", 2.0, (1.6, 1.6)))
    rows = checked.to_dict(model="tiny", p=2, m=2)["rows"]
    assert [r["error"] for r in rows] == pytest.approx([(1.0 - 1.25) / 1.25, (2.0 - 1.6) / 1.6])
    (page,) = write_check_views(checked, html=str(tmp_path / "check.html"), title="check")
    text = page.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)[1])
    summary = re.search(r'<table class="sortable" id="comparison-table">(.*?)</table>', text, re.S)[1]
    header = re.findall(r"<th[^>]*>(.*?)</th>", summary)
    errors = [re.findall(r"<td[^>]*>(.*?)</td>", tr)[header.index("error")]
              for tr in re.findall(r"<tr>(.*?)</tr>", summary.split("<tbody>")[1])]
    assert errors == [f"{r['error']:+.1%}" for r in rows] == ["-20.0%", "+25.0%"]
    # the figures line under each schedule's heading, and every step's error, say the same
    for r, comparison in zip(rows, data["comparisons"], strict=True):
        assert f"error {r['error']:+.1%} (predicted − measured) / measured" in text
        assert comparison["stepError"] == pytest.approx([(r["predicted_s"] - t) / t for t in r["step_times_s"]])
    # the ops' errors take the same sign: each measured op is scaled as its whole step
    for r, timeline in zip(rows, data["timelines"][::2], strict=True):
        shown = [e for e in timeline["deviation"] if e is not None]
        assert shown and shown == pytest.approx([r["error"]] * len(shown), rel=1e-3)


@pytest.mark.slow
def test_a_real_check_states_one_error_in_its_json_and_its_page(cli, tmp_path):
    pytest.importorskip("torch")
    page = tmp_path / "check.html"
    result = cli("check", "--schedules", "1f1b", "-p", "2", "-m", "2", "--model", "tiny", "-s", "16",
                 "--steps", "3", "--warmup", "1", "--html", str(page), "--json")
    assert result.code == 0, result.err
    (checked,) = json.loads(result.out)["rows"]
    assert checked["error"] == pytest.approx((checked["predicted_s"] - checked["measured_s"]) / checked["measured_s"])
    text = page.read_text()
    assert f"error {checked['error']:+.1%} (predicted − measured) / measured" in text
    assert f'<td data-value="{checked["error"]:+.1%}">{checked["error"]:+.1%}</td>' in text
    (comparison,) = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                         text, re.S)[1])["comparisons"]
    assert comparison["stepError"] == pytest.approx(
        [(checked["predicted_s"] - t) / t for t in checked["step_times_s"]])
