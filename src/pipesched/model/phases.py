"""A layer's forward and backward as phases, and an overlapped forward-backward pair (DualPipe's
F&B, Megatron's EP overlap) computed from them as a two-stream schedule.

A chunk (one layer, or a stage's layers) runs on one device's compute stream and its
communication stream. Its forward is, per layer and in ``PHASES`` order (attention, dispatch,
experts (MLP), combine), the phase's kernels on the compute stream, then the collectives that
end the phase on the communication stream (the dispatch and combine all-to-alls, the
tensor-parallel all-reduces); its backward walks the phases in reverse (combine, MLP,
dispatch, attention), each the input-gradient part of its kernels (I), then its backward
collectives; the weight-gradient parts (W) wait for the next collective and run beside it
(they need only their I), as in DeepSeek-V3's report (section 3.2.2: "for a backward chunk,
both attention and MLP are further split into two parts, backward for input and backward
for weights"; its profile runs MLP(W) beside DISPATCH(B)). The recompute a backward redoes
comes first. Otherwise phases follow one another within a microbatch: a lone forward takes
the sum of its phases, F as ``layer_costs`` gives it, and the phases of a backward sum to
its I + W.

An overlapped pair runs one microbatch's forward beside another's backward (``pair``): each
stream runs one phase at a time, and a free stream starts the next phase of one of the two
microbatches: the one ready longest, the one with the most time left (its critical path), or
the one least far through its chunk (both progress alike, so the forward's compute is spread
over the backward's all-to-alls), or the one with the least compute before its next
all-to-all (the link kept busy), ties to the forward or to the backward; the shortest of
these eight schedules is kept, as an interleaving planned once ahead. So one microbatch's all-to-all runs during the other's
compute. While a communication phase runs, the compute
beside it has only ``1 - comm_sm_fraction`` of the device's compute units (DeepSeek-V3: 20
of 132 SMs go to communication) and slows in proportion; alone, compute runs at full speed.

So the pair is never shorter than its longer part (the compute of both chunks, the
communication of both, or either chunk alone), never longer than the two back to back (some
stream is always busy, and compute runs slower only while communication runs), and with no
communication it is F + B. The communication running while compute runs is hidden, the rest
exposed.

>>> f = (Phase(COMPUTE, 2.0), Phase(LINK, 1.0))
>>> b = (Phase(COMPUTE, 3.0),)
>>> cost = pair(f, b)
>>> cost.pair_s, cost.pair_comm_s, cost.pair_hidden_comm_s
(5.0, 1.0, 1.0)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from pipesched.errors import require
from pipesched.model.groups import GroupLevels
from pipesched.model.hardware import DeviceSpec, LinkSpec
from pipesched.model.spec import LayerCost, ModelSpec, TrainingSettings
from pipesched.model.transformer import PHASES, LayerOps, layer_ops


class Resource(StrEnum):
    """What a phase occupies on its device."""

    COMPUTE = "compute"  # the compute stream (attention, experts)
    LINK = "link"  # the communication stream (a dispatch or combine all-to-all, an all-reduce)


COMPUTE, LINK = Resource.COMPUTE, Resource.LINK


class Phase(NamedTuple):
    """One phase of a chunk: ``seconds`` on ``resource`` when it runs alone."""

    resource: Resource
    seconds: float
    name: str = ""
    # may run while the phases just before it on the other stream still run (a weight
    # gradient beside the all-to-all of the input gradient computed before it)
    beside: bool = False


class PhaseRun(NamedTuple):
    """Start and end of each phase of each part (one tuple per part, phases in order)."""

    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]

    @property
    def makespan(self) -> float:
        return max((ends[-1] for ends in self.end if ends), default=0.0)


def _check(parts: Sequence[Sequence[Phase]], comm_sm_fraction: float) -> None:
    require(isinstance(comm_sm_fraction, int | float) and 0 <= comm_sm_fraction < 1, "comm_sm_fraction",
            comm_sm_fraction, "must be in [0, 1): the share of compute units communication kernels take")
    for phases in parts:
        for phase in phases:
            require(phase.resource in tuple(Resource), "phase resource", phase.resource,
                    f"choose {' or '.join(Resource)}")
            require(math.isfinite(phase.seconds) and phase.seconds >= 0, "phase seconds", phase.seconds,
                    "a finite number of seconds >= 0")


class Priority(StrEnum):
    """Which part's phase a free stream starts when several wait for it."""

    READY = "ready"  # the part ready longest
    CRITICAL = "critical"  # the part with the most seconds left (its critical path)
    BALANCED = "balanced"  # the part with the smallest share of its seconds done (both progress alike)
    FEED = "feed"  # the part with the least work before its next communication (keeps the link busy)


