"""An experiment point: one schedule on one workload and machine, frozen and hashable, so that
a grid of points can be evaluated by any map (a list comprehension, a process pool, Ray)
and its results stored and looked up by point.

A point is three records, one per concern: the schedule asked for (``ScheduleRequest``),
the workload (``Workload``) and the engine settings (``EngineSettings``); it reads their
fields as its own. Levels read different parts of it: the closed form (level 1) and the
slot table (level 2) need the schedule asked for (family, sizes, options and slot costs);
the simulation (level 3) also needs the workload: a model on a cluster (with data, tensor parallel and micro-batch sizes,
recompute, the partition of layers into stages, link overrides), or measured stage costs
on uniform links. With ``dp`` > 1 the simulated pipeline is one of dp identical replicas
that reduce their gradients over the cluster (``pipesched.simulate.network.DataParallel``),
with the optimizer state sharded over them at ZeRO stage 1.

What real training runs do to the table is part of the point too: frozen layers (the
stages whose layers are all frozen drop their W, or their whole backward: the table is
generated for them, ``pipesched.passes.freeze``), per-stage recompute, and an activation
offload policy (``pipesched.passes.offload``) with the host links it moves over.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipesched.costs import StageCosts
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.experiments.keys import record_json
from pipesched.experiments.setup import SimulationSetup, describe_model_setup
from pipesched.generators import FAMILIES, generate, get_family
from pipesched.generators.terapipe import FAMILY as TERAPIPE
from pipesched.indices import format_indices
from pipesched.model import load_cluster, load_model
from pipesched.model.freezing import parse_frozen_layers
from pipesched.model.hardware import Cluster
from pipesched.model.recompute import check_recompute, uniform_mode
from pipesched.model.spec import ModelSpec, TrainingSettings, check_context_parallel
from pipesched.model.transformer import attention_time_share
from pipesched.ops import I
from pipesched.passes.freeze import freeze
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.rules import RULES
from pipesched.schedule import Schedule

if TYPE_CHECKING:
    from pipesched.variability.model import Variability
ZERO_STAGES = (0, 1)  # ZeRO stages of the optimizer state a point may take


# the names errors give a point's fields: TrainingSettings' and the flags' (--tensor-parallel)
_FIELD_NAMES = {"tp": "tensor_parallel", "cp": "context_parallel", "cp_comm": "cp_comm_type"}


def zero_applies(zero: int, dp: int) -> bool:
    """Whether ZeRO stage ``zero`` can shard the optimizer state over ``dp`` data-parallel
    replicas: stage 0 always (nothing is sharded), stage 1 only over two or more."""
    return zero == 0 or dp > 1


def check_zero(zero: int, dp: int) -> None:
    """Refuse a ZeRO stage the data-parallel size cannot take (see ``zero_applies``)."""
    require(zero in ZERO_STAGES, "zero", zero,
            "choose 0 (every data-parallel rank keeps the optimizer state) or 1 (sharded over them)")
    require(zero_applies(zero, dp), "zero", zero,
            f"ZeRO-1 shards the optimizer state over data-parallel replicas, and dp={dp}; give --dp 2 or more, "
            "or zero 0")


def check_expert_fold(ep: int, etp: int, tp: int, dp: int) -> None:
    """Refuse an expert-parallel group the stage's ranks cannot hold: Megatron-Core's
    parallel folding draws the EP x ETP ranks of a MoE block from the stage's tp x dp ranks
    (``pipesched.model.groups``), so EP x ETP must divide tp x dp."""
    for name, value in (("expert_parallel", ep), ("expert_tensor_parallel", etp)):
        require(isinstance(value, int) and not isinstance(value, bool) and value >= (1 if name == "expert_parallel" else 0),
                name, value, "must be a whole number >= 1 (expert_tensor_parallel: >= 0, 0 = tensor_parallel)")
    folded = ep * (etp or tp)
    require(ep == 1 or (tp * dp) % folded == 0, "expert_parallel", ep,
            f"x expert_tensor_parallel {etp or tp} = {folded} ranks must divide the tensor x data-parallel ranks "
            f"{tp} x {dp} = {tp * dp} they fold over; give --dp a multiple of {folded // math.gcd(folded, tp)} "
            "or a smaller --ep")


@dataclass(frozen=True)
class ScheduleRequest:
    """The schedule asked for: a family at its sizes and options, or a given table."""

    family: str = ""  # schedule family, or the name of a given ``schedule`` ("" in a template point)
    p: int = DEFAULTS.p  # pipeline devices
    m: int = DEFAULTS.m  # microbatches per iteration
    v: int | None = None  # chunks per device, for families that take it (None: the family's default)
    options: tuple[tuple[str, object], ...] = ()  # family options, e.g. (("activation_limit", 6),)
    schedule: Schedule | None = None  # a given table (a schedule file) instead of a family
    slot_costs: StageCosts | None = None  # F, I, W of levels 1 and 2 (None: 1, 1, 1 slot)
    # an overlapped pair's time over F + B (fused ops; None: the costs' own, F + B or their fb column)
    fb_cost: float | None = None

    def __post_init__(self) -> None:
        for name in ("p", "m"):
            _require_count(name, getattr(self, name))


@dataclass(frozen=True)
class Workload:
    """What the sim level (level 3) runs on: a model on a cluster (with data, tensor
    parallel and micro-batch sizes, recompute, the partition of layers into stages, link
    overrides), or measured stage costs on uniform links; and what training does to the
    table (frozen layers, offload and the host links it moves over)."""

    model: str | ModelSpec | None = DEFAULTS.model
    cluster: str | Cluster | None = DEFAULTS.cluster
    dp: int = 1  # data-parallel pipeline replicas
    tp: int = DEFAULTS.tensor_parallel  # tensor-parallel degree
    micro_batch_size: int = DEFAULTS.micro_batch_size  # sequences per microbatch
    seq_len: int = DEFAULTS.seq_len  # tokens per sequence
    recompute: str = DEFAULTS.recompute  # none, selective or full
    sequence_parallel: bool = DEFAULTS.sequence_parallel
    dtype: str = DEFAULTS.dtype
    partition: str = DEFAULTS.partition  # uniform, balanced, memory, or a Megatron layout string
    # ... or measured stage costs on uniform links
    stage_costs: StageCosts | None = None
    latency: float | None = None  # seconds: uniform links for stage costs, an override for a cluster
    bandwidth: float | None = None  # bytes/s, likewise (inf: free links)
    # layers that do not train: with a model, positions in its layer list (embedding first);
    # with stage costs, cost rows; ranges like 0-39 or a fraction from the front
    frozen_layers: str | tuple[int, ...] = ""
    offload: str | OffloadPolicy = ""  # activation offload: "" none, "all", stages like 0-3, or a fraction like 0.5
    host_bandwidth: float | None = None  # bytes/s of every device's host link: uniform links, or a cluster override
    host_memory: float | None = None  # bytes of host memory each device's offloads may fill, likewise
    # the optimizer state's ZeRO stage: 0 (each data-parallel rank keeps all of it) or 1
    # (split over the dp replicas: reduce-scatter the gradients, all-gather the parameters)
    zero: int = 0
    # context parallelism: ranks that split every sequence (a stage spans tp x cp devices) and
    # how they exchange keys and values (p2p, a2a, allgather)
    cp: int = DEFAULTS.context_parallel
    cp_comm: str = DEFAULTS.cp_comm_type
    # expert parallelism of the MoE blocks (EP ranks, each with num_experts / EP experts) and
    # the experts' own tensor parallelism (0: tp), folded over the tp x dp ranks of a stage
    ep: int = 1
    etp: int = 0
    moe_dispatcher: str = DEFAULTS.moe_dispatcher  # alltoall or deepep (TrainingSettings.moe_dispatcher)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "micro_batch_size", "seq_len", "cp"):
            _require_count(name, getattr(self, name))
        check_context_parallel(self.cp, self.cp_comm, self.seq_len)
        check_recompute(self.recompute)
        for name in ("host_bandwidth", "host_memory"):
            value = getattr(self, name)
            require(value is None or value > 0, name, value, "must be > 0 (bytes/s, bytes)")
        check_zero(self.zero, self.dp)
        check_expert_fold(self.ep, self.etp, self.tp, self.dp)
        if self.stage_costs is not None:
            require(self.cp == 1, "context_parallel", self.cp,
                    "a stage-cost file gives each stage's costs as measured; give a model and a cluster to split "
                    "its sequences, or cp 1")
            require(self.ep == 1, "expert_parallel", self.ep,
                    "a stage-cost file gives the costs of its experts as measured; give a model and a cluster, or --ep 1")
            require(self.zero == 0, "zero", self.zero,
                    "a stage-cost file does not say which of its static bytes are optimizer state; give a model "
                    "and a cluster to shard it, or zero 0")
        elif self.model is None or self.cluster is None:
            raise PipeschedError("model=None: give a model and a cluster, or stage costs")


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs the point."""

    contention: bool = True  # transfers wait for a busy channel
    overlap: bool = True  # communication overlaps compute (else Megatron's blocking p2p)
    # iterations back to back, each stage stepping its optimizer on its own (zero bubble's
    # post-validation): the table and sim levels report the steady-state iteration
    steady_state: bool = False
    # Monte Carlo over durations at the sim level (None: the deterministic run only)
    variability: Variability | None = None


