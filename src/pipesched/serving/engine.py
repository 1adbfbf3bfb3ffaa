"""The discrete-event run of a serving trace on a deployment: ``simulate_serving`` -> ``ServeRun``.

Instances and pipeline parallelism. Each instance is a pipeline of p stages with at most p
batches in flight (vLLM's virtual engines, Vidur's replica stage scheduler). A new batch
forms when stage 0 is free and fewer than p batches are in flight, from the requests no
batch in flight holds (``schedulers.select_batch``). It pays ``config.cpu_overhead_s``
(scheduling and launch on the host) and any swap of KV caches to or from host memory,
then runs stage 0, sends its hidden state of T tokens to stage 1 (``send_s[T]``), runs
stage 1, and so on; each stage serves batches in the order they formed. A stage's time is
``StageIterationCosts.time(T, A, D, K, n)`` of the batch (its compute, and with weights
streamed its loads overlapping it: ``streamed_seconds``): T = prefill chunk tokens + D
decodes, A = sum over chunks of c tokens after x cached of c x (x + c), K = sum over the
decodes of the tokens their attention reads (those cached before the step, + 1 for the
new one), n = the tokens the batch makes (sampled on the last stage). Every (batch, stage)
is a row of the ``IterationLog`` (a batch's members: its decodes, then its prefill
chunks; the row's hidden state, T x ``hidden_bytes_per_token`` bytes, arrived at the next
stage at ``send_end``: its end on the last stage), so a stage idle between two batches of
different times (the pipeline bubble) shows as a gap between its rows. Each preemption's
time (when the batch whose selection preempted it formed) is kept per instance
(``KVTrace.preempted_at``).

Tokens. A batch's tokens are made when it ends on the last stage: one per decode, and one
per prefill whose chunk was its prompt's last (the first output token, or after a
recompute the next one). A request's token times are the ends of the batches that made
them; it finishes with its last token and frees its KV blocks then.

Events, in time order; at one time: batch ends, then KV transfers ending, then arrivals,
then stage 0 becoming free; batches then form on the instances those touched, in index
order. Ties break by the order events were made: the same inputs give the same run.

Routing (``config.routing``): an arriving request goes to a replica (or a prefill
instance) round-robin or to the one with the fewest unfinished requests (the lowest index
on a tie). Disaggregated: when a prompt's prefill ends its first token is made and its KV
cache (prompt tokens x ``kv_bytes_per_token``) is sent to a decode instance routed the same
way, over ``Deployment.transfer_s`` (transfers between one pair of instances one after the
other, ``KVMoves`` "transfer"); its blocks on the prefill instance are freed when the
transfer ends, and it joins the decode instance's batches then.

Swap preemption moves a request's cache (its tokens x the largest per-device
``kv_bytes_per_token`` of the stages, all devices at once) over ``deployment.host_link``
(out at ``host_write_bandwidth``, in at its bandwidth), one move after the other per
instance, before the batch that needs the room (swap-out) or the request back (swap-in)
starts.

What a preemption costs its request (``ServeRun.preemption_s``), from the batch whose
selection preempted it to its cache whole on the device again, in four parts that tile
that span: save (its swap-out), reload (its swap-in), recompute (from the start on stage 0
of the prefill rebuilding a dropped cache to the end of the chunk that has rebuilt the
tokens it lost) and queueing (the rest: waiting for the host link, for a batch to take it
back).

Devices shared in time (``Deployment.sharing``: several models on one device group, each an
instance of its own stage costs). A stage runs on a device slot (``Sharing.slot``), or on
a run of them (``Sharing.span``: a decode stage over all the devices of a prefill
pipeline's stages: ``Disaggregation.shared``); the
instances on one slot serve one batch at a time on it, turn by turn (the least recently
served instance first: one batch each while several wait). Requests come
pre-routed (``routes``: the instance of each request; -1 lets the engine route it). In a swap
group (models whose weights do not fit on the group together) one instance's weights are
on the devices at a time, the first's at the start. While another instance of the group has
requests, the resident admits no new request once its residency has lasted as long as its
own load took (a residency pays for its swap before it yields: the rent-or-buy rule), and
finishes those it holds; when it holds no KV block and no batch is in flight, the waiting
instance (the least recently served) takes the devices, its weights loaded stage by stage
(``Sharing.load_s``: the tiers model's move from host memory or disk, plus latency;
``KVMoves`` ``WEIGHTS``; the resident's weights are dropped for free, a copy stays below;
the requests it has not admitted wait for its next turn).

The run is compiled (numba): the request and instance state are integer tables
(``queues``), the loop does per-iteration work only.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from numba import njit

from pipesched.enums import Preemption, Routing
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_SERVED_TOKENS, check_count
from pipesched.model.inference import iteration_flops, iteration_seconds, streamed_seconds
from pipesched.serving.deployment import Deployment
from pipesched.serving.kv_cache import release, watermark_blocks
from pipesched.serving.queues import (
    AVAILABLE,
    CACHED,
    CAPACITY,
    COHORT,
    COUNT,
    FINISHED_AT,
    FIRST_STAGE,
    FIRST_TOKEN_AT,
    HEAD,
    IN_FLIGHT,
    INCOMING,
    INSTANCE,
    INSTANCE_COLUMNS,
    KIND,
    KIND_CODES,
    LOST,
    MADE,
    NEXT,
    OUT,
    PARTIAL,
    PREEMPTED,
    PREEMPTED_AT,
    PREEMPTED_S,
    PREEMPTION_COLUMNS,
    PREFILL,
    PREV,
    PROMPT,
    QUEUE,
    QUEUE_FROM,
    QUEUEING_S,
    RECOMPUTE_FROM,
    RECOMPUTE_S,
    RELOAD_S,
    REQUEST_COLUMNS,
    REQUEST_TIMES,
    RUNNING,
    SAVE_S,
    SCHEDULED_AT,
    STAGES,
    TAIL,
    TARGET,
    UNFINISHED,
    USED,
    WAITING,
    WATERMARK,
    push_back,
)
from pipesched.serving.records import WEIGHTS, IterationLog, KVMoves, KVTrace, ServeRun
from pipesched.serving.schedulers import (
    BLOCK,
    BUDGET,
    DECODES,
    DROPPED,
    MAX_BATCH,
    NAME,
    PLAN_FIELDS,
    PREFILLS,
    SCHEDULER_CODES,
    SPEC_FIELDS,
    SWAP,
    SWAP_IN,
    SWAP_OUT,
    SWAPS,
    VICTIMS,
    blocks_of,
    select_batch,
)
from pipesched.serving.trace import Trace, check_context

_seconds = njit(cache=True)(iteration_seconds)
_streamed = njit(cache=True)(streamed_seconds)
_flops = njit(cache=True)(iteration_flops)

# event priorities at one time
_BATCH_END, _TRANSFER_END, _STAGE_FREE = 0, 1, 2
# stage terms (float64 table, one row per stage of every instance)
(_BASE, _ATTENTION, _DECODE, _KV, _FLOPS_TOKEN, _FLOPS_ATTENTION, _KV_DEVICE, _HIDDEN, _BLOCKS, _STREAMED,
 _BLOCK_LOAD) = range(11)
# settings (float64): per-iteration overhead, host link (latency, host -> device and device -> host bytes/s)
_OVERHEAD, _HOST_LATENCY, _HOST_BANDWIDTH, _HOST_WRITE_BANDWIDTH = range(4)
# run counters (int64)
(_ROWS, _BATCHES, _MEMBERS, _KV_LOG, _MOVES, _TRANSFERS, _SEQUENCE, _TURN_ENTRY, _TURN_DECODE, _CHUNKS,
 _PREEMPT_LOG) = range(11)
_COUNTERS = 11
# iteration rows (float64): batch, instance, stage, first device, start, end, prefill tokens, decodes, kv tokens,
# flops, hidden state's arrival at the next stage (send_end), its bytes
_ROW_FIELDS = 12
# batches (int64): instance, first member, decodes, prefills, first chunk (of its prefills, in the chunk column)
_BATCH_FIELDS = 5
# moves (float64): request (-1: weights), kind, source device, destination device, bytes, start, end, instance
_MOVE_FIELDS = 8
_MOVE_KINDS = ("transfer", "swap-out", "swap-in", WEIGHTS)
_TRANSFER, _WEIGHTS = 0, 3
_HOST = -1  # device of host memory in KVMoves (-2: disk)


def simulate_serving(deployment: Deployment, trace: Trace, *, routes: np.ndarray | None = None) -> ServeRun:
    """Every request of ``trace`` served on ``deployment`` (module docstring); ``routes``:
    the instance each request goes to (-1 or None: routed by ``config.routing``)."""
    routes = _routes(routes, len(trace), len(deployment.instances))
    _check(deployment, trace, routes)
    tables = _Tables(deployment, trace, routes)
    logs = _run(trace.arrived_at, tables.req, tables.times, tables.token_offsets, tables.token_times, tables.ins,
                tables.stage_free, tables.terms, tables.token_s, tables.send_s, tables.sample_s, tables.device,
                tables.kv_bytes, tables.spec, tables.settings, tables.link_latency, tables.link_bandwidth,
                tables.entry, tables.decode, tables.least_loaded, tables.routes, tables.shared.arrays(),
                tables.preemption)
    return _result(deployment, trace, tables, logs)


def _routes(routes: np.ndarray | None, requests: int, instances: int) -> np.ndarray:
    """The instance of each request (-1: the engine routes it)."""
    if routes is None:
        return np.full(requests, -1, np.int64)
    routes = np.ascontiguousarray(routes, np.int64)
    require(routes.shape == (requests,) and bool(np.all(routes < instances)), "routes", routes.shape,
            f"give one instance below {instances} (or -1) per request")
    return routes


def _check(deployment: Deployment, trace: Trace, routes: np.ndarray) -> None:
    """The trace fits the deployment: every instance's cache holds the longest request that
    may go to it (any, unless routed)."""
    spec = deployment.config.scheduler
    check_count("output_tokens", int(trace.decode_tokens.sum()), MAX_SERVED_TOKENS, what="output tokens of a trace")
    check_context(trace, deployment.max_context)
    for i, plan in enumerate(deployment.instances):
        mine = np.flatnonzero((routes == i) | (routes < 0))
        if mine.size:
            longest = int(mine[np.argmax(trace.total_tokens[mine])])
            blocks = blocks_of(int(trace.total_tokens[longest]), deployment.config.kv.block_size)
            require(plan.kv_capacity_blocks >= blocks, "kv_capacity_blocks", plan.kv_capacity_blocks,
                    f"a {plan.kind} instance's KV cache cannot hold request {longest} alone ({blocks:,} blocks); "
                    "give the cache more memory, a stage more devices, or shorten the requests")
        for costs in plan.stages:
            require(costs.max_tokens >= spec.token_budget and costs.max_batch >= spec.max_batch, "stage_costs",
                    f"{costs.max_tokens} tokens, {costs.max_batch} sequences",
                    f"build the stage costs for {spec.token_budget} tokens and {spec.max_batch} sequences")


class _Tables:
    """The run's state and inputs as the compiled loop reads them."""

    def __init__(self, deployment: Deployment, trace: Trace, routes: np.ndarray) -> None:
        config = deployment.config
        spec = config.scheduler
        n = len(trace)
        self.req = np.zeros((n, REQUEST_COLUMNS), np.int64)
        self.req[:, PROMPT] = trace.prefill_tokens
        self.req[:, TARGET] = trace.prefill_tokens
        self.req[:, OUT] = trace.decode_tokens
        self.req[:, INSTANCE] = -1
        self.req[:, QUEUE] = -1
        self.times = np.full((n, REQUEST_TIMES), np.nan)
        self.token_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(trace.decode_tokens, out=self.token_offsets[1:])
        self.token_times = np.full(int(self.token_offsets[-1]), np.nan)
        plans = deployment.instances
        stages = [costs for plan in plans for costs in plan.stages]
        self.ins = np.zeros((len(plans), INSTANCE_COLUMNS), np.int64)
        self.ins[:, HEAD:COUNT] = -1
        first = np.cumsum([0] + [len(plan.stages) for plan in plans])
        for i, plan in enumerate(plans):
            self.ins[i, [KIND, STAGES, FIRST_STAGE, CAPACITY, WATERMARK]] = (
                KIND_CODES[plan.kind], len(plan.stages), first[i], plan.kv_capacity_blocks,
                watermark_blocks(plan.kv_capacity_blocks))
        self.routes = routes
        self.shared = _SharedTables(deployment.sharing, plans)
        slots = self.shared.slot[:, 0] + self.shared.slot[:, 1]  # past each stage's last slot
        self.stage_free = np.zeros(int(slots.max()) if len(stages) else 0)
        self.terms = np.array([[c.base_s, c.prefill_attention_s, c.decode_request_s, c.kv_token_s, c.flops_per_token,
                                c.flops_per_attention, c.kv_bytes_per_token, c.hidden_bytes_per_token, c.blocks,
                                c.streamed_blocks, c.block_load_s]
                               for c in stages], np.float64)
        self.token_s = np.stack([c.token_s[:spec.token_budget + 1] for c in stages])
        self.send_s = np.stack([c.send_s[:spec.token_budget + 1] for c in stages])
        self.sample_s = np.stack([c.sample_s[:spec.max_batch + 1] for c in stages])
        self.device = np.array([d for plan in plans for d in plan.devices], np.int64)
        self.kv_bytes = np.array([plan.kv_bytes_per_token for plan in plans], np.float64)
        self.spec = np.zeros(SPEC_FIELDS, np.int64)
        self.spec[[NAME, MAX_BATCH, BUDGET, SWAP, BLOCK]] = (
            SCHEDULER_CODES[spec.name], spec.max_batch, spec.token_budget, spec.preemption == Preemption.SWAP,
            config.kv.block_size)
        host = deployment.host_link
        self.settings = np.array([config.cpu_overhead_s, host.latency, host.bandwidth,
                                  deployment.host_write_bandwidth or host.bandwidth], np.float64)
        self.preemption = np.zeros((n, PREEMPTION_COLUMNS))
        self.preemption[:, [PREEMPTED_AT, QUEUE_FROM, RECOMPUTE_FROM]] = np.nan
        self.link_latency = np.ascontiguousarray(deployment.link_latency, np.float64)
        self.link_bandwidth = np.ascontiguousarray(deployment.link_bandwidth, np.float64)
        kinds = [plan.kind for plan in plans]
        self.entry = np.array([i for i, k in enumerate(kinds) if k != "decode"], np.int64)
        self.decode = np.array([i for i, k in enumerate(kinds) if k == "decode"], np.int64)
        self.least_loaded = config.routing == Routing.LEAST_LOADED


