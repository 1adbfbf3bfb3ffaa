"""Profiling a serving rank around its run: its stage's iteration time at fixed batch
compositions (``serve_batches.profile_batches``; half the rounds before the run, half after),
and the time of a hidden-state message to the next rank (before it). Every rank times at
once (the cores are shared as in the run), outside the run, so nothing measured while
serving goes into the prediction."""

from __future__ import annotations

import time

from pipesched.runtime.serve_batches import profile_batches
from pipesched.runtime.serve_model import ServeStage
from pipesched.runtime.serve_run import RankServeResult, ServeTask
from pipesched.runtime.torch_import import require_torch

torch = require_torch()
dist = torch.distributed

LINK_TOKENS = (1, 16, 64, 256)  # hidden states of this many tokens timed between neighbours
IDLE_SHARE = 0.5  # of the profile's time a stage sleeps between its timed iterations


def _inputs(stage: ServeStage, tokens: int, vocab: int, generator):
    if stage.first:
        return torch.randint(vocab, (tokens,), generator=generator).to(stage.device)
    hidden = torch.randn((tokens, stage.hidden_size), generator=generator)
    return hidden.to(device=stage.device, dtype=stage.dtype)


def profile_stage(stage: ServeStage, task: ServeTask, result: RankServeResult, *, repeats: int, record: bool) -> None:
    """Time ``repeats`` rounds of every profile batch, one of each per round (so a change in
    the machine's load over the profile touches every batch alike); with ``record``, keep
    each repeat's seconds in ``result.profile`` as (batch index, seconds)."""
    generator = torch.Generator().manual_seed(task.options.seed + 1)
    prepared = []
    for entries in profile_batches(task.trace, task.options.scheduler, task.slots):
        table = torch.tensor([[e.slot, e.context, e.tokens, int(e.emits)] for e in entries], dtype=torch.int64)
        inputs = _inputs(stage, sum(e.tokens for e in entries), task.model.vocab_size, generator)
        positions = torch.cat([torch.arange(e.context, e.context + e.tokens) for e in entries]).to(stage.device)
        prepared.append((inputs, table.to(stage.device), positions))
    seconds: list[list[float]] = [[] for _ in prepared]
    for _ in range(repeats):
        for index, (inputs, table, positions) in enumerate(prepared):
            start = time.perf_counter_ns()
            stage.forward(inputs, table, positions)
            if stage.device.type == "cuda":
                torch.cuda.synchronize(stage.device)
            took = (time.perf_counter_ns() - start) * 1e-9
            seconds[index].append(took)
            # idle as long again: a serving stage computes in bursts between messages, and a
            # shared core's scheduler treats a process that sleeps between bursts otherwise
            # than one that never yields
            time.sleep(took * IDLE_SHARE / (1.0 - IDLE_SHARE))
    if record:
        result.profile.extend((index, tuple(times)) for index, times in enumerate(seconds))


def profile_link(task: ServeTask, rank: int, channel, result: RankServeResult, *, repeats: int) -> None:
    """Ranks s and s + 1, one pair at a time, send hidden states of LINK_TOKENS tokens as the
    run does: the receiver has posted its receive, the sender posts the send. Each side notes
    its time on the common clock (``result.link_sent`` on the sender: when the send was
    posted; ``result.link_received`` on the receiver: when the data was in hand), as
    (stage, tokens, ns); the first exchange of each size sets up the connection and is not kept."""
    hidden_size = task.model.hidden_size
    for sender in range(task.options.p - 1):
        for tokens in LINK_TOKENS:
            message = torch.zeros((tokens, hidden_size), dtype=channel.dtype, device=channel.device)
            for repeat in range(repeats + 1):
                work = dist.irecv(message, sender, group=channel.data) if rank == sender + 1 else None
                dist.barrier(group=channel.control)
                if rank == sender:
                    posted = time.perf_counter_ns()
                    dist.isend(message, sender + 1, group=channel.data).wait()
                    if repeat:
                        result.link_sent.append((sender, tokens, posted))
                elif work is not None:
                    work.wait()
                    if repeat:
                        result.link_received.append((sender, tokens, time.perf_counter_ns()))
