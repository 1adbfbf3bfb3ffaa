"""The picture options of `show`, `simulate` and `compare` from the command line."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error


@pytest.mark.slow
def test_show_writes_every_view(cli, tmp_path) -> None:
    paths = {kind: tmp_path / f"v.{ext}" for kind, ext in
             (("png", "png"), ("svg", "svg"), ("perfetto", "json"), ("html", "html"))}
    args = [x for kind, path in paths.items() for x in (f"--{kind}", str(path))]
    result = cli("show", "zb-h1", "-p", "4", "-m", "8", *args)
    assert result.code == 0, result
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["svg"].read_text().lstrip().startswith("<?xml")
    trace = json.loads(paths["perfetto"].read_text())
    complete = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"
                and e["cat"] != "critical path"]
    assert len(complete) == 4 * 8 * 3  # one slice per op of the slot table
    assert "zb-h1" in paths["html"].read_text()


@pytest.mark.slow
def test_simulate_with_stage_costs_writes_html_and_json(cli, tmp_path) -> None:
    costs = tmp_path / "costs.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                     + "".join(f"{s},0.01,0.01,0.01,1e6,1e5\n" for s in range(4)))
    html = tmp_path / "sim.html"
    result = cli("simulate", "1f1b", "-p", "4", "-m", "8", "--stage-costs", str(costs),
                 "--latency", "1e-5", "--bandwidth", "1e10", "--html", str(html), "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert data["iteration_time_s"] > (8 + 3) * 0.03
    assert html.stat().st_size > 1000


@pytest.mark.parametrize("command", [["show", "1f1b"], ["compare", "--schedules", "1f1b", "--levels", "table"]])
def test_bad_picture_path_fails_before_work_and_leaves_nothing(cli, tmp_path, command) -> None:
    keep = tmp_path / "keep.html"
    keep.write_text("old report")
    result = cli(*command, "--png", str(tmp_path / "ok.png"), "--html", str(tmp_path / "missing" / "r.html"))
    assert_one_line_error(result, "html=", "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.html"]
    assert keep.read_text() == "old report"


def test_compare_html_has_the_side_by_side_levels(cli, tmp_path) -> None:
    html = tmp_path / "cmp.html"
    result = cli("compare", "--schedules", "gpipe,1f1b,zb-v", "-p", "4", "-m", "8",
                 "--levels", "formula,table", "--html", str(html))
    assert result.code == 0, result
    text = html.read_text()
    assert "formula time (slots)" in text and "table rank" in text
