"""A serving configuration placed on a cluster: its instances, each a pipeline of stages
with their iteration costs, devices and KV-cache capacity (``Deployment``), what the engine
runs a trace on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.enums import Collective, Tier
from pipesched.errors import PipeschedError, require
from pipesched.model.collectives import collective_seconds, group_levels
from pipesched.model.devices import DEFAULT_HOST_BANDWIDTH, HOST_COPY_LATENCY_S
from pipesched.model.hardware import Cluster, LinkSpec
from pipesched.model.inference import (
    LatencyRow,
    StageIterationCosts,
    latency_costs,
    stage_iteration_costs,
    with_residency,
)
from pipesched.model.spec import DTYPE_BYTES, ModelSpec
from pipesched.model.tiers import link_bandwidth
from pipesched.serving.config import Instances, KVSettings, ServeConfig, layout_label
from pipesched.units import GB, GiB

_RESHARD_PROBE_BYTES = 1 * GB  # the cache size reshard_link reads the all-to-all's slope at


@dataclass(frozen=True, eq=False)
class InstancePlan:
    """One model instance: a replica, or a prefill or decode instance when disaggregated."""

    kind: str  # "replica", "prefill" or "decode"
    stages: tuple[StageIterationCosts, ...]  # in pipeline order
    devices: tuple[int, ...]  # per stage: its first cluster rank (the stage runs on tp ranks from there)
    tp: int
    kv_capacity_blocks: int  # blocks of the paged cache: the tightest stage's
    kv_bytes_per_token: float  # KV cache of one token over the whole model (all stages and ranks)


@dataclass(frozen=True, eq=False)
class Sharing:
    """Instances that share devices in time: several models on one device group
    (``pipesched.serving.pool``), read by the engine (its module docstring)."""

    slot: np.ndarray  # int64 per stage of every instance, in order: the device slot it runs on
    swap_group: np.ndarray  # int64 per instance: its swap group (-1: its weights stay on its devices)
    load_s: np.ndarray  # float64 per stage: seconds to bring its weights onto its devices (move + latency)
    load_bytes: np.ndarray  # float64 per stage: its weight bytes per device
    load_from: np.ndarray  # int64 per instance: where its weights wait when swapped out (-1 host memory, -2 disk)
    # int64 per stage: the slots it occupies, from ``slot`` on (a stage over more devices than
    # another's on the same devices); None: one each
    span: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Deployment:
    """A ``ServeConfig`` built on a model and a cluster."""

    config: ServeConfig
    instances: tuple[InstancePlan, ...]
    max_context: int  # longest prompt + output a request may have (the model's context length)
    peak_flops: float  # per device, for MFU
    host_link: LinkSpec  # device to host memory and back (swap preemption)
    # seconds to move n bytes from instance a to instance b: latency[a, b] + n / bandwidth[a, b]
    link_latency: np.ndarray  # float64 [instances, instances]
    link_bandwidth: np.ndarray  # float64 [instances, instances], bytes/s
    host_write_bandwidth: float = 0.0  # device to host memory, bytes/s (swap-out); 0 = host_link's
    sharing: Sharing | None = None  # instances sharing devices in time; None: each on its own

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to send ``nbytes`` of KV cache from instance ``src`` to ``dst``."""
        return float(self.link_latency[src, dst] + nbytes / self.link_bandwidth[src, dst])


