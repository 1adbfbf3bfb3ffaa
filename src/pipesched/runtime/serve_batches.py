"""The batches a real serving run's first rank forms: the simulator's own scheduler
(``serving.schedulers.select_batch``) on the simulator's request and instance state, driven
by the wall clock (no torch here).

The real KV cache is preallocated per request slot (``serve_model``): a request takes a
slot when its prefill first joins a batch and keeps it to its last token. The scheduler's
paged cache (``kv_cache``, in the engine's tables) is sized to hold every slot's longest request with the
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

# the engine's own batch end (its requests go on, finish or wait for their next chunk)
from pipesched.serving.engine import _end_batch as end_batch
from pipesched.serving.kv_cache import WATERMARK, watermark_blocks
from pipesched.serving.queues import (
    CACHED,
    CAPACITY,
    COHORT,
    COUNT,
    FINISHED_AT,
    FIRST_STAGE,
    HEAD,
    IN_FLIGHT,
    INSTANCE,
    INSTANCE_COLUMNS,
    KIND,
    OUT,
    PROMPT,
    QUEUE,
    REPLICA,
    REQUEST_COLUMNS,
    REQUEST_TIMES,
    STAGES,
    TARGET,
    UNFINISHED,
    USED,
    WAITING,
    push_back,
)
from pipesched.serving.queues import WATERMARK as WATERMARK_BLOCKS
from pipesched.serving.schedulers import (
    BLOCK,
    BUDGET,
    DECODES,
    MAX_BATCH,
    NAME,
    PLAN_FIELDS,
    PREFILLS,
    SCHEDULER_CODES,
    SPEC_FIELDS,
    SWAP,
    SWAPS,
    select_batch,
)
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
    """The scheduler's tables of one replica of ``p`` stages (``serving.queues``, as the
    engine holds them), and the KV slots of its requests."""

    def __init__(self, trace: Trace, spec: SchedulerSpec, *, p: int, block_size: int) -> None:
        n = len(trace)
        self.req = np.zeros((n, REQUEST_COLUMNS), np.int64)
        self.req[:, PROMPT] = trace.prefill_tokens
        self.req[:, TARGET] = trace.prefill_tokens
        self.req[:, OUT] = trace.decode_tokens
        self.req[:, INSTANCE] = -1
        self.req[:, QUEUE] = -1
        self.times = np.full((n, REQUEST_TIMES), np.nan)  # the run's clock, seconds
        self.token_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(trace.decode_tokens, out=self.token_offsets[1:])
        self.token_times = np.full(int(self.token_offsets[-1]), np.nan)
        slots = slot_count(trace, spec, p)
        capacity = cache_blocks(trace, slots, block_size)
        self.ins = np.zeros((1, INSTANCE_COLUMNS), np.int64)
        self.ins[:, HEAD:COUNT] = -1
        self.ins[0, [KIND, STAGES, FIRST_STAGE, CAPACITY, WATERMARK_BLOCKS]] = (
            REPLICA, p, 0, capacity, watermark_blocks(capacity))
        self.spec = np.zeros(SPEC_FIELDS, np.int64)
        self.spec[[NAME, MAX_BATCH, BUDGET, SWAP, BLOCK]] = (
            SCHEDULER_CODES[spec.name], spec.max_batch, spec.token_budget, 0, block_size)
        width = max(spec.max_batch, 1)
        self.rows, self.chunks = np.zeros(width, np.int64), np.zeros(width, np.int64)
        self.swaps, self.swap_kind = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64)
        self.plan = np.zeros(PLAN_FIELDS, np.int64)
        self.arrived = 0  # requests 0..arrived-1 have joined the waiting queue
        self.slot = np.full(n, -1, np.int64)
        self.free_slots = list(range(slots - 1, -1, -1))
        self.batches = 0
        self.kv_log: list[tuple[float, int]] = []  # (seconds, blocks in use) after every change

    @property
    def done(self) -> bool:
        return not bool(np.isnan(self.times[:, FINISHED_AT]).any())

    @property
    def capacity(self) -> int:
        return int(self.ins[0, CAPACITY])

    def arrive(self, count: int) -> None:
        """Requests up to row ``count`` have arrived: they wait for the scheduler."""
        for request in range(self.arrived, count):
            push_back(self.req, self.ins, 0, WAITING, request)
            self.ins[0, UNFINISHED] += 1
            self.req[request, INSTANCE] = 0
        self.arrived = max(self.arrived, count)

    def next_batch(self, now: float) -> list[BatchEntry]:
        """The next iteration's batch (``select_batch``); [] when nothing can run now."""
        if self.ins[0, IN_FLIGHT] >= self.ins[0, STAGES]:
            return []
        select_batch(self.spec, self.req, self.ins, 0, self.rows, self.chunks, self.swaps, self.swap_kind, self.plan)
        require(self.plan[SWAPS] == 0, "kv_capacity_blocks", self.capacity,
                "the real run's cache preempted; it is sized never to")
        decodes, prefills = int(self.plan[DECODES]), int(self.plan[PREFILLS])
        if decodes + prefills == 0:
            return []
        self.ins[0, IN_FLIGHT] += 1
        self.kv_log.append((now, int(self.ins[0, USED])))
        entries = []
        for k in range(decodes + prefills):
            r, chunk = int(self.rows[k]), int(self.chunks[k])
            context = int(self.req[r, CACHED])
            if k < decodes:
                entries.append(BatchEntry(r, int(self.slot[r]), context, 1, True, True))
                continue
            if self.slot[r] < 0:
                self.slot[r] = self.free_slots.pop()
            entries.append(BatchEntry(r, int(self.slot[r]), context, chunk,
                                      context + chunk == int(self.req[r, TARGET]), False))
        return entries

    def complete(self, entries: list[BatchEntry], now: float) -> None:
        """The batch's tokens are back: its requests go on or finish (the engine's batch end)."""
        decodes = sum(1 for e in entries if e.decode)
        members = np.array([e.request for e in entries], np.int64)
        chunks = np.array([e.tokens for e in entries if not e.decode], np.int64)
        batch = np.array([[0, 0, decodes, len(entries) - decodes, 0]], np.int64)
        end_batch(0, now, self.req, self.times, self.token_offsets, self.token_times, self.ins, batch, members,
                  chunks, np.zeros(len(entries), np.int64))
        self.req[members, COHORT] = self.batches  # cohorts in the order batches came back
        self.batches += 1
        self.kv_log.append((now, int(self.ins[0, USED])))
        for entry in entries:
            if self.times[entry.request, FINISHED_AT] == now and self.slot[entry.request] >= 0:
                self.free_slots.append(int(self.slot[entry.request]))
                self.slot[entry.request] = -1


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
