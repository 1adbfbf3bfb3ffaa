"""The serving search: its space (every deployment that fits the cluster, each scheduler and
cap), the points' keys, the store that resumes, the ranking by capacity per device."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from pipesched.enums import SchedulerName, SearchStatus
from pipesched.errors import PipeschedError
from pipesched.experiments.grids import process_map
from pipesched.experiments.serving import CapacityRecord, ServingPoint, ServingWorkload, serving_key
from pipesched.search.serving import (
    ServingSpace,
    ServingStore,
    capacity_command_line,
    read_serving_rows,
    search_serving,
)
from pipesched.search.store import SearchStore
from pipesched.serving.config import Instances, SchedulerSpec, ServeConfig

# a stand-in for the capacity search whose answers are known: a deployment's rate grows with
# its devices less a pipeline's share, and a single device cannot hold the model
EVALUATED_KEYS: list[str] = []


def known_capacity(point: ServingPoint) -> CapacityRecord:
    EVALUATED_KEYS.append(serving_key(point))
    config = point.config
    if config.disaggregate is None and config.instances.tp * config.instances.pp == 1:
        return CapacityRecord(serving_key(point), SearchStatus.OUT_OF_MEMORY, point.devices, reason="kv_cache=0 blocks")
    chunk = config.scheduler.chunk if config.scheduler.name == SchedulerName.SARATHI else 0
    qps = point.devices * (1.0 + 0.1 * config.instances.tp) - 0.01 * config.instances.pp + chunk * 1e-4
    return CapacityRecord(serving_key(point), SearchStatus.EVALUATED, point.devices, max_qps=qps, probes=3)


class Stop(Exception):
    """What a killed search sees: the evaluation stops after a few points."""


def stopping_after(count: int):
    def evaluate(point: ServingPoint) -> CapacityRecord:
        if len(EVALUATED_KEYS) >= count:
            raise Stop
        return known_capacity(point)
    return evaluate


SMALL = dict(model="llama3-8b", cluster="1x8-h100", workload=ServingWorkload(requests=20))


def test_the_space_holds_every_deployment_that_fits_the_devices() -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(2, 4), pipeline=(1, 2))
    found = {(i.tp, i.pp, i.count) for i in space.deployments()}
    by_hand = {(tp, pp, n) for tp, pp, n in itertools.product((2, 4), (1, 2), range(1, 9)) if tp * pp * n <= 8}
    assert found == by_hand and len(found) == 4 + 2 + 2 + 1
    points = space.points()
    assert len(points) == len(found) * 2  # vllm and sarathi
    assert all(point.devices <= 8 for point in points)
    assert {str(p.config.scheduler.name) for p in points} == {"vllm", "sarathi"}


def test_a_deployment_need_not_fill_the_devices() -> None:
    # 6 devices: one pipeline of TP 4 leaves two idle; TP 2 takes 1, 2 or 3 replicas of 1 stage, one of 3
    space = ServingSpace(**SMALL, gpus=6, tensor_parallel=(2, 4))
    found = {(i.tp, i.pp, i.count) for i in space.deployments()}
    assert found == {(4, 1, 1), (2, 1, 1), (2, 1, 2), (2, 1, 3), (2, 3, 1)}


def test_disaggregated_splits_fit_the_cluster_together() -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(2, 4), pipeline=(1,), replicas=(1, 2), disaggregated=True,
                         schedulers=("sarathi",))
    colocated = [(tp, 1, n) for tp in (2, 4) for n in (1, 2) if tp * n <= 8]
    pairs = [(a, b) for a in colocated for b in colocated if a[0] * a[2] + b[0] * b[2] <= 8]
    points = space.points()
    split = [p.config.disaggregate for p in points if p.config.disaggregate is not None]
    assert len(points) == len(colocated) + len(pairs)
    assert sorted(((d.prefill.tp, 1, d.prefill.count), (d.decode.tp, 1, d.decode.count)) for d in split) == sorted(pairs)
    assert max(d.prefill.devices + d.decode.devices for d in split) == 8


def test_caps_go_to_the_scheduler_that_reads_them() -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(8,), pipeline=(1,), schedulers=("vllm", "sarathi"),
                         chunks=(256, 512), max_tokens=(4096,), max_batch=(64, 128))
    specs = {(str(p.config.scheduler.name), p.config.scheduler.max_batch, p.config.scheduler.token_budget)
             for p in space.points()}
    assert specs == {(name, batch, tokens) for batch in (64, 128)
                     for name, tokens in (("vllm", 4096), ("sarathi", 256), ("sarathi", 512))}


def test_a_point_key_names_every_field() -> None:
    point = ServingPoint(model="llama3-8b")
    assert serving_key(point) == serving_key(ServingPoint(model="llama3-8b"))
    changed = [point.replace(config=ServeConfig(scheduler=SchedulerSpec(chunk=256))),
               point.replace(config=ServeConfig(instances=Instances(2, 2, 1))),
               point.replace(workload=ServingWorkload(seed=1)), point.replace(cluster="4x8-h100")]
    assert len({serving_key(p) for p in [point, *changed]}) == 5


def test_rows_rank_by_capacity_per_device(tmp_path) -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(1, 2, 4), pipeline=(1, 2), replicas=(1, 2))
    result = search_serving(space, db=tmp_path / "s.sqlite", evaluate=known_capacity)
    per_device = {}
    for point in space.points():
        record = known_capacity(point)
        if record.status == SearchStatus.EVALUATED:
            per_device[serving_key(point)] = record.max_qps / point.devices
    assert [row.key for row in result.ranking] == sorted(per_device, key=lambda k: -per_device[k])
    assert result.best.qps_per_gpu == pytest.approx(max(per_device.values()))
    assert result.count("out of memory") == 2 * 2  # tp 1, pp 1, one or two replicas, both schedulers
    command = capacity_command_line(result.space, result.best)
    assert f"-t {result.best.tp} -p {result.best.pp} --replicas {result.best.replicas}" in command


def test_a_search_started_again_evaluates_no_settled_point(tmp_path) -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(2, 4), pipeline=(1, 2))
    db = tmp_path / "s.sqlite"
    EVALUATED_KEYS.clear()
    first = search_serving(space, db=db, evaluate=known_capacity)
    assert len(EVALUATED_KEYS) == len(space.points()) == first.evaluated_now
    EVALUATED_KEYS.clear()
    again = search_serving(space, db=db, evaluate=known_capacity)
    assert EVALUATED_KEYS == [] and again.evaluated_now == 0 and again.runs == 2
    assert [row.key for row in again.ranking] == [row.key for row in first.ranking]
    assert [row.max_qps for row in again.rows] == [row.max_qps for row in first.rows]


def test_a_killed_search_keeps_what_it_finished_and_resumes(tmp_path) -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(2, 4), pipeline=(1, 2))
    db = tmp_path / "s.sqlite"
    EVALUATED_KEYS.clear()
    with pytest.raises(Stop):
        search_serving(space, db=db, evaluate=stopping_after(5))
    (stored,) = read_serving_rows(db)
    assert len(stored.rows) == 5
    EVALUATED_KEYS.clear()
    resumed = search_serving(space, db=db, evaluate=known_capacity)
    assert len(EVALUATED_KEYS) == len(space.points()) - 5
    assert {row.key for row in stored.rows}.isdisjoint(EVALUATED_KEYS)
    assert len(resumed.rows) == len(space.points())


def test_the_stores_of_the_two_searches_refuse_each_other(tmp_path) -> None:
    serving_db = tmp_path / "serve.sqlite"
    search_serving(ServingSpace(**SMALL, tensor_parallel=(8,), pipeline=(1,)), db=serving_db, evaluate=known_capacity)
    with pytest.raises(PipeschedError, match="pipesched-serve-search"):
        SearchStore.open(serving_db)
    training_db = tmp_path / "train.sqlite"
    SearchStore.open(training_db).close()
    with pytest.raises(PipeschedError, match="pipesched-search"):
        ServingStore.open(training_db)


def test_a_damaged_row_is_refused(tmp_path) -> None:
    db = tmp_path / "serve.sqlite"
    search_serving(ServingSpace(**SMALL, tensor_parallel=(8,), pipeline=(1,)), db=db, evaluate=known_capacity)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE points SET max_qps = NULL WHERE status = 'evaluated'")
    connection.close()
    with pytest.raises(PipeschedError, match="evaluated but no max_qps"):
        read_serving_rows(db)


def test_a_space_that_does_not_fit_is_refused_before_any_store(tmp_path) -> None:
    db = tmp_path / "s.sqlite"
    with pytest.raises(PipeschedError, match="gpus=8"):
        search_serving(ServingSpace(**SMALL, tensor_parallel=(16,)), db=db, evaluate=known_capacity)
    assert not db.exists()


def _values(result) -> list[tuple]:
    return [(row.key, row.status, row.max_qps, row.reason) for row in result.rows]


def test_the_same_rows_with_a_process_pool(tmp_path) -> None:
    space = ServingSpace(**SMALL, tensor_parallel=(1, 2), pipeline=(1, 2), replicas=(1,))
    alone = search_serving(space, db=tmp_path / "one.sqlite", evaluate=known_capacity)
    pooled = search_serving(space, db=tmp_path / "two.sqlite", mapper=process_map(2), evaluate=known_capacity)
    assert _values(pooled) == _values(alone)


@pytest.mark.slow
def test_the_same_rows_on_a_local_ray(tmp_path) -> None:
    ray = pytest.importorskip("ray")  # imported first: the pool binds to the loopback whatever the order
    from pipesched.experiments.ray_pool import ray_pool

    # the real capacity search (Ray's workers import pipesched, not this test module)
    space = ServingSpace(model="llama3-8b", cluster="1x8-h100", gpus=2, tensor_parallel=(1,), pipeline=(1, 2),
                         replicas=(1,), schedulers=("sarathi",), workload=ServingWorkload(requests=100))
    alone = search_serving(space, db=tmp_path / "one.sqlite")
    with ray_pool(workers=2) as mapper:
        assert ray.util.get_node_ip_address() == "127.0.0.1"  # loopback only
        on_ray = search_serving(space, db=tmp_path / "ray.sqlite", mapper=mapper)
    assert _values(on_ray) == _values(alone)
    assert alone.count("evaluated") == 2
