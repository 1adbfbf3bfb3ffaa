"""The batch a real serving run's first rank forms each iteration (no torch here).

The run keeps one KV-cache slot per running request: a request is admitted (given a slot)
when its prefill first joins a batch and holds it to its last token, so at most
``max_batch`` requests run at once and the cache never overflows (no preemption). A
request in a batch still in flight through the pipeline joins no other batch: its next
token needs the one that batch makes (vLLM's pipeline parallelism: each in-flight batch
holds its own requests).

Policies, by ``SchedulerSpec.name`` (each iteration, over the requests not in flight):

- ``sarathi``: a budget of ``chunk`` tokens; running decodes first (one token each), then
  the prefills already begun, then new requests in arrival order, each prefill chunked to
  what is left of the budget (Sarathi-Serve's stall-free batching);
- ``orca``: the same order without chunking: whole prompts join while ``max_tokens`` allows;
- ``vllm``: waiting prompts first, whole, while ``max_tokens`` allows; an iteration that
  takes one takes no decodes; else every running decode.

Token positions: a request's prompt of p tokens fills positions 0..p-1 and makes output
token 1; decode step j (j >= 1) feeds output token j at position p + j - 1, attends over
its p + j cached keys and makes output token j + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.enums import SchedulerName
from pipesched.errors import require
from pipesched.serving.config import SchedulerSpec
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
            f"a real run schedules with {', '.join(p.value for p in POLICIES)}")
    if spec.name != SchedulerName.SARATHI and len(trace):
        longest = int(trace.prefill_tokens.max())
        require(longest <= spec.max_tokens, "max_tokens", spec.max_tokens,
                f"a prompt of {longest} tokens never fits one iteration; give --max-tokens {longest} or more")


class RequestStates:
    """Where every request of the trace is; what ``next_batch`` reads and ``complete`` moves."""

    def __init__(self, trace: Trace, slots: int) -> None:
        n = len(trace)
        self.prompt = trace.prefill_tokens
        self.output = trace.decode_tokens
        self.prefilled = np.zeros(n, np.int64)  # prompt tokens in the cache
        self.generated = np.zeros(n, np.int64)  # output tokens made
        self.slot = np.full(n, -1, np.int64)
        self.in_flight = np.zeros(n, bool)
        self.finished = np.zeros(n, bool)
        self.arrived = 0  # requests 0..arrived-1 have arrived
        self.admitted = 0  # requests 0..admitted-1 have had a slot (arrival order)
        self.free_slots = list(range(slots - 1, -1, -1))
        self.running: list[int] = []  # requests holding a slot, in admission order

    @property
    def done(self) -> bool:
        return bool(self.finished.all())

    def admit(self) -> int:
        """Give the next waiting request a slot; its row."""
        request = self.admitted
        self.slot[request] = self.free_slots.pop()
        self.running.append(request)
        self.admitted += 1
        return request

    def can_admit(self) -> bool:
        return self.admitted < self.arrived and bool(self.free_slots)

    def complete(self, entries: list[BatchEntry]) -> list[int]:
        """The batch's tokens are back: move its requests on; the requests it finished."""
        finished = []
        for entry in entries:
            request = entry.request
            self.in_flight[request] = False
            if self.prefilled[request] < self.prompt[request]:
                self.prefilled[request] += entry.tokens
            if entry.emits:
                self.generated[request] += 1
                if self.generated[request] == self.output[request]:
                    self.finished[request] = True
                    self.free_slots.append(int(self.slot[request]))
                    self.running.remove(request)
                    finished.append(request)
        return finished


def _decode(states: RequestStates, request: int) -> BatchEntry:
    context = int(states.prompt[request] + states.generated[request] - 1)
    return BatchEntry(request, int(states.slot[request]), context, 1, True, True)


def _prefill(states: RequestStates, request: int, budget: int) -> BatchEntry:
    done = int(states.prefilled[request])
    chunk = min(int(states.prompt[request]) - done, budget)
    return BatchEntry(request, int(states.slot[request]), done, chunk, bool(done + chunk == states.prompt[request]), False)


def _ready(states: RequestStates) -> tuple[list[int], list[int]]:
    """Running requests not in flight: (decoding, prefilling), in admission order."""
    decoding, prefilling = [], []
    for request in states.running:
        if not states.in_flight[request]:
            (decoding if states.prefilled[request] == states.prompt[request] else prefilling).append(request)
    return decoding, prefilling


def next_batch(states: RequestStates, spec: SchedulerSpec) -> list[BatchEntry]:
    """The next iteration's batch under ``spec`` (module docstring); [] when nothing can
    run now. Marks its requests in flight and admits the new ones it takes."""
    if spec.name == SchedulerName.VLLM:
        entries = _vllm(states, spec)
    else:
        entries = _decodes_first(states, spec, chunked=spec.name == SchedulerName.SARATHI)
    for entry in entries:
        states.in_flight[entry.request] = True
    return entries


def _decodes_first(states: RequestStates, spec: SchedulerSpec, *, chunked: bool) -> list[BatchEntry]:
    budget = spec.chunk if chunked else spec.max_tokens
    decoding, prefilling = _ready(states)
    entries = [_decode(states, r) for r in decoding[:budget]]
    budget -= len(entries)
    for request in prefilling:
        left = int(states.prompt[request] - states.prefilled[request])
        if budget <= 0 or (not chunked and left > budget):
            break
        entries.append(_prefill(states, request, budget))
        budget -= entries[-1].tokens
    while budget > 0 and states.can_admit():
        if not chunked and states.prompt[states.admitted] > budget:
            break
        entries.append(_prefill(states, states.admit(), budget))
        budget -= entries[-1].tokens
    return entries


def _vllm(states: RequestStates, spec: SchedulerSpec) -> list[BatchEntry]:
    budget = spec.max_tokens
    entries = []
    while states.can_admit() and states.prompt[states.admitted] <= budget:
        entries.append(_prefill(states, states.admit(), budget))
        budget -= entries[-1].tokens
    if entries:
        return entries
    decoding, _ = _ready(states)
    return [_decode(states, r) for r in decoding[:budget]]


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
    if chunk >= 2:
        batches.append([BatchEntry(0, 0, 0, half, True, False), BatchEntry(1 % slots, 1 % slots, 0, half, True, False)])
    if longest - chunk // 4 > chunk // 2 and chunk >= 4:
        batches.append([BatchEntry(0, 0, chunk // 2, chunk // 4, True, False)])
    counts = sorted({1, max(1, slots // 4), max(1, slots // 2), slots})
    for context in sorted({max(1, longest // 4), max(1, longest - 2)}):
        batches += [[BatchEntry(s, s, context, 1, True, True) for s in range(d)] for d in counts]
    mixed = max(1, slots // 2)
    batches.append([BatchEntry(s, s, longest // 2, 1, True, True) for s in range(mixed - 1)]
                   + [BatchEntry(slots - 1, slots - 1, 0, max(1, chunk // 4), True, False)])
    return batches