def _require_count(name: str, value: object) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, _FIELD_NAMES.get(name, name),
            value, "must be a whole number >= 1")


# each part of a point and its record; a point's fields are its parts' fields
PARTS = {"request": ScheduleRequest, "workload": Workload, "engine": EngineSettings}
_PART_OF = {name: part for part, record in PARTS.items() for name in record.__dataclass_fields__}
_DEFAULT_PARTS = {part: record() for part, record in PARTS.items()}  # the commands' defaults


@dataclass(frozen=True, init=False)
class Point:
    """One experiment (see the module docstring): the schedule asked for, the workload and
    the engine settings. ``Point(family, **fields)`` takes any part's fields (each unset one
    has the commands' default) and reads them back as its own (``point.p``, ``point.model``);
    what they imply is settled here, once: a given table fixes the family's name and sizes,
    stage costs replace the model and cluster."""

    request: ScheduleRequest
    workload: Workload
    engine: EngineSettings

    def __init__(self, family: str = "", *, request: ScheduleRequest | None = None, workload: Workload | None = None,
                 engine: EngineSettings | None = None, **fields: object) -> None:
        if family:
            fields["family"] = family
        split: dict[str, dict[str, object]] = {"request": {}, "workload": {}, "engine": {}}
        for name, value in fields.items():
            part = _PART_OF.get(name)
            if part is None:
                raise TypeError(f"Point got an unexpected field: {name}")
            split[part][name] = value
        for part, base in (("request", request), ("workload", workload), ("engine", engine)):
            changes = _settled(split[part], base)
            if base is None:
                record = PARTS[part](**changes) if changes else _DEFAULT_PARTS[part]
            else:
                record = dataclasses.replace(base, **changes) if changes else base
            object.__setattr__(self, part, record)
            self.__dict__.update(record.__dict__)  # the parts' fields, read as the point's own

    @classmethod
    def of(cls, family: str, **fields: object) -> Point:
        """A point with ``options`` given as a dict (sorted into the hashable form)."""
        options = fields.pop("options", None) or {}
        if isinstance(options, dict):
            options = tuple(sorted(options.items()))
        return cls(family, options=options, **fields)

    def replace(self, **changes: object) -> Point:
        return Point(request=self.request, workload=self.workload, engine=self.engine, **changes)

    @functools.cached_property
    def settings(self) -> TrainingSettings:
        """The model's training settings at this point (per-stage recompute and frozen
        layers are resolved by its setup, which knows the model); built once per point."""
        return TrainingSettings(micro_batch_size=self.micro_batch_size, seq_len=self.seq_len,
                                tensor_parallel=self.tp, sequence_parallel=self.sequence_parallel,
                                recompute=uniform_mode(self.recompute) or "none", dtype=self.dtype,
                                optimizer_shards=self.dp if self.zero else 1, context_parallel=self.cp,
                                cp_comm_type=self.cp_comm, expert_parallel=self.ep,
                                expert_tensor_parallel=self.etp, moe_dispatcher=self.moe_dispatcher)

    @property
    def trains_differently(self) -> bool:
        """Whether the point freezes layers or offloads activations (the closed forms know neither)."""
        frozen = bool(self.frozen_layers) or bool(self.stage_costs is not None and self.stage_costs.frozen_stages)
        return frozen or bool(self.offload)

    @property
    def plans_with_setup(self) -> bool:
        """Whether ``build_schedule`` with a setup plans the family with the workload's own
        costs: a family that plans with costs (zb-1p, zb-2p) when the point gives none."""
        return (self.schedule is None and get_family(self.family).plans_with_costs
                and "costs" not in dict(self.options))

    @property
    def sim_table_differs(self) -> bool:
        """Whether the sim level's table is not the one of levels 1 and 2: one planned with
        the setup's costs, or an asynchronous family's table of several iterations."""
        return self.schedule is None and (get_family(self.family).asynchronous or self.plans_with_setup)

    def build_schedule(self, setup=None, *, iterations: int | None = None) -> Schedule:
        """The schedule of this point (generated tables are cached: see ``generate``): the
        family's table (or the given one) for the point's frozen stages, with its offloads.

        With the workload's ``setup`` (a SimulationSetup), a family that plans with the stage
        costs (``Family.plans_with_costs``: zb-1p, zb-2p) plans with the setup's own: its
        per-stage F, I, W (one stage per device), the time of a message between neighbouring
        stages as its latency, and what W keeps as M_W; options given on the point win.
        ``iterations`` asks an asynchronous family for its table of that many iterations.
        """
        options: dict[str, object] = {}
        if self.schedule is not None:
            schedule = self.schedule
        else:
            family = get_family(self.family)
            options = self.family_options()
            if setup is not None and self.plans_with_setup:
                options = {**planning_options(setup, self.p, self.m), **options}
            if iterations is not None and family.asynchronous:
                options["iterations"] = iterations
            schedule = generate(self.family, self.p, self.m, v=self.v, **options)
        frozen = self.frozen_stages(schedule)
        if frozen and frozen != schedule.frozen:
            if self.schedule is not None:
                schedule = freeze(schedule, frozen)
            else:
                schedule = generate(self.family, self.p, self.m, v=self.v, frozen=frozen, **options)
        policy = self.offload_policy(schedule.num_stages)
        if policy is not None:
            schedule = offload(schedule, policy)
        return schedule
    def family_options(self) -> dict[str, object]:
        """The family's options at this point: those given, and what a family reads from the
        workload when not given (TeraPipe's attention share: of a block of the model on the
        cluster's first device, ``attention_time_share``)."""
        options = dict(self.options)
        if (self.family == TERAPIPE.name and "attention_share" not in options and self.stage_costs is None
                and self.model is not None):
            setup = self.setup()
            options["attention_share"] = attention_time_share(setup.model, setup.cluster.devices[0], setup.settings)
        return options

    def frozen_stages(self, schedule: Schedule) -> frozenset[int]:
        """The stages of ``schedule`` whose layers are all frozen at this point."""
        if not self.frozen_layers and (self.stage_costs is None or not self.stage_costs.frozen_stages):
            return frozenset()
        return self.setup().costs_for(schedule).frozen_stages

    def offload_policy(self, num_stages: int) -> OffloadPolicy | None:
        """The offload policy for a table of ``num_stages`` stages, or None."""
        if isinstance(self.offload, OffloadPolicy):
            return self.offload
        if not self.offload:
            return None
        return OffloadPolicy.parse(self.offload, num_stages)

    def setup(self):
        """The SimulationSetup of the workload (cached: many points share one)."""
        return _setup(self.model, self.cluster, self.settings, self.partition, self.stage_costs,
                      self.latency, self.bandwidth, self.recompute, self.frozen_layers, self.host_bandwidth,
                      self.host_memory, self.dp)


