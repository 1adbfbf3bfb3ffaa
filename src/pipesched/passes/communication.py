"""The communication pass: a compute table becomes a table with send, receive and all-reduce
actions, the way PyTorch's ``_add_send_recv`` lowering adds SEND_F/RECV_F/SEND_B/RECV_B.

What crosses a device boundary comes from the rules (``pipesched.rules``): an op's need
whose producer runs on another device is a message, an activation (F(s) -> F(s+1)) or a
gradient (I/B(s+1) -> I/B(s)); a consumer on the producer's device reads the result in
place. A stage that two replicas keep on different devices (Chimera, DualPipe) all-reduces
its weight gradients between them once both have run its last weight-gradient op (W, or B
when the backward is not split); a frozen stage has none. With data parallelism (d > 1 pipeline replicas) every
stage's gradients are summed with the other pipelines' copies in the same way, after the
same op: one gradient collective per stage, whatever number of copies the pipeline itself
holds (``allreduces(schedule, data_parallel=True)``).

Two views of the same derivation:

- ``messages`` and ``allreduces``: arrays (one row per message / all-reduce), what the
  simulator's compiled task graph is built from (``pipesched.simulate.graph``);
- ``with_communication``: per device, the compute ops with ``Send``, ``Recv`` and
  ``AllReduce`` actions in an order that cannot deadlock, what the real executor walks
  and what exports to PyTorch's compute+comms CSV. Like PyTorch's lowering, it walks the
  devices in rounds (one op per device per round, devices in rank order): a device takes
  its next op once the op's inputs have run somewhere; a produced message appends a
  ``Send`` to the producer and, at the same moment, the matching ``Recv`` to the consumer,
  so every pair of devices sees the traffic between them in the same order on both sides
  (what NCCL needs) and a receive is posted long before its consumer waits on it. A fused
  entry (``(0F1;1B0)OVERLAP_F_B``) is taken once every input of its parts has run, and
  its parts' sends follow it, part by part, as PyTorch's lowering does with sub-actions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from pipesched.dependencies import Dependencies, dependencies, derived, rule_arrays
from pipesched.errors import PipeschedError
from pipesched.ops import Op
from pipesched.schedule import Schedule
from pipesched.timeline import ACTIVATION, GRADIENT

_TORCH_SEND = {ACTIVATION: "SEND_F", GRADIENT: "SEND_B"}
_TORCH_RECV = {ACTIVATION: "RECV_F", GRADIENT: "RECV_B"}
# where a message goes: activations to the next stage, gradients to the previous one
_DIRECTION = {ACTIVATION: +1, GRADIENT: -1}


class Message(NamedTuple):
    """A tensor between two stages: ``kind`` (timeline.ACTIVATION / GRADIENT) produced by
    stage ``stage`` for ``microbatch``."""

    kind: int
    stage: int
    microbatch: int

    @property
    def to_stage(self) -> int:
        return self.stage + _DIRECTION[self.kind]

    def tag(self, num_stages: int, num_microbatches: int) -> int:
        """A tag unique within one iteration (gloo matches sends to receives by it)."""
        return (self.kind * num_stages + self.stage) * num_microbatches + self.microbatch


class Send(NamedTuple):
    message: Message
    peer: int  # destination device

    def __str__(self) -> str:
        return f"{self.message.stage}{_TORCH_SEND[self.message.kind]}{self.message.microbatch}"


class Recv(NamedTuple):
    message: Message
    peer: int  # source device

    def __str__(self) -> str:
        return f"{self.message.to_stage}{_TORCH_RECV[self.message.kind]}{self.message.microbatch}"


class AllReduce(NamedTuple):
    """Sum stage ``stage``'s weight gradients with its replica on device ``peer``."""

    stage: int
    peer: int

    def __str__(self) -> str:
        return f"{self.stage}ALLREDUCE"


Action = Op | Send | Recv | AllReduce


@dataclass(frozen=True, eq=False)
class Messages:
    """Every message of one iteration, ordered by producer row (the producer's table order).

    ``via[e]`` gives, for each data dependency edge of ``Dependencies.edges``, the message
    that carries it (-1: a local edge).
    """

    producer: np.ndarray  # int32 op row that sends it (after it ends)
    src: np.ndarray  # int32 device
    dst: np.ndarray  # int32 device
    kind: np.ndarray  # int8 timeline.ACTIVATION / GRADIENT
    stage: np.ndarray  # int32 producing stage
    boundary: np.ndarray  # int32 the stage whose output_bytes size it (the lower of the two stages)
    microbatch: np.ndarray  # int32
    via: np.ndarray  # int32, per dependency edge

    def __len__(self) -> int:
        return int(self.producer.shape[0])


