"""A pool's run read model by model: each model's own ``ServeRun`` out of the one run
(``model_run``), its ``ServeResult`` under its SLOs, the weight swaps, and the pool's SLO
attainment (``PoolResult``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from pipesched.serving.placement import (
    PoolPlacement,
    PoolRun,
    check_placement,
    model_config,
    run_groups,
)
from pipesched.serving.pool import PoolSpec
from pipesched.serving.records import WEIGHTS, IterationLog, KVMoves, KVTrace, ServeRun
from pipesched.serving.results import ServeResult, serve_result
from pipesched.serving.trace import Trace


def _gather(offsets: np.ndarray, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the picked segments of a column cut by ``offsets``, and their new offsets."""
    counts = offsets[picked + 1] - offsets[picked]
    new = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return np.repeat(offsets[picked] - new[:-1], counts) + np.arange(int(new[-1])), new


def model_run(pooled: PoolRun, model: int, pool: PoolSpec, placement: PoolPlacement) -> ServeRun:
    """``model``'s requests, instances, iterations and moves out of the pool's run, numbered
    as its own run would number them (its requests in its trace's order)."""
    run = pooled.run
    rows = np.flatnonzero(pooled.model == model)
    rows = rows[np.argsort(pooled.row[rows], kind="stable")]
    instances = np.array([i for i, m in enumerate(pooled.instance_model) if m == model], np.int64)
    local_row = np.full(len(run.trace), -1, np.int64)
    local_row[rows] = np.arange(rows.size)
    local_instance = np.full(len(run.instance_kind), -1, np.int64)
    local_instance[instances] = np.arange(instances.size)
    tokens, token_offsets = _gather(run.token_offsets, rows)
    trace = Trace(run.trace.arrived_at[rows], run.trace.prefill_tokens[rows], run.trace.decode_tokens[rows])
    group = placement.groups[pooled.instance_group[int(instances[0])]]
    return ServeRun(
        trace=trace, config=model_config(pool, group.tp, group.pp, instances.size),
        instance=local_instance[run.instance[rows]].astype(np.int32), scheduled_at=run.scheduled_at[rows],
        first_token_at=run.first_token_at[rows], finished_at=run.finished_at[rows],
        preemptions=run.preemptions[rows], token_times=run.token_times[tokens], token_offsets=token_offsets,
        iterations=_iterations(run.iterations, instances, local_row, local_instance), kv=_kv(run.kv, instances),
        instance_kind=tuple(run.instance_kind[i] for i in instances),
        instance_devices=tuple(run.instance_devices[i] for i in instances),
        tp=tuple(run.tp[i] for i in instances), peak_flops=run.peak_flops,
        moves=_moves(run.moves, instances, local_row), source=run.source,
        kv_bytes_per_token=tuple(run.kv_bytes_per_token[i] for i in instances) if run.kv_bytes_per_token else ())


def _iterations(log: IterationLog, instances: np.ndarray, local_row: np.ndarray,
                local_instance: np.ndarray) -> IterationLog:
    keep = np.flatnonzero(np.isin(log.instance, instances))
    batches, batch = np.unique(log.batch[keep], return_inverse=True)
    members, offsets = _gather(log.offsets, batches)
    return IterationLog(
        batch=batch.astype(np.int64), instance=local_instance[log.instance[keep]].astype(np.int32),
        stage=log.stage[keep], first_device=log.first_device[keep], start=log.start[keep], end=log.end[keep],
        prefill_tokens=log.prefill_tokens[keep], decodes=log.decodes[keep], kv_tokens=log.kv_tokens[keep],
        flops=log.flops[keep], members=local_row[log.members[members]], offsets=offsets,
        send_end=None if log.send_end is None else log.send_end[keep],
        send_bytes=None if log.send_bytes is None else log.send_bytes[keep])


def _kv(kv: KVTrace, instances: np.ndarray) -> KVTrace:
    return KVTrace(tuple(kv.times[i] for i in instances), tuple(kv.blocks[i] for i in instances),
                   tuple(kv.capacity_blocks[i] for i in instances), kv.block_size,
                   preempted_at=tuple(kv.preempted_at[i] for i in instances) if kv.preempted_at else ())


