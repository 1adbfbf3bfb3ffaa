"""The check, search and distribution pages' figures, without a browser (the pages
themselves run in tests/test_report_browser.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipesched.generators import generate
from pipesched.pairing import PARTING_SHARE, deviations, kind_errors
from render_timelines import measured_like, simulated, split_backward


@pytest.fixture(scope="module")
def pair():
    predicted = simulated(split_backward(generate("1f1b", 2, 4)))
    return predicted, measured_like(predicted, seed=5)


def test_kind_errors_are_predicted_minus_measured_over_measured(pair) -> None:
    predicted, measured = pair
    found = deviations(predicted, measured)
    by_op = {}
    for row in range(len(predicted)):
        other = next(r for r in range(len(measured)) if measured.op(r) == predicted.op(row)
                     and measured.op_device[r] == predicted.op_device[row])
        share = ((predicted.op_end[row] - predicted.op_start[row])
                 / (measured.op_end[other] - measured.op_start[other]) - 1)
        by_op.setdefault(int(predicted.op_kind[row]), []).append(share)
    errors = kind_errors(predicted, found)
    assert [e.kind for e in errors] == sorted(by_op)
    for e in errors:
        assert e.count == len(by_op[e.kind])
        assert e.mean == pytest.approx(np.mean(by_op[e.kind]))
        assert e.median == pytest.approx(np.median(by_op[e.kind]))


def test_the_timelines_part_at_the_first_op_off_by_the_share(pair) -> None:
    predicted, measured = pair
    found = deviations(predicted, measured)
    span = predicted.makespan
    starts = {(int(measured.op_device[r]), str(measured.op(r))): measured.op_start[r] - measured.origin
              for r in range(len(measured))}
    off = [row for row in range(len(predicted))
           if abs(starts[(int(predicted.op_device[row]), str(predicted.op(row)))]
                  - (predicted.op_start[row] - predicted.origin)) > PARTING_SHARE * span]
    expected = min(off, key=lambda row: (predicted.op_start[row], row)) if off else -1
    assert found.parting(span) == expected
    # a timeline never parts from itself
    assert deviations(predicted, predicted).parting(span) == -1


def test_timelines_are_sampled_along_the_front() -> None:
    from pipesched.render.search_page import sampled_front
    from pipesched.search.store import EVALUATED, StoredRow

    front = [StoredRow(f"k{i}", "1f1b", None, 1, 1, 2, 1, 4, "none", "balanced", 0, 1, EVALUATED,
                       peak_memory_bytes=float(i), iteration_time_s=10.0 - i) for i in range(11)]
    best = front[-1]
    shown = sampled_front(front, best, count=6)
    # the best, then five points evenly spaced over the other ten (positions 0, 2, 4, 7, 9 of 0..9)
    assert shown[0] is best
    positions = [front.index(row) for row in shown[1:]]
    spacing = [b - a for a, b in itertools.pairwise(positions)]
    assert positions[0] == 0 and positions[-1] == 9 and max(spacing) - min(spacing) <= 1
    assert sampled_front(front[:3], front[2], count=6) == [front[2], front[0], front[1]]


def test_distribution_data_tells_who_beats_the_next_and_how_often_the_order_flips() -> None:
    from pipesched.render.html import distribution_data

    rng = np.random.default_rng(1)
    common = rng.lognormal(0, 0.05, 300)  # common random numbers: sample i of each together
    samples = {"a": 1.0 * common * rng.lognormal(0, 0.03, 300), "b": 1.02 * common * rng.lognormal(0, 0.03, 300),
               "c": 1.05 * common * rng.lognormal(0, 0.03, 300)}
    data = distribution_data([{"name": n, "samples": x, "deterministic": float(np.median(x))}
                              for n, x in samples.items()])
    rows = {row["name"]: row for row in data["rows"]}
    assert rows["a"]["next"] == "b" and rows["b"]["next"] == "c" and rows["c"]["next"] is None
    assert rows["a"]["fasterThanNext"] == pytest.approx(np.mean(samples["a"] < samples["b"]))
    assert rows["b"]["fasterThanNext"] == pytest.approx(np.mean(samples["b"] < samples["c"]))
    stacked = np.vstack([samples["a"], samples["b"], samples["c"]])
    in_order = np.all(np.diff(stacked, axis=0) >= 0, axis=0)
    assert data["orderDiffers"] == pytest.approx(1 - in_order.mean())
    best = stacked.argmin(axis=0)
    assert rows["a"]["fastest"] == pytest.approx(np.mean(best == 0))
    # unequal sample counts: no pairing, only what was given
    lone = distribution_data([{"name": "a", "samples": samples["a"], "deterministic": 1.0, "fastest": 0.5},
                              {"name": "b", "samples": samples["b"][:10], "deterministic": 1.0}])
    assert lone["orderDiffers"] is None and lone["rows"][0]["fastest"] == 0.5 and lone["rows"][0]["next"] is None


def _measured_run(pair, steps):
    import dataclasses

    from pipesched.timeline import MeasuredInfo

    _, measured = pair
    waits = np.full(len(measured), 1e-4)
    info = MeasuredInfo(runtime="ours", backend="gloo", partition="1|1", dtype="float32", micro_batch_size=1,
                        seq_len=16, step=1, op_wait_s=waits, op_cpu_s=waits, step_times_s=steps)
    return dataclasses.replace(measured, measured=info)


def test_a_run_page_shows_its_steps_and_says_what_the_measurement_lacks(pair) -> None:
    from pipesched.render.html import render_html

    timeline = _measured_run(pair, (0.012, 0.011, 0.0135, 0.0118))
    page = render_html([timeline])
    section = page[page.index('<section class="measured">'):]
    section = section[:section.index("</section>")]
    assert section.count("<circle data-step=") == 4
    # the median step is the lower middle one of an even count, as the run reports it
    assert "median 11.8 ms" in section and "spread 2.5 ms" in section
    assert "no memory curves" in section and "no communication lanes" in section
    per_device = [1e-4 * 1e3 * int((timeline.op_device == d).sum()) for d in range(timeline.num_devices)]
    assert all(f"d{d} {w:.4g} ms" in section for d, w in enumerate(per_device))


def test_compare_jitter_page_carries_the_terminals_pairwise_figures(cli, tmp_path) -> None:
    import json
    import re

    page = tmp_path / "jitter.html"
    result = cli("compare", "--schedules", "1f1b,zb-v,gpipe", "-p", "4", "-m", "8", "--jitter", "0.1",
                 "--samples", "200", "--json", "--html", str(page))
    assert result.code == 0, result
    paired = json.loads(result.out)["variability"]
    text = page.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)[1])
    shown = data["distributions"]
    assert shown["orderDiffers"] == pytest.approx(paired["ranking_flip_share"])
    assert f"{paired['ranking_flip_share']:.1%} of the samples" in text
    rows = {row["name"]: row for row in shown["rows"]}
    for row in paired["rows"]:
        assert rows[row["schedule"]]["fasterThanNext"] == (
            None if row["faster_than_next"] is None else pytest.approx(row["faster_than_next"]))
        assert rows[row["schedule"]]["fastest"] == pytest.approx(row["fastest_probability"])


def test_the_legend_names_every_kind_drawn_fused_pairs_included() -> None:
    from pipesched.render.html import kind_legend
    from pipesched.render.style import KIND_NAMES
    from pipesched.slots import slot_table

    timeline = slot_table(generate("dualpipev", 4, 8))
    legend = kind_legend([timeline])
    drawn = {int(k) for k in np.unique(timeline.box_kind)}
    assert "overlapped forward + backward" in {KIND_NAMES[k] for k in drawn}
    assert all(KIND_NAMES[k] in legend for k in drawn)
