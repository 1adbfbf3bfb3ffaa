"""The option groups of the commands that evaluate a workload (simulate, compare,
synthesize): one group object per concept, declared once from the options of
``pipesched.cli.options`` and built from their parsed values (``options.command``).

Their modules load with these commands, not with the light ones (``validate``, ``list``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipesched.cli.options import (
    ArrivalForm,
    Bandwidth,
    BandwidthEfficiency,
    BlockSize,
    Chunk,
    ClusterName,
    ContextParallel,
    CpComm,
    CpuOverhead,
    DataParallelSize,
    Disaggregate,
    Dtype,
    ExpertParallel,
    ExpertTensorParallel,
    FreezePlan,
    FrozenLayers,
    HostBandwidth,
    HostMemory,
    Jitter,
    JitterFile,
    KvFraction,
    Latency,
    LatencyModelFile,
    MatmulEfficiency,
    MaxBatch,
    MaxTokens,
    MicroBatchSize,
    Model,
    MoeDispatcher,
    NoContention,
    NoOverlap,
    Offload,
    OptionGroup,
    OutputTokens,
    PartitionOption,
    PreemptionChoice,
    PromptTokens,
    Qps,
    RandomStraggler,
    Recompute,
    Replicas,
    Requests,
    RequestTrace,
    Resident,
    ResidentFrom,
    RoutingChoice,
    SameDevices,
    Samples,
    SchedulerChoice,
    Seed,
    SeqLen,
    SequenceParallel,
    ServeCluster,
    ServeModel,
    ServeRunOutputTokens,
    ServeRunPromptTokens,
    ServeRunQps,
    ServeRunRequests,
    ServeStages,
    ServeTensorParallel,
    SloTpot,
    SloTtft,
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
from pipesched.enums import Preemption, Routing, SchedulerName
from pipesched.errors import PipeschedError, require
from pipesched.experiments.serving import (
    ServingPoint,
    ServingWorkload,
    Targets,
    check_workload,
    trace_digest,
)
from pipesched.io.stage_costs import load_stage_costs
from pipesched.limits import (
    MAX_CLUSTER_RANKS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    check_amount,
    check_count,
    parse_int,
)
from pipesched.model import load_device, load_model
from pipesched.model.hardware import Cluster, DeviceSpec
from pipesched.model.spec import ModelSpec, TrainingSettings
from pipesched.serving.config import (
    Disaggregation,
    Instances,
    KVSettings,
    SchedulerSpec,
    ServeConfig,
    stream_source,
    vocabulary_word,
)
from pipesched.variability import (
    load_repeats,
    parse_jitter,
    parse_random_straggler,
    parse_slow_link,
    parse_straggler,
)
from pipesched.variability.model import Variability

if TYPE_CHECKING:  # the training experiments load when a training command builds its point
    from pipesched.experiments.point import Point


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
    context_parallel: ContextParallel = None
    cp_comm: CpComm = None
    expert_parallel: ExpertParallel = None
    expert_tensor_parallel: ExpertTensorParallel = None
    moe_dispatcher: MoeDispatcher = None
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
        return TrainingSettings(micro_batch_size=given_or(self.micro_batch_size, DEFAULTS.micro_batch_size),
                                seq_len=given_or(self.seq_len, DEFAULTS.seq_len), dtype=self.dtype or DEFAULTS.dtype,
                                recompute=recompute or self.recompute or DEFAULTS.recompute,
                                tensor_parallel=given_or(self.tensor_parallel, DEFAULTS.tensor_parallel),
                                sequence_parallel=given_or(self.sequence_parallel, DEFAULTS.sequence_parallel),
                                context_parallel=given_or(self.context_parallel, DEFAULTS.context_parallel),
                                cp_comm_type=self.cp_comm or DEFAULTS.cp_comm_type,
                                expert_parallel=given_or(self.expert_parallel, DEFAULTS.expert_parallel),
                                expert_tensor_parallel=given_or(self.expert_tensor_parallel,
                                                           DEFAULTS.expert_tensor_parallel),
                                moe_dispatcher=self.moe_dispatcher or DEFAULTS.moe_dispatcher)

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
                  "dp": given_or(training.dp, 1), "zero": given_or(training.zero, 0),
                  "micro_batch_size": given_or(model.micro_batch_size, DEFAULTS.micro_batch_size),
                  "seq_len": given_or(model.seq_len, DEFAULTS.seq_len)}
        if self.stage_costs is not None:
            fields["stage_costs"] = load_stage_costs(self.stage_costs)
        else:
            fields |= {"model": model.model or DEFAULTS.model,
                       "cluster": model.cluster(self.cluster or DEFAULTS.cluster),
                       "dtype": model.dtype or DEFAULTS.dtype,
                       "sequence_parallel": given_or(model.sequence_parallel, DEFAULTS.sequence_parallel),
                       "tp": given_or(model.tensor_parallel, DEFAULTS.tensor_parallel),
                       "cp": given_or(model.context_parallel, DEFAULTS.context_parallel),
                       "cp_comm": model.cp_comm or DEFAULTS.cp_comm_type,
                       "ep": given_or(model.expert_parallel, DEFAULTS.expert_parallel),
                       "etp": given_or(model.expert_tensor_parallel, DEFAULTS.expert_tensor_parallel),
                       "moe_dispatcher": model.moe_dispatcher or DEFAULTS.moe_dispatcher,
                       "recompute": model.recompute or DEFAULTS.recompute,
                       "partition": self.partition or DEFAULTS.partition}
        from pipesched.experiments.point import Point

        return Point(bandwidth=parse_bandwidth(self.bandwidth), **fields)

    def _check(self, training: TrainingOptions) -> None:
        """The option values are well formed, and a stage-cost file comes without a model's options."""
        check_training(training.frozen_layers, training.offload)
        if self.partition is not None:
            from pipesched.experiments.setup import check_partition

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
_MODEL_FLAGS = ("model", "cluster", "tensor-parallel", "cp", "cp-comm", "recompute", "partition", "dtype",
                "sequence-parallel", "matmul-efficiency", "bandwidth-efficiency", "ep", "etp", "moe-dispatcher")


