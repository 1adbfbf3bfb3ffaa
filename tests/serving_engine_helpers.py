"""Deployments built by hand for the serving engine's tests: every stage a fitted latency
line (``LatencyRow``'s form), so a test can compute an iteration's time from the formula."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.model.hardware import LinkSpec
from pipesched.model.inference import StageIterationCosts
from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.deployment import Deployment, InstancePlan
from pipesched.serving.trace import Trace


@dataclass(frozen=True)
class Line:
    """One stage's iteration time: base + token x T + attention x A + decode x D + kv x K."""

    base: float = 0.004
    token: float = 2e-5
    attention: float = 1e-9
    decode: float = 1e-5
    kv: float = 1e-7
    send: float = 0.0  # seconds per token of the hidden state sent to the next stage

    def time(self, tokens: int, attention: float, decodes: int, kv_tokens: int) -> float:
        return (self.base + self.token * tokens + self.attention * attention + self.decode * decodes
                + self.kv * kv_tokens)


def stage_costs(line: Line, stage: int, stages: int, max_tokens: int, max_batch: int) -> StageIterationCosts:
    counts = np.arange(max_tokens + 1, dtype=np.float64)
    last = stage == stages - 1
    return StageIterationCosts(
        stage=stage, layers=(stage, stage + 1), base_s=line.base, token_s=line.token * counts,
        prefill_attention_s=line.attention, decode_request_s=line.decode, kv_token_s=line.kv,
        sample_s=np.zeros(max_batch + 1), send_s=np.zeros(max_tokens + 1) if last else line.send * counts,
        weight_bytes=1e9, kv_bytes_per_token=1e5, workspace_bytes=1e8, flops_per_token=1e9,
        flops_per_attention=1e3)


HOST_LINK = LinkSpec(2.5e10, 1e-5)  # PCIe-like: bytes/s, seconds
DEVICE_LINK = LinkSpec(1e11, 2e-6)  # between instances


def deployment(config: ServeConfig | None = None, *, line: Line = Line(), capacity_blocks: int = 100_000,
               max_context: int = 1 << 20, host: LinkSpec = HOST_LINK, link: LinkSpec = DEVICE_LINK) -> Deployment:
    """The config's instances on consecutive ranks, each stage ``line``."""
    config = config or ServeConfig()
    groups: list[tuple[str, Instances]] = (
        [("prefill", config.disaggregate.prefill), ("decode", config.disaggregate.decode)]
        if config.disaggregate else [("replica", config.instances)])
    spec = config.scheduler
    plans, rank = [], 0
    for kind, group in groups:
        for _ in range(group.count):
            stages = tuple(stage_costs(line, s, group.pp, spec.token_budget, spec.max_batch) for s in range(group.pp))
            devices = tuple(rank + s * group.tp for s in range(group.pp))
            rank += group.pp * group.tp
            plans.append(InstancePlan(kind, stages, devices, group.tp, capacity_blocks, 1e5 * group.pp))
    n = len(plans)
    return Deployment(config, tuple(plans), max_context, 1e15, host, np.full((n, n), link.latency),
                      np.full((n, n), link.bandwidth))


def poisson_trace(n: int, qps: float, *, prompt: tuple[int, int] = (64, 512), output: tuple[int, int] = (8, 64),
                  seed: int = 0) -> Trace:
    """n requests, Poisson arrivals at ``qps``, uniform prompt and output lengths."""
    rng = np.random.default_rng(seed)
    return Trace(np.cumsum(rng.exponential(1.0 / qps, n)), rng.integers(prompt[0], prompt[1] + 1, n),
                 rng.integers(output[0], output[1] + 1, n))
