"""Profiling a serving rank before its run: its stage's iteration time at fixed batch
compositions (``serve_batches.profile_batches``), and the time of a hidden-state message to
the next rank. Every rank times at once (the cores are shared as in the run), outside the
run, so nothing measured while serving goes into the prediction."""

from __future__ import annotations

import statistics
import time

from pipesched.runtime.serve_batches import profile_batches
from pipesched.runtime.serve_model import ServeStage
from pipesched.runtime.serve_run import RankServeResult, ServeTask
from pipesched.runtime.torch_import import require_torch

torch = require_torch()
dist = torch.distributed

LINK_TOKENS = (1, 16, 64, 256)  # hidden states of this many tokens timed between neighbours


def _inputs(stage: ServeStage, tokens: int, vocab: int, generator):
    if stage.first:
        return torch.randint(vocab, (tokens,), generator=generator).to(stage.device)
    hidden = torch.randn((tokens, stage.hidden_size), generator=generator)
    return hidden.to(device=stage.device, dtype=stage.dtype)


def profile_stage(stage: ServeStage, task: ServeTask, result: RankServeResult, *, repeats: int, record: bool) -> None:
    """Time ``repeats`` iterations of every profile batch; with ``record``, keep each
    repeat's seconds in ``result.profile`` as (batch index, seconds)."""
    generator = torch.Generator().manual_seed(task.options.seed + 1)
    for index, entries in enumerate(profile_batches(task.trace, task.options.scheduler, task.slots)):
        table = torch.tensor([[e.slot, e.context, e.tokens, int(e.emits)] for e in entries], dtype=torch.int64)
        count = sum(e.tokens for e in entries)
        inputs = _inputs(stage, count, task.model.vocab_size, generator)
        positions = torch.cat([torch.arange(e.context, e.context + e.tokens) for e in entries]).to(stage.device)
        table = table.to(stage.device)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            stage.forward(inputs, table, positions)
            if stage.device.type == "cuda":
                torch.cuda.synchronize(stage.device)
            seconds.append((time.perf_counter_ns() - start) * 1e-9)
        if record:
            result.profile.append((index, tuple(seconds)))


def profile_link(task: ServeTask, rank: int, channel, *, repeats: int) -> list[tuple[int, float]]:
    """Ranks s and s + 1 exchange hidden states of LINK_TOKENS tokens, one pair at a time:
    half the median round trip is the one-way time. Returns (tokens, seconds) on each
    sender (empty elsewhere)."""
    timed: list[tuple[int, float]] = []
    hidden_size = task.model.hidden_size
    for sender in range(task.options.p - 1):
        for tokens in LINK_TOKENS:
            dist.barrier(group=channel.control)
            if rank not in (sender, sender + 1):
                continue
            message = torch.zeros((tokens, hidden_size), dtype=channel.dtype, device=channel.device)
            trips = []
            for _ in range(repeats + 1):  # the first exchange sets up the connection
                start = time.perf_counter_ns()
                if rank == sender:
                    dist.send(message, sender + 1, group=channel.data)
                    dist.recv(message, sender + 1, group=channel.data)
                else:
                    dist.recv(message, sender, group=channel.data)
                    dist.send(message, sender, group=channel.data)
                trips.append((time.perf_counter_ns() - start) * 1e-9)
            if rank == sender:
                timed.append((tokens, statistics.median(trips[1:]) / 2))
    return timed
