"""Data parallelism in the model: collectives over the cluster's links (ring, hierarchical),
the replica-major rank layout, a gradient all-reduce per stage in the compiled graph that
overlaps the last backward ops, ZeRO-1's memory and traffic, throughput and MFU of d
pipelines, and the --dp / --zero options of simulate and compare."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.experiments import Point, evaluate
from pipesched.experiments.simulation import simulate_point
from pipesched.generators import generate
from pipesched.model import (
    CollectiveLevel,
    LinkSpec,
    allreduce_seconds,
    allreduce_time,
    data_parallel_groups,
    group_levels,
    load_cluster,
    reduce_scatter_seconds,
)
from pipesched.schedule import Placement
from pipesched.simulate import compile_graph, run
from pipesched.simulate.memory import peak_memory
from pipesched.simulate.network import DataParallel, Network
from pipesched.timeline import ALLREDUCE
from simulate_helpers import random_costs

GiB = 2.0**30


# --- collectives ---------------------------------------------------------------------------
def test_ring_allreduce_sends_two_n_minus_one_over_n_of_the_buffer() -> None:
    level = CollectiveLevel(4, 1e-5, 1e9)
    assert allreduce_seconds(8e9, (level,)) == pytest.approx(2 * 3 / 4 * 8.0 + 6 * 1e-5)
    assert reduce_scatter_seconds(8e9, (level,)) == pytest.approx(allreduce_seconds(8e9, (level,)) / 2)
    # two ranks (a Chimera stage and its replica): bytes / bandwidth + 2 latencies
    assert allreduce_seconds(3e9, (CollectiveLevel(2, 0.25, 1e9),)) == pytest.approx(3.0 + 0.5)
    # one rank reduces nothing; the tensor-parallel formula is the same ring
    assert allreduce_seconds(1e9, (CollectiveLevel(1, 1.0, 1.0),)) == 0.0
    link = LinkSpec(bandwidth=2e9, latency=3e-6)
    assert allreduce_time(5e8, 8, link) == allreduce_seconds(5e8, (CollectiveLevel(8, 3e-6, 2e9),))


def test_hierarchical_allreduce_crosses_nodes_with_a_share_of_the_buffer() -> None:
    inside, across = CollectiveLevel(4, 0.0, 100e9), CollectiveLevel(2, 0.0, 10e9)
    nbytes = 8e9
    expected = 2 * (3 / 4 * nbytes / 100e9) + 2 * (1 / 2) * (nbytes / 4) / 10e9
    assert allreduce_seconds(nbytes, (inside, across)) == pytest.approx(expected)
    # cheaper than one flat ring of all 8 ranks over the slow link
    assert allreduce_seconds(nbytes, (inside, across)) < allreduce_seconds(nbytes, (CollectiveLevel(8, 0.0, 10e9),))
    assert reduce_scatter_seconds(nbytes, (inside, across)) == pytest.approx(
        3 / 4 * nbytes / 100e9 + 1 / 2 * nbytes / 4 / 10e9)


def test_group_levels_follow_nodes_and_shared_nics() -> None:
    cluster = load_cluster("4x8-h100")  # one NIC per GPU
    one_per_node = group_levels(cluster, (0, 8, 16, 24))
    assert [(x.ranks, x.bandwidth) for x in one_per_node] == [(4, cluster.inter_node.bandwidth)]
    two_per_node = group_levels(cluster, (0, 4, 8, 12))
    assert [(x.ranks, x.bandwidth) for x in two_per_node] == [(2, cluster.intra_node.bandwidth),
                                                               (2, cluster.inter_node.bandwidth)]
    assert group_levels(cluster, (0, 2, 4, 6))[0].ranks == 4 and len(group_levels(cluster, (0, 2, 4, 6))) == 1
    shared = load_cluster("mixed-h100-a100")  # one NIC per node: the group's ranks and tp ranks share it
    assert not shared.nic_per_device
    levels = group_levels(shared, (0, 4, 8, 12), concurrent=2)
    assert levels[-1].bandwidth == pytest.approx(shared.inter_node.bandwidth / (2 * 2))
    assert group_levels(cluster, (5,)) == ()


def test_replica_major_layout_puts_peers_at_stride_p_times_t() -> None:
    cluster = load_cluster("4x8-h100")
    groups = data_parallel_groups(Placement.one_per_device(4), cluster, 2, 4)
    assert groups == ((0, 8, 16, 24), (2, 10, 18, 26), (4, 12, 20, 28), (6, 14, 22, 30))
    with pytest.raises(Exception, match=r"4 data-parallel pipelines need 4 x 4 x tensor_parallel 4 = 64"):
        data_parallel_groups(Placement.one_per_device(4), cluster, 4, 4)


# --- the compiled graph -------------------------------------------------------------------
def _network(p: int, dp: int, *, shared: bool = False, sharded: bool = False) -> Network:
    base = Network(latency=np.full((p, p), 1e-3), bandwidth=np.full((p, p), 1e3),
                   node_of=tuple(d * 2 // p for d in range(p)), shared_nic=shared)
    groups = DataParallel.uniform(p, dp, latency=2e-3, bandwidth=500.0, sharded_optimizer=sharded)
    return dataclasses.replace(base, data_parallel=groups)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
def test_each_stage_reduces_after_its_last_weight_gradient_op(name: str) -> None:
    schedule = generate(name, 4, 8)
    costs = dataclasses.replace(random_costs(schedule.num_stages, seed=7),
                                grad_bytes=tuple(100.0 + 10 * s for s in range(schedule.num_stages)))
    network = _network(4, 3)
    graph = compile_graph(schedule, costs, network)
    reduces = np.flatnonzero(graph.tr_kind == ALLREDUCE)
    assert sorted(graph.tr_stage[reduces].tolist()) == list(range(schedule.num_stages))
    timeline = run(graph)
    ops = graph.ops
    ends_weight = np.isin(ops.kind, [k for k, rule in enumerate(schedule.rules) if rule.ends_weight_gradient])
    for t in reduces.tolist():
        stage, device = int(graph.tr_stage[t]), int(graph.tr_src[t])
        assert graph.tr_dst[t] == device  # one copy of the stage in this pipeline
        mine = np.flatnonzero((ops.stage == stage) & ends_weight)
        last = int(mine.max())  # its last weight-gradient op in table order
        assert graph.tr_rel[graph.tr_rel_ptr[t]:graph.tr_rel_ptr[t + 1]].tolist() == [last]
        assert timeline.transfers.start[t] >= timeline.op_end[last] - 1e-12
        assert graph.tr_duration[t] == pytest.approx(network.data_parallel.seconds(device, costs.grad_bytes[stage]))
        # held: the device's data-parallel channel (after compute, send, receive and NICs)
        held = graph.tr_res[graph.tr_res_ptr[t]:graph.tr_res_ptr[t + 1]].tolist()
        assert held == [3 * 4 + 2 * 2 + device]
        assert timeline.transfers.channel_names[timeline.transfers.channel[t]] == f"dp {device}"
    # the iteration ends after the last all-reduce, and the optimizer steps after each device's
    assert timeline.makespan >= timeline.transfers.end[reduces].max() - 1e-12
    steps = timeline.simulation.optimizer_step
    for t in reduces.tolist():
        assert steps[graph.tr_src[t]] >= timeline.transfers.end[t] - 1e-12


def test_the_reduction_overlaps_the_last_backward_ops_of_other_devices() -> None:
    # in 1F1B the last device finishes its backward first: its all-reduce runs while
    # device 0 still computes, and only device 0's is exposed at the end
    schedule = generate("1f1b", 4, 8)
    costs = dataclasses.replace(random_costs(4, seed=2), grad_bytes=(400.0,) * 4)
    timeline = run(compile_graph(schedule, costs, _network(4, 2)))
    reduces = np.flatnonzero(timeline.transfers.kind == ALLREDUCE)
    last_device = reduces[timeline.transfers.src_device[reduces] == 3][0]
    device0_end = timeline.op_end[timeline.op_device == 0].max()
    assert timeline.transfers.end[last_device] < device0_end
    alone = run(compile_graph(schedule, costs, dataclasses.replace(_network(4, 2), data_parallel=None)))
    first = reduces[timeline.transfers.src_device[reduces] == 0][0]
    assert timeline.makespan == pytest.approx(alone.makespan + timeline.transfers.end[first]
                                                    - timeline.transfers.start[first])


def test_a_shared_nic_serializes_the_reductions_of_a_node() -> None:
    schedule = generate("1f1b", 4, 4)
    costs = dataclasses.replace(random_costs(4, seed=5), grad_bytes=(2000.0,) * 4)
    free = run(compile_graph(schedule, costs, _network(4, 2, shared=False)))
    shared_graph = compile_graph(schedule, costs, _network(4, 2, shared=True))
    shared = run(shared_graph)
    reduces = np.flatnonzero(shared.transfers.kind == ALLREDUCE)
    egress0 = 3 * 4
    held = shared_graph.tr_res[shared_graph.tr_res_ptr[reduces[0]]:shared_graph.tr_res_ptr[reduces[0] + 1]]
    assert egress0 + shared_graph.network.node_of[int(shared_graph.tr_src[reduces[0]])] in held.tolist()
    # devices 0 and 1 share node 0's NIC: their reductions do not overlap
    on_node = [t for t in reduces if shared_graph.network.node_of[int(shared.transfers.src_device[t])] == 0]
    spans = sorted((shared.transfers.start[t], shared.transfers.end[t]) for t in on_node)
    assert spans[0][1] <= spans[1][0] + 1e-12
    assert shared.makespan >= free.makespan - 1e-12


def test_chimera_replicas_and_data_parallel_reduce_in_one_hierarchical_collective() -> None:
    schedule = generate("chimera", 4, 4)
    costs = dataclasses.replace(random_costs(4, seed=3), grad_bytes=(300.0,) * 4)
    network = _network(4, 2)
    graph = compile_graph(schedule, costs, network)
    reduces = np.flatnonzero(graph.tr_kind == ALLREDUCE)
    assert len(reduces) == 4  # one per stage, each between the stage's two devices
    for t in reduces.tolist():
        a, b = int(graph.tr_src[t]), int(graph.tr_dst[t])
        assert a != b
        pair = CollectiveLevel(2, 1e-3, 1e3)
        levels = (pair, *network.data_parallel.levels[a])
        assert graph.tr_duration[t] == pytest.approx(allreduce_seconds(300.0, levels))
        held = graph.tr_res[graph.tr_res_ptr[t]:graph.tr_res_ptr[t + 1]].tolist()
        assert held[:4] == [4 + a, 8 + b, 4 + b, 8 + a] and held[4:] == [16 + a, 16 + b]
    # without data parallelism, the same pair all-reduce as before: bytes / bandwidth + 2 latencies
    alone = compile_graph(schedule, costs, dataclasses.replace(network, data_parallel=None))
    durations = alone.tr_duration[alone.tr_kind == ALLREDUCE]
    assert durations == pytest.approx([300.0 / 1e3 + 2e-3] * 4)


def test_sharded_optimizer_reduce_scatters_gradients_and_all_gathers_parameters() -> None:
    groups = DataParallel.uniform(2, 4, latency=0.0, bandwidth=1e9, sharded_optimizer=True, gather_ratio=0.5)
    plain = dataclasses.replace(groups, sharded_optimizer=False)
    # ring over 4: reduce-scatter 3/4 of the fp32 gradients, all-gather 3/4 of the bf16 weights
    assert groups.seconds(0, 4e9) == pytest.approx(3 / 4 * 4 + 3 / 4 * 2)
    assert plain.seconds(0, 4e9) == pytest.approx(2 * 3 / 4 * 4)


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "chimera", "dualpipev", "interleaved-1f1b"])
def test_peak_memory_without_running_equals_the_trace(name: str) -> None:
    schedule = generate(name, 4, 8)
    costs = dataclasses.replace(random_costs(schedule.num_stages, seed=11),
                                static_bytes=tuple(float(s) for s in range(schedule.num_stages)))
    graph = compile_graph(schedule, costs, _network(4, 2))
    assert peak_memory(graph).tolist() == list(run(graph).memory.peak)


# --- points, metrics, commands ------------------------------------------------------------
def test_throughput_counts_every_pipeline_and_mfu_every_device() -> None:
    one = evaluate(Point("1f1b", p=4, m=16, tp=4, dp=1), ("sim",)).results[0]
    two = evaluate(Point("1f1b", p=4, m=16, tp=4, dp=2), ("sim",)).results[0]
    # the same pipeline, plus a gradient all-reduce across nodes at the end
    assert two.iteration_time > one.iteration_time
    tokens = 16 * 4096
    assert one.throughput_tokens_per_s == pytest.approx(tokens / one.iteration_time)
    assert two.throughput_tokens_per_s == pytest.approx(2 * tokens / two.iteration_time)
    # MFU: d x one pipeline's FLOPs over d x p x t devices, the same work per device
    assert two.mfu == pytest.approx(one.mfu * one.iteration_time / two.iteration_time)


def test_zero_one_shards_the_optimizer_state_over_the_replicas() -> None:
    plain = simulate_point(Point("1f1b", p=4, m=8, tp=4, dp=2))
    sharded = simulate_point(Point("1f1b", p=4, m=8, tp=4, dp=2, zero=1))
    costs = plain.setup.costs_for(plain.schedule)
    params = np.asarray(costs.static_bytes) / 18.0  # 2 + 4 + 12 bytes per parameter
    expected = np.asarray(costs.static_bytes) - params * 12.0 / 2
    assert sharded.setup.costs_for(sharded.schedule).static_bytes == pytest.approx(tuple(expected))
    assert all(s < p for s, p in zip(sharded.timeline.memory.peak, plain.timeline.memory.peak, strict=True))
    # gradients reduce-scattered (4 bytes) and weights gathered (2 bytes) instead of an
    # all-reduce of the gradients: 3/4 of the traffic on one ring of 2
    reduce = plain.timeline.transfers.kind == ALLREDUCE
    span = (plain.timeline.transfers.end - plain.timeline.transfers.start)[reduce]
    sharded_span = (sharded.timeline.transfers.end - sharded.timeline.transfers.start)[reduce]
    # NCCL's Simple protocol on the calibrated network level: one launch and one step per
    # half ring, two steps for the all-reduce
    calibration = plain.network.data_parallel.levels[0][0].calibration
    launch, step = calibration.base_latency[2], calibration.step_latency[2]
    assert calibration.ramp_bytes == 0
    assert (sharded_span - 2 * (launch + step)) == pytest.approx(0.75 * (span - launch - 2 * step), rel=1e-9)


def test_simulate_and_compare_take_dp_and_zero(cli) -> None:
    result = cli("simulate", "zb-v", "-p", "2", "-m", "8", "-t", "4", "--dp", "4", "--zero", "1", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert data["dp"] == 4 and data["zero"] == 1
    assert "data parallel 4 (ZeRO-1 optimizer)" in data["setup"]
    assert data["throughput_tokens_per_s"] == pytest.approx(4 * 8 * 4096 / data["iteration_time_s"])
    assert min(data["allreduce_s"]) > 0
    text = cli("simulate", "1f1b", "-p", "2", "-m", "4", "-t", "8", "--dp", "2", "--no-timeline")
    assert text.code == 0 and "2 pipelines; gradient all-reduce up to" in text.out
    compared = cli("compare", "--schedules", "1f1b,zb-v", "-p", "4", "-m", "8", "--dp", "2", "--json")
    assert compared.code == 0, compared
    assert "data parallel 2" in json.loads(compared.out)["setup"]


def test_dp_and_zero_bad_input(cli, tmp_path) -> None:
    assert_one_line_error(cli("simulate", "1f1b", "--dp", "8"), "cluster=4x8-h100", "8 x 8 x tensor_parallel 4 = 256")
    assert_one_line_error(cli("simulate", "1f1b", "--dp", "0"), "dp=0")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "--dp", "2", "--zero", "2"), "zero=2")
    costs = tmp_path / "costs.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n"
                     "0,1,1,1,1,1\n1,1,1,1,1,1\n")
    assert_one_line_error(cli("simulate", "1f1b", "-p", "2", "-m", "4", "--stage-costs", str(costs), "--dp", "2",
                              "--zero", "1"), "zero=1", "stage-cost file")
    ring = cli("simulate", "1f1b", "-p", "2", "-m", "4", "--stage-costs", str(costs), "--dp", "2", "--latency",
               "0.5", "--json")
    assert ring.code == 0, ring
    # given costs have no static bytes, so no gradients to reduce: only the ring's latency
    assert json.loads(ring.out)["allreduce_s"] == pytest.approx([2 * 0.5, 2 * 0.5])


@pytest.mark.parametrize("name", ["pipesched.model.collectives", "pipesched.model.stages"])
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(("family", "steady"), [("pipedream-2bw", False), ("pipedream", False), ("1f1b", True)])
def test_steady_state_throughput_counts_every_pipeline(cli, family: str, steady: bool) -> None:
    # asynchronous families and --steady-state runs: d pipelines, each m x b samples per
    # steady-state iteration, in simulate (JSON) and in the evaluations compare and search use
    sizes = ["-p", "2", "-m", "8", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "1"]
    for dp in (1, 2, 4):
        args = ["simulate", family, *sizes, "--dp", str(dp), "--json"] + (["--steady-state"] if steady else [])
        result = cli(*args)
        assert result.code == 0, result
        data = json.loads(result.out)
        samples = dp * 8 * 1 / data["iteration_time_s"]
        assert data["m"] == 8
        assert data["throughput_samples_per_s"] == pytest.approx(samples)
        assert data["throughput_tokens_per_s"] == pytest.approx(samples * 4096)
        point = Point(family, p=2, m=8, model="llama3-8b", cluster="1x8-h100", tp=1, dp=dp, steady_state=steady)
        row = evaluate(point, ("sim",)).results[0]
        assert row.iteration_time == pytest.approx(data["iteration_time_s"])
        assert row.throughput_tokens_per_s == pytest.approx(data["throughput_tokens_per_s"])
        assert row.mfu == pytest.approx(data["mfu"]) and row.hfu == pytest.approx(data["hfu"])
