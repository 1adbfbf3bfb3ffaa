"""The HTML report in a real headless browser (Debian's chromium, driven by playwright).

It loads from a file URL with no console error and no network request, draws one element
per op, shows an op's details on hover, zooms, sorts, and leaves a screenshot in
test-artifacts/report.png. In CI (CI=true) a missing browser fails the test; elsewhere it
skips.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipesched.generators import generate
from pipesched.render.views import write_views
from pipesched.slots import slot_table
from pipesched.waits import WAIT_TRANSFER, waited_for
from render_timelines import GIB, simulated, split_backward

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
EVIL = "<script>alert(1)</script> 1f1b"


def browser_or_fail():
    """playwright's sync API, after checking chromium and playwright are there."""
    problems = []
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        problems.append("chromium is missing (Debian: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problems.append("playwright is missing (pip install 'pipesched[browser]')")
        sync_playwright = None
    if problems:
        message = "browser test cannot run: " + "; ".join(problems)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    schedule = generate("1f1b", 4, 8)
    evil = split_backward(schedule.with_ops(schedule.device_ops, name=EVIL))
    timelines = [simulated(evil, capacity=3 * GIB), simulated(generate("gpipe", 4, 8)),
                 slot_table(generate("1f1b", 4, 8))]
    path = tmp_path_factory.mktemp("report") / "report.html"
    comparison = [{"schedule": "1f1b", "level": "formula", "bubble": 0.2727},
                  {"schedule": "gpipe", "level": "table", "bubble": 0.2727}]
    rng = np.random.default_rng(0)
    distributions = [{"name": EVIL, "samples": 0.030 * rng.lognormal(0, 0.05, 400), "deterministic": 0.029,
                      "fastest": 0.75},
                     {"name": "gpipe", "samples": 0.031 * rng.lognormal(0, 0.05, 400), "deterministic": 0.030,
                      "fastest": 0.25}]
    write_views(timelines, html=path, comparison=comparison, title="browser test", distributions=distributions)
    return path, timelines, distributions


@pytest.mark.slow
def test_report_in_chromium(report) -> None:
    sync_playwright = browser_or_fail()
    path, timelines, distributions = report
    url = path.as_uri()
    executable = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("dialog", lambda dialog: (problems.append("dialog: " + dialog.message), dialog.dismiss()))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]", timeout=15_000)

            # one element per op, one per transfer
            assert page.locator("[data-op]").count() == sum(len(t) for t in timelines)
            assert page.locator("[data-transfer]").count() == sum(len(t.transfers) for t in timelines)
            # the hostile schedule name is shown as text, never run
            assert page.locator("#metrics-table tbody tr").first.inner_text().startswith(EVIL)

            # hover 1I3 of the first timeline: its details and what it waited for
            timeline = timelines[0]
            row = next(r for r in range(len(timeline)) if str(timeline.op(r)) == "1I3")
            waits = waited_for(timeline)
            assert waits.cause[row] == WAIT_TRANSFER  # its gradient comes from device 2
            page.hover(f'[data-op="0:{row}"]')
            tooltip = page.locator("#tooltip")
            tooltip.wait_for(state="visible", timeout=5_000)
            text = tooltip.inner_text()
            start_ms = (timeline.op_start[row] - timeline.origin) * 1e3
            for expected in ("1I3", "backward (input)", "stage: 1", "microbatch: 3", "device: d1",
                             f"start: {float(f'{start_ms:.3g}'):g} ms", "duration: 1 ms",
                             "waited for: gradient transfer of microbatch 3 from d2 to d1"):
                assert expected in text, f"{expected!r} not in tooltip {text!r}"
            # the transfer it waited for is outlined
            assert page.locator(f'[data-transfer="0:{int(waits.ref[row])}"].cause').count() == 1

            # zoom in with the button: the op boxes stretch
            before = page.locator(f'[data-op="0:{row}"]').bounding_box()["width"]
            page.locator(".panel").first.get_by_role("button", name="+").click()
            page.wait_for_timeout(100)
            after = page.locator(f'[data-op="0:{row}"]').bounding_box()["width"]
            assert after > before * 1.3
            page.mouse.move(10, 10)

            # sort the metrics by bubble, largest first
            header = page.locator("#metrics-table th", has_text="bubble / work")
            header.click()
            header.click()
            assert header.get_attribute("aria-sort") == "descending"
            worst = max(timelines, key=lambda t: t.bubble_ratio())
            first = page.locator("#metrics-table tbody tr").first.inner_text()
            assert first.startswith(worst.schedule.name) and worst.source in first

            # one distribution plot per schedule on one time axis; a bar tells its range and count
            assert page.locator("[data-distribution]").count() == len(distributions)
            assert page.locator("[data-distribution] h3").first.inner_text().startswith(EVIL)
            bars = page.locator('[data-distribution="0"] [data-bin]')
            assert 1 <= bars.count() <= 40
            bars.first.hover()
            tooltip.wait_for(state="visible", timeout=5_000)
            assert "iteration time" in tooltip.inner_text() and "of 400" in tooltip.inner_text()
            for name in ("deterministic", "mean", "p99"):
                assert page.locator(f".dist-{name}").count() == len(distributions)
            page.mouse.move(10, 10)
            check_distribution_axes(page, distributions)

            page.get_by_role("button", name="reset").first.click()
            page.wait_for_timeout(100)
            ARTIFACTS.mkdir(exist_ok=True)
            page.hover(f'[data-op="0:{row}"]')
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert set(requests) == {url}
    assert (ARTIFACTS / "report.png").stat().st_size > 20_000


