"""`pipesched search`: a small space checked exhaustively against every point evaluated one by
one, pruning that loses nothing, the same rows with 1 and 2 workers and with a local Ray, a
search killed with SIGKILL and resumed, the store's refusals, bad input, and the outputs
(--json, --csv, --show, --html)."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from pipesched.errors import PipeschedError
from pipesched.experiments import evaluate, process_map
from pipesched.experiments.point import point_key
from pipesched.limits import MAX_WORKERS
from pipesched.search.bounds import lower_bound
from pipesched.search.results import pareto_front
from pipesched.search.space import SearchSpace
from pipesched.search.store import (
    APPLICATION_ID,
    BOUNDED,
    EVALUATED,
    FORMAT,
    INVALID,
    OUT_OF_MEMORY,
    POINT_COLUMNS,
    PRUNED,
    VERSION,
    SearchStore,
    point_row,
    row_point,
)
from pipesched.search.sweep import search

SRC = str(Path(__file__).resolve().parents[1] / "src")

# llama3-8b on one node of 8 H100: 6 layouts, 280 points, every status occurs
SMALL = SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8,
                    schedules=("1f1b", "zb-h1", "zb-v", "interleaved-1f1b", "chimera"), chunks=(2,),
                    partitions=("balanced", "memory"), recompute=("selective",))


def _rows(result) -> dict[str, tuple]:
    """Each row's content without the run that wrote it."""
    return {row.key: dataclasses.astuple(dataclasses.replace(row, run=0)) for row in result.rows}


@pytest.fixture(scope="module")
def one_by_one() -> dict[str, object]:
    """Every point of SMALL evaluated alone, at level 3."""
    return {point_key(point): evaluate(point, ("sim",)) for point in SMALL.points()}


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory) -> object:
    return search(SMALL, db=tmp_path_factory.mktemp("pruned") / "s.sqlite")


def test_space_enumerates_every_layout_batch_split_and_option() -> None:
    points = SMALL.points()
    assert len(points) == 280 and len({point_key(p) for p in points}) == 280
    assert {(p.tp, p.p, p.dp) for p in points} == {(1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 2, 2), (2, 4, 1), (4, 2, 1)}
    for point in points:
        assert point.dp * point.p * point.tp == 8 and point.dp * point.micro_batch_size * point.m == 8
        assert point.zero == 0 or point.dp > 1
        assert (point.v == 2) == (point.family == "interleaved-1f1b")


@pytest.mark.slow
def test_small_space_matches_every_point_evaluated_one_by_one(pruned_run, one_by_one, tmp_path) -> None:
    exhaustive = search(SMALL, db=tmp_path / "all.sqlite", prune=False)
    statuses = {row.status for row in pruned_run.rows}
    assert statuses == {EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID}
    assert exhaustive.count(PRUNED) == 0 and exhaustive.count(BOUNDED) == 0
    fitting = {}
    for row in exhaustive.rows:
        record = one_by_one[row.key]
        if row.status == INVALID:
            assert not record.ok and row.reason in record.error
            continue
        if row.status == OUT_OF_MEMORY and not record.ok:
            assert "no partition" in record.error  # the memory partition finds none that fits
            continue
        result = record.results[0]
        assert row.bound_s <= result.iteration_time * (1 + 1e-12)  # the bound is a lower bound
        assert row.peak_memory_bytes == result.peak_memory  # exact before simulating
        assert (row.status == OUT_OF_MEMORY) == result.out_of_memory
        if row.status == EVALUATED:
            assert row.iteration_time_s == result.iteration_time
            assert row.throughput_tokens_per_s == result.throughput_tokens_per_s
            assert row.mfu == result.mfu and row.hfu == result.hfu
            fitting[row.label] = (result.iteration_time, result.peak_memory)  # ties: by label
    assert fitting and len(fitting) == exhaustive.count(EVALUATED)
    # pruning evaluates fewer points, and loses neither the best nor the front
    assert pruned_run.count(EVALUATED) < exhaustive.count(EVALUATED)
    best_label = min(fitting, key=lambda k: (fitting[k], k))
    assert pruned_run.best.label == exhaustive.best.label == best_label
    assert [r.key for r in pruned_run.front] == [r.key for r in exhaustive.front]
    front = sorted(fitting, key=lambda k: (fitting[k][1], fitting[k][0], k))
    expected, fastest = [], float("inf")
    for key in front:
        if fitting[key][0] < fastest:
            expected.append(key)
            fastest = fitting[key][0]
    assert [r.label for r in exhaustive.front] == expected
    for row in pruned_run.rows:
        if row.status == PRUNED:
            better = row.reason.split(" of ", 1)[1].split(", which")[0]
            assert fitting[better][0] <= fitting[row.label][0] and fitting[better][1] <= fitting[row.label][1]
        elif row.status == EVALUATED:
            assert _rows(pruned_run)[row.key] == _rows(exhaustive)[row.key]