def given_or(value: object, default: object) -> object:
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
            samples=given_or(self.samples, DEFAULTS.samples),
            seed=given_or(self.seed, DEFAULTS.seed),
        )




# --- serving (serve simulate, capacity, search) ----------------------------------------------
@dataclass(frozen=True)
class DeploymentOptions(OptionGroup):
    """Where the model is served: the model and cluster, replicas of TP x PP, or prefill and
    decode instances of their own; a fitted latency model instead of the kernel model."""

    model: ServeModel = None
    cluster: ServeCluster = None
    tensor_parallel: ServeTensorParallel = None
    p: ServeStages = None
    replicas: Replicas = None
    disaggregate: Disaggregate = None
    same_devices: SameDevices = False
    latency_model: LatencyModelFile = None
    resident: Resident = None
    resident_from: ResidentFrom = None

    def residency(self) -> dict[str, object]:
        """``ServeConfig``'s residency fields asked for (each unset one from DEFAULTS)."""
        return {"resident": given_or(self.resident, DEFAULTS.resident),
                "stream_from": stream_source(self.resident_from or DEFAULTS.resident_from)}

    def instances(self) -> Instances:
        """The colocated replicas asked for (each unset size from DEFAULTS)."""
        return Instances(given_or(self.tensor_parallel, DEFAULTS.serve_tensor_parallel), given_or(self.p, DEFAULTS.serve_p),
                         given_or(self.replicas, DEFAULTS.replicas))

    def split(self) -> Disaggregation | None:
        """``--disaggregate``'s prefill and decode instances; None when not given."""
        if self.disaggregate is None:
            require(not self.same_devices, "same-devices", "true", "give --disaggregate PREFILL,DECODE with it")
            return None
        refuse_with("disaggregate", {"tensor-parallel": self.tensor_parallel, "p": self.p, "replicas": self.replicas},
                    "which gives each side's TPxPPxN")
        split = parse_disaggregation(self.disaggregate)
        return Disaggregation(split.prefill, split.decode, shared=True) if self.same_devices else split


def parse_disaggregation(text: str) -> Disaggregation:
    """``PREFILL,DECODE``, each ``TPxPP`` or ``TPxPPxN`` -> the two sides' instances.

    >>> parse_disaggregation("2x1x2,4x1").decode
    Instances(tp=4, pp=1, count=1)
    """
    sides = text.split(",")
    form = "give PREFILL,DECODE, each TPxPP or TPxPPxN, like 2x1x2,4x1"
    require(len(sides) == 2, "disaggregate", text, form)
    parsed = []
    for side in sides:
        sizes = side.strip().lower().split("x")
        require(len(sizes) in (2, 3) and all(size.strip().isdigit() for size in sizes), "disaggregate", text, form)
        numbers = [parse_int("disaggregate", size, MAX_CLUSTER_RANKS, minimum=1) for size in sizes]
        parsed.append(Instances(*numbers))
    return Disaggregation(*parsed)


@dataclass(frozen=True)
class BatchOptions(OptionGroup):
    """The batch scheduler of every instance and its caps."""

    scheduler: SchedulerChoice = None
    max_batch: MaxBatch = None
    max_tokens: MaxTokens = None
    chunk: Chunk = None

    def spec(self, preemption: str | None = None) -> SchedulerSpec:
        return SchedulerSpec(vocabulary_word(SchedulerName, "scheduler", self.scheduler or DEFAULTS.scheduler), given_or(self.max_batch, DEFAULTS.max_batch),
                             given_or(self.max_tokens, DEFAULTS.max_tokens), given_or(self.chunk, DEFAULTS.chunk),
                             vocabulary_word(Preemption, "preemption", preemption or DEFAULTS.preemption))