def percent(share: float) -> str:
    """A share as the pages print it: signed, one decimal."""
    return f"{share:+.1%}"


def check_distribution_axes(page, distributions) -> None:
    """Every distribution plot has its own time axis and a count axis up to the tallest bar of
    the page; each says how often it beats the next, and the page how often the order flips."""
    samples = [np.asarray(d["samples"]) for d in distributions]
    edges = np.linspace(min(min(x.min() for x in samples), *(d["deterministic"] for d in distributions)),
                        max(max(x.max() for x in samples), *(d["deterministic"] for d in distributions)), 41)
    tallest = max(int(np.histogram(x, bins=edges)[0].max()) for x in samples)
    # one legend names the bars and the three lines every plot draws
    legend = page.locator(".dist-legend").inner_text()
    assert page.locator(".dist-legend").count() == 1
    for mark in ("samples per bin", "deterministic iteration time", "mean", "p99"):
        assert mark in legend
    for k in range(len(distributions)):
        heading = page.locator(f'[data-distribution="{k}"] h3').inner_text()
        deterministic = float(f"{distributions[k]['deterministic'] * 1e3:.4g}")
        assert f"deterministic {deterministic:g} ms" in heading
        plot = page.locator(f'[data-distribution="{k}"] svg')
        text = plot.text_content()
        assert plot.locator(".tick").count() >= 2 and "time (ms)" in text
        counts = [int(c) for c in plot.locator("[data-count]").evaluate_all(
            "nodes => nodes.map(n => n.getAttribute('data-count'))")]
        assert counts[0] == 0 and counts[-1] == tallest and "samples" in text
    by_mean = sorted(range(len(samples)), key=lambda k: samples[k].mean())
    first, second = (samples[k] for k in by_mean)
    beats = float(np.mean(first < second))
    heading = page.locator(f'[data-distribution="{by_mean[0]}"] h3').inner_text()
    assert f"faster than {distributions[by_mean[1]]['name']} in {100 * beats:.1f}% of samples" in heading
    flips = float(np.mean(second < first))
    assert f"differs from the order by mean in {flips:.1%} of the samples" in page.locator(".order-note").inner_text()


@pytest.fixture(scope="module")
def comparison_page(tmp_path_factory):
    from pipesched.pairing import Comparison
    from pipesched.render.views import write_comparison_views
    from render_timelines import measured_like

    comparisons = []
    for family in ("1f1b", "zb-h1"):
        predicted = simulated(generate(family, 2, 4))
        measured = measured_like(predicted, seed=len(comparisons))
        steps = tuple(measured.makespan * f for f in (0.97, 1.0, 1.04, 1.1, 0.99))
        comparisons.append(Comparison(predicted, measured, steps, predicted_p50=predicted.makespan * 1.03,
                                      predicted_p99=predicted.makespan * 1.12))
    path = tmp_path_factory.mktemp("check") / "check.html"
    write_comparison_views(comparisons, html=path, summary=[{"schedule": c.predicted.schedule.name} for c in comparisons])
    return path, comparisons


