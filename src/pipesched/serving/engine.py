"""The discrete-event run of a serving trace on a deployment: ``simulate_serving`` -> ``ServeRun``.

Instances and pipeline parallelism. Each instance is a pipeline of p stages with at most p
batches in flight (vLLM's virtual engines, Vidur's replica stage scheduler). A new batch
forms when stage 0 is free and fewer than p batches are in flight, from the requests no
batch in flight holds (``schedulers.select_batch``). It pays ``config.cpu_overhead_s``
(scheduling and launch on the host) and any swap of KV caches to or from host memory,
then runs stage 0, sends its hidden state of T tokens to stage 1 (``send_s[T]``), runs
stage 1, and so on; each stage serves batches in the order they formed. A stage's time is
``StageIterationCosts.time(T, A, D, K, n)`` of the batch: T = prefill chunk tokens + D
decodes, A = sum over chunks c after x cached tokens of c x (x + c), K = sum over decodes
of the tokens their attention reads (the tokens cached before the step, + 1 for the new
one), n = tokens the batch makes (sampled on the last stage). Every (batch, stage) is a
row of the ``IterationLog``, so a stage idle between two batches of different times (the
pipeline bubble) shows as a gap between its rows.

Tokens. A batch's tokens are made when it ends on the last stage: one per decode, and one
per prefill whose chunk was its prompt's last (the first output token, or after a
recompute the next one). A request's token times are the ends of the batches that made
them; it finishes with its last token and frees its KV blocks then.

Events, in time order; at one time: batch ends, then KV transfers ending, then arrivals,
then stage 0 becoming free; batches then form on the instances those touched, in index
order. Ties break by the order events were made: the same inputs give the same run.

Routing (``config.routing``): an arriving request goes to a replica (or a prefill
instance) round-robin or to the one with the fewest unfinished requests (lowest index on a
tie); when disaggregated, a request whose prompt is prefilled goes the same way to a
decode instance: its first token is made, its KV cache (prompt tokens x
``kv_bytes_per_token``) sent over ``Deployment.transfer_s`` (the transfers between one
pair of instances one after the other, ``KVMoves`` "transfer"), its blocks on the prefill
instance freed when the transfer ends, and it joins the decode instance's batches then.

Swap preemption moves a request's cache (its tokens x the largest per-device
``kv_bytes_per_token`` of the stages, all devices in parallel) over ``deployment.host_link``,
one move after the other per instance, before the batch that needs the room (swap-out) or
the request back (swap-in) starts.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from pipesched.enums import Routing
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_SERVED_TOKENS, check_count
from pipesched.serving.deployment import Deployment
from pipesched.serving.kv_cache import PagedKVCache
from pipesched.serving.records import IterationLog, KVMoves, KVTrace, ServeRun
from pipesched.serving.schedulers import Plan, select_batch
from pipesched.serving.state import InstanceState, Requests
from pipesched.serving.trace import Trace

# event priorities at one time
_BATCH_END, _TRANSFER_END, _STAGE_FREE = 0, 1, 2
_HOST = -1  # device of host memory in KVMoves


def simulate_serving(deployment: Deployment, trace: Trace) -> ServeRun:
    """Every request of ``trace`` served on ``deployment`` (module docstring)."""
    _check(deployment, trace)
    run = _Run(deployment, trace)
    run.loop()
    return run.result()


def _check(deployment: Deployment, trace: Trace) -> None:
    spec = deployment.config.scheduler
    check_count("output_tokens", int(trace.decode_tokens.sum()), MAX_SERVED_TOKENS, what="output tokens of a trace")
    longest = int(np.argmax(trace.total_tokens))
    require(int(trace.total_tokens[longest]) <= deployment.max_context, "num_prefill_tokens",
            int(trace.prefill_tokens[longest]), f"request {longest}'s prompt + output "
            f"({int(trace.total_tokens[longest]):,} tokens) is over the model's context length "
            f"{deployment.max_context:,}; shorten it")
    block = deployment.config.kv.block_size
    for plan in deployment.instances:
        blocks = -(-int(trace.total_tokens[longest]) // block)
        require(plan.kv_capacity_blocks >= blocks, "kv_capacity_blocks", plan.kv_capacity_blocks,
                f"a {plan.kind} instance's KV cache cannot hold request {longest} alone ({blocks:,} blocks "
                "needed); give more memory to the cache, more devices per stage or shorter requests")
        for costs in plan.stages:
            require(costs.max_tokens >= spec.token_budget and costs.max_batch >= spec.max_batch, "stage_costs",
                    f"{costs.max_tokens} tokens, {costs.max_batch} sequences",
                    f"build the stage costs for {spec.token_budget} tokens and {spec.max_batch} sequences")


class _Run:
    """The state of one run: requests, instances, the event heap and the logs."""

    def __init__(self, deployment: Deployment, trace: Trace) -> None:
        self.deployment = deployment
        self.config = deployment.config
        self.trace = trace
        self.reqs = Requests(trace)
        block = self.config.kv.block_size
        self.insts = [InstanceState(i, plan, PagedKVCache(plan.kv_capacity_blocks, block, self.reqs.held))
                      for i, plan in enumerate(deployment.instances)]
        self.entry = [i for i, plan in enumerate(deployment.instances) if plan.kind != "decode"]
        self.decode = [i for i, plan in enumerate(deployment.instances) if plan.kind == "decode"]
        self.turn = {"entry": 0, "decode": 0}  # round-robin counters
        self.heap: list[tuple[float, int, int, int]] = []  # (time, priority, sequence, payload)
        self.seq = 0
        self.batches = _BatchLog()
        self.moves = _MoveLog()
        self.link_free: dict[tuple[int, int], float] = {}  # KV transfers between instances
        self.transfers: list[tuple[int, int, int]] = []  # (request, source, destination)

    def push(self, time: float, priority: int, payload: int) -> None:
        heapq.heappush(self.heap, (time, priority, self.seq, payload))
        self.seq += 1

    def loop(self) -> None:
        arrived = self.trace.arrived_at
        n = len(self.trace)
        nxt = 0
        while True:
            t = min(self.heap[0][0] if self.heap else math.inf, arrived[nxt] if nxt < n else math.inf)
            if t == math.inf:
                return
            touched: set[int] = set()
            while self.heap and self.heap[0][0] == t:
                _, priority, _, payload = heapq.heappop(self.heap)
                touched.update(self.handle(priority, payload, t))
            while nxt < n and arrived[nxt] == t:
                touched.add(self.arrive(nxt))
                nxt += 1
            for i in sorted(touched):
                self.form(self.insts[i], t)

    def handle(self, priority: int, payload: int, now: float) -> tuple[int, ...]:
        if priority == _BATCH_END:
            return self.end_batch(payload, now)
        if priority == _TRANSFER_END:
            r, src, dst = self.transfers[payload]
            self.insts[src].cache.release(r, now)
            self.insts[dst].incoming.append(r)
            return (src, dst)
        return (payload,)

    def route(self, group: str, candidates: list[int]) -> int:
        if self.config.routing == Routing.LEAST_LOADED:
            return min(candidates, key=lambda i: (self.insts[i].unfinished, i))
        turn = self.turn[group]
        self.turn[group] = turn + 1
        return candidates[turn % len(candidates)]

    def arrive(self, r: int) -> int:
        i = self.route("entry", self.entry)
        inst = self.insts[i]
        inst.waiting.append(r)
        inst.unfinished += 1
        self.reqs.instance[r] = i
        return i

    def form(self, inst: InstanceState, now: float) -> None:
        """Start the instance's next batch if its stage 0 is free and it may have one more in flight."""
        if inst.stage_free[0] > now or inst.in_flight >= inst.p:
            return
        plan = select_batch(self.config.scheduler, inst, self.reqs, now)
        start = self.swaps(inst, plan, now, now + self.config.cpu_overhead_s)
        if plan.empty:
            return
        end, stage0_end = self.batches.add(inst, plan, self.reqs, start)
        fresh = plan.prefill[np.isnan(self.reqs.scheduled_at[plan.prefill])]
        self.reqs.scheduled_at[fresh] = self.batches.stage0_start
        inst.in_flight += 1
        self.push(end, _BATCH_END, len(self.batches.instance) - 1)
        self.push(stage0_end, _STAGE_FREE, inst.index)

    def swaps(self, inst: InstanceState, plan: Plan, now: float, start: float) -> float:
        """Move the plan's swapped caches over the host link; when the batch may start."""
        if not plan.swap_out and not plan.swap_in:
            return start
        per_device = max(costs.kv_bytes_per_token for costs in inst.plan.stages)
        link = self.deployment.host_link
        device = inst.plan.devices[0]
        for kind, rows, src, dst in (("swap-out", plan.swap_out, device, _HOST),
                                     ("swap-in", plan.swap_in, _HOST, device)):
            for r in rows:
                tokens = float(self.reqs.cached[r])
                begin = max(now, inst.host_free)
                inst.host_free = begin + link.transfer_time(per_device * tokens)
                self.moves.add(r, kind, src, dst, inst.plan.kv_bytes_per_token * tokens, begin, inst.host_free)
        return max(start, inst.host_free)

    def end_batch(self, b: int, now: float) -> tuple[int, ...]:
        """The batch's tokens are made: requests go on, finish, or leave for a decode instance."""
        reqs = self.reqs
        inst = self.insts[self.batches.instance[b]]
        inst.in_flight -= 1
        dec, pre, chunks = self.batches.decodes[b], self.batches.prefill[b], self.batches.chunks[b]
        reqs.cached[dec] += 1
        if pre.size:
            reqs.cached[pre] += chunks
            done = reqs.cached[pre] == reqs.target[pre]
            inst.partial.extend(int(r) for r in pre[~done])
            made = np.concatenate((dec, pre[done]))
        else:
            made = dec
        reqs.made[made] += 1
        reqs.token_times[reqs.token_offsets[made] + reqs.made[made] - 1] = now
        first = made[reqs.made[made] == 1]
        reqs.first_token_at[first] = now
        over = reqs.made[made] == reqs.out[made]
        finished, going = made[over], made[~over]
        if finished.size:
            reqs.finished_at[finished] = now
            inst.cache.release(finished, now)
            inst.running -= finished.size
            self.release_unfinished(finished)
        if inst.kind == "prefill":
            return (inst.index, *(self.send(int(r), inst, now) for r in going))
        if going.size:
            inst.available.append(going)
        return (inst.index,)

    def release_unfinished(self, finished: np.ndarray) -> None:
        owners, counts = np.unique(self.reqs.instance[finished], return_counts=True)
        for i, c in zip(owners.tolist(), counts.tolist(), strict=True):
            self.insts[i].unfinished -= c

    def send(self, r: int, src: InstanceState, now: float) -> int:
        """Send request r's KV cache from prefill instance ``src`` to a decode instance."""
        dst = self.route("decode", self.decode)
        nbytes = float(self.reqs.cached[r]) * src.plan.kv_bytes_per_token
        begin = max(now, self.link_free.get((src.index, dst), 0.0))
        end = begin + self.deployment.transfer_s(src.index, dst, nbytes)
        self.link_free[(src.index, dst)] = end
        self.moves.add(r, "transfer", src.plan.devices[-1], self.insts[dst].plan.devices[0], nbytes, begin, end)
        self.transfers.append((r, src.index, dst))
        self.push(end, _TRANSFER_END, len(self.transfers) - 1)
        src.running -= 1
        src.unfinished -= 1
        self.insts[dst].unfinished += 1
        self.reqs.instance[r] = dst
        return src.index

    def result(self) -> ServeRun:
        reqs = self.reqs
        stuck = np.flatnonzero(np.isnan(reqs.finished_at))
        if stuck.size:
            r = int(stuck[0])
            raise PipeschedError(f"kv_capacity_blocks={self.insts[reqs.instance[r]].cache.capacity}: request {r} "
                                 "never got the KV blocks it needs; give the cache more memory or shorter requests")
        caches = [inst.cache for inst in self.insts]
        traces = [cache.trace() for cache in caches]
        plans = self.deployment.instances
        return ServeRun(
            trace=self.trace, config=self.config, instance=reqs.instance, scheduled_at=reqs.scheduled_at,
            first_token_at=reqs.first_token_at, finished_at=reqs.finished_at, preemptions=reqs.preemptions,
            token_times=reqs.token_times, token_offsets=reqs.token_offsets, iterations=self.batches.log(),
            kv=KVTrace(tuple(t for t, _ in traces), tuple(b for _, b in traces),
                       tuple(cache.capacity for cache in caches), self.config.kv.block_size,
                       preempted_at=tuple(np.asarray(inst.preempted_at, np.float64) for inst in self.insts)),
            instance_kind=tuple(plan.kind for plan in plans),
            instance_devices=tuple(tuple(plan.devices) for plan in plans),
            tp=tuple(plan.tp for plan in plans), peak_flops=self.deployment.peak_flops,
            moves=self.moves.log(),
            kv_bytes_per_token=tuple(tuple(costs.kv_bytes_per_token for costs in plan.stages) for plan in plans))