@dataclass(frozen=True)
class CacheOptions(OptionGroup):
    """The paged KV cache, what a full one does, how requests spread over replicas, and the
    per-iteration overhead."""

    block_size: BlockSize = None
    kv_fraction: KvFraction = None
    preemption: PreemptionChoice = None
    routing: RoutingChoice = None
    cpu_overhead: CpuOverhead = None

    def kv(self) -> KVSettings:
        return KVSettings(given_or(self.block_size, DEFAULTS.block_size), given_or(self.kv_fraction, DEFAULTS.kv_fraction))

    def routed(self) -> Routing:
        return vocabulary_word(Routing, "routing", self.routing or DEFAULTS.routing)

    def overhead(self) -> float:
        return given_or(self.cpu_overhead, DEFAULTS.cpu_overhead)


@dataclass(frozen=True)
class RequestOptions(OptionGroup):
    """The requests served: a trace file, or a synthetic trace."""

    trace: RequestTrace = None
    qps: Qps = None
    arrival: ArrivalForm = None
    requests: Requests = None
    prompt_tokens: PromptTokens = None
    output_tokens: OutputTokens = None
    seed: Seed = None

    def workload(self) -> ServingWorkload:
        """The workload asked for, each unset option from DEFAULTS."""
        return serving_workload(self, requests=DEFAULTS.requests, qps=DEFAULTS.qps, prompt=DEFAULTS.prompt_tokens,
                                output=DEFAULTS.output_tokens)


@dataclass(frozen=True)
class RealRequestOptions(OptionGroup):
    """The requests a real run serves: a trace file, or a small synthetic trace (the
    serve_run_ rows: sizes this machine serves in seconds)."""

    trace: RequestTrace = None
    qps: ServeRunQps = None
    arrival: ArrivalForm = None
    requests: ServeRunRequests = None
    prompt_tokens: ServeRunPromptTokens = None
    output_tokens: ServeRunOutputTokens = None
    seed: Seed = None

    def workload(self) -> ServingWorkload:
        return serving_workload(self, requests=DEFAULTS.serve_run_requests, qps=DEFAULTS.serve_run_qps,
                                prompt=DEFAULTS.serve_run_prompt_tokens, output=DEFAULTS.serve_run_output_tokens)


def serving_workload(given: RequestOptions | RealRequestOptions, *, requests: int, qps: float, prompt: str,
                     output: str) -> ServingWorkload:
    """The workload of the request options ``given``, each unset one from the defaults
    passed; a trace file refuses the synthetic options (``--qps`` rescales it)."""
    if given.trace is not None:
        refuse_with("trace", {"arrival": given.arrival, "requests": given.requests,
                              "prompt-tokens": given.prompt_tokens, "output-tokens": given.output_tokens,
                              "seed": given.seed}, "which gives the requests")
        return ServingWorkload(trace=given.trace, trace_digest=trace_digest(given.trace), qps=given.qps)
    synthetic = ServingWorkload(requests=given_or(given.requests, requests), qps=given_or(given.qps, qps),
                                arrival=given.arrival or DEFAULTS.arrival, prompt_tokens=given.prompt_tokens or prompt,
                                output_tokens=given.output_tokens or output, seed=given_or(given.seed, DEFAULTS.seed))
    check_workload(synthetic)
    return synthetic


@dataclass(frozen=True)
class SloOptions(OptionGroup):
    """The latency targets."""

    slo_ttft: SloTtft = None
    slo_tpot: SloTpot = None

    def targets(self, attainment: float | None = None) -> Targets:
        return Targets(given_or(self.slo_ttft, DEFAULTS.slo_ttft), given_or(self.slo_tpot, DEFAULTS.slo_tpot),
                       given_or(attainment, DEFAULTS.attainment))


def serving_point(deployment: DeploymentOptions, batch: BatchOptions, cache: CacheOptions, requests: RequestOptions,
                  slo: SloOptions, *, attainment: float | None = None) -> ServingPoint:
    """The serving point the options ask for, each unset option from DEFAULTS."""
    config = ServeConfig(deployment.instances(), batch.spec(cache.preemption), cache.kv(), cache.routed(),
                         cache.overhead(), deployment.split(), **deployment.residency())
    return ServingPoint(model=deployment.model or DEFAULTS.serve_model,
                        cluster=deployment.cluster or DEFAULTS.serve_cluster, config=config,
                        workload=requests.workload(), targets=slo.targets(attainment),
                        latency_model=deployment.latency_model)
