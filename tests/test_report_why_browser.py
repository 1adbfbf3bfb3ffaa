"""The main report's answers in a real headless browser (Debian's chromium, playwright):
each panel on its own time axis (a steady state on one steady iteration), the legend of
every kind drawn, search across panels, the library's critical path, transfers wide
enough to see, idle gaps that say what they waited for, sorting that reorders the panels.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.render.style import KIND_NAMES, time_scale
from pipesched.render.views import write_views
from pipesched.simulate import Network, simulate
from pipesched.simulate.critical import critical_path
from pipesched.simulate.iterations import steady_state
from render_timelines import GIB, simulated
from test_report_browser import ARTIFACTS, browser_or_fail, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def fast_links(schedule):
    """Transfers of a few microseconds beside 1 ms ops: far under a pixel at full view."""
    p = schedule.num_stages
    costs = StageCosts.uniform(p, forward=1e-3, backward_input=1e-3, backward_weight=0.8e-3,
                               activation_bytes=GIB, output_bytes=2**20)
    return simulate(schedule, costs, Network.uniform(schedule.num_devices, latency=1e-6, bandwidth=1e12))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    timelines = [
        simulated(generate("1f1b", 4, 8), capacity=3 * GIB),
        simulated(generate("interleaved-1f1b", 4, 8)),
        simulated(generate("dualpipev", 4, 8)),
        fast_links(generate("zb-h1", 4, 16)),
        steady_state(generate("pipedream", 4, 8, iterations=4), StageCosts.slots().broadcast(4)).timeline,
    ]
    path = tmp_path_factory.mktemp("why") / "report.html"
    # as wide as the default compare's: 20 columns of three levels
    columns = [f"{level} {what}" for level in ("formula", "table", "sim")
               for what in ("time (slots)", "bubble", "act.", "rank", "staleness", "weight versions", "MFU")]
    comparison = [{"schedule": t.schedule.name, **{c: 0.123456 * (k + 1) for c in columns[:20]},
                   "rank changes": "table: 11 -> 12; sim: 12 -> 6"} for k, t in enumerate(timelines)]
    write_views(timelines, html=path, comparison=comparison)
    return path, timelines


def test_main_report_answers_why(report) -> None:
    sync_playwright = browser_or_fail()
    path, timelines = report
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems, timeout_ms=30_000)
        try:

            # each panel's axis ends at its own makespan; the steady state at its second iteration
            seconds = [t for t in timelines if t.unit == "s"]
            factor = time_scale("s", max(t.makespan for t in seconds)).factor
            for index, timeline in enumerate(timelines):
                svg = page.locator(f'#timeline-{index} svg.chart').first
                x0, x1 = float(svg.get_attribute("data-x0")), float(svg.get_attribute("data-x1"))
                scale = factor if timeline.unit == "s" else 1.0
                if timeline.iterations >= 3:
                    first, second = timeline.iteration_end[:2]
                    margin = 0.03 * (second - first)
                    assert (x0, x1) == pytest.approx((first - margin, second + margin), rel=1e-4)
                    assert page.locator(f"#timeline-{index} [data-iteration-end]").count() == timeline.iterations
                else:
                    assert (x0, x1) == pytest.approx((0.0, timeline.makespan * scale), rel=1e-4)
            # the tables fit their boxes at 1600 px
            for table in ("metrics", "comparison"):
                width, box = page.evaluate(f"[document.getElementById('{table}-table').scrollWidth, "
                                           f"document.getElementById('{table}-table').parentNode.clientWidth]")
                assert width <= box, table
            # one time axis for all: every panel of a unit ends at the longest makespan of that unit
            page.locator("#share-axis").check()
            page.wait_for_timeout(150)
            ends = [float(page.locator(f"#timeline-{k} svg.chart").first.get_attribute("data-x1"))
                    for k in range(len(timelines)) if timelines[k].unit == "s"]
            assert ends == pytest.approx([max(t.makespan for t in seconds) * factor] * len(seconds), rel=1e-4)
            page.locator("#share-axis").uncheck()
            page.wait_for_timeout(150)

            # the legend names every kind drawn in the page (the fused pair's too), and no other
            drawn = {KIND_NAMES[int(k)] for t in timelines for k in np.unique(t.box_kind[t.drawn()])}
            assert "overlapped forward + backward" in drawn
            legend = set(page.locator("header .legend [data-kind]").evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('data-kind'))"))
            assert legend == drawn

            # "mb 3" lights up every op of microbatch 3, on every device of every panel, and nothing else
            page.locator("#op-search").fill("mb 3")
            page.wait_for_timeout(100)
            lit = set(page.locator("rect.match").evaluate_all("nodes => nodes.map(n => n.getAttribute('data-op'))"))
            expected = {f"{k}:{r}" for k, t in enumerate(timelines) for r in np.flatnonzero(t.op_microbatch == 3)}
            assert lit == expected
            for k, t in enumerate(timelines):
                devices = {int(t.op_device[int(key.split(':')[1])]) for key in lit if key.startswith(f"{k}:")}
                assert devices == set(range(t.num_devices))
            # a stage and a kind together
            page.locator("#op-search").fill("F stage 2")
            page.wait_for_timeout(100)
            lit = set(page.locator("rect.match").evaluate_all("nodes => nodes.map(n => n.getAttribute('data-op'))"))
            expected = {f"{k}:{r}" for k, t in enumerate(timelines)
                        for r in np.flatnonzero((t.op_stage == 2) & (t.box_kind == 0))}
            assert lit == expected
            page.locator("#op-search").fill("")
            # clicking an op pins its microbatch
            page.locator('[data-op="0:0"]').click()
            assert page.locator("#op-search").input_value() == f"mb {int(timelines[0].op_microbatch[0])}"
            page.locator("#op-search").fill("")
            page.locator("#op-search").dispatch_event("input")

            # the critical-path toggle marks exactly the library's critical path
            page.locator("#show-critical").check()
            for k, t in enumerate(timelines):
                path = critical_path(t)
                marked = set(page.locator(f'#timeline-{k} rect[data-op].on-path').evaluate_all(
                    "nodes => nodes.map(n => Number(n.getAttribute('data-op').split(':')[1]))"))
                assert marked == set(path.row[~path.is_transfer].tolist())
                marked = set(page.locator(f'#timeline-{k} rect[data-transfer].on-path').evaluate_all(
                    "nodes => nodes.map(n => Number(n.getAttribute('data-transfer').split(':')[1]))"))
                assert marked == set(path.row[path.is_transfer].tolist())
            off = page.locator("#timeline-0 rect[data-op]:not(.on-path)").first
            assert float(off.evaluate("n => getComputedStyle(n).opacity")) < 0.5
            page.locator("#show-critical").uncheck()

            # every transfer is drawn at least a pixel wide, the microsecond ones too
            fast = 3
            durations = timelines[fast].transfers.end - timelines[fast].transfers.start
            assert durations.max() * 1600 / timelines[fast].makespan < 1  # under a pixel by their length
            widths = page.locator(f"#timeline-{fast} rect[data-transfer]").evaluate_all(
                "nodes => nodes.map(n => n.getBoundingClientRect().width)")
            assert len(widths) == len(timelines[fast].transfers) and min(widths) >= 1

            # an idle gap says what it waited for, in readable units
            page.locator("#timeline-0 [data-gap]").nth(1).hover()
            tip = page.locator("#tooltip")
            tip.wait_for(state="visible", timeout=5_000)
            text = tip.inner_text()
            assert text.startswith("idle ") and "waited for:" in text and " ms" in text

            # the wheel scrolls the page; ctrl+wheel zooms the panel under the cursor
            box = page.locator("#timeline-1 svg.chart").first.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 20)
            before = page.evaluate("window.scrollY")
            page.mouse.wheel(0, 300)
            page.wait_for_timeout(150)
            assert page.evaluate("window.scrollY") > before
            svg = page.locator("#timeline-1 svg.chart").first
            span = float(svg.get_attribute("data-x1")) - float(svg.get_attribute("data-x0"))
            svg.scroll_into_view_if_needed()
            box = svg.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 20)
            page.keyboard.down("Control")
            page.mouse.wheel(0, -200)
            page.keyboard.up("Control")
            page.wait_for_timeout(150)
            assert float(svg.get_attribute("data-x1")) - float(svg.get_attribute("data-x0")) < 0.9 * span
            page.keyboard.press("0")
            page.mouse.move(5, 5)

            # sorting the metrics by iteration time puts the panels in that order
            header = page.locator("#metrics-table th", has_text="iteration time")
            header.click()
            order = page.locator("#timelines > .panel").evaluate_all("nodes => nodes.map(n => n.id)")
            rows = page.locator("#metrics-table tbody tr").evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('data-link'))")
            assert order == rows

            # shift+drag measures busy and idle time in a window: they add up to devices x window
            svg = page.locator("#timeline-0 svg.chart").first
            svg.scroll_into_view_if_needed()
            box = svg.bounding_box()
            page.keyboard.down("Shift")
            page.mouse.move(box["x"] + 200, box["y"] + 30)
            page.mouse.down()
            page.mouse.move(box["x"] + 600, box["y"] + 30, steps=4)
            page.mouse.up()
            page.keyboard.up("Shift")
            stats = page.locator("#timeline-0 .window-stats")
            assert stats.inner_text().startswith("window ")
            busy = sum(stats.evaluate("n => Object.values(JSON.parse(n.getAttribute('data-busy')))"))
            idle = float(stats.get_attribute("data-idle"))
            window = stats.inner_text().split(":")[0]
            assert busy > 0 and idle >= 0 and "× 4 devices" in window

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report-why.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []


def test_a_report_written_with_share_axis_opens_on_one_axis(tmp_path) -> None:
    sync_playwright = browser_or_fail()
    timelines = [simulated(generate("1f1b", 4, 8)), simulated(generate("gpipe", 4, 16))]
    path = tmp_path / "shared.html"
    write_views(timelines, html=path, share_axis=True)
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems)
        try:
            assert page.locator("#share-axis").is_checked()
            page.wait_for_timeout(150)
            factor = time_scale("s", max(t.makespan for t in timelines)).factor
            ends = [float(page.locator(f"#timeline-{k} svg.chart").first.get_attribute("data-x1"))
                    for k in range(len(timelines))]
            assert ends == pytest.approx([max(t.makespan for t in timelines) * factor] * 2, rel=1e-4)
            # unticked, each panel goes back to its own axis
            page.locator("#share-axis").uncheck()
            page.wait_for_timeout(150)
            ends = [float(page.locator(f"#timeline-{k} svg.chart").first.get_attribute("data-x1"))
                    for k in range(len(timelines))]
            assert ends == pytest.approx([t.makespan * factor for t in timelines], rel=1e-4)
        finally:
            browser.close()
    assert problems == []
