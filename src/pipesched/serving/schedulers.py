"""Which requests the next iteration of an instance batches: static, Orca, vLLM, Sarathi-Serve.

``select_batch`` is asked when the instance's stage 0 is free and fewer than p batches are
in flight; it picks from the requests no batch in flight holds, takes their KV blocks
(``kv_cache``) and writes the plan: the decode steps then the prefill chunks of the batch
(``rows``, ``chunks``; a decode's chunk is 0), the caches swapped out or in before it and
the requests whose cache a recompute preemption dropped (``swaps``, ``swap_kind``), and how
many requests it preempted (``VICTIMS``).
Caps (``SchedulerSpec``): ``max_batch`` sequences per iteration, ``token_budget`` tokens per
iteration (prefill chunk tokens + one per decode); an instance admits at most
``max_batch`` x p running requests (p batches in flight, as vLLM's virtual engines).

- **static**: a batch of up to ``max_batch`` waiting requests (whole prompts, ``max_tokens``)
  runs its prefill, then decodes together until all of them have finished (those done drop
  out, nobody joins); only then may its place take a new batch. Each request reserves
  blocks for its prompt and all its output at admission (FasterTransformer): no preemption.
- **orca**: iteration-level batching: every running decode, and whole prompts join between
  iterations while the caps allow, each reserving prompt + output (Orca), no chunking, no
  preemption.
- **vllm**: continuous batching, waiting prefills first (vLLM v0): an iteration with new
  prompts runs them alone, whole (blocks for the whole prompt, the watermark kept free),
  else the running decodes; when a decode starting a new block finds none free, the most
  recently arrived running request is preempted (itself, if it is that one) until the rest
  fit. Swapped requests come back, before any new prompt, in an iteration that preempted
  no one.
- **sarathi**: a ``chunk`` token budget: the running decodes first (preempting as vLLM
  does), swapped requests back, then the prefills in progress, then new prompts, each
  chunked to fill the budget (blocks for the chunk; a new prompt only with the watermark
  free): stall-free batching.

Preemption (``SchedulerSpec.preemption``): by recompute the request's blocks are freed and
it goes back to the front of the waiting queue, to prefill its prompt and the tokens made
so far again (its last chunk makes its next token; the tokens made stay made); by swap a
decoding request's cache moves to host memory and back before it decodes again (a request
in its prefill is always recomputed).

A prompt of more tokens than the budget (a recomputed one, prompt + tokens made) runs
alone, in chunks of the budget, under every scheduler.

Disaggregated: a prefill instance runs prefill chunks only (chunked to ``chunk`` under
Sarathi, whole prompts otherwise); a decode instance runs its decodes, then admits the
requests whose cache has arrived (``INCOMING``) as decodes, then any recomputed prompt.
If nothing is in flight and nothing can run, the most recently arrived request holding
blocks no batch holds is preempted by recompute until something can.

Plain indexing on the run's tables (``queues``): the functions compile with numba.
"""

from __future__ import annotations

from numba import njit

from pipesched.enums import SchedulerName
from pipesched.serving.kv_cache import admits, blocks_for, free, need, release, take
from pipesched.serving.queues import (
    AVAILABLE,
    CACHED,
    COHORT,
    COUNT,
    DECODE,
    HEAD,
    HELD,
    IN_FLIGHT,
    INCOMING,
    KIND,
    LOST,
    MADE,
    NEXT,
    OUT,
    PARTIAL,
    PREEMPTED,
    PREFILL,
    PROMPT,
    QUEUE,
    RUNNING,
    STAGES,
    SWAPPED,
    TARGET,
    WAITING,
    latest,
    push_front,
    remove,
)

# scheduler codes (the spec table's NAME)
STATIC, ORCA, VLLM, SARATHI = 0, 1, 2, 3
SCHEDULER_CODES = {SchedulerName.STATIC: STATIC, SchedulerName.ORCA: ORCA, SchedulerName.VLLM: VLLM,
                   SchedulerName.SARATHI: SARATHI}
