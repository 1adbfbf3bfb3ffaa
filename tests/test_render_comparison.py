"""Predicted and measured timelines of one schedule side by side: op pairing, deviations,
the two-processes-per-device trace and the comparison page's data (the page itself runs in
the browser test)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.pairing import Comparison, deviations, partners
from pipesched.render.html import render_comparison_html
from pipesched.render.trace import comparison_trace_document
from render_timelines import measured_like, simulated, split_backward


@pytest.fixture(scope="module")
def pair():
    predicted = simulated(split_backward(generate("1f1b", 2, 4)))
    return predicted, measured_like(predicted, seed=3)


def test_every_predicted_op_finds_its_measured_counterpart(pair):
    predicted, measured = pair
    partner = partners(predicted, measured)
    assert sorted(partner.tolist()) == list(range(len(measured)))  # one to one
    for row, other in enumerate(partner.tolist()):
        assert predicted.op(row) == measured.op(other)
        assert predicted.op_device[row] == measured.op_device[other]
    # an op the run lacks has no counterpart
    keep = np.arange(1, len(measured))
    shorter = measured.__class__(measured.schedule, "measured", "s", measured.op_device[keep], measured.op_stage[keep],
                                 measured.op_kind[keep], measured.op_microbatch[keep], measured.op_start[keep],
                                 measured.op_end[keep])
    assert (partners(predicted, shorter) == -1).sum() == 1


def test_deviations_are_predicted_minus_measured_from_each_start(pair):
    predicted, measured = pair
    found = deviations(predicted, measured)
    for row in range(len(predicted)):
        other = found.partner[row]
        measured_duration = measured.op_end[other] - measured.op_start[other]
        duration = (predicted.op_end[row] - predicted.op_start[row]) - measured_duration
        start = (predicted.op_start[row] - predicted.origin) - (measured.op_start[other] - measured.origin)
        assert found.duration[row] == pytest.approx(duration)
        assert found.start[row] == pytest.approx(start)
        # the prediction error: positive where the prediction is longer than the run
        assert found.relative[row] == pytest.approx(duration / measured_duration)
    largest = found.largest(5)
    sizes = np.abs(found.duration[largest])
    assert len(largest) == 5 and np.all(np.diff(sizes) <= 0)
    assert sizes[0] == pytest.approx(np.abs(found.duration).max())


def test_the_trace_holds_both_timelines_as_two_processes_per_device(pair):
    predicted, measured = pair
    document = comparison_trace_document([pair, pair])
    events = document["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
             and not e["args"]["name"].endswith(" · critical path · predicted")
             and not e["args"]["name"].endswith(" · critical path · measured")}
    assert len(names) == 2 * 2 * predicted.num_devices
    schedule = predicted.schedule.name
    for device in range(predicted.num_devices):
        first = 1 + 2 * device  # the first pair's processes: predicted, then measured, per device
        assert names[first] == f"{schedule} · device {device} · predicted"
        assert names[first + 1] == f"{schedule} · device {device} · measured"
    for pid, timeline in ((1, predicted), (2, measured)):
        ops = [e for e in events if e["ph"] == "X" and e["pid"] == pid and e.get("cat") != "transfer"]
        assert len(ops) == int((timeline.op_device == 0).sum())
        assert min(e["ts"] for e in ops) == 0  # each on its own iteration clock
    measured_ops = sorted((e["ts"], e["name"]) for e in events if e["ph"] == "X" and e["pid"] == 2)
    first_measured = measured.rows_of_device(0)[0]
    assert measured_ops[0][1] == str(measured.op(first_measured))


def test_the_page_carries_both_timelines_links_and_steps(pair):
    predicted, measured = pair
    page = render_comparison_html([Comparison(predicted, measured, (0.011, 0.012, 0.0125))],
                                  summary=[{"schedule": "<b>x</b>", "error": "+3.0%"}])
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)[1])
    top, bottom = data["timelines"]
    assert (top["pairWith"], bottom["pairWith"]) == (1, 0) and top["view"] == bottom["view"]
    assert len(top["links"]) == len(predicted) and len(bottom["links"]) == len(measured)
    assert all(bottom["links"][top["links"][row]] == row for row in range(len(predicted)))
    assert data["comparisons"][0]["steps"] == pytest.approx([11.0, 12.0, 12.5])  # ms, the pair's unit
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert page.count("<tr data-link=") == len(predicted)  # every op fits in the deviation list


def test_a_pair_must_be_one_schedule(pair):
    predicted, _ = pair
    other = measured_like(simulated(generate("gpipe", 2, 4)))
    with pytest.raises(PipeschedError, match="must be a run of"):
        Comparison(predicted, other)