@pytest.mark.slow
def test_comparison_page_in_chromium(comparison_page) -> None:
    from pipesched.pairing import deviations

    sync_playwright = browser_or_fail()
    path, comparisons = comparison_page
    url = path.as_uri()
    executable = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]", timeout=15_000)

            # one element per op in each timeline: predicted = timeline 2k, measured = 2k + 1
            for k, comparison in enumerate(comparisons):
                assert page.locator(f'[data-op^="{2 * k}:"]').count() == len(comparison.predicted)
                assert page.locator(f'[data-op^="{2 * k + 1}:"]').count() == len(comparison.measured)
                assert page.locator(f"#steps-{k} [data-step]").count() == len(comparison.step_times)

            # hovering an op outlines its counterpart, both ways
            predicted, measured = comparisons[0].predicted, comparisons[0].measured
            found = deviations(predicted, measured)
            row = next(r for r in range(len(predicted)) if str(predicted.op(r)) == "1B2")
            partner = int(found.partner[row])
            page.hover(f'[data-op="0:{row}"]')
            assert page.locator(f'[data-op="1:{partner}"].linked').count() == 1
            tip = page.locator("#tooltip").inner_text()
            assert "measured duration" in tip
            # one sign on the page: the op's error and a step's error are (predicted - measured) / measured
            predicted_duration = predicted.op_end[row] - predicted.op_start[row]
            measured_duration = measured.op_end[partner] - measured.op_start[partner]
            assert f"duration error: {percent(predicted_duration / measured_duration - 1)}" in tip
            page.hover("#steps-0 [data-step='0']")
            step = comparisons[0].step_times[0]
            assert f"error: {percent(predicted.makespan / step - 1)}" in page.locator("#tooltip").inner_text()
            page.hover(f'[data-op="0:{row}"]')
            page.hover(f'[data-op="1:{partner}"]')
            assert page.locator(f'[data-op="0:{row}"].linked').count() == 1
            assert page.locator(".linked").count() == 1
            page.mouse.move(5, 5)

            # the deviation list comes largest first, and sorts by any column
            table = page.locator("#deviations-0-table")

            def column(index: int) -> list[float]:
                return [float(v) for v in table.locator(f"tbody tr td:nth-child({index})").evaluate_all(
                    "cells => cells.map(c => c.getAttribute('data-value'))")]

            sizes = column(8)
            assert sizes == sorted(sizes, reverse=True) and sizes[0] == pytest.approx(abs(found.duration).max())
            table.locator("th", has_text="predicted start").click()
            starts = column(3)
            assert starts == sorted(starts)
            # a row outlines its op in both timelines
            first = table.locator("tbody tr").first
            _, pred_row, meas_row = (int(x) for x in first.get_attribute("data-link").split(":"))
            first.hover()
            assert page.locator(f'[data-op="0:{pred_row}"].linked, [data-op="1:{meas_row}"].linked').count() == 2
            page.mouse.move(5, 5)

            # zoom on the predicted panel: the measured panel follows
            before = [page.locator(f'[data-op="{i}:0"]').bounding_box()["width"] for i in (0, 1)]
            page.locator(".pair").first.locator(".panel").first.get_by_role("button", name="+").click()
            page.wait_for_timeout(150)
            after = [page.locator(f'[data-op="{i}:0"]').bounding_box()["width"] for i in (0, 1)]
            assert after[0] > 1.3 * before[0] and after[1] > 1.3 * before[1]
            # the other schedule has its own view
            other = page.locator('[data-op="2:0"]').bounding_box()["width"]
            page.locator(".pair").nth(1).locator(".panel").first.get_by_role("button", name="reset").click()
            page.wait_for_timeout(150)
            assert page.locator('[data-op="2:0"]').bounding_box()["width"] == pytest.approx(other, abs=0.5)

            check_page_colours_band_and_tables(page, comparisons)

            ARTIFACTS.mkdir(exist_ok=True)
            page.hover(f'[data-op="0:{row}"]')
            page.screenshot(path=str(ARTIFACTS / "check.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert set(requests) == {url}


def check_page_colours_band_and_tables(page, comparisons) -> None:
    """The comparison page's legend, op colours, step band, kind table and parting op."""
    from pipesched.pairing import PARTING_SHARE, deviations
    from pipesched.render.style import KIND_COLORS, KIND_NAMES, TRANSFER_NAMES

    page.wait_for_selector("body[data-check-ready=true]", timeout=5_000)
    legend = page.locator("header .legend").first.inner_text()
    drawn = [t for c in comparisons for t in (c.predicted, c.measured)]
    for kind in {int(k) for t in drawn for k in np.unique(t.box_kind)}:
        assert KIND_NAMES[kind] in legend
    for kind in {int(k) for t in drawn for k in np.unique(t.transfers.kind)}:
        assert f"{TRANSFER_NAMES[kind]} transfer" in legend
    # every op is filled with its kind's colour (first chunk: the colour itself), not its deviation
    predicted = comparisons[0].predicted
    fills = page.locator('[data-op^="0:"]').evaluate_all("nodes => nodes.map(n => n.getAttribute('fill'))")
    assert fills == [KIND_COLORS[int(k)] for k in predicted.box_kind]
    # the fill toggle colours by deviation, and back
    page.locator("#deviation-fill").check()
    assert page.locator('[data-op="0:0"]').get_attribute("fill").startswith("rgb(")
    page.locator("#deviation-fill").uncheck()
    assert page.locator('[data-op="0:0"]').get_attribute("fill") == KIND_COLORS[int(predicted.box_kind[0])]
    for k, comparison in enumerate(comparisons):
        # the step band runs from the prediction's p50 to its p99, with a legend
        band = page.locator(f"#steps-{k} .steps-band")
        assert band.count() == 1
        scale = 1e3  # the pair's unit is ms
        assert float(band.get_attribute("data-p50")) == pytest.approx(comparison.predicted_p50 * scale, rel=1e-5)
        assert float(band.get_attribute("data-p99")) == pytest.approx(comparison.predicted_p99 * scale, rel=1e-5)
        box = band.bounding_box()
        p50_line = page.locator(f"#steps-{k} .predicted-p50").bounding_box()
        assert box["x"] - 0.5 <= p50_line["x"] <= box["x"] + box["width"] + 0.5
        legend_text = page.locator(f"#steps-{k} .steps-legend").inner_text()
        assert "predicted p50" in legend_text and "p99" in legend_text and "measured step" in legend_text
        # one row per op kind of the prediction, its mean error (predicted - measured) / measured
        found = deviations(comparison.predicted, comparison.measured)
        kinds = page.locator(f"#kinds-{k}-table tbody tr")
        assert kinds.count() == len(np.unique(comparison.predicted.op_kind))
        for r in range(kinds.count()):
            cells = kinds.nth(r).locator("td")
            name = cells.nth(0).get_attribute("data-value")
            kind = KIND_NAMES.index(name)
            rows = [x for x in range(len(comparison.predicted)) if comparison.predicted.op_kind[x] == kind]
            shares = [((comparison.predicted.op_end[x] - comparison.predicted.op_start[x])
                       / (comparison.measured.op_end[found.partner[x]] - comparison.measured.op_start[found.partner[x]]))
                      - 1 for x in rows]
            assert int(cells.nth(1).get_attribute("data-value")) == len(rows)
            assert float(cells.nth(2).get_attribute("data-value")) == pytest.approx(np.mean(shares))
            assert float(cells.nth(3).get_attribute("data-value")) == pytest.approx(np.median(shares))
        # the parting op: the earliest predicted start whose measured start is off by more than the share
        span = comparison.predicted.makespan
        off = [x for x in range(len(comparison.predicted))
               if abs((comparison.measured.op_start[found.partner[x]] - comparison.measured.origin)
                      - (comparison.predicted.op_start[x] - comparison.predicted.origin)) > PARTING_SHARE * span]
        parted = page.locator(f'[data-op^="{2 * k}:"].parting')
        if off:
            first = min(off, key=lambda x: (comparison.predicted.op_start[x], x))
            assert parted.count() == 1 and parted.get_attribute("data-op") == f"{2 * k}:{first}"
        else:
            assert parted.count() == 0


def open_page(playwright, path, problems, *, timeout_ms: int = 15_000):
    """Chromium at 1600 x 1000 on the page at ``path``, once its script is ready; console
    errors and page errors go to ``problems``. Returns (browser, page): close the browser."""
    executable = str(CHROMIUM) if CHROMIUM.exists() else shutil.which("chromium")
    browser = playwright.chromium.launch(executable_path=executable)
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=timeout_ms)
    return browser, page


@pytest.mark.slow
def test_search_page_in_chromium(tmp_path, cli) -> None:
    import json

    from pipesched.render.search_page import SEARCH_COLUMNS
    from pipesched.search.results import JSON_COLUMNS

    sync_playwright = browser_or_fail()
    path = tmp_path / "search.html"
    result = cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8",
                 "--schedules", "1f1b,zb-v,interleaved-1f1b", "--chunks", "2", "--partitions", "balanced",
                 "--recompute", "selective,full", "--db", str(tmp_path / "s.sqlite"), "--json", "--html", str(path))
    assert result.code == 0, result
    (found,) = json.loads(result.out)["searches"]
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems)
        try:
            # readable headers, never the raw keys; throughput with thousands separators, MFU in percent
            headers = page.locator("#ranked-table th").all_inner_texts()
            assert [h.strip() for h in headers] == [header for _, header, _ in SEARCH_COLUMNS]
            assert not set(headers) & (set(JSON_COLUMNS) - {"schedule", "recompute", "partition"})
            best = found["best"]
            first = page.locator("#ranked-table tbody tr").first
            assert f"{best['throughput_tokens_per_s']:,.0f}" in first.inner_text()
            assert f"{best['mfu']:.1%}" in first.inner_text()
            # dots coloured by family (one colour per family), the ones out of memory hollow
            fills = page.locator("svg.pareto circle.front").evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('fill'))")
            families = page.locator("svg.pareto circle.front").evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('data-key'))")
            assert len(fills) == len(found["pareto_front"]) and len(set(fills)) > 1
            assert page.locator("svg.pareto circle.oom").count() >= 1
            assert page.locator("svg.pareto circle.oom").first.get_attribute("fill") == "none"
            # a click on a dot selects its row in the table and its timeline
            dot = page.locator("svg.pareto circle.front").last
            key = dot.get_attribute("data-key")
            dot.click()
            selected = page.locator("tr.selected")
            assert selected.count() >= 1 and all(
                k == key for k in selected.evaluate_all("rows => rows.map(r => r.getAttribute('data-key'))"))
            keys = json.loads(page.locator("#report-data").text_content())["timelineKeys"]
            assert key in keys and page.locator(".panel.selected").get_attribute("data-timeline") == str(keys.index(key))
            assert len(families) == len(set(families))
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "search.png"), full_page=False)
        finally:
            browser.close()
    assert problems == []



