"""Chimera, Hanayo, DualPipe and DualPipeV: constraints, reference tables, published findings.

DualPipeV is checked against PyTorch's ScheduleDualPipeV; DualPipe against the phase
structure of deepseek-ai/DualPipe's ``step()`` (read by hand into the expected prefix below)
and against DualPipeV, which is the same per-device program on half the devices.
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from types import SimpleNamespace

import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, formula, generate
from pipesched.generators.chimera import chimera, chimera_idle
from pipesched.generators.dualpipe import dualpipe
from pipesched.generators.dualpipev import dualpipev
from pipesched.generators.hanayo import hanayo
from pipesched.io.grid import dumps, loads
from pipesched.metrics import iteration_microbatches, throughput
from pipesched.ops import B, F, I, Op
from pipesched.rules import RULES
from pipesched.schedule import Placement
from pipesched.simulate import Network, simulate
from pipesched.slots import slot_table, table_metrics
from pipesched.validation import validate

FAMILY_NAMES = ("chimera", "hanayo", "dualpipe", "dualpipev")


# --- registry and constraints ------------------------------------------------------------
def test_families_are_registered():
    for name in FAMILY_NAMES:
        assert FAMILIES[name].name == name
    assert FAMILIES["hanayo"].chunks is None and FAMILIES["hanayo"].default_v == 2
    assert FAMILIES["dualpipev"].chunks == 2


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "field", "words"),
    [
        ("chimera", 3, 6, None, "p=3", "even"),
        ("chimera", 4, 6, None, "m=6", "multiple of 4"),
        ("dualpipe", 3, 8, None, "p=3", "even"),
        ("dualpipe", 4, 9, None, "m=9", "even"),
        ("dualpipe", 4, 6, None, "m=6", "m >= 2p = 8"),
        ("dualpipev", 4, 7, None, "m=7", "m >= 2p = 8"),
        ("hanayo", 4, 8, 3, "v=3", "even v"),
        ("hanayo", 4, 0, None, "m=0", "at least 1"),
        ("dualpipev", 1, 8, None, "p=1", "at least 2"),
    ],
)
def test_impossible_sizes_name_the_constraint(name, p, m, v, field, words):
    with pytest.raises(PipeschedError) as caught:
        generate(name, p, m, v=v)
    message = str(caught.value)
    assert message.startswith(f"{field}:")
    assert words in message
    assert "\n" not in message


def test_hanayo_needs_a_wave():
    with pytest.raises(PipeschedError, match=r"^waves=0: "):
        hanayo(4, 8, waves=0)


def test_fixed_chunk_families_refuse_v():
    with pytest.raises(PipeschedError, match=r"^v=3: dualpipev always uses 2"):
        generate("dualpipev", 4, 8, v=3)


def test_cli_reports_bad_sizes_on_one_line(cli):
    result = cli("show", "chimera", "-p", "4", "-m", "6")
    assert result.code == 2
    assert result.err.strip() == (
        "pipesched: error: m=6: Chimera concatenates basic units of p=4 microbatches; "
        "give m a multiple of 4"
    )


# --- placements and routes ---------------------------------------------------------------
def test_bidirectional_families_route_half_each_way():
    for schedule in (chimera(4, 8), dualpipe(4, 8)):
        assert schedule.placement == Placement.bidirectional(4)
        assert schedule.route == (0, 0, 0, 0, 1, 1, 1, 1)
        # microbatch 5 goes up: stage 0 on device 3
        assert schedule.device_of(0, 5) == 3
        assert schedule.device_of(0, 1) == 0


def test_hanayo_waves_map_to_zigzag_chunks():
    schedule = generate("hanayo", 4, 8, v=4)
    assert schedule.params["waves"] == 2
    assert schedule.placement == Placement.zigzag(4, 4)
    assert schedule.num_stages == 16
    assert generate("hanayo", 4, 8).placement == Placement.vshape(4)


def test_grid_round_trips_two_replicas():
    for schedule in (chimera(4, 8), dualpipe(4, 8), hanayo(4, 8, waves=2), dualpipev(4, 8)):
        again = loads(dumps(schedule))
        assert again.device_ops == schedule.device_ops
        assert again.placement == schedule.placement
        assert again.route == schedule.route


# --- DualPipeV against PyTorch -----------------------------------------------------------
def _torch_dualpipev_order(p: int, m: int) -> dict[int, list]:
    """PyTorch's ScheduleDualPipeV tables, built from stand-in stages.

    The constructor reads only the stages' group size, rank, stage count and submodule (for
    its torch.compile check) and stores ``stage_index_to_group_rank`` on them; it computes
    ``pipeline_order`` for every rank, so one rank's stages suffice and no process group is
    needed.
    """
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    stages = [
        SimpleNamespace(submod=None, group_size=p, group_rank=0, num_stages=2 * p) for _ in range(2)
    ]
    return ScheduleDualPipeV(stages, m).pipeline_order


@pytest.mark.parametrize(
    ("p", "m"), [(2, 4), (2, 7), (3, 6), (4, 8), (4, 11), (5, 13), (6, 12), (8, 16), (8, 32)]
)
def test_dualpipev_equals_pytorch_schedule(p, m):
    # action for action, PyTorch's OVERLAP_F_B pairs equal to our fused ops
    order = _torch_dualpipev_order(p, m)
    ours = dualpipev(p, m)
    assert sorted(order) == list(range(p))
    for rank in range(p):
        assert [str(op) for op in ours.device_ops[rank]] == [str(action) for action in order[rank]], f"rank {rank}"


def test_pytorch_refuses_what_we_refuse():
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        _torch_dualpipev_order(4, 7)
    with pytest.raises(PipeschedError):
        dualpipev(4, 7)


# --- DualPipe against DualPipe's step() -----------------------------------------------------
def test_dualpipe_first_device_follows_dualpipe_phases():
    # 8 ranks, 20 microbatches (10 each way), rank 0 (half_rank 0), as in DualPipe's README
    # figure. Forward direction: stage 0, microbatches 0..9; reverse: stage 7, 10..19.
    ops = [str(op) for op in dualpipe(8, 20).device_ops[0]]

    def pair(forward: str, backward: str) -> str:
        return f"({forward};{backward})OVERLAP_F_B"

    expected = [
        # 1. nF0: 2 x (4 - 0 - 1) = 6 forwards
        *["0F0", "0F1", "0F2", "0F3", "0F4", "0F5"],
        # 2. nF0F1: 1 pair
        *["0F6", "7F10"],
        # 3. nB1W1F1 with zero bubble: 3 rounds
        *["7I10", "7W10", "7F11", "7I11", "7W11", "7F12", "7I12", "7W12", "7F13"],
        # 4. nF0B1F1B0: 10 - 8 + 0 + 1 = 3 rounds of two overlapped pairs
        *[pair("0F7", "7B13"), pair("7F14", "0B0"), pair("0F8", "7B14"), pair("7F15", "0B1"),
          pair("0F9", "7B15"), pair("7F16", "0B2")],
        # 5. nB1F1B0: 3 rounds of B1 and an overlapped pair
        *["7B16", pair("7F17", "0B3"), "7B17", pair("7F18", "0B4"), "7B18", pair("7F19", "0B5")],
        # 6. nB1B0: 1 round, zero bubble from the first B0 on (half_rank 0 is even)
        *["7B19", "0I6"],
        # 7. nWB0: 3 rounds
        *["0W6", "0I7", "0W7", "0I8", "0W8", "0I9"],
        # 8. nW: 1
        "0W9",
    ]
    assert ops == expected
    unfused = [str(op) for op in dualpipe(8, 20, fused=False).device_ops[0]]
    assert unfused == [part for op in dualpipe(8, 20).device_ops[0] for part in map(str, op.atoms)]


def test_middle_rank_runs_its_first_steady_pair_unoverlapped():
    # rank 3 of 8 is a middle rank: its first F0, B1 of step 4 are two ops, the next a pair
    ops = dualpipe(8, 20).device_ops[3]
    first_backward = next(i for i, op in enumerate(ops) if op.kind is B)
    assert ops[first_backward - 1].kind is F
    assert ops[first_backward + 1].parts


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 12), (6, 14), (8, 20), (8, 34)])
def test_dualpipe_is_dualpipev_on_each_half(p, m):
    """Device r < p/2 of DualPipe runs DualPipeV's device r program for p/2 devices and m/2
    microbatches: its down stage is the same stage, its up stage p-1-r carries the reverse
    microbatches. Device p-1-r mirrors it with the two directions swapped."""
    half, n = p // 2, m // 2
    ours = dualpipe(p, m)
    folded = dualpipev(half, n)

    def mapped(op: Op, change) -> Op:
        if op.parts:
            return Op.fused(*(change(part) for part in op.parts))
        return change(op)

    for r in range(half):
        expected = [
            mapped(op, lambda o: Op(o.stage, o.kind, o.microbatch if o.stage < half else n + o.microbatch))
            for op in folded.device_ops[r]
        ]
        assert list(ours.device_ops[r]) == expected
        mirrored = [
            mapped(op, lambda o: Op(o.stage, o.kind, o.microbatch + n if o.microbatch < n else o.microbatch - n))
            for op in ours.device_ops[r]
        ]
        assert list(ours.device_ops[p - 1 - r]) == mirrored


def test_overlapped_pairs_are_forward_then_backward_of_the_other_stage():
    for schedule in (dualpipe(8, 32), dualpipev(8, 32)):
        for ops in schedule.device_ops:
            pairs = [op for op in ops if op.parts]
            assert pairs, "every device has a steady phase"
            for op in pairs:
                forward, backward = op.parts
                assert op.kind.value == "OVERLAP_F_B"
                assert forward.kind is F and backward.kind is B
                assert forward.stage != backward.stage


# --- Chimera and Hanayo tables -----------------------------------------------------------
def test_chimera_basic_unit_has_p_minus_2_bubble_cells():
    # the paper's picture: equal cells, D-2 bubbles on every worker of a basic unit
    costs = StageCosts.slots(f=1, i=0.5, w=0.5)
    for p in (4, 6, 8):
        metrics = table_metrics(chimera(p, p), costs)
        assert metrics.idle_per_device == tuple(float(p - 2) for _ in range(p))


def test_chimera_holds_p_microbatches_or_2p_when_doubling_forwards():
    for p, m in ((4, 16), (8, 32), (16, 64)):
        plain = table_metrics(chimera(p, m, forward_doubling=0)).peak_inflight
        assert max(plain) == p
        assert plain[0] == p // 2 + 1  # the first device: p/2 down, 1 up
        doubled = table_metrics(chimera(p, m)).peak_inflight
        assert max(doubled) == 2 * p
    assert max(table_metrics(chimera(8, 8)).peak_inflight) == 8  # one unit: nothing to double


@pytest.mark.parametrize("p", [4, 8, 16])
@pytest.mark.parametrize("units", [1, 2, 4, 8])
def test_chimera_bubble_at_or_below_1f1b_with_b_twice_f(p, units):
    # the paper's units with forward doubling at F = I = W = 1 (B = 2F)
    m = units * p
    chimera_bubble = table_metrics(generate("chimera", p, m)).bubble_ratio
    assert chimera_bubble <= table_metrics(generate("1f1b", p, m)).bubble_ratio
    # with B = 2F a doubled unit's forward cell is as long as a backward: the idle stays at
    # one basic unit's p/2-1 forward and p/2-1 backward bubbles, (p/2-1)(F+B)
    if units > 1:
        assert set(table_metrics(generate("chimera", p, m)).idle_per_device) == {(p / 2 - 1) * 3}


def test_forward_doubling_order_of_the_paper():
    # device 0 of 4 (down stage 0 primary, a = 2, b = 0): two doubled warm-up forwards, then
    # per pair of up microbatches two forwards and one backward, then p/2 more backward pairs
    ops = [str(op) for op in chimera(4, 8).device_ops[0]]
    assert ops[:10] == ["0F0", "0F1", "0F2", "0F3", "3F4", "3F5", "3B4", "3F6", "3F7", "3B5"]
    assert ops[10:] == ["0B0", "3B6", "0B1", "3B7", "0B2", "0B3"]


@pytest.mark.parametrize("costs", [StageCosts.slots(), StageCosts.slots(f=1, i=0.5, w=0.5), StageCosts.slots(f=1, i=2, w=2),
                                   StageCosts.slots(f=2, i=0.25, w=0.25), StageCosts.slots(f=1, i=1.25, w=1.25)])
def test_chimera_closed_form_is_exact_at_any_costs(costs):
    for p in (2, 4, 6, 10):
        for units in range(1, 7):
            m = units * p
            for doubling in (0, 1):
                idle = table_metrics(chimera(p, m, forward_doubling=doubling), costs).idle_per_device
                expected = chimera_idle(p, m, costs, forward_doubling=bool(doubling))
                assert idle == pytest.approx([expected] * p)
            assert formula("chimera", p, m, costs=costs).idle == pytest.approx(chimera_idle(p, m, costs))


def test_chimera_forward_doubling_is_a_switch():
    with pytest.raises(PipeschedError, match=r"^forward_doubling=2: give 1 \(on\) or 0 \(off\)"):
        generate("chimera", 4, 8, forward_doubling=2)
    assert chimera(4, 8, forward_doubling=0).params["forward_doubling"] == 0
    assert chimera(4, 4).params["forward_doubling"] == 0  # one unit: nothing to double
    assert chimera(4, 8).params["forward_doubling"] == 1


@pytest.mark.parametrize("costs", [StageCosts.slots(), StageCosts.slots(f=2, i=1, w=1), StageCosts.slots(f=1, i=3, w=0.5),
                                   StageCosts.slots(f=1, i=0.25, w=0.25), StageCosts.slots(f=1, i=0.75, w=0.75)])
def test_hanayo_one_wave_table_equals_its_closed_form(costs):
    for p in (2, 3, 4, 5, 8):
        for m in (1, 2, p - 1, p, p + 1, 2 * p - 2, 2 * p - 1, 2 * p, 3 * p, 4 * p + 1):
            if m < 1:
                continue
            metrics = table_metrics(hanayo(p, m), costs)
            estimate = formula("hanayo", p, m, costs=costs)
            assert estimate.exact
            assert max(metrics.idle_per_device) == pytest.approx(estimate.idle)
            assert max(metrics.peak_inflight) == estimate.peak_inflight


@pytest.mark.parametrize("m", [32, 64])
def test_hanayo_one_wave_matches_interleaved_1f1b_at_the_same_chunk_count(m):
    # p = 8, F = I = W = 1: the wave order idles (p-1)(F+B) chunk slots, like interleaved 1F1B
    # with v = 2, where the fold of a deep 1F1B idled (p-1) slots more
    wave = table_metrics(generate("hanayo", 8, m))
    interleaved = table_metrics(generate("interleaved-1f1b", 8, m, v=2))
    assert wave.makespan == interleaved.makespan == 6 * m + 21
    assert set(wave.idle_per_device) == {21.0}


def test_hanayo_wave_order_has_no_holes_in_its_steady_phase():
    # a device waits once for the first backward wave, then only in the drain after its
    # last forward: no holes while forwards and backwards alternate
    timeline = slot_table(hanayo(8, 32))
    for device in range(8):
        rows = sorted((r for r in range(len(timeline.op_device)) if timeline.op_device[r] == device),
                      key=lambda r: timeline.op_start[r])
        last_forward = max(timeline.op_start[r] for r in rows if timeline.op_kind[r] == RULES.index(F))
        gap_starts = [timeline.op_end[a] for a, b in pairwise(rows)
                      if timeline.op_start[b] > timeline.op_end[a]]
        assert all(start > last_forward for start in gap_starts[1:])


def test_hanayo_waves_option():
    assert generate("hanayo", 4, 8, waves=2).device_ops == generate("hanayo", 4, 8, v=4).device_ops
    assert generate("hanayo", 4, 8, v=4, waves=2).params["waves"] == 2
    with pytest.raises(PipeschedError, match=r"^waves=3: -v 4 means 2 waves"):
        generate("hanayo", 4, 8, v=4, waves=3)
    with pytest.raises(PipeschedError, match=r"^waves=1.5: "):
        generate("hanayo", 4, 8, waves=1.5)


def test_more_waves_lower_hanayo_bubble_and_raise_activations():
    ratios, units = [], []
    for waves in (1, 2, 3):
        schedule = hanayo(8, 32, waves=waves)
        metrics = table_metrics(schedule)
        ratios.append(metrics.bubble_ratio)
        units.append(metrics.activation_units)
    assert ratios[0] > ratios[1] > ratios[2]
    assert units[0] < units[1] < units[2]


# --- formulas (level 1) ------------------------------------------------------------------
def test_formula_notes_say_what_is_approximate():
    for name in FAMILY_NAMES:
        estimate = formula(name, 8, 32, v=None)
        assert estimate.exact or estimate.note
    assert "2x parameters" in formula("chimera", 8, 32).note
    assert "2x parameters" in formula("dualpipe", 8, 32).note
    assert formula("chimera", 8, 32, costs=StageCosts.slots(f=2, i=1, w=1)).exact


@pytest.mark.parametrize("x", [1.0, 2.0])
def test_unfused_dualpipe_tables_idle_half_the_published_bubble_at_equal_costs(x):
    # each overlapped pair as two ops (fused=0): the table idles half of the figure
    costs = StageCosts.slots(f=x, i=x, w=x)
    for name, p, m in (
        ("dualpipe", 8, 32),
        ("dualpipe", 4, 10),
        ("dualpipev", 4, 8),
        ("dualpipev", 8, 40),
    ):
        published = formula(name, p, m, costs=costs).idle
        idle = max(table_metrics(generate(name, p, m, fused=0), costs).idle_per_device)
        assert idle == published / 2


def test_formula_peaks_match_tables():
    for name, p, m, v in (
        ("dualpipe", 8, 32, None),
        ("dualpipev", 8, 32, None),
        ("chimera", 8, 32, None),
        ("hanayo", 8, 32, 4),
    ):
        estimate = formula(name, p, m, v=v)
        peaks = table_metrics(generate(name, p, m, v=v)).peak_inflight
        assert max(peaks) == estimate.peak_inflight


# --- findings of the tabular-abstraction study, checked at level 2 ----------------------------
@pytest.mark.parametrize("p", [4, 8, 16])
def test_chimera_beats_1f1b_with_few_microbatches(p):
    chimera_time = table_metrics(generate("chimera", p, p)).makespan
    one_f_one_b_time = table_metrics(generate("1f1b", p, p)).makespan
    assert chimera_time < one_f_one_b_time


def test_plain_concatenation_loses_its_advantage_with_many_microbatches():
    # with B = 2F, directly concatenated units leave gaps: 1F1B catches up at m = 4p; forward
    # doubling keeps the gain
    p = 8

    def gain(m, **options):
        return (table_metrics(generate("1f1b", p, m)).makespan
                - table_metrics(generate("chimera", p, m, **options)).makespan)

    plain = [gain(m, forward_doubling=0) for m in (p, 2 * p, 4 * p)]
    assert plain[0] > plain[1] > plain[2]
    assert plain[2] < 0
    assert all(gain(m) > 0 for m in (p, 2 * p, 4 * p, 8 * p))


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 32), (8, 16), (8, 64)])
def test_dualpipev_bubble_below_1f1b(p, m):
    assert (
        table_metrics(dualpipev(p, m)).bubble_ratio
        < table_metrics(generate("1f1b", p, m)).bubble_ratio
    )


# --- golden tables -----------------------------------------------------------------------
GOLDEN = [
    ("chimera_p4_m4.txt", "chimera", 4, 4, None),
    ("chimera_p4_m8.txt", "chimera", 4, 8, None),
    ("chimera_p4_m12.txt", "chimera", 4, 12, None),
    ("hanayo_p4_m8.txt", "hanayo", 4, 8, None),
    ("hanayo_p4_m8_v4.txt", "hanayo", 4, 8, 4),
    ("dualpipe_p4_m8.txt", "dualpipe", 4, 8, None),
    ("dualpipe_p8_m20.txt", "dualpipe", 8, 20, None),
    ("dualpipev_p4_m8.txt", "dualpipev", 4, 8, None),
]


@pytest.mark.parametrize(("filename", "name", "p", "m", "v"), GOLDEN)
def test_golden_tables(golden, filename, name, p, m, v):
    schedule = generate(name, p, m, v=v)
    assert validate(schedule) == []
    golden.check(filename, dumps(schedule))


def test_split_backwards_only_where_dualpipe_splits_them():
    assert not chimera(4, 8).splits_backward and not hanayo(4, 8).splits_backward
    ops = dualpipev(4, 8).device_ops[0]
    # device 0 of 4 (h = 0): 3 split in step 3, 1 in step 6, 3 in step 7
    assert sum(op.kind is I for op in ops) == 2 * (4 - 0 - 1) + 1


# --- Chimera's backward halving ------------------------------------------------------------
def test_chimera_backward_halving_is_a_switch_and_needs_forward_doubling():
    with pytest.raises(PipeschedError, match=r"^backward_halving=2: give 1 \(on\) or 0 \(off\)"):
        generate("chimera", 4, 8, backward_halving=2)
    with pytest.raises(PipeschedError, match=r"^backward_halving=1: backward halving is forward doubling"):
        generate("chimera", 4, 8, backward_halving=1, forward_doubling=0)
    halved = chimera(4, 8, backward_halving=1)
    assert halved.num_microbatches == 16 and halved.microbatch_fraction == 0.5
    assert validate(halved) == []


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("units", [1, 2, 4, 8])
def test_chimera_backward_halving_table_equals_its_closed_form_and_beats_1f1b(p, units):
    m = units * p
    costs = StageCosts.slots(f=1, i=1, w=1)  # B = 2F
    halved = table_metrics(generate("chimera", p, m, backward_halving=1), costs)
    estimate = formula("chimera", p, m, costs=costs, backward_halving=1)
    assert estimate.exact and halved.makespan == pytest.approx(estimate.makespan)
    # the activations of p whole microbatches (2p halves), not forward doubling's 2p
    assert halved.activation_units == pytest.approx(estimate.activation_units) == p
    assert halved.makespan <= table_metrics(generate("1f1b", p, m), costs).makespan
    assert halved.makespan <= table_metrics(generate("chimera", p, m), costs).makespan


def test_half_size_microbatches_cost_half_in_time_memory_and_throughput():
    # one whole-microbatch cost row: the halved table runs each half at half of it
    costs = dataclasses.replace(StageCosts.uniform(4, forward=1.0, backward_input=1.0, backward_weight=1.0,
                                                   activation_bytes=8.0, output_bytes=2.0), static_bytes=(100.0,) * 4)
    network = Network.uniform(4, latency=0.0, bandwidth=float("inf"))
    doubled = simulate(generate("chimera", 4, 16), costs, network)
    halved = simulate(generate("chimera", 4, 16, backward_halving=1), costs, network)
    assert sum(halved.busy_per_device()) == pytest.approx(sum(doubled.busy_per_device()))
    # forward doubling holds 2p microbatches' activations at its peak, halving p (2p halves)
    assert max(halved.memory.peak) - 2 * 100.0 < max(doubled.memory.peak) - 2 * 100.0
    samples_halved, _ = throughput(halved.makespan, microbatches=iteration_microbatches(halved))
    assert samples_halved == pytest.approx(16 / halved.makespan)


def test_backward_halving_is_not_run_for_real(cli):
    result = cli("run", "chimera", "-p", "2", "-m", "2", "--set", "backward_halving=1")
    assert result.code == 2 and "backward halving" in result.err and "Traceback" not in result.err


def test_a_table_of_a_command_is_generated_once():
    """A command asks for its table twice (to read it, then to simulate it): a table of
    hundreds of thousands of ops comes back the same object, not built again."""
    first = generate("zb-v", 64, 512)
    assert first.num_ops > 100_000
    assert generate("zb-v", 64, 512) is first