# the spec table (int64): the scheduler and its caps
NAME, MAX_BATCH, BUDGET, SWAP, BLOCK = 0, 1, 2, 3, 4
SPEC_FIELDS = 5
# the plan's counters (int64): what the plan holds and what the iteration may still take;
# PREEMPTIONS counts the running decodes' victims of one selection round (vLLM lets swapped
# requests back only after a round that preempted no one), VICTIMS every request preempted
# while this batch was selected (the engine's ``KVTrace.preempted_at``)
DECODES, PREFILLS, SWAPS, TOKENS_LEFT, SEQS_LEFT, PREEMPTIONS, VICTIMS = 0, 1, 2, 3, 4, 5, 6
PLAN_FIELDS = 7
# the plan's swap_kind: swap directions, and a victim of recompute (its cache dropped, no move)
SWAP_OUT, SWAP_IN, DROPPED = 0, 1, 2


@njit(cache=True, _nrt=False)
def select_batch(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan):
    """Write the next batch of instance i into the plan (module docstring); its ``DECODES``
    and ``PREFILLS`` are 0 when nothing can run (its swap-outs, if any, still move)."""
    plan[SWAPS] = 0
    plan[VICTIMS] = 0
    _select(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan)
    while plan[DECODES] + plan[PREFILLS] == 0 and ins[i, IN_FLIGHT] == 0 and _unstick(
            spec, req, ins, i, swaps, swap_kind, plan):
        _select(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan)


@njit(cache=True, _nrt=False)
def _select(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan):
    plan[DECODES] = 0
    plan[PREFILLS] = 0
    plan[PREEMPTIONS] = 0
    plan[TOKENS_LEFT] = spec[BUDGET]
    plan[SEQS_LEFT] = spec[MAX_BATCH]
    name, kind = spec[NAME], ins[i, KIND]
    prefill_first = kind == PREFILL or (kind != DECODE and (name in (STATIC, VLLM)))
    chunked = name == SARATHI
    if prefill_first and (kind == PREFILL or ins[i, COUNT + SWAPPED] == 0) and not (
            name == STATIC and kind != PREFILL and ins[i, COUNT + AVAILABLE] > 0):
        _prefills(spec, req, ins, i, rows, chunks, plan, chunked and kind == PREFILL)
        if plan[PREFILLS] > 0 or kind == PREFILL:
            return
    _decodes(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan)
    if kind == DECODE:
        _join(spec, req, ins, i, INCOMING, rows, chunks, swaps, swap_kind, plan)
    if plan[PREEMPTIONS] == 0:
        _join(spec, req, ins, i, SWAPPED, rows, chunks, swaps, swap_kind, plan)
    if name in (SARATHI, ORCA) or kind == DECODE:
        _prefills(spec, req, ins, i, rows, chunks, plan, chunked)


@njit(cache=True, _nrt=False)
def _cap(spec, ins, i):
    """Running requests the instance may hold: max_batch per batch in flight."""
    return spec[MAX_BATCH] * ins[i, STAGES]