@pytest.mark.slow
def test_run_page_in_chromium(tmp_path) -> None:
    """A measured run's page (run --html): no console error, every step drawn, the median
    step (the lower middle one) marked, and the missing memory said."""
    import dataclasses

    from pipesched.render.html import render_html
    from pipesched.timeline import MeasuredInfo
    from render_timelines import measured_like

    sync_playwright = browser_or_fail()
    measured = measured_like(simulated(generate("1f1b", 2, 4)), seed=2)
    steps = (measured.makespan * 1.1, measured.makespan, measured.makespan * 0.9, measured.makespan * 1.3)
    waits = np.zeros(len(measured))
    info = MeasuredInfo(runtime="ours", backend="gloo", partition="1|1", dtype="float32", micro_batch_size=1,
                        seq_len=16, step=1, op_wait_s=waits, op_cpu_s=waits, step_times_s=steps)
    path = tmp_path / "run.html"
    path.write_text(render_html([dataclasses.replace(measured, measured=info)]))
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems)
        try:
            section = page.locator("section.measured")
            assert section.locator("circle[data-step]").count() == len(steps)
            median = sorted(steps)[(len(steps) - 1) // 2]
            assert f"median {median * 1e3:.4g} ms" in section.inner_text()
            assert "no memory curves" in section.inner_text()
            # the step drawn (step 2, the median here) is ringed
            assert section.locator('circle[data-step="1"]').get_attribute("stroke") == "#c0392b"
        finally:
            browser.close()
    assert problems == []
