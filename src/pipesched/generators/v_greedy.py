"""The zero-bubble V-shape heuristic (Qi et al., ICLR 2024, section 6; the ``v_schedule``
module of sail-sg/zero-bubble-pipeline-parallelism), as a pure function.

Device d holds the "down" stage d (chunk 0) and the "up" stage 2p-1-d (chunk 1). A forward
goes down the devices through chunk 0 and back up through chunk 1; its backward retraces the
V: up-chunk input gradients (I) travel from device 0 to p-1, down-chunk ones back to 0.

The heuristic lays ops device by device in rounds, tracking when each would end if the
tables ran with no communication cost: (1) a warm-up of forwards sized so that the first
microbatch's up-forward arrives just when the device runs out of work, within the memory
limit (in-flight stage-microbatches per device: F takes one, W gives it back); (2) rounds of
one I and at most one F per device, where deferred weight gradients (W) fill any wait and
are forced in when memory is full; (3) the W still owed. It tries its two bubble-filling
policies, re-runs each with the bubbles of the previous run as allowances while that helps,
and keeps the schedule with the shortest iteration.

The published heuristic assumes equal stage costs and 1F1B's memory (2p per device). Here a
device whose next op's input is not placed yet (uneven costs) or that is full with no W to
run (a lower limit) sits the round out instead of failing, so any limit >= 2 works; below 2p
the bubble grows as memory shrinks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.ops import F, I, Op, OpKind, W
from pipesched.rules import RULES

DOWN, UP = 0, 1


class Infeasible(Exception):
    """A pass of the heuristic got stuck: no device could place an op."""


@dataclass
class _Device:
    """Book-keeping of one device while the heuristic fills its table."""

    ops: list[Op] = field(default_factory=list)
    free_at: float = 0.0  # when the last placed op ends
    held: int = 0  # stage-microbatches in flight (F placed, W not yet)
    bubble: float = 0.0  # idle time since the device's first op
    # placed F and I per chunk (DOWN, UP); W is tracked by the pending queue
    forwards: list[int] = field(default_factory=lambda: [0, 0])
    inputs: list[int] = field(default_factory=lambda: [0, 0])
    pending_w: deque[Op] = field(default_factory=deque)


class _Pass:
    """One run of the heuristic with fixed policies; raises Infeasible when stuck."""

    def __init__(self, p: int, m: int, costs: StageCosts, limit: int, *, fill_f: bool, fill_i: bool,
                 allowance: list[float] | None) -> None:
        self.p, self.m, self.costs, self.limit = p, m, costs, limit
        self.fill_f, self.fill_i = fill_f, fill_i
        self.allowance = allowance or [-1.0] * p
        self.devices = [_Device() for _ in range(p)]
        self.end: dict[Op, float] = {}

    # --- geometry -----------------------------------------------------------------------
    def stage(self, device: int, chunk: int) -> int:
        return device if chunk == DOWN else 2 * self.p - 1 - device

    def upstream(self, device: int, kind: OpKind, chunk: int, mb: int) -> Op | None:
        """The op on a neighbour device whose output this op waits for (None at the V's ends).

        Forwards flow down chunk 0 (from d-1) and up chunk 1 (from d+1); input gradients flow
        the other way round: chunk 1 from d-1, chunk 0 from d+1.
        """
        if kind is F:
            source = device - 1 if chunk == DOWN else device + 1
        else:
            source = device + 1 if chunk == DOWN else device - 1
        if not 0 <= source < self.p:
            return None
        return Op(self.stage(source, chunk), kind, mb)

    def local_needs(self, device: int, kind: OpKind, chunk: int, mb: int) -> Op | None:
        """The op on the same device that must already be placed (the V's turn and its
        retrace): F up after F down, I up after F up, I down after I up."""
        if kind is F and chunk == UP:
            return Op(self.stage(device, DOWN), F, mb)
        if kind is I:
            return Op(self.stage(device, UP), F if chunk == UP else I, mb)
        return None

    def max_bubble(self, device: int | None = None) -> float:
        worst = max(d.bubble for d in self.devices)
        if device is not None:
            worst = max(worst, max(self.allowance) - self.allowance[device])
        return worst

    # --- placing ops --------------------------------------------------------------------
    def put(self, device: int, kind: OpKind, chunk: int) -> None:
        dev = self.devices[device]
        counter = dev.forwards if kind is F else dev.inputs
        mb = counter[chunk]
        if mb >= self.m:
            raise Infeasible(f"device {device} has no {kind} left in chunk {chunk}")
        op = Op(self.stage(device, chunk), kind, mb)
        if kind is F and dev.held + 1 > self.limit:
            raise Infeasible(f"device {device} would exceed {self.limit} in flight")
        local = self.local_needs(device, kind, chunk, mb)
        if local is not None and local not in self.end:
            raise Infeasible(f"{op} placed before {local}")
        duration = self.costs.of(kind, op.stage)
        ends = no_wait = dev.free_at + duration
        source = self.upstream(device, kind, chunk, mb)
        if source is not None:
            if source not in self.end:
                raise Infeasible(f"{op} placed before {source}")
            ends = max(ends, self.end[source] + duration)
        self._record(dev, op, ends, no_wait)
        counter[chunk] += 1
        dev.held += RULES.units_delta(kind)
        if kind is not F:
            dev.pending_w.append(Op(op.stage, W, mb))

    def put_w(self, device: int) -> None:
        dev = self.devices[device]
        if not dev.pending_w:
            raise Infeasible(f"device {device} is full and owes no W to free memory")
        op = dev.pending_w.popleft()
        ends = dev.free_at + self.costs.of(W, op.stage)
        self._record(dev, op, ends, ends)
        dev.held += RULES.units_delta(W)

    def _record(self, dev: _Device, op: Op, ends: float, no_wait: float) -> None:
        if dev.forwards[DOWN] > 0:
            dev.bubble += ends - no_wait
        dev.free_at = self.end[op] = ends
        dev.ops.append(op)

    def arrival(self, device: int, kind: OpKind, chunk: int) -> float | None:
        """When the input of the device's next (kind, chunk) op is ready; None if its source
        is not placed yet or there is none."""
        dev = self.devices[device]
        counter = dev.forwards if kind is F else dev.inputs
        source = self.upstream(device, kind, chunk, counter[chunk])
        if source is None:
            return None
        return self.end.get(source)

    def fill_wait(self, device: int, ready: float | None, *, fill: bool) -> None:
        """Before an op whose input arrives at ``ready``, run owed W that end in time; one more
        W when the wait exceeds what this device may idle compared with the worst device."""
        if ready is None:
            return
        dev = self.devices[device]
        while dev.pending_w and ready >= dev.free_at + self.costs.of(W, dev.pending_w[0].stage):
            self.put_w(device)
        if dev.pending_w and ready - dev.free_at > self.max_bubble(device) - dev.bubble and fill:
            self.put_w(device)

    # --- the three phases ---------------------------------------------------------------
    def run(self) -> list[list[Op]]:
        p = self.p
        self.warm_up()
        # rounds of one I and at most one F per device; with equal stage costs every device
        # places its I in every round, with uneven ones a device may wait a round
        while any(sum(dev.inputs) < 2 * self.m for dev in self.devices):
            if not self.place_inputs() + self.place_forwards():
                raise Infeasible("no device can place an op")
        for device in range(p):
            while self.devices[device].pending_w:
                self.put_w(device)
        return [dev.ops for dev in self.devices]

    def warm_up(self) -> None:
        p, m = self.p, self.m
        # the first microbatch runs down the V
        for device in range(p):
            self.put(device, F, DOWN)
        # and back up; meanwhile each device takes more down-forwards while they end before
        # the up-forward arrives and memory allows the whole diagonal of them
        for device in reversed(range(p)):
            if device < p - 1:
                arrives = self.end[Op(self.stage(device + 1, UP), F, 0)]
                dev = self.devices[device]
                while (dev.held + 2 + 2 * device <= self.limit
                       and dev.free_at + self.costs.of(F, self.stage(device, DOWN)) <= arrives
                       and dev.forwards[DOWN] < m - device):
                    for upper in range(device + 1):
                        self.put(upper, F, DOWN)
            self.put(device, F, UP)
        # later devices catch up with their predecessor, alternating chunks
        chunk = DOWN
        for device in range(1, p):
            prev, dev = self.devices[device - 1], self.devices[device]
            idle_sweeps = 0
            while idle_sweeps < 2 and (sum(dev.forwards) < sum(prev.forwards)
                                       or dev.forwards[UP] <= prev.forwards[UP] < m):
                placed = 0
                for lower in range(p - 1, device - 1, -1):
                    if self.ready_to_forward(lower, chunk):
                        self.put(lower, F, chunk)
                        placed += 1
                # with few microbatches a sweep may find nothing to place in one chunk
                idle_sweeps = 0 if placed else idle_sweeps + 1
                chunk = 1 - chunk

    def ready_to_forward(self, device: int, chunk: int) -> bool:
        """The device has a forward left in ``chunk``, room for it, and its input placed."""
        return self.devices[device].held + 1 <= self.limit and self.inputs_placed(device, F, chunk)

    def inputs_placed(self, device: int, kind: OpKind, chunk: int) -> bool:
        """The device has a ``kind`` op left in ``chunk`` and what it needs is placed."""
        dev = self.devices[device]
        mb = (dev.forwards if kind is F else dev.inputs)[chunk]
        if mb >= self.m:
            return False
        needs = [self.upstream(device, kind, chunk, mb), self.local_needs(device, kind, chunk, mb)]
        return all(op is None or op in self.end for op in needs)

    def place_inputs(self) -> int:
        p, m = self.p, self.m
        up_devices, down_devices = [], []
        for device in range(p):
            dev = self.devices[device]
            if dev.inputs[DOWN] >= dev.inputs[UP]:
                up_devices.append(device)
            elif device == p - 1:
                down_devices.append(device)
            else:
                gradient = Op(self.stage(device + 1, DOWN), I, dev.inputs[DOWN])
                if gradient in self.end or dev.inputs[UP] >= m:
                    down_devices.append(device)
                else:
                    up_devices.append(device)
        # down-chunk gradients travel towards device 0: place them from the far end first
        order = [(d, DOWN) for d in reversed(down_devices)] + [(d, UP) for d in up_devices]
        placed = 0
        for device, chunk in order:
            if not self.inputs_placed(device, I, chunk):
                continue
            ready = self.arrival(device, I, chunk)
            self.fill_wait(device, ready, fill=chunk == DOWN or self.fill_i)
            self.put(device, I, chunk)
            placed += 1
        return placed

    def place_forwards(self) -> int:
        p, m = self.p, self.m
        placed = 0
        for device in range(p):
            dev = self.devices[device]
            if dev.forwards[UP] >= m:
                continue
            chunk = None
            if dev.forwards[UP] >= dev.forwards[DOWN]:
                chunk = DOWN
            elif device == p - 1 or Op(self.stage(device + 1, UP), F, dev.forwards[UP]) in self.end:
                chunk = UP
            elif dev.forwards[DOWN] < m and (
                device == 0 or Op(self.stage(device - 1, DOWN), F, dev.forwards[DOWN]) in self.end
            ):
                chunk = DOWN
            if chunk is None or not self.inputs_placed(device, F, chunk):
                continue
            if dev.held + 1 > self.limit and not dev.pending_w:
                continue  # full until an I of this device makes a W available
            # memory: a forward needs a free in-flight slot; owed W free one each
            while dev.held + 1 > self.limit:
                self.put_w(device)
            self.fill_wait(device, self.arrival(device, F, chunk), fill=self.fill_f)
            self.put(device, F, chunk)
            placed += 1
        return placed

    def makespan(self) -> float:
        return max(dev.free_at for dev in self.devices)


def v_greedy(p: int, m: int, costs: StageCosts, activation_limit: int) -> list[list[Op]] | None:
    """Per-device op orders of the best schedule the heuristic finds; None when every
    policy gets stuck."""
    best: tuple[float, float, list[list[Op]]] | None = None
    for fill_i in (True, False):
        for fill_f in (True, False):
            allowance = None
            previous_bubble = None
            # re-run with the bubbles just found as allowances while the worst bubble shrinks
            while True:
                attempt = _Pass(p, m, costs, activation_limit, fill_f=fill_f, fill_i=fill_i, allowance=allowance)
                try:
                    tables = attempt.run()
                except Infeasible:
                    break
                worst = attempt.max_bubble()
                key = (attempt.makespan(), worst)
                if best is None or key < best[:2]:
                    best = (key[0], key[1], tables)
                if previous_bubble is not None and worst >= previous_bubble:
                    break
                previous_bubble = worst
                allowance = [dev.bubble for dev in attempt.devices]
    return None if best is None else best[2]