def build_deployment(config: ServeConfig, model: ModelSpec, cluster: Cluster, *,
                     latency: Sequence[LatencyRow] | None = None, dtype: str = "bf16",
                     first_rank: int = 0, memory_bytes: Sequence[float] | None = None) -> Deployment:
    """``config`` placed on ``cluster``: its instances on the ranks ``config.py`` lays out
    (replicas; or the prefill instances first, then the decode instances), each stage's
    iteration costs from the kernel model (or from the fitted ``latency`` rows, one per
    stage) sized for the scheduler's token budget and batch, and each instance's paged KV
    cache: the blocks its tightest stage holds in ``kv_fraction`` of device memory after its
    weights and workspace. With ``config.resident`` below 1 each stage keeps only that share
    of its blocks in device memory (``with_residency``): the memory of the streamed ones,
    less the staging buffer, goes to the KV cache. The stages' ``base_s`` is device work only: the engine pays
    ``config.cpu_overhead_s`` (the host's scheduling and launch) before each batch itself.
    The instances start at cluster rank ``first_rank``; ``memory_bytes`` (per stage) is the
    device memory the deployment may take in place of each device's own (its share of devices
    it shares with other models). With ``config.disaggregate.shared`` the decode instances
    sit on the prefill instances' ranks: the two caches split what both layouts' weights
    leave (``_shared_memory``), each stage takes its tp devices' slots (``Sharing.span``) and
    each prompt's cache goes over the re-sharding all-to-all (``reshard_link``).

    >>> from pipesched.model import load_cluster, load_model
    >>> deployment = build_deployment(ServeConfig(), load_model("llama3-70b"), load_cluster("1x8-h100"))
    >>> [(plan.kind, plan.devices) for plan in deployment.instances]
    [('replica', (0, 4))]
    """
    groups = _groups(config)
    _check_devices(config, cluster, groups, first_rank)
    shared = config.disaggregate is not None and config.disaggregate.shared
    require(not (shared and memory_bytes is not None), "disaggregate", layout_label(config),
            "prefill and decode on the same devices take the whole devices; give no memory share")
    spec = config.scheduler
    max_tokens = max(spec.token_budget, spec.max_batch)  # a decode-only iteration batches max_batch tokens
    layouts = []  # per instance: its kind, its side's shape, its stages' first ranks and their costs
    offset = first_rank
    for kind, group in groups:
        offset = first_rank if shared and kind == "decode" else offset  # on the prefill instances' devices
        for _ in range(group.count):
            ranks = tuple(offset + stage * group.tp for stage in range(group.pp))
            stages = _stage_costs(model, cluster, group, ranks, latency, max_tokens, spec.max_batch, dtype)
            stages = tuple(with_residency(costs, cluster.devices[rank], config.resident, source=config.stream_from)
                           for costs, rank in zip(stages, ranks, strict=True))
            layouts.append((kind, group, ranks, stages))
            offset += group.devices // group.count
    memories = (_shared_memory(layouts, cluster, config.kv) if shared else
                [tuple(cluster.devices[rank].memory_bytes for rank in ranks) if memory_bytes is None
                 else tuple(memory_bytes) for _, _, ranks, _ in layouts])
    instances = tuple(InstancePlan(kind=kind, stages=stages, devices=ranks, tp=group.tp,
                                   kv_capacity_blocks=_kv_blocks(stages, memory, config.kv),
                                   kv_bytes_per_token=model_kv_bytes_per_token(model, dtype))
                      for (kind, group, ranks, stages), memory in zip(layouts, memories, strict=True))
    max_context = model.context_length or min(plan.kv_capacity_blocks for plan in instances) * config.kv.block_size
    for index, (plan, memory) in enumerate(zip(instances, memories, strict=True)):
        _check_holds_one_request(plan, index, memory, config.kv, max_context)
    latency_matrix, bandwidth = _links(instances, cluster, shared=shared)
    device = cluster.devices[0]
    host = device.host_bandwidth or DEFAULT_HOST_BANDWIDTH
    return Deployment(config=config, instances=instances, max_context=max_context,
                      peak_flops=device.peak_flops, host_link=LinkSpec(bandwidth=host, latency=HOST_COPY_LATENCY_S),
                      link_latency=latency_matrix, link_bandwidth=bandwidth,
                      host_write_bandwidth=link_bandwidth(device, Tier.DEVICE, Tier.HOST) if device.host_bandwidth else 0.0,
                      sharing=_phase_sharing(instances, first_rank) if shared else None)


