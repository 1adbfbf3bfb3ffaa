"""A serving rank: one pipeline stage with its KV cache (``serve_model``); rank 0 also forms
the batches (``serve_batches``). Runs inside ``pipesched.runtime.worker`` after the process
group is up; ``serve_run``'s module docstring says what is measured."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from pipesched.runtime.launch import LaunchSpec, RankContext
from pipesched.runtime.serve_batches import BatchEntry, RequestStates, warm_up
from pipesched.runtime.serve_model import CacheShape, ServeStage
from pipesched.runtime.serve_profile import profile_link, profile_stage
from pipesched.runtime.serve_run import RankServeResult, ServeTask
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import torch_dtype

torch = require_torch()
dist = torch.distributed

# message tags: a stage posts its next announcement's receive before the current batch's
# hidden states come, so each kind of message is matched on its own tag
CONTROL, HIDDEN, TOKENS = 1, 2, 3
HEADER = 3  # int64s that open a batch's announcement: (batch, entries, tokens); batch -1 ends the run
WARMUP = 3  # untimed iterations of every stage before the run


@dataclass
class Channel:
    """How a rank talks to its neighbours: the control group carries the headers, entry
    tables and tokens (gloo, on the CPU), the data group the hidden states."""

    control: object  # None: the default group
    data: object
    device: torch.device
    dtype: torch.dtype


def run_serve(spec: LaunchSpec, context: RankContext) -> RankServeResult:
    """Warm up, profile when asked, then serve the trace (rank 0 leads, the others follow)."""
    task: ServeTask = spec.task
    rank = context.rank
    device = torch.device("cuda", rank) if spec.backend == "nccl" else torch.device("cpu")
    if spec.backend == "nccl":
        torch.cuda.set_device(rank)
    dtype = torch_dtype(task.options.dtype)
    channel = Channel(dist.new_group(backend="gloo") if spec.backend == "nccl" else None, None, device, dtype)
    stage = ServeStage(task.model, task.partition.layers(rank), CacheShape(task.slots, task.max_len),
                       seed=task.options.seed, dtype=dtype, device=device)
    result = RankServeResult()
    profile_stage(stage, task, result, repeats=WARMUP, record=False)
    repeats = task.options.profile_repeats
    # the profile brackets the run: half its rounds before, half after (so a change in the
    # machine's load while the trace is served weighs on the fitted model as on the run)
    if repeats:
        dist.barrier(group=channel.control)
        profile_stage(stage, task, result, repeats=repeats - repeats // 2, record=True)
        profile_link(task, rank, channel, result, repeats=repeats)
    dist.barrier(group=channel.control)
    context.progress.update(0, 0, 0)
    if rank == 0:
        _lead(stage, task, channel, result, context)
    else:
        _follow(stage, task, channel, result, context, rank, spec.world_size)
    if repeats // 2:
        dist.barrier(group=channel.control)
        profile_stage(stage, task, result, repeats=repeats // 2, record=True)
    return result


def _synchronize(channel: Channel) -> None:
    if channel.device.type == "cuda":
        torch.cuda.synchronize(channel.device)


@dataclass
class InFlight:
    """A batch sent down the pipeline whose tokens rank 0 awaits."""

    batch: int
    entries: list[BatchEntry]
    tokens: torch.Tensor  # int64 [emitting entries], filled by the last stage's message
    works: list  # the posted sends and the token receive
    buffers: tuple = ()  # the tensors being sent, kept alive until their sends complete


class Lead:
    """Rank 0's state: the requests, their prompt ids and generated tokens."""

    def __init__(self, task: ServeTask, channel: Channel) -> None:
        trace = task.trace
        self.task, self.channel = task, channel
        warm_up(task.options.scheduler, p=task.options.p, block_size=task.options.block_size)
        self.states = RequestStates(trace, task.options.scheduler, p=task.options.p,
                                    block_size=task.options.block_size)
        generator = torch.Generator().manual_seed(task.options.seed)
        self.prompts = [torch.randint(task.model.vocab_size, (int(n),), generator=generator) for n in trace.prefill_tokens]
        self.tokens: list[list[int]] = [[] for _ in range(len(trace))]
        self.in_flight = 0  # batches sent and not yet back
        self.origin_ns = 0  # the common start: the trace's time 0 on the host clock
        # a thread waits for each batch's messages in dispatch order (a gloo receive says it
        # is complete only to a wait) and hands the batch back here
        self.posted: queue.Queue[InFlight | None] = queue.Queue()
        self.returned: queue.Queue[InFlight] = queue.Queue()
        self.waiter = threading.Thread(target=self._await_batches, daemon=True)
        self.waiter.start()

    def _await_batches(self) -> None:
        while (flight := self.posted.get()) is not None:
            for work in flight.works:
                work.wait()
            self.returned.put(flight)

    def send(self, flight: InFlight) -> None:
        self.in_flight += 1
        self.posted.put(flight)

    def take(self, timeout_s: float | None) -> bool:
        """Take the oldest returned batch, waiting up to ``timeout_s`` (None: no wait); whether one came."""
        try:
            flight = self.returned.get(timeout=timeout_s) if timeout_s is None or timeout_s > 0 else None
            if flight is None:
                flight = self.returned.get_nowait()
        except queue.Empty:
            return False
        self.in_flight -= 1
        self.finish(flight, (time.perf_counter_ns() - self.origin_ns) * 1e-9)
        return True

    def close(self) -> None:
        self.posted.put(None)
        self.waiter.join()

    def inputs(self, entries: list[BatchEntry]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's token ids and positions (flat, in entry order) and its entry table."""
        ids, positions = [], []
        for e in entries:
            if e.decode:
                ids.append(torch.tensor([self.tokens[e.request][-1]]))
            else:
                ids.append(self.prompts[e.request][e.context:e.context + e.tokens])
            positions.append(torch.arange(e.context, e.context + e.tokens))
        table = torch.tensor([[e.slot, e.context, e.tokens, int(e.emits)] for e in entries], dtype=torch.int64)
        device = self.channel.device
        return torch.cat(ids).to(device), torch.cat(positions).to(device), table

    def finish(self, flight: InFlight, now: float) -> None:
        """Take a batch's tokens: every emitting request gets its next token."""
        made = flight.tokens.tolist()
        emitting = [e for e in flight.entries if e.emits]
        for entry, token in zip(emitting, made, strict=True):
            self.tokens[entry.request].append(int(token))
        self.states.complete(flight.entries, now)


def _lead(stage: ServeStage, task: ServeTask, channel: Channel, result: RankServeResult, context: RankContext) -> None:
    lead = Lead(task, channel)
    states = lead.states
    arrive_ns = np.asarray(task.trace.arrived_at * 1e9, np.int64)
    result.origin_ns = lead.origin_ns = origin = time.perf_counter_ns()
    try:
        while not states.done:
            while lead.take(0):
                pass
            begun = time.perf_counter_ns()
            states.arrive(int(np.searchsorted(arrive_ns, begun - origin, side="right")))
            entries = states.next_batch((begun - origin) * 1e-9)
            if entries:
                _dispatch(stage, lead, entries, begun, result, context)
                continue
            _wait(lead, arrive_ns, origin)
    finally:
        lead.close()
    _stop(task, channel)
    result.tokens = lead.tokens
    result.kv_times = np.array([t for t, _ in states.kv_log], np.float64)
    result.kv_blocks = np.array([b for _, b in states.kv_log], np.int64)
    result.kv_capacity = states.capacity


def _wait(lead: Lead, arrive_ns: np.ndarray, origin: int) -> None:
    """Nothing to form now: wait for a batch in flight to come back, or the next arrival."""
    states = lead.states
    until = (int(arrive_ns[states.arrived]) + origin - time.perf_counter_ns()) * 1e-9 \
        if states.arrived < arrive_ns.size else None
    if lead.in_flight:
        lead.take(None if until is None else max(until, 1e-6))
    elif until is not None:
        time.sleep(max(0.0, until))


def control_message(batch: int, table: torch.Tensor, tokens: int, max_entries: int) -> torch.Tensor:
    """The fixed-size message that announces a batch: (batch, entries, tokens), then the
    entry table, padded to ``max_entries`` rows (batch -1: the run is over)."""
    message = torch.zeros(HEADER + 4 * max_entries, dtype=torch.int64)
    message[:HEADER] = torch.tensor([batch, table.shape[0], tokens])
    message[HEADER:HEADER + table.numel()] = table.reshape(-1)
    return message


def _dispatch(stage: ServeStage, lead: Lead, entries: list[BatchEntry], begun: int, result: RankServeResult,
              context: RankContext) -> None:
    """Announce the batch down the pipeline, run it on stage 0 and send its hidden states
    on (with one stage, take its tokens). The announcement goes first so that every stage
    has posted its receive of the hidden states before they are sent (a gloo send waits for
    the receiver's request, which a busy core may answer late)."""
    batch = len(result.entries)
    context.progress.update(0, batch, 0)
    ids, positions, table = lead.inputs(entries)
    channel = lead.channel
    works, buffers = [], []
    tokens = torch.empty(sum(1 for e in entries if e.emits), dtype=torch.int64)
    if not stage.last:
        control = control_message(batch, table, int(ids.shape[0]), lead.task.options.scheduler.max_batch)
        works.append(dist.isend(control, 1, group=channel.control, tag=CONTROL))
        works.append(dist.irecv(tokens, dist.get_world_size() - 1, group=channel.control, tag=TOKENS))
        buffers.append(control)
    start = time.perf_counter_ns()
    out = stage.forward(ids, table.to(channel.device), positions)
    _synchronize(channel)
    end = time.perf_counter_ns()
    result.entries.append(entries)
    result.overhead_ns.append(start - begun)
    result.batch.append(batch)
    result.start_ns.append(start)  # after the batch was formed, as the engine starts stage 0
    result.end_ns.append(end)
    if stage.last:
        lead.send(InFlight(batch, entries, out.cpu(), []))
        return
    hidden = out.contiguous()
    works.append(dist.isend(hidden, 1, group=channel.data, tag=HIDDEN))
    buffers.append(hidden)
    lead.send(InFlight(batch, entries, tokens, works, tuple(buffers)))


def _stop(task: ServeTask, channel: Channel) -> None:
    if task.options.p > 1:
        stop = control_message(-1, torch.zeros((0, 4), dtype=torch.int64), 0, task.options.scheduler.max_batch)
        dist.send(stop, 1, group=channel.control, tag=CONTROL)


def _follow(stage: ServeStage, task: ServeTask, channel: Channel, result: RankServeResult, context: RankContext,
            rank: int, world: int) -> None:
    """Stage ``rank`` > 0: run each announced batch when its hidden states come and send its
    output on (the last stage: the sampled tokens to rank 0)."""
    arrivals: queue.Queue = queue.Queue()
    listener = threading.Thread(target=_listen, args=(task, channel, rank, world, arrivals), daemon=True)
    listener.start()
    pending: list = []  # sends not yet complete, and their tensors
    while (arrival := arrivals.get()) is not None:
        batch, table, hidden, received = arrival
        received.wait()
        context.progress.update(0, batch, 0)
        start = time.perf_counter_ns()
        out = stage.forward(hidden, table.to(channel.device))
        _synchronize(channel)
        end = time.perf_counter_ns()
        result.batch.append(batch)
        result.start_ns.append(start)
        result.end_ns.append(end)
        sending = out.cpu() if stage.last else out.contiguous()
        target, group, tag = (0, channel.control, TOKENS) if stage.last else (rank + 1, channel.data, HIDDEN)
        pending.append((dist.isend(sending, target, group=group, tag=tag), sending))
        pending = _settled(pending)
    listener.join()
    for work, _ in pending:
        work.wait()


def _listen(task: ServeTask, channel: Channel, rank: int, world: int, arrivals: queue.Queue) -> None:
    """A follower's listening thread: takes each announcement as it comes, passes it on,
    and posts the receive of its hidden states at once (so a sender never waits on this
    rank's busy compute to ask for them); hands (batch, table, hidden, receive) to the
    stage, then None after the last."""
    size = HEADER + 4 * task.options.scheduler.max_batch
    forwarded: list = []
    while True:
        message = torch.empty(size, dtype=torch.int64)
        dist.recv(message, rank - 1, group=channel.control, tag=CONTROL)
        batch, count, tokens = message[:HEADER].tolist()
        if rank < world - 1:
            forwarded.append((dist.isend(message, rank + 1, group=channel.control, tag=CONTROL), message))
            forwarded = _settled(forwarded)
        if batch < 0:
            break
        hidden = torch.empty((tokens, task.model.hidden_size), dtype=channel.dtype, device=channel.device)
        received = dist.irecv(hidden, rank - 1, group=channel.data, tag=HIDDEN)
        arrivals.put((batch, message[HEADER:HEADER + 4 * count].view(count, 4), hidden, received))
    for work, _ in forwarded:
        work.wait()
    arrivals.put(None)


def _settled(pending: list) -> list:
    """Wait for all but the newest sends (a send done long ago returns at once)."""
    for work, _ in pending[:-2]:
        work.wait()
    return pending[-2:]