def _settled(changes: dict[str, object], record: object | None) -> dict[str, object]:
    """The ``changes`` to one part of a point with what they imply: a given table names the
    family and fixes the sizes; stage costs stand for the model and cluster; frozen layers
    listed are a tuple."""
    if not changes:
        return changes
    schedule = changes.get("schedule", getattr(record, "schedule", None))
    if schedule is not None:
        changes |= {"family": schedule.name, "p": schedule.num_devices, "m": schedule.num_microbatches}
    if isinstance(changes.get("frozen_layers"), list):
        changes["frozen_layers"] = tuple(changes["frozen_layers"])
    if changes.get("stage_costs", getattr(record, "stage_costs", None)) is not None:
        changes |= {"model": None, "cluster": None}
    return changes


def planning_options(setup, p: int, m: int) -> dict[str, object]:
    """What a cost-planning generator takes from a workload (see ``Point.build_schedule``):
    ``costs`` of one stage per device, ``latency`` (the longest message time between
    neighbouring stages: link latency + output bytes / bandwidth) and ``m_w`` (what a
    stage-microbatch still holds between its I and its W, over what its F allocated; the
    largest over the stages)."""
    # the placement of one stage per device, in a table the memory-aware partition can read
    table = generate("1f1b", p, m)
    costs = setup.costs_for(table)
    network = setup.network_for(table)
    message = max((float(network.latency[s, s + 1]) + costs.output_bytes[s] / float(network.bandwidth[s, s + 1])
                   for s in range(p - 1)), default=0.0)
    kept = costs.kept_for_w_bytes or (0.0,) * p
    shares = [1.0 + RULES[I].memory.bytes(costs.activation_bytes[s], costs.input_frees, kept[s])
              / costs.activation_bytes[s] for s in range(p) if costs.activation_bytes[s] > 0]
    m_w = min(1.0, max(0.0, max(shares, default=1.0 - costs.input_frees)))
    return {"costs": costs, "latency": message, "m_w": m_w}


