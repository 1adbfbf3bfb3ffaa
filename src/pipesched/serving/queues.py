"""The state of a serving run as the compiled engine holds it: one row per request and one
per instance in integer tables with named columns, and each instance's request queues as
doubly linked lists threaded through the request rows (a request is in at most one queue).

A request's life on an instance: ``WAITING`` (arrived, or preempted by recompute; in arrival
order, the preempted at the front), its prefill in progress (``PARTIAL`` between chunks),
then decoding: ``AVAILABLE`` while no batch in flight holds it (in cohorts: the requests a
finished batch gave back, in batch order, ``COHORT`` naming the batch), or ``SWAPPED`` to
host memory. On a decode instance of a disaggregated deployment, requests whose KV cache
has arrived wait in ``INCOMING``. A request no queue holds is in a batch in flight.

Plain indexing on numpy arrays only: the functions compile with numba (``engine``).
"""

from __future__ import annotations

from numba import njit

# request columns (int64 table, one row per trace request)
PROMPT = 0  # prompt tokens
OUT = 1  # output tokens to make, the prefill's first one included
TARGET = 2  # tokens its (next) prefill must cache: the prompt, + the tokens made after a recompute
CACHED = 3  # tokens in its KV cache
MADE = 4  # output tokens made
HELD = 5  # KV blocks it holds on its instance
PREEMPTED = 6  # times it was preempted
INSTANCE = 7  # where it runs now (its decode instance once its cache is sent there)
NEXT = 8  # next request in its queue (-1: last)
PREV = 9  # previous request in its queue (-1: first)
QUEUE = 10  # the queue it is in (-1: in a batch in flight, or finished)
COHORT = 11  # the batch that gave it back (its cohort in AVAILABLE)
LOST = 12  # tokens its cache held when a recompute preemption dropped it (0: none to rebuild)
REQUEST_COLUMNS = 13

# request time columns (float64 table)
SCHEDULED_AT = 0  # its first prefill chunk started on stage 0
FIRST_TOKEN_AT = 1
FINISHED_AT = 2
REQUEST_TIMES = 3

# preemption columns (float64 table, one row per request): the open preemption's marks
# (NaN: none open) and the seconds of each part of its preemptions, summed
PREEMPTED_AT = 0  # when the open preemption began
QUEUE_FROM = 1  # when its latest wait began (the preemption, or its swap-out's end)
RECOMPUTE_FROM = 2  # when the prefill rebuilding its lost cache started on stage 0
SAVE_S = 3  # swap-outs: its cache to host memory
RELOAD_S = 4  # swap-ins: its cache back
RECOMPUTE_S = 5  # the prefill of its lost cache again
QUEUEING_S = 6  # waiting, preempted, for the host link or a batch
PREEMPTED_S = 7  # every preemption's span, its start to its cache whole again on the device
PREEMPTION_COLUMNS = 8

# the queues of an instance
WAITING = 0
PARTIAL = 1
AVAILABLE = 2
SWAPPED = 3
INCOMING = 4
QUEUES = 5

# instance columns (int64 table, one row per instance)
KIND = 0  # REPLICA, PREFILL or DECODE
STAGES = 1  # p: pipeline stages, batches it may have in flight
FIRST_STAGE = 2  # row of its stage 0 in the stage tables
CAPACITY = 3  # KV blocks of its cache
USED = 4  # KV blocks in use
WATERMARK = 5  # KV blocks a new prompt must leave free
IN_FLIGHT = 6  # batches between stage 0 and the end of the last stage
RUNNING = 7  # admitted requests not finished, swapped ones excluded
UNFINISHED = 8  # requests routed here, not finished or sent on (least-loaded routing)
HEAD = 9  # + queue: first request of each queue (-1: empty)
TAIL = HEAD + QUEUES  # + queue: last request
COUNT = TAIL + QUEUES  # + queue: requests in it
INSTANCE_COLUMNS = COUNT + QUEUES

# instance kinds
REPLICA = 0
PREFILL = 1
DECODE = 2
KIND_CODES = {"replica": REPLICA, "prefill": PREFILL, "decode": DECODE}


@njit(cache=True, _nrt=False, inline="always")
def push_back(req, ins, i, q, r):
    """Append request r to queue q of instance i."""
    tail = ins[i, TAIL + q]
    req[r, PREV] = tail
    req[r, NEXT] = -1
    req[r, QUEUE] = q
    if tail >= 0:
        req[tail, NEXT] = r
    else:
        ins[i, HEAD + q] = r
    ins[i, TAIL + q] = r
    ins[i, COUNT + q] += 1


@njit(cache=True, _nrt=False, inline="always")
def push_front(req, ins, i, q, r):
    """Put request r first in queue q of instance i."""
    head = ins[i, HEAD + q]
    req[r, NEXT] = head
    req[r, PREV] = -1
    req[r, QUEUE] = q
    if head >= 0:
        req[head, PREV] = r
    else:
        ins[i, TAIL + q] = r
    ins[i, HEAD + q] = r
    ins[i, COUNT + q] += 1


@njit(cache=True, _nrt=False, inline="always")
def remove(req, ins, i, r):
    """Take request r out of its queue on instance i."""
    q = req[r, QUEUE]
    before, after = req[r, PREV], req[r, NEXT]
    if before >= 0:
        req[before, NEXT] = after
    else:
        ins[i, HEAD + q] = after
    if after >= 0:
        req[after, PREV] = before
    else:
        ins[i, TAIL + q] = before
    req[r, QUEUE] = -1
    ins[i, COUNT + q] -= 1


@njit(cache=True, _nrt=False)
def latest(req, ins, i, q):
    """The most recently arrived request of queue q (the highest trace row), -1 if empty."""
    best = -1
    r = ins[i, HEAD + q]
    while r >= 0:
        best = max(best, r)
        r = req[r, NEXT]
    return best