@dataclass(frozen=True, eq=False)
class AllReduces:
    """One gradient all-reduce per stage whose two replicas sit on different devices; with
    data parallelism, one per stage (src = dst for a stage one device of the pipeline holds)."""

    stage: np.ndarray  # int32
    src: np.ndarray  # int32 the lower device
    dst: np.ndarray  # int32 the higher device (src when the pipeline holds one copy)
    after: np.ndarray  # int32 (k, 2): each device's last weight-gradient op of the stage (-1: none)

    def __len__(self) -> int:
        return int(self.stage.shape[0])


def messages(schedule: Schedule) -> Messages:
    """The messages of ``schedule`` (computed once per schedule)."""
    return derived(schedule, "messages", lambda s: _messages(dependencies(s)))


def _messages(deps: Dependencies) -> Messages:
    ops = deps.ops
    consumer, producer, kind = deps.edges
    sender, receiver, message_kind, via = _message_rows(consumer, producer, kind, ops.device, len(ops))
    return Messages(
        producer=sender,
        src=ops.device[sender],
        dst=ops.device[receiver],
        kind=message_kind,
        stage=ops.stage[sender],
        boundary=np.minimum(ops.stage[sender], ops.stage[receiver]),
        microbatch=ops.microbatch[sender],
        via=via,
    )


@njit(cache=True)
def _message_rows(consumer, producer, kind, device, num_ops):
    """One message per (producer, receiving device), whatever number of ops there read it,
    ordered by producer row, then receiving device. Returns (producer row, first consumer
    row, kind, via): ``via[e]`` is the message of dependency edge e, -1 when local."""
    num_edges = consumer.shape[0]
    # counting sort of the remote edges by producer row
    start = np.zeros(num_ops + 1, np.int64)
    for e in range(num_edges):
        if kind[e] >= 0:
            start[producer[e] + 1] += 1
    for x in range(num_ops):
        start[x + 1] += start[x]
    remote = start[num_ops]
    by_producer = np.empty(remote, np.int64)
    fill = start[:-1].copy()
    for e in range(num_edges):
        if kind[e] >= 0:
            by_producer[fill[producer[e]]] = e
            fill[producer[e]] += 1
    via = np.full(num_edges, -1, np.int32)
    sender = np.empty(remote, np.int32)
    receiver = np.empty(remote, np.int32)
    message_kind = np.empty(remote, np.int8)
    count = 0
    for x in range(num_ops):
        first = count
        for k in range(start[x], start[x + 1]):
            e = by_producer[k]
            target = device[consumer[e]]
            found = -1
            for t in range(first, count):
                if device[receiver[t]] == target:
                    found = t
            if found < 0:
                # keep this producer's messages ordered by receiving device
                found = count
                while found > first and device[receiver[found - 1]] > target:
                    sender[found] = sender[found - 1]
                    receiver[found] = receiver[found - 1]
                    message_kind[found] = message_kind[found - 1]
                    found -= 1
                sender[found] = x
                receiver[found] = consumer[e]
                message_kind[found] = kind[e]
                count += 1
        # edges learn their message once the producer's messages are in final order
        for k in range(start[x], start[x + 1]):
            e = by_producer[k]
            target = device[consumer[e]]
            for t in range(first, count):
                if device[receiver[t]] == target:
                    via[e] = t
    return sender[:count].copy(), receiver[:count].copy(), message_kind[:count].copy(), via


def allreduces(schedule: Schedule, *, data_parallel: bool = False) -> AllReduces:
    """The gradient all-reduces of ``schedule``: between replicas of a stage, and with
    ``data_parallel`` (d > 1 pipelines) of every stage (computed once per schedule)."""
    key = "allreduces+dp" if data_parallel else "allreduces"
    return derived(schedule, key, lambda s: _allreduces(dependencies(s), data_parallel))


def _allreduces(deps: Dependencies, data_parallel: bool) -> AllReduces:
    schedule, ops = deps.schedule, deps.ops
    stages, sources, targets, after = [], [], [], []
    if schedule.placement.num_replicas > 1 or data_parallel:
        ends = rule_arrays(schedule.rules).ends_weight_gradient
        weight_rows = np.flatnonzero(ends[ops.kind])
        # the last weight-gradient op of each (device, stage), by table position: rows
        # ascend, so the last occurrence of a key is its last op in table order
        keys = ops.device[weight_rows].astype(np.int64) * schedule.num_stages + ops.stage[weight_rows]
        unique_keys, first_in_reversed = np.unique(keys[::-1], return_index=True)
        last = {divmod(int(key), schedule.num_stages): int(weight_rows[len(weight_rows) - 1 - index])
                for key, index in zip(unique_keys.tolist(), first_in_reversed.tolist(), strict=True)}
        for stage in range(schedule.num_stages):
            if stage in schedule.frozen:
                continue  # a frozen stage has no weight gradient to reduce
            devices = sorted({replica[stage] for replica in schedule.placement.replicas})
            if data_parallel and len(devices) == 1 and (devices[0], stage) in last:
                stages.append(stage)
                sources.append(devices[0])
                targets.append(devices[0])
                after.append((last[(devices[0], stage)], -1))
            for a, b in itertools.pairwise(devices):
                releases = [last[(d, stage)] for d in (a, b) if (d, stage) in last]
                if not releases:
                    continue
                stages.append(stage)
                sources.append(a)
                targets.append(b)
                after.append((releases[0], releases[1] if len(releases) > 1 else -1))
    return AllReduces(
        stage=np.asarray(stages, np.int32),
        src=np.asarray(sources, np.int32),
        dst=np.asarray(targets, np.int32),
        after=np.asarray(after, np.int32).reshape(-1, 2),
    )


