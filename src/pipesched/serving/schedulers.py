"""Which requests the next iteration of an instance batches: static, Orca, vLLM, Sarathi-Serve.

``select_batch`` is asked when the instance's stage 0 is free and fewer than p batches are
in flight; it picks from the requests no batch in flight holds, takes their KV blocks
(``kv_cache``) and returns a ``Plan``: the decode steps and the prefill chunks of the
batch, and the caches swapped out or in before it. Caps (``SchedulerSpec``): ``max_batch``
sequences per iteration, ``token_budget`` tokens per iteration (prefill chunk tokens + one
per decode); an instance admits at most ``max_batch`` x p running requests (p batches in
flight, as vLLM's virtual engines).

- **static**: a batch of up to ``max_batch`` waiting requests (whole prompts, ``max_tokens``)
  runs its prefill, then decodes together until all of them have finished (those done
  drop out, nobody joins); only then may its place take a new batch. Each request reserves
  blocks for its prompt and all its output at admission (FasterTransformer), so nothing is
  preempted.
- **orca**: iteration-level batching: every running decode, and whole prompts join between
  iterations while the caps allow, with a reservation of prompt + output (Orca), no
  chunking, no preemption.
- **vllm**: continuous batching, waiting prefills first (vLLM v0): an iteration with new
  prompts runs them alone, whole (blocks for the whole prompt, ``WATERMARK`` kept free),
  else the running decodes; a decode that starts a new block when none is free preempts the
  most recently arrived running request (itself, if it is that one) until the rest fit.
  Swapped requests come back (before any new prompt) when no one was preempted this
  iteration.
- **sarathi**: a ``chunk`` token budget: the running decodes first (preempting as vLLM
  does), then the prefills in progress, then new prompts, each chunked to fill the budget
  (blocks for the chunk; a new prompt only with the watermark free): stall-free batching.

Preemption (``SchedulerSpec.preemption``): by recompute the request's blocks are freed and
it goes back to the front of the waiting queue, to prefill its prompt and the tokens made
so far again (its last chunk makes its next token; the tokens made stay made); by swap its
cache moves to host memory (``Plan.swap_out``) and back before it decodes again
(``Plan.swap_in``). A request in its prefill is always recomputed.

A prompt of more tokens than the budget (a recomputed one, prompt + tokens made) runs
alone, in chunks of the budget, under every scheduler.

Disaggregated: a prefill instance runs prefill chunks only (chunked to ``chunk`` under
Sarathi, whole prompts otherwise); a decode instance runs its decodes, then admits the
requests whose cache has arrived (``incoming``) as decodes, then any recomputed prompt.
If nothing is in flight and nothing can run, the most recently arrived holder of blocks
is preempted by recompute until something can (the cache is held by requests that cannot
go on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.enums import Preemption, SchedulerName
from pipesched.serving.config import SchedulerSpec
from pipesched.serving.state import InstanceState, Requests

_NO_ROWS = np.zeros(0, np.int64)
_RESERVING = (SchedulerName.STATIC, SchedulerName.ORCA)  # reserve prompt + output at admission


@dataclass(frozen=True, eq=False)
class Plan:
    """One iteration's work: decode steps and prefill chunks (request rows)."""

    decodes: np.ndarray  # int64 request rows making one decode step
    prefill: np.ndarray  # int64 request rows running a prefill chunk
    chunks: np.ndarray  # int64 tokens of each one's chunk
    swap_out: tuple[int, ...] = ()  # request rows whose cache goes to host memory before the batch
    swap_in: tuple[int, ...] = ()  # request rows whose cache comes back before the batch

    @property
    def empty(self) -> bool:
        return self.decodes.size == 0 and self.prefill.size == 0


@dataclass
class _Budget:
    """What the iteration may still take."""

    tokens: int
    seqs: int
    full: int  # the whole token budget


