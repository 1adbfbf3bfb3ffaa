"""The blocking runtime (``overlap=False``) as task-graph edges: a device's program alternates
steps of compute and batches of point-to-point communication, as Megatron-LM's
non-overlapped pipelines do (``send_forward_recv_backward`` and friends)::

    step k  ->  batch [sends of step k, receives of step k+1]  ->  step k+1

A message is posted by its sender in the batch after the step that produced it and by its
receiver in the batch before the step that first reads it; it starts once both ends have
posted (and its channels are free) and lasts its link time. Neither device computes until
every transfer of its batch has ended. So a receive blocks the receiver from the moment its
own table reaches the batch, not from the moment the sender posts; and a sender waits for
its receiver to reach the matching batch (a rendezvous).

Steps. Megatron's 1F1B runs one op per step (``"op"``). Its interleaved schedule groups a
forward with the backward that follows it into one step, sending both results and
receiving for the next forward and backward in one batch (``"pair"``). A table that one-op
batches cannot run (each device waits for the other to reach a batch) may run with pairs;
``"auto"`` takes one-op steps, else pairs. Tables whose sends and receives cross either way
(zero-bubble V shapes, DualPipe, ...) deadlock on a blocking runtime: ``blocking_program``
raises, naming what each device waits for. Gradient all-reduces of replicated stages stay
as the graph puts them: each holds both devices' compute streams while it runs.

In the graph: each message gets a second releaser, the op before the receiver's step (the
engine starts a transfer after the later of its releasers); the first op of the sender's
next step waits for the message (an edge that the free-communication walk sees as a
dependency on the receiver's releaser, so the global service order stays consistent); the
first op of the receiver's step waits for it too. The walk over these edges runs to
completion exactly when the blocking program does not deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.dependencies import dependencies
from pipesched.errors import PipeschedError, require
from pipesched.rules import GRADIENT, Rules
from pipesched.schedule import Schedule
from pipesched.simulate import engine

STEPS = ("auto", "op", "pair")


@dataclass(frozen=True, eq=False)
class BlockingProgram:
    """The edges a blocking runtime adds to a task graph."""

    steps: str  # "op" or "pair" (see the module docstring)
    tr_rel_ptr: np.ndarray  # int64 (T+1): ops that release each transfer (messages: both ends)
    tr_rel: np.ndarray  # int32
    pred_ptr: np.ndarray  # int64 (N+1): the data dependencies plus the batch waits
    pred_op: np.ndarray  # int32
    pred_via: np.ndarray  # int32


def blocking_program(schedule: Schedule, *, steps: str, queue_rows: np.ndarray, queue_offsets: np.ndarray,
                     kinds: np.ndarray, pred_ptr: np.ndarray, pred_op: np.ndarray, pred_via: np.ndarray,
                     tr_rel_ptr: np.ndarray, tr_rel: np.ndarray, num_messages: int,
                     tails: np.ndarray | None = None) -> BlockingProgram:
    """The blocking program of a compiled graph's arrays (``kinds``: rules index per op row;
    transfers 0..num_messages-1 are messages released by their producer alone; ``tails``:
    the rows that are a fused entry's later part, which run in their head's step: one batch
    before the pair for both inputs, one after it for both outputs). Raises PipeschedError
    when the tables deadlock on a blocking runtime."""
    require(steps in STEPS, "steps", steps, f"choose one of {', '.join(STEPS)}")
    n = kinds.shape[0]
    producer = tr_rel[tr_rel_ptr[:num_messages]].astype(np.int64)
    edges = pred_via >= 0
    consumer_of_edge = np.repeat(np.arange(n, dtype=np.int64), np.diff(pred_ptr))
    first_consumer = np.full(num_messages, n, np.int64)
    np.minimum.at(first_consumer, pred_via[edges], consumer_of_edge[edges])
    before, after = _queue_neighbours(queue_rows, queue_offsets, n)
    tried = ["op", "pair"] if steps == "auto" else [steps]
    first_failure = ""
    for mode in tried:
        head = step_heads(schedule.rules, kinds, before, mode)
        if tails is not None:
            head &= ~tails
        program = _program(mode, head, before, after, producer, first_consumer, pred_ptr, pred_op, pred_via,
                           tr_rel_ptr, tr_rel, num_messages)
        done = _done(program, queue_rows, queue_offsets, n)
        if done.all():
            return program
        if not first_failure:
            first_failure = _describe(schedule, program, done, queue_rows, queue_offsets, producer, first_consumer)
    how = "one batch per op or per forward-backward pair" if len(tried) > 1 else f"{steps} steps"
    raise PipeschedError(
        f"schedule={schedule.name}: a blocking runtime (overlap off) deadlocks on this table with {how}: "
        f"{first_failure}; its sends and receives cross, which only an overlapped runtime can run: simulate "
        "it with overlap")


def _queue_neighbours(queue_rows: np.ndarray, queue_offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The op before and after each op row on its queue (-1 at a queue's ends)."""
    rows = queue_rows.astype(np.int64)
    first = np.zeros(rows.shape[0], np.bool_)
    starts = queue_offsets[:-1][queue_offsets[:-1] < queue_offsets[1:]]
    first[starts] = True
    last = np.zeros(rows.shape[0], np.bool_)
    last[queue_offsets[1:][queue_offsets[:-1] < queue_offsets[1:]] - 1] = True
    before = np.full(n, -1, np.int64)
    after = np.full(n, -1, np.int64)
    before[rows[1:][~first[1:]]] = rows[:-1][~first[1:]]
    after[rows[:-1][~last[:-1]]] = rows[1:][~last[:-1]]
    return before, after


