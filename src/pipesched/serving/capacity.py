"""The highest request rate a deployment serves within its SLOs (``serve capacity``).

``capacity`` runs a simulation at a rate, asks what share of requests met both SLOs, and
bisects over rates: from a starting rate it doubles (or halves) until one rate meets the
asked attainment and another misses it, then halves that bracket until its ends are within
``tolerance`` of each other (relative to the lower end). Halving stops, and the SLOs are
called unmeetable, when a halving changes nothing (the requests no longer wait for each
other) or at the starting rate / 2^10. Every run serves the same requests
(common random numbers: one trace drawn at one request per second, its arrivals divided by
the rate), so two rates differ only in how close together the requests arrive, and the
attainment falls with the rate as it does in a queue. The answer is the highest rate that
met the SLOs; every run is kept (its rate, attainment and latency percentiles) for the
latency against request rate plot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_QPS, MAX_SECONDS, check_amount, check_count
from pipesched.serving.records import ServeRun
from pipesched.serving.results import ServeResult, Summary, check_slo, serve_result, summarize
from pipesched.serving.trace import (
    Trace,
    TraceSpec,
    at_unit_rate,
    mean_rate,
    rate_scaled,
    unit_trace,
)

MAX_PROBES = 64  # simulations one capacity search may run
HALVINGS = 10  # the lowest rate tried: the starting rate / 2^10, before the SLOs are called unmeetable


@dataclass(frozen=True)
class Probe:
    """One simulation of the capacity search: the rate, the share of requests within both
    SLOs, and the latency percentiles (seconds)."""

    qps: float
    attainment: float
    meets: bool  # attainment at least the asked share
    goodput_requests_per_s: float
    ttft_s: Summary
    tpot_s: Summary
    tbt_s: Summary
    e2e_s: Summary

    def to_dict(self) -> dict[str, object]:
        return {"qps": self.qps, "attainment": self.attainment, "meets": self.meets,
                "goodput_requests_per_s": self.goodput_requests_per_s, "ttft_s": self.ttft_s.to_dict(),
                "tpot_s": self.tpot_s.to_dict(), "tbt_s": self.tbt_s.to_dict(), "e2e_s": self.e2e_s.to_dict()}


@dataclass(frozen=True)
class CapacityResult:
    """What ``capacity`` found: ``max_qps``, the highest rate probed that met the SLOs, with
    the next rate probed above it missing them within ``tolerance`` (when ``converged``)."""

    max_qps: float  # requests per second
    attainment: float  # the share of requests asked to meet both SLOs
    slo_ttft_s: float
    slo_tpot_s: float
    tolerance: float  # relative width of the final bracket
    converged: bool  # the bracket narrowed to the tolerance within the probes allowed
    requests: int  # requests of every run
    probes: tuple[Probe, ...]  # in the order run

    def to_dict(self) -> dict[str, object]:
        """The JSON object of ``serve capacity``; probes by rate."""
        return {"max_qps": self.max_qps, "attainment": self.attainment,
                "slo_ttft_s": self.slo_ttft_s if np.isfinite(self.slo_ttft_s) else None,
                "slo_tpot_s": self.slo_tpot_s if np.isfinite(self.slo_tpot_s) else None,
                "tolerance": self.tolerance, "converged": self.converged, "requests": self.requests,
                "probes": [probe.to_dict() for probe in sorted(self.probes, key=lambda probe: probe.qps)]}


@dataclass(frozen=True)
class _Search:
    """The fixed inputs of one capacity search."""

    simulate: Callable[[Trace], ServeRun]
    unit: Trace  # the requests at one per second
    slo_ttft: float
    slo_tpot: float
    attainment: float
    max_probes: int


def capacity(simulate: Callable[[Trace], ServeRun], workload: TraceSpec | Trace, *,
             slo_ttft: float = DEFAULTS.slo_ttft, slo_tpot: float = DEFAULTS.slo_tpot,
             attainment: float = DEFAULTS.attainment, start_qps: float | None = None, tolerance: float = 0.02,
             max_probes: int = 32) -> CapacityResult:
    """The highest rate at which ``attainment`` of the requests meet both SLOs (module
    docstring). ``simulate`` runs a trace (the engine on a deployment); ``workload`` is a
    synthetic spec (its rate the starting one) or a trace (at any rate: its requests are
    kept, their spacing scaled; its own rate the starting one). SLOs that even the lowest
    rate tried misses raise a PipeschedError naming the SLO to relax."""
    search = _Search(simulate, unit_trace(workload) if isinstance(workload, TraceSpec) else at_unit_rate(workload),
                     check_slo("slo_ttft", slo_ttft), check_slo("slo_tpot", slo_tpot),
                     check_amount("attainment", attainment, limit=1.0, above_minimum=True, unit="(a share)"),
                     check_count("max_probes", max_probes, MAX_PROBES, minimum=2, what="simulations"))
    require(0 < tolerance < 1, "tolerance", tolerance, "give a share of the rate in (0, 1), e.g. 0.02")
    first = start_qps if start_qps is not None else (workload.qps if isinstance(workload, TraceSpec)
                                                     else mean_rate(workload))
    first = check_amount("start_qps", first, limit=MAX_QPS, above_minimum=True, unit="requests/s")
    probes: list[Probe] = []
    low, high = _bracket(search, first, probes)
    while high is not None and high > low * (1 + tolerance) and len(probes) < max_probes:
        middle = 0.5 * (low + high)
        if _probe(search, middle, probes)[0]:
            low = middle
        else:
            high = middle
    converged = high is not None and high <= low * (1 + tolerance)
    return CapacityResult(low, search.attainment, search.slo_ttft, search.slo_tpot, tolerance, converged,
                          len(search.unit), tuple(probes))


def _bracket(search: _Search, first: float, probes: list[Probe]) -> tuple[float, float | None]:
    """A rate that meets the SLOs and one above it that misses them (None: none missed up to
    MAX_QPS or within the probes), doubling up from ``first`` or halving down."""
    meets, result = _probe(search, first, probes)
    if meets:
        low = first
        while 2 * low <= MAX_QPS and len(probes) < search.max_probes:
            if not _probe(search, 2 * low, probes)[0]:
                return low, 2 * low
            low *= 2
        return low, None
    # the unit trace spans about len - 1 seconds; no rate so low that it outlasts MAX_SECONDS
    floor = max(first / 2**HALVINGS, 2 * max(float(search.unit.arrived_at[-1]), 1.0) / MAX_SECONDS)
    high = first
    while high / 2 >= floor and len(probes) < search.max_probes:
        meets, slower = _probe(search, high / 2, probes)
        if meets:
            return high / 2, high
        if _no_gain(result, slower, search.attainment):
            break
        high, result = high / 2, slower
    raise _unmet(search, slower, probes[-1].qps)


def _no_gain(faster: ServeResult, slower: ServeResult, share: float) -> bool:
    """Whether halving the rate changed nothing: no more requests within the SLOs, and the
    TTFT and TPOT that ``share`` of the requests meet within 1%; the requests no longer
    wait for each other, and a lower rate cannot meet the SLOs either."""
    def close(a: np.ndarray, b: np.ndarray) -> bool:
        high, low = float(np.quantile(a, share)), float(np.quantile(b, share))
        return abs(high - low) <= 0.01 * max(abs(high), abs(low))

    return (slower.slo_attainment <= faster.slo_attainment and close(faster.ttft_s, slower.ttft_s)
            and close(faster.tpot_s, slower.tpot_s))


def _probe(search: _Search, qps: float, probes: list[Probe]) -> tuple[bool, ServeResult]:
    """Simulate the requests at ``qps`` and keep the run's probe; whether it met the SLOs."""
    result = serve_result(search.simulate(rate_scaled(search.unit, qps)), slo_ttft=search.slo_ttft,
                          slo_tpot=search.slo_tpot)
    probe = Probe(qps, result.slo_attainment, result.slo_attainment >= search.attainment,
                  result.goodput_requests_per_s, summarize(result.ttft_s), summarize(result.tpot_s),
                  summarize(result.tbt_s), summarize(result.e2e_s))
    probes.append(probe)
    return probe.meets, result


def _unmet(search: _Search, result: ServeResult, qps: float) -> PipeschedError:
    """The SLOs missed at the lowest rate tried (``result``, at ``qps``): the one fewer
    requests meet, and the value that ``attainment`` of them would meet there."""
    shares = {"slo_ttft": (float((result.ttft_s <= search.slo_ttft).mean()), search.slo_ttft, result.ttft_s),
              "slo_tpot": (float((result.tpot_s <= search.slo_tpot).mean()), search.slo_tpot, result.tpot_s)}
    field = min(shares, key=lambda name: shares[name][0])
    share, slo, latencies = shares[field]
    needed = float(np.quantile(latencies, search.attainment, method="higher"))
    return PipeschedError(
        f"{field}={slo:g}: met by {share:.0%} of requests even at {qps:.3g} requests/s, under the "
        f"{search.attainment:.0%} asked (both SLOs together: {result.slo_attainment:.0%}); relax it to at least "
        f"{needed:.3g} s, lower attainment, or give a faster deployment")
