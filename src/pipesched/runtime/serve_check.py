"""The serving prediction check: a trace served for real against the simulator's run of it on
a latency model fitted on this machine.

One launch (``serve_run`` with ``profile_repeats``): every rank times its stage at fixed
batch compositions (``serve_batches.profile_batches``), half the rounds before the run and
half after it, and ranks s and s + 1 time hidden-state messages before it, all outside the
run; between them the trace is served and measured. The
profile is fitted: each stage's ``LatencyRow`` (``fit_latency_rows`` on the means of each
composition's repeats, see ``fit_stage_rows``) and each link's latency and bandwidth (``nonnegative_least_squares``
of the one-way times on the message bytes). The prediction is ``simulate_serving`` on the
``Deployment`` of those rows (``build_deployment``): one replica of p stages, the same
scheduler and caps, the same KV-cache size as the real run's scheduler (so neither
preempts), each stage's ``send_s`` the fitted link at its hidden-state bytes, and the
run's median per-iteration CPU overhead as ``cpu_overhead_s``.

The host's delays. On a shared machine a message waits for its receiver to get a core: the
hidden states of a batch reach the next stage later than the link alone says, and a
batch's tokens reach rank 0 later than the last stage made them (the engine makes a batch's
requests ready at its end on the last stage), and a rank that lost its core between batches
starts the next late. They are measured from the run like the CPU
overhead (``host_delays``, means: the metrics add them up): the hop, a stage's start after its input's end on the stage
before when it was idle by then, less the link's time for the message;
the return, stage 0's idle time between a batch's end on the last stage and the next batch
with one of its requests; the pickup, a stage's wait after its previous batch's end to start
one whose hidden states were already in hand (the rank lost its core between batches),
summed and spread over all the stage's batches. The prediction adds the hop to each stage's
``send_s``, the return to ``cpu_overhead_s`` and the pickup to the base of the stage after
the link.

The machine's speed. On a shared machine the cores run the ranks slower or faster while
serving than while profiling, however the profile is spread around the run. Each stage's
load factors (``load_factors``) fit the run's compute seconds on that stage to what its
fitted row gives the same batches, its prefill work and the rest apart (a prefill chunk's
GEMMs and the decodes' small steps do not slow alike); the prediction runs every row's
coefficients times its stage's factors (``scaled_rows``): the profile says how a batch's
time grows with what it holds, the run how fast the machine was at each kind of work.
``profile_only`` is the prediction with nothing measured from the run: no host delays, no
load factors.

Compared per request: time to first token, time per output token after the first (the
mean time between its tokens; requests of one token have none) and end-to-end latency;
each error is (predicted - measured) / measured (``pairing.prediction_error``). The
verdict: each metric's median absolute error over the requests within ``tolerance``.

What the engine does not see: the tokens' way back from the last rank to rank 0 (a batch's
requests may go on only when rank 0 has them; one small message, about the link latency).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import require
from pipesched.model.hardware import LinkSpec
from pipesched.model.inference import (
    LatencyRow,
    StageIterationCosts,
    fit_latency_rows,
    nonnegative_least_squares,
)
from pipesched.model.spec import ModelSpec
from pipesched.pairing import prediction_error
from pipesched.runtime.launch import StatusCallback
from pipesched.runtime.measure import ELEMENT_BYTES
from pipesched.runtime.serve_batches import cache_blocks, profile_batches
from pipesched.runtime.serve_run import (
    RankServeResult,
    ServeRunOptions,
    ServeRunReport,
    serve_cluster,
    serve_run,
    serving_dtype,
)
from pipesched.serving.config import Instances, KVSettings, ServeConfig
from pipesched.serving.deployment import Deployment, build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.records import ServeRun
from pipesched.serving.results import serve_result
from pipesched.serving.trace import Trace

TOLERANCE = 0.10  # the check passes when every metric's median absolute error is within this
CHECK_REPEATS = 20  # timed repeats of each profile composition (and of each link message)


@dataclass(frozen=True)
class LinkFit:
    """The link from stage ``stage`` to the next: a message of n bytes takes latency + n / bandwidth."""

    stage: int
    latency_s: float
    bandwidth: float  # bytes/s
    tokens: tuple[int, ...]  # hidden states timed, tokens
    one_way_s: tuple[float, ...]  # their median one-way seconds


@dataclass(frozen=True)
class MetricError:
    """One metric over the requests: measured and predicted per request, and their errors."""

    name: str
    measured: np.ndarray  # seconds, per compared request
    predicted: np.ndarray
    requests: np.ndarray  # int64 trace rows compared

    @property
    def errors(self) -> np.ndarray:
        return prediction_error(self.predicted, self.measured)

    @property
    def median_error(self) -> float:
        return float(np.median(self.errors)) if self.errors.size else 0.0

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.errors))) if self.errors.size else 0.0


@dataclass(frozen=True)
class HostDelays:
    """Mean waits of the run's messages beyond the work (the module docstring), seconds, and
    the machine's speed while serving against its profile."""

    hop_s: tuple[float, ...]  # per link: hidden states to the next stage, beyond the link's time
    return_s: float  # tokens back to rank 0: stage 0 idle while a batch's requests come back
    # per stage: the run's speed against the fitted row's, (the rest, the prefill work)
    load: tuple[tuple[float, float], ...] = ()
    # per link: the next stage's wait to start a batch whose hidden states came while it was
    # busy, after its previous batch's end (the stage's time between batches, not the link's),
    # over all its batches
    pickup_s: tuple[float, ...] = ()


