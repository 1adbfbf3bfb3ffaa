"""Each scheduler's batches against its rule: what may share an iteration, the caps, who
is preempted, and the swap's time on the host link."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipesched.enums import Preemption, SchedulerName
from pipesched.serving.config import Instances, SchedulerSpec, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.trace import Trace
from serving_engine_helpers import HOST_LINK, Line, deployment, poisson_trace

LINE = Line(base=0.003, token=2e-5, attention=3e-10, decode=1e-5, kv=2e-7, send=1e-6)


def _run(name: SchedulerName, trace: Trace, *, pp: int = 2, capacity: int = 100_000, max_batch: int = 16,
         chunk: int = 256, max_tokens: int = 2048, preemption: Preemption = Preemption.RECOMPUTE):
    config = ServeConfig(instances=Instances(tp=1, pp=pp, count=1),
                         scheduler=SchedulerSpec(name=name, max_batch=max_batch, max_tokens=max_tokens, chunk=chunk,
                                                 preemption=preemption), cpu_overhead_s=0.001)
    return simulate_serving(deployment(config, line=LINE, capacity_blocks=capacity), trace)


def _members(run, b: int) -> np.ndarray:
    log = run.iterations
    return log.members[log.offsets[b]:log.offsets[b + 1]]


def _stage0(run):
    return run.iterations.stage == 0


TRACE = poisson_trace(120, 40.0, prompt=(50, 900), output=(5, 80), seed=4)


@pytest.mark.parametrize("name", list(SchedulerName))
def test_every_batch_keeps_the_caps(name: SchedulerName) -> None:
    run = _run(name, TRACE)
    log = run.iterations
    first = _stage0(run)
    budget = 256 if name == SchedulerName.SARATHI else 2048
    assert np.all(log.prefill_tokens[first] + log.decodes[first] <= budget)
    assert np.all(np.diff(log.offsets) <= 16)


def test_vllm_runs_new_prompts_alone() -> None:
    log = _run(SchedulerName.VLLM, TRACE).iterations
    first = log.stage == 0
    assert np.all((log.prefill_tokens[first] == 0) | (log.decodes[first] == 0))
    assert np.any(log.prefill_tokens[first] > 0) and np.any(log.decodes[first] > 0)


def test_sarathi_chunks_prompts_beside_running_decodes() -> None:
    run = _run(SchedulerName.SARATHI, TRACE)
    log = run.iterations
    first = log.stage == 0
    mixed = first & (log.prefill_tokens > 0) & (log.decodes > 0)
    assert mixed.any()  # stall-free: decodes go on while prompts are prefilled
    # a prompt over the budget is prefilled in chunks, one batch after the other
    long = int(np.argmax(TRACE.prefill_tokens))
    batches = [b for b in range(log.offsets.size - 1) if long in _members(run, b)]
    assert len(batches) > TRACE.decode_tokens[long]  # its chunks, then one batch per later token


def test_orca_mixes_whole_prompts_with_decodes_and_never_preempts() -> None:
    # a cache for few requests at once: Orca reserves prompt + output, so it waits instead
    run = _run(SchedulerName.ORCA, TRACE, capacity=140)
    log = run.iterations
    first = log.stage == 0
    assert np.any((log.prefill_tokens[first] > 0) & (log.decodes[first] > 0))
    assert run.preemptions.sum() == 0
    # whole prompts: each request is a prefill of exactly one batch (a batch's decodes come first)
    prefills = np.concatenate([_members(run, b)[log.decodes[first][b]:] for b in range(log.offsets.size - 1)])
    assert np.array_equal(np.sort(prefills), np.arange(len(TRACE)))


def test_static_batches_take_no_one_in_until_all_are_done() -> None:
    run = _run(SchedulerName.STATIC, TRACE, pp=1)
    log = run.iterations
    group = np.full(len(TRACE), -1)
    for b in range(log.offsets.size - 1):
        rows = _members(run, b)
        if log.prefill_tokens[b] > 0:
            assert log.decodes[b] == 0 and np.all(group[rows] == -1)
            group[rows] = b
        else:
            assert np.unique(group[rows]).size == 1  # one prefill batch's requests only
    # the next prefill batch starts after every request of the one before has finished
    prefills = np.flatnonzero(log.prefill_tokens > 0)
    for before, after in itertools.pairwise(prefills):
        assert log.start[after] >= run.finished_at[_members(run, before)].max()


@pytest.mark.parametrize("name", [SchedulerName.VLLM, SchedulerName.SARATHI])
def test_the_most_recently_arrived_running_request_is_preempted(name: SchedulerName) -> None:
    # two 16-token prompts fill one block each; a cache of 3 blocks: when both decodes need
    # a second block, the later one gives its blocks up and is recomputed once the first is done
    trace = Trace(np.zeros(2), np.array([16, 16]), np.array([20, 5]))
    run = _run(name, trace, pp=1, capacity=3)
    assert run.preemptions.tolist() == [0, 1]
    assert np.diff(run.token_offsets).tolist() == [20, 5]
    assert run.first_token_at[1] < run.finished_at[0] < run.token_times[run.token_offsets[1] + 1]
    assert max(blocks.max() for blocks in run.kv.blocks) <= 3


def test_a_swap_takes_the_host_link_time_of_its_cache() -> None:
    trace = Trace(np.zeros(2), np.array([16, 16]), np.array([20, 5]))
    run = _run(SchedulerName.VLLM, trace, pp=1, capacity=3, preemption=Preemption.SWAP)
    moves = run.moves
    assert moves.kind == ("swap-out", "swap-in")
    assert moves.request.tolist() == [1, 1]
    per_device = 1e5  # the helper's kv_bytes_per_token of a stage
    tokens = 16  # request 1's cache when it was swapped out: its prompt (the first token is not cached yet)
    assert moves.end - moves.start == pytest.approx([HOST_LINK.transfer_time(per_device * tokens)] * 2)
    assert moves.src_device.tolist() == [0, -1] and moves.dst_device.tolist() == [-1, 0]
    # the request decodes again only once its cache is back
    back = run.token_times[run.token_offsets[1] + 1]
    assert back > moves.end[1]
