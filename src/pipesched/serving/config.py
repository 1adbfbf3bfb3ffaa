"""What a serving run deploys and how it schedules: the one record of a serving configuration.

A deployment is ``replicas`` copies of the model, each a pipeline of ``pp`` stages of ``tp``
devices; replica r's stage s runs on the cluster ranks ``(r x pp + s) x tp`` to ``+ tp - 1``.
With ``disaggregate`` the prefill and decode phases run on their own instances (DistServe,
Splitwise): ``Instances`` of their own TP x PP, the prefill instances first on the cluster's
ranks, the decode instances after them, the KV cache of each prompt sent from one to the
other over the cluster's links. With ``Disaggregation.shared`` (phase-dependent
parallelism) the decode instances sit on the prefill instances' devices instead, decode
instance k on prefill instance k's, each layout with its own TP x PP (pipeline parallelism
for prefill, tensor parallelism for decode, say): the two take the devices in turns, both
layouts' weights stay on them, and each prompt's KV cache is re-sharded from the prefill
layout to the decode layout by an all-to-all over the devices' links.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesched.defaults import DEFAULTS
from pipesched.enums import Preemption, Routing, SchedulerName, Tier
from pipesched.errors import require
from pipesched.limits import (
    MAX_BATCH_REQUESTS,
    MAX_BATCH_TOKENS,
    MAX_CLUSTER_RANKS,
    MAX_KV_BLOCK,
    MAX_SECONDS,
    MAX_STAGES,
    MAX_TENSOR_PARALLEL,
    check_count,
)
from pipesched.model.inference import check_resident


def vocabulary_word(kind: type, field: str, text: object) -> object:
    """The member of the closed vocabulary ``kind`` (``SchedulerName``, ``Preemption``,
    ``Routing``) that ``text`` names; else one error line naming the choices."""
    require(text in tuple(kind), field, text, f"choose {' or '.join(kind)}")
    return kind(text)


# the words of ``--resident-from``: the tier the layers not resident on the GPU live in
STREAM_SOURCES = {"host": Tier.HOST, "disk": Tier.DISK}


def stream_source(text: str) -> Tier:
    """The tier ``--resident-from``'s word names; else one error line naming the choices."""
    require(text in STREAM_SOURCES, "resident-from", text, f"choose {' or '.join(STREAM_SOURCES)}")
    return STREAM_SOURCES[text]


@dataclass(frozen=True)
class SchedulerSpec:
    """A replica's scheduler and its caps."""

    name: SchedulerName = SchedulerName.SARATHI  # DEFAULTS.scheduler
    max_batch: int = DEFAULTS.max_batch  # sequences per iteration
    max_tokens: int = DEFAULTS.max_tokens  # tokens per iteration (static, orca, vllm)
    chunk: int = DEFAULTS.chunk  # token budget per iteration (sarathi)
    preemption: Preemption = Preemption.RECOMPUTE  # DEFAULTS.preemption

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", SchedulerName(self.name))
        object.__setattr__(self, "preemption", Preemption(self.preemption))
        check_count("max_batch", self.max_batch, MAX_BATCH_REQUESTS, what="requests per iteration")
        check_count("max_tokens", self.max_tokens, MAX_BATCH_TOKENS, what="tokens per iteration")
        check_count("chunk", self.chunk, MAX_BATCH_TOKENS, what="tokens per iteration")

    @property
    def token_budget(self) -> int:
        """Tokens one iteration may batch under this scheduler."""
        return self.chunk if self.name == SchedulerName.SARATHI else self.max_tokens


@dataclass(frozen=True)
class KVSettings:
    """The paged KV cache of every stage (vLLM's block manager)."""

    block_size: int = DEFAULTS.block_size  # tokens per block
    kv_fraction: float = DEFAULTS.kv_fraction  # share of device memory for weights + workspace + KV cache

    def __post_init__(self) -> None:
        check_count("block_size", self.block_size, MAX_KV_BLOCK, what="tokens per block")
        require(0.0 < self.kv_fraction <= 1.0, "kv_fraction", self.kv_fraction, "give a share in (0, 1]")


