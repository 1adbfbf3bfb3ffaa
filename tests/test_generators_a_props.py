"""Property tests of interleaved 1F1B, looped BFS, ZB-H1, ZB-H2, ZB-V, V-Half and V-Min over
random sizes (p in 2..16, m in 1..64, v in 2..4 where the family takes it).

Every table is complete, puts each op on its stage's device, runs without deadlock, validates,
and meets its level-1 closed form: exactly where the form is exact, within the bounds its
note documents otherwise. The heuristics keep any memory limit they are given.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.costs import StageCosts
from pipesched.generators import formula, generate
from pipesched.ops import B, F, I, W
from pipesched.ordering import walk
from pipesched.schedule import Schedule
from pipesched.slots import inflight_per_device, table_metrics
from pipesched.validation import validate

SETTINGS = settings(max_examples=25, deadline=None)
SIZES = {"p": st.integers(2, 16), "m": st.integers(1, 64)}
EQUAL_COSTS = st.sampled_from([StageCosts.slots(), StageCosts.slots(f=2, i=2, w=2), StageCosts.slots(f=0.5, i=0.5, w=0.5)])
# uneven slot lengths within a factor 6 of each other, the range the bounds are stated for
UNEVEN_COSTS = st.builds(
    StageCosts.slots,
    f=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    i=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    w=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
)


def check_table(schedule: Schedule, *, split: bool) -> None:
    """Every (stage, microbatch) has one F and one B, or one I and one W; every op is on its
    stage's device; the tables run to the end; the validator agrees."""
    counts = Counter((op.stage, op.microbatch, op.kind) for _, op in schedule.ops())
    backward = (0, 1, 1) if split else (1, 0, 0)
    for stage in range(schedule.num_stages):
        for mb in range(schedule.num_microbatches):
            assert counts.pop((stage, mb, F), 0) == 1, (stage, mb)
            found = tuple(counts.pop((stage, mb, kind), 0) for kind in (B, I, W))
            assert found == backward, (stage, mb, found)
    assert not counts, f"ops outside the model: {sorted(counts)[:3]}"
    assert schedule.num_ops == schedule.num_stages * schedule.num_microbatches * (3 if split else 2)
    for device, op in schedule.ops():
        assert schedule.device_of(op.stage, op.microbatch) == device, (device, str(op))
    assert walk(schedule, lambda op: 1.0).stuck is None
    assert validate(schedule) == []


def idle_and_peak(schedule: Schedule, costs: StageCosts) -> tuple[float, float, int]:
    """Worst device's idle, every device's work (equal in these families), peak in flight."""
    metrics = table_metrics(schedule, costs)
    return max(metrics.idle_per_device), metrics.makespan - max(metrics.idle_per_device), max(metrics.peak_inflight)


def assert_exact(name: str, p: int, m: int, v: int | None, costs: StageCosts) -> None:
    schedule = generate(name, p, m, v=v)
    estimate = formula(name, p, m, v=v, costs=costs)
    assert estimate.exact
    metrics = table_metrics(schedule, costs)
    assert metrics.makespan == estimate.makespan, (metrics.makespan, estimate)
    assert min(metrics.idle_per_device) >= 0
    assert max(metrics.peak_inflight) == estimate.peak_inflight
    assert metrics.activation_units == estimate.activation_units


# --- looped placements -------------------------------------------------------------------
@pytest.mark.slow
@SETTINGS
@given(**SIZES, v=st.integers(2, 4), costs=st.one_of(EQUAL_COSTS, UNEVEN_COSTS))
def test_interleaved_1f1b(p, m, v, costs):
    schedule = generate("interleaved-1f1b", p, m, v=v)
    check_table(schedule, split=False)
    assert schedule.placement.replicas[0] == tuple(s % p for s in range(p * v))
    # the closed form is exact for every m (rounds of m < p add (v-1)(p-m)(F+B))
    assert_exact("interleaved-1f1b", p, m, v, costs)


@SETTINGS
@given(p=st.integers(2, 16), rounds=st.integers(1, 4), v=st.integers(2, 4), costs=EQUAL_COSTS)
def test_interleaved_1f1b_with_m_a_multiple_of_p(p, rounds, v, costs):
    # the textbook case: idle (p-1)(F+B) chunk slots, p + (p-1)/v stages of activations
    # (with a single round every forward runs first: m stages)
    m = p * rounds
    estimate = formula("interleaved-1f1b", p, m, v=v, costs=costs)
    assert estimate.idle == (p - 1) * (costs.f + costs.b)
    assert estimate.activation_units == min(p + (p - 1) / v, m)
    assert_exact("interleaved-1f1b", p, m, v, costs)


@pytest.mark.slow
@SETTINGS
@given(**SIZES, v=st.integers(2, 4), costs=st.one_of(EQUAL_COSTS, UNEVEN_COSTS))
def test_looped_bfs(p, m, v, costs):
    schedule = generate("looped-bfs", p, m, v=v)
    check_table(schedule, split=False)
    assert_exact("looped-bfs", p, m, v, costs)
    assert max(inflight_per_device(schedule)) == v * m


