"""Serving metrics against hand computations, closed forms and Little's law."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from pipesched import metrics as metrics_module
from pipesched.errors import PipeschedError
from pipesched.serving import results as results_module
from pipesched.serving.config import Instances, SchedulerSpec, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.results import serve_result, summarize, token_gaps
from pipesched.serving.trace import TraceSpec, mean_rate, rate_scaled, synthetic_trace, unit_trace
from serving_engine_helpers import deployment
from serving_results_helpers import fifo_run, hand_run

# three requests (arrival, first scheduled, token times), worked by hand:
#   0: TTFT 1.0, TPOT (2.5 - 1.0) / 2 = 0.75, e2e 2.5, queue 0.5, gaps 0.5, 1.0
#   1: TTFT 2.0, TPOT 0 (one output token), e2e 2.0, queue 0.0, no gaps
#   2: TTFT 1.0, TPOT 0.1, e2e 1.3, queue 0.5, gaps 0.1, 0.1, 0.1
ARRIVED = [0.0, 1.0, 2.0]
SCHEDULED = [0.5, 1.0, 2.5]
TOKENS = [[1.0, 1.5, 2.5], [3.0], [3.0, 3.1, 3.2, 3.3]]


def test_per_request_latencies_match_the_hand_computation() -> None:
    result = serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS), slo_ttft=1.5, slo_tpot=0.5)
    np.testing.assert_allclose(result.ttft_s, [1.0, 2.0, 1.0])
    np.testing.assert_allclose(result.tpot_s, [0.75, 0.0, 0.1])
    np.testing.assert_allclose(result.e2e_s, [2.5, 2.0, 1.3])
    np.testing.assert_allclose(result.queue_s, [0.5, 0.0, 0.5])
    np.testing.assert_allclose(result.tbt_s, [0.5, 1.0, 0.1, 0.1, 0.1])
    assert result.output_tokens.tolist() == [3, 1, 4]


def test_rates_and_slo_attainment_match_the_hand_computation() -> None:
    result = serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS), slo_ttft=1.5, slo_tpot=0.5)
    assert result.duration_s == pytest.approx(3.3)  # first arrival 0 to last token 3.3
    assert result.throughput_tokens_per_s == pytest.approx(8 / 3.3)
    assert result.requests_per_s == pytest.approx(3 / 3.3)
    # 0 misses the TPOT SLO (0.75 > 0.5), 1 the TTFT SLO (2.0 > 1.5); only 2 meets both
    assert result.meets_slo.tolist() == [False, False, True]
    assert result.slo_attainment == pytest.approx(1 / 3)
    assert result.goodput_requests_per_s == pytest.approx(1 / 3.3)
    relaxed = serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS), slo_ttft=math.inf, slo_tpot=0.75)
    assert relaxed.slo_attainment == 1.0


def test_percentiles_are_linear_between_order_statistics() -> None:
    result = serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS))
    ttft = result.to_dict()["ttft_s"]
    # sorted [1, 1, 2]: the q-th percentile sits at rank 2q between the 2nd and 3rd values
    assert ttft == pytest.approx({"mean": 4 / 3, "p50": 1.0, "p90": 1.8, "p99": 1.98})
    # gaps sorted [0.1, 0.1, 0.1, 0.5, 1.0]: p99 at rank 3.96 = 0.5 + 0.96 x 0.5
    assert result.to_dict()["tbt_s"]["p99"] == pytest.approx(0.98)
    assert summarize(np.zeros(0)).p99 == 0.0


def test_token_gaps_never_cross_requests() -> None:
    times = np.array([5.0, 1.0, 2.0, 4.0])  # request 0 ends at 5, request 1 starts at 1
    assert token_gaps(times, np.array([0, 1, 4])).tolist() == [1.0, 2.0]
    assert token_gaps(np.array([1.0, 2.0]), np.array([0, 1, 2])).tolist() == []


def _pipelined(batches: int, stages: int, t: float, gap_at: float | None = None) -> list[tuple]:
    """Rows of ``batches`` equal batches streaming through ``stages`` stages back to back:
    batch b runs on stage s over [(b + s) t, (b + s + 1) t]."""
    rows = [(b, 0, s, (b + s) * t, (b + s + 1) * t, 0.0) for b in range(batches) for s in range(stages)]
    if gap_at is not None:  # one more batch long after, nothing in flight in between
        rows += [(batches, 0, s, gap_at + s * t, gap_at + (s + 1) * t, 0.0) for s in range(stages)]
    return rows


@pytest.mark.parametrize(("batches", "stages"), [(1, 2), (5, 3), (8, 4)])
def test_the_bubble_of_a_full_pipeline_is_the_closed_form(batches: int, stages: int) -> None:
    t = 0.25
    end = (batches + stages - 1) * t
    run = hand_run([0.0], [0.0], [[end]], rows=_pipelined(batches, stages, t), members=[[0]] * batches,
                   stages=(stages,))
    result = serve_result(run)
    bubble = (stages - 1) / (batches + stages - 1)  # the classic fill-and-drain bubble
    assert result.bubble == pytest.approx(bubble)
    np.testing.assert_allclose(result.stage_bubble, [[bubble] * stages])
    np.testing.assert_allclose(result.stage_busy, [[batches * t / end] * stages])


def test_idle_time_with_nothing_in_flight_is_no_bubble() -> None:
    t = 1.0
    run = hand_run([0.0], [0.0], [[103.0]], rows=_pipelined(1, 1, t, gap_at=100.0), members=[[0], [0]])
    result = serve_result(run)
    assert result.bubble == 0.0
    np.testing.assert_allclose(result.stage_busy, [[2 / 103]])


def test_two_instances_are_reported_apart() -> None:
    rows = [(0, 0, 0, 0.0, 1.0, 0.0), (0, 0, 1, 1.0, 2.0, 0.0), (1, 1, 0, 0.0, 4.0, 0.0)]
    run = hand_run([0.0], [0.0], [[4.0]], rows=rows, members=[[0], [0]], stages=(2, 1),
                   kv_blocks=((0, 3, 5, 2), (0, 4, 1)), kv_capacity=(10, 16))
    result = serve_result(run)
    np.testing.assert_allclose(result.stage_busy[0], [0.25, 0.25])
    np.testing.assert_allclose(result.stage_busy[1], [1.0])
    np.testing.assert_allclose(result.stage_bubble[0], [0.5, 0.5])
    np.testing.assert_allclose(result.stage_bubble[1], [0.0])
    assert result.bubble == pytest.approx(2.0 / 8.0)  # 2 s idle of 4 + 4 (instance 0), none of 4 (instance 1)
    assert result.kv_peak_fraction == pytest.approx(0.5)  # 5 of 10 blocks beats 4 of 16


def test_mfu_is_model_flops_over_every_devices_peak() -> None:
    rows = [(0, 0, 0, 0.0, 1.0, 3e12), (0, 0, 1, 1.0, 2.0, 5e12)]
    run = hand_run([0.0], [0.0], [[2.0]], rows=rows, members=[[0]], stages=(2,), tp=4, peak_flops=1e12)
    # 8e12 FLOPs over 2 s x 1e12 FLOP/s x 8 devices (2 stages of 4)
    assert serve_result(run).mfu == pytest.approx(8e12 / (2.0 * 1e12 * 8))


def test_json_has_the_keys_the_issue_lists() -> None:
    result = serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS, preemptions=[0, 2, 1]))
    out = result.to_dict()
    for key in ("requests", "ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "requests_per_s",
                "slo_attainment", "goodput_requests_per_s", "preemptions", "kv_peak_fraction", "stage_busy"):
        assert key in out
    for key in ("ttft_s", "tpot_s", "e2e_s", "tbt_s", "queue_s"):
        assert set(out[key]) == {"mean", "p50", "p90", "p99"}
    assert out["requests"] == 3 and out["preemptions"] == 3 and "per_request" not in out
    rows = result.to_dict(per_request=True)["per_request"]
    assert [row["output_tokens"] for row in rows] == [3, 1, 4]
    assert rows[2]["arrived_at"] == 2.0 and rows[2]["ttft_s"] == pytest.approx(1.0)
    assert rows[0]["e2e_s"] == pytest.approx(2.5)
    assert all(isinstance(value, int | float | bool | list | dict) for value in out.values())


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), 1e9, True])
def test_bad_slos_are_one_error(bad: float) -> None:
    with pytest.raises(PipeschedError, match=r"slo_tpot=.*give seconds above 0"):
        serve_result(hand_run(ARRIVED, SCHEDULED, TOKENS), slo_tpot=bad)


def mean_in_system(arrived: np.ndarray, finished: np.ndarray) -> float:
    """Time-average number of requests arrived and not finished, from the first arrival to the
    last finish: the area under the count, event by event."""
    times = np.concatenate([arrived, finished])
    steps = np.concatenate([np.ones(arrived.size), -np.ones(finished.size)])
    order = np.argsort(times, kind="stable")
    count = np.cumsum(steps[order])
    area = float(np.sum(count[:-1] * np.diff(times[order])))
    return area / float(finished.max() - arrived.min())


def test_littles_law_on_a_long_queue() -> None:
    trace = synthetic_trace(TraceSpec(requests=3000, qps=1.0, prompt="uniform:10-90", output="uniform:1-9", seed=3))
    result = serve_result(fifo_run(trace, prefill_token_s=0.005, decode_s=0.05))  # 0.45 s of work per request
    little = 1.0 * float(result.e2e_s.mean())  # L = lambda x W, lambda the offered 1 request/s
    assert mean_in_system(trace.arrived_at, trace.arrived_at + result.e2e_s) == pytest.approx(little, rel=0.05)


def _engine(pp: int = 2):
    return deployment(ServeConfig(instances=Instances(tp=1, pp=pp, count=1)))


def test_littles_law_on_a_long_engine_run() -> None:
    trace = synthetic_trace(TraceSpec(requests=1000, qps=30.0, prompt="uniform:64-512", output="uniform:8-64", seed=12))
    result = serve_result(simulate_serving(_engine(), trace))
    assert result.stage_busy[0][0] > 0.5  # a loaded pipeline, requests overlapping
    little = mean_rate(trace) * float(result.e2e_s.mean())  # L = lambda x W
    finished = trace.arrived_at + result.e2e_s
    assert mean_in_system(trace.arrived_at, finished) == pytest.approx(little, rel=0.05)
    assert little > 2  # many requests in the system at once


def test_ttft_p99_rises_with_the_rate() -> None:
    unit = unit_trace(TraceSpec(requests=300, prompt="uniform:64-512", output="uniform:8-64", seed=13))
    p99 = [serve_result(simulate_serving(_engine(), rate_scaled(unit, qps))).to_dict()["ttft_s"]["p99"]
           for qps in (15.0, 30.0, 60.0, 90.0)]
    assert p99 == sorted(p99) and p99[-1] > 2 * p99[0]


@pytest.mark.parametrize("module", [results_module, metrics_module])
def test_the_docstring_examples_run(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted >= 2 and result.failed == 0


def test_a_tight_cache_preempts_and_every_request_still_gets_all_its_tokens() -> None:
    config = ServeConfig(instances=Instances(tp=1, pp=2, count=1), scheduler=SchedulerSpec(name="vllm"))
    trace = synthetic_trace(TraceSpec(requests=120, qps=20.0, prompt="uniform:64-512", output="uniform:8-64", seed=14))
    run = simulate_serving(deployment(config, capacity_blocks=60), trace)
    result = serve_result(run)
    assert result.to_dict()["preemptions"] == int(run.preemptions.sum()) > 0
    assert np.array_equal(result.output_tokens, trace.decode_tokens)
    assert 0.9 < result.kv_peak_fraction <= 1.0  # full, never over
