"""Pipelines that change shape: a schedule of cluster events (a device lost or added at a
time), the re-parallelisation each one forces (SpotServe's), its cost on the links, and the
run that goes on across it (``serve simulate --events FILE``).

The pool. A deployment starts on the cluster ranks its configuration takes (0 to its
devices - 1); an event removes a rank of the pool (``lose``) or adds one of the cluster's
that is not in it (``add``). Events at one time are one change.

The plan (``replan``). On the devices left, the new deployment is the layout (replicas of
TP x PP, TP a power of two or the old one) that uses the most of them and fits (its KV
cache holds a request); among those the old TP x PP first, then the most replicas, then the
nearest to the old in devices per replica (a fitted latency model keeps its stages). It is built on the pool as a cluster of its own (logical rank i is the pool's i-th
rank, so the links and devices are the pool's). Each device of the new deployment needs
its new shard: per layer, its tensor-parallel slice; what it held already of that slice
stays, the rest comes from the surviving device of the old deployment whose slice of that
layer overlaps it most (the same node first), over ``Cluster.transfer_time``, or, when no
surviving device holds the layer, from host memory over the host link
(``model.tiers.move_seconds``). A device receives its moves one after the other, all
devices at once: the change takes the slowest device's moves.

The run (``simulate_with_events``): the trace split at the event times, the engine run per
segment. A segment serves the requests arriving in it and those carried over from the one
before; what it did up to the next event stands (the engine is causal: nothing after a
time changes what happened before it). The requests still in flight at an event pause
during the change and are carried over: their KV caches are not migrated but recomputed on
the new deployment, as vLLM's recompute preemption does (their prompt and the tokens made
so far prefilled again; the tokens made stay made). Requests arriving during the change
wait for it to end. The segments' logs are joined into one ``ServeRun`` (every segment's
instances, on their cluster ranks), the weight moves among its moves (kind ``weights``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipesched.enums import Tier
from pipesched.errors import PipeschedError, require
from pipesched.io.files import read_text
from pipesched.io.yaml_text import load_yaml
from pipesched.limits import MAX_CLUSTER_EVENTS, MAX_SECONDS
from pipesched.model.hardware import Cluster
from pipesched.model.inference import LatencyRow, StageIterationCosts
from pipesched.model.spec import ModelSpec
from pipesched.model.tiers import move_seconds
from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.deployment import Deployment, build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.records import WEIGHTS, IterationLog, KVMoves, KVTrace, ServeRun
from pipesched.serving.trace import Trace

EVENT_KINDS = ("lose", "add")
EVENT_COLUMNS = ("at_s", "event", "device")
_HOST = -1  # a move's source in host memory


@dataclass(frozen=True)
class ClusterEvent:
    """At ``at_s`` seconds, cluster rank ``device`` is lost from the pool or added to it."""

    at_s: float
    kind: str  # "lose" or "add"
    device: int


# --- the events file ----------------------------------------------------------------------
def read_events(path: str) -> tuple[ClusterEvent, ...]:
    """The events of a YAML file (a list of ``{at_s, event, device}``, or ``{events: [...]}``)
    or a CSV file (header ``at_s,event,device``)."""
    text = read_text(path, "events")
    if Path(path).suffix.lower() == ".csv":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        require(bool(lines) and tuple(c.strip() for c in lines[0].split(",")) == EVENT_COLUMNS, "events", path,
                f"give a CSV header {','.join(EVENT_COLUMNS)}")
        entries: object = [dict(zip(EVENT_COLUMNS, (c.strip() for c in line.split(",")), strict=False))
                           for line in lines[1:]]
    else:
        entries = load_yaml(text, field="events", source=path)
        if isinstance(entries, dict):
            entries = entries.get("events")
    require(isinstance(entries, list) and 1 <= len(entries) <= MAX_CLUSTER_EVENTS, "events", path,
            f"give 1 to {MAX_CLUSTER_EVENTS} events, each at_s, event (lose or add) and device")
    return tuple(_event(entry, index) for index, entry in enumerate(entries))


def _event(entry: object, index: int) -> ClusterEvent:
    field = f"events[{index}]"
    require(isinstance(entry, dict) and set(entry) == set(EVENT_COLUMNS), field, entry,
            f"give {', '.join(EVENT_COLUMNS)}")
    try:
        at, device = float(entry["at_s"]), int(str(entry["device"]))
    except ValueError:
        raise PipeschedError(f"{field}={entry}: give at_s in seconds and device as a cluster rank") from None
    require(math.isfinite(at) and 0.0 <= at <= MAX_SECONDS, f"{field}.at_s", at,
            f"give seconds from 0 to {MAX_SECONDS:g}")
    require(entry["event"] in EVENT_KINDS, f"{field}.event", entry["event"], "choose lose or add")
    return ClusterEvent(at, str(entry["event"]), device)


def check_events(events: Sequence[ClusterEvent], cluster: Cluster, pool: Sequence[int]) -> None:
    """The events in time order, each naming a device of the cluster that is in the pool
    (lose) or not (add) then, and never the whole pool lost."""
    alive = set(pool)
    for index, event in enumerate(events):
        field = f"events[{index}]"
        require(index == 0 or event.at_s >= events[index - 1].at_s, f"{field}.at_s", event.at_s,
                f"give the events in time order (the one before is at {events[index - 1].at_s:g} s)" if index else "")
        require(0 <= event.device < cluster.num_devices, f"{field}.device", event.device,
                f"the cluster {cluster.name} has devices 0 to {cluster.num_devices - 1}")
        if event.kind == "lose":
            require(event.device in alive, f"{field}.device", event.device,
                    "it is not serving then; lose a device of the deployment")
            alive.discard(event.device)
            require(bool(alive), f"{field}.device", event.device, "it is the last device; keep at least one")
        else:
            require(event.device not in alive, f"{field}.device", event.device,
                    "it is serving already; add a device the deployment does not use")
            alive.add(event.device)


# --- the plan of one change -----------------------------------------------------------------
@dataclass(frozen=True)
class WeightMove:
    """Bytes of weights a device of the new deployment receives from one source."""

    dst: int  # cluster rank
    src: int  # cluster rank; -1: host memory
    nbytes: float
    seconds: float  # over its link, alone


@dataclass(frozen=True, eq=False)
class Reconfiguration:
    """One change of shape: the events, the new deployment and what it cost."""

    at_s: float
    events: tuple[ClusterEvent, ...]
    pool: tuple[int, ...]  # cluster ranks serving after it
    config: ServeConfig  # the new deployment's
    moves: tuple[WeightMove, ...]
    seconds: float  # until the new deployment serves: the slowest device's moves, one after the other
    in_flight: int = 0  # requests paused and carried over
    recomputed_tokens: int = 0  # KV-cache tokens of those requests dropped and prefilled again

    @property
    def moved_bytes(self) -> float:
        return float(sum(move.nbytes for move in self.moves))

    @property
    def from_host_bytes(self) -> float:
        return float(sum(move.nbytes for move in self.moves if move.src == _HOST))


def pool_cluster(cluster: Cluster, pool: Sequence[int]) -> Cluster:
    """The pool's ranks as a cluster of their own (its rank i is the pool's i-th)."""
    return dataclasses.replace(cluster, devices=tuple(cluster.devices[r] for r in pool),
                               node_of=tuple(cluster.node_of[r] for r in pool))


def holdings(deployment: Deployment, pool: Sequence[int]) -> dict[int, dict[int, tuple[float, float, float]]]:
    """Per cluster rank of the deployment: per layer position it holds in device memory, its
    slice of the layer (from, to, in shares of the layer) and the whole layer's bytes (the
    blocks ``--resident`` streams live in host memory: no device holds or receives them)."""
    held: dict[int, dict[int, tuple[float, float, float]]] = {}
    for plan in deployment.instances:
        head = plan.stages[-1].layers[1] - 1  # the LM head's position (the embedding's is 0)
        for stage, first in zip(plan.stages, plan.devices, strict=True):
            layer_bytes = _layer_bytes(stage, plan.tp, head)
            streamed = [p for p in range(stage.layers[1] - 1, stage.layers[0] - 1, -1) if p not in (0, head)]
            for p in streamed[:stage.streamed_blocks]:
                del layer_bytes[p]
            for j in range(plan.tp):
                held[pool[first + j]] = {p: (j / plan.tp, (j + 1) / plan.tp, b) for p, b in layer_bytes.items()}
    return held


def _layer_bytes(stage: StageIterationCosts, tp: int, head: int) -> dict[int, float]:
    """Each layer position of a stage and its whole layer's bytes (all tensor-parallel ranks):
    a block's, and the rest of the stage's parameters shared by its embedding and head."""
    first, end = stage.layers
    ends = [p for p in (0, head) if first <= p < end]
    blocks = (end - first) - len(ends)
    block = stage.block_weight_bytes if stage.block_weight_bytes > 0 else stage.weight_bytes / max(end - first, 1)
    rest = max(stage.weight_bytes - blocks * block, 0.0) / max(len(ends), 1)
    return {p: tp * (rest if p in ends else block) for p in range(first, end)}


def weight_moves(before: dict, after: dict, cluster: Cluster) -> tuple[WeightMove, ...]:
    """What each device of ``after`` receives (module docstring: the plan)."""
    moves = []
    for dst, layers in sorted(after.items()):
        incoming: dict[int, float] = {}
        for position, (lo, hi, layer_bytes) in layers.items():
            kept = _overlap((lo, hi), before.get(dst, {}).get(position))
            need = (hi - lo - kept) * layer_bytes
            if need <= layer_bytes * 1e-12:
                continue
            src = _source(dst, position, (lo, hi), before, cluster)
            incoming[src] = incoming.get(src, 0.0) + need
        for src, nbytes in sorted(incoming.items()):
            seconds = (move_seconds(cluster.devices[dst], nbytes, Tier.HOST, Tier.DEVICE) if src == _HOST
                       else cluster.transfer_time(src, dst, nbytes))
            moves.append(WeightMove(dst, src, nbytes, seconds))
    return tuple(moves)


def _overlap(want: tuple[float, float], have: tuple[float, float, float] | None) -> float:
    return 0.0 if have is None else max(0.0, min(want[1], have[1]) - max(want[0], have[0]))


def _source(dst: int, position: int, want: tuple[float, float], before: dict, cluster: Cluster) -> int:
    """The surviving device whose slice of the layer overlaps ``want`` most (the same node
    first, then the lowest rank); host memory when none holds it."""
    best, key = _HOST, (0.0, False, 0)
    for src, layers in before.items():
        if src == dst or position not in layers:
            continue
        candidate = (_overlap(want, layers[position]), cluster.same_node(src, dst), -src)
        if candidate[0] > 0 and candidate > key:
            best, key = src, candidate
    return best


def replan(config: ServeConfig, model: ModelSpec, cluster: Cluster, pool: Sequence[int], *,
           latency: Sequence[LatencyRow] | None = None, dtype: str = "bf16") -> tuple[ServeConfig, Deployment]:
    """The deployment on ``pool`` (module docstring: the plan)."""
    old = config.instances
    devices = len(pool)
    degrees = sorted({old.tp, *(1 << k for k in range(devices.bit_length()))})
    layouts = [Instances(tp, pp, devices // (tp * pp)) for tp in degrees if tp <= devices
               for pp in range(1, devices // tp + 1) if latency is None or pp == old.pp]
    layouts.sort(key=lambda x: (-x.devices, (x.tp, x.pp) != (old.tp, old.pp), -x.count,
                                abs(x.tp * x.pp - old.tp * old.pp), x.tp))
    sub = pool_cluster(cluster, pool)
    reason = ""
    for layout in layouts:
        candidate = dataclasses.replace(config, instances=layout)
        try:
            return candidate, build_deployment(candidate, model, sub, latency=latency, dtype=dtype)
        except PipeschedError as exc:
            reason = str(exc)
    raise PipeschedError(f"events={devices} devices: no deployment of {model.name} fits the devices left "
                         f"({reason}); give fewer losses or a smaller model")


# --- the run across the changes ---------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class EventsRun:
    """A run across cluster events: the joined run and each change."""

    run: ServeRun
    reconfigurations: tuple[Reconfiguration, ...]


@dataclass
class _Progress:
    """Each request's progress across segments (trace order)."""

    made: np.ndarray  # output tokens made before the current segment
    token_times: list[list[np.ndarray]]  # per request, its token times of each segment
    scheduled_at: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray
    instance: np.ndarray
    preemptions: np.ndarray
    preemption_s: np.ndarray


