"""Serving for real: a small model's prefill and decode with a KV cache on P rank processes,
every request's timings measured, as a ``ServeRun`` of source "measured".

The ranks are the training runtime's (``launch``: one process per pipeline stage, gloo over
loopback on CPU, NCCL with one GPU per rank; the FileStore, the timeouts and the killing of
every rank on a failure are the same). Rank s holds stage s of the model's layers, split
as the training runs split them (``runs.stage_partition``: the uniform partition, embedding
first, head last). Rank 0 also schedules: each iteration it admits the requests that have
arrived by the wall clock (arrival times counted from a common start after every rank is
ready), forms a batch (``serve_batches``), runs its stage, and sends the batch's entry table
and hidden states to rank 1; each stage sends its output on, the last samples greedily and
sends the tokens back to rank 0. Up to P batches (vLLM's pipeline parallelism, the engine's
semantics) travel through the stages at once, each with its own requests; the batches are
the simulator's scheduler's (``serve_batches``).

Times (every rank on the host's monotonic clock, ``measure``): a stage's iteration runs
from when its input was in hand (rank 0: once the batch was formed) to when its output was
ready; a token is made when the last stage's iteration that sampled it ended. A request is
scheduled when its first chunk's iteration started on the first stage. Rank 0's time to
form each batch (admission and the policy, its entry table and inputs) is the per-iteration
CPU overhead, kept apart (``ServeRunReport.overhead_s``), just before stage 0's row (the
engine's stage 0 likewise starts a batch ``cpu_overhead_s`` after it forms). The KV use reported is the
scheduler's paged cache, blocks taken when a batch forms and freed when rank 0 has a
request's last token.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.limits import (
    MAX_REPEATS,
    MAX_STAGES,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    check_amount,
    check_count,
)
from pipesched.model import layer_params
from pipesched.model.clusters import homogeneous_cluster
from pipesched.model.devices import load_device
from pipesched.model.hardware import Cluster
from pipesched.model.inference import StageIterationCosts, stage_iteration_costs
from pipesched.model.spec import ModelSpec
from pipesched.partition import Partition
from pipesched.runtime.launch import LaunchSpec, StatusCallback, launch
from pipesched.runtime.measure import ELEMENT_BYTES
from pipesched.runtime.runs import (
    BACKENDS,
    RUNTIME_DTYPES,
    check_capacity,
    memory_problem,
    stage_partition,
)
from pipesched.runtime.serve_batches import BatchEntry, check_policy, slot_count
from pipesched.serving.config import Instances, KVSettings, SchedulerSpec, ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.records import IterationLog, KVTrace, ServeRun
from pipesched.serving.results import serve_result
from pipesched.serving.trace import Trace

NS = 1e-9  # seconds per nanosecond of the host clock


@dataclass(frozen=True)
class ServeRunOptions:
    """How a trace is served for real."""

    p: int = DEFAULTS.serve_run_p  # ranks, one pipeline stage each
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    dtype: str = DEFAULTS.run_dtype
    backend: str = "gloo"  # gloo (CPU ranks) or nccl (one GPU per rank)
    seed: int = 0  # weights and prompt token ids
    timeout_s: float = DEFAULTS.run_timeout  # the whole launch; then every rank is killed
    threads: int = 1  # torch threads per rank
    pin_cpus: bool = True  # pin rank r to core r when the machine has a core per rank
    block_size: int = DEFAULTS.block_size  # tokens per block of the KV use reported (KVTrace)
    # > 0: every rank times its stage at the profile batches, this many repeats each (half
    # before serving, half after), and ranks s and s + 1 time hidden-state messages before
    # it (serve_check's fitted model)
    profile_repeats: int = 0

    def __post_init__(self) -> None:
        check_count("p", self.p, MAX_STAGES, what="ranks")
        check_count("threads", self.threads, MAX_THREADS, what="threads")
        check_count("profile_repeats", self.profile_repeats, MAX_REPEATS, minimum=0, what="repeats")
        require(self.dtype in RUNTIME_DTYPES, "dtype", self.dtype, f"must be one of {', '.join(RUNTIME_DTYPES)}")
        require(self.backend in BACKENDS, "backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        check_amount("timeout", self.timeout_s, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")


@dataclass(frozen=True)
class ServeTask:
    """What every rank of a serving launch receives."""

    model: ModelSpec
    partition: Partition
    trace: Trace
    options: ServeRunOptions
    slots: int  # KV-cache slots: requests running at once
    max_len: int  # tokens of the longest request (prompt + output)


@dataclass
class RankServeResult:
    """What one rank sends back: its stage's iterations (host clock, ns)."""

    batch: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    # rank 0 only: the common start, each batch's entries, its time to form them, the tokens
    origin_ns: int = 0
    entries: list[list[BatchEntry]] = field(default_factory=list)
    overhead_ns: list[int] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # per request, its output token ids
    # profile phase: (composition index, seconds of each repeat); the link's messages
    # (stage sending, tokens, ns on the common clock): sent when posted, received when in hand
    profile: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    link_sent: list[tuple[int, int, int]] = field(default_factory=list)
    link_received: list[tuple[int, int, int]] = field(default_factory=list)
    # rank 0: the scheduler's paged cache over time (seconds from the start) and its size
    kv_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kv_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    kv_capacity: int = 0