class _SharedTables:
    """Devices shared in time, as the compiled loop reads them (each stage on its own slot,
    no swap group, when nothing is shared). ``slot`` [stages, 2]: each stage's first slot
    and the slots it occupies from there (``Sharing.span``)."""

    def __init__(self, sharing, plans) -> None:
        instances, stages = len(plans), sum(len(plan.stages) for plan in plans)
        owner = np.repeat(np.arange(instances), [len(plan.stages) for plan in plans])
        if sharing is None:
            first, self.group = np.arange(stages, dtype=np.int64), np.full(instances, -1, np.int64)
            self.load_s, self.load_bytes = np.zeros(stages), np.zeros(stages)
            self.load_from, self.any = np.full(instances, _HOST, np.int64), False
            self.quantum = np.zeros(instances)
        else:
            first = np.asarray(sharing.slot, np.int64)
            self.group = np.ascontiguousarray(sharing.swap_group, np.int64)
            self.load_s = np.ascontiguousarray(sharing.load_s, np.float64)
            self.load_bytes = np.ascontiguousarray(sharing.load_bytes, np.float64)
            self.load_from, self.any = np.ascontiguousarray(sharing.load_from, np.int64), True
            # per instance: its longest stage load, the least its residency lasts before it yields
            self.quantum = np.array([max((float(self.load_s[g]) for g in np.flatnonzero(owner == i)), default=0.0)
                                     for i in range(instances)])
        require(first.shape == (stages,) and self.group.shape == (instances,), "sharing", first.shape,
                f"give a slot per stage ({stages}) and a swap group per instance ({instances})")
        span = np.ones(stages, np.int64) if sharing is None or sharing.span is None else sharing.span
        self.slot = np.ascontiguousarray(np.stack([first, np.asarray(span, np.int64)], axis=1))
        groups = int(self.group.max()) + 1 if instances else 0
        # the instance whose weights each swap group holds: its first
        self.resident = np.array([int(np.flatnonzero(self.group == g)[0]) for g in range(groups)], np.int64)
        self.since = np.zeros(groups)  # per swap group: when its resident's weights arrived (seconds)

    def arrays(self) -> tuple:
        return (self.slot, self.group, self.resident, self.load_s, self.load_bytes, self.load_from, self.any,
                self.since, self.quantum)