def simulate_with_events(config: ServeConfig, model: ModelSpec, cluster: Cluster, trace: Trace,
                         events: Sequence[ClusterEvent], *, latency: Sequence[LatencyRow] | None = None,
                         dtype: str = "bf16") -> EventsRun:
    """``trace`` served by ``config`` while ``events`` change its pool (module docstring)."""
    require(config.disaggregate is None, "events", "with --disaggregate",
            "give cluster events to a colocated deployment (replicas of TP x PP)")
    pool = tuple(range(config.devices))
    require(config.devices <= cluster.num_devices, "replicas", config.devices,
            f"the cluster {cluster.name} has {cluster.num_devices} devices")
    check_events(events, cluster, pool)
    deployment = build_deployment(config, model, pool_cluster(cluster, pool), latency=latency, dtype=dtype)
    n = len(trace)
    progress = _Progress(np.zeros(n, np.int64), [[] for _ in range(n)], np.full(n, np.nan), np.full(n, np.nan),
                         np.full(n, np.nan), np.full(n, -1, np.int32), np.zeros(n, np.int32), np.zeros((n, 5)))
    parts: list[tuple[ServeRun, np.ndarray, tuple[int, ...], float]] = []
    changes: list[Reconfiguration] = []
    start, ready, carried = 0.0, 0.0, np.zeros(0, np.int64)
    times = sorted({event.at_s for event in events})
    for at in [*times, math.inf]:
        rows = np.concatenate([carried, np.flatnonzero((trace.arrived_at >= start) & (trace.arrived_at < at))])
        if rows.size:
            segment, rows = _segment_trace(trace, rows, progress.made, ready)
            run = simulate_serving(deployment, segment)
            carried = _advance(progress, run, rows, at, sum(len(part[0].instance_kind) for part in parts))
            parts.append((run, rows, pool, at))
        else:
            carried = np.zeros(0, np.int64)
        if at == math.inf:
            break
        now = tuple(event for event in events if event.at_s == at)
        held = holdings(deployment, pool)
        pool = _pool_after(pool, now)
        before = {rank: layers for rank, layers in held.items() if rank in pool}  # what survives
        config, deployment = replan(config, model, cluster, pool, latency=latency, dtype=dtype)
        moves = weight_moves(before, holdings(deployment, pool), cluster)
        seconds = max([sum(m.seconds for m in moves if m.dst == dst) for dst in {m.dst for m in moves}], default=0.0)
        lost = int((trace.prefill_tokens[carried] + progress.made[carried]).sum()) if carried.size else 0
        changes.append(Reconfiguration(at, now, pool, config, moves, seconds, int(carried.size), lost))
        start, ready = at, at + seconds
    return EventsRun(_joined(trace, parts, changes, progress), tuple(changes))


