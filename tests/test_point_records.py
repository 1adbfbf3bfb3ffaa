"""An experiment point is three records, each of one concern: the schedule asked for, the
workload, the engine settings; what its fields imply is settled once, where it is built."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from pipesched.errors import PipeschedError
from pipesched.experiments.point import EngineSettings, Point, ScheduleRequest, Workload
from pipesched.generators import generate
from pipesched.io.stage_costs import load_stage_costs


def _costs_file(tmp_path, stages: int) -> str:
    path = tmp_path / "costs.csv"
    path.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                    + "".join(f"{s},0.01,0.02,0.01,1e8,1e6\n" for s in range(stages)))
    return str(path)


def test_a_point_is_its_three_parts() -> None:
    point = Point("zb-v", p=4, m=8, options=(("activation_limit", 4),), dp=2, tp=2, contention=False,
                  steady_state=True)
    assert point.request == ScheduleRequest("zb-v", p=4, m=8, options=(("activation_limit", 4),))
    assert point.workload == Workload(dp=2, tp=2)
    assert point.engine == EngineSettings(contention=False, steady_state=True)
    assert [field.name for field in dataclasses.fields(Point)] == ["request", "workload", "engine"]
    # every field of every part reads back through the point, under its own name
    for part in (point.request, point.workload, point.engine):
        for field in dataclasses.fields(part):
            assert getattr(point, field.name) == getattr(part, field.name), field.name


def test_no_field_belongs_to_two_parts() -> None:
    names = [field.name for record in (ScheduleRequest, Workload, EngineSettings)
             for field in dataclasses.fields(record)]
    assert len(names) == len(set(names))


def test_replace_changes_one_part_and_keeps_the_others() -> None:
    point = Point("1f1b", p=4, m=8, dp=2)
    changed = point.replace(m=16, overlap=False)
    assert (changed.m, changed.overlap, changed.p, changed.dp) == (16, False, 4, 2)
    assert changed.workload is point.workload  # untouched parts are the same records
    assert point.m == 8  # a point is frozen: replace makes a new one
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.p = 3  # type: ignore[misc]


def test_a_given_table_fixes_the_name_and_sizes_where_the_point_is_built() -> None:
    table = generate("zb-v", 4, 8)
    point = Point(schedule=table)
    assert (point.family, point.p, point.m) == (table.name, table.num_devices, table.num_microbatches)
    # sizes asked for later still read the table's: the table fixes them
    assert point.replace(p=9, m=3).p == table.num_devices


def test_stage_costs_stand_for_the_model_and_cluster(tmp_path) -> None:
    costs = load_stage_costs(_costs_file(tmp_path, 4))
    point = Point("1f1b", p=4, m=8, stage_costs=costs)
    assert (point.model, point.cluster) == (None, None)
    assert point.replace(model="llama3-8b").model is None  # still the costs' workload
    assert Point(frozen_layers=[0, 1]).frozen_layers == (0, 1)  # listed layers are hashable


@pytest.mark.parametrize(("fields", "fragments"), [
    ({"p": 0}, ("p=0", ">= 1")),
    ({"tp": 0}, ("tensor_parallel=0",)),
    ({"dp": 1, "zero": 1}, ("zero=1", "dp=1")),
    ({"host_memory": -1.0}, ("host_memory=-1",)),
    ({"recompute": "most"}, ("recompute",)),
])
def test_each_part_refuses_what_it_cannot_be(fields, fragments) -> None:
    with pytest.raises(PipeschedError) as caught:
        Point("1f1b", **fields)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_an_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        Point("1f1b", bogus=1)


def test_the_workload_alone_sets_up_the_simulation() -> None:
    # two points that differ in the schedule asked for and the engine share one setup
    first, second = Point("1f1b", p=4, m=8), Point("zb-v", p=4, m=16, contention=False, steady_state=True)
    assert first.workload == second.workload
    assert first.setup() is second.setup()


def test_points_travel_to_worker_processes_whole() -> None:
    point = Point("zb-h1", p=4, m=8, dp=2, options=(("activation_limit", 4),), overlap=False)
    copied = pickle.loads(pickle.dumps(point))
    assert copied == point and hash(copied) == hash(point)
    assert copied.overlap is False and copied.options == (("activation_limit", 4),)
