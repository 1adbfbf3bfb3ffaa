"""Where a pool's models run: device groups, each holding replicas of some models
(``PoolPlacement``), the memory rule that says what a group may hold, and the pool's run.

Memory. A replica of a model on a group of TP x PP devices needs, on each stage's devices,
its weights, its workspace and a minimum KV cache: one request of the model's longest
context (``build_deployment``'s own rule), all within ``kv_fraction`` of the device's memory
(``tiers.tier_capacity``). Models whose needs fit together stay on the devices together
(co-resident) and split the memory left over equally between their caches. Models that do
not fit together, but each alone, form a swap group: one model's weights on the devices at
a time, every model's weights in host memory (or on disk when host memory is short: the
tier that holds them all), and a model brought in costs ``tiers.move_seconds`` of its
weights per device from there plus a copy's latency (``Sharing``; while another model of
the group has requests, the resident admits no new one once its residency has lasted as
long as its load took, finishes those it holds, and the waiting model's weights come in).

Time. A group serves its models one batch at a time on its devices, turn by turn (one
run of the serving engine for the whole pool: each model's replicas are instances of
their own stage costs, the instances of a group on the group's device slots; each model's
requests go round-robin to its replicas, as ``serve simulate`` routes them). A model's
metrics are its own requests, iterations and moves out of that run (``model_run``), so a
model alone on the pool gives ``serve simulate``'s numbers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pipesched.enums import Tier
from pipesched.errors import PipeschedError
from pipesched.model.devices import HOST_COPY_LATENCY_S
from pipesched.model.tiers import move_seconds, tier_capacity
from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.deployment import Deployment, Sharing, build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.pool import PoolSpec
from pipesched.serving.records import ServeRun
from pipesched.serving.schedulers import blocks_of
from pipesched.serving.trace import Trace

_FROM = {Tier.HOST: -1, Tier.DISK: -2}  # KVMoves' device of the tier a weights load comes from


@dataclass(frozen=True)
class DeviceGroup:
    """``tp x pp`` devices from cluster rank ``first_rank``, one replica of each of ``models``."""

    first_rank: int
    tp: int
    pp: int
    models: tuple[int, ...] = ()  # pool model indices, one replica each, in the order placed
    swapped: bool = False  # the models do not fit together: one model's weights on the devices at a time

    @property
    def size(self) -> int:
        return self.tp * self.pp

    def with_model(self, model: int, swapped: bool) -> DeviceGroup:
        return replace(self, models=(*self.models, model), swapped=swapped)


@dataclass(frozen=True)
class PoolPlacement:
    """Which device groups hold which models' replicas (``method``: how it was found)."""

    method: str
    groups: tuple[DeviceGroup, ...]

    def replicas(self, model: int) -> tuple[int, ...]:
        """The groups holding a replica of ``model``, in order (its requests go round-robin)."""
        return tuple(g for g, group in enumerate(self.groups) if model in group.models)

    def placing(self, group: int, model: int, swapped: bool) -> PoolPlacement:
        groups = list(self.groups)
        groups[group] = groups[group].with_model(model, swapped)
        return replace(self, groups=tuple(groups))

    def adding(self, group: DeviceGroup) -> PoolPlacement:
        return replace(self, groups=(*self.groups, group))

    def to_dict(self, pool: PoolSpec) -> dict[str, object]:
        return {"method": self.method, "groups": [
            {"ranks": list(range(group.first_rank, group.first_rank + group.size)), "tp": group.tp, "pp": group.pp,
             "models": [pool.models[m].name for m in group.models], "swapped": group.swapped}
            for group in self.groups if group.models]}