def _moves(moves: KVMoves, instances: np.ndarray, local_row: np.ndarray) -> KVMoves:
    if len(moves) == 0:
        return KVMoves.empty()
    keep = np.flatnonzero(np.isin(moves.instance, instances))
    request = np.where(moves.request[keep] >= 0, local_row[np.maximum(moves.request[keep], 0)], -1)
    local = np.searchsorted(instances, moves.instance[keep]).astype(np.int32)
    return KVMoves(request, tuple(moves.kind[k] for k in keep), moves.src_device[keep], moves.dst_device[keep],
                   moves.nbytes[keep], moves.start[keep], moves.end[keep], instance=local)


@dataclass(frozen=True, eq=False)
class Swap:
    """One model's weights loaded onto a device group's stage (bytes per device)."""

    model: str
    group: int
    device: int  # the stage's first cluster rank
    source: str  # "host memory" or "disk"
    nbytes: float
    start_s: float
    end_s: float


@dataclass(frozen=True, eq=False)
class PoolResult:
    """A placement served: each model's metrics, the swaps, the overall SLO attainment."""

    pool: PoolSpec
    placement: PoolPlacement
    run: ServeRun | None  # the pool's one run (None: nothing placed)
    results: tuple[ServeResult | None, ...]  # per model (None: no replica placed)
    swaps: tuple[Swap, ...]
    placement_s: float  # seconds the placement took to find

    @property
    def attainment(self) -> float:
        """Requests that met their model's SLOs over all the pool's requests (an unplaced
        model's requests meet none)."""
        met = sum(int(r.meets_slo.sum()) for r in self.results if r is not None)
        total = sum(len(m.trace) for m in self.pool.models)
        return met / total if total else 0.0

    def to_dict(self) -> dict[str, object]:
        """The JSON object of ``serve pool``."""
        models = {}
        for m, (traffic, result) in enumerate(zip(self.pool.models, self.results, strict=True)):
            models[traffic.name] = {
                "model": traffic.model.name, "replicas": len(self.placement.replicas(m)),
                "groups": list(self.placement.replicas(m)),
                "serving": None if result is None else result.to_dict()}
        return {"placement": self.placement.to_dict(self.pool), "placement_s": self.placement_s,
                "slo_attainment": self.attainment, "models": models,
                "swap_s": sum(s.end_s - s.start_s for s in self.swaps),
                "swaps": [{"model": s.model, "group": s.group, "device": s.device, "source": s.source,
                           "bytes": s.nbytes, "start_s": s.start_s, "end_s": s.end_s} for s in self.swaps]}


def serve_pool(pool: PoolSpec, placement: PoolPlacement, *, placement_s: float = 0.0) -> PoolResult:
    """``placement`` served: the pool's one run, read model by model."""
    check_placement(pool, placement)
    used = [g for g, group in enumerate(placement.groups) if group.models]
    if not used:
        return PoolResult(pool, placement, None, (None,) * len(pool.models), (), placement_s)
    pooled = run_groups(pool, placement, used)
    results = []
    for m, traffic in enumerate(pool.models):
        placed = m in pooled.instance_model
        results.append(serve_result(model_run(pooled, m, pool, placement), slo_ttft=traffic.slo_ttft_s,
                                    slo_tpot=traffic.slo_tpot_s) if placed else None)
    named = replace(pooled.run, instance_kind=tuple(pool.models[m].name for m in pooled.instance_model))
    return PoolResult(pool, placement, named, tuple(results), _swaps(pool, pooled), placement_s)


def _swaps(pool: PoolSpec, pooled: PoolRun) -> tuple[Swap, ...]:
    moves = pooled.run.moves
    source = {-1: "host memory", -2: "disk"}
    return tuple(Swap(pool.models[pooled.instance_model[int(moves.instance[k])]].name,
                      pooled.instance_group[int(moves.instance[k])], int(moves.dst_device[k]),
                      source[int(moves.src_device[k])], float(moves.nbytes[k]), float(moves.start[k]),
                      float(moves.end[k]))
                 for k in range(len(moves)) if moves.kind[k] == WEIGHTS)


def timed(function, *args):
    """``function(*args)`` and the seconds it took."""
    start = time.perf_counter()
    out = function(*args)
    return out, time.perf_counter() - start
