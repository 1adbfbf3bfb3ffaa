"""What a serving run achieved: per-request latencies, their percentiles, throughput, SLO
attainment, goodput, KV-cache use, stage busy time, the pipeline bubble and MFU
(``ServeResult``, from a ``ServeRun``).

Per request, in seconds:

- TTFT, time to first token: ``first_token_at - arrived_at`` (its queueing and its prefill)
- TPOT, time per output token: ``(finished_at - first_token_at) / (output tokens - 1)``, the
  mean gap after the first token; 0 for a request of one output token (it has no gap)
- TBT, time between tokens: every gap between consecutive tokens of a request (its p99 is
  over all gaps of all requests: the stalls a reader sees)
- end to end: ``finished_at - arrived_at``; queueing: ``scheduled_at - arrived_at``

What preemption cost (``preemption_cost_s``): per request and in total, the seconds from
each preemption to its cache whole on the device again, split into save (swap-out over the
device -> host link), reload (swap-in), recompute (the prefill of the dropped cache again)
and queueing (the rest: waiting preempted).

A request meets the SLOs when its TTFT is at most ``slo_ttft`` and its TPOT at most
``slo_tpot``; attainment is the share that do, goodput those per second. Rates are over the
run's duration (first arrival to last token). Percentiles are numpy's default (``linear``:
the (n - 1) x q-th order statistic, interpolated between its neighbours).

A stage's busy share is its iterations' time over the run's duration. The pipeline bubble is
a stage's idle time while its pipeline has a batch in flight (between a batch's start on its
first stage and its end on its last): with one batch at a time through p equal stages, each
stage idles (p - 1) / p of it; the bubble is 0 when batches fill every stage.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.limits import MAX_SECONDS
from pipesched.metrics import union_length, utilization
from pipesched.serving.records import PREEMPTION_PARTS, PREEMPTION_TOTAL, IterationLog, ServeRun


@dataclass(frozen=True)
class Summary:
    """Mean and percentiles of one latency, seconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


def summarize(values: np.ndarray) -> Summary:
    """Mean, p50, p90 and p99 of ``values`` (numpy's ``linear`` percentiles); zeros when empty.

    >>> summarize(np.arange(101.0))
    Summary(mean=50.0, p50=50.0, p90=90.0, p99=99.0)
    """
    if values.size == 0:
        return Summary(0.0, 0.0, 0.0, 0.0)
    p50, p90, p99 = np.percentile(values, (50, 90, 99))
    return Summary(float(values.mean()), float(p50), float(p90), float(p99))


