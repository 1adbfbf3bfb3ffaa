"""The option groups of the commands that evaluate a workload (simulate, compare,
synthesize): one group object per concept, declared once from the options of
``pipesched.cli.options`` and built from their parsed values (``options.command``).

Their modules load with these commands, not with the light ones (``validate``, ``list``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipesched.cli.options import (
    Bandwidth,
    BandwidthEfficiency,
    ClusterName,
    DataParallelSize,
    Dtype,
    FreezePlan,
    FrozenLayers,
    HostBandwidth,
    HostMemory,
    Jitter,
    JitterFile,
    Latency,
    MatmulEfficiency,
    MicroBatchSize,
    Model,
    NoContention,
    NoOverlap,
    Offload,
    OptionGroup,
    PartitionOption,
    RandomStraggler,
    Recompute,
    Samples,
    Seed,
    SeqLen,
    SequenceParallel,
    SlowLink,
    StageCostsFile,
    SteadyStateFlag,
    Straggler,
    TensorParallel,
    ZeroStage,
    check_training,
    parse_amount,
    parse_bandwidth,
    refuse_with,
    tuned_cluster,
    tuned_device,
)
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError
from pipesched.experiments.point import Point
from pipesched.experiments.setup import check_partition
from pipesched.io.stage_costs import load_stage_costs
from pipesched.limits import (
    MAX_MICRO_BATCH_SIZE,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    check_amount,
    check_count,
)
from pipesched.model import load_device, load_model
from pipesched.model.hardware import Cluster, DeviceSpec
from pipesched.model.spec import ModelSpec, TrainingSettings
from pipesched.variability import (
    load_repeats,
    parse_jitter,
    parse_random_straggler,
    parse_slow_link,
    parse_straggler,
)
from pipesched.variability.model import Variability


@dataclass(frozen=True)
class TrainingOptions(OptionGroup):
    """What training does to the table: data parallelism, ZeRO, frozen layers, offload."""

    dp: DataParallelSize = None
    zero: ZeroStage = None
    frozen_layers: FrozenLayers = None
    offload: Offload = None
    freeze_plan: FreezePlan = None


@dataclass(frozen=True)
class EngineOptions(OptionGroup):
    """How the simulation runs: contention, overlap, iterations back to back."""

    no_contention: NoContention = False
    no_overlap: NoOverlap = False
    steady_state: SteadyStateFlag = False


@dataclass(frozen=True)
class ModelOptions(OptionGroup):
    """A model and how it trains: its sizes, tensor parallelism, recompute, dtype, and the
    efficiencies its devices reach."""

    model: Model = None
    micro_batch_size: MicroBatchSize = None
    seq_len: SeqLen = None
    tensor_parallel: TensorParallel = None
    recompute: Recompute = None
    dtype: Dtype = None
    sequence_parallel: SequenceParallel = None
    matmul_efficiency: MatmulEfficiency = None
    bandwidth_efficiency: BandwidthEfficiency = None

    def spec(self) -> ModelSpec:
        """The model asked for (the default's when none is)."""
        return load_model(self.model or DEFAULTS.model)

    def settings(self, *, recompute: str | None = None) -> TrainingSettings:
        """The training settings asked for, each unset one from DEFAULTS; ``recompute``
        replaces the mode asked for (a uniform mode of a per-stage text)."""
        return TrainingSettings(micro_batch_size=_or(self.micro_batch_size, DEFAULTS.micro_batch_size),
                                seq_len=_or(self.seq_len, DEFAULTS.seq_len), dtype=self.dtype or DEFAULTS.dtype,
                                recompute=recompute or self.recompute or DEFAULTS.recompute,
                                tensor_parallel=_or(self.tensor_parallel, DEFAULTS.tensor_parallel),
                                sequence_parallel=_or(self.sequence_parallel, DEFAULTS.sequence_parallel))

    def device(self, name: str | None) -> DeviceSpec:
        """The device preset ``name`` (None: the default) with the efficiencies asked for."""
        return tuned_device(load_device(name or DEFAULTS.device), self.matmul_efficiency, self.bandwidth_efficiency)

    def cluster(self, cluster: str | Cluster) -> str | Cluster:
        """``cluster`` with every device's efficiencies asked for (see ``tuned_cluster``)."""
        return tuned_cluster(cluster, self.matmul_efficiency, self.bandwidth_efficiency)


@dataclass(frozen=True)
class WorkloadOptions(OptionGroup):
    """The analytical workload and machine: a model on a cluster, or a stage-cost file on
    uniform links, and the host links."""

    training_model: ModelOptions = dataclasses.field(default_factory=ModelOptions)
    cluster: ClusterName = None
    partition: PartitionOption = None
    stage_costs: StageCostsFile = None
    latency: Latency = None
    bandwidth: Bandwidth = None
    host_bandwidth: HostBandwidth = None
    host_memory: HostMemory = None

    def point(self, training: TrainingOptions = TrainingOptions(), engine: EngineOptions = EngineOptions()) -> Point:
        """The template point these options ask for: a stage-cost file on uniform links, or
        a model on a cluster (each unset option from DEFAULTS; the efficiencies replace its
        devices'), with the frozen layers, the offload policy and host links asked for."""
        self._check(training)
        model = self.training_model
        fields = {"contention": not engine.no_contention, "overlap": not engine.no_overlap,
                  "steady_state": engine.steady_state, "latency": self.latency,
                  "frozen_layers": training.frozen_layers or "", "offload": training.offload or "",
                  "host_bandwidth": parse_amount(self.host_bandwidth, "bandwidth", "host-bandwidth"),
                  "host_memory": parse_amount(self.host_memory, "bytes", "host-memory"),
                  "dp": _or(training.dp, 1), "zero": _or(training.zero, 0),
                  "micro_batch_size": _or(model.micro_batch_size, DEFAULTS.micro_batch_size),
                  "seq_len": _or(model.seq_len, DEFAULTS.seq_len)}
        if self.stage_costs is not None:
            fields["stage_costs"] = load_stage_costs(self.stage_costs)
        else:
            fields |= {"model": model.model or DEFAULTS.model,
                       "cluster": model.cluster(self.cluster or DEFAULTS.cluster),
                       "dtype": model.dtype or DEFAULTS.dtype,
                       "sequence_parallel": _or(model.sequence_parallel, DEFAULTS.sequence_parallel),
                       "tp": _or(model.tensor_parallel, DEFAULTS.tensor_parallel),
                       "recompute": model.recompute or DEFAULTS.recompute,
                       "partition": self.partition or DEFAULTS.partition}
        return Point(bandwidth=parse_bandwidth(self.bandwidth), **fields)

    def _check(self, training: TrainingOptions) -> None:
        """The option values are well formed, and a stage-cost file comes without a model's options."""
        check_training(training.frozen_layers, training.offload)
        if self.partition is not None:
            check_partition(self.partition)
        if self.latency is not None:
            check_amount("latency", self.latency, limit=MAX_SECONDS, unit="seconds")
        if self.training_model.micro_batch_size is not None:
            check_count("micro_batch_size", self.training_model.micro_batch_size, MAX_MICRO_BATCH_SIZE)
        if self.training_model.seq_len is not None:
            check_count("seq_len", self.training_model.seq_len, MAX_SEQ_LEN)
        if self.stage_costs is not None:
            refuse_with("stage-costs", {flag: value for flag, value in self.given().items() if flag in _MODEL_FLAGS},
                        "which gives the costs instead of a model and cluster")


# the options that describe a model's costs, which a stage-cost file gives instead
_MODEL_FLAGS = ("model", "cluster", "tensor-parallel", "recompute", "partition", "dtype", "sequence-parallel",
                "matmul-efficiency", "bandwidth-efficiency")


def _or(value: object, default: object) -> object:
    """``value``, or ``default`` when it is not given (None)."""
    return default if value is None else value


@dataclass(frozen=True)
class VariabilityOptions(OptionGroup):
    """Monte Carlo over durations: jitter, measured repeats, stragglers, slow links."""

    jitter: Jitter = None
    jitter_file: JitterFile = None
    straggler: Straggler = None
    random_straggler: RandomStraggler = None
    slow_link: SlowLink = None
    samples: Samples = None
    seed: Seed = None

    def model(self) -> Variability | None:
        """The duration model the options ask for; None when none is given."""
        given = (self.jitter is not None or self.jitter_file is not None or self.straggler
                 or self.random_straggler is not None or self.slow_link)
        if not given:
            for flag, value in (("samples", self.samples), ("seed", self.seed)):
                if value is not None:
                    raise PipeschedError(f"{flag}={value}: draws samples only with --jitter, --jitter-file, "
                                         "--straggler, --random-straggler or --slow-link")
            return None
        return Variability(
            jitter=parse_jitter(self.jitter) if self.jitter is not None else (),
            measured=load_repeats(self.jitter_file) if self.jitter_file is not None else None,
            stragglers=tuple(parse_straggler(text) for text in self.straggler or ()),
            random_straggler=(parse_random_straggler(self.random_straggler)
                              if self.random_straggler is not None else None),
            slow_links=tuple(parse_slow_link(text) for text in self.slow_link or ()),
            samples=_or(self.samples, DEFAULTS.samples),
            seed=_or(self.seed, DEFAULTS.seed),
        )