def overlapped(*parts: Sequence[Phase], comm_sm_fraction: float = 0.0, priority: Priority = Priority.READY) -> PhaseRun:
    """The phases of ``parts`` run at once on one device's two streams (module docstring):
    event by event, a free stream starts the next phase of the part that ``priority``
    picks, ties to the part given first; compute runs at ``1 - comm_sm_fraction`` of its
    speed while a communication phase runs. A phase waits for every earlier phase of its
    part, but one marked ``beside`` not for the other stream's phases just before it.

    A forward that computes 2 then sends for 1, beside a backward computing 1: the send
    runs while the backward computes.

    >>> overlapped([Phase(COMPUTE, 2.0), Phase(LINK, 1.0)], [Phase(COMPUTE, 1.0)])
    PhaseRun(start=((0.0, 2.0), (2.0,)), end=((2.0, 3.0), (3.0,)))
    """
    _check(parts, comm_sm_fraction)
    state = _Progress(parts)
    left_from = [np.cumsum([phase.seconds for phase in phases][::-1])[::-1] for phases in parts]
    to_link = [_seconds_to_link(phases) for phases in parts]
    rank = {Priority.READY: lambda k, j: state.ready[k],
            Priority.CRITICAL: lambda k, j: -left_from[k][j],
            Priority.BALANCED: lambda k, j: -left_from[k][j] / left_from[k][0],
            Priority.FEED: lambda k, j: to_link[k][j]}[Priority(priority)]
    running: dict[Resource, list] = {}  # stream -> [part, phase, seconds of work left at full speed]
    now = 0.0
    while True:
        started = True
        while started:  # a phase started on one stream may let one start beside it on the other
            started = False
            for resource in Resource:
                if resource not in running:
                    waiting = [(k, j) for k, j in enumerate(state.next_on(resource))
                               if j is not None and state.can_start(k, j)]
                    if waiting:
                        k, j = min(waiting, key=lambda kj: (rank(*kj), kj[0]))
                        running[resource] = [k, j, parts[k][j].seconds]
                        state.begin(k, j, now)
                        started = True
        if not running:
            break
        rate = {COMPUTE: 1.0 - comm_sm_fraction if LINK in running else 1.0, LINK: 1.0}
        step = min(left / rate[resource] for resource, (_, _, left) in running.items())
        now += step
        for resource in list(running):
            k, j, left = running[resource]
            running[resource][2] = left = left - step * rate[resource]
            if left <= 1e-12 * max(1.0, parts[k][j].seconds):
                state.finish(k, j, now)
                del running[resource]
    return PhaseRun(tuple(map(tuple, state.start)), tuple(map(tuple, state.end)))


def _seconds_to_link(phases: Sequence[Phase]) -> list[float]:
    """Per phase, the seconds of it and the compute after it before the part's next
    communication phase (inf when none follows)."""
    out, ahead = [0.0] * len(phases), math.inf
    for j in range(len(phases) - 1, -1, -1):
        ahead = 0.0 if phases[j].resource is LINK else ahead + phases[j].seconds
        out[j] = ahead
    return out


class _Progress:
    """Which phases of each part have started and ended, and when."""

    def __init__(self, parts: Sequence[Sequence[Phase]]) -> None:
        self.parts = parts
        self.done = [[False] * len(phases) for phases in parts]
        self.started = [[False] * len(phases) for phases in parts]
        self.start = [[0.0] * len(phases) for phases in parts]
        self.end = [[0.0] * len(phases) for phases in parts]
        self.ready = [0.0] * len(parts)  # when each part's latest phase ended
        self.done_upto = [0] * len(parts)  # phases done from each part's first on
        # each part's first phase on each stream not started yet (phases run in order on a stream)
        self.first_on = [{resource: self._after(k, -1, resource) for resource in Resource} for k in range(len(parts))]

    def _after(self, k: int, j: int, resource: Resource) -> int | None:
        phases = self.parts[k]
        return next((i for i in range(j + 1, len(phases)) if phases[i].resource is resource), None)

    def next_on(self, resource: Resource) -> list[int | None]:
        """Each part's first phase on ``resource`` not started yet."""
        return [first[resource] for first in self.first_on]

    def can_start(self, k: int, j: int) -> bool:
        phases, first = self.parts[k], j
        if phases[j].beside:  # skip the other stream's phases right before it
            while first > 0 and phases[first - 1].resource is not phases[j].resource:
                first -= 1
        return self.done_upto[k] >= first and all(self.started[k][first:j])

    def begin(self, k: int, j: int, now: float) -> None:
        self.started[k][j] = True
        self.start[k][j] = now
        resource = self.parts[k][j].resource
        self.first_on[k][resource] = self._after(k, j, resource)

    def finish(self, k: int, j: int, now: float) -> None:
        self.done[k][j] = True
        self.end[k][j] = self.ready[k] = now
        while self.done_upto[k] < len(self.done[k]) and self.done[k][self.done_upto[k]]:
            self.done_upto[k] += 1