class _BatchLog:
    """Every batch (its requests and chunks) and every (batch, stage) row it ran."""

    def __init__(self) -> None:
        self.instance: list[int] = []
        self.decodes: list[np.ndarray] = []
        self.prefill: list[np.ndarray] = []
        self.chunks: list[np.ndarray] = []
        self.rows: list[tuple[int, int, int, int, float, float, int, int, int, float]] = []
        self.send_end: list[float] = []  # per row: when its hidden state reached the next stage
        self.stage0_start = 0.0

    def add(self, inst: InstanceState, plan: Plan, reqs: Requests, start: float) -> tuple[float, float]:
        """Log the batch on each stage from ``start``; its end on the last stage and on stage 0."""
        pre, chunks, dec = plan.prefill, plan.chunks, plan.decodes
        attention = float(np.dot(chunks, reqs.cached[pre] + chunks)) if pre.size else 0.0
        sampled = dec.size + int(np.count_nonzero(reqs.cached[pre] + chunks == reqs.target[pre]))
        decodes = int(dec.size)
        kv_tokens = int(reqs.cached[dec].sum()) + decodes
        prefill_tokens = int(chunks.sum())
        tokens = prefill_tokens + decodes
        b = len(self.instance)
        ready = start
        end = start
        for s, costs in enumerate(inst.plan.stages):
            begin = max(ready, inst.stage_free[s])
            end = begin + costs.time(tokens, attention, decodes, kv_tokens, sampled)
            inst.stage_free[s] = end
            if s == 0:
                self.stage0_start = begin
            self.rows.append((b, inst.index, s, inst.plan.devices[s], begin, end, prefill_tokens, decodes,
                              kv_tokens, costs.flops(tokens, attention, kv_tokens)))
            ready = end + float(costs.send_s[tokens])
            self.send_end.append(ready)
        self.instance.append(inst.index)
        self.decodes.append(dec)
        self.prefill.append(pre)
        self.chunks.append(chunks)
        return end, inst.stage_free[0]

    def log(self) -> IterationLog:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 10
        members = [np.concatenate((d, p)) for d, p in zip(self.decodes, self.prefill, strict=True)]
        offsets = np.zeros(len(members) + 1, np.int64)
        np.cumsum([m.size for m in members], out=offsets[1:])
        return IterationLog(
            batch=np.asarray(cols[0], np.int64), instance=np.asarray(cols[1], np.int32),
            stage=np.asarray(cols[2], np.int32), first_device=np.asarray(cols[3], np.int32),
            start=np.asarray(cols[4], np.float64), end=np.asarray(cols[5], np.float64),
            prefill_tokens=np.asarray(cols[6], np.int64), decodes=np.asarray(cols[7], np.int64),
            kv_tokens=np.asarray(cols[8], np.int64), flops=np.asarray(cols[9], np.float64),
            members=np.concatenate(members) if members else np.zeros(0, np.int64), offsets=offsets,
            send_end=np.asarray(self.send_end, np.float64))


class _MoveLog:
    """KV caches moved over a link, one row each."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, int, int, float, float, float]] = []

    def add(self, r: int, kind: str, src: int, dst: int, nbytes: float, start: float, end: float) -> None:
        self.rows.append((r, kind, src, dst, nbytes, start, end))

    def log(self) -> KVMoves:
        if not self.rows:
            return KVMoves.empty()
        r, kind, src, dst, nbytes, start, end = zip(*self.rows, strict=True)
        return KVMoves(np.asarray(r, np.int64), tuple(kind), np.asarray(src, np.int32), np.asarray(dst, np.int32),
                       np.asarray(nbytes, np.float64), np.asarray(start, np.float64), np.asarray(end, np.float64))