@dataclass(frozen=True)
class ServeRunReport:
    """A trace served for real."""

    run: ServeRun  # source "measured", seconds from the trace's time 0
    model: str
    partition: Partition
    backend: str
    tokens: tuple[np.ndarray, ...]  # per request, the output token ids it generated (greedy)
    overhead_s: np.ndarray  # per iteration, rank 0's time to form the batch
    slots: int  # KV-cache slots of every stage
    ranks: tuple[RankServeResult, ...] = field(repr=False, default=())

    @property
    def cpu_overhead_s(self) -> float:
        """The median per-iteration CPU overhead (``ServeConfig.cpu_overhead_s`` of a prediction)."""
        return float(np.median(self.overhead_s)) if self.overhead_s.size else 0.0

    def to_dict(self, *, per_request: bool = False) -> dict:
        """The JSON shape of ``serve run --json``: how it ran, then the metrics of the measured
        run in the shape of ``serve simulate`` (``serving.results``)."""
        run = self.run
        return {
            "model": self.model, "p": len(self.partition.sizes), "partition": str(self.partition),
            "backend": self.backend, "scheduler": run.config.scheduler.name.value, "source": run.source,
            "iterations": int(run.iterations.offsets.size - 1), "cpu_overhead_s": self.cpu_overhead_s,
            **serve_result(run).to_dict(per_request=per_request),
        }


def serving_dtype(runtime_dtype: str) -> str:
    """The kernel model's dtype for a runtime dtype (float64 is costed as fp32)."""
    return "bf16" if runtime_dtype == "bfloat16" else "fp32"


def serve_cluster(options: ServeRunOptions) -> Cluster:
    """The machine of a real run as the kernel model sees it: p ranks of the ``cpu`` preset
    on one node (its links are measured, not taken from here)."""
    return homogeneous_cluster(load_device("cpu"), options.p, devices_per_node=options.p)


def kernel_stage_costs(model: ModelSpec, options: ServeRunOptions) -> tuple[StageIterationCosts, ...]:
    """The kernel model's iteration costs of the run's stages on the ``cpu`` preset: their
    layers (the serving costs' own split, the training partitioner over each layer's time in
    the largest iteration) and the model FLOPs of an iteration."""
    spec = options.scheduler
    return stage_iteration_costs(model, serve_cluster(options), tp=1, first_ranks=tuple(range(options.p)),
                                 max_tokens=max(spec.token_budget, spec.max_batch), max_batch=spec.max_batch,
                                 dtype=serving_dtype(options.dtype))


def serve_partition(model: ModelSpec, options: ServeRunOptions) -> Partition:
    """The layers of each stage (``kernel_stage_costs``), checked for a real run."""
    bounds = (0, *(stage.layers[1] for stage in kernel_stage_costs(model, options)))
    return stage_partition(model, options.p, Partition(bounds))


