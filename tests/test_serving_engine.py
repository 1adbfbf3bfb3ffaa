"""The serving engine against hand computations from the latency formula, and its laws:
pipeline batches in flight, the paged cache's bounds, preemption, Little's law."""

from __future__ import annotations

import numpy as np
import pytest

from pipesched.enums import Preemption, SchedulerName
from pipesched.errors import PipeschedError
from pipesched.serving.config import Disaggregation, Instances, SchedulerSpec, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.results import token_gaps
from pipesched.serving.trace import Trace
from serving_engine_helpers import DEVICE_LINK, Line, deployment, poisson_trace

LINE = Line(base=0.003, token=2e-5, attention=3e-10, decode=1e-5, kv=2e-7, send=1e-6)
OVERHEAD = 0.001


def _config(name: SchedulerName, *, pp: int = 2, replicas: int = 1, chunk: int = 512, max_tokens: int = 4096,
            max_batch: int = 64, preemption: Preemption = Preemption.RECOMPUTE, **kwargs) -> ServeConfig:
    return ServeConfig(instances=Instances(tp=1, pp=pp, count=replicas),
                       scheduler=SchedulerSpec(name=name, max_batch=max_batch, max_tokens=max_tokens, chunk=chunk,
                                               preemption=preemption),
                       cpu_overhead_s=OVERHEAD, **kwargs)


def _iteration(pp: int, tokens: int, attention: float, decodes: int, kv_tokens: int) -> float:
    """One batch through the pipeline, alone: overhead, each stage, each send but the last."""
    stage = LINE.time(tokens, attention, decodes, kv_tokens)
    return OVERHEAD + pp * stage + (pp - 1) * LINE.send * tokens


def _chunks(prompt: int, chunk: int) -> list[int]:
    return [min(chunk, prompt - start) for start in range(0, prompt, chunk)]


def _alone(prompt: int, output: int, chunks: list[int], pp: int) -> tuple[float, list[float]]:
    """TTFT and the later token gaps of a request served alone, from the formula."""
    ttft, cached = 0.0, 0
    for c in chunks:
        ttft += _iteration(pp, c, c * (cached + c), 0, 0)
        cached += c
    gaps = [_iteration(pp, 1, 0.0, 1, prompt + k) for k in range(1, output)]
    return ttft, gaps


@pytest.mark.parametrize(("name", "pp"), [(SchedulerName.SARATHI, 2), (SchedulerName.VLLM, 2),
                                          (SchedulerName.ORCA, 1), (SchedulerName.STATIC, 3)])
def test_one_request_at_a_time_matches_the_formula_exactly(name: SchedulerName, pp: int) -> None:
    trace = Trace(np.array([0.0, 50.0, 100.0]), np.array([1000, 37, 1300]), np.array([5, 1, 9]))
    config = _config(name, pp=pp)
    run = simulate_serving(deployment(config, line=LINE), trace)
    for r in range(len(trace)):
        prompt, output = int(trace.prefill_tokens[r]), int(trace.decode_tokens[r])
        chunks = _chunks(prompt, 512) if name == SchedulerName.SARATHI else [prompt]
        ttft, gaps = _alone(prompt, output, chunks, pp)
        times = run.token_times[run.token_offsets[r]:run.token_offsets[r + 1]]
        assert run.first_token_at[r] - trace.arrived_at[r] == pytest.approx(ttft, rel=1e-12)
        assert np.diff(times) == pytest.approx(gaps, rel=1e-9)
        assert run.finished_at[r] == times[-1]
        assert run.scheduled_at[r] == pytest.approx(trace.arrived_at[r] + OVERHEAD)


def test_two_batches_in_flight_overlap_on_two_stages() -> None:
    trace = Trace(np.zeros(2), np.array([1000, 1000]), np.array([3, 3]))
    run = simulate_serving(deployment(_config(SchedulerName.SARATHI), line=LINE), trace)
    log = run.iterations
    s0_b1 = (log.batch == 1) & (log.stage == 0)
    s1_b0 = (log.batch == 0) & (log.stage == 1)
    assert log.start[s0_b1][0] < log.end[s1_b0][0] and log.start[s1_b0][0] < log.end[s0_b1][0]
    members = [set(log.members[log.offsets[b]:log.offsets[b + 1]].tolist()) for b in range(2)]
    assert members == [{0}, {1}]


def test_never_more_than_p_batches_in_flight() -> None:
    run = simulate_serving(deployment(_config(SchedulerName.SARATHI, pp=3), line=LINE), poisson_trace(200, 40.0))
    log = run.iterations
    batches = int(log.batch.max()) + 1
    begin = np.full(batches, np.inf)
    finish = np.zeros(batches)
    np.minimum.at(begin, log.batch, log.start)
    np.maximum.at(finish, log.batch, log.end)
    for b in range(batches):
        assert np.count_nonzero((begin <= begin[b]) & (finish > begin[b])) <= 3


