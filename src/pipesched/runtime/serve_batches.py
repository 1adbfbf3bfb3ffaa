"""The batches a real serving run's first rank forms: the simulator's own scheduler
(``serving.schedulers.select_batch``) on the simulator's request and instance state, driven
by the wall clock (no torch here).

The real KV cache is preallocated per request slot (``serve_model``): a request takes a
slot when its prefill first joins a batch and keeps it to its last token. The scheduler's
paged cache (``PagedKVCache``) is sized to hold every slot's longest request with the
watermark to spare, so it never preempts: at most ``max_batch`` x p requests run at once
(the scheduler's cap), and that is the number of slots. ``cache_blocks`` is that size; a
prediction of the run gives its deployment the same.

What a batch holds, per request (``BatchEntry``): the tokens already in its cache
(context) and the tokens it feeds, a decode step's one or a prefill chunk; whether it makes
a token (every decode, and the chunk that ends the prompt). Token positions: a prompt of p
tokens fills positions 0..p-1 and makes output token 1; the decode that feeds output token
j sits at position p + j - 1 and reads its p + j cached keys (``kv_read``, the engine's K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.enums import SchedulerName
from pipesched.errors import require
from pipesched.serving.config import SchedulerSpec
from pipesched.serving.deployment import InstancePlan
from pipesched.serving.kv_cache import WATERMARK, PagedKVCache
from pipesched.serving.schedulers import Plan, select_batch
from pipesched.serving.state import InstanceState, Requests
from pipesched.serving.trace import Trace

POLICIES = (SchedulerName.SARATHI, SchedulerName.ORCA, SchedulerName.VLLM)


@dataclass(frozen=True)
class BatchEntry:
    """One request's share of an iteration."""

    request: int  # trace row
    slot: int  # its KV-cache slot on every stage
    context: int  # tokens already in its cache before this iteration
    tokens: int  # tokens it feeds: a prefill chunk, or 1 for a decode step
    emits: bool  # it makes an output token: a decode step, or the chunk that ends its prompt
    decode: bool  # a decode step (else a prefill chunk)

    @property
    def attention(self) -> int:
        """Its share of the prefill attention term: chunk x (context + chunk); 0 for a decode."""
        return 0 if self.decode else self.tokens * (self.context + self.tokens)

    @property
    def kv_read(self) -> int:
        """KV tokens a decode step reads: its cached context and its own key; 0 for a prefill."""
        return self.context + 1 if self.decode else 0


def check_policy(spec: SchedulerSpec, trace: Trace) -> None:
    """Refuse a scheduler the real run does not run, or a prompt its policy can never batch."""
    require(spec.name in POLICIES, "scheduler", spec.name.value,
            f"a real run schedules with {', '.join(p.value for p in POLICIES)} (static batching waits for "
            "whole batches, which the real loop does not do)")


def slot_count(trace: Trace, spec: SchedulerSpec, p: int) -> int:
    """KV slots of a real run: the most requests the scheduler runs at once, at most the trace's."""
    return min(spec.max_batch * p, len(trace))


