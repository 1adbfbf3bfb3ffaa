"""Property tests of Chimera, Hanayo, DualPipe and DualPipeV over random sizes.

Every table is complete, puts each op on the device of its microbatch's replica, runs without
deadlock, validates, and meets its level-1 closed form: exactly where the form is exact, within
the documented bounds otherwise.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.costs import StageCosts
from pipesched.generators import formula, generate
from pipesched.generators.chimera import chimera_idle
from pipesched.ops import B, F, I, W
from pipesched.ordering import walk
from pipesched.schedule import Schedule
from pipesched.slots import table_metrics
from pipesched.validation import validate

SETTINGS = settings(max_examples=30, deadline=None)
# slot costs with B >= F, the regime the bounds below are stated for
COSTS = st.sampled_from([StageCosts.slots(), StageCosts.slots(f=2, i=1, w=1), StageCosts.slots(f=1, i=2, w=2)])


@st.composite
def chimera_sizes(draw):
    p = draw(st.integers(1, 8)) * 2
    units = draw(st.integers(1, 64 // p))
    return p, units * p


@st.composite
def dualpipe_sizes(draw):
    p = draw(st.integers(1, 8)) * 2
    m = draw(st.integers(p, 32)) * 2  # even, >= 2p
    return p, m


@st.composite
def dualpipev_sizes(draw):
    p = draw(st.integers(2, 16))
    return p, draw(st.integers(2 * p, 64))


def check_table(schedule: Schedule) -> None:
    """Complete, on the right devices, deadlock-free, valid."""
    counts = Counter((op.stage, op.microbatch, op.kind) for _, op in schedule.ops())
    for stage in range(schedule.num_stages):
        for mb in range(schedule.num_microbatches):
            kinds = {kind: counts.pop((stage, mb, kind), 0) for kind in (F, B, I, W)}
            assert kinds[F] == 1, (stage, mb)
            assert (kinds[B], kinds[I], kinds[W]) in ((1, 0, 0), (0, 1, 1)), (stage, mb, kinds)
    assert not counts, f"ops outside the model: {sorted(counts)[:3]}"
    for device, op in schedule.ops():
        assert schedule.device_of(op.stage, op.microbatch) == device, (device, str(op))
    assert walk(schedule, lambda op: 1.0).stuck is None
    assert validate(schedule) == []


def idle(schedule: Schedule, costs: StageCosts) -> float:
    return max(table_metrics(schedule, costs).idle_per_device)


@pytest.mark.slow
@SETTINGS
@given(chimera_sizes(), COSTS)
def test_chimera(sizes, costs):
    p, m = sizes
    schedule = generate("chimera", p, m)
    check_table(schedule)
    assert schedule.num_ops == 2 * p * m
    estimate = formula("chimera", p, m, costs=costs)
    assert max(table_metrics(schedule).peak_inflight) == estimate.peak_inflight == (p if m == p else 2 * p)
    assert estimate.exact
    assert idle(schedule, costs) == pytest.approx(estimate.idle)
    plain = generate("chimera", p, m, forward_doubling=0)
    check_table(plain)
    assert idle(plain, costs) == pytest.approx(chimera_idle(p, m, costs, forward_doubling=False))
    # doubling never idles more than plain concatenation when B >= F
    assert idle(schedule, costs) <= idle(plain, costs) + 1e-9


@pytest.mark.slow
@SETTINGS
@given(st.integers(2, 16), st.integers(1, 64), st.integers(1, 3), COSTS)
def test_hanayo(p, m, waves, costs):
    v = 2 * waves
    schedule = generate("hanayo", p, m, v=v)
    check_table(schedule)
    assert schedule.num_stages == v * p
    assert schedule.num_ops == 2 * v * p * m
    estimate = formula("hanayo", p, m, v=v, costs=costs)
    assert max(table_metrics(schedule).peak_inflight) == estimate.peak_inflight
    measured = idle(schedule, costs)
    assert measured >= estimate.idle - 1e-9
    if waves == 1:
        assert estimate.exact
    elif m >= 2 * p:
        assert measured <= 1.7 * estimate.idle
    else:
        assert measured <= v * estimate.idle
    if estimate.exact:
        assert measured == pytest.approx(estimate.idle)


@pytest.mark.slow
@SETTINGS
@given(dualpipe_sizes(), st.sampled_from([1.0, 2.0]))
def test_dualpipe(sizes, x):
    p, m = sizes
    schedule = generate("dualpipe", p, m)
    check_table(schedule)
    forwards = sum(op.kind is F for _, op in schedule.ops())
    assert forwards == p * m
    assert schedule.num_ops == 2 * p * m + sum(op.kind is I for _, op in schedule.ops())
    assert (
        max(table_metrics(schedule).peak_inflight)
        == formula("dualpipe", p, m).peak_inflight
        == p + 1
    )
    equal = StageCosts.slots(f=x, i=x, w=x)
    assert (
        idle(schedule, equal) == formula("dualpipe", p, m, costs=equal).idle == 2 * (p // 2 - 1) * x
    )


@pytest.mark.slow
@SETTINGS
@given(dualpipev_sizes(), st.sampled_from([1.0, 2.0]))
def test_dualpipev(sizes, x):
    p, m = sizes
    schedule = generate("dualpipev", p, m)
    check_table(schedule)
    assert sum(op.kind is F for _, op in schedule.ops()) == 2 * p * m
    assert (
        max(table_metrics(schedule).peak_inflight)
        == formula("dualpipev", p, m).peak_inflight
        == 2 * p + 1
    )
    equal = StageCosts.slots(f=x, i=x, w=x)
    assert idle(schedule, equal) == formula("dualpipev", p, m, costs=equal).idle == 2 * (p - 1) * x
