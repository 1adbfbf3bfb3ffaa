"""Compile once, run many times: the compiled task graph run with new durations equals
compiling costs with those durations, and a batch run equals one run per sample."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.simulate import Network, compile_graph, run, run_batch
from simulate_helpers import random_costs

FAMILIES = ["1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "chimera", "dualpipe", "hanayo"]
# tables whose sends and receives cross: a blocking runtime deadlocks on them (test_simulate_blocking)
BLOCKING_DEADLOCKS = {"zb-v", "hanayo", "chimera"}  # chimera: its forward-doubled order


def network(p: int) -> Network:
    # two nodes sharing a NIC each, so contention and all-reduces both happen
    latency = np.full((p, p), 2e-2)
    bandwidth = np.full((p, p), 50.0)
    return Network(latency=latency, bandwidth=bandwidth, node_of=tuple(d * 2 // p for d in range(p)), shared_nic=True)


def scaled(costs: StageCosts, factor: float) -> StageCosts:
    """Every op time times ``factor``; sizes unchanged."""
    return dataclasses.replace(costs, forward=tuple(x * factor for x in costs.forward),
                               backward_input=tuple(x * factor for x in costs.backward_input),
                               backward_weight=tuple(x * factor for x in costs.backward_weight))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("overlap", [True, False])
def test_running_with_scaled_durations_equals_compiling_scaled_costs(name: str, overlap: bool):
    schedule = generate(name, 4, 8)
    costs = random_costs(schedule.num_stages, seed=len(name))
    if not overlap and name in BLOCKING_DEADLOCKS:
        with pytest.raises(PipeschedError, match=r"blocking runtime .* deadlocks"):
            compile_graph(schedule, costs, network(4), overlap=overlap)
        return
    graph = compile_graph(schedule, costs, network(4), overlap=overlap)
    for factor in (2.0, 0.37):
        rerun = run(graph, op_durations=graph.op_duration * factor)
        fresh = run(compile_graph(schedule, scaled(costs, factor), network(4), overlap=overlap))
        np.testing.assert_allclose(rerun.op_start, fresh.op_start, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rerun.op_end, fresh.op_end, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rerun.transfers.end, fresh.transfers.end, rtol=1e-12, atol=1e-12)
        assert rerun.makespan == pytest.approx(fresh.makespan, rel=1e-12)
    # the graph itself is untouched by the reruns
    np.testing.assert_array_equal(run(graph).op_end, run(compile_graph(schedule, costs, network(4),
                                                                       overlap=overlap)).op_end)


def test_transfer_durations_can_be_replaced_too():
    schedule = generate("1f1b", 4, 8)
    costs = random_costs(4, seed=3)
    slow = Network.uniform(4, latency=0.3, bandwidth=np.inf)
    graph = compile_graph(schedule, costs, Network.uniform(4, latency=0.1, bandwidth=np.inf), contention=False)
    rerun = run(graph, transfer_durations=graph.tr_duration * 3.0)
    fresh = run(compile_graph(schedule, costs, slow, contention=False))
    assert rerun.makespan == pytest.approx(fresh.makespan, rel=1e-12)


@pytest.mark.parametrize("name", ["zb-v", "chimera", "interleaved-1f1b"])
def test_a_batch_equals_one_run_per_sample(name: str):
    schedule = generate(name, 4, 8)
    graph = compile_graph(schedule, random_costs(schedule.num_stages, seed=7), network(4))
    rng = np.random.default_rng(0)
    ops = graph.op_duration * rng.lognormal(0.0, 0.3, (12, graph.num_ops))
    transfers = graph.tr_duration * rng.lognormal(0.0, 0.3, (12, graph.num_transfers))
    batch = run_batch(graph, ops, transfers, critical=True)
    counts = np.zeros(graph.num_ops + graph.num_transfers, np.int64)
    for i in range(12):
        timeline = run(graph, op_durations=ops[i], transfer_durations=transfers[i])
        assert batch.makespan[i] == timeline.makespan
        path = timeline.simulation.critical_path
        counts[np.where(path.is_transfer, graph.num_ops + path.row, path.row)] += 1
    np.testing.assert_array_equal(np.concatenate([batch.critical_ops, batch.critical_transfers]), counts)


def test_bad_duration_vectors_are_refused():
    graph = compile_graph(generate("1f1b", 2, 2), random_costs(2, seed=1), network(2))
    with pytest.raises(PipeschedError, match="op_durations=shape"):
        run(graph, op_durations=np.ones(3))
    with pytest.raises(PipeschedError, match="op_durations=a negative or non-finite value"):
        run(graph, op_durations=-graph.op_duration)
    with pytest.raises(PipeschedError, match="op_durations=shape"):
        run_batch(graph, np.ones(graph.num_ops))