def _pool_after(pool: tuple[int, ...], events: Sequence[ClusterEvent]) -> tuple[int, ...]:
    alive = set(pool)
    for event in events:
        (alive.discard if event.kind == "lose" else alive.add)(event.device)
    return tuple(sorted(alive))


def _segment_trace(trace: Trace, rows: np.ndarray, made: np.ndarray, ready: float) -> tuple[Trace, np.ndarray]:
    """The segment's requests, and their trace rows in the segment's order: each arriving
    when it did or when the deployment is ready; a carried one with its prompt and the
    tokens it made as its prompt, its output left."""
    arrived = np.maximum(trace.arrived_at[rows], ready)
    order = np.argsort(arrived, kind="stable")
    rows = rows[order]
    return (Trace(arrived[order], trace.prefill_tokens[rows] + made[rows], trace.decode_tokens[rows] - made[rows]),
            rows)


def _advance(progress: _Progress, run: ServeRun, rows: np.ndarray, until: float, first_instance: int) -> np.ndarray:
    """Record what the segment's run (its requests: trace ``rows``) did before ``until``; the
    requests it carries over."""
    carried = []
    for k, r in enumerate(rows.tolist()):
        times = run.token_times[run.token_offsets[k]:run.token_offsets[k + 1]]
        kept = times[times <= until]
        if np.isnan(progress.scheduled_at[r]) and run.scheduled_at[k] <= until:
            progress.scheduled_at[r] = run.scheduled_at[k]
        if kept.size and np.isnan(progress.first_token_at[r]):
            progress.first_token_at[r] = kept[0]
        progress.token_times[r].append(kept)
        progress.instance[r] = first_instance + run.instance[k]
        if run.finished_at[k] <= until:
            progress.finished_at[r] = run.finished_at[k]
            progress.preemptions[r] += run.preemptions[k]
            if run.preemption_s is not None:
                progress.preemption_s[r] += run.preemption_s[k]
        else:
            progress.made[r] += kept.size
            carried.append(r)
    return np.array(carried, np.int64)


