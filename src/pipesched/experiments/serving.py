"""Serving experiments are data too: a frozen ``ServingPoint`` (a serving configuration of a
model on a cluster, the requests it serves and the latency targets it must meet),
``serving_key(point)`` its name in a results store, and ``evaluate_capacity(point) ->
CapacityRecord``: the highest request rate at which the configuration meets the targets
(``pipesched.serving.capacity``'s bisection over rates with common random numbers), what
``serve capacity`` prints for one point and ``serve search`` ranks over many.

A point travels to worker processes (``process_map``) or Ray tasks as it is: every field is
a plain value or a frozen record; the trace file, when there is one, is read where the point
is evaluated, and its digest is part of the key (a changed file is a new point).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from functools import partial

from pipesched.defaults import DEFAULTS
from pipesched.enums import SearchStatus
from pipesched.errors import OutOfMemory, PipeschedError, require
from pipesched.experiments.keys import record_key
from pipesched.io.files import read_text
from pipesched.io.latency_model import load_latency_model
from pipesched.limits import MAX_QPS, MAX_SECONDS
from pipesched.model import load_cluster, load_model
from pipesched.serving.capacity import CapacityResult, capacity
from pipesched.serving.config import ServeConfig
from pipesched.serving.deployment import Deployment, build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.events import EventsRun, read_events, simulate_with_events
from pipesched.serving.records import ServeRun
from pipesched.serving.trace import (
    Trace,
    TraceSpec,
    at_unit_rate,
    check_context,
    rate_scaled,
    read_trace,
    unit_trace,
)


@dataclass(frozen=True)
class ServingWorkload:
    """The requests: a trace file (``trace``), or a synthetic trace of ``requests`` requests
    with these arrivals and lengths (the text forms ``--arrival``, ``--prompt-tokens`` and
    ``--output-tokens`` take). ``qps`` is the rate a single run serves (``serve simulate``);
    a capacity search scales the same requests' arrivals to each rate it probes."""

    trace: str | None = None  # CSV arrived_at,num_prefill_tokens,num_decode_tokens
    trace_digest: str = ""  # of the trace file's text (``trace_digest``)
    requests: int = DEFAULTS.requests
    qps: float | None = DEFAULTS.qps  # requests per second (None: a trace file's own arrivals)
    arrival: str = DEFAULTS.arrival  # poisson or gamma:CV
    prompt_tokens: str = DEFAULTS.prompt_tokens
    output_tokens: str = DEFAULTS.output_tokens
    seed: int = DEFAULTS.seed

    def __post_init__(self) -> None:
        require(self.qps is None or 0.0 < self.qps <= MAX_QPS, "qps", self.qps, f"give requests per second in (0, {MAX_QPS:g}]")