def host_delays(run: ServeRun, links: Sequence[LinkFit], hidden_bytes_per_token: float) -> HostDelays:
    """The host's delays of a measured run (the module docstring)."""
    log = run.iterations
    stages = int(log.stage.max()) + 1
    rows = [np.flatnonzero(log.stage == s) for s in range(stages)]  # batch order on every stage
    tokens = (log.prefill_tokens + log.decodes)[rows[0]]
    hops, pickups = [], []
    for stage, link in enumerate(links):
        before, after = rows[stage], rows[stage + 1]
        free = np.concatenate([[-np.inf], log.end[after][:-1]])
        came = log.end[before] + link.latency_s + tokens * hidden_bytes_per_token / link.bandwidth
        idle = free <= log.end[before]  # the message alone decides when the stage starts
        wait = log.start[after] - came
        hops.append(max(0.0, float(np.mean(wait[idle]))) if idle.any() else 0.0)
        busy = free >= came  # the hidden states were in hand before the stage was free
        # spread over every batch: the engine adds it to each, and a batch that found the stage
        # idle waited in its hop instead
        pickups.append(float(np.maximum(log.start[after] - free, 0.0)[busy].sum()) / max(after.size, 1))
    first, last = rows[0], rows[-1]
    idle = []
    seen: dict[int, int] = {}  # request -> the last batch that held it
    for batch in range(first.size):
        members = log.members[log.offsets[batch]:log.offsets[batch + 1]].tolist()
        held = [seen[r] for r in members if r in seen]
        if held and batch > 0:
            ready = max(float(log.end[last[max(held)]]), float(log.end[first[batch - 1]]))
            idle.append(max(0.0, float(log.start[first[batch]]) - ready - run.config.cpu_overhead_s))
        seen.update((r, batch) for r in members)
    return HostDelays(tuple(hops), float(np.mean(idle)) if idle else 0.0, pickup_s=tuple(pickups))


def load_factors(measured: ServeRunReport, costs: Sequence[StageIterationCosts]) -> tuple[tuple[float, float], ...]:
    """Per stage, how much slower (> 1) or faster the machine ran the batches while serving
    than while it was profiled: the non-negative least-squares factors (f, g) of the run's
    compute seconds (its rows; stage 0's start once rank 0 formed the batch) on what
    ``costs`` (the fitted rows') give each batch, split into its prefill work (its chunks'
    tokens and attention) and the rest (the base, the decodes and the KV they read):
    seconds = f x rest + g x prefill. A stage without prefill work (or a fit that zeroes
    one part) has f = g = its seconds over the rows'."""
    entries = measured.ranks[0].entries
    log = measured.run.iterations
    factors = []
    for stage, stage_costs in enumerate(costs):
        rows = np.flatnonzero(log.stage == stage)
        parts = np.array([_work_parts(stage_costs, entries[b]) for b in log.batch[rows].tolist()]).reshape(-1, 2)
        took = log.end[rows] - log.start[rows]
        whole = float(parts.sum())
        ratio = float(took.sum()) / whole if whole > 0 else 1.0
        rest, prefill = nonnegative_least_squares(parts, took) if parts[:, 1].any() else (ratio, ratio)
        factors.append((rest, prefill) if rest > 0 and prefill > 0 else (ratio, ratio))
    return tuple(factors)


def _work_parts(costs: StageIterationCosts, entries: Sequence) -> tuple[float, float]:
    """A batch's seconds on ``costs`` apart from its prefill work, and its prefill work."""
    chunk = sum(e.tokens for e in entries if not e.decode)
    attention = sum(e.attention for e in entries)
    whole = costs.time(sum(e.tokens for e in entries), attention, sum(1 for e in entries if e.decode),
                       sum(e.kv_read for e in entries), sum(1 for e in entries if e.emits))
    prefill = costs.time(chunk, attention, 0, 0.0, 0) - costs.time(0, 0.0, 0, 0.0, 0)
    return whole - prefill, prefill