def _joined(trace: Trace, parts: Sequence[tuple[ServeRun, np.ndarray, tuple[int, ...], float]],
            changes: Sequence[Reconfiguration], progress: _Progress) -> ServeRun:
    """The segments' runs as one: each segment's iterations, cache use and moves up to its
    end, its instances after the earlier segments', on their cluster ranks; the weight moves
    of each change, each device's one after the other from the change's time."""
    logs, kv, moves = [], ([], [], [], []), []
    kinds, devices, tps, per_token = [], [], [], []
    batches = 0
    for run, rows, pool, until in parts:
        ranks = np.asarray(pool, np.int64)
        log, batches_here = _iterations(run.iterations, rows, ranks, until, len(kinds), batches)
        logs.append(log)
        batches += batches_here
        for i in range(len(run.instance_kind)):
            keep = run.kv.times[i] <= until
            kv[0].append(run.kv.times[i][keep])
            kv[1].append(run.kv.blocks[i][keep])
            kv[2].append(run.kv.capacity_blocks[i])
            kv[3].append(run.kv.preempted_at[i][run.kv.preempted_at[i] <= until] if run.kv.preempted_at
                         else np.zeros(0))
        moves.append(_kv_moves(run.moves, rows, ranks, until))
        kinds += run.instance_kind
        devices += [tuple(int(ranks[d]) for d in stages) for stages in run.instance_devices]
        tps += run.tp
        per_token += run.kv_bytes_per_token
    moves += [_weight_moves(change) for change in changes]
    tokens = [np.concatenate(times) if times else np.zeros(0) for times in progress.token_times]
    offsets = np.concatenate([[0], np.cumsum([len(times) for times in tokens])]).astype(np.int64)
    first = parts[0][0]
    return ServeRun(
        trace=trace, config=first.config, instance=progress.instance, scheduled_at=progress.scheduled_at,
        first_token_at=progress.first_token_at, finished_at=progress.finished_at, preemptions=progress.preemptions,
        token_times=np.concatenate(tokens).astype(np.float64), token_offsets=offsets,
        iterations=_concat_logs(logs), kv=KVTrace(tuple(kv[0]), tuple(kv[1]), tuple(kv[2]), first.kv.block_size,
                                                  preempted_at=tuple(kv[3])),
        instance_kind=tuple(kinds), instance_devices=tuple(devices), tp=tuple(tps), peak_flops=first.peak_flops,
        moves=_concat_moves(moves), kv_bytes_per_token=tuple(per_token), preemption_s=progress.preemption_s)