@njit(cache=True)
def _run(arrived, req, times, token_offsets, token_times, ins, stage_free, terms, token_s, send_s, sample_s, device,
         kv_bytes, spec, settings, link_latency, link_bandwidth, entry, decode, least_loaded, routes, shared,
         preemption):
    """The event loop (module docstring); returns the logs and their counters. The functions
    it calls allocate nothing and are compiled without reference counting (numba's
    ``_nrt=False``: no atomic count per array argument per call, half the time of a batch);
    the logs grow here, before each call that may write them."""
    n, nins = arrived.shape[0], ins.shape[0]
    slot, group, resident, load_s, load_bytes, load_from, any_shared, since, quantum = shared
    slot_low, slot_high = np.zeros(nins, np.int64), np.zeros(nins, np.int64)  # per instance: its slots [low, high)
    for i in range(nins):
        slot_low[i], slot_high[i] = _slot_range(ins, slot, i)
    stages, grow = ins[:, STAGES].max(), spec[MAX_BATCH] * (ins[:, STAGES].max() + 2) + 1
    counts = np.zeros(_COUNTERS, np.int64)
    # logs sized for a run without preemption: a member per output token and per prefill chunk
    chunks = n + (req[:, PROMPT].sum() + spec[BUDGET] - 1) // spec[BUDGET]
    members, chunks_of = np.empty(token_times.shape[0] + chunks, np.int64), np.empty(chunks, np.int64)
    rows, batches = np.empty((4096, _ROW_FIELDS)), np.empty((4096, _BATCH_FIELDS), np.int64)
    kv_log, moves, transfers = np.empty((4096, 3)), np.empty((grow, _MOVE_FIELDS)), np.empty((grow, 3), np.int64)
    preempt_log = np.empty((64, 3))  # instance, time, requests preempted then
    host_free, link_free, ends = np.zeros(nins), np.zeros((nins, nins)), np.zeros(grow)
    plan_rows, plan_chunks = np.empty(grow, np.int64), np.empty(grow, np.int64)  # the plan's requests, chunks
    swaps, swap_kind, going = np.empty(grow, np.int64), np.empty(grow, np.int64), np.empty(grow, np.int64)
    plan = np.zeros(PLAN_FIELDS, np.int64)
    touched = np.zeros(nins, np.bool_)
    served = np.full(nins, -1, np.int64)  # per instance: its latest batch
    heap = [(0.0, 0, 0, 0)]  # (time, priority, sequence, payload)
    heap.pop()
    nxt = 0
    while True:
        t = heap[0][0] if len(heap) > 0 else math.inf
        if nxt < n and arrived[nxt] < t:
            t = arrived[nxt]
        if t == math.inf:
            break
        while len(heap) > 0 and heap[0][0] == t:
            _, priority, _, payload = heapq.heappop(heap)
            if counts[_KV_LOG] + 2 > kv_log.shape[0] or counts[_MOVES] + grow > moves.shape[0]:
                kv_log, moves = _room(kv_log, counts[_KV_LOG] + 2), _room(moves, counts[_MOVES] + grow)
            if counts[_TRANSFERS] + grow > transfers.shape[0]:
                transfers = _room(transfers, counts[_TRANSFERS] + grow)
            sent = _event(priority, payload, t, req, times, token_offsets, token_times, ins, batches, members,
                          chunks_of, kv_log, moves, transfers, counts, touched, device, kv_bytes, link_latency,
                          link_bandwidth, link_free, decode, least_loaded, going, ends, preemption)
            for k in range(sent):  # KV caches on their way to decode instances
                heapq.heappush(heap, (ends[k], _TRANSFER_END, counts[_SEQUENCE], counts[_TRANSFERS] - sent + k))
                counts[_SEQUENCE] += 1
        nxt = _arrive(nxt, t, arrived, routes, req, ins, entry, least_loaded, counts, touched)
        if any_shared:
            _touch_sharers(touched, slot_low, slot_high)
        # instances sharing devices take turns: the least recently served first
        order = np.argsort(served, kind="mergesort") if any_shared else np.arange(nins)
        for i in order:
            if not touched[i]:
                continue
            touched[i] = False
            if _slot_free(stage_free, slot, ins[i, FIRST_STAGE]) > t or ins[i, IN_FLIGHT] >= ins[i, STAGES]:
                continue
            if counts[_ROWS] + stages > rows.shape[0] or counts[_BATCHES] + 1 > batches.shape[0]:
                rows, batches = _room(rows, counts[_ROWS] + stages), _room(batches, counts[_BATCHES] + 1)
            if counts[_MEMBERS] + grow > members.shape[0] or counts[_CHUNKS] + grow > chunks_of.shape[0]:
                members = _room_1d(members, counts[_MEMBERS] + grow)
                chunks_of = _room_1d(chunks_of, counts[_CHUNKS] + grow)
            if counts[_KV_LOG] + 1 > kv_log.shape[0] or counts[_MOVES] + grow + stages > moves.shape[0]:
                kv_log, moves = _room(kv_log, counts[_KV_LOG] + 1), _room(moves, counts[_MOVES] + grow + stages)
            preempt_log = _room(preempt_log, counts[_PREEMPT_LOG] + 1)
            loaded, yielding = False, False
            if group[i] >= 0:
                held = _hold(i, t, ins, group, resident, stage_free, slot, load_s, load_bytes, load_from, device,
                             moves, counts, since)
                if held < 0:
                    continue
                loaded = held > 0
                yielding = t >= since[group[i]] + quantum[i] and _others_wait(i, ins, group)
            if yielding:  # it admits no new request: its waiting ones are set aside for this batch
                head, tail, count = ins[i, HEAD + WAITING], ins[i, TAIL + WAITING], ins[i, COUNT + WAITING]
                ins[i, HEAD + WAITING], ins[i, TAIL + WAITING], ins[i, COUNT + WAITING] = -1, -1, 0
            b = _form(i, t, req, times, ins, stage_free, slot, terms, token_s, send_s, sample_s, device, kv_bytes,
                      spec, settings, host_free, rows, batches, members, chunks_of, kv_log, moves, counts, plan_rows,
                      plan_chunks, swaps, swap_kind, plan, ends, preempt_log, preemption)
            if yielding:
                _rejoin(req, ins, i, head, tail, count)
            if b >= 0:  # its end on the last stage, and stage 0 free for the next
                served[i] = b
                heapq.heappush(heap, (ends[0], _BATCH_END, counts[_SEQUENCE], b))
                heapq.heappush(heap, (ends[1], _STAGE_FREE, counts[_SEQUENCE] + 1, i))
                counts[_SEQUENCE] += 2
            elif loaded:  # its weights arrive with nothing to run yet: look again then
                heapq.heappush(heap, (_slot_free(stage_free, slot, ins[i, FIRST_STAGE]), _STAGE_FREE,
                                      counts[_SEQUENCE], i))
                counts[_SEQUENCE] += 1
    return rows, batches, members, kv_log, moves, preempt_log, counts