def check_serve_inputs(model: ModelSpec, trace: Trace, options: ServeRunOptions) -> None:
    """Refuse, before any rank starts, what a real run cannot serve: a request longer than
    the model's context, a scheduler it does not run, ranks or memory the machine lacks, a
    model it cannot serve the trace with in the timeout."""
    require(len(trace) >= 1, "requests", 0, "give a trace of at least one request")
    longest = int(np.argmax(trace.total_tokens))
    limit = model.context_length
    require(limit == 0 or trace.total_tokens[longest] <= limit, "num_prefill_tokens",
            int(trace.prefill_tokens[longest]),
            f"request {longest} needs {int(trace.total_tokens[longest])} tokens with its output and {model.name}'s "
            f"context is {limit}; give shorter prompts or outputs")
    check_policy(options.scheduler, trace)
    check_capacity(options.p, options.backend)
    partition = serve_partition(model, options)
    need = serve_bytes_per_rank(model, partition, options, slots=_slots(trace, options),
                                max_len=int(trace.total_tokens.max()))
    problem = memory_problem(need, options.backend)
    if problem is not None:
        raise PipeschedError(f"model={model.name}: {problem.replace('weights and gradients', 'weights and KV cache')}; "
                             "use a smaller model (tiny, small), more ranks, fewer requests at once (--max-batch) "
                             "or a smaller dtype")
    expected = expected_duration_s(model, trace, options)
    require(expected <= options.timeout_s, "model", model.name,
            f"serving these {len(trace)} requests is expected to take {expected:,.0f} s on this machine (the kernel "
            f"model's cpu preset), more than timeout={options.timeout_s:g}s; use a smaller model (tiny, small), "
            "fewer or shorter requests, or a longer timeout")


def expected_duration_s(model: ModelSpec, trace: Trace, options: ServeRunOptions) -> float:
    """Seconds from the trace's start to its last token as the engine predicts it with the
    kernel model's ``cpu`` preset: a lower bound of a real CPU run's (the preset is a
    nominal server CPU; Python's per-iteration work comes on top)."""
    config = ServeConfig(instances=Instances(tp=1, pp=options.p, count=1), scheduler=options.scheduler,
                         kv=KVSettings(block_size=options.block_size))
    deployment = build_deployment(config, model, serve_cluster(options), dtype=serving_dtype(options.dtype))
    return float(simulate_serving(deployment, trace).finished_at.max())


def _slots(trace: Trace, options: ServeRunOptions) -> int:
    return slot_count(trace, options.scheduler, options.p)


def serve_bytes_per_rank(model: ModelSpec, partition: Partition, options: ServeRunOptions, *, slots: int,
                         max_len: int) -> list[float]:
    """The least memory each rank needs, bytes: its stage's weights and its KV cache (keys and
    values of every slot at the longest request's length), in the runtime dtype."""
    params = layer_params(model)
    element = ELEMENT_BYTES[options.dtype]
    kv_per_token = 2 * model.num_kv_heads * model.kv_channels * element  # one block's keys + values
    need = []
    for stage in range(partition.num_stages):
        layers = partition.layers(stage)
        blocks = sum(1 for i in layers if 0 < i < model.num_cost_layers - 1)
        need.append(element * sum(params[i] for i in layers) + blocks * kv_per_token * slots * max_len)
    return need


def serve_run(model: ModelSpec, trace: Trace, *, options: ServeRunOptions | None = None,
              on_status: StatusCallback | None = None) -> ServeRunReport:
    """Serve ``trace`` with ``model`` for real on ``options.p`` ranks (the module docstring)."""
    options = options or ServeRunOptions()
    from pipesched.runtime.torch_model import check_buildable

    check_buildable(model)
    check_serve_inputs(model, trace, options)
    partition = serve_partition(model, options)
    task = ServeTask(model, partition, trace, options, slots=_slots(trace, options),
                     max_len=int(trace.total_tokens.max()))
    spec = LaunchSpec(handler="serve", task=task, world_size=options.p, backend=options.backend,
                      timeout_s=options.timeout_s, threads=options.threads,
                      pin_cpus=options.pin_cpus and options.backend == "gloo")
    ranks: list[RankServeResult] = launch(spec, describe=["serve"], on_status=on_status)
    return ServeRunReport(
        run=measured_serve_run(task, ranks, kernel_stage_costs(model, options)), model=model.name, partition=partition, backend=options.backend,
        tokens=tuple(np.asarray(t, np.int64) for t in ranks[0].tokens),
        overhead_s=np.asarray(ranks[0].overhead_ns, np.float64) * NS, slots=task.slots, ranks=tuple(ranks),
    )