def empty_groups(pool: PoolSpec, tp: int, pp: int) -> tuple[DeviceGroup, ...]:
    """The pool's devices cut into groups of ``tp x pp`` from rank 0 (the rest left idle)."""
    size = tp * pp
    return tuple(DeviceGroup(k * size, tp, pp) for k in range(pool.cluster.num_devices // size))


def model_config(pool: PoolSpec, tp: int, pp: int, replicas: int = 1) -> ServeConfig:
    """The serving configuration of one model of the pool on groups of ``tp x pp``."""
    return ServeConfig(instances=Instances(tp=tp, pp=pp, count=replicas), scheduler=pool.scheduler, kv=pool.kv,
                       cpu_overhead_s=pool.cpu_overhead_s)


@dataclass(frozen=True)
class Footprint:
    """One replica of a model on a device group: bytes per device, per stage."""

    need: tuple[float, ...]  # weights + workspace + the minimum KV cache (one request of the longest context)
    weights: tuple[float, ...]  # weights


def footprint(pool: PoolSpec, model: int, group: DeviceGroup) -> Footprint | None:
    """What a replica of ``model`` takes on ``group``'s devices; None when it does not fit
    there alone."""
    return _footprint(pool, model, group.first_rank, group.tp, group.pp)


@functools.lru_cache(maxsize=4096)
def _footprint(pool: PoolSpec, model: int, first_rank: int, tp: int, pp: int) -> Footprint | None:
    traffic = pool.models[model]
    try:
        deployment = build_deployment(model_config(pool, tp, pp), traffic.model, pool.cluster, first_rank=first_rank)
    except PipeschedError:
        return None
    tokens = blocks_of(max(deployment.max_context, int(traffic.trace.total_tokens.max(initial=0))),
                       pool.kv.block_size) * pool.kv.block_size
    stages = deployment.instances[0].stages
    return Footprint(need=tuple(s.weight_bytes + s.workspace_bytes + tokens * s.kv_bytes_per_token for s in stages),
                     weights=tuple(s.weight_bytes for s in stages))


def _budget(pool: PoolSpec, group: DeviceGroup) -> tuple[float, ...]:
    """Bytes per device each stage's devices give the models: ``kv_fraction`` of device memory."""
    return tuple(tier_capacity(pool.cluster.devices[group.first_rank + s * group.tp], Tier.DEVICE)
                 * pool.kv.kv_fraction for s in range(group.pp))


def fits_together(pool: PoolSpec, group: DeviceGroup, models: Sequence[int]) -> bool:
    """``models`` all stay on ``group``'s devices at once."""
    prints = [footprint(pool, m, group) for m in models]
    if any(p is None for p in prints):
        return False
    budget = _budget(pool, group)
    return all(sum(p.need[s] for p in prints) <= budget[s] for s in range(group.pp))


def swap_tier(pool: PoolSpec, group: DeviceGroup, models: Sequence[int]) -> Tier | None:
    """Where a swap group of ``models`` keeps every model's weights (host memory, else disk);
    None when some model does not fit the devices alone or no tier holds them all."""
    prints = [footprint(pool, m, group) for m in models]
    if any(p is None for p in prints):
        return None
    for tier in (Tier.HOST, Tier.DISK):
        if all(sum(p.weights[s] for p in prints) <= tier_capacity(_device(pool, group, s), tier)
               for s in range(group.pp)):
            return tier
    return None


def _device(pool: PoolSpec, group: DeviceGroup, stage: int):
    return pool.cluster.devices[group.first_rank + stage * group.tp]


def admits(pool: PoolSpec, group: DeviceGroup, model: int, *, swap: bool) -> bool | None:
    """Whether ``group`` may take a replica of ``model``: False (together with its models),
    True (as a swap group, when ``swap``), None (not at all)."""
    if model in group.models:
        return None
    models = (*group.models, model)
    if not group.swapped and fits_together(pool, group, models):
        return False
    if swap and swap_tier(pool, group, models) is not None:
        return True
    return None


def check_placement(pool: PoolSpec, placement: PoolPlacement) -> None:
    """Nothing beyond a device's or host's capacity, no group past the pool's devices."""
    for g, group in enumerate(placement.groups):
        if not group.models:
            continue
        names = ", ".join(pool.models[m].name for m in group.models)
        if group.first_rank + group.size > pool.cluster.num_devices:
            raise PipeschedError(f"group={g}: ranks {group.first_rank}..{group.first_rank + group.size - 1} are past "
                                 f"the pool's {pool.cluster.num_devices} devices; give fewer or smaller groups")
        ok = (swap_tier(pool, group, group.models) is not None if group.swapped
              else fits_together(pool, group, group.models))
        if not ok:
            raise PipeschedError(f"group={g}: {names} do not fit its {group.tp}x{group.pp} devices' memory "
                                 f"{'or host memory' if group.swapped else 'together'}; place fewer models there")


def _instance(pool: PoolSpec, group: DeviceGroup, model: int) -> Deployment:
    """``model``'s replica on ``group`` (a deployment of one instance): its stages' costs and
    its KV cache (its share of the memory the group's co-resident models leave)."""
    memory = None
    if not group.swapped and len(group.models) > 1:
        prints = [footprint(pool, m, group) for m in group.models]
        mine = prints[group.models.index(model)]
        budget = _budget(pool, group)
        spare = [budget[s] - sum(p.need[s] for p in prints) for s in range(group.pp)]
        memory = tuple((mine.need[s] + spare[s] / len(prints)) / pool.kv.kv_fraction for s in range(group.pp))
    return _replica(pool, model, group.first_rank, group.tp, group.pp, memory)


@functools.lru_cache(maxsize=4096)
def _replica(pool: PoolSpec, model: int, first_rank: int, tp: int, pp: int,
             memory: tuple[float, ...] | None) -> Deployment:
    return build_deployment(model_config(pool, tp, pp), pool.models[model].model, pool.cluster,
                            first_rank=first_rank, memory_bytes=memory)


@dataclass(frozen=True, eq=False)
class PoolRun:
    """One run of the serving engine over some of a placement's groups."""

    run: ServeRun  # every instance's requests, merged in arrival order
    deployment: Deployment  # what ran: every instance, its device slots and swap groups
    model: np.ndarray  # int64 per request of the run: its pool model
    row: np.ndarray  # int64 per request of the run: its row in its model's trace
    instance_model: tuple[int, ...]  # per instance: its pool model
    instance_group: tuple[int, ...]  # per instance: its placement group


def routes(placement: PoolPlacement, model: int, requests: int) -> np.ndarray:
    """The group each of ``model``'s requests goes to: round-robin over its replicas."""
    groups = np.asarray(placement.replicas(model), np.int64)
    return groups[np.arange(requests) % groups.size] if groups.size else np.full(requests, -1, np.int64)


def run_groups(pool: PoolSpec, placement: PoolPlacement, groups: Sequence[int]) -> PoolRun:
    """The serving engine's run of ``groups`` of ``placement`` (module docstring)."""
    built, owners, where = [], [], []
    for g in groups:
        for m in placement.groups[g].models:
            built.append(_instance(pool, placement.groups[g], m))
            owners.append(m)
            where.append(g)
    index = {(g, m): i for i, (g, m) in enumerate(zip(where, owners, strict=True))}
    parts = []
    for m in sorted(set(owners)):
        trace = pool.models[m].trace
        group = routes(placement, m, len(trace))
        rows = np.flatnonzero(np.isin(group, groups))
        parts.append((np.full(rows.size, m), rows, np.array([index[(int(g), m)] for g in group[rows]], np.int64)))
    model, row, instance = (np.concatenate(column) for column in zip(*parts, strict=True))
    arrived = _column(pool, model, row, "arrived_at")
    order = np.lexsort((row, model, arrived))
    model, row, instance = model[order], row[order], instance[order]
    trace = Trace(arrived[order], _column(pool, model, row, "prefill_tokens"), _column(pool, model, row, "decode_tokens"))
    deployment = _deployment(pool, placement, built, where)
    run = simulate_serving(deployment, trace, routes=instance)
    return PoolRun(run, deployment, model, row, tuple(owners), tuple(where))


def _column(pool: PoolSpec, model: np.ndarray, row: np.ndarray, name: str) -> np.ndarray:
    """Trace column ``name`` of each (model, row)."""
    out = np.zeros(model.shape[0], getattr(pool.models[int(model[0])].trace, name).dtype if model.size else np.int64)
    for m in np.unique(model):
        mine = model == m
        out[mine] = getattr(pool.models[int(m)].trace, name)[row[mine]]
    return out


def _deployment(pool: PoolSpec, placement: PoolPlacement, deployments: Sequence[Deployment],
                where: Sequence[int]) -> Deployment:
    """The instances of the run, their device slots and their swap groups."""
    cluster = pool.cluster
    plans = [built.instances[0] for built in deployments]
    slot, load_s, load_bytes, swap_group, load_from = [], [], [], [], []
    swap_ids: dict[int, int] = {}
    for plan, g in zip(plans, where, strict=True):
        group = placement.groups[g]
        tier = swap_tier(pool, group, group.models) if group.swapped else Tier.HOST
        for s, costs in enumerate(plan.stages):
            slot.append(g * max(group.pp for group in placement.groups) + s)
            device = cluster.devices[plan.devices[s]]
            load_s.append(move_seconds(device, costs.weight_bytes, tier, Tier.DEVICE) + HOST_COPY_LATENCY_S
                          if group.swapped else 0.0)
            load_bytes.append(costs.weight_bytes)
        swap_group.append(swap_ids.setdefault(g, len(swap_ids)) if group.swapped else -1)
        load_from.append(_FROM[tier])
    sharing = Sharing(slot=np.array(slot, np.int64), swap_group=np.array(swap_group, np.int64),
                      load_s=np.array(load_s), load_bytes=np.array(load_bytes), load_from=np.array(load_from))
    firsts = [plan.devices[0] for plan in plans]
    return Deployment(
        config=model_config(pool, plans[0].tp, len(plans[0].stages), len(plans)), instances=tuple(plans),
        max_context=max(built.max_context for built in deployments), peak_flops=deployments[0].peak_flops,
        host_link=deployments[0].host_link,
        link_latency=np.array([[0.0 if a == b else cluster.latency(a, b) for b in firsts] for a in firsts]),
        link_bandwidth=np.array([[math.inf if a == b else cluster.link(a, b).bandwidth for b in firsts]
                                 for a in firsts]), sharing=sharing)
