"""GPipe and 1F1B: golden tables, closed forms, properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched import io
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, formula, generate, get_family
from pipesched.slots import inflight_per_device, table_metrics
from pipesched.validation import validate


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_golden_tables(name: str, golden) -> None:
    golden.check(f"{name}_p4_m8.txt", io.dumps(generate(name, 4, 8)))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 16), m=st.integers(1, 64), name=st.sampled_from(["gpipe", "1f1b"]),
       f=st.integers(1, 3), i=st.integers(1, 3), w=st.integers(0, 3))
def test_slot_table_equals_closed_form(p: int, m: int, name: str, f: int, i: int, w: int) -> None:
    schedule = generate(name, p, m)
    assert validate(schedule) == []
    assert schedule.num_ops == 2 * p * m
    costs = StageCosts.slots(f, i, w)
    metrics = table_metrics(schedule, costs)
    est = formula(name, p, m, costs=costs)
    assert est.exact
    assert metrics.makespan == est.makespan == (m + p - 1) * (f + i + w)
    assert max(metrics.peak_inflight) == est.peak_inflight


def test_one_f_one_b_holds_p_minus_d_on_device_d() -> None:
    assert inflight_per_device(generate("1f1b", 6, 20)) == [6, 5, 4, 3, 2, 1]
    assert inflight_per_device(generate("gpipe", 3, 5)) == [5, 5, 5]


def test_unknown_family_lists_known_ones() -> None:
    with pytest.raises(PipeschedError, match="known families: gpipe, 1f1b"):
        get_family("zb-h9")


@pytest.mark.parametrize("p,m,match", [(1, 4, "p=1"), (4, 0, "m=0")])
def test_impossible_sizes_name_the_constraint(p: int, m: int, match: str) -> None:
    for name in ("gpipe", "1f1b"):
        with pytest.raises(PipeschedError, match=match):
            generate(name, p, m)


def test_fixed_chunk_families_reject_v() -> None:
    with pytest.raises(PipeschedError, match="v=2"):
        generate("1f1b", 4, 8, v=2)


def test_every_family_documents_itself() -> None:
    for family in FAMILIES.values():
        assert family.summary and family.constraints


def test_huge_sizes_are_refused_before_any_work(cli) -> None:
    result = cli("show", "1f1b", "-p", "100000", "-m", "100000")
    assert result.code == 2 and "p=100000: over the limit of 1,024 pipeline devices" in result.err
    assert result.out == ""
    with pytest.raises(PipeschedError, match=r"size=p512 x m4096 x v2: about 12,582,912 ops.*lower p, m or v"):
        generate("zb-v", 512, 4096)