@njit(cache=True)
def _room(buf, rows):
    """``buf`` (a table), or a copy with room for ``rows`` rows."""
    if rows <= buf.shape[0]:
        return buf
    bigger = np.empty((max(rows, 2 * buf.shape[0]), buf.shape[1]), buf.dtype)
    bigger[:buf.shape[0]] = buf
    return bigger


@njit(cache=True)
def _room_1d(buf, size):
    """``buf`` (a column), or a copy with room for ``size`` values."""
    if size <= buf.shape[0]:
        return buf
    bigger = np.empty(max(size, 2 * buf.shape[0]), buf.dtype)
    bigger[:buf.shape[0]] = buf
    return bigger


@njit(cache=True, _nrt=False)
def _slot_free(stage_free, slot, g):
    """When every slot stage g occupies is free."""
    free = stage_free[slot[g, 0]]
    for k in range(1, slot[g, 1]):
        free = max(free, stage_free[slot[g, 0] + k])
    return free


@njit(cache=True, _nrt=False)
def _occupy(stage_free, slot, g, until):
    """Stage g holds its slots until ``until``."""
    for k in range(slot[g, 1]):
        stage_free[slot[g, 0] + k] = until


@njit(cache=True, _nrt=False)
def _slot_range(ins, slot, i):
    """The slots instance i's stages occupy: [first, end)."""
    low, high = slot[ins[i, FIRST_STAGE], 0], 0
    for g in range(ins[i, FIRST_STAGE], ins[i, FIRST_STAGE] + ins[i, STAGES]):
        low, high = min(low, slot[g, 0]), max(high, slot[g, 0] + slot[g, 1])
    return low, high


