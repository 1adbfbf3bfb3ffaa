"""From a model on a cluster to per-stage costs: cost the layers on each stage's device,
partition them, and sum each stage.

Pipeline rank ``d`` of the placement runs on cluster ranks ``d*t .. d*t + t-1`` (t = the
tensor-parallel degree; that group must sit inside one node and is costed on its first
rank's device). Stage ``s`` runs on pipeline rank ``placement.replicas[0][s]``.

Methods:
- ``uniform``: equal blocks per stage, embedding first, head last;
- ``balanced``: exact minimum of the largest stage time F + I + W plus the boundary sends
  (each stage pays for sending its output on and its input gradient back);
- ``memory``: ``balanced`` among the partitions that fit in device memory under a
  schedule's in-flight activations.

Each stage may recompute differently (``recompute``: a mode per stage, see
``pipesched.model.recompute``): its layers are costed with its own mode. Frozen layers
(``TrainingSettings.frozen_layers``, ``pipesched.model.freezing``) cost less (no W, and no
backward at all before the first layer that trains), so ``balanced`` gives the stages that
hold them more layers: the partition follows the frozen set. A stage held ``n`` microbatches at once needs its
  static bytes + n x its activation bytes; a device holding k stage copies gives each a
  1/k share of its memory (the sum of per-stage peaks bounds the device's peak, so what is
  found fits; with k = 1 the search is exact).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from pipesched.costs import StageCosts
from pipesched.errors import OutOfMemory, PipeschedError, require
from pipesched.model.freezing import freeze_layers, frozen_mask, static_bytes
from pipesched.model.groups import GroupLevels, expert_group_levels, with_context_group
from pipesched.model.hardware import Cluster, DeviceSpec, LinkSpec
from pipesched.model.phases import model_layer_ops, stage_pair_seconds
from pipesched.model.spec import RECOMPUTE_MODES, LayerCost, ModelSpec, TrainingSettings
from pipesched.model.transformer import layer_costs
from pipesched.partition import (
    Partition,
    device_peak_bytes,
    inflight_per_stage,
    min_bottleneck,
    stage_instances_per_device,
    stage_values,
    uniform,
)
from pipesched.schedule import Placement, Schedule
from pipesched.units import GiB

METHODS = ("uniform", "balanced", "memory")


@dataclass(frozen=True)
class StagePlan:
    """A partition with everything derived from it. Times in seconds, sizes in bytes."""

    model: ModelSpec
    settings: TrainingSettings
    placement: Placement
    partition: Partition
    method: str
    ranks: tuple[int, ...]  # cluster rank of every stage (replica 0)
    devices: tuple[DeviceSpec, ...]  # device of every stage
    layers: tuple[tuple[LayerCost, ...], ...]  # the layer costs of every stage, on its device
    costs: StageCosts
    send_s: tuple[float, ...]  # boundary sends every stage pays per microbatch
    stage_s: tuple[float, ...]  # F + I + W + sends
    inflight: tuple[int, ...] | None = None  # per stage, from the schedule
    device_peak_bytes: tuple[float, ...] | None = None  # per pipeline rank, from the schedule
    device_memory: tuple[float, ...] = ()  # capacity per pipeline rank
    recompute: tuple[str, ...] = ()  # recompute mode of every stage

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


def pipeline_ranks(placement: Placement, cluster: Cluster, tensor_parallel: int, *,
                   data_parallel: int = 1, context_parallel: int = 1) -> tuple[int, ...]:
    """Cluster rank of every pipeline rank of the first pipeline replica: the first rank of
    its tensor-parallel group.

    Rank layout, replica-major (Megatron's order: tensor innermost, then context, then
    pipeline, then data): with d data-parallel replicas of a pipeline of p devices, tensor
    parallelism t and context parallelism c, a pipeline device spans w = t c ranks;
    replica r holds ranks r p w .. (r+1) p w - 1, and its pipeline device k runs on ranks
    r p w + k w .. r p w + k w + w - 1: c tensor-parallel groups of t ranks (each inside a
    node), the context-parallel ranks of one shard at stride t (they may span nodes). The
    data-parallel peers of a pipeline device are therefore ranks at stride p w
    (``data_parallel_groups``).
    """
    width = tensor_parallel * context_parallel
    needed = data_parallel * placement.num_devices * width
    replicas = f"{data_parallel} data-parallel pipelines need {data_parallel} x " if data_parallel > 1 else \
        "the pipeline needs "
    context = f" x context_parallel {context_parallel}" if context_parallel > 1 else ""
    require(cluster.num_devices >= needed, "cluster", cluster.name,
            f"has {cluster.num_devices} devices; {replicas}{placement.num_devices} x tensor_parallel "
            f"{tensor_parallel}{context} = {needed}; "
            f"{fitting_sizes(cluster, placement.num_devices, tensor_parallel, data_parallel, context_parallel)}")
    for first in range(0, needed, tensor_parallel):
        group = range(first, first + tensor_parallel)
        require(all(cluster.node_of[r] == cluster.node_of[first] for r in group), "tensor_parallel",
                tensor_parallel, f"group of pipeline rank {first // width % placement.num_devices} spans "
                "two nodes; use a degree that divides the node size")
    return tuple(device * width for device in range(placement.num_devices))


def context_group(first: int, tensor_parallel: int, context_parallel: int) -> tuple[int, ...]:
    """The context-parallel ranks of the pipeline device whose first rank is ``first``
    (``pipeline_ranks``): one per context chunk, at stride t.

    >>> context_group(16, 4, 2)
    (16, 20)
    """
    return tuple(first + j * tensor_parallel for j in range(context_parallel))


def fitting_sizes(cluster: Cluster, p: int, tensor_parallel: int, data_parallel: int = 1,
                  context_parallel: int = 1) -> str:
    """What to give instead of a pipeline that needs more devices than ``cluster`` has: the
    largest pipeline (-p) at this tensor-parallel degree, and the largest degree (-t, one
    that divides the node size) at this pipeline size, each with ``data_parallel`` replicas
    (and ``context_parallel`` ranks per stage)."""
    node_size = cluster.node_of.count(cluster.node_of[0])
    replicas = f" --dp {data_parallel}" if data_parallel > 1 else ""
    replicas += f" --cp {context_parallel}" if context_parallel > 1 else ""
    fits = []
    others = data_parallel * context_parallel  # ranks of every tensor-parallel group's copies
    largest_p = cluster.num_devices // (others * tensor_parallel)
    if largest_p >= 1:
        fits.append(f"-p {largest_p} -t {tensor_parallel}{replicas}")
    degrees = [t for t in range(1, node_size + 1) if node_size % t == 0 and others * p * t <= cluster.num_devices]
    if degrees:
        fits.append(f"-p {p} -t {degrees[-1]}{replicas}")
    if not fits:
        return "use a bigger cluster or lower dp"
    return "give " + " or ".join(fits)


def data_parallel_groups(placement: Placement, cluster: Cluster, tensor_parallel: int,
                         data_parallel: int, *, context_parallel: int = 1) -> tuple[tuple[int, ...], ...]:
    """For every pipeline device, the cluster ranks its gradients are reduced over: the same
    device of each of the d pipeline replicas, replica 0 first (``pipeline_ranks`` gives the
    layout: stride p x t x c), and with context parallelism each replica's c context ranks
    (which hold the same weights and see other tokens: Megatron's data-and-context group).

    >>> from pipesched.model import load_cluster
    >>> data_parallel_groups(Placement.one_per_device(2), load_cluster("4x8-h100"), 4, 4)
    ((0, 8, 16, 24), (4, 12, 20, 28))
    >>> data_parallel_groups(Placement.one_per_device(2), load_cluster("4x8-h100"), 4, 1, context_parallel=2)
    ((0, 4), (8, 12))
    """
    ranks = pipeline_ranks(placement, cluster, tensor_parallel, data_parallel=data_parallel,
                           context_parallel=context_parallel)
    stride = placement.num_devices * tensor_parallel * context_parallel
    return tuple(tuple(member + replica * stride for replica in range(data_parallel)
                       for member in context_group(rank, tensor_parallel, context_parallel)) for rank in ranks)


def plan_stages(model: ModelSpec, placement: Placement, cluster: Cluster, settings: TrainingSettings, *,
                method: str = "balanced", partition: Partition | None = None, schedule: Schedule | None = None,
                memory_limit: float | None = None, recompute: Sequence[str] | None = None) -> StagePlan:
    """Partition ``model`` into ``placement.num_stages`` stages and cost them.

    ``partition`` fixes the partition (``method`` is then ignored). ``schedule`` gives the
    in-flight counts (needed by ``method="memory"``; with other methods it adds each device's
    peak memory to the plan). ``memory_limit`` replaces every device's capacity, in bytes.
    ``recompute`` gives each stage its recompute mode (default: ``settings.recompute`` for
    every stage).
    """
    require(method in METHODS, "method", method, f"must be one of {', '.join(METHODS)}")
    modes = tuple(recompute) if recompute is not None else (settings.recompute,) * placement.num_stages
    require(len(modes) == placement.num_stages, "recompute", f"{len(modes)} modes",
            f"give one per stage ({placement.num_stages})")
    for mode in modes:
        require(mode in RECOMPUTE_MODES, "recompute", mode, f"choose one of {', '.join(RECOMPUTE_MODES)}")
    if schedule is not None:
        require(schedule.placement.replicas == placement.replicas, "schedule", schedule.name,
                "places stages differently from the given placement; pass schedule.placement")
    inflight = tuple(inflight_per_stage(schedule)) if schedule is not None else None
    # only the memory method partitions by the in-flight counts: under the others every
    # schedule shares one plan, which then carries the schedule's own counts
    by_memory = partition is None and method == "memory"
    plan = _planned(model, placement, cluster, settings, method, partition, memory_limit, modes,
                    inflight if by_memory else None)
    if isinstance(plan, _NoFit):
        raise plan.error(model.name, placement.num_stages, schedule.name if schedule is not None else "")
    if schedule is None:
        return plan
    return dataclasses.replace(plan, inflight=inflight, device_peak_bytes=tuple(device_peak_bytes(schedule, plan.costs)))


@functools.lru_cache(maxsize=4096)
def _planned(model: ModelSpec, placement: Placement, cluster: Cluster, settings: TrainingSettings, method: str,
             partition: Partition | None, memory_limit: float | None, modes: tuple[str, ...],
             inflight: tuple[int, ...] | None) -> StagePlan | _NoFit:
    """The plan of ``plan_stages`` without per-device peaks: a pure function of hashable
    inputs, in which a schedule counts only by its in-flight microbatches per stage, and
    only under the memory method (a search asks for the same plan for every family, ZeRO
    stage and data-parallel degree). When no partition fits under the memory method, what
    the error says."""
    tp, cp = settings.tensor_parallel, settings.context_parallel
    ranks_of_device = pipeline_ranks(placement, cluster, tp, context_parallel=cp)
    stage_ranks = tuple(ranks_of_device[d] for d in placement.replicas[0])
    num_stages = placement.num_stages
    tp_link = cluster.intra_node

    # the expert groups of the first stage's device (every stage's are alike in the rank layout)
    experts = expert_group_levels(cluster, settings, stage_ranks[0], placement.num_devices * settings.stage_width)

    def key_of(rank: int, mode: str) -> tuple[DeviceSpec, str, GroupLevels]:
        # a stage's layers differ by its device, recompute mode and context group's links
        return cluster.devices[rank], mode, with_context_group(experts, cluster, settings, rank)

    # every stage's device and recompute mode cost the whole model's layers; frozen layers
    # then cost what they still run
    by_device: dict[tuple[DeviceSpec, str, GroupLevels], list[LayerCost]] = {}
    mask: tuple[bool, ...] | None = None
    for rank, mode in zip(stage_ranks, modes, strict=True):
        key = key_of(rank, mode)
        if key not in by_device:
            layers = layer_costs(model, key[0], dataclasses.replace(settings, recompute=mode), tp_link=tp_link,
                                 groups=key[2])
            if settings.frozen_layers:
                mask = frozen_mask(settings.frozen_layers, len(layers), model.name)
                layers = freeze_layers(layers, mask)
            by_device[key] = layers
    per_stage = [by_device[key_of(rank, mode)] for rank, mode in zip(stage_ranks, modes, strict=True)]
    num_layers = len(per_stage[0])

    # per (device spec, recompute mode): each layer's F + I + W and output bytes
    rows = {key: (np.array([layer.total_s for layer in layers]), np.array([layer.output_bytes for layer in layers]))
            for key, layers in by_device.items()}
    stage_keys = [key_of(rank, mode) for rank, mode in zip(stage_ranks, modes, strict=True)]
    compute = np.array([rows[key][0] for key in stage_keys])
    out = np.array([rows[key][1] for key in stage_keys])
    send_forward = np.zeros((num_stages, num_layers))
    send_backward = np.zeros((num_stages, num_layers))
    if num_stages > 1:
        send_forward[:-1] = _transfer_times(cluster, stage_ranks[:-1], stage_ranks[1:], out[:-1])
        send_backward[1:] = _transfer_times(cluster, stage_ranks[1:], stage_ranks[:-1], out[1:])

    capacity = [memory_limit if memory_limit is not None else cluster.devices[r].memory_bytes for r in ranks_of_device]
    chosen = method if partition is None else "given"
    if partition is not None:
        require(partition.num_stages == num_stages, "partition", partition,
                f"has {partition.num_stages} stages; the placement has {num_stages}")
        require(partition.num_layers == num_layers, "partition", partition,
                f"covers {partition.num_layers} layers; {model.name} has {num_layers}")
    elif method == "uniform":
        partition = uniform(model.layer_kinds, num_stages)
    elif method == "balanced":
        partition = min_bottleneck(compute, send_forward=send_forward, send_backward=send_backward).partition
    else:
        if inflight is None:
            raise PipeschedError("method=memory: needs a schedule for its in-flight activations; give one "
                                 "(CLI: --schedule NAME -m MICROBATCHES)")
        partition = _fit_memory(settings, placement, [cluster.devices[r] for r in stage_ranks],
                                per_stage, inflight, capacity, compute, send_forward, send_backward)
        if isinstance(partition, _NoFit):
            return partition

    layers = tuple(tuple(per_stage[s][i] for i in partition.layers(s)) for s in range(num_stages))
    stage_devices = tuple(cluster.devices[r] for r in stage_ranks)
    pairs = _stage_pairs(model, settings, stage_devices, modes, layers, partition, tp_link,
                         [key[2] for key in stage_keys], pair_partners(placement))
    costs = _stage_costs(layers, settings, stage_devices, frozen=mask is not None, pairs=pairs)
    sends = stage_values(partition, np.zeros((num_stages, num_layers)),
                         send_forward=send_forward, send_backward=send_backward)
    stage_s = stage_values(partition, compute, send_forward=send_forward, send_backward=send_backward)
    stage_s = stage_s + np.array([3 * device.op_overhead_s for device in stage_devices])  # F, I and W
    return StagePlan(
        model=model, settings=settings, placement=placement, partition=partition, method=chosen,
        ranks=stage_ranks, devices=stage_devices, layers=layers,
        costs=costs, send_s=tuple(float(x) for x in sends), stage_s=tuple(float(x) for x in stage_s),
        inflight=inflight,
        device_memory=tuple(capacity), recompute=modes,
    )


def _stage_pairs(model: ModelSpec, settings: TrainingSettings, devices: Sequence[DeviceSpec], modes: Sequence[str],
                 layers: Sequence[Sequence[LayerCost]], partition: Partition, link: LinkSpec,
                 groups: Sequence[GroupLevels], partners: Sequence[int]) -> tuple[float, ...] | None:
    """Each stage's overlapped forward-backward pair (``pipesched.model.phases``): its
    forward's phases beside the backward's of stage ``partners[s]`` (one microbatch's
    communication beside the other's compute), seconds; None for a model of measured layers,
    without expert parallelism (a dense or EP = 1 model keeps its pairs at F + B as it always
    had them: the overlap is what DualPipe hides the experts' all-to-alls with) and where no
    pair overlaps anything. ``groups``: each stage's. The pipeline's sends stay the
    simulator's transfers."""
    if settings.expert_parallel == 1:
        return None
    ops = []
    for s, (device, mode) in enumerate(zip(devices, modes, strict=True)):
        every = model_layer_ops(model, device, dataclasses.replace(settings, recompute=mode), link, groups[s])
        if not every:
            return None
        ops.append(every)
    chunks = [([ops[s][i] for i in partition.layers(s)], layers[s]) for s in range(len(devices))]
    pairs = tuple(stage_pair_seconds(chunks[s], chunks[partner], devices[s], full_recompute=modes[partner] == "full")
                  for s, partner in enumerate(partners))
    # none overlaps anything: every pair is its parts back to back, as without pairs
    serial = [sum(layer.forward_s for layer in layers[s])
              + sum(layer.backward_input_s + layer.backward_weight_s for layer in layers[partner])
              for s, partner in enumerate(partners)]
    return None if all(p >= t * (1 - 1e-9) for p, t in zip(pairs, serial, strict=True)) else pairs


def pair_partners(placement: Placement) -> tuple[int, ...]:
    """The stage whose backward each stage's forward runs beside in an overlapped pair: the
    one other stage its device holds (DualPipe's stage of the other direction, DualPipeV's
    other arm, the other chunk of two), else itself (1F1B's pairs).

    >>> pair_partners(Placement.bidirectional(4)), pair_partners(Placement.one_per_device(2))
    ((3, 2, 1, 0), (0, 1))
    """
    held: dict[int, set[int]] = {}
    for replica in placement.replicas:
        for stage, device in enumerate(replica):
            held.setdefault(device, set()).add(stage)
    partners = []
    for stage, device in enumerate(placement.replicas[0]):
        others = held[device] - {stage}
        partners.append(min(others) if len(others) == 1 else stage)
    return tuple(partners)


def _transfer_times(cluster: Cluster, sources: Sequence[int], targets: Sequence[int], nbytes: np.ndarray) -> np.ndarray:
    """``cluster.transfer_time(sources[k], targets[k], n)`` for every n of row k of ``nbytes``."""
    pairs = list(zip(sources, targets, strict=True))
    latency = np.array([[cluster.latency(a, b)] for a, b in pairs])
    bandwidth = np.array([[cluster.link(a, b).bandwidth] for a, b in pairs])
    moving = (nbytes > 0) & np.array([[a != b] for a, b in pairs])
    return np.where(moving, latency + nbytes / bandwidth, 0.0)


def _fit_memory(settings: TrainingSettings, placement: Placement, devices: Sequence[DeviceSpec],
                per_stage: list[list[LayerCost]], inflight: Sequence[int], capacity: Sequence[float],
                compute: np.ndarray, send_forward: np.ndarray, send_backward: np.ndarray) -> Partition | _NoFit:
    """The balanced partition among those whose stages fit their share of device memory;
    when none does, what the error says."""
    fragmentation = [cluster_device.memory_fragmentation for cluster_device in devices]
    # each layer's static and activation bytes, once per layer list (stages on the same
    # device spec with the same recompute mode share one)
    columns: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for layers in per_stage:
        if id(layers) not in columns:
            columns[id(layers)] = (np.array([static_bytes(layer, settings) for layer in layers], np.float64),
                                   np.array([layer.activation_bytes for layer in layers], np.float64))
    memory = np.array([columns[id(layers)][0] + n * frag * columns[id(layers)][1]
                       for layers, n, frag in zip(per_stage, inflight, fragmentation, strict=True)])
    copies = stage_instances_per_device(placement)
    share = np.array([copies[d] for d in placement.replicas[0]], dtype=float)
    caps = np.array([capacity[d] for d in placement.replicas[0]]) / share
    found = min_bottleneck(compute, send_forward=send_forward, send_backward=send_backward,
                           memory=memory, memory_cap=caps)
    if found is not None:
        return found.partition
    smallest = min_bottleneck(memory * share[:, None])
    assert smallest is not None
    return _NoFit(min(capacity), float(smallest.value), bool(share.max() > 1))


class _NoFit(NamedTuple):
    """Why no partition fits under the memory method (bytes per device)."""

    capacity: float  # the smallest device memory
    smallest: float  # the smallest memory per device that some partition fits in
    shared: bool  # some device holds several stage copies

    def error(self, model: str, stages: int, schedule: str) -> OutOfMemory:
        shared = " (a device holding k stage copies gives each 1/k of its memory)" if self.shared else ""
        return OutOfMemory(
            f"memory={self.capacity / GiB:.1f} GiB: no partition of {model} into {stages} stages fits under "
            f"schedule {schedule}; the smallest memory that fits is {self.smallest / GiB:.2f} GiB per "
            f"device{shared}; use more devices, recompute, or a schedule with fewer microbatches in flight")


def _stage_costs(layers: Sequence[Sequence[LayerCost]], settings: TrainingSettings,
                 devices: Sequence[DeviceSpec], *, frozen: bool = False,
                 pairs: Sequence[float] | None = None) -> StageCosts:
    """Sum each stage's layers. Every op F, I, W and B also pays its device's fixed
    ``op_overhead_s`` once (B is one op, so it pays it once, not as I + W); activations and
    the gradients kept for W take ``memory_fragmentation`` times their bytes. With
    ``frozen`` (some layer is frozen) a stage whose layers are all frozen is marked so.
    ``pairs``: each stage's overlapped forward-backward pair, its two parts' overheads on
    top (``forward_backward``, what a fused pair costs); None where no pair overlaps anything
    (a pair is then F + B, as without it)."""
    def total(field: str) -> tuple[float, ...]:
        value = attrgetter(field)
        return tuple(sum(map(value, stage)) for stage in layers)

    fragmentation = [device.memory_fragmentation for device in devices]
    overhead = [device.op_overhead_s for device in devices]
    activations = tuple(a * f for a, f in zip(total("activation_bytes"), fragmentation, strict=True))
    inputs_for_w = sum(i * f for i, f in zip(total("weight_input_bytes"), fragmentation, strict=True))
    all_activations = sum(activations)
    # the stage's output is its last layer's; an empty stage passes its input on unchanged
    outputs = []
    previous = 0.0
    for stage in layers:
        previous = stage[-1].output_bytes if stage else previous
        outputs.append(previous)
    backward_input = total("backward_input_s")
    backward_weight = total("backward_weight_s")
    return StageCosts(
        forward=tuple(t + o for t, o in zip(total("forward_s"), overhead, strict=True)),
        backward_input=tuple(t + o for t, o in zip(backward_input, overhead, strict=True)),
        backward_weight=tuple(t + o for t, o in zip(backward_weight, overhead, strict=True)),
        backward=tuple(i + w + o for i, w, o in zip(backward_input, backward_weight, overhead, strict=True)),
        activation_bytes=activations,
        output_bytes=tuple(outputs),
        static_bytes=tuple(sum(static_bytes(layer, settings) for layer in stage) for stage in layers),
        grad_bytes=tuple(sum(layer.params for layer in stage if not layer.frozen) * settings.grad_bytes
                         for stage in layers),
        # I frees what W does not need: everything but the inputs of the weight matmuls
        input_frees=1.0 - inputs_for_w / all_activations if all_activations > 0 else 0.5,
        kept_for_w_bytes=tuple(k * f for k, f in zip(total("kept_for_w_bytes"), fragmentation, strict=True)),
        frozen=tuple(all(layer.frozen for layer in stage) for stage in layers) if frozen else None,
        recompute_s=total("recompute_s"),
        forward_backward=_pair_costs(pairs, overhead),
    )


def _pair_costs(pairs: Sequence[float] | None, overhead: Sequence[float]) -> tuple[float, ...] | None:
    """The stages' pair times with their F and B ops' overheads (None: no pair overlaps)."""
    return None if pairs is None else tuple(p + 2 * o for p, o in zip(pairs, overhead, strict=True))


def build_stage_costs(model: ModelSpec, placement: Placement, cluster: Cluster, settings: TrainingSettings, *,
                      method: str = "balanced", partition: Partition | None = None,
                      schedule: Schedule | None = None, memory_limit: float | None = None,
                      recompute: Sequence[str] | None = None) -> StageCosts:
    """Per-stage costs of ``model`` split over ``placement`` on ``cluster`` (see plan_stages).

    >>> from pipesched.model import load_cluster, load_model
    >>> costs = build_stage_costs(load_model("llama3-8b"), Placement.one_per_device(4),
    ...                           load_cluster("1x8-h100"), TrainingSettings(tensor_parallel=2))
    >>> costs.num_stages
    4
    """
    modes = None if recompute is None else tuple(recompute)
    # a pure function of hashable inputs: a grid of experiments asks for the same costs many
    # times (every family and microbatch count on the same placement; a search's bound, then
    # its simulation, of the same schedule)
    key = None if schedule is None else _SameSchedule(schedule)
    return cached_plan(model, placement, cluster, settings, method, partition, memory_limit, modes, key).costs


class _SameSchedule:
    """A schedule as a cache key, by identity (generated schedules are cached, so the same
    sizes give the same object); the key keeps its schedule alive, so no other takes its id."""

    __slots__ = ("schedule",)

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def __hash__(self) -> int:
        return id(self.schedule)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameSchedule) and other.schedule is self.schedule


@functools.lru_cache(maxsize=1024)
def cached_plan(model: ModelSpec, placement: Placement, cluster: Cluster, settings: TrainingSettings,
                method: str, partition: Partition | None, memory_limit: float | None,
                recompute: tuple[str, ...] | None = None, schedule: _SameSchedule | None = None) -> StagePlan:
    """``plan_stages`` kept for its hashable inputs (a schedule by identity)."""
    return plan_stages(model, placement, cluster, settings, method=method, partition=partition,
                       memory_limit=memory_limit, recompute=recompute,
                       schedule=schedule.schedule if schedule is not None else None)
