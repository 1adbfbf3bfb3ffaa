"""Capacity: the highest rate within the SLOs, by bisection over rates on the same requests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipesched.errors import PipeschedError
from pipesched.serving.capacity import capacity
from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.results import serve_result
from pipesched.serving.trace import TraceSpec, mean_rate, rate_scaled, synthetic_trace, unit_trace
from serving_engine_helpers import deployment
from serving_results_helpers import fifo_run

PREFILL_TOKEN_S, DECODE_S = 0.001, 0.05


def _queue(trace):
    """A single-server FIFO queue: 0.001 s per prompt token, 0.05 s per later token."""
    return fifo_run(trace, prefill_token_s=PREFILL_TOKEN_S, decode_s=DECODE_S)


def test_capacity_of_evenly_spaced_requests_is_the_closed_form() -> None:
    # n requests every 1/q seconds, each 0.1 s of prefill then 4 x 0.05 s of decode: S = 0.3 s
    # of work. Above q = 1/S request k waits k (S - 1/q), so its TTFT is P + k (S - 1/q) with
    # P = 0.1 s; a share a of them meets the TTFT SLO while request ceil(a n) - 1 does:
    # S - 1/q <= (slo - P) / (ceil(a n) - 1).
    n, slo, share = 100, 1.0, 0.9
    spec = TraceSpec(requests=n, qps=1.0, arrival="gamma:0", prompt="fixed:100", output="fixed:5")
    work, prefill = 0.1 + 4 * DECODE_S, 100 * PREFILL_TOKEN_S
    closed = 1 / (work - (slo - prefill) / (math.ceil(share * n) - 1))
    found = capacity(_queue, spec, slo_ttft=slo, slo_tpot=1.0, attainment=share, tolerance=0.01)
    assert found.converged
    assert closed / 1.01 <= found.max_qps <= closed
    assert found.requests == n and len(found.probes) <= 32


def test_capacity_meets_the_slos_below_it_and_misses_them_above() -> None:
    spec = TraceSpec(requests=400, qps=1.0, prompt="uniform:50-300", output="uniform:1-8", seed=4)
    found = capacity(_queue, spec, slo_ttft=1.5, slo_tpot=0.1, attainment=0.9)
    unit = unit_trace(spec)

    def attained(qps: float) -> float:
        return serve_result(_queue(rate_scaled(unit, qps)), slo_ttft=1.5, slo_tpot=0.1).slo_attainment

    assert attained(0.95 * found.max_qps) >= 0.9
    assert attained(1.10 * found.max_qps) < 0.9
    probes = found.to_dict()["probes"]
    assert [p["qps"] for p in probes] == sorted(p["qps"] for p in probes)
    assert all(p["meets"] == (p["attainment"] >= 0.9) for p in probes)
    # the latency against rate curve rises with the rate (the same requests, closer together)
    p99 = [p["ttft_s"]["p99"] for p in probes]
    assert p99 == sorted(p99)
    assert set(found.to_dict()) >= {"max_qps", "probes", "attainment", "slo_ttft_s", "slo_tpot_s"}


def test_capacity_of_a_file_trace_keeps_its_requests() -> None:
    trace = synthetic_trace(TraceSpec(requests=300, qps=3.0, prompt="uniform:50-300", output="uniform:1-8", seed=5))
    seen = []

    def recording(scaled):
        seen.append(scaled)
        return _queue(scaled)

    found = capacity(recording, trace, slo_ttft=1.5, slo_tpot=0.1)
    assert found.probes[0].qps == pytest.approx(mean_rate(trace))  # starts at the trace's own rate
    np.testing.assert_allclose(seen[0].arrived_at, trace.arrived_at)  # the trace itself, first
    for scaled, probe in zip(seen, found.probes, strict=True):
        assert (scaled.prefill_tokens == trace.prefill_tokens).all()
        np.testing.assert_allclose(scaled.arrived_at * probe.qps, trace.arrived_at * mean_rate(trace))
    assert found.max_qps > 0


@pytest.mark.parametrize(("slos", "words"), [
    ({"slo_ttft": 0.05, "slo_tpot": 1.0}, r"slo_ttft=0.05: met by 0% of requests even at .* relax it to at least 0.1 s"),
    ({"slo_ttft": 5.0, "slo_tpot": 0.01}, r"slo_tpot=0.01: met by 0% .* relax it to at least 0.05 s"),
])
def test_slos_no_rate_meets_name_the_slo_and_what_to_relax(slos: dict, words: str) -> None:
    spec = TraceSpec(requests=50, qps=1.0, prompt="fixed:100", output="fixed:3")
    with pytest.raises(PipeschedError, match=words):
        capacity(_queue, spec, **slos)


def test_bad_capacity_options_are_one_error() -> None:
    spec = TraceSpec(requests=10, prompt="fixed:10", output="fixed:2")
    with pytest.raises(PipeschedError, match=r"attainment=1\.5: over the limit"):
        capacity(_queue, spec, attainment=1.5)
    with pytest.raises(PipeschedError, match="tolerance=0: give a share"):
        capacity(_queue, spec, tolerance=0)


def test_capacity_of_an_engine_run_meets_the_slos_below_it_and_misses_them_above() -> None:
    dep = deployment(ServeConfig(instances=Instances(tp=1, pp=2, count=1)))
    spec = TraceSpec(requests=200, qps=10.0, prompt="uniform:64-512", output="uniform:8-64", seed=11)

    def simulate(trace):
        return simulate_serving(dep, trace)

    found = capacity(simulate, spec, slo_ttft=0.2, slo_tpot=0.025)
    assert found.converged and found.max_qps > spec.qps
    unit = unit_trace(spec)

    def attained(qps: float) -> float:
        return serve_result(simulate(rate_scaled(unit, qps)), slo_ttft=0.2, slo_tpot=0.025).slo_attainment

    assert attained(0.95 * found.max_qps) >= 0.9
    assert attained(1.10 * found.max_qps) < 0.9


def test_halving_stops_once_the_requests_no_longer_wait_for_each_other() -> None:
    # 0.2 s of work a request, at most one a second: no request waits at 1 or 0.5 requests/s,
    # so halving to 0.5 changes nothing and the search stops there
    calls = []

    def counting(trace):
        calls.append(trace)
        return _queue(trace)

    spec = TraceSpec(requests=50, qps=1.0, arrival="gamma:0", prompt="fixed:100", output="fixed:3")
    with pytest.raises(PipeschedError, match=r"slo_ttft=0.05: .* even at 0.5 requests/s"):
        capacity(counting, spec, slo_ttft=0.05, slo_tpot=1.0)
    assert len(calls) == 2
