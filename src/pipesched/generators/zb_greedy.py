"""The zero-bubble paper's automatic scheduling heuristic for one stage per device (Qi et al.,
ICLR 2024, section 3.1), as a pure function.

It lays the table microbatch by microbatch while tracking when each op would end, with
per-stage F, I, W costs, a link latency between neighbouring stages, and the paper's memory
accounting: a stage-microbatch holds M_B from its F until its I, and M_W (what W still needs)
from its I until its W; a device may hold at most ``activation_limit`` (in units of M_B).

- microbatch 0: every device runs F0; then, from the last device back, a device adds warm-up
  forwards while they end before the first input gradient can arrive and memory allows
  (never as many as the device before it), then the I0 chain runs back up;
- microbatch k > 0: each device decides whether to run its next forward now (when the next
  device is two forwards behind and prioritising I, it may postpone it); before an F or I
  whose input is not ready yet it runs owed W that fit in the wait, one more when the wait is
  longer than its share of the worst bubble (or always, filling greedily), and owed W
  whenever memory is full;
- the W still owed close the iteration.

Three policy switches (bubble allowed before the first I, prioritise I, fill waits with W
greedily) give eight variants; the one whose longest device span (first F to last W) is
shortest wins, the first in switch order on ties. Each device's table is its ops by end time.
A variant is not run when it differs from one already run only in switches that no
decision of that run turned on: it would make the same decisions.

This is the reference's algorithm (sail-sg/zero-bubble-pipeline-parallelism, scheduler
``zb.py``) step for step, tested op for op against its output, with one deviation: the
warm-up of microbatch 0 never gives a device more forwards than the device before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.ops import F, I, Op, OpKind, W
from pipesched.rules import RULES

# the heuristic's inner loop indexes plain lists by kind: F, I, W as 0, 1, 2 (also their
# order among ops that end together)
_KINDS = (F, I, W)
_F, _I, _W = range(3)
SWITCHES = ("bubble_before_first_i", "prioritise_i", "greedy_fill")  # the policy switches, in their order


@dataclass(frozen=True)
class Memory:
    """The paper's activation accounting, in units of M_B (what F allocates)."""

    limit: float  # most a device may hold
    m_w: float = 1.0  # M_W / M_B: what a stage-microbatch still holds between its I and W

    def delta(self, kind: OpKind) -> float:
        """The rules' memory effect of ``kind`` with M_B = 1 and M_W = ``m_w``: F adds M_B,
        I frees M_B - M_W, W frees M_W."""
        return RULES[kind].memory.bytes(1.0, 1.0 - self.m_w)


@dataclass(slots=True)
class _Device:
    ops: list[tuple[int, int]] = field(default_factory=list)  # (kind index, microbatch) as placed
    free_at: float = 0.0  # when the last placed op ends
    held: float = 0.0  # activations held, in M_B
    bubble: float = 0.0  # idle time since the device's first forward
    placed: list[int] = field(default_factory=lambda: [0, 0, 0])  # ops placed per kind index