def test_the_bubble_between_batches_of_different_times_is_in_the_log() -> None:
    # a 100-token prompt then a 1000-token one: the second's longer stage 0 leaves stage 1 idle
    trace = Trace(np.zeros(2), np.array([100, 1000]), np.array([1, 1]))
    run = simulate_serving(deployment(_config(SchedulerName.VLLM, max_batch=1), line=LINE), trace)
    log = run.iterations
    stage1 = np.flatnonzero(log.stage == 1)
    small = LINE.time(100, 100 * 100, 0, 0)
    big = LINE.time(1000, 1000 * 1000, 0, 0)
    # batch 1 forms when batch 0 leaves stage 0, pays the overhead, runs stage 0 and its send
    gap = (OVERHEAD + big + LINE.send * 1000) - (LINE.send * 100 + small)
    assert log.start[stage1[1]] - log.end[stage1[0]] == pytest.approx(gap, rel=1e-9)


def _small_cache_run(name: SchedulerName, preemption: Preemption, capacity: int = 300):
    config = _config(name, pp=2, max_batch=32, preemption=preemption, replicas=2)
    trace = poisson_trace(300, 60.0, prompt=(100, 600), output=(20, 300), seed=3)
    return trace, simulate_serving(deployment(config, line=LINE, capacity_blocks=capacity), trace)


@pytest.mark.parametrize("name", list(SchedulerName))
@pytest.mark.parametrize("preemption", list(Preemption))
def test_the_paged_cache_never_holds_more_than_it_has(name: SchedulerName, preemption: Preemption) -> None:
    _, run = _small_cache_run(name, preemption)
    for blocks, capacity in zip(run.kv.blocks, run.kv.capacity_blocks, strict=True):
        assert blocks.max() <= capacity
        assert blocks[-1] == 0  # every block given back at the end


@pytest.mark.parametrize("name", [SchedulerName.VLLM, SchedulerName.SARATHI])
@pytest.mark.parametrize("preemption", list(Preemption))
def test_a_preempted_request_finishes_with_all_its_tokens(name: SchedulerName, preemption: Preemption) -> None:
    trace, run = _small_cache_run(name, preemption)
    assert run.preemptions.sum() > 0
    counts = np.diff(run.token_offsets)
    assert np.array_equal(counts, trace.decode_tokens)
    assert np.isfinite(run.token_times).all()
    for r in np.flatnonzero(run.preemptions):
        times = run.token_times[run.token_offsets[r]:run.token_offsets[r + 1]]
        assert np.all(np.diff(times) > 0)
        assert run.finished_at[r] == times[-1] and run.first_token_at[r] == times[0]
    if preemption == Preemption.SWAP:
        kinds = set(run.moves.kind)
        assert kinds <= {"swap-out", "swap-in"} and "swap-out" in kinds
        assert run.moves.kind.count("swap-out") == run.moves.kind.count("swap-in")


def test_the_same_inputs_give_the_same_run() -> None:
    config = _config(SchedulerName.SARATHI, replicas=2, routing="least-loaded")
    trace = poisson_trace(300, 50.0, seed=5)
    one, two = (simulate_serving(deployment(config, line=LINE, capacity_blocks=400), trace) for _ in range(2))
    for name in ("first_token_at", "finished_at", "token_times", "preemptions", "instance"):
        assert np.array_equal(getattr(one, name), getattr(two, name))
    assert np.array_equal(one.iterations.start, two.iterations.start)
    assert np.array_equal(one.iterations.members, two.iterations.members)


def test_littles_law_on_a_long_run() -> None:
    qps = 30.0
    trace = poisson_trace(3000, qps, seed=11)
    run = simulate_serving(deployment(_config(SchedulerName.SARATHI), line=LINE), trace)
    e2e = run.finished_at - trace.arrived_at
    # mean requests in the system, sampled over the arrivals' span: arrived minus finished
    probes = np.linspace(trace.arrived_at[0], trace.arrived_at[-1], 20_000)
    in_system = (np.searchsorted(trace.arrived_at, probes, side="right")
                 - np.searchsorted(np.sort(run.finished_at), probes, side="right"))
    assert in_system.mean() == pytest.approx(qps * e2e.mean(), rel=0.05)


def test_ttft_p99_rises_with_the_rate() -> None:
    unit = poisson_trace(600, 1.0, seed=2)
    line = deployment(_config(SchedulerName.SARATHI), line=LINE)
    p99 = []
    for qps in (10.0, 25.0, 40.0):
        trace = Trace(unit.arrived_at / qps, unit.prefill_tokens, unit.decode_tokens)
        run = simulate_serving(line, trace)
        p99.append(np.quantile(run.first_token_at - trace.arrived_at, 0.99))
    assert p99[0] < p99[1] < p99[2]


