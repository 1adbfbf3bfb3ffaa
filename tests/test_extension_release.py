"""Extension point (b): release times honoured by the engine, and a loop in which a policy
picks the next ops at run time (first come first served, continuous batching). Every time
below is worked out by hand in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.ops import F, Op
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import (
    Job,
    Launch,
    Network,
    batching,
    compile_graph,
    first_come_first_served,
    run,
    run_batch,
    run_policy,
)


def one_f_one_b() -> tuple:
    schedule = generate("1f1b", 2, 2)
    return schedule, compile_graph(schedule, StageCosts.uniform(2))  # F = I = W = 1, B = 2


def times_of(schedule, timeline) -> dict[str, tuple[float, float]]:
    return {str(op): (float(s), float(e)) for (_, op), s, e in
            zip(schedule.ops(), timeline.op_start, timeline.op_end, strict=True)}


def test_an_op_waits_for_its_release_time():
    schedule, graph = one_f_one_b()
    release = np.zeros(graph.num_ops)
    rows = [str(op) for _, op in schedule.ops()]
    release[rows.index("0F1")] = 5.0  # microbatch 1 arrives at t = 5
    got = times_of(schedule, run(graph.with_release(release)))
    # device 0: 0F0 [0,1]; 0F1 waits for its arrival [5,6]; 0B0 after 0F1 and 1B0 (4): [6,8];
    # 0B1 after 1B1 (9): [9,11]. device 1: 1F0 [1,2], 1B0 [2,4], 1F1 after 0F1: [6,7], 1B1 [7,9]
    assert got == {"0F0": (0, 1), "0F1": (5, 6), "0B0": (6, 8), "0B1": (9, 11),
                   "1F0": (1, 2), "1B0": (2, 4), "1F1": (6, 7), "1B1": (7, 9)}
    # without release times: the table's own times (0F1 at 1, last end 9)
    plain = times_of(schedule, run(graph))
    assert plain["0F1"] == (1, 2) and max(end for _, end in plain.values()) == 9


def test_release_times_with_links_and_in_a_batch():
    schedule = generate("1f1b", 2, 2)
    network = Network.uniform(2, latency=0.5, bandwidth=float("inf"))
    graph = compile_graph(schedule, StageCosts.uniform(2, output_bytes=1.0), network)
    release = np.zeros(graph.num_ops)
    release[[str(op) for _, op in schedule.ops()].index("0F1")] = 5.0
    released = graph.with_release(release)
    timeline = run(released)
    # 0F1 [5,6]; its activation arrives at 6.5: 1F1 [6.5,7.5]
    got = times_of(schedule, timeline)
    assert got["0F1"] == (5, 6) and got["1F1"] == (6.5, 7.5)
    batch = run_batch(released, np.stack([released.op_duration, released.op_duration]))
    assert batch.makespan.tolist() == [timeline.makespan] * 2
    with pytest.raises(PipeschedError, match="release"):
        graph.with_release(-release)


# requests on one device: arrivals at 0, 0.5, 1 and 4; a launch of b requests takes 1 + b
ARRIVALS = {"r0": 0.0, "r1": 0.5, "r2": 1.0, "r3": 4.0}
REQUESTS = [Job(key, release=t, alloc_bytes=10.0, free_bytes=10.0) for key, t in ARRIVALS.items()]


def batch_seconds(_device: int, jobs: tuple[Job, ...]) -> float:
    return 1.0 + len(jobs)


def test_first_come_first_served_by_hand():
    result = run_policy(first_come_first_served, REQUESTS, num_devices=1, duration=batch_seconds)
    # r0 [0,2]; at 2 r1 and r2 wait: r1 [2,4]; at 4 r2 (arrived first) before r3: [4,6]; r3 [6,8]
    assert result.times() == {"r0": (0, 2), "r1": (2, 4), "r2": (4, 6), "r3": (6, 8)}
    assert result.peak_memory == (10.0,)


def test_batching_up_to_two_by_hand():
    result = run_policy(batching(2), REQUESTS, num_devices=1, duration=batch_seconds)
    # at 0 only r0 has arrived: alone [0,2]; at 2 r1 and r2 together [2,5]; r3 (arrived at 4) [5,7]
    assert result.times() == {"r0": (0, 2), "r1": (2, 5), "r2": (2, 5), "r3": (5, 7)}
    assert [tuple(job.key for job in launch.jobs) for launch in result.launches] == [("r0",), ("r1", "r2"), ("r3",)]
    assert result.peak_memory == (20.0,) and result.makespan == 7.0


def test_first_come_first_served_on_two_devices():
    result = run_policy(first_come_first_served, REQUESTS, num_devices=2, duration=batch_seconds)
    # r0 on device 0 [0,2]; r1 arrives at 0.5 to idle device 1 [0.5,2.5]; r2 waits for device 0 [2,4];
    # r3 arrives at 4: both idle, the lower index takes it [4,6]
    assert result.times() == {"r0": (0, 2), "r1": (0.5, 2.5), "r2": (2, 4), "r3": (4, 6)}
    assert result.device.tolist() == [0, 1, 0, 0]


def test_decode_steps_join_the_running_batch():
    # two requests of two steps each, every step after the request's previous one; a step of
    # a batch takes 1 whatever its size (decode is bound by reading the weights)
    jobs = [Job("a0"), Job("a1", needs=("a0",)), Job("b0", release=1.0), Job("b1", needs=("b0",))]
    seen = []

    def watching(state):
        seen.append((state.time, tuple(job.key for job in state.ready)))
        return batching(2)(state)

    result = run_policy(watching, jobs, num_devices=1, duration=lambda _d, _jobs: 1.0)
    # a0 [0,1]; at 1 b0 has arrived and a1's need has ended: together [1,2]; b1 [2,3]
    assert result.times() == {"a0": (0, 1), "a1": (1, 2), "b0": (1, 2), "b1": (2, 3)}
    assert seen == [(0.0, ("a0",)), (1.0, ("a1", "b0")), (2.0, ("b1",))]
    fcfs = run_policy(first_come_first_served, jobs, num_devices=1, duration=lambda _d, _jobs: 1.0)
    assert fcfs.times() == {"a0": (0, 1), "a1": (1, 2), "b0": (2, 3), "b1": (3, 4)}


def test_a_policy_that_breaks_the_rules_is_refused():
    with pytest.raises(PipeschedError, match="launch job"):
        run_policy(lambda state: [Launch(0, ("r3",))], REQUESTS, num_devices=1, duration=batch_seconds)
    with pytest.raises(PipeschedError, match="left it waiting"):
        run_policy(lambda state: [], REQUESTS, num_devices=1, duration=batch_seconds)


def test_first_come_first_served_is_the_table_in_arrival_order_with_release_times():
    # the same requests as forwards of a frozen one-stage table, in arrival order, each
    # released at its arrival: the engine gives the policy loop's times
    ops = tuple(Op(0, F, mb) for mb in range(len(REQUESTS)))
    schedule = Schedule("serve", Placement.one_per_device(1), len(REQUESTS), (ops,), frozen=frozenset({0}))
    graph = compile_graph(schedule, StageCosts.uniform(1, forward=2.0))  # one request alone: 1 + 1
    timeline = run(graph.with_release(np.array(list(ARRIVALS.values()))))
    policy = run_policy(first_come_first_served, REQUESTS, num_devices=1, duration=batch_seconds)
    assert timeline.op_start.tolist() == policy.start.tolist()
    assert timeline.op_end.tolist() == policy.end.tolist()
