"""The serving page (``serving_report``, what ``serve simulate --html`` writes) in headless
chromium: no console error and no request, the request plots loaded, the stage groups' row
labels, and an op's hover naming its batch's requests and token counts."""

from __future__ import annotations

import pytest

from pipesched.render.serving import serving_report
from pipesched.serving.results import serve_result
from test_report_browser import browser_or_fail, open_page
from test_serving_views import engine_run, hand_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_serving_page_in_chromium(tmp_path) -> None:
    sync_playwright = browser_or_fail()
    run = hand_run()
    path = tmp_path / "serving.html"
    probes = [{"qps": 1.0, "ttft_s": {"p50": 0.1, "p99": 0.3}, "attainment": 1.0},
              {"qps": 2.0, "ttft_s": {"p50": 0.2, "p99": 0.6}, "attainment": 0.6}]
    path.write_text(serving_report(run, serve_result(run).to_dict(), probes=probes, slo_ttft=0.025))
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems)
        page.on("request", lambda request: requests.append(request.url))
        try:
            # the four request plots are images that loaded (inline SVG documents)
            images = page.locator("figure.serving-plot img")
            assert images.count() == 4
            assert all(images.nth(k).evaluate("img => img.complete && img.naturalWidth > 0") for k in range(4))
            # one element per op; the rows are the stage groups
            assert page.locator("[data-op]").count() == 8
            labels = page.locator(".row-label").evaluate_all("nodes => nodes.map(n => n.textContent)")
            assert labels[:2] == ["r0 s0", "r0 s1"]
            # hover 1M1 (row 5: stage 1's second op): its batch, requests and tokens
            page.hover('[data-op="0:5"]')
            tooltip = page.locator("#tooltip")
            tooltip.wait_for(state="visible", timeout=5_000)
            text = tooltip.inner_text()
            for expected in ("1M1", "mixed prefill + decode iteration", "stage group: replica 0 · stage 1 · ranks 2-3",
                             "batch: 1 of the run", "requests: 2: 1, 0", "prefill tokens: 50", "decodes: 1",
                             "KV tokens read: 100", "waited for: the device: previous op 1P0 on r0 s1"):
                assert expected in text, f"{expected!r} not in tooltip {text!r}"
        finally:
            browser.close()
    assert problems == []
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []


def test_an_engine_run_page_in_chromium(tmp_path) -> None:
    sync_playwright = browser_or_fail()
    run = engine_run()
    path = tmp_path / "engine.html"
    path.write_text(serving_report(run, serve_result(run).to_dict(), iterations=60))
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser, page = open_page(playwright, path, problems)
        try:
            # 60 iterations on each of the 2 replicas' 2 stages they ran on
            assert page.locator("[data-op]").count() == 2 * 60
            assert page.locator(".row-label").evaluate_all("nodes => nodes.map(n => n.textContent)") == ["r0 s0", "r0 s1", "r1 s0", "r1 s1"]
        finally:
            browser.close()
    assert problems == []