def step_heads(rules: Rules, kinds: np.ndarray, before: np.ndarray, steps: str) -> np.ndarray:
    """Which ops begin a step (``kinds``: rules index per op; ``before``: the op before each
    on its queue, -1 for none). One-op steps: all. Pairs: every op but a backward (a kind
    that receives a gradient) right after a forward (a kind that sends its output on)."""
    if steps == "op":
        return np.ones(kinds.shape[0], np.bool_)
    forward = np.array([any(offset > 0 for offset, _ in rules.sends(rule.kind)) for rule in rules], np.bool_)
    backward = np.array([any(need.message == GRADIENT for need in rule.needs) for rule in rules], np.bool_)
    paired = backward[kinds] & (before >= 0)
    paired[paired] = forward[kinds[before[paired]]]
    return ~paired


def _program(mode, head, before, after, producer, first_consumer, pred_ptr, pred_op, pred_via, tr_rel_ptr, tr_rel,
             num_messages) -> BlockingProgram:
    """The releasers and batch waits of the steps that ``head`` begins."""
    n = head.shape[0]
    # the first and the last op of each op's step: a head and at most one op after it
    tail = ~head
    step_first = np.arange(n, dtype=np.int64)
    step_first[tail] = before[tail]
    step_last = np.arange(n, dtype=np.int64)
    step_last[before[tail]] = np.flatnonzero(tail)
    sent_after = step_last[producer]  # the sender posts after its step
    read_at = step_first[first_consumer]  # the receiver posts before its step
    posted_after = before[read_at]  # ... right after the op before that step (-1: at the start)
    sender_next = after[sent_after]  # the first op of the sender's next step (-1: its tail batch)
    # releasers: the sender's step end, and the receiver's post when it has an op before
    has_post = posted_after >= 0
    count = np.diff(tr_rel_ptr).astype(np.int64)
    count[:num_messages] = 1 + has_post
    rel_ptr = np.zeros(count.shape[0] + 1, np.int64)
    np.cumsum(count, out=rel_ptr[1:])
    rel = np.empty(rel_ptr[-1], np.int32)
    rel[rel_ptr[:num_messages]] = sent_after
    rel[rel_ptr[1:num_messages + 1][has_post] - 1] = posted_after[has_post]
    others = np.arange(rel_ptr[num_messages], rel_ptr[-1])
    rel[others] = tr_rel[tr_rel_ptr[num_messages]:]
    # batch waits: (waiting op, op it waits for in the free-communication walk, message)
    messages = np.arange(num_messages)
    sends = sender_next >= 0
    # the receiver's wait is already a data edge when its step starts with the consumer and
    # the message left right after its producer
    receives = (read_at != first_consumer) | (sent_after != producer)
    waiter = np.concatenate([sender_next[sends], read_at[receives]])
    waits_for = np.concatenate([np.where(has_post, posted_after, sent_after)[sends], sent_after[receives]])
    waits_via = np.concatenate([messages[sends], messages[receives]])
    consumers = np.concatenate([np.repeat(np.arange(n), np.diff(pred_ptr)), waiter])
    order = np.argsort(consumers, kind="stable")  # each op keeps its data edges first
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(consumers, minlength=n), out=ptr[1:])
    preds = np.concatenate([pred_op, waits_for])[order].astype(np.int32)
    via = np.concatenate([pred_via, waits_via])[order].astype(np.int32)
    return BlockingProgram(mode, rel_ptr, rel, ptr, preds, via)


def _done(program: BlockingProgram, queue_rows: np.ndarray, queue_offsets: np.ndarray, n: int) -> np.ndarray:
    """Which ops the blocking program runs before it stops (all of them: no deadlock)."""
    order, _count = engine.completion_order(queue_rows, queue_offsets, program.pred_ptr, program.pred_op,
                                            np.zeros(n, np.float64))
    done = np.zeros(n, np.bool_)
    done[order] = True
    return done


def _describe(schedule: Schedule, program: BlockingProgram, done: np.ndarray, queue_rows: np.ndarray,
              queue_offsets: np.ndarray, producer: np.ndarray, first_consumer: np.ndarray) -> str:
    """What each stuck queue waits for, in words: 'd0 waits before 3F0 until d1 takes 0F2's
    output (d1 posts that receive before 1F2)'."""
    ops = dependencies(schedule).ops

    def name(row: int) -> str:
        device = int(ops.device[row])
        return str(schedule.device_atoms[device][row - int(ops.device_offsets[device])])

    lines = []
    for q in range(queue_offsets.shape[0] - 1):
        rows = queue_rows[queue_offsets[q]:queue_offsets[q + 1]]
        open_rows = rows[~done[rows]]
        if not open_rows.shape[0]:
            continue
        x = int(open_rows[0])
        device = int(ops.device[x])
        reason = "its inputs"
        for e in range(program.pred_ptr[x], program.pred_ptr[x + 1]):
            t = int(program.pred_via[e])
            if t < 0 or done[program.pred_op[e]]:
                continue
            a, c = int(producer[t]), int(first_consumer[t])
            if int(ops.device[a]) == device:
                reason = f"d{int(ops.device[c])} takes {name(a)}'s output (it posts that receive before {name(c)})"
            else:
                reason = f"{name(a)}'s output arrives from d{int(ops.device[a])}"
            break
        lines.append(f"d{device} waits before {name(x)} until {reason}")
    return "; ".join(lines[:4]) + ("; ..." if len(lines) > 4 else "")
