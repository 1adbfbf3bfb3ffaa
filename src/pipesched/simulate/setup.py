"""What a schedule is simulated on: stage costs and a network for its placement.

Two sources:

- a model on a cluster (``SimulationSetup.from_model``): the model package partitions the
  model into the schedule's stages and costs them on the cluster's devices
  (``pipesched.model.build_stage_costs``, method "balanced"); pipeline device d runs on
  cluster rank d x t (t = tensor-parallel degree, ``pipesched.model.pipeline_ranks``), so
  the rest of each tensor-parallel group sits beside it on the same node;
- measured stage costs and a network (``SimulationSetup.from_costs``). A schedule with k
  times more stages than the costs (v chunks per device) splits each cost row into k equal
  chunks: times, activation, parameter and gradient bytes divided by k, output bytes
  unchanged (a chunk boundary carries the same hidden state as a stage boundary).

The default scenario, used by ``pipesched compare`` without arguments: Llama-3-70B on 4
nodes of 8 H100 (NVLink inside a node, 400 Gb/s InfiniBand per GPU across nodes), pipeline
of p = 8 with tensor parallelism 4 (sequence parallel, selective recompute), so each node
holds 2 pipeline stages and every other stage boundary crosses nodes; m = 32 microbatches
of one 4096-token sequence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.model.hardware import Cluster
from pipesched.model.spec import ModelSpec, TrainingSettings
from pipesched.schedule import Schedule
from pipesched.simulate.network import Network


def _default_settings() -> TrainingSettings:
    return TrainingSettings(micro_batch_size=1, seq_len=4096, tensor_parallel=4,
                            sequence_parallel=True, recompute="selective")


@dataclass(frozen=True)
class Scenario:
    """A model on a cluster at a pipeline size: a complete simulation question."""

    model: str = "llama3-70b"  # model preset or file
    cluster: str = "4x8-h100"  # cluster preset or file
    p: int = 8  # pipeline devices
    m: int = 32  # microbatches per iteration
    settings: TrainingSettings = field(default_factory=_default_settings)

    def describe(self, *, measured: bool = False) -> str:
        """One line (``measured``: the model's layer costs were measured)."""
        return describe_model_setup(self.model, self.cluster, self.settings, measured=measured,
                                    pipeline=f"p={self.p}, m={self.m}")


def describe_model_setup(model: str, cluster: str, settings: TrainingSettings, *, measured: bool,
                         pipeline: str = "") -> str:
    """"MODEL on CLUSTER[, PIPELINE], micro-batch ...": the settings are left out for a model
    with measured layer costs, whose micro-batch, sequence length and recompute are the
    measurement's."""
    line = f"{model}{' (measured layers)' if measured else ''} on {cluster}" + (f", {pipeline}" if pipeline else "")
    if measured:
        return line
    return (f"{line}, micro-batch {settings.micro_batch_size} x {settings.seq_len} tokens, "
            f"tensor parallel {settings.tensor_parallel}, recompute {settings.recompute}")


def split_stage_costs(costs: StageCosts, num_stages: int) -> StageCosts:
    """``costs`` for a schedule with ``num_stages`` stages (a multiple of the cost rows).

    >>> split = split_stage_costs(StageCosts.uniform(2, forward=2.0), 4)
    >>> split.forward, split.num_stages
    ((1.0, 1.0, 1.0, 1.0), 4)
    """
    if costs.num_stages == num_stages:
        return costs
    if num_stages % costs.num_stages:
        raise PipeschedError(
            f"stage_costs={costs.num_stages} stages: the schedule has {num_stages} stages; give "
            f"{num_stages} cost rows, or a number of rows that divides {num_stages}"
        )
    k = num_stages // costs.num_stages

    def chunks(values: tuple[float, ...] | None, *, divide: bool = True) -> tuple[float, ...] | None:
        if values is None:
            return None
        return tuple(values[s // k] / (k if divide else 1) for s in range(num_stages))

    return StageCosts(
        forward=chunks(costs.forward),
        backward_input=chunks(costs.backward_input),
        backward_weight=chunks(costs.backward_weight),
        activation_bytes=chunks(costs.activation_bytes),
        output_bytes=chunks(costs.output_bytes, divide=False),
        backward=chunks(costs.backward),
        static_bytes=chunks(costs.static_bytes),
        grad_bytes=chunks(costs.grad_bytes),
        input_frees=costs.input_frees,
        kept_for_w_bytes=chunks(costs.kept_for_w_bytes),
    )


@dataclass(frozen=True, eq=False)
class SimulationSetup:
    """Stage costs and a network for any schedule (see the module docstring)."""

    description: str
    costs: StageCosts | None = None
    network: Network | None = None  # a fixed network; else uniform links of the two below
    latency: float = 0.0  # seconds, uniform links for given costs
    bandwidth: float = math.inf  # bytes/s, uniform links for given costs
    model: ModelSpec | None = None
    cluster: Cluster | None = None
    settings: TrainingSettings | None = None
    micro_batch_size: int = 1
    seq_len: int | None = None

    @classmethod
    def from_costs(cls, costs: StageCosts, *, latency: float = 0.0, bandwidth: float = math.inf,
                   network: Network | None = None, micro_batch_size: int = 1, seq_len: int | None = None,
                   description: str | None = None) -> SimulationSetup:
        """Measured costs on ``network``, or on uniform links of ``latency`` seconds and
        ``bandwidth`` bytes/s between every pair of devices (default: free links)."""
        require(math.isfinite(latency) and latency >= 0, "latency", latency, "must be a finite number >= 0 seconds")
        require(bandwidth > 0, "bandwidth", bandwidth, "must be > 0 bytes/s (use inf for free links)")
        if description is None:
            description = (f"given stage costs on {network.name}" if network is not None else
                           f"given stage costs, links {latency:g} s + bytes / {bandwidth:g} B/s")
        return cls(description=description, costs=costs, network=network, latency=latency, bandwidth=bandwidth,
                   micro_batch_size=micro_batch_size, seq_len=seq_len)

    @classmethod
    def from_model(cls, model: ModelSpec, cluster: Cluster, settings: TrainingSettings) -> SimulationSetup:
        """``model`` (a ModelSpec) on ``cluster`` with TrainingSettings ``settings``."""
        return cls(
            description=f"{model.name} on {cluster.name}",
            model=model,
            cluster=cluster,
            settings=settings,
            micro_batch_size=settings.micro_batch_size,
            seq_len=settings.seq_len,
        )

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> SimulationSetup:
        from pipesched.model import load_cluster, load_model

        model = load_model(scenario.model)
        setup = cls.from_model(model, load_cluster(scenario.cluster), scenario.settings)
        return dataclasses.replace(setup, description=scenario.describe(measured=bool(model.measured)))

    def costs_for(self, schedule: Schedule) -> StageCosts:
        if self.costs is not None:
            return split_stage_costs(self.costs, schedule.num_stages)
        from pipesched.model import build_stage_costs

        return build_stage_costs(self.model, schedule.placement, self.cluster, self.settings)

    def network_for(self, schedule: Schedule) -> Network:
        if self.cluster is not None:
            from pipesched.model import pipeline_ranks

            ranks = pipeline_ranks(schedule.placement, self.cluster, self.settings.tensor_parallel)
            return Network.from_cluster(self.cluster, ranks=ranks)
        if self.network is not None:
            return self.network
        return Network.uniform(schedule.num_devices, latency=self.latency, bandwidth=self.bandwidth)

    def flops_per_iteration(self, num_microbatches: int) -> float | None:
        """Model FLOPs of one iteration (for MFU), when a model is known."""
        if self.model is None:
            return None
        from pipesched.model import model_flops_per_iteration

        return model_flops_per_iteration(self.model, self.settings, num_microbatches)

    def peak_flops_per_device(self, network: Network) -> tuple[float, ...] | None:
        """Peak FLOP/s behind each pipeline device: its tensor-parallel group's."""
        if network.peak_flops is None:
            return None
        group = self.settings.tensor_parallel if self.settings is not None else 1
        return tuple(peak * group for peak in network.peak_flops)


DEFAULT_SCENARIO = Scenario()