def serial_time(phases: Sequence[Phase]) -> float:
    """A lone chunk's time: its phases one after another."""
    return float(sum(phase.seconds for phase in phases))


@dataclass(frozen=True)
class PairCost:
    """An overlapped pair of a forward chunk and a backward chunk (seconds)."""

    pair_s: float  # the pair, both chunks overlapped
    pair_comm_s: float  # all communication of both chunks
    pair_hidden_comm_s: float  # the part of it that runs while compute runs
    forward_s: float  # the forward chunk alone
    backward_s: float  # the backward chunk alone (I + W)
    compute_s: float  # compute of both chunks at full speed

    @property
    def exposed_comm_s(self) -> float:
        """Communication during which the compute stream idles."""
        return max(0.0, self.pair_comm_s - self.pair_hidden_comm_s)


def pair(forward: Sequence[Phase], backward: Sequence[Phase], *, comm_sm_fraction: float = 0.0) -> PairCost:
    """A forward chunk beside a backward chunk of another microbatch (module docstring):
    the shortest of the schedules of every ``Priority`` and both tie orders."""
    runs = []
    for priority in Priority:
        runs.append(overlapped(forward, backward, comm_sm_fraction=comm_sm_fraction, priority=priority))
        behind = overlapped(backward, forward, comm_sm_fraction=comm_sm_fraction, priority=priority)
        runs.append(PhaseRun(behind.start[::-1], behind.end[::-1]))  # parts back in (forward, backward) order
    return _pair_cost((forward, backward), min(runs, key=lambda run: run.makespan))


def _pair_cost(parts: tuple[Sequence[Phase], ...], run: PhaseRun) -> PairCost:
    """The pair's figures from its phases' start and end times."""
    intervals: dict[Resource, list[tuple[float, float]]] = {resource: [] for resource in Resource}
    for phases, first, last in zip(parts, run.start, run.end, strict=True):
        for phase, a, b in zip(phases, first, last, strict=True):
            if b > a:
                intervals[phase.resource].append((a, b))
    return PairCost(
        pair_s=run.makespan,
        pair_comm_s=sum(phase.seconds for phases in parts for phase in phases if phase.resource is LINK),
        pair_hidden_comm_s=overlap_seconds(intervals[LINK], intervals[COMPUTE]),
        forward_s=serial_time(parts[0]),
        backward_s=serial_time(parts[1]),
        compute_s=sum(phase.seconds for phases in parts for phase in phases if phase.resource is COMPUTE),
    )


