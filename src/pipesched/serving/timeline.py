"""A serving run as a ``Timeline``: the training views (HTML report, Perfetto trace, Gantt
chart, terminal) draw it as they draw a schedule.

Rows. One timeline device per pipeline stage of every instance: the stage's tensor-parallel
group, whose ranks run each iteration together (its all-reduces are inside the iteration
time), so drawing each rank would repeat the same box tp times. Devices are numbered
instance after instance, stage after stage, and each is its own timeline stage (a global
stage: instance i's stage s is ``sum of earlier instances' stages + s``).

Ops. One op per (iteration, stage) that ran: its microbatch is the iteration's position in
the window drawn (``ServingInfo.batch`` gives the run's batch number), its kind what it
batches (``SERVING_RULES``): P prefill chunks only, D decode steps only, M both (Sarathi's
stall-free mixed batches). Each stage's op needs the same batch's op on the stage before it
in its instance, the hidden state (an ``ACTIVATION`` message); the first stage of an instance
needs nothing, and a batch runs on no other instance's stages (the empty complete set).

Transfers. Each stage's hidden state sent to the next stage (when the run records its
arrival, ``IterationLog.send_end``), and the KV-cache moves (``KVMoves``): a prompt's cache
from a prefill to a decode instance (``KV_CACHE``), a preempted request's cache swapped to
host memory and back (``SWAP_OUT``, ``SWAP_IN``, on the device's host link channel), and
the weights a device receives (``WEIGHT_MOVE``): a model's loaded from host memory or disk
onto a device group it shares (on the device's host link channel), or, when the deployment
changes shape, from a device or from host memory (``serving.events``).

Memory. Per device, the KV cache of its instance over time: blocks in use x block size x
the stage's KV bytes per token per device (``ServeRun.kv_bytes_per_token``), its capacity
the instance's blocks; without bytes per token, in KV tokens.

Window. A run of 30,000 iterations is normal, and a view of all of them is unreadable and
heavy, so a timeline holds a window of whole iterations: ``window=(start, end)`` seconds
takes every iteration with a stage running in it (at most ``limits.MAX_VIEW_ITERATIONS``);
by default ``DEFAULT_VIEW_ITERATIONS`` iterations around the moment the KV cache is fullest
(the fraction of its blocks in use, the worst instance): where queues, preemptions and the
longest batches are; the whole run when it has no more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import IterationKind, MemoryUnit
from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_VIEW_ITERATIONS
from pipesched.ops import Op
from pipesched.rules import ACTIVATION, KindRule, Need, Rules
from pipesched.schedule import Placement, Schedule
from pipesched.serving.config import ServeConfig
from pipesched.serving.records import WEIGHTS, ServeRun
from pipesched.timeline import ACTIVATION as ACTIVATION_KIND
from pipesched.timeline import (
    KV_CACHE,
    SWAP_IN,
    SWAP_OUT,
    WEIGHT_MOVE,
    MemoryTrace,
    ServingInfo,
    Source,
    Timeline,
    TransferTable,
)

PREFILL, DECODE, MIXED = IterationKind.PREFILL, IterationKind.DECODE, IterationKind.MIXED
# iterations a timeline holds when no window is given
DEFAULT_VIEW_ITERATIONS = 400
# a device row's short label by its instance's kind (``ServeRun.instance_kind``): r0 s1, pf0 s0, dc1 s1
_SHORT = {"replica": "r", "prefill": "pf", "decode": "dc"}


def _iteration_kind(kind: IterationKind, summary: str) -> KindRule:
    # cost: what a slot table would charge; a serving timeline's times are the run's
    return KindRule(kind, summary, needs=(Need(-1, (kind,), ACTIVATION),), cost="forward")


SERVING_RULES = Rules(
    kinds=(_iteration_kind(PREFILL, "prefill iteration"), _iteration_kind(DECODE, "decode iteration"),
           _iteration_kind(MIXED, "mixed prefill + decode iteration")),
    # one kind per stage of the batch's instance, none on the other instances' stages
    complete=(frozenset({PREFILL}), frozenset({DECODE}), frozenset({MIXED}), frozenset()),
)
_KIND_INDEX = np.array([SERVING_RULES.index(kind) for kind in (PREFILL, DECODE, MIXED)], np.int8)


def iteration_kinds(prefill_tokens: np.ndarray, decodes: np.ndarray) -> np.ndarray:
    """The ``SERVING_RULES`` kind index of each iteration: P with prefill tokens and no
    decodes, M with both, D otherwise.

    >>> [SERVING_RULES.kinds[k].kind for k in iteration_kinds(np.array([5, 5, 0]), np.array([0, 2, 3]))]
    ['P', 'M', 'D']
    """
    prefill, decode = np.asarray(prefill_tokens) > 0, np.asarray(decodes) > 0
    return _KIND_INDEX[np.where(prefill & ~decode, 0, np.where(prefill, 2, 1))]


def serving_timeline(run: ServeRun, *, window: tuple[float, float] | None = None,
                     iterations: int = DEFAULT_VIEW_ITERATIONS) -> Timeline:
    """The timeline of ``run``'s iterations in ``window`` (seconds of the run), or of the
    ``iterations`` around its fullest KV cache (module docstring)."""
    log = run.iterations
    require(len(log) > 0, "run", "no iterations", "simulate a trace with at least one request")
    batches, first_start = _batch_starts(log)
    chosen, how = _choose(run, batches, first_start, window, iterations)
    groups = _Groups.of(run)
    rows = np.flatnonzero(np.isin(log.batch, chosen))
    device = groups.offset[log.instance[rows]] + log.stage[rows]
    rows = rows[np.lexsort((log.start[rows], device))]  # table order: device by device, in start order
    device = groups.offset[log.instance[rows]] + log.stage[rows]
    microbatch = np.searchsorted(chosen, log.batch[rows]).astype(np.int32)
    kinds = _batch_kinds(log, chosen)
    schedule = _schedule(run_name(run.config), device, microbatch, kinds[microbatch], groups, len(chosen))
    transfers, carried = _transfers(run, rows, device, microbatch, groups)
    start, end = float(log.start[rows].min()), float(log.end[rows].max())
    info = _info(run, chosen, groups, carried, (start, end), how)
    return Timeline(
        schedule=schedule, source=Source.MEASURED if run.source == Source.MEASURED else Source.SIMULATED,
        unit="s", op_device=device.astype(np.int32), op_stage=device.astype(np.int32),
        op_kind=kinds[microbatch], op_microbatch=microbatch, op_start=log.start[rows].astype(np.float64),
        op_end=log.end[rows].astype(np.float64), transfers=transfers, memory=_memory(run, groups, start, end),
        serving=info)


def _batch_starts(log) -> tuple[np.ndarray, np.ndarray]:
    """The run's batch numbers, ascending, and when each started its first stage."""
    order = np.argsort(log.batch, kind="stable")
    batches, first = np.unique(log.batch[order], return_index=True)
    return batches.astype(np.int64), np.minimum.reduceat(log.start[order], first)


