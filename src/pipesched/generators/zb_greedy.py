"""The zero-bubble heuristic for one stage per device (Qi et al., ICLR 2024, section 3; the
``zb`` scheduler of sail-sg/zero-bubble-pipeline-parallelism), as a pure function.

It lays the table microbatch by microbatch while tracking when each op would end if the
tables ran with no communication cost, with per-stage F, I, W costs and a memory limit
(stage-microbatches in flight per device: F takes one, W gives it back):

- microbatch 0: every device runs F0; then, from the last device back, a device adds
  warm-up forwards while they end before the first input gradient can arrive and memory
  allows (fewer on each later device), then the I0 chain runs back up;
- microbatch k > 0: each device decides whether to run its next forward now (possibly
  postponing it when the next device is two forwards behind and the I would wait); before
  an F or I whose input is not ready yet it runs owed W that fit in the wait, and owed W
  whenever memory is full;
- the W still owed close the iteration.

Three policy switches (bubble allowed before the first I, prioritise I over F, fill waits
with W greedily) give eight variants; the one with the shortest iteration wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from pipesched.costs import StageCosts
from pipesched.ops import F, I, Op, OpKind, W
from pipesched.rules import RULES


@dataclass
class _Device:
    ops: list[Op] = field(default_factory=list)
    free_at: float = 0.0  # when the last placed op ends
    held: int = 0  # stage-microbatches in flight
    bubble: float = 0.0  # idle time since the device's first op
    placed: dict[OpKind, int] = field(default_factory=lambda: {F: 0, I: 0, W: 0})


class _Pass:
    def __init__(self, m: int, costs: StageCosts, limit: int, *, bubble_before_first_i: bool,
                 prioritise_i: bool, greedy_fill: bool) -> None:
        self.p = len(costs.forward)
        self.m, self.costs, self.limit = m, costs, limit
        self.bubble_before_first_i = bubble_before_first_i
        self.prioritise_i = prioritise_i
        self.greedy_fill = greedy_fill
        self.devices = [_Device() for _ in range(self.p)]
        self.end: dict[Op, float] = {}

    def cost(self, kind: OpKind, device: int) -> float:
        return self.costs.of(kind, device)

    def put(self, device: int, kind: OpKind) -> None:
        dev = self.devices[device]
        mb = dev.placed[kind]
        op = Op(device, kind, mb)
        duration = self.cost(kind, device)
        ends = no_wait = dev.free_at + duration
        # inputs from the neighbours: activations from d-1, gradients from d+1
        if kind is F and device > 0:
            ends = max(ends, self.end[Op(device - 1, F, mb)] + duration)
        if kind is I and device < self.p - 1:
            ends = max(ends, self.end[Op(device + 1, I, mb)] + duration)
        if dev.placed[F] > 0:
            dev.bubble += ends - no_wait
        dev.free_at = self.end[op] = ends
        dev.held += RULES.units_delta(kind)
        dev.placed[kind] += 1
        dev.ops.append(op)

    def owes_w(self, device: int) -> bool:
        placed = self.devices[device].placed
        return placed[W] < placed[I]

    def max_bubble(self) -> float:
        return max(dev.bubble for dev in self.devices)

    def fill_before(self, device: int, ready: float) -> None:
        """Run owed W that end before ``ready``; one more when the wait is more than this
        device may idle compared with the worst (or always, in greedy fill)."""
        dev = self.devices[device]
        while self.owes_w(device) and dev.free_at + self.cost(W, device) <= ready:
            self.put(device, W)
        waits = ready - dev.free_at
        if self.owes_w(device) and waits > 0 and (waits > self.max_bubble() - dev.bubble or self.greedy_fill):
            self.put(device, W)

    def make_room(self, device: int) -> None:
        """Owed W free memory for the next forward (the limit guarantees one is owed)."""
        while self.devices[device].held + 1 > self.limit:
            # each round runs at most one F per I, so with limit >= 1 a W is owed here
            assert self.owes_w(device), "memory limit below one microbatch in flight"
            self.put(device, W)

    def first_microbatch(self) -> None:
        p, m = self.p, self.m
        for device in range(p):
            self.put(device, F)
        # warm-up forwards per device, sized from the last device back: stop when they
        # would end after the first input gradient arrives or memory is full
        extra = [0] * p
        arrives = 0.0
        for device in reversed(range(p)):
            dev = self.devices[device]
            if device == p - 1:
                arrives = self.end[Op(device, F, 0)] + self.cost(I, device)
                continue
            held, busy = dev.held, dev.free_at
            while dev.placed[F] + extra[device] < m and held + 1 <= self.limit:
                if self.bubble_before_first_i:
                    if busy + self.cost(F, device) > arrives:
                        break
                elif busy >= arrives:
                    break
                held += 1
                busy += self.cost(F, device)
                extra[device] += 1
            arrives = max(busy, arrives) + self.cost(I, device)
        # each device runs fewer warm-up forwards than the one before it, and never more
        # (it cannot run a forward the previous device has not)
        for device in range(1, p):
            while (extra[device] > 0 and extra[device] >= extra[device - 1]
                   and self.devices[device].placed[F] + extra[device] < m):
                extra[device] -= 1
            extra[device] = min(extra[device], extra[device - 1])
        for device in range(p):
            for _ in range(extra[device]):
                self.put(device, F)
        for device in reversed(range(p)):
            self.put(device, I)

    def wants_forward(self, device: int) -> bool:
        """Whether the device runs its next forward in this round."""
        dev = self.devices[device]
        if dev.placed[F] >= self.m:
            return False
        if device + 1 < self.p and self.prioritise_i and dev.placed[F] >= self.devices[device + 1].placed[F] + 2:
            # the next device is two forwards behind: its F and I come first
            nxt = self.devices[device + 1]
            next_done = nxt.free_at + self.cost(F, device + 1) + self.cost(I, device + 1)
            if dev.free_at >= next_done:
                return False
            owed_cost, owed, held = 0.0, 0, dev.held + 1
            while held > self.limit and dev.placed[W] + owed < dev.placed[I]:
                owed_cost += self.cost(W, device)
                held -= 1
                owed += 1
            if dev.free_at + self.cost(F, device) + owed_cost <= next_done:
                return True
            if next_done - dev.free_at <= self.max_bubble() - dev.bubble:
                return False
        return True

    def later_microbatch(self, k: int) -> None:
        p = self.p
        wanted = [self.wants_forward(device) for device in range(p)]
        # a device runs a forward only if the next one does too
        for device in range(p - 2, -1, -1):
            wanted[device] = wanted[device] and wanted[device + 1]
        for device in range(p):
            if not wanted[device]:
                continue
            self.make_room(device)
            if device > 0:
                self.fill_before(device, self.end[Op(device - 1, F, self.devices[device].placed[F])])
            self.put(device, F)
        for device in reversed(range(p)):
            if device + 1 < p:
                self.fill_before(device, self.end[Op(device + 1, I, k)])
            if device == 0 and self.devices[0].placed[F] == self.m:
                while self.owes_w(0):
                    self.put(0, W)
            self.put(device, I)

    def run(self) -> list[list[Op]]:
        self.first_microbatch()
        for k in range(1, self.m):
            self.later_microbatch(k)
        for device in range(self.p):
            while self.owes_w(device):
                self.put(device, W)
        return [dev.ops for dev in self.devices]

    def makespan(self) -> float:
        return max(dev.free_at for dev in self.devices)


def zb_greedy(m: int, costs: StageCosts, memory_limit: int) -> list[list[Op]]:
    """Per-device op orders (one stage per device, p = number of stages in ``costs``) of
    the best of the heuristic's eight variants. ``memory_limit`` must be at least 1."""
    best: tuple[float, float, list[list[Op]]] | None = None
    for before_first_i, prioritise_i, greedy_fill in product((True, False), repeat=3):
        attempt = _Pass(m, costs, memory_limit, bubble_before_first_i=before_first_i,
                        prioritise_i=prioritise_i, greedy_fill=greedy_fill)
        tables = attempt.run()
        key = (attempt.makespan(), attempt.max_bubble())
        if best is None or key < best[:2]:
            best = (key[0], key[1], tables)
    assert best is not None
    return best[2]