def trace_digest(path: str) -> str:
    """The digest of a trace file's text (a bounded read), which names it in a point's key."""
    return hashlib.sha256(read_text(path, "trace").encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Targets:
    """The latency targets (SLOs, seconds) and the share of requests that must meet both."""

    slo_ttft: float = DEFAULTS.slo_ttft  # time to the first token
    slo_tpot: float = DEFAULTS.slo_tpot  # time per output token after the first
    attainment: float = DEFAULTS.attainment

    def __post_init__(self) -> None:
        for name in ("slo_ttft", "slo_tpot"):
            value = getattr(self, name)
            require(0.0 < value <= MAX_SECONDS, name, value, f"give seconds in (0, {MAX_SECONDS:g}]")
        require(0.0 < self.attainment <= 1.0, "attainment", self.attainment, "give a share of requests in (0, 1]")


@dataclass(frozen=True)
class ServingPoint:
    """One serving experiment: ``config`` of ``model`` on ``cluster`` (preset names or files,
    as ``--model`` and ``--cluster`` take them), costed by the kernel model in ``dtype`` or
    by a fitted latency model (``latency_model``, a CSV file), serving ``workload`` against
    ``targets``."""

    model: str = DEFAULTS.serve_model
    cluster: str = DEFAULTS.serve_cluster
    config: ServeConfig = field(default_factory=ServeConfig)
    workload: ServingWorkload = field(default_factory=ServingWorkload)
    targets: Targets = field(default_factory=Targets)
    latency_model: str | None = None
    dtype: str = "bf16"

    def replace(self, **changes: object) -> ServingPoint:
        return dataclasses.replace(self, **changes)

    @property
    def devices(self) -> int:
        """Cluster devices the configuration takes."""
        return self.config.devices


def serving_key(point: ServingPoint) -> str:
    """The name of ``point`` in a results store: a digest of all its fields."""
    return record_key(point)


@dataclass(frozen=True)
class CapacityRecord:
    """What became of one point's capacity search: ``evaluated`` (``max_qps`` found),
    ``out of memory`` (its KV cache cannot hold one request) or ``invalid`` (it cannot be
    built, or no rate meets the targets), with why."""

    key: str
    status: SearchStatus
    devices: int
    max_qps: float | None = None  # requests per second that meet the targets
    slo_attainment: float | None = None  # at max_qps
    ttft_p99_s: float | None = None  # at max_qps
    tpot_p99_s: float | None = None  # at max_qps
    probes: int = 0  # simulated runs the bisection made
    reason: str = ""

    @property
    def qps_per_gpu(self) -> float | None:
        """Capacity per device: what a search ranks by."""
        return None if self.max_qps is None else self.max_qps / self.devices


# --- the requests of a point ------------------------------------------------------------------
def trace_spec(workload: ServingWorkload, *, max_context: int = 0) -> TraceSpec:
    """The synthetic trace a workload without a file asks for (requests cut to ``max_context``
    tokens, 0: none)."""
    return TraceSpec(requests=workload.requests, qps=workload.qps or DEFAULTS.qps, arrival=workload.arrival,
                     prompt=workload.prompt_tokens, output=workload.output_tokens, seed=workload.seed,
                     max_context=max_context)


def check_workload(workload: ServingWorkload) -> None:
    """The synthetic forms read and their counts are within bounds, before anything runs."""
    if workload.trace is None:
        trace_spec(workload)


def unit_rate_requests(workload: ServingWorkload, max_context: int) -> Trace:
    """The workload's requests at one request per second (what capacity scales to each rate):
    the trace file's, checked against the model's context, or the synthetic ones, cut to it."""
    if workload.trace is None:
        return unit_trace(trace_spec(workload, max_context=max_context))
    trace = read_trace(workload.trace)
    check_context(trace, max_context)
    return at_unit_rate(trace)


def served_requests(workload: ServingWorkload, max_context: int) -> Trace:
    """The requests one run serves: at ``workload.qps`` (a trace file's own arrivals when it
    is None)."""
    if workload.trace is not None and workload.qps is None:
        trace = read_trace(workload.trace)
        check_context(trace, max_context)
        return trace
    return rate_scaled(unit_rate_requests(workload, max_context), workload.qps or DEFAULTS.qps)


# --- evaluation -------------------------------------------------------------------------------
def point_deployment(point: ServingPoint) -> Deployment:
    """The point's configuration built on its model and cluster: every stage's iteration costs
    (the kernel model's, or the fitted latency model's) and every instance's KV cache."""
    latency = load_latency_model(point.latency_model) if point.latency_model is not None else None
    return build_deployment(point.config, load_model(point.model), load_cluster(point.cluster), latency=latency,
                            dtype=point.dtype)


def simulate_point(point: ServingPoint) -> ServeRun:
    """One simulated run of the point's requests at its rate (``serve simulate``)."""
    deployment = point_deployment(point)
    return simulate_serving(deployment, served_requests(point.workload, deployment.max_context))


def simulate_point_with_events(point: ServingPoint, events: str) -> EventsRun:
    """One run of the point's requests while the cluster events of the file ``events``
    change its devices (``serve simulate --events``: ``serving.events``)."""
    latency = load_latency_model(point.latency_model) if point.latency_model is not None else None
    model, cluster = load_model(point.model), load_cluster(point.cluster)
    changes = read_events(events)
    deployment = point_deployment(point)
    return simulate_with_events(point.config, model, cluster, served_requests(point.workload, deployment.max_context),
                                changes, latency=latency, dtype=point.dtype)


def point_capacity(point: ServingPoint) -> CapacityResult:
    """The point's capacity (``serve capacity``): the highest rate at which its targets'
    attainment of the requests meet both SLOs, the same requests at every rate probed."""
    deployment = point_deployment(point)
    workload = point.workload
    requests: TraceSpec | Trace = (trace_spec(workload, max_context=deployment.max_context) if workload.trace is None
                                   else served_requests(workload, deployment.max_context))
    targets = point.targets
    return capacity(partial(simulate_serving, deployment), requests, slo_ttft=targets.slo_ttft,
                    slo_tpot=targets.slo_tpot, attainment=targets.attainment)


def evaluate_capacity(point: ServingPoint) -> CapacityRecord:
    """``point_capacity`` as a search stores it: never raises for a point that cannot be
    built or served (its record says why)."""
    key, devices = serving_key(point), point.devices
    try:
        found = point_capacity(point)
    except OutOfMemory as exc:
        return CapacityRecord(key, SearchStatus.OUT_OF_MEMORY, devices, reason=str(exc))
    except PipeschedError as exc:
        # a KV cache that cannot hold one request is the deployment's memory, not a bad point
        status = SearchStatus.OUT_OF_MEMORY if str(exc).startswith(KV_CACHE_FIELD) else SearchStatus.INVALID
        return CapacityRecord(key, status, devices, reason=str(exc))
    if not found.converged:
        return CapacityRecord(key, SearchStatus.INVALID, devices, max_qps=None, probes=len(found.probes),
                              reason=unbounded_reason(found))
    at = min(found.probes, key=lambda probe: abs(probe.qps - found.max_qps))
    return CapacityRecord(key, SearchStatus.EVALUATED, devices, max_qps=found.max_qps,
                          slo_attainment=at.attainment, ttft_p99_s=at.ttft_s.p99, tpot_p99_s=at.tpot_s.p99,
                          probes=len(found.probes))


def at_capacity(point: ServingPoint, found: CapacityResult) -> ServingPoint:
    """``point`` with its requests at the capacity found (what a report of it draws)."""
    return point.replace(workload=dataclasses.replace(point.workload, qps=found.max_qps))


def rate_rows(found: CapacityResult) -> list[dict[str, float]]:
    """Every rate a capacity search probed, by rate: its p50 and p99 TTFT and TBT and its
    attainment (the latency-against-rate plot's points)."""
    return [{"qps": probe.qps, "ttft_p50_s": probe.ttft_s.p50, "ttft_p99_s": probe.ttft_s.p99,
             "tbt_p50_s": probe.tbt_s.p50, "tbt_p99_s": probe.tbt_s.p99, "attainment": probe.attainment}
            for probe in sorted(found.probes, key=lambda probe: probe.qps)]


def unbounded_reason(found: CapacityResult) -> str:
    """Why a capacity search found no rate that misses the SLOs: too few requests to load
    the deployment (all of them fit in its first batches at any rate)."""
    return (f"requests={found.requests}: no rate up to {found.max_qps:.3g} requests/s missed the SLOs in "
            f"{len(found.probes)} runs; give more requests (--requests, or a longer --trace) to load the deployment")


# the field a deployment's error names when a KV cache cannot hold one request
KV_CACHE_FIELD = "kv_cache="
