"""ServeRuns built by hand for the results and capacity tests: requests with known token
times, and a single-server FIFO queue standing in for the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.records import IterationLog, KVTrace, ServeRun
from pipesched.serving.trace import Trace

# one iteration row: (batch, instance, stage, start, end, flops)
Row = tuple[int, int, int, float, float, float]


def iteration_log(rows: Sequence[Row], members: Sequence[Sequence[int]]) -> IterationLog:
    """An iteration log of ``rows`` whose batch b holds the requests ``members[b]``."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * 6
    batch, instance, stage, start, end, flops = (np.array(c) for c in columns)
    n = len(rows)
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in members])]).astype(np.int64)
    flat = np.array([r for m in members for r in m], np.int64)
    return IterationLog(batch=batch.astype(np.int64), instance=instance.astype(np.int32),
                        stage=stage.astype(np.int32), first_device=stage.astype(np.int32),
                        start=start.astype(np.float64), end=end.astype(np.float64),
                        prefill_tokens=np.zeros(n, np.int64), decodes=np.zeros(n, np.int64),
                        kv_tokens=np.zeros(n, np.int64), flops=flops.astype(np.float64), members=flat,
                        offsets=offsets)


def hand_run(arrived: Sequence[float], scheduled: Sequence[float], tokens: Sequence[Sequence[float]], *,
             rows: Sequence[Row] = (), members: Sequence[Sequence[int]] = (), stages: Sequence[int] = (1,),
             tp: int = 1, kv_blocks: Sequence[Sequence[int]] = ((0,),), kv_capacity: Sequence[int] = (100,),
             preemptions: Sequence[int] | None = None, peak_flops: float = 1e12) -> ServeRun:
    """A ServeRun of requests arriving at ``arrived``, first scheduled at ``scheduled``, making
    their output tokens at ``tokens[i]``; instances of ``stages[k]`` stages of ``tp`` devices."""
    n = len(arrived)
    decode = np.array([len(t) for t in tokens], np.int64)
    trace = Trace(np.array(arrived, np.float64), np.full(n, 8, np.int64), decode)
    kinds = tuple("replica" for _ in stages)
    return ServeRun(
        trace=trace, config=ServeConfig(instances=Instances(tp=tp, pp=stages[0], count=len(stages))),
        instance=np.zeros(n, np.int32), scheduled_at=np.array(scheduled, np.float64),
        first_token_at=np.array([t[0] for t in tokens], np.float64),
        finished_at=np.array([t[-1] for t in tokens], np.float64),
        preemptions=np.array(preemptions if preemptions is not None else [0] * n, np.int32),
        token_times=np.array([x for t in tokens for x in t], np.float64),
        token_offsets=np.concatenate([[0], np.cumsum(decode)]).astype(np.int64),
        iterations=iteration_log(rows, members),
        kv=KVTrace(times=tuple(np.arange(len(b), dtype=np.float64) for b in kv_blocks),
                   blocks=tuple(np.array(b, np.int64) for b in kv_blocks), capacity_blocks=tuple(kv_capacity),
                   block_size=16),
        instance_kind=kinds, instance_devices=tuple(tuple(range(s)) for s in stages), tp=(tp,) * len(stages),
        peak_flops=peak_flops)


def fifo_run(trace: Trace, *, prefill_token_s: float, decode_s: float) -> ServeRun:
    """One request at a time, first come first served, on one stage: a request's prefill
    takes ``prefill_token_s`` per prompt token and makes its first token; each later token
    takes ``decode_s``."""
    free = 0.0
    scheduled, tokens, rows = [], [], []
    for k, (arrived, prompt, output) in enumerate(zip(trace.arrived_at.tolist(), trace.prefill_tokens.tolist(),
                                                       trace.decode_tokens.tolist(), strict=True)):
        start = max(arrived, free)
        first = start + prefill_token_s * prompt
        made = [first + decode_s * j for j in range(output)]
        scheduled.append(start)
        tokens.append(made)
        rows.append((k, 0, 0, start, made[-1], 1.0))
        free = made[-1]
    run = hand_run(trace.arrived_at.tolist(), scheduled, tokens, rows=rows, members=[[k] for k in range(len(trace))])
    return dataclasses.replace(run, trace=trace)