@dataclass(frozen=True, eq=False)
class ServeResult:
    """The metrics of one serving run under SLOs (module docstring); per-request arrays in
    trace order."""

    slo_ttft_s: float
    slo_tpot_s: float
    duration_s: float  # first arrival to last token
    arrived_at: np.ndarray  # float64 seconds
    ttft_s: np.ndarray  # float64 seconds
    tpot_s: np.ndarray  # float64 seconds (0 for one output token)
    e2e_s: np.ndarray  # float64 seconds
    queue_s: np.ndarray  # float64 seconds, arrival to the first prefill chunk's start
    output_tokens: np.ndarray  # int64
    preemptions: np.ndarray  # int32 per request
    meets_slo: np.ndarray  # bool: TTFT and TPOT within their SLOs
    tbt_s: np.ndarray  # float64: every gap between consecutive tokens of a request
    kv_peak_fraction: float  # peak KV blocks in use over capacity, the fullest instance
    stage_busy: tuple[tuple[float, ...], ...]  # per instance, per stage: busy share of the duration
    stage_bubble: tuple[tuple[float, ...], ...]  # per instance, per stage: idle share while a batch is in flight
    bubble: float  # all stages' idle time while in flight over their time in flight
    mfu: float  # model FLOPs over duration x peak FLOP/s of every device of the deployment
    # float64 [requests, 5]: what preemption cost each request, seconds (``ServeRun.preemption_s``:
    # save, reload, recompute, queueing, and their total); zeros when unrecorded
    preemption_s: np.ndarray | None = None

    @property
    def requests(self) -> int:
        return int(self.ttft_s.shape[0])

    @property
    def throughput_tokens_per_s(self) -> float:
        """Output tokens per second."""
        return _per_second(float(self.output_tokens.sum()), self.duration_s)

    @property
    def requests_per_s(self) -> float:
        return _per_second(float(self.requests), self.duration_s)

    @property
    def slo_attainment(self) -> float:
        """Share of requests that meet both SLOs."""
        return float(self.meets_slo.mean())

    def preemption_cost(self) -> dict[str, float]:
        """Seconds the requests' preemptions cost, all requests together: each part and the total."""
        costs = self.preemption_s if self.preemption_s is not None else np.zeros((self.requests, 5))
        return dict(zip((*PREEMPTION_PARTS, PREEMPTION_TOTAL), costs.sum(axis=0).tolist(), strict=True))

    @property
    def goodput_requests_per_s(self) -> float:
        """Requests that meet both SLOs, per second."""
        return _per_second(float(self.meets_slo.sum()), self.duration_s)

    def to_dict(self, *, per_request: bool = False) -> dict[str, object]:
        """The JSON object of ``serve simulate`` (one shape, every key always present)."""
        out: dict[str, object] = {
            "requests": self.requests,
            "ttft_s": summarize(self.ttft_s).to_dict(),
            "tpot_s": summarize(self.tpot_s).to_dict(),
            "e2e_s": summarize(self.e2e_s).to_dict(),
            "tbt_s": summarize(self.tbt_s).to_dict(),
            "queue_s": summarize(self.queue_s).to_dict(),
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "slo_ttft_s": _finite_or_none(self.slo_ttft_s),
            "slo_tpot_s": _finite_or_none(self.slo_tpot_s),
            "slo_attainment": self.slo_attainment,
            "goodput_requests_per_s": self.goodput_requests_per_s,
            "preemptions": int(self.preemptions.sum()),
            "preemption_cost_s": self.preemption_cost(),
            "kv_peak_fraction": self.kv_peak_fraction,
            "stage_busy": [list(shares) for shares in self.stage_busy],
            "stage_bubble": [list(shares) for shares in self.stage_bubble],
            "bubble": self.bubble,
            "mfu": self.mfu,
            "duration_s": self.duration_s,
        }
        if per_request:
            out["per_request"] = self.per_request()
        return out

    def per_request(self) -> list[dict[str, object]]:
        """One object per request, in trace order."""
        costs = self.preemption_s if self.preemption_s is not None else np.zeros((self.requests, 5))
        names = (*PREEMPTION_PARTS, PREEMPTION_TOTAL)
        columns = zip(self.arrived_at.tolist(), self.ttft_s.tolist(), self.tpot_s.tolist(), self.e2e_s.tolist(),
                      self.queue_s.tolist(), self.output_tokens.tolist(), self.preemptions.tolist(),
                      self.meets_slo.tolist(), costs.tolist(), strict=True)
        return [{"arrived_at": arrived, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "queue_s": queue,
                 "output_tokens": tokens, "preemptions": preempted, "meets_slo": meets,
                 "preemption_cost_s": dict(zip(names, cost, strict=True))}
                for arrived, ttft, tpot, e2e, queue, tokens, preempted, meets, cost in columns]


def _per_second(amount: float, duration: float) -> float:
    return amount / duration if duration > 0 else 0.0


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def check_slo(field: str, value: float) -> float:
    """An SLO in seconds: above 0, at most MAX_SECONDS, or inf for none."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    require(isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS, field,
            value, f"give seconds above 0, at most {MAX_SECONDS:g}")
    return float(value)


def serve_result(run: ServeRun, *, slo_ttft: float = DEFAULTS.slo_ttft,
                 slo_tpot: float = DEFAULTS.slo_tpot) -> ServeResult:
    """The metrics of ``run`` under the SLOs ``slo_ttft`` and ``slo_tpot`` (seconds; inf: none)."""
    slo_ttft, slo_tpot = check_slo("slo_ttft", slo_ttft), check_slo("slo_tpot", slo_tpot)
    arrived = run.trace.arrived_at
    ttft, tpot = request_latencies(arrived, run.first_token_at, run.finished_at, run.token_offsets)
    output_tokens = np.diff(run.token_offsets)
    duration = run.duration
    busy, bubble, total_bubble = _stage_shares(run, duration)
    flops = float(run.iterations.flops.sum())
    devices = sum(len(stages) * tp for stages, tp in zip(run.instance_devices, run.tp, strict=True))
    return ServeResult(
        slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, duration_s=duration, arrived_at=arrived, ttft_s=ttft, tpot_s=tpot,
        e2e_s=run.finished_at - arrived, queue_s=run.scheduled_at - arrived, output_tokens=output_tokens,
        preemptions=run.preemptions, meets_slo=meets_slos(ttft, tpot, slo_ttft, slo_tpot),
        tbt_s=token_gaps(run.token_times, run.token_offsets), kv_peak_fraction=_kv_peak(run), stage_busy=busy,
        stage_bubble=bubble, bubble=total_bubble,
        mfu=utilization(duration, flops_per_iteration=flops, peak_flops=run.peak_flops, devices=devices),
        preemption_s=run.preemption_s)


def meets_slos(ttft: np.ndarray, tpot: np.ndarray, slo_ttft: float, slo_tpot: float) -> np.ndarray:
    """The requests whose TTFT and TPOT are both within their SLOs (seconds)."""
    return (ttft <= slo_ttft) & (tpot <= slo_tpot)


def request_latencies(arrived: np.ndarray, first_token_at: np.ndarray, finished_at: np.ndarray,
                      token_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TTFT (arrival to its first token) and TPOT (its later tokens' mean gap;
    0 with one output token), seconds; a request meets its SLOs when both are within them.

    >>> ttft, tpot = request_latencies(np.array([0.0, 1.0]), np.array([0.5, 1.2]), np.array([2.5, 1.2]),
    ...                                np.array([0, 5, 6]))
    >>> ttft.tolist(), tpot.tolist()
    ([0.5, 0.19999999999999996], [0.5, 0.0])
    """
    gaps = np.maximum(np.diff(token_offsets) - 1, 0)
    tpot = np.divide(finished_at - first_token_at, gaps, out=np.zeros(arrived.shape[0]), where=gaps > 0)
    return first_token_at - arrived, tpot


