"""The one declaration of the StageCosts fields (``pipesched.costs.COST_FIELDS``): it covers
every field, every field round-trips through the stage-cost CSV and JSON, old files still
load, and each transform does what its rule says on hand-worked costs."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error
from pipesched.costs import COST_FIELDS, SECONDS, SLOTS, Quantity, StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments.setup import split_stage_costs
from pipesched.generators import generate
from pipesched.io.stage_costs import dumps_stage_costs, parse_stage_costs
from pipesched.rules import FORWARD_ONLY, INPUT_GRADIENT, TRAINS
from pipesched.slots import table_costs

# a stage-cost file as written before the file held every field (no recompute_s,
# input_frees, fb_cost or unit column)
OLD_FILE = """stage,forward,backward_input,backward_weight,activation_bytes,output_bytes,static_bytes,kept_for_w_bytes,frozen,fb
0,0.010,0.010,0.008,2e9,1.6e7,1e10,1e8,0,0.02
1,0.012,0.0125,0.0075,2e9,1.6e7,1e10,1e8,1,0.021
"""
HEADER = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes"

# every field given, two stages, nothing uniform
FULL = StageCosts(
    forward=(2.0, 4.0), backward_input=(3.0, 5.0), backward_weight=(1.0, 2.0), activation_bytes=(8.0, 6.0),
    output_bytes=(4.0, 2.0), backward=(4.5, 7.5), static_bytes=(18.0, 36.0), grad_bytes=(4.0, 8.0), input_frees=0.25,
    kept_for_w_bytes=(1.0, 3.0), unit=SECONDS, frozen=(False, True), recompute_s=(0.5, 1.0),
    forward_backward=(5.0, 9.0), fb_cost=0.75)


def test_the_declaration_covers_every_field_once() -> None:
    declared = [spec.name for spec in COST_FIELDS]
    assert declared == [field.name for field in dataclasses.fields(StageCosts)]
    columns = [spec.column for spec in COST_FIELDS]
    assert len(set(columns)) == len(columns) and "stage" not in columns
    assert all(spec.meaning for spec in COST_FIELDS)
    # the test's full costs give every field (so the transforms below see each one)
    assert all(getattr(FULL, name) is not None for name in declared)


# --- round trips ------------------------------------------------------------------------
_NUMBERS = {Quantity.TIME: (0.0, 1e6), Quantity.BYTES: (0.0, 1e20), Quantity.FRACTION: (0.0, 1.0),
            Quantity.RATIO: (0.5, 1.0)}


def _values(quantity: Quantity) -> st.SearchStrategy:
    if quantity is Quantity.FLAG:
        return st.booleans()
    if quantity is Quantity.UNIT:
        return st.sampled_from((SECONDS, SLOTS))
    low, high = _NUMBERS[quantity]
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


@st.composite
def stage_costs(draw) -> StageCosts:
    """Any valid StageCosts: each field drawn from what its declaration says it holds."""
    stages = draw(st.integers(1, 5))
    fields = {}
    for spec in COST_FIELDS:
        if not spec.required and draw(st.booleans()):
            continue  # left at its default
        values = _values(spec.quantity)
        fields[spec.name] = (tuple(draw(values) for _ in range(stages)) if spec.per_stage else draw(values))
    return StageCosts(**fields)


@settings(max_examples=60, deadline=None)
@given(costs=stage_costs())
def test_every_field_round_trips_through_the_stage_cost_file(costs: StageCosts) -> None:
    assert parse_stage_costs(dumps_stage_costs(costs)) == costs


@settings(max_examples=60, deadline=None)
@given(costs=stage_costs())
def test_every_field_round_trips_through_json(costs: StageCosts) -> None:
    assert StageCosts.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs


def test_recompute_and_input_frees_are_written_and_read() -> None:
    text = dumps_stage_costs(FULL)
    header = text.splitlines()[0].split(",")
    for column in ("recompute_s", "input_frees", "fb", "fb_cost", "frozen", "kept_for_w_bytes"):
        assert column in header
    read = parse_stage_costs(text)
    assert read.recompute_s == (0.5, 1.0) and read.input_frees == 0.25 and read.fb_cost == 0.75
    assert read == FULL


def test_an_old_file_loads_with_the_defaults_of_the_new_columns() -> None:
    costs = parse_stage_costs(OLD_FILE, num_stages=2)
    assert costs.forward == (0.010, 0.012)
    assert costs.kept_for_w_bytes == (1e8, 1e8) and costs.frozen == (False, True)
    assert costs.forward_backward == (0.02, 0.021)
    # the columns the file lacks: what StageCosts is without them
    assert costs.recompute_s is None and costs.backward is None and costs.grad_bytes is None
    assert (costs.input_frees, costs.fb_cost, costs.unit) == (0.5, 1.0, SECONDS)


@pytest.mark.parametrize(
    ("column", "cells", "fragments"),
    [
        ("input_frees", ("0.5", "0.25"), ["stage=1", "input_frees=0.25", "same on every row"]),
        ("input_frees", ("1.5", "1.5"), ["input_frees=1.5", "1"]),
        ("fb_cost", ("0.25", "0.25"), ["fb_cost=0.25", "0.5"]),
        ("unit", ("hours", "hours"), ["unit='hours'", "'s' or 'slot'"]),
        ("recompute_s", ("-1", "0"), ["recompute_s=-1", ">= 0"]),
    ],
)
def test_bad_new_columns_name_the_line_field_and_value(column: str, cells: tuple[str, str],
                                                      fragments: list[str]) -> None:
    text = f"{HEADER},{column}\n0,1,1,1,1,1,{cells[0]}\n1,1,1,1,1,1,{cells[1]}\n"
    with pytest.raises(PipeschedError) as info:
        parse_stage_costs(text, source="costs.csv")
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_bad_json_costs_name_the_field() -> None:
    with pytest.raises(PipeschedError, match=r"costs\.speed"):
        StageCosts.from_dict({**StageCosts.slots().to_dict(), "speed": [1.0]})
    with pytest.raises(PipeschedError, match=r"costs\.forward\[0\]"):
        StageCosts.from_dict({**StageCosts.slots().to_dict(), "forward": ["fast"]})
    with pytest.raises(PipeschedError, match=r"costs\.output_bytes"):
        StageCosts.from_dict({"forward": [1.0], "backward_input": [1.0], "backward_weight": [1.0],
                              "activation_bytes": [1.0]})


# --- the transforms, on hand-worked costs -----------------------------------------------
def test_half_a_microbatch_halves_times_and_per_microbatch_sizes_only() -> None:
    half = FULL.of_microbatch_fraction(0.5)
    assert half.forward == (1.0, 2.0) and half.backward_input == (1.5, 2.5) and half.backward_weight == (0.5, 1.0)
    assert half.backward == (2.25, 3.75) and half.forward_backward == (2.5, 4.5) and half.recompute_s == (0.25, 0.5)
    assert half.activation_bytes == (4.0, 3.0) and half.output_bytes == (2.0, 1.0)
    assert half.kept_for_w_bytes == (0.5, 1.5)
    # parameters, gradients, flags and ratios are not per microbatch
    assert half.static_bytes == (18.0, 36.0) and half.grad_bytes == (4.0, 8.0) and half.frozen == (False, True)
    assert (half.input_frees, half.fb_cost, half.unit) == (0.25, 0.75, SECONDS)


def test_a_checkpoint_redoes_the_forward_and_keeps_the_input_boundary() -> None:
    costs = FULL.checkpointed([1])
    # stage 1 redoes its forward (4.0) in I and in B; it keeps stage 0's output (2 x 2.0 bytes in)
    assert costs.backward_input == (3.0, 9.0) and costs.backward == (4.5, 11.5) and costs.recompute_s == (0.5, 5.0)
    assert costs.activation_bytes == (8.0, 4.0)
    assert costs.backward_weight == FULL.backward_weight and costs.kept_for_w_bytes == FULL.kept_for_w_bytes
    assert costs.forward_backward == FULL.forward_backward and costs.static_bytes == FULL.static_bytes
    # no recompute time known before: the checkpoint's is all there is
    assert StageCosts.uniform(2, forward=3.0).checkpointed([0]).recompute_s == (3.0, 0.0)


def test_chunks_divide_the_stage_but_keep_its_boundary_and_flag() -> None:
    split = split_stage_costs(FULL, 4)
    assert split.num_stages == 4
    assert split.forward == (1.0, 1.0, 2.0, 2.0) and split.backward == (2.25, 2.25, 3.75, 3.75)
    assert split.static_bytes == (9.0, 9.0, 18.0, 18.0) and split.recompute_s == (0.25, 0.25, 0.5, 0.5)
    assert split.kept_for_w_bytes == (0.5, 0.5, 1.5, 1.5) and split.forward_backward == (2.5, 2.5, 4.5, 4.5)
    assert split.output_bytes == (4.0, 4.0, 2.0, 2.0) and split.frozen == (False, False, True, True)
    assert (split.input_frees, split.fb_cost) == (0.25, 0.75)


def test_the_slot_table_keeps_op_lengths_and_counts_stage_microbatches() -> None:
    schedule = generate("1f1b", 2, 4)
    slots = table_costs(schedule, FULL)
    assert slots.unit == SLOTS
    assert slots.forward == FULL.forward and slots.backward == FULL.backward
    assert slots.forward_backward == FULL.forward_backward and slots.fb_cost == 0.75
    # one unit of activations per stage-microbatch, none freed at I, free messages, nothing else
    assert slots.activation_bytes == (1.0, 1.0) and slots.output_bytes == (0.0, 0.0) and slots.input_frees == 0.0
    assert slots.static_bytes is None and slots.kept_for_w_bytes is None and slots.frozen is None
    assert slots.recompute_s is None and slots.grad_bytes is None
    given = StageCosts.slots(1, 2, 1)
    assert (given.forward, given.backward_input, given.backward_weight, given.b) == ((1.0,), (2.0,), (1.0,), 3.0)
    assert (given.activation_bytes, given.output_bytes, given.input_frees, given.unit) == ((1.0,), (0.0,), 0.0, SLOTS)
    assert given.static_bytes is None and given.backward is None and given.fb_cost == 1.0


def test_a_given_pair_ratio_replaces_the_measured_pair() -> None:
    costs = FULL.with_pair_cost(0.5)
    assert costs.forward_backward is None and costs.fb_cost == 0.5
    assert costs.fused_time(0, 2.0, 4.5) == 4.5  # 0.5 x 6.5 = 3.25, never less than the longer part
    assert dataclasses.replace(costs, fb_cost=FULL.fb_cost, forward_backward=FULL.forward_backward) == FULL


def test_a_per_op_overhead_adds_to_every_op_time() -> None:
    costs = FULL.with_op_overhead(0.5)
    assert costs.forward == (2.5, 4.5) and costs.backward_input == (3.5, 5.5) and costs.backward_weight == (1.5, 2.5)
    assert costs.backward == (5.0, 8.0) and costs.forward_backward == (5.5, 9.5)
    assert costs.recompute_s == FULL.recompute_s  # part of a backward, not an op of its own
    assert costs.activation_bytes == FULL.activation_bytes


def test_roles_zero_the_work_a_stage_does_not_run() -> None:
    costs = FULL.for_roles((TRAINS, INPUT_GRADIENT))
    assert costs.backward_weight == (1.0, 0.0) and costs.backward_input == (3.0, 5.0)
    assert costs.backward is None and costs.full_backward(1) == 5.0  # a B on a frozen stage costs I
    none = FULL.for_roles((FORWARD_ONLY, TRAINS))
    assert none.backward_input == (0.0, 5.0) and none.backward_weight == (0.0, 2.0) and none.forward == FULL.forward


def test_op_times_alone() -> None:
    costs = StageCosts.from_times({"forward": (1.0, 2.0), "backward_input": (2.0, 2.0), "backward_weight": (1.0, 1.0)})
    assert costs.activation_bytes == (0.0, 0.0) and costs.output_bytes == (0.0, 0.0)
    assert costs.full_backward(1) == 3.0


# --- the commands -----------------------------------------------------------------------
def test_simulate_reads_an_old_file_and_its_new_form_alike(cli, tmp_path) -> None:
    old = tmp_path / "old.csv"
    old.write_text(OLD_FILE)
    new = tmp_path / "new.csv"
    new.write_text(dumps_stage_costs(parse_stage_costs(OLD_FILE)))
    first = cli("simulate", "zb-h1", "-p", "2", "-m", "4", "--stage-costs", str(old), "--json")
    second = cli("simulate", "zb-h1", "-p", "2", "-m", "4", "--stage-costs", str(new), "--json")
    assert first.code == 0 and second.code == 0, first.err + second.err
    for key in ("iteration_time_s", "bubble_ratio", "peak_memory_bytes"):
        assert json.loads(first.out)[key] == json.loads(second.out)[key]


def test_a_bad_shared_column_is_one_line_error(cli, tmp_path) -> None:
    path = tmp_path / "costs.csv"
    path.write_text(f"{HEADER},input_frees\n0,1,1,1,1,1,0.5\n1,1,1,1,1,1,0.25\n")
    result = cli("simulate", "1f1b", "-p", "2", "-m", "4", "--stage-costs", str(path))
    assert_one_line_error(result, "input_frees=0.25", "same on every row")
    assert result.out == ""


@pytest.mark.parametrize("name", ["pipesched.costs", "pipesched.slots"])
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_every_optional_per_stage_field_says_what_its_absence_means() -> None:
    """A per-stage field a file may leave out reads None; its declaration says what that
    stands for (the CSV's missing column, the JSON's missing key)."""
    unexplained = [f.name for f in COST_FIELDS if f.per_stage and not f.required and not f.absent]
    assert unexplained == []


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_value_is_named_by_its_stage(bad):
    """Costs are checked in one pass; a bad value is still named by the first stage holding it."""
    for stage in range(3):
        values = [0.0, 1.0, 2.0]
        values[stage] = bad
        with pytest.raises(PipeschedError, match=rf"^backward_input\[stage {stage}\]="):
            StageCosts(forward=(1.0,) * 3, backward_input=values, backward_weight=(1.0,) * 3,
                       activation_bytes=(0.0,) * 3, output_bytes=(0.0,) * 3)
    assert StageCosts(forward=(1, 2), backward_input=(0, -0.0), backward_weight=(1, 1), activation_bytes=(0, 0),
                      output_bytes=(0, 0)).backward_input == (0.0, -0.0)
