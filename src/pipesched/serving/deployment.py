"""A serving configuration placed on a cluster: its instances, each a pipeline of stages
with their iteration costs, devices and KV-cache capacity (``Deployment``), what the engine
runs a trace on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.model.hardware import LinkSpec
from pipesched.model.inference import StageIterationCosts
from pipesched.serving.config import ServeConfig


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

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to send ``nbytes`` of KV cache from instance ``src`` to ``dst``."""
        return float(self.link_latency[src, dst] + nbytes / self.link_bandwidth[src, dst])