def _iterations(log: IterationLog, rows: np.ndarray, ranks: np.ndarray, until: float, first_instance: int,
                first_batch: int) -> tuple[IterationLog, int]:
    """A segment's iterations that ended by ``until``, renumbered after the earlier
    segments' (batches from ``first_batch``, instances from ``first_instance``), their
    members as trace rows and their devices as cluster ranks; and how many batches."""
    keep = np.flatnonzero(log.end <= until)
    kept_batches, batch = np.unique(log.batch[keep], return_inverse=True)
    counts = log.offsets[kept_batches + 1] - log.offsets[kept_batches]
    gather = np.concatenate([np.arange(log.offsets[b], log.offsets[b + 1]) for b in kept_batches]
                            or [np.zeros(0, np.int64)]).astype(np.int64)
    empty = np.zeros(len(log.start))
    send_end = log.send_end if log.send_end is not None else log.end
    send_bytes = log.send_bytes if log.send_bytes is not None else empty
    return IterationLog(
        batch=first_batch + batch.astype(np.int64), instance=(first_instance + log.instance[keep]).astype(np.int32),
        stage=log.stage[keep], first_device=ranks[log.first_device[keep]].astype(np.int32), start=log.start[keep],
        end=log.end[keep], prefill_tokens=log.prefill_tokens[keep], decodes=log.decodes[keep],
        kv_tokens=log.kv_tokens[keep], flops=log.flops[keep], members=rows[log.members[gather]],
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), send_end=send_end[keep],
        send_bytes=send_bytes[keep]), len(kept_batches)


