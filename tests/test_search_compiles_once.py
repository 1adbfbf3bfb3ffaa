"""A search builds each point's schedule once and compiles its graph once: the bound's graph
(free communication) is kept for the point's evaluation, which lowers the network onto it,
with the same rows as an evaluation that compiles its own graph. A point evaluated alone
builds its table once too."""

from __future__ import annotations

import importlib
import json
import sys
from collections import Counter

import pytest

from pipesched.experiments import evaluate
from pipesched.experiments.point import Point
from pipesched.model import load_cluster, pipeline_ranks
from pipesched.search import sweep

graph_module = importlib.import_module("pipesched.simulate.graph")
search_page = importlib.import_module("pipesched.render.search_page")

# 2 layouts x 2 micro-batch sizes x (1f1b, zb-v, zb-1p, chimera): 16 points, all but one fit
# (Chimera with m = 1 is not built)
ARGS = ["search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules",
        "1f1b,zb-v,zb-1p,chimera", "--partitions", "balanced", "--recompute", "selective", "--tensor-parallel", "4",
        "--workers", "1", "--no-prune", "--json", "--top", "0"]


def _counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of ``Point.build_schedule`` and of ``compile_graph`` (wherever it was imported)."""
    counts: Counter[str] = Counter()
    build, compile_graph = Point.build_schedule, graph_module.compile_graph

    def counted_build(self, *args, **kwargs):
        counts["build_schedule"] += 1
        return build(self, *args, **kwargs)

    def counted_compile(*args, **kwargs):
        counts["compile_graph"] += 1
        return compile_graph(*args, **kwargs)

    monkeypatch.setattr(Point, "build_schedule", counted_build)
    for name, module in list(sys.modules.items()):
        if name.startswith("pipesched") and getattr(module, "compile_graph", None) is compile_graph:
            monkeypatch.setattr(module, "compile_graph", counted_compile)
    return counts


def _search(cli, *args: str) -> dict:
    result = cli(*ARGS, *args)
    assert result.code == 0, result
    found = json.loads(result.out)["searches"][0]
    return {key: value for key, value in found.items() if key not in ("seconds", "db")}


def test_a_search_builds_and_compiles_each_point_once_with_the_same_rows(tmp_path, cli, monkeypatch) -> None:
    with monkeypatch.context() as patched:
        # the reference: nothing kept from the bound, the evaluation compiles its own graph
        patched.setattr(sweep, "keep_graph", lambda point, graph: None)
        reference = _search(cli, "--db", str(tmp_path / "fresh.sqlite"))
    counts = _counted(monkeypatch)
    found = _search(cli, "--db", str(tmp_path / "kept.sqlite"))
    assert (found["points"], found["evaluated_points"], found["invalid_points"]) == (16, 15, 1)
    # each point built once (the invalid one too: its build says why), each built one compiled once
    assert counts == {"build_schedule": 16, "compile_graph": 15}
    assert found == reference


def test_a_point_evaluated_alone_builds_its_table_once(monkeypatch) -> None:
    counts = _counted(monkeypatch)
    record = evaluate(Point("zb-v", p=2, m=8, tp=4, model="llama3-8b", cluster="1x8-h100"))
    assert record.ok and [r.level for r in record.results] == ["formula", "table", "sim"]
    # the slot table runs the same graph compiler: one table, one graph per timed level
    assert counts == {"build_schedule": 1, "compile_graph": 2}


def _refuse(*args, **kwargs):
    raise AssertionError("the search page simulated or built a point")


# what simulates a point or builds its schedule: refused while a search page is drawn
REFUSED = (("pipesched.experiments.evaluation", ("run_sim", "evaluate", "compile_graph", "with_network")),
           ("pipesched.experiments.simulation", ("simulate_point", "run_sim")),
           ("pipesched.simulate.run", ("run",)), ("pipesched.simulate.graph", ("compile_graph", "with_network")))


def _refusing(patch: pytest.MonkeyPatch) -> None:
    for module, names in REFUSED:
        for name in names:
            patch.setattr(importlib.import_module(module), name, _refuse)
    patch.setattr(Point, "build_schedule", _refuse)


def test_the_search_page_reads_stored_results_and_simulates_nothing(tmp_path, cli, monkeypatch) -> None:
    db = tmp_path / "s.sqlite"
    args = [*ARGS[:ARGS.index("--json")], "--db", str(db)]
    draw = search_page.render_search_html

    def drawn_without_simulating(*given, **options):
        with pytest.MonkeyPatch.context() as inner:
            _refusing(inner)
            return draw(*given, **options)

    run_page, shown_page = tmp_path / "run.html", tmp_path / "shown.html"
    with monkeypatch.context() as patched:
        # the page of a search run now: the timelines its evaluation kept
        patched.setattr(search_page, "render_search_html", drawn_without_simulating)
        assert cli(*args, "--html", str(run_page)).code == 0
    _refusing(monkeypatch)
    assert cli("search", "--db", str(db), "--show", "--html", str(shown_page)).code == 0
    stored = json.loads(cli("search", "--db", str(db), "--show", "--json").out)["searches"][0]
    for html in (run_page.read_text(), shown_page.read_text()):
        assert html.count('class="front"') == len(stored["pareto_front"]) and 'class="best"' in html
        assert html.count("<circle") >= stored["evaluated_points"]
    assert '"timelines":[{' in run_page.read_text()  # the best and the front, from the run
    assert '"timelines":[]' in shown_page.read_text()  # a store keeps no timelines


def test_kept_graphs_are_taken_once_and_the_oldest_go_beyond_the_budget(monkeypatch) -> None:
    evaluate_module = importlib.import_module("pipesched.experiments.evaluation")
    points = [Point("1f1b", p=2, m=m, tp=4, model="llama3-8b", cluster="1x8-h100") for m in (4, 8, 16)]
    graphs = [bound_graph(point) for point in points]
    # room for the two newest graphs' op rows only
    monkeypatch.setattr(evaluate_module, "KEPT_OPS", graphs[1].num_ops + graphs[2].num_ops)
    monkeypatch.setattr(evaluate_module, "_KEPT", evaluate_module._Kept())  # none kept before
    for point, graph in zip(points, graphs, strict=True):
        evaluate_module.keep_graph(point, graph)
    assert evaluate_module.take_graph(points[0]) is None
    assert evaluate_module.take_graph(points[2]) is graphs[2]
    assert evaluate_module.take_graph(points[2]) is None  # once
    assert evaluate_module.take_graph(points[1]) is graphs[1]


def bound_graph(point: Point):
    return importlib.import_module("pipesched.search.bounds").lower_bound(point).graph


def test_the_network_of_a_placement_is_built_once_for_every_point_on_it() -> None:
    """Points that differ only in what does not reach the network (recompute mode,
    partition) share one network: the cluster's links between the placement's ranks."""
    base = Point("1f1b", p=4, m=8, model="llama3-70b", cluster="4x8-h100", tp=4, dp=2)
    schedule = base.build_schedule()
    networks = [point.setup().network_for(schedule)
                for point in (base, base.replace(recompute="full"), base.replace(partition="uniform"))]
    assert networks[0] is networks[1] is networks[2]
    cluster = load_cluster("4x8-h100")
    ranks = pipeline_ranks(schedule.placement, cluster, 4, data_parallel=2)
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    assert [networks[0].latency[a, b] for a, b in pairs] == [cluster.latency(ranks[a], ranks[b]) for a, b in pairs]
