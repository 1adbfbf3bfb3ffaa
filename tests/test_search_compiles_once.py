"""A search builds each point's schedule once and compiles its graph once: the bound's graph
(free communication) is kept for the point's evaluation, which lowers the network onto it,
with the same rows as an evaluation that compiles its own graph. A point evaluated alone
builds its table once too."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from pipesched.experiments import evaluate
from pipesched.experiments.point import Point
from pipesched.search import sweep
from pipesched.simulate import graph as graph_module

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
