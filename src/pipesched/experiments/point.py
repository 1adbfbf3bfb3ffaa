"""An experiment point: one schedule on one workload and machine, frozen and hashable, so that
a grid of points can be evaluated by any map (a list comprehension, a process pool, Ray)
and its results stored and looked up by point.

Levels read different parts of it: the closed form (level 1) and the slot table (level 2)
need the family, sizes, options and slot costs; the simulation (level 3) also needs the
workload: a model on a cluster (with data, tensor parallel and micro-batch sizes,
recompute, the partition of layers into stages, link overrides), or measured stage costs
on uniform links.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.experiments.defaults import DEFAULTS
from pipesched.model.hardware import Cluster
from pipesched.model.spec import RECOMPUTE_MODES, ModelSpec, TrainingSettings
from pipesched.schedule import Schedule


@dataclass(frozen=True)
class Point:
    """One experiment (see the module docstring). Every field has the commands' default."""

    family: str = ""  # schedule family, or the name of a given ``schedule`` ("" in a template point)
    p: int = DEFAULTS.p  # pipeline devices
    m: int = DEFAULTS.m  # microbatches per iteration
    v: int | None = None  # chunks per device, for families that take it (None: the family's default)
    options: tuple[tuple[str, object], ...] = ()  # family options, e.g. (("memory_limit", 6),)
    schedule: Schedule | None = None  # a given table (a schedule file) instead of a family
    slot_costs: StageCosts | None = None  # F, I, W of levels 1 and 2 (None: 1, 1, 1 slot)
    # level 3: a model on a cluster ...
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
    # the engine
    contention: bool = True
    overlap: bool = True
    # an overlapped pair's time over F + B (fused ops; None: the costs' own, F + B or their fb column)
    fb_cost: float | None = None
    # iterations back to back, each stage stepping its optimizer on its own (zero bubble's
    # post-validation): the table and sim levels report the steady-state iteration
    steady_state: bool = False

    def __post_init__(self) -> None:
        if self.schedule is not None:
            object.__setattr__(self, "family", self.schedule.name)
            object.__setattr__(self, "p", self.schedule.num_devices)
            object.__setattr__(self, "m", self.schedule.num_microbatches)
        for name in ("p", "m", "dp", "tp", "micro_batch_size", "seq_len"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value,
                    "must be a whole number >= 1")
        require(self.recompute in RECOMPUTE_MODES, "recompute", self.recompute,
                f"choose one of {', '.join(RECOMPUTE_MODES)}")
        if self.stage_costs is not None:
            object.__setattr__(self, "model", None)
            object.__setattr__(self, "cluster", None)
        elif self.model is None or self.cluster is None:
            raise PipeschedError("model=None: give a model and a cluster, or stage costs")

    @classmethod
    def of(cls, family: str, **fields: object) -> Point:
        """A point with ``options`` given as a dict (sorted into the hashable form)."""
        options = fields.pop("options", None) or {}
        if isinstance(options, dict):
            options = tuple(sorted(options.items()))
        return cls(family, options=options, **fields)

    def replace(self, **changes: object) -> Point:
        return dataclasses.replace(self, **changes)

    @property
    def settings(self) -> TrainingSettings:
        """The model's training settings at this point."""
        return TrainingSettings(micro_batch_size=self.micro_batch_size, seq_len=self.seq_len,
                                tensor_parallel=self.tp, sequence_parallel=self.sequence_parallel,
                                recompute=self.recompute, dtype=self.dtype)

    def build_schedule(self, setup=None, *, iterations: int | None = None) -> Schedule:
        """The schedule of this point (generated tables are cached: see ``generate``).

        With the workload's ``setup`` (a SimulationSetup), a family that plans with the stage
        costs (``Family.plans_with_costs``: zb-1p, zb-2p) plans with the setup's own: its
        per-stage F, I, W (one stage per device), the time of a message between neighbouring
        stages as its latency, and what W keeps as M_W; options given on the point win.
        ``iterations`` asks an asynchronous family for its table of that many iterations.
        """
        if self.schedule is not None:
            return self.schedule
        from pipesched.generators import generate, get_family

        family = get_family(self.family)
        options = dict(self.options)
        if setup is not None and family.plans_with_costs and "costs" not in options:
            options = {**planning_options(setup, self.p, self.m), **options}
        if iterations is not None and family.asynchronous:
            options["iterations"] = iterations
        return generate(self.family, self.p, self.m, v=self.v, **options)

    def setup(self):
        """The SimulationSetup of the workload (cached: many points share one)."""
        return _setup(self.model, self.cluster, self.settings, self.partition, self.stage_costs,
                      self.latency, self.bandwidth)


def planning_options(setup, p: int, m: int) -> dict[str, object]:
    """What a cost-planning generator takes from a workload (see ``Point.build_schedule``):
    ``costs`` of one stage per device, ``latency`` (the longest message time between
    neighbouring stages: link latency + output bytes / bandwidth) and ``m_w`` (what a
    stage-microbatch still holds between its I and its W, over what its F allocated; the
    largest over the stages)."""
    from pipesched.generators import generate
    from pipesched.ops import I
    from pipesched.rules import RULES

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
           partition: str, stage_costs: StageCosts | None, latency: float | None, bandwidth: float | None):
    from pipesched.experiments.setup import SimulationSetup, describe_model_setup

    if stage_costs is not None:
        links = 0.0 if latency is None else latency
        rate = math.inf if bandwidth is None else bandwidth
        return SimulationSetup.from_costs(stage_costs, latency=links, bandwidth=rate,
                                          micro_batch_size=settings.micro_batch_size, seq_len=settings.seq_len,
                                          description=f"given stage costs, links {links:g} s + bytes / {rate:g} B/s")
    from pipesched.model import load_cluster, load_model

    spec = load_model(model) if isinstance(model, str) else model
    machines = load_cluster(cluster) if isinstance(cluster, str) else cluster
    description = describe_model_setup(spec.name, machines.name, settings, measured=bool(spec.measured))
    return SimulationSetup.from_model(spec, machines, settings, partition=partition, latency=latency,
                                      bandwidth=bandwidth, description=description)