def test_sarathi_trades_a_longer_ttft_for_a_shorter_p99_time_between_tokens() -> None:
    # a mixed trace: long prompts beside long outputs, at a rate both sustain
    trace = poisson_trace(400, 6.0, prompt=(500, 3000), output=(50, 400), seed=7)
    runs = {}
    for name in (SchedulerName.VLLM, SchedulerName.SARATHI):
        runs[name] = simulate_serving(deployment(_config(name, pp=2, max_batch=128), line=LINE), trace)
    tbt = {name: np.quantile(token_gaps(run.token_times, run.token_offsets), 0.99) for name, run in runs.items()}
    ttft = {name: np.mean(run.first_token_at - trace.arrived_at) for name, run in runs.items()}
    assert tbt[SchedulerName.SARATHI] < tbt[SchedulerName.VLLM]
    assert ttft[SchedulerName.VLLM] < ttft[SchedulerName.SARATHI]


def test_round_robin_and_least_loaded_routing() -> None:
    # request 0 is long; 1 is short and done before 2 arrives
    trace = Trace(np.array([0.0, 0.0, 5.0]), np.array([100, 100, 100]), np.array([2000, 2, 2]))
    robin = simulate_serving(deployment(_config(SchedulerName.VLLM, replicas=2), line=LINE), trace)
    least = simulate_serving(deployment(_config(SchedulerName.VLLM, replicas=2, routing="least-loaded"),
                                        line=LINE), trace)
    assert robin.instance.tolist() == [0, 1, 0]
    assert least.instance.tolist() == [0, 1, 1]


def test_disaggregated_prefill_sends_the_cache_and_decodes_elsewhere() -> None:
    split = Disaggregation(prefill=Instances(tp=1, pp=2, count=1), decode=Instances(tp=2, pp=1, count=1))
    config = _config(SchedulerName.SARATHI, disaggregate=split)
    built = deployment(config, line=LINE)
    trace = Trace(np.array([0.0]), np.array([1000]), np.array([4]))
    run = simulate_serving(built, trace)
    ttft, _ = _alone(1000, 4, _chunks(1000, 512), 2)
    assert run.first_token_at[0] == pytest.approx(ttft, rel=1e-12)
    nbytes = 1000 * built.instances[0].kv_bytes_per_token
    assert run.moves.kind == ("transfer",)
    assert run.moves.nbytes[0] == nbytes
    arrived = run.first_token_at[0] + DEVICE_LINK.latency + nbytes / DEVICE_LINK.bandwidth
    assert run.moves.end[0] == pytest.approx(arrived, rel=1e-12)
    times = run.token_times
    # the decode instance is one stage: each later token one decode iteration after the last
    assert times[1] == pytest.approx(arrived + _iteration(1, 1, 0.0, 1, 1001), rel=1e-12)
    assert np.diff(times[1:]) == pytest.approx([_iteration(1, 1, 0.0, 1, 1000 + k) for k in (2, 3)], rel=1e-9)
    assert run.instance[0] == 1 and run.moves.src_device[0] == 1 and run.moves.dst_device[0] == 2
    assert all(blocks[-1] == 0 for blocks in run.kv.blocks)


@pytest.mark.parametrize("name", [SchedulerName.SARATHI, SchedulerName.VLLM])
@pytest.mark.parametrize("preemption", list(Preemption))
def test_disaggregated_runs_keep_every_token_and_the_caches_bounds(name: SchedulerName,
                                                                   preemption: Preemption) -> None:
    # two decode instances with small caches: they preempt, and recomputed prompts prefill there
    split = Disaggregation(prefill=Instances(tp=1, pp=2, count=1), decode=Instances(tp=1, pp=1, count=2))
    config = _config(name, disaggregate=split, max_batch=32, preemption=preemption)
    trace = poisson_trace(200, 40.0, prompt=(100, 600), output=(20, 300), seed=9)
    run = simulate_serving(deployment(config, line=LINE, capacity_blocks=200), trace)
    assert np.array_equal(np.diff(run.token_offsets), trace.decode_tokens)
    assert np.isfinite(run.token_times).all() and run.preemptions.sum() > 0
    assert set(run.instance.tolist()) == {1, 2}  # every request ends on a decode instance
    transfers = [k for k, kind in enumerate(run.moves.kind) if kind == "transfer"]
    assert len(transfers) == len(trace)  # each prompt's cache sent once (all outputs are over one token)
    assert np.array_equal(run.instance[run.moves.request[transfers]], 1 + np.arange(len(trace)) % 2)
    for blocks, capacity in zip(run.kv.blocks, run.kv.capacity_blocks, strict=True):
        assert blocks.max() <= capacity and blocks[-1] == 0


def test_a_request_no_cache_or_context_can_hold_is_named() -> None:
    trace = Trace(np.zeros(2), np.array([100, 900]), np.array([10, 200]))
    config = _config(SchedulerName.SARATHI)
    with pytest.raises(PipeschedError, match=r"^kv_capacity_blocks=50: .*request 1 alone \(69 blocks\)"):
        simulate_serving(deployment(config, line=LINE, capacity_blocks=50), trace)
    with pytest.raises(PipeschedError, match=r"^num_prefill_tokens=900: request 1 needs"):
        simulate_serving(deployment(config, line=LINE, max_context=1000), trace)