@dataclass(frozen=True, eq=False)
class CommSchedule:
    """A schedule with its communication: ``actions[d]`` is what device d does, in order."""

    schedule: Schedule
    actions: tuple[tuple[Action, ...], ...]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommSchedule) and self.actions == other.actions

    def __hash__(self) -> int:
        return hash(self.actions)

    def text_rows(self) -> list[list[str]]:
        """PyTorch's action strings, one row per device (``0F1``, ``0SEND_F1``, ...)."""
        return [[str(action) for action in row] for row in self.actions]


def with_communication(schedule: Schedule) -> CommSchedule:
    """The compute table of ``schedule`` with its sends, receives and all-reduces.

    Raises PipeschedError when the tables deadlock (no device can take its next op).

    >>> from pipesched.generators import generate
    >>> [str(a) for a in with_communication(generate("gpipe", 2, 1)).actions[0]]
    ['0F0', '0SEND_F0', '0RECV_B0', '0B0']
    """
    deps = dependencies(schedule)
    sent = messages(schedule)
    reduces = allreduces(schedule)
    ops = deps.ops
    num_devices = schedule.num_devices
    # messages each op sends, by producer row (messages are sorted by producer)
    sends_from = np.searchsorted(sent.producer, np.arange(len(ops) + 1))
    reduce_after: dict[int, list[AllReduce]] = {}
    for j in range(len(reduces)):
        a, b = int(reduces.src[j]), int(reduces.dst[j])
        for row, peer in zip(reduces.after[j].tolist(), (b, a), strict=True):
            if row >= 0:
                reduce_after.setdefault(row, []).append(AllReduce(int(reduces.stage[j]), peer))
    # a replica that no microbatch went through still joins its stage's all-reduce, at the end
    tail: list[list[AllReduce]] = [[] for _ in range(num_devices)]
    for j in range(len(reduces)):
        a, b = int(reduces.src[j]), int(reduces.dst[j])
        for slot, device, peer in ((0, a, b), (1, b, a)):
            if reduces.after[j, slot] < 0:
                tail[device].append(AllReduce(int(reduces.stage[j]), peer))
    plans: list[list[Action]] = [[] for _ in range(num_devices)]
    # per device, the table entries and the op rows each covers (a fused entry: its parts')
    entries = schedule.device_ops
    first_row = [np.cumsum([0, *(len(op.atoms) for op in ops)]) + int(ops_start)
                 for ops, ops_start in zip(entries, ops.device_offsets[:-1].tolist(), strict=True)]
    position = [0] * num_devices
    done = np.zeros(len(ops), np.bool_)
    need_row = deps.need_row
    remaining = sum(len(row) for row in entries)
    while remaining:
        progress = False
        for device in range(num_devices):
            index = position[device]
            if index == len(entries[device]):
                continue
            rows = range(int(first_row[device][index]), int(first_row[device][index + 1]))
            # an entry runs once every input of every part has run (a fused entry's parts
            # take nothing from each other)
            if not all(done[r] for x in rows for r in need_row[x] if r >= 0):
                continue
            plans[device].append(entries[device][index])
            position[device] += 1
            remaining -= 1
            progress = True
            for x in rows:
                done[x] = True
            for x in rows:
                for t in range(sends_from[x], sends_from[x + 1]):
                    message = Message(int(sent.kind[t]), int(sent.stage[t]), int(sent.microbatch[t]))
                    plans[device].append(Send(message, int(sent.dst[t])))
                    plans[int(sent.dst[t])].append(Recv(message, device))
                plans[device].extend(reduce_after.get(x, ()))
        if not progress:
            stuck = "; ".join(f"device {d} waits at {entries[d][position[d]]}"
                              for d in range(num_devices) if position[d] < len(entries[d]))
            raise PipeschedError(
                f"schedule={schedule.name}: the tables deadlock ({stuck}); run `pipesched validate` for the report"
            )
    for device in range(num_devices):
        plans[device].extend(tail[device])
    return CommSchedule(schedule, tuple(tuple(plan) for plan in plans))