@functools.lru_cache(maxsize=256)
def _setup(model: str | ModelSpec | None, cluster: str | Cluster | None, settings: TrainingSettings,
           partition: str, stage_costs: StageCosts | None, latency: float | None, bandwidth: float | None,
           recompute: str = "none", frozen_layers: str | tuple[int, ...] = "", host_bandwidth: float | None = None,
           host_memory: float | None = None, dp: int = 1):
    def frozen(count: int) -> tuple[int, ...]:
        if isinstance(frozen_layers, tuple):
            return frozen_layers
        return parse_frozen_layers(frozen_layers, count)

    if stage_costs is not None:
        links = 0.0 if latency is None else latency
        rate = math.inf if bandwidth is None else bandwidth
        rows = frozen(stage_costs.num_stages)
        if rows:
            outside = [row for row in rows if row >= stage_costs.num_stages]
            require(not outside, "frozen_layers", outside[0] if outside else "",
                    f"the stage costs have rows 0..{stage_costs.num_stages - 1}")
            flags = stage_costs.frozen or (False,) * stage_costs.num_stages
            stage_costs = dataclasses.replace(
                stage_costs, frozen=tuple(flag or row in rows for row, flag in enumerate(flags)))
        description = f"given stage costs, links {links:g} s + bytes / {rate:g} B/s"
        if host_bandwidth is not None:
            description += f", host links {host_bandwidth:g} B/s"
        if stage_costs.frozen_stages:
            description += f", frozen stages {format_indices(stage_costs.frozen_stages)}"
        if dp > 1:
            description += f", data parallel {dp}"
        return SimulationSetup.from_costs(stage_costs, latency=links, bandwidth=rate,
                                          micro_batch_size=settings.micro_batch_size, seq_len=settings.seq_len,
                                          description=description, host_bandwidth=host_bandwidth,
                                          host_memory=host_memory, data_parallel=dp)
    spec = _loaded("model", model, _stamp(model)) if isinstance(model, str) else model
    machines = _loaded("cluster", cluster, _stamp(cluster)) if isinstance(cluster, str) else cluster
    settings = dataclasses.replace(settings, frozen_layers=frozen(spec.num_cost_layers))
    description = describe_model_setup(spec.name, machines.name, settings, measured=bool(spec.measured),
                                       recompute=recompute, data_parallel=dp)
    return SimulationSetup.from_model(spec, machines, settings, partition=partition, latency=latency,
                                      bandwidth=bandwidth, description=description, recompute=recompute,
                                      host_bandwidth=host_bandwidth, host_memory=host_memory, data_parallel=dp)