def select_batch(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    """The next batch of ``inst`` (module docstring); ``Plan.empty`` when nothing can run (its
    swap-outs, if any, still move)."""
    plan = _select(spec, inst, reqs, now)
    swap_out = plan.swap_out
    while plan.empty and inst.in_flight == 0 and _unstick(spec, inst, reqs, now):
        plan = _select(spec, inst, reqs, now)
        swap_out += plan.swap_out
    return Plan(plan.decodes, plan.prefill, plan.chunks, swap_out, plan.swap_in) if swap_out != plan.swap_out else plan


def _select(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    if inst.kind == "prefill":
        return _prefill_instance(spec, inst, reqs, now)
    if inst.kind == "decode":
        return _decode_instance(spec, inst, reqs, now)
    if spec.name == SchedulerName.SARATHI:
        return _sarathi(spec, inst, reqs, now)
    if spec.name == SchedulerName.VLLM:
        return _vllm(spec, inst, reqs, now)
    if spec.name == SchedulerName.ORCA:
        return _orca(spec, inst, reqs, now)
    return _static(spec, inst, reqs, now)


def _budget(spec: SchedulerSpec) -> _Budget:
    return _Budget(spec.token_budget, spec.max_batch, spec.token_budget)


def _plan(decodes: np.ndarray, prefill: list[int], chunks: list[int], swap_out: list[int],
          swap_in: list[int]) -> Plan:
    return Plan(decodes, np.asarray(prefill, np.int64), np.asarray(chunks, np.int64),
                tuple(swap_out), tuple(swap_in))


def _sarathi(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    budget = _budget(spec)
    dec, swap_out, preempted = _decodes(spec, inst, reqs, budget, now)
    swap_in = [] if preempted else _join(spec, inst, reqs, inst.swapped, budget, now)
    dec = _with(dec, swap_in)
    prefill, chunks = _prefills(spec, inst, reqs, budget, now, chunked=True)
    return _plan(dec, prefill, chunks, swap_out, swap_in)


def _vllm(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    if not inst.swapped:
        prefill, chunks = _prefills(spec, inst, reqs, _budget(spec), now, chunked=False)
        if prefill:
            return _plan(_NO_ROWS, prefill, chunks, [], [])
    budget = _budget(spec)
    dec, swap_out, preempted = _decodes(spec, inst, reqs, budget, now)
    swap_in = [] if preempted else _join(spec, inst, reqs, inst.swapped, budget, now)
    return _plan(_with(dec, swap_in), [], [], swap_out, swap_in)


def _orca(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    budget = _budget(spec)
    dec, swap_out, _ = _decodes(spec, inst, reqs, budget, now)
    prefill, chunks = _prefills(spec, inst, reqs, budget, now, chunked=False)
    return _plan(dec, prefill, chunks, swap_out, [])


def _static(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    if inst.available:  # one batch's requests, decoding together until all are done
        return _plan(inst.available.pop(0), [], [], [], [])
    prefill, chunks = _prefills(spec, inst, reqs, _budget(spec), now, chunked=False)
    return _plan(_NO_ROWS, prefill, chunks, [], [])


def _prefill_instance(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    chunked = spec.name == SchedulerName.SARATHI
    prefill, chunks = _prefills(spec, inst, reqs, _budget(spec), now, chunked=chunked)
    return _plan(_NO_ROWS, prefill, chunks, [], [])


def _decode_instance(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> Plan:
    budget = _budget(spec)
    dec, swap_out, preempted = _decodes(spec, inst, reqs, budget, now)
    joined = _join(spec, inst, reqs, inst.incoming, budget, now)
    swap_in = [] if preempted else _join(spec, inst, reqs, inst.swapped, budget, now)
    dec = _with(dec, joined + swap_in)
    prefill, chunks = _prefills(spec, inst, reqs, budget, now, chunked=spec.name == SchedulerName.SARATHI)
    return _plan(dec, prefill, chunks, swap_out, swap_in)


def _with(dec: np.ndarray, more: list[int]) -> np.ndarray:
    return np.concatenate((dec, np.asarray(more, np.int64))) if more else dec


def _take_available(inst: InstanceState, limit: int) -> np.ndarray:
    """Up to ``limit`` decoding requests no batch in flight holds, oldest cohort first."""
    if not inst.available or limit <= 0:
        return _NO_ROWS
    rows = inst.available[0] if len(inst.available) == 1 else np.concatenate(inst.available)
    inst.available = [rows[limit:]] if rows.size > limit else []
    return rows[:limit]


def _decodes(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, budget: _Budget,
             now: float) -> tuple[np.ndarray, list[int], bool]:
    """The running decodes of the batch, each with room for its next token: the most
    recently arrived are preempted until the others fit. Returns them, the rows swapped
    out, and whether anyone was preempted."""
    dec = _take_available(inst, min(budget.seqs, budget.tokens))
    cache = inst.cache
    need = cache.grow_need(dec, reqs.cached[dec])
    total = int(need.sum())
    swap_out: list[int] = []
    preempted = False
    while total > cache.free:
        latest_dec = int(dec.max()) if dec.size else -1
        victim = max(latest_dec, max(inst.partial, default=-1))
        if victim == latest_dec:
            k = int(np.argmax(dec))
            total -= int(need[k])
            dec, need = np.delete(dec, k), np.delete(need, k)
        else:
            inst.partial.remove(victim)
        preempted = True
        if _preempt(spec, inst, reqs, victim, now):
            swap_out.append(victim)
    cache.take_each(dec, need, now)
    budget.tokens -= dec.size
    budget.seqs -= dec.size
    return dec, swap_out, preempted


def _preempt(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, r: int, now: float, *,
             swap: bool = True) -> bool:
    """Preempt running request ``r``; True when its cache is swapped out (not recomputed)."""
    inst.cache.release(r, now)
    inst.running -= 1
    reqs.preemptions[r] += 1
    inst.preempted_at.append(now)
    if swap and spec.preemption == Preemption.SWAP and reqs.made[r] > 0:
        inst.swapped.appendleft(r)
        return True
    reqs.cached[r] = 0
    reqs.target[r] = reqs.prompt[r] + reqs.made[r]
    inst.waiting.appendleft(r)
    return False


def _join(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, queue, budget: _Budget,
          now: float) -> list[int]:
    """Requests of ``queue`` (swapped out, or arrived from a prefill instance) that join the
    batch as decodes while the caps and the cache (watermark kept) allow."""
    joined: list[int] = []
    cache = inst.cache
    reserve = spec.name in _RESERVING
    while queue and budget.seqs > 0 and budget.tokens > 0 and inst.running < spec.max_batch * inst.p:
        r = queue[0]
        tokens = int(reqs.prompt[r] + reqs.out[r]) if reserve else int(reqs.cached[r]) + 1
        blocks = cache.need(r, tokens)
        if not cache.admits(blocks):
            break
        queue.popleft()
        cache.take(r, blocks, now)
        inst.running += 1
        budget.seqs -= 1
        budget.tokens -= 1
        joined.append(r)
    return joined


def _prefills(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, budget: _Budget, now: float,
              *, chunked: bool) -> tuple[list[int], list[int]]:
    """Prefill chunks of the batch: the prefills in progress, then new prompts in arrival order."""
    rows: list[int] = []
    chunks: list[int] = []
    keep: list[int] = []
    for r in inst.partial:
        c = min(int(reqs.target[r] - reqs.cached[r]), budget.tokens)
        blocks = inst.cache.need(r, int(reqs.cached[r]) + c)
        if c <= 0 or budget.seqs <= 0 or blocks > inst.cache.free:
            keep.append(r)
            continue
        _add_chunk(inst, reqs, r, c, blocks, budget, rows, chunks, now)
    inst.partial = keep
    while inst.waiting and budget.seqs > 0 and budget.tokens > 0 and inst.running < spec.max_batch * inst.p:
        r = inst.waiting[0]
        c = _new_chunk(int(reqs.target[r] - reqs.cached[r]), budget, chunked=chunked, first=not rows)
        if c == 0:
            break
        blocks = inst.cache.need(r, _reserved_tokens(spec, reqs, r, c, chunked=chunked))
        if not inst.cache.admits(blocks):
            break
        inst.waiting.popleft()
        inst.running += 1
        _add_chunk(inst, reqs, r, c, blocks, budget, rows, chunks, now)
    return rows, chunks


def _new_chunk(remaining: int, budget: _Budget, *, chunked: bool, first: bool) -> int:
    """Tokens of a new prompt's first chunk, 0 if it does not fit this iteration: chunked to
    the budget left, else whole (one longer than the whole budget runs alone, in chunks)."""
    if chunked or remaining <= budget.tokens:
        return min(remaining, budget.tokens)
    return budget.tokens if first and budget.tokens == budget.full else 0


def _reserved_tokens(spec: SchedulerSpec, reqs: Requests, r: int, chunk: int, *, chunked: bool) -> int:
    """Tokens a new prompt takes blocks for: its chunk (chunked), its whole prompt (vLLM), or
    its prompt and all its output (static, Orca)."""
    if spec.name in _RESERVING:
        return int(reqs.prompt[r] + reqs.out[r])
    if chunked:
        return int(reqs.cached[r]) + chunk
    return max(int(reqs.target[r]), int(reqs.cached[r]) + chunk)


def _add_chunk(inst: InstanceState, reqs: Requests, r: int, c: int, blocks: int, budget: _Budget,
               rows: list[int], chunks: list[int], now: float) -> None:
    inst.cache.take(r, blocks, now)
    rows.append(r)
    chunks.append(c)
    budget.tokens -= c
    budget.seqs -= 1


def _unstick(spec: SchedulerSpec, inst: InstanceState, reqs: Requests, now: float) -> bool:
    """Preempt the most recently arrived request holding blocks that no batch holds, when
    nothing is in flight and nothing can run; False when there is none."""
    holders = list(inst.partial)
    for cohort in inst.available:
        holders.extend(int(r) for r in cohort)
    if len(holders) <= 1 and not (inst.waiting or inst.swapped or inst.incoming):
        return False
    if not holders:
        return False
    victim = max(holders)
    if victim in inst.partial:
        inst.partial.remove(victim)
    else:
        inst.available = [c[c != victim] for c in inst.available]
        inst.available = [c for c in inst.available if c.size]
    _preempt(spec, inst, reqs, victim, now, swap=False)
    return True
