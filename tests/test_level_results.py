"""One result type per level, each with its units and the fields only it reports, and one
serializer giving the JSON keys the README's "JSON output" table names for its records."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipesched.costs import StageCosts
from pipesched.experiments import Point, evaluate
from pipesched.experiments.evaluation import (
    FormulaResult,
    LevelResult,
    SimulatedResult,
    TableResult,
)

FAST = Point(stage_costs=StageCosts.uniform(4, output_bytes=1.0))
# the README's keys of the compare records: slots and 1F1B-stage activations below the sim
# level, seconds, bytes, rates and the worst or some device's figures at it
SLOT_KEYS = {"iteration_time_slots", "peak_activation_units"}
SIM_KEYS = {"iteration_time_s", "max_peak_memory_bytes", "throughput_samples_per_s", "throughput_tokens_per_s",
            "mfu", "any_out_of_memory", "max_exposed_comm_s", "max_host_peak_memory_bytes"}
SHARED = {"schedule", "level", "bubble_ratio", "rank", "previous_rank", "rank_changed", "asynchronous"}


@pytest.fixture(scope="module")
def results() -> dict[str, LevelResult]:
    record = evaluate(FAST.replace(family="zb-h1", p=4, m=8))
    assert record.ok, record.error
    return {result.level: result for result in record.results}


def test_each_level_has_its_own_type_and_units(results) -> None:
    assert (type(results["formula"]), type(results["table"]), type(results["sim"])) == (
        FormulaResult, TableResult, SimulatedResult)
    assert {level: (r.time_unit, r.memory_unit) for level, r in results.items()} == {
        "formula": ("slot", "1F1B-stage activations"), "table": ("slot", "1F1B-stage activations"),
        "sim": ("s", "bytes")}


def test_each_serializer_gives_its_levels_keys_only(results) -> None:
    formula, table, sim = (results[level].to_dict() for level in ("formula", "table", "sim"))
    for record in (formula, table):
        assert set(record) >= SHARED | SLOT_KEYS
        assert not SIM_KEYS & set(record), sorted(SIM_KEYS & set(record))
    assert set(sim) >= SHARED | SIM_KEYS
    assert not SLOT_KEYS & set(sim)
    assert "exact" in formula and "exact" not in table and "exact" not in sim
    json.dumps([formula, table, sim])
    # the values are the result's own, under the unit's key
    assert sim["iteration_time_s"] == results["sim"].iteration_time
    assert formula["peak_activation_units"] == results["formula"].peak_memory


def test_what_a_level_does_not_report_reads_none(results) -> None:
    formula = results["formula"]
    assert (formula.mfu, formula.out_of_memory, formula.training, formula.staleness) == (None, None, None, None)
    assert results["table"].mfu is None and results["table"].out_of_memory is None
    assert not hasattr(results["table"], "exact") and not hasattr(results["formula"], "throughput_samples_per_s")


def test_no_level_has_a_field_of_another_meaning() -> None:
    shared = {field.name for field in dataclasses.fields(LevelResult)}
    only = {kind: {field.name for field in dataclasses.fields(kind)} - shared
            for kind in (FormulaResult, TableResult, SimulatedResult)}
    assert only[FormulaResult] == {"peak_inflight", "exact"}
    assert "mfu" in only[SimulatedResult] and "mfu" not in only[TableResult]
    assert len(shared) <= 8  # what every level reports, and nothing more