def token_gaps(token_times: np.ndarray, token_offsets: np.ndarray) -> np.ndarray:
    """Every gap between consecutive tokens of the same request (seconds), request after request.

    >>> token_gaps(np.array([1.0, 1.5, 2.5, 7.0, 9.0, 9.25]), np.array([0, 3, 4, 6])).tolist()
    [0.5, 1.0, 0.25]
    """
    gaps = np.diff(token_times)
    within = np.ones(gaps.shape[0], bool)
    starts = token_offsets[1:-1]  # each later request's first token: the gap into it crosses requests
    starts = starts[(starts > 0) & (starts < token_times.shape[0])]
    within[starts - 1] = False
    return gaps[within]


def _kv_peak(run: ServeRun) -> float:
    """Peak blocks in use over the cache's blocks, the fullest instance."""
    shares = [float(blocks.max()) / capacity for blocks, capacity in zip(run.kv.blocks, run.kv.capacity_blocks,
                                                                        strict=True)
              if blocks.size and capacity > 0]
    return max(shares, default=0.0)


def _stage_shares(run: ServeRun, duration: float) -> tuple[tuple[tuple[float, ...], ...],
                                                           tuple[tuple[float, ...], ...], float]:
    """Per instance and stage: busy share of the duration and idle share while in flight;
    and the bubble of all stages together."""
    log = run.iterations
    stage_counts = [len(stages) for stages in run.instance_devices]
    first_slot = np.concatenate([[0], np.cumsum(stage_counts)]).astype(np.int64)
    slots = int(first_slot[-1])
    slot = first_slot[log.instance] + log.stage
    busy = np.bincount(slot, weights=log.end - log.start, minlength=slots)
    in_flight = np.repeat(_in_flight_per_instance(log, len(stage_counts)), stage_counts)
    idle = np.maximum(in_flight - busy, 0.0)
    busy_share = busy / duration if duration > 0 else np.zeros(slots)
    idle_share = np.divide(idle, in_flight, out=np.zeros(slots), where=in_flight > 0)
    total = float(idle.sum() / in_flight.sum()) if in_flight.sum() > 0 else 0.0
    return _per_instance(busy_share, first_slot), _per_instance(idle_share, first_slot), total


def _per_instance(values: np.ndarray, first_slot: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(values[a:b].tolist()) for a, b in itertools.pairwise(first_slot.tolist()))


def _in_flight_per_instance(log: IterationLog, instances: int) -> np.ndarray:
    """Seconds each instance had a batch in flight: the union of its batches' spans, each
    from its first stage's start to its last stage's end."""
    out = np.zeros(instances)
    if len(log) == 0:
        return out
    batches = int(log.batch.max()) + 1
    start = np.full(batches, np.inf)
    end = np.full(batches, -np.inf)
    np.minimum.at(start, log.batch, log.start)
    np.maximum.at(end, log.batch, log.end)
    owner = np.zeros(batches, np.int64)
    owner[log.batch] = log.instance
    ran = np.isfinite(start)
    for instance in range(instances):
        mine = ran & (owner == instance)
        out[instance] = union_length(start[mine], end[mine])
    return out

