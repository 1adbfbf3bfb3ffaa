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

from pipesched.defaults import DEFAULTS
from pipesched.enums import SearchStatus
from pipesched.errors import require
from pipesched.experiments.point import record_key
from pipesched.io.files import read_text
from pipesched.limits import MAX_QPS, MAX_SECONDS
from pipesched.serving.config import ServeConfig


@dataclass(frozen=True)
class ServingWorkload:
    """The requests: a trace file (``trace``), or a synthetic trace of ``requests`` requests
    with these arrivals and lengths (the text forms ``--arrival``, ``--prompt-tokens`` and
    ``--output-tokens`` take). ``qps`` is the rate a single run serves (``serve simulate``);
    a capacity search scales the same requests' arrivals to each rate it probes."""

    trace: str | None = None  # CSV arrived_at,num_prefill_tokens,num_decode_tokens
    trace_digest: str = ""  # of the trace file's text (``trace_digest``)
    requests: int = DEFAULTS.requests
    qps: float = DEFAULTS.qps  # requests per second
    arrival: str = DEFAULTS.arrival  # poisson or gamma:CV
    prompt_tokens: str = DEFAULTS.prompt_tokens
    output_tokens: str = DEFAULTS.output_tokens
    seed: int = DEFAULTS.seed

    def __post_init__(self) -> None:
        require(0.0 < self.qps <= MAX_QPS, "qps", self.qps, f"give requests per second in (0, {MAX_QPS:g}]")


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