@functools.lru_cache(maxsize=64)
def _loaded(kind: str, name: str, stamp: tuple[int, int] | None) -> ModelSpec | Cluster:
    """A model or cluster by preset name or file, read once per version of the file."""
    return load_model(name) if kind == "model" else load_cluster(name)


def _stamp(name: str) -> tuple[int, int] | None:
    """(modification time, size) of the file ``name`` names; None for a preset name."""
    try:
        found = os.stat(name)
    except (OSError, ValueError):
        return None
    return found.st_mtime_ns, found.st_size


def point_key(point: Point) -> str:
    """The name of ``point`` in a results store: a digest of its records' fields (the
    schedule asked for, the workload, the engine settings) as canonical JSON, so that two
    points differing in any field have different keys and equal points the same one."""
    # the three records' canonical JSON in one object, its keys in sorted order
    text = (f'{{"engine":{record_json(point.engine)},"request":{record_json(point.request)},'
            f'"workload":{record_json(point.workload)}}}')
    return hashlib.sha256(text.encode()).hexdigest()[:32]  # 128 bits


def family_point(template: Point, family: str, *, p: int, m: int, v: int | None = None,
                 options: Mapping[str, object] | None = None) -> Point:
    """The point that runs ``family`` at ``p`` devices and ``m`` microbatches on
    ``template``'s workload and engine settings: ``v`` where the family takes it
    (``Family.takes_v``), ``options`` (the family's own, see ``family_settings``) sorted
    into the point's hashable form. Every command builds its family points here."""
    taken = get_family(family)
    return template.replace(family=family, p=p, m=m, v=v if taken.takes_v else None,
                            options=tuple(sorted((options or {}).items())))