@njit(cache=True, _nrt=False)
def _touch_sharers(touched, slot_low, slot_high):
    """Every instance on a touched instance's devices is touched too: a slot one frees or a
    swap group one leaves may start another's batch."""
    nins = touched.shape[0]
    for i in range(nins):
        if not touched[i]:
            continue
        for j in range(nins):
            if slot_low[j] < slot_high[i] and slot_low[i] < slot_high[j]:
                touched[j] = True


@njit(cache=True, _nrt=False)
def _hold(i, t, ins, group, resident, stage_free, slot, load_s, load_bytes, load_from, device, moves, counts,
          since):
    """Instance i's weights on its devices at t: 0 when they are there, 1 when they are
    loaded now (stage by stage, each after its slot frees), -1 when the resident instance of
    its swap group still holds KV blocks or a batch in flight, or i has no request."""
    h = resident[group[i]]
    if h == i:
        return 0
    if ins[h, USED] > 0 or ins[h, IN_FLIGHT] > 0 or ins[i, UNFINISHED] == 0:
        return -1
    resident[group[i]] = i
    arrived = t
    for g in range(ins[i, FIRST_STAGE], ins[i, FIRST_STAGE] + ins[i, STAGES]):
        begin = max(t, _slot_free(stage_free, slot, g))
        _occupy(stage_free, slot, g, begin + load_s[g])
        arrived = max(arrived, begin + load_s[g])
        _log_move(moves, counts, -1, i, _WEIGHTS, load_from[i], device[g], load_bytes[g], begin, begin + load_s[g])
    since[group[i]] = arrived
    return 1


@njit(cache=True, _nrt=False)
def _others_wait(i, ins, group):
    """Another instance of i's swap group has requests."""
    for j in range(ins.shape[0]):
        if j != i and group[j] == group[i] and ins[j, UNFINISHED] > 0:
            return True
    return False


@njit(cache=True, _nrt=False)
def _rejoin(req, ins, i, head, tail, count):
    """Instance i's waiting queue as the batch left it, followed by the ``count`` requests
    set aside (``head`` to ``tail``)."""
    if count == 0:
        return
    last = ins[i, TAIL + WAITING]
    if last >= 0:
        req[last, NEXT] = head
        req[head, PREV] = last
    else:
        ins[i, HEAD + WAITING] = head
    ins[i, TAIL + WAITING] = tail
    ins[i, COUNT + WAITING] += count


@njit(cache=True, _nrt=False)
def _arrive(nxt, t, arrived, routes, req, ins, entry, least_loaded, counts, touched):
    """Route the requests arriving at t, from trace row ``nxt`` on (to ``routes[row]`` where
    it names one); the next row to arrive."""
    while nxt < arrived.shape[0] and arrived[nxt] == t:
        i = routes[nxt] if routes[nxt] >= 0 else _route(entry, ins, least_loaded, counts, _TURN_ENTRY)
        push_back(req, ins, i, WAITING, nxt)
        ins[i, UNFINISHED] += 1
        req[nxt, INSTANCE] = i
        touched[i] = True
        nxt += 1
    return nxt


@njit(cache=True, _nrt=False)
def _route(candidates, ins, least_loaded, counts, turn):
    """The instance a request goes to: round-robin, or the fewest unfinished (lowest index on a tie)."""
    if least_loaded:
        best = candidates[0]
        for i in candidates:
            if ins[i, UNFINISHED] < ins[best, UNFINISHED]:
                best = i
        return best
    counts[turn] += 1
    return candidates[(counts[turn] - 1) % candidates.shape[0]]