def _concat_logs(logs: Sequence[IterationLog]) -> IterationLog:
    member_offsets = np.cumsum([0] + [len(log.members) for log in logs])
    offsets = np.concatenate([[0]] + [log.offsets[1:] + base for log, base in zip(logs, member_offsets, strict=False)])
    columns = {name: np.concatenate([getattr(log, name) for log in logs])
               for name in ("batch", "instance", "stage", "first_device", "start", "end", "prefill_tokens", "decodes",
                            "kv_tokens", "flops", "members", "send_end", "send_bytes")}
    return IterationLog(**columns, offsets=offsets.astype(np.int64))


def _kv_moves(moves: KVMoves, rows: np.ndarray, ranks: np.ndarray, until: float) -> KVMoves:
    keep = np.flatnonzero(moves.end <= until)
    device = np.concatenate([ranks, [_HOST]])  # index -1: host memory stays host memory
    return KVMoves(rows[moves.request[keep]], tuple(moves.kind[k] for k in keep),
                   device[moves.src_device[keep]].astype(np.int32), device[moves.dst_device[keep]].astype(np.int32),
                   moves.nbytes[keep], moves.start[keep], moves.end[keep])


def _weight_moves(change: Reconfiguration) -> KVMoves:
    """A change's weight moves as ``KVMoves`` rows (request -1): each device's from the
    change's time, one after the other."""
    start, end, ready = [], [], {}
    for move in change.moves:
        begin = ready.get(move.dst, change.at_s)
        ready[move.dst] = begin + move.seconds
        start.append(begin)
        end.append(ready[move.dst])
    n = len(change.moves)
    return KVMoves(np.full(n, -1, np.int64), (WEIGHTS,) * n, np.array([m.src for m in change.moves], np.int32),
                   np.array([m.dst for m in change.moves], np.int32), np.array([m.nbytes for m in change.moves]),
                   np.array(start, np.float64), np.array(end, np.float64))


def _concat_moves(parts: Sequence[KVMoves]) -> KVMoves:
    parts = [part for part in parts if len(part)]
    if not parts:
        return KVMoves.empty()
    return KVMoves(np.concatenate([p.request for p in parts]), tuple(k for p in parts for k in p.kind),
                   np.concatenate([p.src_device for p in parts]), np.concatenate([p.dst_device for p in parts]),
                   np.concatenate([p.nbytes for p in parts]), np.concatenate([p.start for p in parts]),
                   np.concatenate([p.end for p in parts]))


# --- what each change cost the requests -------------------------------------------------------
def reconfiguration_dicts(result: EventsRun) -> list[dict[str, object]]:
    """Each change as JSON: its time, events, plan, moved bytes, seconds, and the latency
    of the requests before it (finished since the change before), during it (in flight at
    it) and after it (arriving once the new deployment serves, until the next change)."""
    run, changes = result.run, result.reconfigurations
    arrived, finished = run.trace.arrived_at, run.finished_at
    out = []
    for index, change in enumerate(changes):
        since = changes[index - 1].at_s if index else -math.inf
        upto = changes[index + 1].at_s if index + 1 < len(changes) else math.inf
        groups = {"before": (arrived >= since) & (finished <= change.at_s),
                  "during": (arrived <= change.at_s) & (finished > change.at_s),
                  "after": (arrived >= change.at_s + change.seconds) & (arrived < upto)}
        layout = change.config.instances
        out.append({
            "at_s": change.at_s,
            "events": [{"event": e.kind, "device": e.device} for e in change.events],
            "plan": {"tp": layout.tp, "pp": layout.pp, "replicas": layout.count, "devices": list(change.pool),
                     "moves": [{"dst": m.dst, "src": "host" if m.src == _HOST else m.src, "bytes": m.nbytes,
                                "seconds": m.seconds} for m in change.moves]},
            "moved_bytes": change.moved_bytes, "from_host_bytes": change.from_host_bytes, "seconds": change.seconds,
            "requests_in_flight": change.in_flight, "recomputed_kv_tokens": change.recomputed_tokens,
            "latency": {name: _latency(run, mask) for name, mask in groups.items()}})
    return out


def _latency(run: ServeRun, mask: np.ndarray) -> dict[str, object]:
    e2e = (run.finished_at - run.trace.arrived_at)[mask]
    ttft = (run.first_token_at - run.trace.arrived_at)[mask]
    return {"requests": int(mask.sum()), "e2e_s_mean": float(e2e.mean()) if e2e.size else None,
            "e2e_s_p99": float(np.percentile(e2e, 99)) if e2e.size else None,
            "ttft_s_mean": float(ttft.mean()) if ttft.size else None}