def test_same_rows_with_one_and_two_workers(pruned_run, tmp_path) -> None:
    two = search(SMALL, db=tmp_path / "two.sqlite", mapper=process_map(2))
    assert _rows(two) == _rows(pruned_run)


@pytest.mark.slow
def test_same_rows_on_a_local_ray(tmp_path) -> None:
    ray = pytest.importorskip("ray")  # imported first: the pool binds to the loopback whatever the order
    from pipesched.experiments.ray_pool import ray_pool

    space = dataclasses.replace(SMALL, partitions=("balanced",))
    alone = search(space, db=tmp_path / "one.sqlite")
    with ray_pool(workers=2) as mapper:
        assert ray.util.get_node_ip_address() == "127.0.0.1"  # loopback only
        assert all(node["NodeManagerAddress"] == "127.0.0.1" for node in ray.nodes())
        on_ray = search(space, db=tmp_path / "ray.sqlite", mapper=mapper)
    assert _rows(on_ray) == _rows(alone)
    assert on_ray.count(EVALUATED) > 0


def test_bounds_are_lower_bounds_with_every_family() -> None:
    from pipesched.experiments import Point
    from pipesched.generators import FAMILIES

    for family in FAMILIES:
        for dp, p, m in ((1, 4, 8), (2, 4, 8), (2, 2, 4)):
            point = Point(family, p=p, m=m, dp=dp, tp=1, model="llama3-8b", cluster="1x8-h100",
                          zero=1 if dp > 1 else 0)
            record = evaluate(point, ("sim",))
            if not record.ok:
                continue
            bound = lower_bound(point)
            assert bound.seconds <= record.results[0].iteration_time * (1 + 1e-12), family
            assert max(bound.peak_memory) == record.results[0].peak_memory
            assert bound.closed_form_s <= bound.seconds and bound.work_s <= bound.seconds


def test_steady_state_bounds_are_lower_bounds() -> None:
    # iterations back to back: no time bound (never pruned), the whole run's exact memory
    from pipesched.experiments import Point

    for family, steady in (("pipedream", False), ("pipedream-2bw", False), ("zb-v", True), ("1f1b", True)):
        point = Point(family, p=4, m=8, dp=1, tp=1, model="llama3-8b", cluster="1x8-h100", steady_state=steady)
        record = evaluate(point, ("sim",))
        assert record.ok, record
        bound = lower_bound(point)
        assert bound.seconds == 0.0, family
        assert max(bound.peak_memory) == record.results[0].peak_memory, family


def test_the_default_space_leaves_out_the_asynchronous_families() -> None:
    from pipesched.generators import get_family

    assert not any(get_family(name).asynchronous for name in SearchSpace().schedules)
    assert "pipedream-2bw" in SearchSpace(schedules=("pipedream-2bw",)).schedules


def _settled(db: Path, status: str | None = None) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            query = "SELECT count(*) FROM points" + ("" if status is None else " WHERE status = ?")
            return connection.execute(query, () if status is None else (status,)).fetchone()[0]
    except sqlite3.Error:
        return 0