@njit(cache=True, _nrt=False)
def _log_kv(kv_log, counts, i, t, ins):
    row = counts[_KV_LOG]
    kv_log[row, 0] = i
    kv_log[row, 1] = t
    kv_log[row, 2] = ins[i, USED]
    counts[_KV_LOG] += 1


@njit(cache=True, _nrt=False)
def _log_move(moves, counts, r, i, kind, src, dst, nbytes, start, end):
    row = counts[_MOVES]
    moves[row, 0], moves[row, 1], moves[row, 2], moves[row, 3] = r, kind, src, dst
    moves[row, 4], moves[row, 5], moves[row, 6], moves[row, 7] = nbytes, start, end, i
    counts[_MOVES] += 1


@njit(cache=True, _nrt=False)
def _event(priority, payload, t, req, times, token_offsets, token_times, ins, batches, members, chunks_of, kv_log,
           moves, transfers, counts, touched, device, kv_bytes, link_latency, link_bandwidth, link_free, decode,
           least_loaded, going, ends, preemption):
    """One event: a batch ends (its tokens are made), a KV transfer ends, or a stage 0 frees.
    Returns how many KV caches a prefill instance's batch sent (their ends in ``ends``)."""
    if priority == _BATCH_END:
        i = batches[payload, 0]
        sent = end_batch(payload, t, req, times, token_offsets, token_times, ins, batches, members, chunks_of, going)
        _rebuilt(payload, t, req, batches, members, preemption)
        _log_kv(kv_log, counts, i, t, ins)
        touched[i] = True
        for k in range(sent):
            ends[k] = _send(going[k], i, t, req, ins, moves, transfers, counts, device, kv_bytes, link_latency,
                            link_bandwidth, link_free, decode, least_loaded)
        return sent
    if priority == _TRANSFER_END:
        r, src, dst = transfers[payload, 0], transfers[payload, 1], transfers[payload, 2]
        release(req, ins, src, r)
        _log_kv(kv_log, counts, src, t, ins)
        push_back(req, ins, dst, INCOMING, r)
        touched[src] = True
        touched[dst] = True
    else:
        touched[payload] = True
    return 0


@njit(cache=True, _nrt=False)
def end_batch(b, t, req, times, token_offsets, token_times, ins, batches, members, chunks_of, going):
    """The batch's tokens are made: its requests go on, finish, or (from a prefill instance)
    leave for a decode instance (written to ``going``; returns how many)."""
    i, first, decodes, prefills = batches[b, 0], batches[b, 1], batches[b, 2], batches[b, 3]
    chunk = batches[b, 4] - first - decodes  # the chunk column's row of member k is chunk + k
    ins[i, IN_FLIGHT] -= 1
    sent = 0
    for k in range(first, first + decodes + prefills):
        r = members[k]
        req[r, CACHED] += 1 if k < first + decodes else chunks_of[chunk + k]
        if req[r, CACHED] < req[r, TARGET]:  # a prefill chunk, not its prompt's last
            push_back(req, ins, i, PARTIAL, r)
            continue
        req[r, MADE] += 1
        token_times[token_offsets[r] + req[r, MADE] - 1] = t
        if req[r, MADE] == 1:
            times[r, FIRST_TOKEN_AT] = t
        if req[r, MADE] == req[r, OUT]:
            times[r, FINISHED_AT] = t
            release(req, ins, i, r)
            ins[i, RUNNING] -= 1
            ins[i, UNFINISHED] -= 1
        elif ins[i, KIND] == PREFILL:
            going[sent] = r
            sent += 1
        else:
            req[r, COHORT] = b
            push_back(req, ins, i, AVAILABLE, r)
    return sent


@njit(cache=True, _nrt=False)
def _rebuilt(b, t, req, batches, members, preemption):
    """The preempted requests of batch b whose prefill has rebuilt the cache they lost: their
    recompute, and their preemption, end at t."""
    first, prefills = batches[b, 1] + batches[b, 2], batches[b, 3]
    for k in range(first, first + prefills):
        r = members[k]
        if np.isnan(preemption[r, RECOMPUTE_FROM]) or req[r, CACHED] < req[r, LOST]:
            continue
        preemption[r, RECOMPUTE_S] += t - preemption[r, RECOMPUTE_FROM]
        preemption[r, PREEMPTED_S] += t - preemption[r, PREEMPTED_AT]
        preemption[r, PREEMPTED_AT] = np.nan
        preemption[r, RECOMPUTE_FROM] = np.nan
        req[r, LOST] = 0


@njit(cache=True, _nrt=False)
def _preempted(preemption, r, t):
    """Request r is preempted at t: its preemption opens (a recompute in progress, preempted
    again, ends its recompute part there and waits again)."""
    if np.isnan(preemption[r, PREEMPTED_AT]):
        preemption[r, PREEMPTED_AT] = t
    elif not np.isnan(preemption[r, RECOMPUTE_FROM]):
        preemption[r, RECOMPUTE_S] += t - preemption[r, RECOMPUTE_FROM]
        preemption[r, RECOMPUTE_FROM] = np.nan
    preemption[r, QUEUE_FROM] = t


@njit(cache=True, _nrt=False)
def _send(r, src, t, req, ins, moves, transfers, counts, device, kv_bytes, link_latency, link_bandwidth, link_free,
          decode, least_loaded):
    """Send request r's KV cache from prefill instance ``src`` to a decode instance; when it arrives."""
    dst = _route(decode, ins, least_loaded, counts, _TURN_DECODE)
    nbytes = req[r, CACHED] * kv_bytes[src]
    begin = max(t, link_free[src, dst])
    end = begin + link_latency[src, dst] + nbytes / link_bandwidth[src, dst]  # Deployment.transfer_s
    link_free[src, dst] = end
    last_stage = ins[src, FIRST_STAGE] + ins[src, STAGES] - 1
    _log_move(moves, counts, r, src, _TRANSFER, device[last_stage], device[ins[dst, FIRST_STAGE]], nbytes, begin, end)
    transfers[counts[_TRANSFERS], 0] = r
    transfers[counts[_TRANSFERS], 1] = src
    transfers[counts[_TRANSFERS], 2] = dst
    counts[_TRANSFERS] += 1
    ins[src, RUNNING] -= 1
    ins[src, UNFINISHED] -= 1
    ins[dst, UNFINISHED] += 1
    req[r, INSTANCE] = dst
    return end


