"""The results store keyed by the point: a point's key tells every field of its three records
apart, a point round-trips through its row, a store of an older format is refused with one
line, a search started again settles nothing new, the space's capacity is checked once and
before any file is written; and simulate and compare build their points through one
constructor (``experiments.point.points_for``)."""

from __future__ import annotations

import dataclasses
import math
import sqlite3

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import pipesched.cli.simulate
import pipesched.compare
from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments.point import PARTS, Point, point_key
from pipesched.generators import generate
from pipesched.passes.offload import OffloadPolicy
from pipesched.search.space import SearchSpace
from pipesched.search.store import POINT_COLUMNS, SearchStore, point_row, row_point
from pipesched.search.sweep import search
from pipesched.variability.model import Variability

# a point away from every default, so that each change below changes it
BASE = dict(family="interleaved-1f1b", p=4, m=8, v=2, model="llama3-8b", cluster="1x8-h100", dp=2, tp=2,
            micro_batch_size=2, zero=0)
# for every field of a point's records, values it may take instead of BASE's
CHANGES: dict[str, list[object]] = {
    "family": ["1f1b", "zb-v"], "p": [2, 8], "m": [4, 16], "v": [None, 4],
    "options": [(("activation_limit", 6),), (("activation_limit", 7),)],
    "schedule": [generate("1f1b", 4, 8), generate("gpipe", 4, 8)],
    "slot_costs": [StageCosts.uniform(4), StageCosts.uniform(4, forward=2.0)], "fb_cost": [0.8, 0.9],
    "model": ["llama3-70b"], "cluster": ["4x8-h100"], "dp": [4, 8], "tp": [1, 4], "micro_batch_size": [1, 4],
    "seq_len": [2048, 8192], "recompute": ["none", "full"], "sequence_parallel": [False], "dtype": ["fp32", "fp16"],
    "partition": ["uniform", "memory"], "stage_costs": [StageCosts.uniform(4), StageCosts.uniform(2)],
    "latency": [1e-5, 2e-5], "bandwidth": [1e10, 10**10, math.inf],  # 1e10 == 10**10: one point, one key
    "frozen_layers": ["0-3", (0, 1)],
    "offload": ["all", OffloadPolicy.parse("0-1", 4)], "host_bandwidth": [1e10, 2e10],
    "host_memory": [1e11, 2e11], "zero": [1], "ep": [2, 4], "etp": [1, 2], "moe_dispatcher": ["deepep"],
    "contention": [False], "overlap": [False], "steady_state": [True],
    "variability": [Variability(jitter=(("ops", 0.1),)), Variability(jitter=(("ops", 0.2),))],
}
SMALL = SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8, schedules=("1f1b", "zb-v"),
                    partitions=("balanced",), recompute=("selective",), tensor_parallel=(4,))
TINY = ["--model", "llama3-8b", "--cluster", "1x8-h100", "--global-batch", "8", "--schedules", "1f1b",
        "--partitions", "balanced", "--recompute", "selective", "--tensor-parallel", "4"]
CHANGE = st.sampled_from([(name, index) for name, values in CHANGES.items() for index in range(len(values))])


def test_every_field_of_a_point_has_changes() -> None:
    assert set(CHANGES) == {field.name for record in PARTS.values() for field in dataclasses.fields(record)}


def _point(changes: list[tuple[str, int]]) -> Point:
    """BASE with ``changes``; a combination a point refuses (ZeRO-1 on stage costs) is no example."""
    try:
        return Point(**{**BASE, **{name: CHANGES[name][index] for name, index in changes}})
    except PipeschedError:
        reject()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(CHANGE, max_size=3), st.lists(CHANGE, max_size=3))
def test_points_have_the_same_key_exactly_when_they_are_equal(one: list, other: list) -> None:
    first, second = _point(one), _point(other)
    assert (point_key(first) == point_key(second)) == (first == second)


@settings(max_examples=60, deadline=None)
@given(CHANGE)
def test_a_point_differing_in_one_field_has_another_key(change: tuple[str, int]) -> None:
    point = _point([change])
    assert point != _point([]) and point_key(point) != point_key(_point([]))


