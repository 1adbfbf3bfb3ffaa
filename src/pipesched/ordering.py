"""Run a schedule's tables in order with given op durations and no communication cost.

This is the dependency walk shared by the slot table (level 2) and the validator's deadlock
check: each device runs its ops in table order, an op starts when its device is free and its
data predecessors have ended. When no device can move, the waits form a cycle: a deadlock.
A fused entry runs as one op: it starts once every input of its parts has ended, and all its
parts end with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pipesched.ops import Op
from pipesched.schedule import Schedule


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

    Ops whose predecessor is absent from the schedule wait forever; the validator reports
    those as missing ops, not as a deadlock.
    """
    offsets = [0]
    for ops in schedule.device_ops:
        offsets.append(offsets[-1] + len(ops))
    n = offsets[-1]
    start = [math.nan] * n
    end = [math.nan] * n
    finished: dict[Op, float] = {}
    position = [0] * schedule.num_devices
    free_at = [0.0] * schedule.num_devices
    waiting: dict[Op, list[int]] = {}
    ready = list(range(schedule.num_devices - 1, -1, -1))
    while ready:
        device = ready.pop()
        ops = schedule.device_ops[device]
        while position[device] < len(ops):
            op = ops[position[device]]
            begin = free_at[device]
            blocked_on = None
            for pred in schedule.predecessors(op):
                done = finished.get(pred)
                if done is None:
                    blocked_on = pred
                    break
                begin = max(begin, done)
            if blocked_on is not None:
                waiting.setdefault(blocked_on, []).append(device)
                break
            row = offsets[device] + position[device]
            start[row] = begin
            end[row] = free_at[device] = begin + duration(op)
            position[device] += 1
            for atom in op.atoms:
                finished[atom] = end[row]
                ready.extend(waiting.pop(atom, ()))
    blocked = [d for d in range(schedule.num_devices) if position[d] < len(schedule.device_ops[d])]
    if not blocked:
        return Walk(start, end, None)
    return Walk(start, end, _stuck(schedule, position, blocked))


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
