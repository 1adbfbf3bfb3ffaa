"""The blocking runtime (``simulate(..., overlap=False)``) against an independent reference
(tests/blocking_reference.py: each device posts, between two steps, one batch with the
sends of the step it finished and the receives of the step it runs next, and a transfer
starts when both ends have posted).

A blocking receive holds the receiver from the moment its own table reaches the batch, not
from the moment the sender posts; a sender waits for its receiver to post. Tables whose
sends and receives cross cannot run so: the engine says which devices wait for what.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocking_reference import blocking_run
from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.io.stage_costs import save_stage_costs
from pipesched.metrics import communication_per_device
from pipesched.ops import F, Op
from pipesched.simulate import Network, compile_graph, run, simulate
from simulate_helpers import random_costs, random_valid_schedule


def two_device_1f1b():
    schedule = generate("1f1b", 2, 4)
    costs = StageCosts.uniform(2, forward=1.0, backward_input=1.0, backward_weight=1.0, output_bytes=1.0)
    return schedule, costs, Network.uniform(2, latency=0.1, bandwidth=float("inf"))


def test_the_reference_pays_only_the_transfers_on_the_critical_path():
    schedule, costs, network = two_device_1f1b()
    overlapped = simulate(schedule, costs, network, contention=False).makespan
    blocking = blocking_run(schedule, costs, network)
    # 1F1B's transfers are off the critical path except one 0.1 s gradient: 15.4 -> 15.5
    assert overlapped == pytest.approx(15.4)
    assert blocking.makespan == pytest.approx(15.5)
    # device 1 computes its first forward as soon as the activation has arrived
    assert blocking.start[(1, Op(1, F, 0))] == pytest.approx(1.1)


def test_one_op_batches_deadlock_on_the_interleaved_table():
    # a runtime that receives only for its next op cannot run interleaved 1F1B blocking:
    # Megatron receives for the next forward and the next backward in one batch instead
    schedule = generate("interleaved-1f1b", 4, 8, v=2)
    costs = StageCosts.uniform(8, output_bytes=1.0)
    with pytest.raises(RuntimeError, match="deadlocks"):
        blocking_run(schedule, costs, Network.uniform(4, latency=0.1, bandwidth=float("inf")))


def test_a_blocking_receive_waits_for_the_receiver_to_reach_it():
    schedule, costs, network = two_device_1f1b()
    timeline = simulate(schedule, costs, network, contention=False, overlap=False)
    row = next(r for r in range(len(timeline)) if timeline.op(r) == Op(1, F, 0))
    assert timeline.op_start[row] == pytest.approx(1.1)
    assert timeline.makespan == pytest.approx(15.5)
    assert timeline.simulation.blocking_steps == "op"


@pytest.mark.parametrize("seed", range(4))
def test_engine_blocking_runtime_matches_the_reference_on_1f1b(seed):
    schedule = generate("1f1b", 4, 8)
    costs = random_costs(4, seed, split=False)
    network = Network.uniform(4, latency=0.05, bandwidth=1e3)
    engine = simulate(schedule, costs, network, contention=False, overlap=False)
    assert engine.makespan == pytest.approx(blocking_run(schedule, costs, network).makespan, rel=1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "hanayo"]),
       p=st.integers(2, 4), m=st.integers(1, 6), seed=st.integers(0, 10_000), shuffle=st.booleans(),
       steps=st.sampled_from(["op", "pair"]))
def test_engine_runs_or_deadlocks_exactly_as_the_reference(family, p, m, seed, shuffle, steps):
    schedule = generate(family, p, m)
    if shuffle:
        schedule = random_valid_schedule(schedule, seed)
    costs = random_costs(schedule.num_stages, seed, split=False)
    network = Network.uniform(p, latency=0.05, bandwidth=3.0)
    try:
        reference = blocking_run(schedule, costs, network, steps=steps)
    except RuntimeError:
        reference = None
    if reference is None:
        with pytest.raises(PipeschedError, match=r"blocking runtime .* deadlocks .*: d\d waits before"):
            compile_graph(schedule, costs, network, contention=False, overlap=False, blocking_steps=steps)
        return
    timeline = run(compile_graph(schedule, costs, network, contention=False, overlap=False, blocking_steps=steps))
    assert timeline.makespan == pytest.approx(reference.makespan, rel=1e-9)
    starts = [reference.start[(int(timeline.op_device[row]), timeline.op(row))] for row in range(len(timeline))]
    np.testing.assert_allclose(timeline.op_start, starts, rtol=1e-9, atol=1e-9)
    # exposed communication is what the batches hold each device beyond its waits for data
    exposed, _ = communication_per_device(timeline)
    np.testing.assert_allclose(exposed, reference.exposed, rtol=1e-9, atol=1e-9)


def test_exposed_communication_of_a_blocking_run_by_hand():
    # GPipe, 2 devices, 1 microbatch, F = 1, B = 2, each transfer 0.1 s
    schedule = generate("gpipe", 2, 1)
    costs = StageCosts.uniform(2, forward=1.0, backward_input=1.0, backward_weight=1.0, output_bytes=1.0)
    timeline = simulate(schedule, costs, Network.uniform(2, latency=0.1, bandwidth=float("inf")), overlap=False)
    exposed, _ = communication_per_device(timeline)
    # d0: its B waits 0.1 s for the gradient after d1's B ends (its send [1, 1.1] falls in
    # the wait for that gradient: bubble); d1: 0.1 s for the activation, 0.1 s to send the gradient
    assert timeline.makespan == pytest.approx(6.2)
    np.testing.assert_allclose(exposed, [0.1, 0.2])


def test_interleaved_runs_blocking_with_paired_batches():
    schedule = generate("interleaved-1f1b", 4, 8, v=2)
    costs = StageCosts.uniform(8, output_bytes=1.0)
    network = Network.uniform(4, latency=0.1, bandwidth=float("inf"))
    with pytest.raises(PipeschedError, match="with op steps: d0 waits before"):
        compile_graph(schedule, costs, network, overlap=False, blocking_steps="op")
    graph = compile_graph(schedule, costs, network, contention=False, overlap=False)
    assert graph.blocking_steps == "pair"
    reference = blocking_run(schedule, costs, network, steps="pair")
    assert run(graph).makespan == pytest.approx(reference.makespan, rel=1e-12)


def test_a_table_no_blocking_runtime_can_run_names_what_each_device_waits_for(cli, tmp_path):
    path = tmp_path / "costs.csv"
    save_stage_costs(StageCosts.uniform(4, forward=0.01, backward_input=0.01, backward_weight=0.01,
                                        output_bytes=1e6), path)
    result = cli("simulate", "zb-v", "-p", "2", "-m", "4", "--stage-costs", str(path), "--latency", "1e-4",
                 "--no-overlap")
    assert_one_line_error(result, "schedule=zb-v", "blocking runtime", "d0 waits before", "d1 waits before",
                          "simulate it with overlap")