def measured_serve_run(task: ServeTask, ranks: list[RankServeResult],
                       costs: Sequence[StageIterationCosts]) -> ServeRun:
    """The ``ServeRun`` of what the ranks recorded: seconds from the trace's time 0; each
    row's model FLOPs from ``costs`` (the stages' kernel-model costs)."""
    lead, last = ranks[0], ranks[-1]
    origin = lead.origin_ns
    entries = lead.entries
    made = np.zeros(len(entries))  # per batch: when its last stage ended (its tokens were made)
    made[np.asarray(last.batch, np.int64)] = (np.asarray(last.end_ns, np.int64) - origin) * NS
    started = np.zeros(len(entries))
    started[np.asarray(lead.batch, np.int64)] = (np.asarray(lead.start_ns, np.int64) - origin) * NS
    times = _token_times(task.trace, entries, made)
    counts = np.array([len(t) for t in times], np.int64)
    require(bool(np.array_equal(counts, task.trace.decode_tokens)), "serve run", "tokens",
            "a request did not get all its output tokens; the run is incomplete")
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    scheduled = np.full(len(task.trace), np.inf)
    for batch, batch_entries in enumerate(entries):
        for entry in batch_entries:
            scheduled[entry.request] = min(scheduled[entry.request], started[batch])
    config = ServeConfig(instances=Instances(tp=1, pp=task.options.p, count=1), scheduler=task.options.scheduler,
                         kv=KVSettings(block_size=task.options.block_size),
                         cpu_overhead_s=_median_s(lead.overhead_ns))
    flat = np.concatenate(times) if times else np.zeros(0)
    return ServeRun(
        trace=task.trace, config=config, instance=np.zeros(len(task.trace), np.int32), scheduled_at=scheduled,
        first_token_at=flat[offsets[:-1]], finished_at=flat[offsets[1:] - 1],
        preemptions=np.zeros(len(task.trace), np.int32), token_times=flat, token_offsets=offsets,
        iterations=iteration_log(ranks, entries, origin, costs), kv=KVTrace((lead.kv_times,), (lead.kv_blocks,), (lead.kv_capacity,), task.options.block_size),
        instance_kind=("replica",), instance_devices=(tuple(range(task.options.p)),), tp=(1,),
        peak_flops=load_device("cpu").peak_flops if task.options.backend == "gloo" else 0.0,
        source="measured",
    )


def _median_s(values_ns: list[int]) -> float:
    return statistics.median(values_ns) * NS if values_ns else 0.0


def _token_times(trace: Trace, entries: list[list[BatchEntry]], made: np.ndarray) -> list[np.ndarray]:
    times: list[list[float]] = [[] for _ in range(len(trace))]
    for batch, batch_entries in enumerate(entries):
        for entry in batch_entries:
            if entry.emits:
                times[entry.request].append(float(made[batch]))
    return [np.asarray(t, np.float64) for t in times]


def iteration_log(ranks: list[RankServeResult], entries: list[list[BatchEntry]], origin: int,
                  costs: Sequence[StageIterationCosts]) -> IterationLog:
    """One row per (batch, stage), stage by stage, each stage's rows in the order they ran."""
    batch = np.concatenate([np.asarray(r.batch, np.int64) for r in ranks])
    stage = np.concatenate([np.full(len(r.batch), s, np.int32) for s, r in enumerate(ranks)])
    start = np.concatenate([np.asarray(r.start_ns, np.int64) for r in ranks])
    end = np.concatenate([np.asarray(r.end_ns, np.int64) for r in ranks])
    prefill = np.array([sum(e.tokens for e in b if not e.decode) for b in entries], np.int64)
    decodes = np.array([sum(1 for e in b if e.decode) for b in entries], np.int64)
    kv_tokens = np.array([sum(e.kv_read for e in b) for b in entries], np.int64)
    attention = np.array([sum(e.attention for e in b) for b in entries], np.float64)
    flops = np.array([costs[s].flops(int(prefill[b] + decodes[b]), float(attention[b]), float(kv_tokens[b]))
                      for b, s in zip(batch.tolist(), stage.tolist(), strict=True)])
    members = np.array([e.request for b in entries for e in b], np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in entries])]).astype(np.int64)
    return IterationLog(
        batch=batch, instance=np.zeros(batch.size, np.int32), stage=stage, first_device=stage.copy(),
        start=(start - origin) * NS, end=(end - origin) * NS, prefill_tokens=prefill[batch],
        decodes=decodes[batch], kv_tokens=kv_tokens[batch], flops=flops,
        members=members, offsets=offsets,
    )