def scaled_rows(rows: Sequence[LatencyRow], load: Sequence[tuple[float, float]],
                pickup_s: Sequence[float] = ()) -> tuple[LatencyRow, ...]:
    """Each stage's fitted row at the run's speed (``load_factors``: its prefill coefficients
    times the stage's prefill factor, the others times its other factor), and the base of
    stage s + 1 longer by ``pickup_s[s]``."""
    extra = (0.0, *pickup_s, *(0.0,) * len(rows))  # stage 0 has no link before it
    return tuple(LatencyRow(row.stage, row.base_s * rest + extra[row.stage], row.prefill_token_s * prefill,
                            row.prefill_attention_s * prefill, row.decode_request_s * rest, row.kv_token_s * rest)
                 for row, (rest, prefill) in zip(rows, load, strict=True))




@dataclass(frozen=True)
class ServeCheckReport:
    """A trace served for real and predicted on its fitted latency model."""

    measured: ServeRunReport
    predicted: ServeRun
    rows: tuple[LatencyRow, ...]  # the fitted latency model, one row per stage
    links: tuple[LinkFit, ...]
    metrics: tuple[MetricError, ...]  # TTFT, TPOT, end-to-end
    delays: HostDelays
    profile_only: tuple[MetricError, ...]  # the same, predicted without the host's delays
    tolerance: float = TOLERANCE

    @property
    def passed(self) -> bool:
        return all(metric.median_abs_error <= self.tolerance for metric in self.metrics)

    def to_dict(self) -> dict:
        """The JSON shape of ``serve check --json``."""
        return {
            "model": self.measured.model, "p": len(self.rows), "partition": str(self.measured.partition),
            "backend": self.measured.backend, "scheduler": self.predicted.config.scheduler.name.value,
            "requests": len(self.predicted.trace), "cpu_overhead_s": self.measured.cpu_overhead_s,
            "latency_model": [dataclasses.asdict(row) for row in self.rows],
            "links": [{"stage": link.stage, "latency_s": link.latency_s, "bandwidth_bytes_per_s": link.bandwidth}
                      for link in self.links],
            "host_delays": {"hop_s": list(self.delays.hop_s), "return_s": self.delays.return_s,
                            "pickup_s": list(self.delays.pickup_s), "load": [list(pair) for pair in self.delays.load]},
            "metrics": _metrics_dict(self.metrics),
            "profile_only": _metrics_dict(self.profile_only),
            "tolerance": self.tolerance, "passed": self.passed,
        }


def _metrics_dict(metrics: Sequence[MetricError]) -> dict:
    return {m.name: {"median_error": m.median_error, "median_abs_error": m.median_abs_error,
                     "measured_median": float(np.median(m.measured)) if m.measured.size else 0.0,
                     "predicted_median": float(np.median(m.predicted)) if m.predicted.size else 0.0,
                     "requests": int(m.requests.size)}
            for m in metrics}


def fit_stage_rows(ranks: Sequence[RankServeResult], trace: Trace, options: ServeRunOptions,
                   slots: int) -> tuple[LatencyRow, ...]:
    """Each stage's latency row fitted to the mean of each profiled composition's repeats:
    on a shared machine an iteration's time has a long tail (another process takes the
    core), and the metrics compared add iterations up (a request's time per token is a mean,
    its latency a sum), so the expected time is what they need, not the typical one."""
    batches = profile_batches(trace, options.scheduler, slots)
    samples = []
    for stage, rank in enumerate(ranks):
        pooled: dict[int, list[float]] = {}  # composition -> its repeats, before and after the run
        for index, seconds in rank.profile:
            pooled.setdefault(index, []).extend(seconds)
        for index, seconds in sorted(pooled.items()):
            entries = batches[index]
            decodes = sum(1 for e in entries if e.decode)
            samples.append([stage, sum(e.tokens for e in entries), sum(e.attention for e in entries), decodes,
                            sum(e.kv_read for e in entries), float(np.mean(seconds))])
    require(len(samples) > 0, "profile_repeats", options.profile_repeats, "give at least 1 repeat to fit a model")
    return fit_latency_rows(np.asarray(samples, np.float64))


def fit_links(ranks: Sequence[RankServeResult], hidden_bytes_per_token: float) -> tuple[LinkFit, ...]:
    """Each link's latency and bandwidth, fitted to the medians of its timed messages (from
    the send posted on one rank to the data in hand on the next, one clock)."""
    fits = []
    for stage in range(len(ranks) - 1):
        sent = [(t, ns) for s, t, ns in ranks[stage].link_sent if s == stage]
        received = [(t, ns) for s, t, ns in ranks[stage + 1].link_received if s == stage]
        require(len(sent) == len(received) > 0, "profile", f"link {stage}", "the link's messages were not all timed")
        sizes = sorted({t for t, _ in sent})
        one_way = [float(np.median([(r - s) * 1e-9 for (t, s), (_, r) in zip(sent, received, strict=True)
                                    if t == size])) for size in sizes]
        tokens = np.asarray(sizes, np.float64)
        latency, per_byte = nonnegative_least_squares(np.column_stack([np.ones_like(tokens),
                                                                       tokens * hidden_bytes_per_token]),
                                                      np.asarray(one_way))
        fits.append(LinkFit(stage, latency, 1.0 / per_byte if per_byte > 0 else float("inf"), tuple(sizes),
                            tuple(one_way)))
    return tuple(fits)