def _links(instances: Sequence[InstancePlan], cluster: Cluster, *, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """Latency and bandwidth of the KV cache's way between instances (``Deployment``): the
    cluster's link between their first devices; on the same devices (``shared``), prefill
    instance k to decode instance k, the re-sharding all-to-all's (``reshard_link``)."""
    firsts = [plan.devices[0] for plan in instances]
    latency = np.array([[0.0 if a == b else cluster.latency(a, b) for b in firsts] for a in firsts])
    bandwidth = np.array([[np.inf if a == b else cluster.link(a, b).bandwidth for b in firsts] for a in firsts])
    if shared:
        half = len(instances) // 2
        for k in range(half):
            latency[k, k + half], bandwidth[k, k + half] = reshard_link(cluster, instance_ranks(instances[k]))
    return latency, bandwidth


def instance_ranks(plan: InstancePlan) -> tuple[int, ...]:
    """Every cluster rank an instance runs on (its stages' tp ranks each)."""
    return tuple(rank + k for rank in plan.devices for k in range(plan.tp))


def reshard_link(cluster: Cluster, ranks: Sequence[int]) -> tuple[float, float]:
    """A KV cache re-sharded from one layout of ``ranks`` to another (pipeline stages to
    tensor-parallel heads): an all-to-all in which each rank holds 1 / n of the cache and
    keeps 1 / n of that (``collectives.collective_seconds``), as the engine's link: latency
    (seconds) and bandwidth (the whole cache's bytes per second), the time at no bytes and
    the slope to a gigabyte's."""
    levels = group_levels(cluster, ranks)
    n = len(ranks)
    empty = collective_seconds(Collective.ALL_TO_ALL, 0.0, levels)
    slope = (collective_seconds(Collective.ALL_TO_ALL, _RESHARD_PROBE_BYTES / n, levels) - empty) / _RESHARD_PROBE_BYTES
    return empty, (1.0 / slope if slope > 0 else math.inf)


def _shared_memory(layouts: Sequence[tuple], cluster: Cluster, kv: KVSettings) -> list[tuple[float, ...]]:
    """Device memory per stage each instance of a prefill-decode pair on the same devices
    may take: its stage's weights and workspace on each of the stage's devices, and half the
    ``kv_fraction`` of the device that both layouts' weights and workspace leave (the
    tightest device of the stage): the two caches split what is left."""
    need = {}  # (instance, rank): bytes its stage there holds besides the cache
    for x, (_, group, ranks, stages) in enumerate(layouts):
        for rank, costs in zip(ranks, stages, strict=True):
            for device in range(rank, rank + group.tp):
                need[x, device] = costs.device_weight_bytes + costs.workspace_bytes
    half = len(layouts) // 2
    memories = []
    for x, (_, group, ranks, _) in enumerate(layouts):
        partner = x + half if x < half else x - half
        memories.append(tuple(
            min(need[x, d] + (cluster.devices[d].memory_bytes * kv.kv_fraction - need[x, d] - need[partner, d]) / 2
                for d in range(rank, rank + group.tp)) / kv.kv_fraction for rank in ranks))
    return memories


def _phase_sharing(instances: Sequence[InstancePlan], first_rank: int) -> Sharing:
    """Prefill and decode instances on the same devices: a slot per device, each stage on
    its tp devices' slots."""
    slot = [rank - first_rank for plan in instances for rank in plan.devices]
    span = [plan.tp for plan in instances for _ in plan.devices]
    return Sharing(slot=np.array(slot, np.int64), swap_group=np.full(len(instances), -1, np.int64),
                   load_s=np.zeros(len(slot)), load_bytes=np.zeros(len(slot)),
                   load_from=np.full(len(instances), -1, np.int64), span=np.array(span, np.int64))


def _groups(config: ServeConfig) -> tuple[tuple[str, Instances], ...]:
    """The kinds of instances in rank order."""
    if config.disaggregate is None:
        return (("replica", config.instances),)
    return (("prefill", config.disaggregate.prefill), ("decode", config.disaggregate.decode))


def _check_devices(config: ServeConfig, cluster: Cluster, groups: Sequence[tuple[str, Instances]],
                   first_rank: int) -> None:
    """The deployment fits on the cluster's ranks from ``first_rank``."""
    if first_rank >= 0 and first_rank + config.devices <= cluster.num_devices:
        return
    parts = " + ".join(f"{group.count} {kind}{'s' if group.count > 1 else ''} of tp {group.tp} x p {group.pp}"
                       for kind, group in groups)
    field = "disaggregate" if config.disaggregate is not None else "replicas"
    start = f" from rank {first_rank}" if first_rank else ""
    raise PipeschedError(f"{field}={parts}: needs {config.devices} devices{start}; the cluster {cluster.name} has "
                         f"{cluster.num_devices}; give fewer instances, a smaller -t or -p, or a bigger cluster")


def _stage_costs(model: ModelSpec, cluster: Cluster, group: Instances, ranks: tuple[int, ...],
                 latency: Sequence[LatencyRow] | None, max_tokens: int, max_batch: int,
                 dtype: str) -> tuple[StageIterationCosts, ...]:
    if latency is None:
        return stage_iteration_costs(model, cluster, tp=group.tp, first_ranks=ranks, max_tokens=max_tokens,
                                     max_batch=max_batch, dtype=dtype)
    return latency_costs(latency, model, cluster, tp=group.tp, first_ranks=ranks, max_tokens=max_tokens,
                         max_batch=max_batch, dtype=dtype)


def kv_free_bytes(stage: StageIterationCosts, memory_bytes: float, kv: KVSettings) -> float:
    """Bytes a stage's device (of ``memory_bytes``) has for its KV cache: its share of memory
    after weights and workspace."""
    return memory_bytes * kv.kv_fraction - stage.device_weight_bytes - stage.workspace_bytes


def _kv_blocks(stages: Sequence[StageIterationCosts], memory: Sequence[float], kv: KVSettings) -> int:
    """Blocks of the instance's paged cache: every stage holds every block's tokens for its
    layers, so the tightest stage decides."""
    blocks = [math.floor(max(kv_free_bytes(stage, nbytes, kv), 0.0) / (stage.kv_bytes_per_token * kv.block_size))
              for stage, nbytes in zip(stages, memory, strict=True) if stage.kv_bytes_per_token > 0]
    return min(blocks) if blocks else 0


def _check_holds_one_request(plan: InstancePlan, index: int, memory: Sequence[float], kv: KVSettings,
                             max_context: int) -> None:
    """A KV cache that cannot hold one request of the longest context is an error that
    says how much memory is short on the tightest stage and what to change."""
    needed = math.ceil(max_context / kv.block_size)
    if plan.kv_capacity_blocks >= needed:
        return
    # bytes each stage lacks for ``needed`` blocks of its layers' keys and values
    short = [needed * kv.block_size * stage.kv_bytes_per_token - kv_free_bytes(stage, nbytes, kv)
             for stage, nbytes in zip(plan.stages, memory, strict=True)]
    position = int(np.argmax(short))
    stage, nbytes = plan.stages[position], memory[position]
    raise PipeschedError(
        f"kv_cache={plan.kv_capacity_blocks} blocks: {plan.kind} {index} cannot hold one request of "
        f"{max_context:,} tokens ({needed:,} blocks of {kv.block_size}); its stage {position} has "
        f"{kv.kv_fraction:g} x {nbytes / GiB:.1f} GiB for {stage.device_weight_bytes / GiB:.1f} GiB of "
        f"weights, {stage.workspace_bytes / GiB:.2f} GiB of workspace and the cache: {short[position] / GiB:.2f} GiB "
        "short; give a larger -t or -p, a higher --kv-fraction, a smaller --max-tokens, or a smaller model")


def model_kv_bytes_per_token(model: ModelSpec, dtype: str) -> float:
    """Bytes of one token's keys and values (or latent-attention latent) over the whole
    model (every layer, every rank)."""
    return model.kv_cache_elements() * DTYPE_BYTES[dtype] * model.num_layers