def _killed_when(args: list[str], db: Path, ready) -> None:
    """Start a search, SIGKILL it as soon as ``ready(db)`` holds, and wait for it."""
    env = {**os.environ, "PYTHONPATH": SRC}
    process = subprocess.Popen([sys.executable, "-c", "from pipesched.cli import main; main()", *args],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ready(db):
        assert process.poll() is None, "the search ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.mark.slow
def test_a_killed_search_resumes_without_recomputing_or_losing_points(tmp_path) -> None:
    space = dataclasses.replace(SMALL, schedules=("1f1b", "zb-h1", "zb-v", "interleaved-1f1b", "chimera", "gpipe",
                                                  "v-half"), partitions=("uniform", "balanced", "memory"),
                                recompute=("selective", "full"))
    args = ["search", "--model", space.model, "--cluster", space.cluster, "--global-batch", "8",
            "--schedules", ",".join(space.schedules), "--chunks", "2", "--partitions", ",".join(space.partitions),
            "--recompute", ",".join(space.recompute), "--workers", "1", "--no-prune", "--db"]
    db = tmp_path / "killed.sqlite"
    total = len(space.points())
    snapshots = []
    # killed while bounding, then again while simulating
    for ready in (lambda path: _settled(path) >= 150,
                  lambda path: _settled(path, EVALUATED) >= 10 and _settled(path, BOUNDED) >= 10):
        _killed_when([*args, str(db)], db, ready)
        with SearchStore.open(db) as store:  # the store opens: nothing is damaged
            (search_id, _), = store.searches()
            rows = {row.key: row for row in store.rows(search_id)}
        unsettled = total - len(rows) + sum(1 for row in rows.values() if row.status == BOUNDED)
        assert len(rows) > 0 and unsettled > 0
        for row in rows.values():
            assert row.status in (BOUNDED, EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID)
            if row.status in (BOUNDED, EVALUATED):
                assert row.bound_s is not None and row.peak_memory_bytes is not None
            if row.status == EVALUATED:
                assert row.iteration_time_s is not None and row.throughput_tokens_per_s is not None
        snapshots.append(rows)
    assert len(snapshots[1]) >= len(snapshots[0])
    resumed = search(space, db=db, prune=False)
    whole = search(space, db=tmp_path / "whole.sqlite", prune=False)
    assert resumed.runs == 3 and len(resumed.rows) == total and resumed.complete
    assert _rows(resumed) == _rows(whole)
    after = {row.key: row for row in resumed.rows}
    for rows in snapshots:
        for key, row in rows.items():
            if row.status != BOUNDED:  # a settled point is never computed again
                assert after[key] == row
    assert any(row.run == 3 for row in resumed.rows) and any(row.run == 1 for row in resumed.rows)


# --- the store ------------------------------------------------------------------------------
def test_store_refuses_foreign_and_damaged_files_and_leaves_them(tmp_path, cli) -> None:
    args = ["search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules", "1f1b",
            "--partitions", "balanced", "--recompute", "selective", "--tensor-parallel", "4", "--db"]
    text = tmp_path / "notes.sqlite"
    text.write_bytes(b"my notes, not a database\n" * 40)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE users (name TEXT)")
        connection.execute("INSERT INTO users VALUES ('ada')")
    damaged = tmp_path / "damaged.sqlite"
    assert cli(*args, str(damaged)).code == 0
    for leftover in tmp_path.glob("damaged.sqlite-*"):
        leftover.unlink()
    data = bytearray(damaged.read_bytes())
    assert len(data) > 3 * 4096
    data[4096:3 * 4096] = b"\xa5" * (2 * 4096)  # pages of the tables overwritten
    damaged.write_bytes(bytes(data))
    for path, fragments in ((text, ("not a SQLite database",)), (foreign, ("another program's SQLite database",)),
                            (damaged, ("damaged", "left as it is"))):
        before = path.read_bytes()
        result = cli(*args, str(path))
        assert_one_line_error(result, f"db={path}")
        for fragment in fragments:
            assert fragment in result.err
        assert path.read_bytes() == before
        assert_one_line_error(cli("search", "--db", str(path), "--show"), f"db={path}")
        assert path.read_bytes() == before


TINY_STORE = ["--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules", "1f1b",
              "--partitions", "balanced", "--recompute", "selective", "--tensor-parallel", "4"]


def test_store_refuses_what_it_cannot_read_in_one_line(tmp_path, cli) -> None:
    good = tmp_path / "good.sqlite"
    assert cli("search", *TINY_STORE, "--db", str(good)).code == 0
    first = "(SELECT min(rowid) FROM points)"

    def variant(name: str, *statements: str, fresh: bool = False) -> Path:
        path = tmp_path / f"{name}.sqlite"
        if not fresh:
            shutil.copy(good, path)
        with closing(sqlite3.connect(path)) as connection:
            for statement in statements:
                connection.execute(statement)
            connection.commit()
        return path

    unknown = json.dumps({**SearchSpace().spec(), "schedules": ["no-such-family"]})
    numbered = json.dumps({**SearchSpace().spec(), "model": 8})
    cases = {
        variant("our_id", f"PRAGMA application_id = {APPLICATION_ID}", "CREATE TABLE users (name TEXT)",
                fresh=True): "another program's SQLite database",
        variant("our_id_format", f"PRAGMA application_id = {APPLICATION_ID}",
                "CREATE TABLE format (name TEXT NOT NULL, version INTEGER NOT NULL)",
                f"INSERT INTO format VALUES ('{FORMAT}', {VERSION})", fresh=True): "the searches table is missing",
        variant("other_format", "UPDATE format SET version = 99"): "a search store of format",
        variant("no_points", "DROP TABLE points"): "the points table is missing",
        variant("columns", "ALTER TABLE points ADD COLUMN extra TEXT"): "the points table has other columns",
        variant("space_text", "UPDATE searches SET space = '{not json'"): "search 1 has no readable space",
        variant("space_list", "UPDATE searches SET space = '[1, 2]'"): "search 1 has no readable space",
        variant("space_values", f"UPDATE searches SET space = '{unknown}'"): "space this pipesched cannot read",
        variant("space_model", f"UPDATE searches SET space = '{numbered}'"): "model=8",
        variant("types", f"UPDATE points SET dp = 'two' WHERE rowid = {first}"): "dp=two is not of its type",
        variant("mfu", f"UPDATE points SET mfu = 'high' WHERE rowid = {first}"): "mfu=high is not of its type",
        variant("status", f"UPDATE points SET status = 'done' WHERE rowid = {first}"): "status=done is unknown",
        variant("values", "UPDATE points SET iteration_time_s = NULL WHERE status = 'evaluated'"):
            "evaluated but no iteration_time_s",
    }
    for path, fragment in cases.items():
        before = path.read_bytes()
        for args in (("search", "--db", str(path), "--show"), ("search", *TINY_STORE, "--db", str(path))):
            assert_one_line_error(cli(*args), f"db={path}", fragment)
            assert path.read_bytes() == before, path.name
            assert not list(tmp_path.glob(f"{path.name}-*")), path.name  # no journal left beside it


@contextmanager
def _read_only(path: Path):
    """``path``, a file or a folder, read-only for this process while the block runs (for
    root, which writes through permissions, the file system's immutable flag)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("no way to make a file read-only for root here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_stores_are_shown_and_refused_for_a_search_in_one_line(tmp_path, cli) -> None:
    folder = tmp_path / "shelf"
    folder.mkdir()
    db = folder / "s.sqlite"
    assert cli("search", *TINY_STORE, "--db", str(db)).code == 0
    expected = json.loads(cli("search", "--db", str(db), "--show", "--json").out)
    before = db.read_bytes()
    for locked in (db, folder):
        with _read_only(locked):
            assert_one_line_error(cli("search", *TINY_STORE, "--db", str(db)), f"db={db}", "read-only")
            shown = cli("search", "--db", str(db), "--show", "--json")
            assert shown.code == 0, shown
            assert json.loads(shown.out) == expected
            assert [path.name for path in folder.iterdir()] == ["s.sqlite"]  # nothing created beside it
    with _read_only(folder):
        assert_one_line_error(cli("search", *TINY_STORE, "--db", str(folder / "new.sqlite")), "read-only")
    assert db.read_bytes() == before and [path.name for path in folder.iterdir()] == ["s.sqlite"]
def _search(result) -> dict:
    """The one search a ``search --json`` ran."""
    (search,) = json.loads(result.out)["searches"]
    return search


@pytest.mark.slow
def test_store_keeps_several_searches_and_shows_them(tmp_path, cli) -> None:
    db = tmp_path / "two.sqlite"
    base = ["search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--schedules", "1f1b,zb-v",
            "--partitions", "balanced", "--recompute", "selective", "--db", str(db)]
    first = cli(*base, "--global-batch", "8", "--json")
    assert first.code == 0, first
    again = cli(*base, "--global-batch", "8", "--json")
    second = cli(*base, "--global-batch", "16", "--json")
    assert _search(again)["rows"] == _search(first)["rows"]
    assert _search(second)["space"]["global_batch"] == 16
    shown = cli("search", "--db", str(db), "--show", "--json")
    assert shown.code == 0, shown
    stored = json.loads(shown.out)["searches"]
    assert [s["space"]["global_batch"] for s in stored] == [8, 16]
    assert stored[0]["best"] == _search(first)["best"]
    text = cli("search", "--db", str(db), "--show", "--top", "3")
    assert text.code == 0 and text.out.count("global batch") == 2 and "best: " in text.out
    csv_path = tmp_path / "rows.csv"
    assert cli("search", "--db", str(db), "--show", "--csv", str(csv_path)).code == 0
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("key,schedule,v,dp,tp,pp,micro_batch_size,m,recompute,partition,zero,ep,status")
    assert len(lines) == 1 + sum(s["points"] for s in stored) + 1  # two searches, two headers
    assert_one_line_error(cli("search", "--db", str(tmp_path / "none.sqlite"), "--show"), "db=", "no such file")


# --- command line ---------------------------------------------------------------------------
def test_search_json_and_html(tmp_path, cli) -> None:
    page = tmp_path / "search.html"
    result = cli("search", "--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8",
                 "--schedules", "1f1b,zb-v,interleaved-1f1b", "--chunks", "2", "--partitions", "balanced",
                 "--recompute", "selective,full", "--db", str(tmp_path / "s.sqlite"), "--json", "--top", "5",
                 "--html", str(page))
    assert result.code == 0, result
    data = _search(result)
    assert set(data) >= {"best", "rows", "evaluated_points", "pruned_points", "out_of_memory_points",
                         "invalid_points", "seconds", "pareto_front"}
    assert len(data["rows"]) == 5
    for row in data["rows"]:
        assert set(row) >= {"schedule", "dp", "tp", "pp", "v", "micro_batch_size", "m", "recompute",
                            "iteration_time_s", "throughput_tokens_per_s", "mfu", "hfu", "max_peak_memory_bytes", "fits"}
    assert data["rows"][0] == data["best"] and data["best"]["fits"]
    times = [row["iteration_time_s"] for row in data["rows"] if row["fits"]]
    assert times == sorted(times)
    assert data["rows"][0]["throughput_tokens_per_s"] == pytest.approx(8 * 4096 / times[0])
    assert (data["evaluated_points"] + data["pruned_points"] + data["out_of_memory_points"] + data["invalid_points"]
            == data["points"])
    html = page.read_text()
    assert html.count('class="front"') == len(data["pareto_front"]) and 'class="best"' in html
    assert html.count("<circle") >= data["evaluated_points"] and '"timelines":[{' in html


def test_best_of_the_default_scenario_beats_compare_and_simulate_reproduces_it(tmp_path, cli) -> None:
    # the default scenario's model, cluster and global batch (32 sequences of 4096 tokens),
    # over the layouts and options the default compare shares with its neighbours
    result = cli("search", "--tensor-parallel", "4,8", "--recompute", "selective", "--partitions", "balanced",
                 "--micro-batch-sizes", "1", "--db", str(tmp_path / "default.sqlite"), "--json")
    assert result.code == 0, result
    best = _search(result)["best"]
    compared = cli("compare", "--levels", "sim", "--json")
    assert compared.code == 0
    # the flushed schedules (the asynchronous ones train on stale weights: searched when named)
    fitting = [r["iteration_time_s"] for r in json.loads(compared.out)["records"]
               if not r["any_out_of_memory"] and not r["asynchronous"]]
    assert best["iteration_time_s"] <= min(fitting)
    args = ["simulate", best["schedule"], "-p", str(best["pp"]), "-m", str(best["m"]), "-t", str(best["tp"]),
            "--dp", str(best["dp"]), "--zero", str(best["zero"]), "-b", str(best["micro_batch_size"]),
            "--recompute", best["recompute"], "--partition", best["partition"], "--json"]
    if best["v"] is not None:
        args += ["-v", str(best["v"])]
    simulated = json.loads(cli(*args).out)
    assert simulated["iteration_time_s"] == best["iteration_time_s"]
    assert max(simulated["peak_memory_bytes"]) == simulated["max_peak_memory_bytes"] == best["max_peak_memory_bytes"]
    assert simulated["throughput_tokens_per_s"] == pytest.approx(best["throughput_tokens_per_s"])


def test_bad_input_one_line_and_no_store(tmp_path, cli, monkeypatch) -> None:
    db = tmp_path / "new.sqlite"
    small = ["--model", "llama3-8b", "--cluster", "1x8-h100", "--db", str(db)]
    assert_one_line_error(cli("search", *small, "--global-batch", "3", "--dp", "2,4"),
                          "global_batch=3", "not divisible by any data-parallel size", "2, 4")
    assert_one_line_error(cli("search", "--model", "llama3-405b", "--cluster", "1x8-h100", "--db", str(db)),
                          "cluster=1x8-h100", "cannot hold llama3-405b")
    assert_one_line_error(cli("search", *small, "--global-batch", "0"), "global_batch=0")
    assert_one_line_error(cli("search", *small, "--gpus", "9"), "gpus=9")
    assert_one_line_error(cli("search", *small, "--tensor-parallel", "two"), "tensor-parallel='two'")
    assert_one_line_error(cli("search", *small, "--schedules", "nope"), "schedule='nope'")
    assert_one_line_error(cli("search", *small, "--recompute", "some"), "recompute=some")
    assert_one_line_error(cli("search", *small, "--workers", "0"), "workers=0")
    assert_one_line_error(cli("search", *small, "--workers", str(MAX_WORKERS + 1)), f"workers={MAX_WORKERS + 1}",
                          f"over the limit of {MAX_WORKERS:,}")
    assert_one_line_error(cli("search", *small, "--ray", "--workers", "2"), "workers=2", "not with --ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    assert_one_line_error(cli("search", *small, "--ray"), "ray=not installed", "pip install 'pipesched[ray]'")
    assert_one_line_error(cli("search", *small, "--ray-address", "10.0.0.1:6379"), "ray-address=not installed")
    assert not db.exists()


def test_space_rejects_impossible_splits() -> None:
    with pytest.raises(PipeschedError, match="gpus=8: no tensor-parallel x pipeline x data-parallel split"):
        SearchSpace(model="llama3-8b", cluster="1x8-h100", pipeline=(3,)).layouts()
    with pytest.raises(PipeschedError, match=r"space=[\d,]+ points: at most 500,000 in one search"):
        SearchSpace(global_batch=1 << 20, chunks=tuple(range(2, 60))).points()
    assert pareto_front([]) == []


@pytest.mark.parametrize("name", ["pipesched.search.space", "pipesched.search.results", "pipesched.search.store"])
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_a_point_round_trips_through_its_row() -> None:
    for point in SMALL.points()[::7]:
        row = point_row(point)
        assert row_point(SMALL.spec(), row) == point and row.key == point_key(point)
        # the row's columns carry the point's own values, under the point's own names
        assert all(getattr(row, name) == getattr(point, name) for name in POINT_COLUMNS)


def test_progress_bar_with_time_left_on_a_terminal_only() -> None:
    import io

    from rich.console import Console

    from pipesched.cli.search import ProgressBar

    screen = io.StringIO()
    bar = ProgressBar(Console(file=screen, force_terminal=True, width=100))
    for done in range(0, 101, 25):
        bar("bound", done, 100)
    bar("simulate", 3, 10)
    bar.close()
    shown = screen.getvalue()
    assert "bound" in shown and "simulate" in shown and "ETA" in shown and "3/10" in shown
    piped = io.StringIO()
    quiet = ProgressBar(Console(file=piped, force_terminal=False))
    quiet("bound", 5, 10)
    quiet.close()
    assert piped.getvalue() == ""


# --- processes: Ray from the command line, kill -9, Ctrl-C, two searches at once ------------
# one layout, one family, one partition and recompute mode: 4 points, a search of a second
TINY = ["--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules", "1f1b",
        "--partitions", "balanced", "--recompute", "selective", "--tensor-parallel", "4"]
# the killed search's space: about 1,200 points, tens of seconds with 2 workers
LONG = ["--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules",
        "1f1b,zb-h1,zb-v,interleaved-1f1b,chimera,gpipe,v-half", "--chunks", "2", "--recompute", "selective,full",
        "--no-prune"]


def _command(*args: str, env: dict | None = None, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """``pipesched ARGS`` in a new process, as a user starts it from a shell: in a process
    group of its own, which Ctrl-C on the terminal signals as a whole."""
    return subprocess.Popen([sys.executable, "-c", "from pipesched.cli import main; main()", *args],
                            env={**os.environ, "PYTHONPATH": SRC, **(env or {})}, stdout=stdout,
                            stderr=subprocess.PIPE, text=True, process_group=0)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _started_until(args: list[str], db: Path, ready) -> subprocess.Popen:
    process = _command(*args, "--db", str(db))
    deadline = time.monotonic() + 120
    while not ready(db):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return process


@pytest.mark.slow
def test_search_on_a_local_ray_from_the_command_line(tmp_path) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    process = _command("search", *TINY, "--db", str(tmp_path / "ray.sqlite"), "--ray", "--json",
                       stdout=subprocess.PIPE)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "pipesched: error" not in err
    (on_ray,) = json.loads(out)["searches"]
    alone = search(SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8, schedules=("1f1b",),
                               partitions=("balanced",), recompute=("selective",), tensor_parallel=(4,)),
                   db=tmp_path / "one.sqlite")
    assert on_ray["points"] == len(alone.rows) == 4 and on_ray["evaluated_points"] == alone.count(EVALUATED)
    assert on_ray["best"]["iteration_time_s"] == alone.best.iteration_time_s


def _answer_http1(server) -> None:
    connection, _ = server.accept()
    with connection:
        connection.recv(1024)
        connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def test_ray_address_that_does_not_answer_is_one_line(tmp_path, cli) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    import socket
    import threading

    db = tmp_path / "s.sqlite"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens once it is closed
    started = time.monotonic()
    result = cli("search", *TINY, "--db", str(db), "--ray-address", f"127.0.0.1:{port}")
    assert_one_line_error(result, f"ray-address=127.0.0.1:{port}", "nothing answers there", "ray start --head")
    with socket.socket() as server:  # a service that is not Ray: a web server of HTTP/1.1
        server.bind(("127.0.0.1", 0))
        server.listen()
        threading.Thread(target=_answer_http1, args=(server,), daemon=True).start()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert_one_line_error(cli("search", *TINY, "--db", str(db), "--ray-address", address),
                              f"ray-address={address}", "not a Ray cluster")
    assert_one_line_error(cli("search", *TINY, "--db", str(db), "--ray-address", "head-node"),
                          "ray-address=head-node", "host:port")
    assert time.monotonic() - started < 20
    assert not db.exists()


@pytest.mark.slow
def test_ray_address_that_wants_a_token_is_one_line(tmp_path) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    ray_command = Path(sys.executable).with_name("ray")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
    head = subprocess.Popen([str(ray_command), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                             f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline
                time.sleep(0.5)
        db = tmp_path / "s.sqlite"
        process = _command("search", *TINY, "--db", str(db), "--ray-address", f"127.0.0.1:{port}",
                           env={"RAY_AUTH_MODE": "disabled"})
        _, err = process.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert process.returncode == 2 and len(lines) == 1, err
        assert lines[0].startswith(f"pipesched: error: ray-address=127.0.0.1:{port}: cannot join it")
        assert "RAY_AUTH_MODE=token" in lines[0] and not db.exists()
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table in /proc")
def test_a_killed_search_leaves_no_workers(tmp_path) -> None:
    db = tmp_path / "killed.sqlite"
    process = _started_until(["search", *LONG, "--workers", "2"], db, lambda path: _settled(path) >= 50)
    workers = _children(process.pid)
    assert len(workers) == 2
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their search"
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_stops_a_search_at_once_and_keeps_what_it_finished(tmp_path) -> None:
    db = tmp_path / "interrupted.sqlite"
    args = ["search", *LONG, "--workers", "2"]
    process = _started_until(args, db, lambda path: _settled(path, EVALUATED) >= 20)
    stored = _settled(db)
    asked = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the search and its workers
    _, err = process.communicate(timeout=30)
    took = time.monotonic() - asked
    assert process.returncode == 2 and err.strip().splitlines() == ["pipesched: error: interrupted"], err
    assert took < 2.0, f"{took:.1f} s to stop"
    with SearchStore.open(db) as store:
        (search_id, space), = store.searches()
        kept = {row.key: row for row in store.rows(search_id)}
    assert len(kept) >= stored and sum(row.status == EVALUATED for row in kept.values()) >= 20
    resumed = search(SearchSpace(**space), db=db, prune=False)
    assert resumed.runs == 2 and resumed.complete
    after = {row.key: row for row in resumed.rows}
    for key, row in kept.items():
        if row.status != BOUNDED:  # what the first run finished is not computed again
            assert after[key] == row and row.run == 1


class _Interrupted:
    """A map that gives ``results`` results, then stops as Ctrl-C does."""

    def __init__(self, results: int) -> None:
        self.results = results

    def __call__(self, function, items):
        for count, result in enumerate(map(function, items)):
            if count == self.results:
                raise KeyboardInterrupt
            yield result


def test_an_interrupted_search_stores_every_point_it_finished(tmp_path) -> None:
    # fewer rows than a store transaction holds, in less time than one waits for: only a
    # search that writes what it holds when it stops keeps them
    with pytest.raises(KeyboardInterrupt):
        search(SMALL, db=tmp_path / "s.sqlite", mapper=_Interrupted(30))
    with SearchStore.open(tmp_path / "s.sqlite") as store:
        (search_id, _), = store.searches()
        kept = store.rows(search_id)
    assert len(kept) == 30
    resumed = search(SMALL, db=tmp_path / "s.sqlite")
    assert resumed.runs == 2 and resumed.complete
    after = {row.key: row for row in resumed.rows}
    assert all(after[row.key] == row for row in kept if row.status != BOUNDED)  # not computed again
    assert all(after[row.key].bound_s == row.bound_s for row in kept)


@pytest.mark.slow
def test_two_searches_started_together_on_a_new_store(tmp_path) -> None:
    db = tmp_path / "shared.sqlite"
    processes = [_command("search", *TINY, "--db", str(db), "--workers", "1", "--json", stdout=subprocess.PIPE)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    (first,), (second,) = (json.loads(out)["searches"] for out, _ in outputs)
    assert first["rows"] == second["rows"] and first["points"] == 4
    with SearchStore.open(db) as store:
        (search_id, _), = store.searches()
        assert len(store.rows(search_id)) == 4


def _open_and_begin(path: str, barrier, answers) -> None:
    barrier.wait()
    try:
        with SearchStore.open(path) as store:
            answers.put(store.begin(SearchSpace().spec())[1])
    except Exception as exc:  # reported to the test, which names it
        answers.put(repr(exc))


@pytest.mark.slow
def test_stores_opened_together_take_turns(tmp_path) -> None:
    import multiprocessing

    context = multiprocessing.get_context()
    for trial in range(3):
        path = str(tmp_path / f"new{trial}.sqlite")
        barrier, answers = context.Barrier(4), context.Queue()
        openers = [context.Process(target=_open_and_begin, args=(path, barrier, answers)) for _ in range(4)]
        for opener in openers:
            opener.start()
        runs = [answers.get(timeout=120) for _ in openers]
        for opener in openers:
            opener.join()
        assert sorted(map(str, runs)) == ["1", "2", "3", "4"], runs  # each opened the store, counted one start