class _Pass:
    def __init__(self, m: int, costs: StageCosts, memory: Memory, latency: float, *,
                 bubble_before_first_i: bool, prioritise_i: bool, greedy_fill: bool) -> None:
        self.p = costs.num_stages
        self.m, self.costs, self.memory, self.latency = m, costs, memory, latency
        self.bubble_before_first_i = bubble_before_first_i
        self.prioritise_i = prioritise_i
        self.greedy_fill = greedy_fill
        self.devices = [_Device() for _ in range(self.p)]
        # end[kind][device][microbatch]: when each placed op ends
        self.end = [[[0.0] * m for _ in range(self.p)] for _ in _KINDS]
        # looked up millions of times: each kind's duration per device and memory effect
        self._cost = [[costs.duration(Op(device, kind, 0)) for device in range(self.p)] for kind in _KINDS]
        self._delta = [memory.delta(kind) for kind in _KINDS]
        self._max_bubble = 0.0  # bubbles only grow: the running maximum is the maximum
        # the switches some decision of this pass read with an outcome their other value
        # would have changed: a pass with any others flipped makes the same decisions
        self.decisive: set[str] = set()

    def cost(self, kind: int, device: int) -> float:
        return self._cost[kind][device]

    def put(self, device: int, kind: int) -> None:
        dev = self.devices[device]
        placed = dev.placed
        microbatch = placed[kind]
        duration = self._cost[kind][device]
        ends = no_wait = dev.free_at + duration
        # inputs from the neighbours, one link latency away: activations from d-1,
        # gradients from d+1
        if kind == _F:
            if device > 0:
                ends = max(ends, self.end[_F][device - 1][microbatch] + self.latency + duration)
        elif kind == _I and device < self.p - 1:
            ends = max(ends, self.end[_I][device + 1][microbatch] + self.latency + duration)
        if placed[_F] > 0:
            bubble = dev.bubble = dev.bubble + (ends - no_wait)
            if bubble > self._max_bubble:
                self._max_bubble = bubble
        dev.free_at = self.end[kind][device][microbatch] = ends
        dev.held += self._delta[kind]
        placed[kind] = microbatch + 1
        dev.ops.append((kind, microbatch))

    def ready(self, kind: int, device: int, microbatch: int) -> float:
        """When the output of op (device, kind, microbatch) reaches the neighbour."""
        return self.end[kind][device][microbatch] + self.latency

    def owes_w(self, device: int) -> bool:
        placed = self.devices[device].placed
        return placed[_W] < placed[_I]

    def max_bubble(self) -> float:
        return self._max_bubble

    def make_room(self, device: int, kind: int) -> None:
        """Owed W free memory until ``kind`` fits."""
        dev = self.devices[device]
        while dev.held + self._delta[kind] > self.memory.limit:
            if not self.owes_w(device):
                raise PipeschedError(
                    f"activation_limit={self.memory.limit:g}: too small for the next {_KINDS[kind].value} on "
                    f"device {device}; give at least 1 (one microbatch's M_B)"
                )
            self.put(device, _W)

    def fill_before(self, device: int, ready: float) -> None:
        """Run owed W that end before ``ready``; one more when the wait is more than this
        device may idle compared with the worst (or always, in greedy fill)."""
        dev = self.devices[device]
        placed, w_cost = dev.placed, self._cost[_W][device]
        while placed[_W] < placed[_I] and dev.free_at + w_cost <= ready:
            self.put(device, _W)
        waits = ready - dev.free_at
        if placed[_W] < placed[_I] and waits > 0:
            if waits > self._max_bubble - dev.bubble:
                self.put(device, _W)
            else:
                self.decisive.add("greedy_fill")
                if self.greedy_fill:
                    self.put(device, _W)

    def first_microbatch(self) -> None:
        p, m, latency = self.p, self.m, self.latency
        for device in range(p):
            self.put(device, _F)
        # warm-up forwards per device, sized from the last device back: stop when they
        # would end after the first input gradient arrives or memory is full
        extra = [0] * p
        arrives = self.end[_F][p - 1][0] + self.cost(_I, p - 1)
        for device in reversed(range(p - 1)):
            dev = self.devices[device]
            held, busy = dev.held, dev.free_at
            while (dev.placed[_F] + extra[device] < m
                   and held + self._delta[_F] <= self.memory.limit):
                late = busy + self.cost(_F, device) > arrives + latency  # ends after the gradient
                if late != (busy >= arrives + latency):  # ... or starts after it
                    self.decisive.add("bubble_before_first_i")
                if late if self.bubble_before_first_i else busy >= arrives + latency:
                    break
                held += self._delta[_F]
                busy += self.cost(_F, device)
                extra[device] += 1
            arrives = max(busy, arrives + latency) + self.cost(_I, device)
        # each device runs fewer warm-up forwards than the one before it, and never more:
        # the reference stops lowering a device that has all m forwards, which with few
        # microbatches lets it run ahead of the device before it; it then never places that
        # device's remaining forwards and lists them first in its table, at time 0
        for device in range(1, p):
            while (extra[device] > 0 and extra[device] >= extra[device - 1]
                   and self.devices[device].placed[_F] + extra[device] < m):
                extra[device] -= 1
            extra[device] = min(extra[device], extra[device - 1])
        for device in range(p):
            for _ in range(extra[device]):
                self.put(device, _F)
        for device in reversed(range(p)):
            self.put(device, _I)

    def wants_forward(self, device: int) -> bool:
        """Whether the device runs its next forward in this round."""
        dev = self.devices[device]
        if dev.placed[_F] >= self.m:
            return False
        if not (device + 1 < self.p and dev.placed[_F] >= self.devices[device + 1].placed[_F] + 2):
            return True
        # the next device is two forwards behind: with prioritise_i its F and I come first
        prioritised = self._prioritised(device)
        if not prioritised:
            self.decisive.add("prioritise_i")
        return prioritised or not self.prioritise_i

    def _prioritised(self, device: int) -> bool:
        """Whether the device runs its next forward when its next device's F and I come first."""
        dev, nxt = self.devices[device], self.devices[device + 1]
        next_done = nxt.free_at + self.cost(_F, device + 1) + self.cost(_I, device + 1) + self.latency
        if dev.free_at >= next_done:
            return False
        owed_cost, owed, held = 0.0, 0, dev.held + self._delta[_F]
        while held > self.memory.limit and dev.placed[_W] + owed < dev.placed[_I]:
            owed_cost += self.cost(_W, device)
            held += self._delta[_W]
            owed += 1
        if dev.free_at + self.cost(_F, device) + owed_cost <= next_done:
            return True
        return next_done - dev.free_at > self.max_bubble() - dev.bubble

    def later_microbatch(self, k: int) -> None:
        p = self.p
        wanted = [self.wants_forward(device) for device in range(p)]
        # a device runs a forward only if the next one does too
        for device in range(p - 2, -1, -1):
            wanted[device] = wanted[device] and wanted[device + 1]
        for device in range(p):
            if not wanted[device]:
                continue
            self.make_room(device, _F)
            if device > 0:
                self.fill_before(device, self.ready(_F, device - 1, self.devices[device].placed[_F]))
            self.put(device, _F)
        for device in reversed(range(p)):
            self.make_room(device, _I)
            if device + 1 < p:
                self.fill_before(device, self.ready(_I, device + 1, k))
            if device == 0 and self.devices[0].placed[_F] == self.m:
                while self.owes_w(0):
                    self.put(0, _W)
            self.put(device, _I)

    def run(self) -> None:
        self.first_microbatch()
        for k in range(1, self.m):
            self.later_microbatch(k)
        for device in range(self.p):
            while self.owes_w(device):
                self.put(device, _W)

    def longest_span(self) -> float:
        """The longest time from a device's first F starting to its last W ending."""
        return max(self.end[_W][device][self.m - 1] - (self.end[_F][device][0] - self.cost(_F, device))
                   for device in range(self.p))

    def tables(self) -> list[list[Op]]:
        """Each device's ops by end time (ties: F, I, W, then microbatch)."""
        end = self.end
        return [[Op(device, _KINDS[kind], mb) for kind, mb in
                 sorted(dev.ops, key=lambda entry: (end[entry[0]][device][entry[1]], entry[0], entry[1]))]
                for device, dev in enumerate(self.devices)]


def zb_greedy(m: int, costs: StageCosts, memory: Memory, *, latency: float = 0.0) -> list[list[Op]]:
    """Per-device op orders (one stage per device, p = the stages of ``costs``) of the best
    of the heuristic's eight variants.

    >>> tables = zb_greedy(3, StageCosts.uniform(2), Memory(limit=2))
    >>> [str(op) for op in tables[1]]
    ['1F0', '1I0', '1F1', '1I1', '1W0', '1F2', '1I2', '1W1', '1W2']
    """
    best: tuple[float, _Pass] | None = None
    run: list[tuple[dict[str, bool], set[str]]] = []  # each pass run: its switches, the decisive ones
    for values in product((True, False), repeat=3):
        switches = dict(zip(SWITCHES, values, strict=True))
        if any(all(switches[name] == done[name] or name not in decisive for name in SWITCHES)
               for done, decisive in run):
            continue  # it would repeat a pass already run, decision for decision
        attempt = _Pass(m, costs, memory, latency, **switches)
        attempt.run()
        run.append((switches, attempt.decisive))
        span = attempt.longest_span()
        if best is None or span < best[0]:
            best = (span, attempt)
    assert best is not None
    return best[1].tables()