@njit(cache=True, _nrt=False)
def _form(i, t, req, times, ins, stage_free, slot, terms, token_s, send_s, sample_s, device, kv_bytes, spec, settings,
          host_free, rows, batches, members, chunks_of, kv_log, moves, counts, plan_rows, plan_chunks, swaps,
          swap_kind, plan, ends, preempt_log, preemption):
    """Start instance i's next batch at t, if its scheduler finds one: its index (its end on
    the last stage and on stage 0 in ``ends``), or -1."""
    select_batch(spec, req, ins, i, plan_rows, plan_chunks, swaps, swap_kind, plan)
    if plan[VICTIMS] > 0:
        row = counts[_PREEMPT_LOG]
        preempt_log[row, 0], preempt_log[row, 1], preempt_log[row, 2] = i, t, plan[VICTIMS]
        counts[_PREEMPT_LOG] += 1
    start = _swaps(i, t, req, ins, terms, device, kv_bytes, settings, host_free, moves, counts, swaps, swap_kind,
                   plan, preemption)
    _log_kv(kv_log, counts, i, t, ins)
    decodes, prefills = plan[DECODES], plan[PREFILLS]
    if decodes + prefills == 0:
        return -1
    b, m = counts[_BATCHES], counts[_MEMBERS]
    attention, kv_tokens, prefill_tokens, sampled = 0.0, 0, 0, decodes
    for k in range(decodes + prefills):
        r, c = plan_rows[k], plan_chunks[k]
        members[m + k] = r
        if k < decodes:
            kv_tokens += req[r, CACHED] + 1
        else:
            chunks_of[counts[_CHUNKS] + k - decodes] = c
            attention += c * (req[r, CACHED] + c)
            prefill_tokens += c
            if req[r, CACHED] + c == req[r, TARGET]:
                sampled += 1
    batches[b, 0], batches[b, 1], batches[b, 2] = i, m, decodes
    batches[b, 3], batches[b, 4] = prefills, counts[_CHUNKS]
    counts[_CHUNKS] += prefills
    counts[_BATCHES] += 1
    counts[_MEMBERS] += decodes + prefills
    ends[0] = _stages(i, b, start, ins, stage_free, slot, terms, token_s, send_s, sample_s, device, rows, counts,
                      prefill_tokens, decodes, attention, kv_tokens, sampled)
    ends[1] = _slot_free(stage_free, slot, ins[i, FIRST_STAGE])
    stage0_start = rows[counts[_ROWS] - ins[i, STAGES], 4]
    for k in range(decodes, decodes + prefills):
        r = plan_rows[k]
        if np.isnan(times[r, SCHEDULED_AT]):
            times[r, SCHEDULED_AT] = stage0_start
        if not np.isnan(preemption[r, PREEMPTED_AT]) and np.isnan(preemption[r, RECOMPUTE_FROM]):
            preemption[r, QUEUEING_S] += stage0_start - preemption[r, QUEUE_FROM]  # its cache's rebuild starts
            preemption[r, RECOMPUTE_FROM] = stage0_start
    ins[i, IN_FLIGHT] += 1
    return b


@njit(cache=True, _nrt=False)
def _stages(i, b, start, ins, stage_free, slot, terms, token_s, send_s, sample_s, device, rows, counts, prefill_tokens,
            decodes, attention, kv_tokens, sampled):
    """Run batch b through instance i's stages from ``start``, each after its last batch; its end."""
    tokens = prefill_tokens + decodes
    ready, end = start, start
    for g in range(ins[i, FIRST_STAGE], ins[i, FIRST_STAGE] + ins[i, STAGES]):
        begin = max(ready, _slot_free(stage_free, slot, g))
        compute = _seconds(terms[g, _BASE], token_s[g, tokens], terms[g, _ATTENTION], attention, terms[g, _DECODE],
                           decodes, terms[g, _KV], kv_tokens, sample_s[g, sampled])
        end = begin + _streamed(compute, terms[g, _BLOCKS], terms[g, _STREAMED], terms[g, _BLOCK_LOAD])
        _occupy(stage_free, slot, g, end)
        flops = _flops(terms[g, _FLOPS_TOKEN], tokens, terms[g, _FLOPS_ATTENTION], attention, kv_tokens)
        row = counts[_ROWS]
        rows[row, 0], rows[row, 1], rows[row, 2], rows[row, 3] = b, i, g - ins[i, FIRST_STAGE], device[g]
        rows[row, 4], rows[row, 5], rows[row, 6], rows[row, 7] = begin, end, prefill_tokens, decodes
        ready = end + send_s[g, tokens]
        rows[row, 8], rows[row, 9], rows[row, 10], rows[row, 11] = kv_tokens, flops, ready, tokens * terms[g, _HIDDEN]
        counts[_ROWS] += 1
    return end