def test_equal_points_built_apart_have_one_key() -> None:
    assert point_key(_point([("bandwidth", 0)])) == point_key(_point([("bandwidth", 1)]))  # 1e10 and 10**10
    assert point_key(Point("1f1b", frozen_layers=[0, 1])) == point_key(Point("1f1b", frozen_layers=(0, 1)))


def test_a_search_point_round_trips_through_its_row() -> None:
    space = SMALL.spec()
    for point in SMALL.points():
        row = point_row(point)
        assert row_point(space, row) == point and row.key == point_key(point)
        assert [getattr(row, name) for name in POINT_COLUMNS] == [getattr(point, name) for name in POINT_COLUMNS]
        # the point as the space's axes state it, built field by field
        assert point == Point(point.family, p=point.p, m=point.m, v=point.v, model=SMALL.model,
                              cluster=SMALL.cluster, dp=point.dp, tp=point.tp,
                              micro_batch_size=point.micro_batch_size, seq_len=SMALL.seq_len,
                              recompute=point.recompute, partition=point.partition, zero=point.zero)


def test_a_store_of_an_older_format_is_refused_with_one_line(tmp_path, cli) -> None:
    db = tmp_path / "old.sqlite"
    SearchStore.open(db).close()
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE format SET version = 2")
    connection.close()
    before = db.read_bytes()
    for args in ((*TINY, "--db", str(db)), ("--db", str(db), "--show")):
        assert_one_line_error(cli("search", *args), f"db={db}", "made by an older pipesched",
                              "search again into a new --db")
    assert db.read_bytes() == before


def test_a_search_started_again_settles_nothing_new(tmp_path) -> None:
    first = search(SMALL, db=tmp_path / "s.sqlite")
    again = search(SMALL, db=tmp_path / "s.sqlite")
    assert again.runs == 2 and {row.run for row in again.rows} == {1}  # every row the first run's
    assert again.rows == first.rows


def test_the_capacity_is_checked_once_before_any_file(tmp_path, cli, monkeypatch) -> None:
    calls = []
    check = SearchSpace.check_capacity
    monkeypatch.setattr(SearchSpace, "check_capacity", lambda space: calls.append(space) or check(space))
    db = tmp_path / "s.sqlite"
    assert cli("search", *TINY, "--db", str(db), "--workers", "1", "--json").code == 0
    assert len(calls) == 1
    refused = tmp_path / "refused.sqlite"
    with pytest.raises(PipeschedError, match="cannot hold llama3-405b"):
        search(SearchSpace(model="llama3-405b", cluster="1x8-h100"), db=refused)
    assert_one_line_error(cli("search", "--model", "llama3-405b", "--cluster", "1x8-h100", "--db", str(refused)),
                          "cluster=1x8-h100", "cannot hold llama3-405b")
    assert not refused.exists()


@pytest.mark.parametrize("flags", [["interleaved-1f1b", "-v", "2"], ["hanayo", "--set", "waves=2"],
                                   ["zb-v", "--partition", "uniform", "--recompute", "full"],
                                   ["dualpipev", "--set", "fb_cost=0.9"]])
def test_simulate_and_compare_build_equal_points_for_the_same_flags(cli, monkeypatch, flags) -> None:
    built: dict[str, list[Point]] = {}

    def recording(command: str, module: object) -> None:
        original = module.points_for

        def points_for(*args: object, **kwargs: object) -> list[Point]:
            points = original(*args, **kwargs)
            built.setdefault(command, []).extend(points)
            return points

        monkeypatch.setattr(module, "points_for", points_for)

    recording("simulate", pipesched.cli.simulate)
    recording("compare", pipesched.compare)
    family, *options = flags
    common = ["-p", "4", "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2", *options]
    assert cli("simulate", family, *common, "--json").code == 0
    assert cli("compare", "--schedules", family, "--levels", "sim", *common, "--json").code == 0
    (simulated,), (compared,) = built["simulate"], built["compare"]
    assert simulated == compared
    assert (simulated.family, simulated.p, simulated.m, simulated.tp) == (family, 4, 8, 2)
