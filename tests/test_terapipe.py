"""TeraPipe as a family: its dynamic program against brute force over every slicing, its
closed form against the proportionate flow shop the engine runs, the KV order of its slices
on the simulated timeline, and with equal slice costs GPipe's over the slices."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import formula, generate
from pipesched.generators.terapipe import terapipe_slicing
from pipesched.ops import B, F
from pipesched.schedule import Execution
from pipesched.simulate import Network, simulate
from pipesched.slots import slot_table


def _hand_times(lengths: tuple[int, ...], a: float, overhead: float) -> list[float]:
    """A slice of tokens [i, j) of n: overhead, its tokens' linear share, and its causal
    attention: each of its tokens attends to every token up to itself, (j^2 - i^2) / n^2 of
    the whole sequence's."""
    n, start, times = sum(lengths), 0, []
    for length in lengths:
        end = start + length
        times.append(overhead + (1 - a) * length / n + a * (end * end - start * start) / (n * n))
        start = end
    return times


def _compositions(n: int):
    """Every slicing of n units, as lengths."""
    for cuts in itertools.product((0, 1), repeat=n - 1):
        lengths, run = [], 1
        for cut in cuts:
            if cut:
                lengths.append(run)
                run = 1
            else:
                run += 1
        yield (*lengths, run)


def _objective(lengths, p, a, overhead, sequences=1) -> float:
    times = _hand_times(lengths, a, overhead)
    return sequences * sum(times) + (p - 1) * max(times)


@pytest.mark.parametrize(("units", "p", "a", "overhead"), [
    (6, 4, 0.0, 0.0), (7, 2, 0.5, 0.01), (8, 8, 0.9, 0.02), (9, 3, 0.3, 0.1), (10, 16, 1.0, 0.005)])
def test_the_dynamic_program_is_optimal_against_every_slicing(units, p, a, overhead) -> None:
    every = list(_compositions(units))
    for slices in range(1, units + 1):
        chosen = terapipe_slicing(p, units=units, attention_share=a, slice_overhead=overhead, slices=slices)
        assert len(chosen) == slices and sum(chosen) == units
        best = min(_objective(c, p, a, overhead) for c in every if len(c) == slices)
        assert _objective(chosen, p, a, overhead) == pytest.approx(best, rel=1e-12, abs=1e-15)
    for sequences in (1, 3):
        chosen = terapipe_slicing(p, units=units, attention_share=a, slice_overhead=overhead, slices=0,
                                  sequences=sequences)
        best = min(_objective(c, p, a, overhead, sequences) for c in every)
        assert _objective(chosen, p, a, overhead, sequences) == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_later_slices_are_shorter_when_attention_dominates() -> None:
    lengths = terapipe_slicing(8, units=32, attention_share=0.8, slices=4)
    assert list(lengths) == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert terapipe_slicing(8, units=32, attention_share=0.0, slices=4) == (8, 8, 8, 8)


OPTIONS = {"slices": 4, "units": 16, "attention_share": 0.7, "slice_overhead": 0.01}


def test_the_closed_form_is_the_flow_shop_the_table_runs() -> None:
    costs = StageCosts.uniform(4, forward=1.0, backward_input=1.5, backward_weight=0.5)
    for m in (1, 3):
        schedule = generate("terapipe", 4, m, **OPTIONS)
        lengths = tuple(schedule.params["slices"])
        times = _hand_times(lengths, 0.7, 0.01)
        span = (m * sum(times) + 3 * max(times)) * (1.0 + 2.0)  # (m sum + (p - 1) max) x (F + B)
        assert slot_table(schedule, costs).makespan == pytest.approx(span, rel=1e-12)
        assert formula("terapipe", 4, m, costs=costs, **OPTIONS).makespan == pytest.approx(span, rel=1e-12)