def predicted_deployment(model: ModelSpec, trace: Trace, options: ServeRunOptions, rows: Sequence[LatencyRow],
                         links: Sequence[LinkFit], *, cpu_overhead_s: float, slots: int,
                         hop_s: Sequence[float] = ()) -> Deployment:
    """The deployment the prediction runs (the module docstring); ``hop_s[s]`` is added to
    every message from stage s."""
    config = ServeConfig(instances=Instances(tp=1, pp=options.p, count=1), scheduler=options.scheduler,
                         kv=KVSettings(block_size=options.block_size), cpu_overhead_s=cpu_overhead_s)
    cluster = serve_cluster(options)
    deployment = build_deployment(config, model, cluster, latency=rows, dtype=serving_dtype(options.dtype))
    hidden = model.hidden_size * ELEMENT_BYTES[options.dtype]  # bytes of one token's hidden state
    plan = deployment.instances[0]
    stages = []
    for stage, costs in enumerate(plan.stages):
        if stage < len(links):
            tokens = np.arange(costs.send_s.size, dtype=np.float64)
            link = LinkSpec(bandwidth=links[stage].bandwidth, latency=links[stage].latency_s)
            extra = hop_s[stage] if stage < len(hop_s) else 0.0
            send = np.where(tokens > 0, link.latency + extra + tokens * hidden / link.bandwidth, 0.0)
            costs = dataclasses.replace(costs, send_s=send)
        stages.append(costs)
    plan = dataclasses.replace(plan, stages=tuple(stages),
                               kv_capacity_blocks=cache_blocks(trace, slots, options.block_size))
    return dataclasses.replace(deployment, instances=(plan,))


def compare_runs(measured: ServeRun, predicted: ServeRun) -> tuple[MetricError, ...]:
    """TTFT, TPOT and end-to-end per request (TPOT of the requests with two tokens or more)."""
    real, model = serve_result(measured), serve_result(predicted)
    several = np.flatnonzero(measured.trace.decode_tokens >= 2)
    every = np.arange(len(measured.trace))
    return (MetricError("ttft_s", real.ttft_s, model.ttft_s, every),
            MetricError("tpot_s", real.tpot_s[several], model.tpot_s[several], several),
            MetricError("e2e_s", real.e2e_s, model.e2e_s, every))


def serve_check(model: ModelSpec, trace: Trace, *, options: ServeRunOptions | None = None,
                tolerance: float = TOLERANCE, on_status: StatusCallback | None = None) -> ServeCheckReport:
    """Serve ``trace`` for real with a profile first (``options.profile_repeats``, or
    CHECK_REPEATS when 0), predict it on the fitted model, compare."""
    options = options or ServeRunOptions()
    if options.profile_repeats == 0:  # a check fits its prediction on a profile
        options = dataclasses.replace(options, profile_repeats=CHECK_REPEATS)
    require(0 < tolerance < 1, "tolerance", tolerance, "give a share in (0, 1)")
    measured = serve_run(model, trace, options=options, on_status=on_status)
    slots = measured.slots
    rows = fit_stage_rows(measured.ranks, trace, options, slots)
    links = fit_links(measured.ranks, model.hidden_size * ELEMENT_BYTES[options.dtype])
    delays = host_delays(measured.run, links, model.hidden_size * ELEMENT_BYTES[options.dtype])
    profiled = predicted_deployment(model, trace, options, rows, links, cpu_overhead_s=measured.cpu_overhead_s,
                                    slots=slots)
    bare = simulate_serving(profiled, trace)
    delays = dataclasses.replace(delays, load=load_factors(measured, profiled.instances[0].stages))
    deployment = predicted_deployment(model, trace, options, scaled_rows(rows, delays.load, delays.pickup_s), links,
                                      slots=slots,
                                      hop_s=delays.hop_s, cpu_overhead_s=measured.cpu_overhead_s + delays.return_s)
    predicted = simulate_serving(deployment, trace)
    return ServeCheckReport(measured=measured, predicted=predicted, rows=rows, links=links,
                            metrics=compare_runs(measured.run, predicted), delays=delays,
                            profile_only=compare_runs(measured.run, bare), tolerance=tolerance)