# --- one stage per device, split backward --------------------------------------------------
@pytest.mark.slow
@SETTINGS
@given(**SIZES, costs=EQUAL_COSTS)
def test_zb_h1_and_zb_h2_with_equal_costs(p, m, costs):
    for name, peak in (("zb-h1", min(p, m)), ("zb-h2", min(2 * p - 1, m))):
        schedule = generate(name, p, m)
        check_table(schedule, split=True)
        assert_exact(name, p, m, None, costs)
        assert max(inflight_per_device(schedule)) == peak


@SETTINGS
@given(**SIZES, costs=UNEVEN_COSTS)
def test_zb_h1_and_zb_h2_with_uneven_costs_stay_within_the_documented_bounds(p, m, costs):
    for name in ("zb-h1", "zb-h2"):
        estimate = formula(name, p, m, costs=costs)
        idle, work, peak = idle_and_peak(generate(name, p, m), costs)
        assert work == estimate.work
        assert peak == estimate.peak_inflight
        if not estimate.exact:
            # the last device starts (p-1)F late; no worse than 1F1B's fill and drain
            assert (p - 1) * costs.f - 1e-9 <= idle <= (p - 1 + max(0, p - m)) * (costs.f + costs.b) + 1e-9


@st.composite
def stage_costs(draw, num_stages: int) -> StageCosts:
    def values():
        return [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(num_stages)]

    return StageCosts(values(), values(), values(), [1.0] * num_stages, [0.0] * num_stages)


@pytest.mark.slow
@SETTINGS
@given(p=st.integers(2, 12), m=st.integers(1, 48), data=st.data())
def test_one_stage_heuristic_keeps_its_activation_limit(p, m, data):
    name = data.draw(st.sampled_from(["zb-h1", "zb-h2"]))
    limit = data.draw(st.integers(1, 2 * p + 2))
    costs = data.draw(st.one_of(st.none(), UNEVEN_COSTS, stage_costs(p)))
    schedule = generate(name, p, m, costs=costs, activation_limit=limit)
    check_table(schedule, split=True)
    assert validate(schedule, activation_limit=limit) == []
    assert max(inflight_per_device(schedule)) <= limit


# --- V placement ---------------------------------------------------------------------------------
@pytest.mark.slow
@SETTINGS
@given(**SIZES, costs=EQUAL_COSTS)
def test_zb_v_with_equal_costs(p, m, costs):
    schedule = generate("zb-v", p, m)
    check_table(schedule, split=True)
    assert schedule.placement.replicas[0] == tuple(min(s, 2 * p - 1 - s) for s in range(2 * p))
    assert_exact("zb-v", p, m, None, costs)


@SETTINGS
@given(**SIZES, costs=UNEVEN_COSTS)
def test_zb_v_with_uneven_costs_stays_within_the_documented_bounds(p, m, costs):
    estimate = formula("zb-v", p, m, costs=costs)
    idle, _, peak = idle_and_peak(generate("zb-v", p, m), costs)
    assert peak == estimate.peak_inflight
    if not estimate.exact:
        unit_form = max(p - 1, 4 * p - 2 - 2 * m) * (costs.f + costs.i + costs.w)
        assert (p - 1) * costs.f - 1e-9 <= idle < 2 * unit_form


@pytest.mark.slow
@SETTINGS
@given(p=st.integers(2, 10), m=st.integers(1, 40), data=st.data())
def test_zb_v_heuristic_keeps_its_activation_limit(p, m, data):
    limit = data.draw(st.integers(2, 2 * p + 2))
    costs = data.draw(st.one_of(st.none(), UNEVEN_COSTS, stage_costs(2 * p)))
    schedule = generate("zb-v", p, m, costs=costs, activation_limit=limit)
    check_table(schedule, split=True)
    assert validate(schedule, activation_limit=limit) == []


@pytest.mark.slow
@SETTINGS
@given(**SIZES, costs=EQUAL_COSTS, name=st.sampled_from(["v-half", "v-min"]))
def test_v_half_and_v_min(p, m, costs, name):
    schedule = generate(name, p, m)
    check_table(schedule, split=True)
    estimate = formula(name, p, m, costs=costs)
    idle, work, peak = idle_and_peak(schedule, costs)
    assert work == estimate.work
    # the peak is the building block's, exactly
    assert peak == estimate.peak_inflight
    # idle: the paper's approximation, p(F+I+W) for V-Half and (4p/3)(F+I+W) for V-Min, in
    # slots of F: within 7 below it once the pipeline is full (m >= 2p), never above 4p
    unit = costs.f
    assert idle <= 4 * p * unit
    if m >= 2 * p:
        low = (3 * p - 7) if name == "v-half" else (4 * p - 7)
        high = 3 * p if name == "v-half" else 4 * p
        assert low * unit <= idle <= high * unit
        assert high * unit == estimate.idle


@pytest.mark.slow
@SETTINGS
@given(p=st.integers(2, 16), m=st.integers(1, 64))
def test_v_half_and_v_min_use_less_memory_than_zb_v(p, m):
    zb_v = max(inflight_per_device(generate("zb-v", p, m)))
    half = max(inflight_per_device(generate("v-half", p, m)))
    minimum = max(inflight_per_device(generate("v-min", p, m)))
    assert minimum <= half <= zb_v
