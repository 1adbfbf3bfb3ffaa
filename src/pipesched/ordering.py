"""Run a schedule's tables in order with given op durations and no communication cost.

One walk (``walk_queues``), shared by the compiled engine's first pass
(``pipesched.simulate.engine``, which compiles the same loop: the slot table, the completion
order), the validator's deadlock check, the text layout and the generators that order ops
by a trial run: each queue runs its ops in program order, an op starts when its queue is
free and its data predecessors (the rules' needs) have ended. When no queue can move, the waits form a cycle: a
deadlock. A fused entry runs as one op: it starts once every input of its parts has ended,
and all its parts end with it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from pipesched.ops import Op
from pipesched.schedule import Schedule


def walk_queues(queue_rows, queue_offsets, pred_ptr, pred_op, duration, pos, free, done, begin, end, sequence,
                wait_head, wait_next, stack, on_stack, release) -> int:
    """Run the queues with free communication (the slot table's semantics: an op starts
    when its queue is free, its data predecessors have ended and its release time has come;
    ``release`` None: no release times); returns how many ops could run (fewer than all:
    deadlock).

    Plain indexing only, so the same loop runs interpreted on lists (the validator, with
    no numpy loaded) and compiled on arrays (``pipesched.simulate.engine``). The caller
    gives the buffers: ``pos`` (a copy of queue_offsets[:-1]), ``free`` (0.0 per queue),
    ``done`` (False per op), ``begin`` and ``end`` (0.0 per op: its start and end), ``sequence`` (per op: the ops in the
    order they ran, a dependency order), ``wait_head`` (-1 per op), ``wait_next`` (-1 per
    queue), ``stack`` (queues + 1) and ``on_stack`` (False per queue).
    """
    num_queues = len(queue_offsets) - 1
    # a queue blocked on an op joins that op's list of waiting queues (each queue waits on
    # at most one op at a time): wait_head[op] -> queue, wait_next[queue] -> queue
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
        while pos[q] < queue_offsets[q + 1]:
            x = queue_rows[pos[q]]
            start = free[q]
            if release is not None and release[x] > start:
                start = release[x]
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
            begin[x] = start
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
    return count


@dataclass(frozen=True)
class Stuck:
    """Why the walk stopped: each blocked device's head op and the op it waits for."""

    waits: tuple[tuple[int, Op, Op], ...]  # (device, head op, missing predecessor)
    cycle: tuple[tuple[int, Op, Op], ...]  # the subset that waits on each other in a cycle


@dataclass(frozen=True)
class Walk:
    # plain lists, so that reading and checking a schedule needs no numpy (start-up time)
    start: list[float]  # one per table entry in table order (nan for entries never run)
    end: list[float]
    stuck: Stuck | None


def walk(schedule: Schedule, duration: Callable[[Op], float]) -> Walk:
    """Times of every table entry (a fused op is one), in table order rows; ``stuck`` is set
    when the tables deadlock.

    An entry waits for the entries holding its data predecessors (``Schedule.predecessors``,
    the rules' needs). Ops whose predecessor is absent from the schedule wait forever; the
    validator reports those as missing ops, not as a deadlock.
    """
    entries = [op for ops in schedule.device_ops for op in ops]
    n = len(entries)
    row_of = {atom: row for row, op in enumerate(entries) for atom in op.atoms}
    pred_ptr, pred_op = [0], []
    for op in entries:
        pred_op += [row_of.get(pred, n) for pred in schedule.predecessors(op)]  # n: an op never run
        pred_ptr.append(len(pred_op))
    queue_offsets = [0, *itertools.accumulate(len(ops) for ops in schedule.device_ops)]
    queues = len(queue_offsets) - 1
    begin, end = [0.0] * (n + 1), [0.0] * (n + 1)
    done = [False] * (n + 1)
    count = walk_queues(range(n), queue_offsets, pred_ptr, pred_op, [duration(op) for op in entries],
                        queue_offsets[:-1], [0.0] * queues, done, begin, end, [0] * n, [-1] * (n + 1),
                        [-1] * queues, [0] * (queues + 1), [False] * queues, None)
    entry_start = [begin[row] if done[row] else math.nan for row in range(n)]
    entry_end = [end[row] if done[row] else math.nan for row in range(n)]
    if count == n:
        return Walk(entry_start, entry_end, None)
    position = [sum(done[lo:hi]) for lo, hi in itertools.pairwise(queue_offsets)]
    blocked = [d for d in range(schedule.num_devices) if position[d] < len(schedule.device_ops[d])]
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
