"""The HTML report as a file: self-contained, escaped, compact, with the data the page draws."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render.html import render_html
from pipesched.slots import slot_table
from pipesched.waits import WAIT_DEVICE, WAIT_TRANSFER, waited_for
from render_timelines import GIB, simulated, split_backward, with_transfers

EVIL = '<script>alert("x")</script>&'


class Page(HTMLParser):
    """Collects tags, attributes and the text of the report."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag) -> None:
        self._in_script = False

    def handle_data(self, data) -> None:
        (self.scripts if self._in_script else self.text).append(data)


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    return parser


def report_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_report_is_self_contained() -> None:
    page = render_html([with_transfers(generate("1f1b", 4, 8))])
    parsed = parse(page)
    tags = [tag for tag, _ in parsed.tags]
    assert "link" not in tags and "iframe" not in tags and "img" not in tags
    for _, attrs in parsed.tags:
        assert "src" not in attrs
        assert not str(attrs.get("href", "")).startswith(("http", "//"))
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    # a content policy forbids any fetch even if a later edit slips one in
    policy = next(a["content"] for t, a in parsed.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in policy
    assert len(parsed.scripts) == 2  # the data and the code, both inline


def test_labels_from_input_are_escaped() -> None:
    schedule = generate("1f1b", 2, 2)
    evil = schedule.with_ops(schedule.device_ops, name=EVIL)
    page = render_html([slot_table(evil)], comparison=[{"schedule": EVIL, EVIL: 1.0}], title=EVIL)
    assert "<script>alert" not in page
    assert page.count("<script") == 2
    parsed = parse(page)
    # shown as text: page title, heading, metrics row, comparison header and row
    assert sum(chunk.count(EVIL) for chunk in parsed.text) >= 5
    assert report_data(page)["timelines"][0]["name"] == EVIL


def test_data_columns_match_the_timeline() -> None:
    timeline = simulated(split_backward(generate("1f1b", 4, 8)), capacity=3 * GIB)
    data = report_data(render_html([timeline]))
    entry = data["timelines"][0]
    assert entry["timeUnit"] == "ms" and entry["devices"] == 4
    ops = entry["ops"]
    assert all(len(column) == len(timeline) for column in ops.values())
    assert ops["start"][5] == pytest.approx((timeline.op_start[5] - timeline.origin) * 1e3)
    assert all(len(column) == len(timeline.transfers) for column in entry["transfers"].values())
    waits = waited_for(timeline)
    assert ops["cause"] == waits.cause.tolist() and ops["ref"] == waits.ref.tolist()
    assert WAIT_TRANSFER in ops["cause"] and WAIT_DEVICE in ops["cause"]
    memory = entry["memory"]
    assert memory["unit"] == "GiB" and memory["peak"][0] == 4.0 and memory["oom"][0] is True
    assert len(memory["times"]) == 4


def test_metrics_table_sorts_by_numbers() -> None:
    timelines = [slot_table(generate("gpipe", 4, 8)), slot_table(generate("1f1b", 4, 4))]
    parsed = parse(render_html(timelines))
    values = [a["data-value"] for t, a in parsed.tags if t == "td"]
    # the iteration-time column holds raw numbers for sorting: 33 and 21 slots
    assert "33.0" in values and "21.0" in values
    headers = "".join(parsed.text)
    for column in ("schedule", "iteration time", "bubble", "peak memory"):
        assert column in headers


def test_comparison_section_only_when_given() -> None:
    timeline = slot_table(generate("1f1b", 2, 2))
    assert "<h2>Comparison</h2>" not in render_html([timeline])
    page = render_html([timeline], comparison=[{"level": "formula", "bubble": 0.25}, {"level": "table", "bubble": 0.3}])
    assert "<h2>Comparison</h2>" in page and 'id="comparison-table"' in page
    assert page.count('data-value="formula"') == 1


def test_report_for_8_schedules_at_p16_m64_is_under_5_mb() -> None:
    timelines = []
    for name in ("gpipe", "1f1b"):
        schedule = generate(name, 16, 64)
        timelines += [simulated(schedule), simulated(split_backward(schedule))]
    timelines = timelines * 2
    page = render_html(timelines)
    size = len(page.encode())
    assert sum(len(t) for t in timelines) == 2 * (2 * 2048 + 2 * 3072)
    assert size < 5 * 2**20, f"report is {size / 2**20:.2f} MiB"


def test_no_timelines_is_a_user_error() -> None:
    with pytest.raises(PipeschedError, match=r"^timelines=0: "):
        render_html([])