def points_for(template: Point, schedules: Sequence[str | Schedule] | None = None, *, p: int = DEFAULTS.p,
               m: int = DEFAULTS.m, v: int | None = None) -> list[Point]:
    """The points of ``schedules`` (family names or given tables; None: every family) on
    ``template``: a family at ``p`` and ``m`` with ``v`` where it takes it and those of the
    template's family options it takes (``family_settings``); a given table as it is (see
    ``schedule_point``). What ``simulate`` and ``compare`` run."""
    chosen = list(schedules) if schedules else list(FAMILIES)
    names = [name for name in chosen if isinstance(name, str)]
    for name in names:
        get_family(name)  # unknown names fail here, listing the known ones
    per_family = family_settings(names, dict(template.options))
    if v is not None and names and not any(get_family(name).takes_v for name in names):
        takers = ", ".join(family.name for family in FAMILIES.values() if family.takes_v)
        raise PipeschedError(f"v={v}: none of the compared families takes -v ({takers} do)")
    return [family_point(template, item, p=p, m=m, v=v, options=per_family[item]) if isinstance(item, str)
            else schedule_point(template, item) for item in chosen]


def family_settings(names: Sequence[str], offered: dict[str, object]) -> dict[str, dict[str, object]]:
    """Each family's options from the offered ones: a plain name goes to every family of
    ``names`` that takes it, ``family.name`` to that family alone (and wins over the plain
    one); raises PipeschedError for an option no family takes, a prefix that names no
    family of ``names``, or an option that family does not take.

    >>> family_settings(["hanayo", "chimera"], {"hanayo.waves": 2, "forward_doubling": 0})
    {'hanayo': {'waves': 2}, 'chimera': {'forward_doubling': 0}}
    """
    chosen: dict[str, dict[str, object]] = {name: {} for name in names}
    scoped = {key: value for key, value in offered.items() if "." in key}
    plain = {key: value for key, value in offered.items() if "." not in key}
    # costs are also the slot costs of levels 1 and 2 (``Point.slot_costs``): every family takes them there
    unknown = sorted(key for key in plain
                     if key != "costs" and not any(key in get_family(name).options for name in names))
    if unknown:
        raise PipeschedError(f"option={unknown[0]}: none of the compared families takes it")
    for name in names:
        chosen[name] = {key: value for key, value in plain.items() if key in get_family(name).options}
    for key, value in sorted(scoped.items()):
        name, _, option = key.partition(".")
        if name not in chosen:
            raise PipeschedError(f"option={key}: {name!r} is not among the compared families "
                                 f"({', '.join(names)})")
        family = get_family(name)
        if option not in family.options:
            raise PipeschedError(f"option={key}: {name} does not take {option!r}; it takes "
                                 f"{', '.join(family.options) or 'no options'}")
        chosen[name][option] = value
    for name in names:
        get_family(name).check_options(chosen[name])  # every value in its bounds, as ``show`` checks it
    return chosen


def check_stage_rows(template: Point, schedule: Schedule) -> None:
    """Refuse stage costs that give neither a row per stage of ``schedule`` nor a divisor
    of its stages."""
    costs = template.stage_costs
    if costs is not None and schedule.num_stages % costs.num_stages:
        raise PipeschedError(f"stage_costs={costs.num_stages} stage rows: the schedule has {schedule.num_stages} "
                             f"stages; give {schedule.num_stages} rows (or a divisor of "
                             f"{schedule.num_stages})")


def schedule_point(template: Point, schedule: Schedule, *, family: str | None = None,
                   options: Mapping[str, object] | None = None, v: int | None = None) -> Point:
    """The point that runs ``schedule`` on ``template``'s workload and engine settings.

    ``family``: the family that generated ``schedule``, whose table the point builds again
    (the cost-planning families plan with the workload's costs, frozen layers regenerate the
    family's own table for its frozen stages) at the table's sizes, with ``v`` where the
    family takes it (``Family.takes_v``) and those of ``options`` it takes. None: a given
    table (a schedule file), carried as it is. Stage costs give a row per stage of the
    table, or a divisor of its stages.
    """
    check_stage_rows(template, schedule)
    if family is None:
        return template.replace(schedule=schedule, options=())  # a given table takes no family options
    taken = get_family(family)
    return family_point(template, family, p=schedule.num_devices, m=int(schedule.iteration_microbatches), v=v,
                        options={k: x for k, x in (options or {}).items() if k in taken.options})