@njit(cache=True, _nrt=False)
def _swaps(i, t, req, ins, terms, device, kv_bytes, settings, host_free, moves, counts, swaps, swap_kind, plan,
           preemption):
    """Move the plan's swapped caches over instance i's host link (out at its device -> host
    bandwidth, in at host -> device), each after the one before; when its batch may start.
    Each victim's preemption opens; a swap-in closes it."""
    start = t + settings[_OVERHEAD]
    first = ins[i, FIRST_STAGE]
    per_device = 0.0  # bytes per token on the stage's devices that hold the most
    for g in range(first, first + ins[i, STAGES]):
        per_device = max(per_device, terms[g, _KV_DEVICE])
    for k in range(plan[SWAPS]):
        r, kind = swaps[k], swap_kind[k]
        if kind != SWAP_IN:
            _preempted(preemption, r, t)
        if kind == DROPPED:
            continue
        tokens = req[r, CACHED]
        begin = max(t, host_free[i])
        bandwidth = settings[_HOST_WRITE_BANDWIDTH] if kind == SWAP_OUT else settings[_HOST_BANDWIDTH]
        host_free[i] = begin + settings[_HOST_LATENCY] + per_device * tokens / bandwidth
        src, dst = (device[first], _HOST) if kind == SWAP_OUT else (_HOST, device[first])
        _log_move(moves, counts, r, i, 1 + kind, src, dst, kv_bytes[i] * tokens, begin, host_free[i])
        start = max(start, host_free[i])
        preemption[r, QUEUEING_S] += begin - preemption[r, QUEUE_FROM]
        preemption[r, SAVE_S if kind == SWAP_OUT else RELOAD_S] += host_free[i] - begin
        preemption[r, QUEUE_FROM] = host_free[i]
        if kind == SWAP_IN:
            preemption[r, PREEMPTED_S] += host_free[i] - preemption[r, PREEMPTED_AT]
            preemption[r, PREEMPTED_AT] = np.nan
    return start


def _result(deployment: Deployment, trace: Trace, tables: _Tables, logs: tuple) -> ServeRun:
    rows, batches, members, kv_log, moves, preempt_log, counts = logs
    req, times = tables.req, tables.times
    stuck = np.flatnonzero(np.isnan(times[:, FINISHED_AT]))
    if stuck.size:
        r = int(stuck[0])
        capacity = int(tables.ins[max(int(req[r, INSTANCE]), 0), CAPACITY])
        raise PipeschedError(f"kv_capacity_blocks={capacity}: request {r} never got the KV blocks it needs; "
                             "give the cache more memory or shorten the requests")
    config, plans = deployment.config, deployment.instances
    return ServeRun(
        trace=trace, config=config, instance=req[:, INSTANCE].astype(np.int32),
        scheduled_at=times[:, SCHEDULED_AT].copy(), first_token_at=times[:, FIRST_TOKEN_AT].copy(),
        finished_at=times[:, FINISHED_AT].copy(), preemptions=req[:, PREEMPTED].astype(np.int32),
        token_times=tables.token_times, token_offsets=tables.token_offsets,
        iterations=_iteration_log(rows[:counts[_ROWS]], batches[:counts[_BATCHES]], members[:counts[_MEMBERS]]),
        kv=_kv_trace(kv_log[:counts[_KV_LOG]], preempt_log[:counts[_PREEMPT_LOG]], tables, config.kv.block_size),
        instance_kind=tuple(plan.kind for plan in plans),
        instance_devices=tuple(tuple(plan.devices) for plan in plans),
        tp=tuple(plan.tp for plan in plans), peak_flops=deployment.peak_flops,
        moves=_moves(moves[:counts[_MOVES]]),
        kv_bytes_per_token=tuple(tuple(costs.kv_bytes_per_token for costs in plan.stages) for plan in plans),
        preemption_s=tables.preemption[:, [SAVE_S, RELOAD_S, RECOMPUTE_S, QUEUEING_S, PREEMPTED_S]].copy())


def _iteration_log(rows: np.ndarray, batches: np.ndarray, members: np.ndarray) -> IterationLog:
    offsets = np.zeros(batches.shape[0] + 1, np.int64)
    np.cumsum(batches[:, 2] + batches[:, 3], out=offsets[1:])
    ints = rows.astype(np.int64)
    return IterationLog(
        batch=ints[:, 0], instance=ints[:, 1].astype(np.int32), stage=ints[:, 2].astype(np.int32),
        first_device=ints[:, 3].astype(np.int32), start=rows[:, 4].copy(), end=rows[:, 5].copy(),
        prefill_tokens=ints[:, 6], decodes=ints[:, 7], kv_tokens=ints[:, 8], flops=rows[:, 9].copy(),
        members=members, offsets=offsets, send_end=rows[:, 10].copy(), send_bytes=rows[:, 11].copy())


def _kv_trace(kv_log: np.ndarray, preempt_log: np.ndarray, tables: _Tables, block_size: int) -> KVTrace:
    """Blocks in use per instance from each time on (the last change at a time kept), and
    each preemption's time (one per request preempted, in time order)."""
    times, blocks, preempted = [], [], []
    for i in range(tables.ins.shape[0]):
        events = preempt_log[preempt_log[:, 0] == i]
        preempted.append(np.repeat(events[:, 1], events[:, 2].astype(np.int64)))
        mine = kv_log[kv_log[:, 0] == i]
        t = np.concatenate(([0.0], mine[:, 1]))
        used = np.concatenate(([0], mine[:, 2].astype(np.int64)))
        last = np.append(t[1:] != t[:-1], True)
        times.append(t[last])
        blocks.append(used[last])
    return KVTrace(tuple(times), tuple(blocks), tuple(int(c) for c in tables.ins[:, CAPACITY]), block_size,
                   preempted_at=tuple(preempted))


def _moves(moves: np.ndarray) -> KVMoves:
    if moves.shape[0] == 0:
        return KVMoves.empty()
    return KVMoves(moves[:, 0].astype(np.int64), tuple(_MOVE_KINDS[int(k)] for k in moves[:, 1]),
                   moves[:, 2].astype(np.int32), moves[:, 3].astype(np.int32), moves[:, 4].copy(),
                   moves[:, 5].copy(), moves[:, 6].copy(), instance=moves[:, 7].astype(np.int32))