def cache_blocks(trace: Trace, slots: int, block_size: int) -> int:
    """Blocks the scheduler's paged cache gets: every slot at the trace's longest request,
    and the watermark on top (so it never preempts)."""
    need = slots * -(-int(trace.total_tokens.max()) // block_size)
    return int(np.ceil(need / (1.0 - WATERMARK))) + 1


class RequestStates:
    """The scheduler's state of one replica of ``p`` stages, and the slots of its requests."""

    def __init__(self, trace: Trace, spec: SchedulerSpec, *, p: int, block_size: int) -> None:
        self.spec = spec
        self.reqs = Requests(trace)
        slots = slot_count(trace, spec, p)
        capacity = cache_blocks(trace, slots, block_size)
        plan = InstancePlan(kind="replica", stages=(), devices=tuple(range(p)), tp=1,
                            kv_capacity_blocks=capacity, kv_bytes_per_token=0.0)
        self.inst = InstanceState(0, plan, PagedKVCache(capacity, block_size, self.reqs.held))
        self.inst.p = p  # batches in flight (the plan carries no stage costs here)
        self.arrived = 0  # requests 0..arrived-1 have joined the waiting queue
        self.slot = np.full(len(trace), -1, np.int64)
        self.free_slots = list(range(slots - 1, -1, -1))

    @property
    def done(self) -> bool:
        return not bool(np.isnan(self.reqs.finished_at).any())

    def arrive(self, count: int) -> None:
        """Requests up to row ``count`` have arrived: they wait for the scheduler."""
        for request in range(self.arrived, count):
            self.inst.waiting.append(request)
            self.inst.unfinished += 1
        self.arrived = max(self.arrived, count)

    def next_batch(self, now: float) -> list[BatchEntry]:
        """The next iteration's batch (``select_batch``); [] when nothing can run now."""
        if self.inst.in_flight >= self.inst.p:
            return []
        plan = select_batch(self.spec, self.inst, self.reqs, now)
        require(not plan.swap_out and not plan.swap_in, "kv_capacity_blocks", self.inst.cache.capacity,
                "the real run's cache preempted; it is sized never to")
        if plan.empty:
            return []
        self.inst.in_flight += 1
        return self._entries(plan)

    def _entries(self, plan: Plan) -> list[BatchEntry]:
        reqs = self.reqs
        entries = []
        for r in plan.decodes.tolist():
            entries.append(BatchEntry(r, int(self.slot[r]), int(reqs.cached[r]), 1, True, True))
        for r, chunk in zip(plan.prefill.tolist(), plan.chunks.tolist(), strict=True):
            if self.slot[r] < 0:
                self.slot[r] = self.free_slots.pop()
            context = int(reqs.cached[r])
            entries.append(BatchEntry(r, int(self.slot[r]), context, chunk, context + chunk == reqs.target[r], False))
        return entries

    def complete(self, entries: list[BatchEntry], now: float) -> None:
        """The batch's tokens are back: its requests go on or finish (the engine's batch end)."""
        reqs, inst = self.reqs, self.inst
        inst.in_flight -= 1
        made = []
        for entry in entries:
            r = entry.request
            reqs.cached[r] += entry.tokens
            if entry.emits:
                made.append(r)
            elif not entry.decode:
                inst.partial.append(r)
        rows = np.asarray(made, np.int64)
        reqs.made[rows] += 1
        over = reqs.made[rows] == reqs.out[rows]
        finished, going = rows[over], rows[~over]
        if finished.size:
            reqs.finished_at[finished] = now
            inst.cache.release(finished, now)
            inst.running -= finished.size
            inst.unfinished -= finished.size
            self.free_slots.extend(int(s) for s in self.slot[finished])
        if going.size:
            inst.available.append(going)


def profile_batches(trace: Trace, spec: SchedulerSpec, slots: int) -> list[list[BatchEntry]]:
    """The batch compositions a stage is timed at before a fitted prediction: prefill chunks
    of a few sizes (alone, in pairs, over a cached context), decode batches of a few sizes
    over short and long contexts, and a chunk with decodes; sized to the trace (its longest
    prompt and request, the KV slots) and the scheduler's token budget."""
    longest = int(trace.total_tokens.max())
    chunk = max(1, min(int(trace.prefill_tokens.max()), spec.token_budget))
    sizes = sorted({max(1, chunk // 8), max(1, chunk // 4), max(1, chunk // 2), chunk})
    batches = [[BatchEntry(0, 0, 0, n, True, False)] for n in sizes]
    half = max(1, chunk // 2)
    if chunk >= 2 and slots >= 2:
        batches.append([BatchEntry(0, 0, 0, half, True, False), BatchEntry(1, 1, 0, half, True, False)])
    if longest - chunk // 4 > chunk // 2 and chunk >= 4:
        batches.append([BatchEntry(0, 0, chunk // 2, chunk // 4, True, False)])
    counts = sorted({1, max(1, slots // 4), max(1, slots // 2), slots})
    for context in sorted({max(1, longest // 4), max(1, longest - 2)}):
        batches += [[BatchEntry(s, s, context, 1, True, True) for s in range(d)] for d in counts]
    mixed = max(1, slots // 2)
    batches.append([BatchEntry(s, s, longest // 2, 1, True, True) for s in range(mixed - 1)]
                   + [BatchEntry(slots - 1, slots - 1, 0, max(1, chunk // 4), True, False)])
    return batches
