"""The mutable state of a serving run, shared by the schedulers and the engine: per-request
columns (``Requests``) and each instance's queues, pipeline and cache (``InstanceState``).

A request's life on an instance: ``waiting`` (arrived, or preempted by recompute, in
arrival order), its prefill in progress (``partial`` between chunks), then decoding:
``available`` while no batch in flight holds it (in cohorts: the requests a finished batch
gave back, in batch order), or ``swapped`` to host memory. On a decode instance of a
disaggregated deployment, requests whose KV cache has arrived wait in ``incoming``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pipesched.serving.deployment import InstancePlan
from pipesched.serving.kv_cache import PagedKVCache
from pipesched.serving.trace import Trace


class Requests:
    """Per-request columns, in trace order (row = request)."""

    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.prompt = trace.prefill_tokens  # prompt tokens
        self.out = trace.decode_tokens  # output tokens to make, the prefill's first one included
        self.target = self.prompt.copy()  # tokens its (next) prefill must cache: prompt, + made after a recompute
        self.cached = np.zeros(n, np.int64)  # tokens in its KV cache
        self.made = np.zeros(n, np.int64)  # output tokens made
        self.held = np.zeros(n, np.int64)  # KV blocks it holds (on its current instance)
        self.preemptions = np.zeros(n, np.int32)
        self.scheduled_at = np.full(n, np.nan)
        self.first_token_at = np.full(n, np.nan)
        self.finished_at = np.full(n, np.nan)
        self.instance = np.full(n, -1, np.int32)  # where it runs now (its decode instance once sent there)
        self.token_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(self.out, out=self.token_offsets[1:])
        self.token_times = np.full(int(self.token_offsets[-1]), np.nan)  # seconds


class InstanceState:
    """One instance (a replica, or a prefill or decode instance) during the run."""

    def __init__(self, index: int, plan: InstancePlan, cache: PagedKVCache) -> None:
        self.index = index
        self.plan = plan
        self.kind = plan.kind
        self.p = len(plan.stages)  # pipeline stages = batches it may have in flight
        self.cache = cache
        self.stage_free = [0.0] * self.p  # seconds: when each stage ends its last batch
        self.in_flight = 0  # batches between stage 0 and the end of the last stage
        self.running = 0  # admitted requests not finished (in flight or not), swapped ones excluded
        self.unfinished = 0  # requests routed here and not finished (least-loaded routing)
        self.host_free = 0.0  # seconds: when its host link ends its last swap
        self.waiting: deque[int] = deque()
        self.partial: list[int] = []
        self.available: list[np.ndarray] = []
        self.swapped: deque[int] = deque()
        self.incoming: deque[int] = deque()
        self.preempted_at: list[float] = []  # seconds: when it preempted a request (ServeRun.kv.preempted_at)

    def has_work(self) -> bool:
        """Whether a request here waits for a batch (not counting those in flight)."""
        return bool(self.waiting or self.partial or self.available or self.swapped or self.incoming)