@dataclass(frozen=True)
class Instances:
    """A group of identical model instances: ``count`` pipelines of ``pp`` stages of ``tp``."""

    tp: int = DEFAULTS.serve_tensor_parallel
    pp: int = DEFAULTS.serve_p
    count: int = DEFAULTS.replicas

    def __post_init__(self) -> None:
        check_count("tensor_parallel", self.tp, MAX_TENSOR_PARALLEL, what="tensor-parallel ranks")
        check_count("p", self.pp, MAX_STAGES, what="pipeline stages")
        check_count("replicas", self.count, MAX_CLUSTER_RANKS, what="replicas")

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.count


@dataclass(frozen=True)
class Disaggregation:
    """Prefill and decode on separate instances (``shared``: on the same devices in turns)."""

    prefill: Instances
    decode: Instances
    shared: bool = False  # decode instance k on prefill instance k's devices (the module docstring)

    def __post_init__(self) -> None:
        if not self.shared:
            return
        prefill, decode = self.prefill, self.decode
        require(prefill.count == decode.count and prefill.tp * prefill.pp == decode.tp * decode.pp, "disaggregate",
                f"{instances_text(prefill)},{instances_text(decode)}",
                "on the same devices give as many prefill as decode instances, of as many devices each, like 1x4,4x1")

    @property
    def devices(self) -> int:
        """Cluster ranks the two sides take."""
        return self.prefill.devices if self.shared else self.prefill.devices + self.decode.devices


@dataclass(frozen=True)
class ServeConfig:
    """One serving configuration: the deployment, its scheduler, cache, routing and overhead.

    The model, the cluster and the costs are given beside it (``pipesched.serving.deployment``
    builds them into stage iteration costs); ``instances`` is the colocated deployment, unused
    when ``disaggregate`` is set.
    """

    instances: Instances = field(default_factory=Instances)
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    kv: KVSettings = field(default_factory=KVSettings)
    routing: Routing = Routing.ROUND_ROBIN  # DEFAULTS.routing
    cpu_overhead_s: float = DEFAULTS.cpu_overhead  # per iteration, on the first stage
    disaggregate: Disaggregation | None = None
    # share of each stage's transformer blocks kept in device memory; the rest stream in from
    # ``stream_from`` every iteration (``model.inference.with_residency``)
    resident: float = DEFAULTS.resident
    stream_from: Tier = Tier.HOST  # DEFAULTS.resident_from: host memory or disk

    def __post_init__(self) -> None:
        object.__setattr__(self, "routing", Routing(self.routing))
        check_resident(self.resident)
        require(self.stream_from in (Tier.HOST, Tier.DISK), "resident_from", self.stream_from,
                "choose host or disk")
        require(0.0 <= self.cpu_overhead_s <= MAX_SECONDS, "cpu_overhead", self.cpu_overhead_s,
                f"give seconds from 0 to {MAX_SECONDS:g}")

    @property
    def devices(self) -> int:
        """Cluster ranks the deployment takes."""
        if self.disaggregate is not None:
            return self.disaggregate.devices
        return self.instances.devices


def instances_text(instances: Instances) -> str:
    """``TPxPPxN``, as ``--disaggregate`` takes each side."""
    return f"{instances.tp}x{instances.pp}x{instances.count}"


def layout_label(config: ServeConfig) -> str:
    """``tp4 pp2 x1`` (colocated), or ``prefill 2x1x2 + decode 4x1x1`` (disaggregated)."""
    if config.disaggregate is None:
        return f"tp{config.instances.tp} pp{config.instances.pp} x{config.instances.count}"
    split = config.disaggregate
    shared = " on the same devices" if split.shared else ""
    return f"prefill {instances_text(split.prefill)} + decode {instances_text(split.decode)}{shared}"