def overlap_seconds(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    """Seconds during which an interval of ``first`` and one of ``second`` both run (the
    intervals of each list never overlap one another: one stream each)."""
    first, second = sorted(first), sorted(second)
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        total += max(0.0, min(first[i][1], second[j][1]) - max(first[i][0], second[j][0]))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


# --- a layer's chunks from its kernels and collectives (``layer_ops``) ----------------------
@dataclass(frozen=True)
class LayerPhases:
    """One layer's forward and backward chunk as phases."""

    name: str
    forward: tuple[Phase, ...]
    backward: tuple[Phase, ...]


def layer_phases(ops: LayerOps, *, cost: LayerCost | None = None, full_recompute: bool = False) -> LayerPhases:
    """A layer's chunks from its kernels' and collectives' times (``layer_ops``), per phase
    (module docstring). ``cost``: the layer's cost as it runs (default ``ops.cost``): a
    frozen layer's (``freeze_layers``) has no W, or no backward at all. ``full_recompute``:
    the backward first redoes the whole forward, communication included (else the cost's
    ``recompute_s`` is one compute phase).

    >>> from pipesched.model import TrainingSettings, load_device, load_model
    >>> from pipesched.model.transformer import layer_ops
    >>> ops = layer_ops(load_model("tiny"), load_device("h100-sxm"), TrainingSettings(seq_len=128))[1]
    >>> phases = layer_phases(ops)
    >>> math.isclose(serial_time(phases.forward), ops.cost.forward_s)
    True
    """
    cost = cost or ops.cost
    forward: list[Phase] = []
    for phase in PHASES:
        forward += _step(COMPUTE, f"{phase} F", sum(k.forward_s for k in ops.kernels if k.phase == phase))
        forward += [Phase(LINK, c.forward_s, c.name) for c in ops.collectives if c.phase == phase and c.forward_s > 0]
    if cost.backward_input_s <= 0 and cost.backward_weight_s <= 0:
        return LayerPhases(ops.cost.name, tuple(forward), ())
    redo = full_recompute and cost.recompute_s > 0  # full recompute of a block (not the embedding or head)
    backward = [p._replace(name=f"recompute {p.name}") for p in forward] if redo else \
        _step(COMPUTE, "recompute", cost.recompute_s)
    trains = cost.backward_weight_s > 0
    waiting: list[tuple[str, float]] = []  # weight gradients not run yet: after the next all-to-all
    for phase in reversed(PHASES):
        backward += _step(COMPUTE, f"{phase} I", sum(k.backward_input_s for k in ops.kernels if k.phase == phase))
        if trains:
            waiting.append((phase, sum(k.backward_weight_s for k in ops.kernels if k.phase == phase)))
        sent = [Phase(LINK, c.backward_s, c.name) for c in ops.collectives if c.phase == phase and c.backward_s > 0]
        if sent:
            backward += sent + _weights(waiting, beside=True)
            waiting = []
    backward += _weights(waiting, beside=False)
    return LayerPhases(ops.cost.name, tuple(forward), tuple(backward))


def _weights(waiting: list[tuple[str, float]], *, beside: bool) -> list[Phase]:
    """The weight gradients of the phases in ``waiting`` as one compute phase (none when
    they take no time); ``beside`` the all-to-all just issued."""
    seconds = sum(s for _, s in waiting)
    names = "+".join(phase for phase, s in waiting if s > 0)
    return [Phase(COMPUTE, seconds, f"{names} W", beside=beside)] if seconds > 0 else []


def _step(resource: Resource, name: str, seconds: float) -> list[Phase]:
    """One phase, or none when it takes no time."""
    return [Phase(resource, seconds, name)] if seconds > 0 else []


def chunk_pair(forward_layers: Sequence[LayerPhases], backward_layers: Sequence[LayerPhases], *,
               comm_sm_fraction: float = 0.0, forward_send_s: float = 0.0, backward_send_s: float = 0.0) -> PairCost:
    """The overlapped pair of a forward chunk of ``forward_layers`` (in forward order) and a
    backward chunk of ``backward_layers`` (given in forward order; the backward walks them
    last first); each chunk ends with its pipeline send (the forward's output, the
    backward's input gradient) on the communication stream when given, seconds."""
    forward = [phase for layer in forward_layers for phase in layer.forward]
    forward += _step(LINK, "pipeline send F", forward_send_s)
    backward = [phase for layer in reversed(backward_layers) for phase in layer.backward]
    backward += _step(LINK, "pipeline send B", backward_send_s)
    return pair(forward, backward, comm_sm_fraction=comm_sm_fraction)


@functools.lru_cache(maxsize=256)
def model_layer_ops(model: ModelSpec, device: DeviceSpec, settings: TrainingSettings, link: LinkSpec,
                    groups: GroupLevels | None = None) -> tuple[LayerOps, ...]:
    """Every layer's kernels and collectives on ``device`` (``layer_ops``: ``link`` carries
    the tensor-parallel collectives, ``groups`` the expert groups' levels); none for a model
    of measured layers (no kernels to split into phases). Pure in hashable inputs: a sweep
    plans the same model on every placement."""
    return () if model.measured else tuple(layer_ops(model, device, settings, tp_link=link, groups=groups))


def stage_pair_seconds(forward: tuple[Sequence[LayerOps], Sequence[LayerCost]],
                       backward: tuple[Sequence[LayerOps], Sequence[LayerCost]], device: DeviceSpec, *,
                       full_recompute: bool = False) -> float:
    """An overlapped pair on one device: the forward chunk of one stage's layers beside the
    backward chunk of another's (or the same stage's), each given as its layers' kernels and
    collectives and their costs as they run (a frozen layer without W, or without backward;
    ``full_recompute``: the backward's stage redoes its forwards), compute slowed by
    ``device.comm_sm_fraction`` beside communication."""
    layers = [layer_phases(entry, cost=cost) for entry, cost in zip(*forward, strict=True)]
    behind = [layer_phases(entry, cost=cost, full_recompute=full_recompute) for entry, cost in zip(*backward, strict=True)]
    return chunk_pair(layers, behind, comm_sm_fraction=device.comm_sm_fraction).pair_s
