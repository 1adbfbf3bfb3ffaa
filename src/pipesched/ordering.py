"""Run a schedule's tables in order with given op durations and no communication cost.

One walk, shared by the compiled engine's first pass (``pipesched.simulate.engine``: the
slot table, the completion order), the validator's deadlock check, the text layout and the
generators that order ops by a trial run: each queue runs its ops in program order, an op
starts when its queue is free and its data predecessors (the rules' needs,
``pipesched.dependencies``) have ended. When no queue can move, the waits form a cycle: a
deadlock. A fused entry runs as one op: it starts once every input of its parts has ended,
and all its parts end with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from pipesched.dependencies import dependencies
from pipesched.ops import Op
from pipesched.schedule import Schedule


@njit(cache=True)
def walk_queues(queue_rows, queue_offsets, pred_ptr, pred_op, duration):
    """Run the queues with free communication (the slot table's semantics: an op starts
    when its queue is free and its data predecessors have ended).

    Returns (sequence, end, count): the ops in the order they were evaluated (a dependency
    order), each op's end time, and how many ops could run (fewer than all: deadlock).
    """
    n = duration.shape[0]
    num_queues = queue_offsets.shape[0] - 1
    pos = queue_offsets[:-1].copy()
    stop = queue_offsets[1:].copy()
    free = np.zeros(num_queues, np.float64)
    done = np.zeros(n, np.bool_)
    end = np.zeros(n, np.float64)
    sequence = np.empty(n, np.int32)
    # a queue blocked on an op joins that op's list of waiting queues (each queue waits on
    # at most one op at a time): wait_head[op] -> queue, wait_next[queue] -> queue
    wait_head = np.full(n, -1, np.int32)
    wait_next = np.full(num_queues, -1, np.int32)
    stack = np.empty(num_queues + 1, np.int32)  # queues that may advance
    on_stack = np.zeros(num_queues, np.bool_)
    top = 0
    for q in range(num_queues - 1, -1, -1):
        stack[top] = q
        on_stack[q] = True
        top += 1
    count = 0
    while top > 0:
        top -= 1
        q = stack[top]
        on_stack[q] = False
        while pos[q] < stop[q]:
            x = queue_rows[pos[q]]
            start = free[q]
            blocked = -1
            for e in range(pred_ptr[x], pred_ptr[x + 1]):
                p = pred_op[e]
                if not done[p]:
                    blocked = p
                    break
                if end[p] > start:
                    start = end[p]
            if blocked >= 0:
                wait_next[q] = wait_head[blocked]
                wait_head[blocked] = q
                break
            finish = start + duration[x]
            end[x] = finish
            free[q] = finish
            done[x] = True
            pos[q] += 1
            sequence[count] = x
            count += 1
            waiter = wait_head[x]
            while waiter >= 0:
                following = wait_next[waiter]
                if not on_stack[waiter]:
                    stack[top] = waiter
                    on_stack[waiter] = True
                    top += 1
                waiter = following
    return sequence, end, count


@dataclass(frozen=True)
class Stuck:
    """Why the walk stopped: each blocked device's head op and the op it waits for."""

    waits: tuple[tuple[int, Op, Op], ...]  # (device, head op, missing predecessor)
    cycle: tuple[tuple[int, Op, Op], ...]  # the subset that waits on each other in a cycle


@dataclass(frozen=True)
class Walk:
    start: np.ndarray  # float64, one per table entry in table order (nan for entries never run)
    end: np.ndarray
    stuck: Stuck | None


def walk(schedule: Schedule, duration: Callable[[Op], float]) -> Walk:
    """Times of every table entry (a fused op is one), in table order rows; ``stuck`` is set
    when the tables deadlock. The table must be structurally valid (``dependencies``
    raises PipeschedError otherwise; ``pipesched.validate`` reports it)."""
    deps = dependencies(schedule)
    ops = deps.ops
    n = len(ops)
    head = ops.entry_head.astype(np.int64) if ops.entry_head is not None else np.arange(n)
    # an entry waits for the entries holding its parts' needs, never for itself
    consumer, producer, _ = deps.edges
    consumer, producer = head[consumer], head[producer]
    outside = consumer != producer
    consumer, producer = consumer[outside], producer[outside]
    order = np.argsort(consumer, kind="stable")
    pred_op = producer[order].astype(np.int64)
    pred_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(consumer, minlength=n), out=pred_ptr[1:])
    entries = np.flatnonzero(head == np.arange(n))  # table order: device by device
    times = np.zeros(n)
    times[entries] = [duration(op) for ops_of in schedule.device_ops for op in ops_of]
    sizes = [len(ops_of) for ops_of in schedule.device_ops]
    queue_offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=queue_offsets[1:])
    sequence, end, count = walk_queues(entries.astype(np.int32), queue_offsets, pred_ptr, pred_op, times)
    finished = np.zeros(n, np.bool_)
    finished[sequence[:count]] = True
    ran = finished[entries]
    entry_end = np.where(ran, end[entries], np.nan)
    entry_start = entry_end - times[entries]
    if count == len(entries):
        return Walk(entry_start, entry_end, None)
    position = [int(ran[lo:hi].sum()) for lo, hi in itertools.pairwise(queue_offsets.tolist())]
    blocked = [d for d in range(schedule.num_devices) if position[d] < sizes[d]]
    return Walk(entry_start, entry_end, _stuck(schedule, position, blocked))


def _stuck(schedule: Schedule, position: list[int], blocked: list[int]) -> Stuck:
    where: dict[Op, int] = {op: d for d, op in schedule.ops()}
    waits = []
    next_device: dict[int, int] = {}
    for device in blocked:
        head = schedule.device_ops[device][position[device]]
        missing = next(p for p in schedule.predecessors(head) if p not in _done(schedule, position, where, p))
        waits.append((device, head, missing))
        if missing in where:
            next_device[device] = where[missing]
    # follow device -> device holding the awaited op until a device repeats: that is the cycle
    cycle: list[int] = []
    for first in blocked:
        path: list[int] = []
        device = first
        while device in next_device and device not in path:
            path.append(device)
            device = next_device[device]
        if device in path:
            cycle = path[path.index(device):]
            break
    by_device = {w[0]: w for w in waits}
    return Stuck(tuple(waits), tuple(by_device[d] for d in cycle))


def _done(schedule: Schedule, position: list[int], where: dict[Op, int], op: Op) -> set[Op]:
    """{op} if op already ran (its entry sits before its device's position), else empty."""
    device = where.get(op)
    if device is None:
        return set()
    index = next(i for i, entry in enumerate(schedule.device_ops[device]) if op in entry.atoms)
    return {op} if index < position[device] else set()