def _choose(run: ServeRun, batches: np.ndarray, first_start: np.ndarray, window, iterations: int):
    """The batches drawn (ascending) and how they were chosen, in words."""
    if window is not None:
        return _in_window(run, batches, window)
    require(isinstance(iterations, int) and not isinstance(iterations, bool) and 1 <= iterations <= MAX_VIEW_ITERATIONS,
            "iterations", iterations, f"give a whole number of iterations from 1 to {MAX_VIEW_ITERATIONS:,}")
    if len(batches) <= iterations:
        return batches, f"every iteration of the run ({len(batches):,})"
    at, fraction = _fullest(run)
    by_start = np.argsort(first_start, kind="stable")
    centre = int(np.searchsorted(first_start[by_start], at))
    low = min(max(0, centre - iterations // 2), len(batches) - iterations)
    chosen = np.sort(batches[by_start[low:low + iterations]])
    return chosen, (f"{iterations:,} of the run's {len(batches):,} iterations, around {at:.6g} s, when its KV cache "
                    f"was fullest ({fraction:.0%} of its blocks)")


def _in_window(run: ServeRun, batches: np.ndarray, window) -> tuple[np.ndarray, str]:
    log = run.iterations
    ok = (isinstance(window, Sequence) and len(window) == 2
          and all(isinstance(x, int | float) and not isinstance(x, bool) and np.isfinite(x) for x in window)
          and window[0] < window[1])
    require(ok, "window", window, "give (start, end) seconds of the run, start before end")
    low, high = float(window[0]), float(window[1])
    chosen = np.unique(log.batch[(log.start < high) & (log.end > low)]).astype(np.int64)
    span = f"the run spans {float(log.start.min()):.6g} to {float(log.end.max()):.6g} s"
    require(chosen.size > 0, "window", f"{low:g}..{high:g}", f"no iteration runs in it; {span}")
    if chosen.size > MAX_VIEW_ITERATIONS:
        raise PipeschedError(f"window={low:g}..{high:g}: {chosen.size:,} iterations; a view draws at most "
                             f"{MAX_VIEW_ITERATIONS:,}, give a shorter window")
    return chosen, f"the {chosen.size:,} iterations running from {low:.6g} to {high:.6g} s (of {len(batches):,})"


def _fullest(run: ServeRun) -> tuple[float, float]:
    """When the KV cache was fullest (the worst instance's share of its blocks), and that share;
    the run's first start when nothing was cached."""
    kv, best = run.kv, (float(run.iterations.start.min()), 0.0)
    for times, blocks, capacity in zip(kv.times, kv.blocks, kv.capacity_blocks, strict=True):
        if len(blocks) and capacity > 0:
            k = int(np.argmax(blocks))
            share = float(blocks[k]) / capacity
            if share > best[1]:
                best = (float(times[k]), share)
    return best


def _batch_kinds(log, chosen: np.ndarray) -> np.ndarray:
    """The kind of each chosen batch (its content is the same on every stage)."""
    first = np.unique(log.batch, return_index=True)[1]
    rows = first[np.searchsorted(np.unique(log.batch), chosen)]
    return iteration_kinds(log.prefill_tokens[rows], log.decodes[rows])


@dataclass(frozen=True, eq=False)
class _Groups:
    """The timeline's devices: every instance's stages in order, each a tensor-parallel group."""

    offset: np.ndarray  # int64 per instance: its first device
    stages: np.ndarray  # int64 per instance: its pipeline stages
    instance: np.ndarray  # int64 per device
    stage: np.ndarray  # int64 per device: its stage within its instance
    first_rank: np.ndarray  # int64 per device: the cluster rank of its group's first device
    tp: np.ndarray  # int64 per device: ranks in its group
    names: tuple[str, ...]  # per device, in full
    labels: tuple[str, ...]  # per device, short

    @classmethod
    def of(cls, run: ServeRun) -> _Groups:
        stages = np.array([len(devices) for devices in run.instance_devices], np.int64)
        offset = np.concatenate(([0], np.cumsum(stages)[:-1])).astype(np.int64)
        instance = np.repeat(np.arange(len(stages)), stages)
        stage = np.arange(int(stages.sum())) - offset[instance]
        first_rank = np.array([rank for devices in run.instance_devices for rank in devices], np.int64)
        tp = np.asarray(run.tp, np.int64)[instance]
        ordinal = [int(np.count_nonzero(np.asarray(run.instance_kind[:i]) == run.instance_kind[i]))
                   for i in range(len(stages))]
        names, labels = [], []
        for i, s, rank, width in zip(instance.tolist(), stage.tolist(), first_rank.tolist(), tp.tolist(), strict=True):
            kind = run.instance_kind[i]
            ranks = f"rank {rank}" if width == 1 else f"ranks {rank}-{rank + width - 1}"
            names.append(f"{kind} {ordinal[i]} · stage {s} · {ranks}")
            labels.append(f"{_SHORT.get(kind, kind[:2])}{ordinal[i]} s{s}")
        return cls(offset, stages, instance, stage, first_rank, tp, tuple(names), tuple(labels))

    def __len__(self) -> int:
        return int(self.instance.shape[0])

    def of_rank(self, rank: np.ndarray, instance: np.ndarray | None = None) -> np.ndarray:
        """The device (group) holding each cluster rank (-1: host memory, or no group's): of
        each rank's ``instance`` where given and one of its stages holds it (instances that
        share devices), else the first."""
        rank = np.asarray(rank, np.int64)
        inside = (rank[:, None] >= self.first_rank) & (rank[:, None] < self.first_rank + self.tp)
        if instance is not None:
            own = inside & (self.instance[None, :] == np.asarray(instance, np.int64)[:, None])
            inside = np.where(own.any(axis=1)[:, None], own, inside)
        return np.where(inside.any(axis=1), np.argmax(inside, axis=1), -1)


def _schedule(name: str, device: np.ndarray, microbatch: np.ndarray, kind: np.ndarray, groups: _Groups,
              batches: int) -> Schedule:
    """The table of the window's ops: device by device, in start order."""
    letters = [rule.kind for rule in SERVING_RULES.kinds]
    ops = [Op(d, letters[k], mb) for d, k, mb in zip(device.tolist(), kind.tolist(), microbatch.tolist(), strict=True)]
    cuts = np.searchsorted(device, np.arange(len(groups) + 1))
    rows = tuple(tuple(ops[cuts[g]:cuts[g + 1]]) for g in range(len(groups)))
    return Schedule(name, Placement.one_per_device(len(groups)), batches, rows, rules=SERVING_RULES)


def run_name(config: ServeConfig) -> str:
    """A serving configuration in a few words: ``sarathi · 2 x TP4 PP2``, or with
    disaggregation ``vllm · prefill 1 x TP2 PP1 + decode 2 x TP2 PP2``.

    >>> run_name(ServeConfig())
    'sarathi · 1 x TP4 PP2'
    """
    def group(instances) -> str:
        return f"{instances.count} x TP{instances.tp} PP{instances.pp}"

    split = config.disaggregate
    shape = (group(config.instances) if split is None
             else f"prefill {group(split.prefill)} + decode {group(split.decode)}")
    return f"{config.scheduler.name} · {shape}"


def _transfers(run: ServeRun, rows: np.ndarray, device: np.ndarray, microbatch: np.ndarray,
               groups: _Groups) -> tuple[TransferTable, np.ndarray]:
    """The hidden-state sends of the window's rows and the KV-cache moves in its span; and
    the request each transfer carries (-1 for a batch's hidden state)."""
    log = run.iterations
    last = groups.offset[log.instance[rows]] + groups.stages[log.instance[rows]] - 1  # its instance's last stage
    parts = []
    if log.send_end is not None:
        sending = np.flatnonzero(device < last)
        r = rows[sending]
        nbytes = log.send_bytes[r] if log.send_bytes is not None else np.zeros(len(r))
        parts.append((device[sending], device[sending] + 1, np.full(len(r), ACTIVATION_KIND), device[sending],
                      microbatch[sending], nbytes, log.end[r], log.send_end[r], np.full(len(r), -1)))
    moves = run.moves
    if len(moves):
        low, high = float(log.start[rows].min()), float(log.end[rows].max())
        shown = np.flatnonzero((moves.start < high) & (moves.end > low))
        kind = np.array([{"transfer": KV_CACHE, "swap-out": SWAP_OUT, "swap-in": SWAP_IN, WEIGHTS: WEIGHT_MOVE}[k]
                         for k in np.asarray(moves.kind, dtype=object)[shown].tolist()], np.int64)
        # the instance at each end: the mover's (the sender of a transfer), a transfer's
        # receiver the request's decode instance
        owner = moves.instance[shown] if moves.instance is not None else None
        receiver = (np.where(kind == KV_CACHE, run.instance[np.maximum(moves.request[shown], 0)], owner)
                    if owner is not None else None)
        src, dst = groups.of_rank(moves.src_device[shown], owner), groups.of_rank(moves.dst_device[shown], receiver)
        # host memory is the device's own host link: a swap goes from and to its device
        src, dst = np.where(src < 0, dst, src), np.where(dst < 0, src, dst)
        parts.append((src, dst, kind, src, np.full(len(shown), -1), moves.nbytes[shown], moves.start[shown],
                      moves.end[shown], moves.request[shown]))
    if not parts:
        return TransferTable.empty(), np.zeros(0, np.int64)
    src, dst, kind, stage, mb, nbytes, start, end, request = (np.concatenate(c) for c in zip(*parts, strict=True))
    channel, names = _channels(src, dst, kind, groups)
    table = TransferTable(src.astype(np.int32), dst.astype(np.int32), kind.astype(np.int8), stage.astype(np.int32),
                          mb.astype(np.int32), nbytes.astype(np.float64), start.astype(np.float64),
                          end.astype(np.float64), channel, names)
    return table, request.astype(np.int64)


def _channels(src: np.ndarray, dst: np.ndarray, kind: np.ndarray, groups: _Groups) -> tuple[np.ndarray, tuple[str, ...]]:
    """One channel per link a transfer uses: a stage to the next, a prefill instance's stage
    to a decode instance's, a device to its host memory (both swap directions)."""
    # a weight move from host memory or disk comes as a move from the device to itself
    host = (kind == SWAP_OUT) | (kind == SWAP_IN) | ((kind == WEIGHT_MOVE) & (src == dst))
    keys = np.stack([np.where(host, -1, src), np.where(host, src, dst)], axis=1)
    unique, channel = np.unique(keys, axis=0, return_inverse=True)
    labels = groups.labels
    names = tuple(f"{labels[b]} host link" if a < 0 else f"{labels[a]} → {labels[b]}" for a, b in unique.tolist())
    return channel.reshape(-1).astype(np.int32), names


def _memory(run: ServeRun, groups: _Groups, start: float, end: float) -> MemoryTrace | None:
    """Each device's KV cache over [start, end]: its instance's blocks in use at start, then
    every change until end (module docstring)."""
    kv = run.kv
    if not kv.times:
        return None
    per_token = run.kv_bytes_per_token
    unit = MemoryUnit.BYTES if per_token else MemoryUnit.KV_TOKENS
    times, values, capacity = [], [], []
    for instance, stage in zip(groups.instance.tolist(), groups.stage.tolist(), strict=True):
        scale = kv.block_size * (per_token[instance][stage] if per_token else 1.0)
        t, blocks = np.asarray(kv.times[instance], np.float64), np.asarray(kv.blocks[instance], np.float64)
        before = int(np.searchsorted(t, start, side="right")) - 1
        inside = np.flatnonzero((t > start) & (t <= end))
        times.append(np.concatenate(([start], t[inside])))
        values.append(np.concatenate(([blocks[before] if before >= 0 else 0.0], blocks[inside])) * scale)
        capacity.append(kv.capacity_blocks[instance] * scale)
    return MemoryTrace(tuple(times), tuple(values), (0.0,) * len(groups), tuple(capacity), unit)


def _info(run: ServeRun, chosen: np.ndarray, groups: _Groups, carried: np.ndarray, window: tuple[float, float],
          how: str) -> ServingInfo:
    log = run.iterations
    first = np.unique(log.batch, return_index=True)[1]
    rows = first[np.searchsorted(np.unique(log.batch), chosen)]
    counts = log.offsets[chosen + 1] - log.offsets[chosen]
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    # the members of each chosen batch, one after another
    gather = np.repeat(log.offsets[chosen] - offsets[:-1], counts) + np.arange(int(offsets[-1]))
    return ServingInfo(
        batch=chosen, instance=log.instance[rows].astype(np.int32), prefill_tokens=log.prefill_tokens[rows],
        decodes=log.decodes[rows], kv_tokens=log.kv_tokens[rows], members=log.members[gather].astype(np.int64),
        offsets=offsets, device_names=groups.names, device_labels=groups.labels, transfer_request=carried,
        window=window, run_iterations=int(np.unique(log.batch).size),
        run_span=(float(log.start.min()), float(log.end.max())), how=how)