def test_a_slice_starts_only_after_the_earlier_slices_kv_exists_on_its_stage() -> None:
    schedule = generate("terapipe", 4, 2, **OPTIONS)
    costs = StageCosts.uniform(4, forward=2.0, backward_input=3.0, backward_weight=1.0, output_bytes=1e6)
    timeline = simulate(schedule, costs, Network.uniform(4, latency=1e-3, bandwidth=1e9))
    k = len(schedule.params["slices"])
    f_kind, b_kind = schedule.rules.index(F), schedule.rules.index(B)
    times = _hand_times(tuple(schedule.params["slices"]), 0.7, 0.01)
    for stage in range(4):
        for kind, order in ((f_kind, 1), (b_kind, -1)):
            rows = np.flatnonzero((timeline.op_stage == stage) & (timeline.op_kind == kind))
            by_microbatch = {int(timeline.op_microbatch[r]): r for r in rows}
            for sequence in range(2):
                slices = [by_microbatch[sequence * k + i] for i in range(k)][::order]
                for earlier, later in itertools.pairwise(slices):
                    assert timeline.op_start[later] >= timeline.op_end[earlier]
        # a slice's forward lasts its share of the sequence's: its time grows with its position
        forwards = sorted((int(timeline.op_microbatch[r]), r) for r in np.flatnonzero(
            (timeline.op_stage == stage) & (timeline.op_kind == f_kind)))
        for microbatch, row in forwards:
            duration = timeline.op_end[row] - timeline.op_start[row]
            assert duration == pytest.approx(2.0 * times[microbatch % k], rel=1e-12)


def test_with_equal_slice_costs_it_is_gpipe_over_the_slices() -> None:
    costs = StageCosts.uniform(4, forward=2.0, backward_input=3.0, backward_weight=1.0, output_bytes=4e6)
    network = Network.uniform(4, latency=1e-3, bandwidth=1e9)
    slices = {"slices": 4, "units": 16, "attention_share": 0.0}
    tera = generate("terapipe", 4, 3, **slices)
    assert tera.params["slices"] == [4, 4, 4, 4]
    gpipe = generate("gpipe", 4, 12)
    quarter = costs.of_microbatch_fraction(0.25)
    assert simulate(tera, costs, network).makespan == pytest.approx(simulate(gpipe, quarter, network).makespan,
                                                                     rel=1e-12)
    assert slot_table(tera, costs).makespan == pytest.approx(slot_table(gpipe, quarter).makespan, rel=1e-12)
    assert formula("terapipe", 4, 3, costs=costs, **slices).makespan == pytest.approx(
        formula("gpipe", 4, 12, costs=quarter).makespan, rel=1e-12)


def test_the_execution_record_keeps_the_slices_scales() -> None:
    schedule = generate("terapipe", 2, 2, **OPTIONS)
    record = schedule.execution
    assert len(record.microbatch_scales) == schedule.num_microbatches
    again = Execution.from_dict(json.loads(json.dumps(record.to_dict())), num_stages=2,
                                num_microbatches=schedule.num_microbatches)
    assert again == record
    with pytest.raises(PipeschedError, match="microbatch_scales"):
        Execution.from_dict({"microbatch_scales": [[1.0, 1.0]]}, num_stages=2, num_microbatches=3)


def test_bad_slicings_are_refused() -> None:
    with pytest.raises(PipeschedError, match="slices=9"):
        generate("terapipe", 2, 2, slices=9, units=8)
    with pytest.raises(PipeschedError, match="units=65"):
        generate("terapipe", 2, 2, units=65)
    with pytest.raises(PipeschedError, match="attention_share=2"):
        generate("terapipe", 2, 2, attention_share=2)


@pytest.mark.slow
def test_simulate_and_compare_run_terapipe_on_a_model(cli) -> None:
    run = ["-p", "2", "-m", "2", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2", "-s", "16384"]
    simulated = cli("simulate", "terapipe", *run, "--set", "slices=4", "--json")
    assert simulated.code == 0, simulated
    assert json.loads(simulated.out)["iteration_time_s"] > 0
    compared = cli("compare", "--schedules", "terapipe,gpipe", *run, "--json")
    assert compared.code == 0, compared
    assert_one_line_error(cli("simulate", "terapipe", *run, "--set", "slices=40"), "slices=40")


def test_a_slice_holds_activations_in_proportion_to_its_tokens() -> None:
    schedule = generate("terapipe", 2, 1, **OPTIONS)
    lengths = schedule.params["slices"]
    costs = StageCosts.uniform(2, forward=2.0, backward_input=3.0, backward_weight=1.0, activation_bytes=8.0)
    memory = simulate(schedule, costs, Network.uniform(2, latency=0.0, bandwidth=float("inf"))).memory
    static = memory.static[0]
    levels = sorted({float(v) - static for v in memory.values[0]} - {0.0})
    # after each forward on device 0: the slices so far, 8 bytes a whole sequence
    held = np.cumsum([8.0 * length / sum(lengths) for length in lengths])
    assert levels[:len(lengths)] == pytest.approx(sorted(held), rel=1e-12)
    assert memory.peak[0] - static == pytest.approx(8.0, rel=1e-12)