@njit(cache=True, _nrt=False)
def _decodes(spec, req, ins, i, rows, chunks, swaps, swap_kind, plan):
    """The running decodes of the batch (static: one cohort), each with room for its next
    token: the most recently arrived are preempted until the others fit."""
    block = spec[BLOCK]
    limit = min(plan[SEQS_LEFT], plan[TOKENS_LEFT])
    r = ins[i, HEAD + AVAILABLE]
    cohort = req[r, COHORT] if r >= 0 else -1
    total = 0
    while r >= 0 and plan[DECODES] < limit and not (spec[NAME] == STATIC and req[r, COHORT] != cohort):
        after = req[r, NEXT]
        remove(req, ins, i, r)
        rows[plan[DECODES]] = r
        chunks[plan[DECODES]] = 0
        plan[DECODES] += 1
        total += need(req, r, req[r, CACHED] + 1, block)
        r = after
    while total > free(ins, i):
        victim = max(_latest_row(rows, plan[DECODES]), latest(req, ins, i, PARTIAL))
        plan[PREEMPTIONS] += 1
        if req[victim, QUEUE] == -1:  # one of the decodes just taken
            total -= need(req, victim, req[victim, CACHED] + 1, block)
            _drop_row(rows, chunks, plan, victim)
        else:
            remove(req, ins, i, victim)
        _preempt(spec, req, ins, i, victim, swaps, swap_kind, plan, True)
    for k in range(plan[DECODES]):
        take(req, ins, i, rows[k], need(req, rows[k], req[rows[k], CACHED] + 1, block))
    plan[TOKENS_LEFT] -= plan[DECODES]
    plan[SEQS_LEFT] -= plan[DECODES]


@njit(cache=True, _nrt=False)
def _latest_row(rows, n):
    best = -1
    for k in range(n):
        best = max(best, rows[k])
    return best


@njit(cache=True, _nrt=False)
def _drop_row(rows, chunks, plan, r):
    """Take decode r out of the plan's decodes (order kept)."""
    n = plan[DECODES]
    k = 0
    while rows[k] != r:
        k += 1
    for j in range(k, n - 1):
        rows[j] = rows[j + 1]
        chunks[j] = chunks[j + 1]
    plan[DECODES] = n - 1


@njit(cache=True, _nrt=False)
def _preempt(spec, req, ins, i, r, swaps, swap_kind, plan, may_swap):
    """Preempt running request r (in no queue): swap its cache out, or recompute it."""
    if may_swap and spec[SWAP] == 1 and req[r, MADE] > 0 and req[r, CACHED] >= req[r, TARGET]:
        swaps[plan[SWAPS]] = r
        swap_kind[plan[SWAPS]] = SWAP_OUT
        plan[SWAPS] += 1
        push_front(req, ins, i, SWAPPED, r)
    else:
        swaps[plan[SWAPS]] = r
        swap_kind[plan[SWAPS]] = DROPPED
        plan[SWAPS] += 1
        req[r, LOST] = max(req[r, LOST], req[r, CACHED])
        req[r, CACHED] = 0
        req[r, TARGET] = req[r, PROMPT] + req[r, MADE]
        push_front(req, ins, i, WAITING, r)
    release(req, ins, i, r)
    ins[i, RUNNING] -= 1
    req[r, PREEMPTED] += 1
    plan[VICTIMS] += 1


@njit(cache=True, _nrt=False)
def _join(spec, req, ins, i, q, rows, chunks, swaps, swap_kind, plan):
    """Requests of queue q (swapped out, or arrived from a prefill instance) join the batch
    as decodes while the caps and the cache (watermark kept) allow."""
    reserve = spec[NAME] == STATIC or spec[NAME] == ORCA
    while (ins[i, COUNT + q] > 0 and plan[SEQS_LEFT] > 0 and plan[TOKENS_LEFT] > 0
           and ins[i, RUNNING] < _cap(spec, ins, i)):
        r = ins[i, HEAD + q]
        tokens = req[r, PROMPT] + req[r, OUT] if reserve else req[r, CACHED] + 1
        blocks = need(req, r, tokens, spec[BLOCK])
        if not admits(ins, i, blocks):
            return
        remove(req, ins, i, r)
        take(req, ins, i, r, blocks)
        ins[i, RUNNING] += 1
        rows[plan[DECODES]] = r
        chunks[plan[DECODES]] = 0
        plan[DECODES] += 1
        plan[SEQS_LEFT] -= 1
        plan[TOKENS_LEFT] -= 1
        if q == SWAPPED:
            swaps[plan[SWAPS]] = r
            swap_kind[plan[SWAPS]] = SWAP_IN
            plan[SWAPS] += 1


