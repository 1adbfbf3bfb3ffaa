"""The blocking runtime (``simulate(..., overlap=False)``) against an independent reference
(tests/blocking_reference.py: each device posts, between two ops, one batch with the sends
of the op it finished and the receives of the op it runs next, and a transfer starts when
both ends have posted).

The engine today puts a blocking transfer on the receiver's compute stream at the moment
the sender releases it (its place in the global service order), not where the receiver's
own table reaches the consuming op: the op the receiver is running then is queued behind
the transfer and starts only when the transfer ends. The tests marked ``xfail(strict=True)``
show it and turn into failures (XPASS) once the engine follows the reference: then drop
the marks.
"""

from __future__ import annotations

import pytest

from blocking_reference import blocking_run
from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.ops import F, Op
from pipesched.simulate import Network, simulate
from simulate_helpers import random_costs

ENGINE_BUG = ("the engine queues a blocking receive on the receiver's compute stream when the sender "
              "releases it, ahead of the op the receiver is still running")


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


@pytest.mark.xfail(strict=True, reason=ENGINE_BUG)
def test_a_blocking_receive_waits_for_the_receiver_to_reach_it():
    schedule, costs, network = two_device_1f1b()
    timeline = simulate(schedule, costs, network, contention=False, overlap=False)
    row = next(r for r in range(len(timeline)) if timeline.op(r) == Op(1, F, 0))
    # the engine starts 1F0 at 2.2: the receive of microbatch 1 (sent at 2.1) went ahead of it
    assert timeline.op_start[row] == pytest.approx(1.1)
    assert timeline.makespan == pytest.approx(15.5)


@pytest.mark.xfail(strict=True, reason=ENGINE_BUG)
@pytest.mark.parametrize("seed", range(4))
def test_engine_blocking_runtime_matches_the_reference_on_1f1b(seed):
    schedule = generate("1f1b", 4, 8)
    costs = random_costs(4, seed, split=False)
    network = Network.uniform(4, latency=0.05, bandwidth=1e3)
    engine = simulate(schedule, costs, network, contention=False, overlap=False)
    assert engine.makespan == pytest.approx(blocking_run(schedule, costs, network).makespan, rel=1e-9)