@njit(cache=True, _nrt=False)
def _prefills(spec, req, ins, i, rows, chunks, plan, chunked):
    """Prefill chunks of the batch: the prefills in progress, then new prompts in arrival order."""
    block = spec[BLOCK]
    r = ins[i, HEAD + PARTIAL]
    while r >= 0:
        after = req[r, NEXT]
        c = min(req[r, TARGET] - req[r, CACHED], plan[TOKENS_LEFT])
        blocks = need(req, r, req[r, CACHED] + c, block)
        if c > 0 and plan[SEQS_LEFT] > 0 and blocks <= free(ins, i):
            remove(req, ins, i, r)
            _add_chunk(req, ins, i, r, c, blocks, rows, chunks, plan)
        r = after
    while (ins[i, COUNT + WAITING] > 0 and plan[SEQS_LEFT] > 0 and plan[TOKENS_LEFT] > 0
           and ins[i, RUNNING] < _cap(spec, ins, i)):
        r = ins[i, HEAD + WAITING]
        c = _new_chunk(req[r, TARGET] - req[r, CACHED], plan[TOKENS_LEFT], spec[BUDGET], chunked,
                       plan[DECODES] + plan[PREFILLS] == 0)
        if c == 0:
            return
        blocks = need(req, r, _reserved_tokens(spec, req, r, c, chunked), block)
        if not admits(ins, i, blocks):
            return
        remove(req, ins, i, r)
        ins[i, RUNNING] += 1
        _add_chunk(req, ins, i, r, c, blocks, rows, chunks, plan)


@njit(cache=True, _nrt=False)
def _new_chunk(remaining, tokens_left, budget, chunked, first):
    """Tokens of a new prompt's first chunk, 0 if it does not fit this iteration: chunked to
    the budget left, else whole (one longer than the whole budget runs alone, in chunks)."""
    if chunked or remaining <= tokens_left:
        return min(remaining, tokens_left)
    return budget if first and tokens_left == budget else 0


@njit(cache=True, _nrt=False)
def _reserved_tokens(spec, req, r, chunk, chunked):
    """Tokens a new prompt takes blocks for: its chunk (chunked), its whole prompt (vLLM), or
    its prompt and all its output (static, Orca)."""
    if spec[NAME] == STATIC or spec[NAME] == ORCA:
        return req[r, PROMPT] + req[r, OUT]
    if chunked:
        return req[r, CACHED] + chunk
    return max(req[r, TARGET], req[r, CACHED] + chunk)


@njit(cache=True, _nrt=False)
def _add_chunk(req, ins, i, r, c, blocks, rows, chunks, plan):
    take(req, ins, i, r, blocks)
    k = plan[DECODES] + plan[PREFILLS]
    rows[k] = r
    chunks[k] = c
    plan[PREFILLS] += 1
    plan[TOKENS_LEFT] -= c
    plan[SEQS_LEFT] -= 1


@njit(cache=True, _nrt=False)
def _unstick(spec, req, ins, i, swaps, swap_kind, plan):
    """Preempt by recompute the most recently arrived request holding blocks that no batch
    holds, when nothing is in flight and nothing can run; False when that cannot help."""
    holders = ins[i, COUNT + PARTIAL] + ins[i, COUNT + AVAILABLE]
    others = ins[i, COUNT + WAITING] + ins[i, COUNT + SWAPPED] + ins[i, COUNT + INCOMING]
    if holders == 0 or (holders == 1 and others == 0):
        return False
    victim = max(latest(req, ins, i, PARTIAL), latest(req, ins, i, AVAILABLE))
    if req[victim, HELD] == 0 and others == 0:
        return False
    remove(req, ins, i, victim)
    _preempt(spec, req, ins, i, victim, swaps, swap_kind, plan, False)
    return True


def blocks_of(tokens: int, block: int) -> int:
    """Blocks that hold ``tokens`` tokens (interpreted: for checks before the run)."""
    return int(blocks_for(tokens, block))
