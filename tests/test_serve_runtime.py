"""Serving for real: the batches rank 0 forms, the measured ServeRun, and a real run of a
small trace whose greedy tokens match a cache-free single-process model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from pipesched.enums import SchedulerName
from pipesched.errors import PipeschedError
from pipesched.model.inference import LatencyRow
from pipesched.model.loading import load_model
from pipesched.runtime.serve_batches import BatchEntry, RequestStates, cache_blocks, profile_batches
from pipesched.runtime.serve_check import (
    LinkFit,
    compare_runs,
    fit_links,
    fit_stage_rows,
    host_delays,
    load_factors,
    predicted_deployment,
    scaled_rows,
    serve_check,
)
from pipesched.runtime.serve_run import (
    RankServeResult,
    ServeRunOptions,
    check_serve_inputs,
    iteration_log,
    kernel_stage_costs,
    serve_run,
)
from pipesched.serving.config import SchedulerSpec
from pipesched.serving.engine import simulate_serving
from pipesched.serving.queues import MADE, PREEMPTED
from pipesched.serving.trace import Trace


def _trace(prompts, outputs, arrivals=None) -> Trace:
    arrivals = np.zeros(len(prompts)) if arrivals is None else arrivals
    return Trace(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs))


def _states(trace: Trace, spec: SchedulerSpec, p: int = 1) -> RequestStates:
    return RequestStates(trace, spec, p=p, block_size=16)


def _run_to_end(states: RequestStates) -> list[list]:
    """Every batch until the trace is served, one batch in flight at a time."""
    batches = []
    states.arrive(len(states.slot))
    while not states.done:
        entries = states.next_batch(0.0)
        assert entries, "nothing to run while requests remain"
        batches.append(entries)
        states.complete(entries, 0.0)
    return batches


def test_sarathi_runs_decodes_first_then_chunks_prefills_to_the_budget():
    spec = SchedulerSpec(name=SchedulerName.SARATHI, chunk=8)
    batches = _run_to_end(_states(_trace([10, 30], [3, 2]), spec))
    first = batches[0]
    assert [(e.request, e.context, e.tokens, e.emits) for e in first] == [(0, 0, 8, False)]
    second = batches[1]  # request 0's last 2 prompt tokens (it makes token 1), then 6 of request 1's
    assert [(e.request, e.context, e.tokens, e.emits) for e in second] == [(0, 8, 2, True), (1, 0, 6, False)]
    third = batches[2]  # request 0 decodes first (its token 2 at position 10), then request 1's chunk
    assert [(e.request, e.context, e.tokens, e.decode) for e in third] == [(0, 10, 1, True), (1, 6, 7, False)]
    for entries in batches:
        assert sum(e.tokens for e in entries) <= spec.chunk
    # every request gets exactly its output tokens: decodes + the prefill's last chunk
    for request, output in enumerate([3, 2]):
        assert sum(e.emits for b in batches for e in b if e.request == request) == output
        assert sum(e.tokens for b in batches for e in b if e.request == request and not e.decode) == [10, 30][request]


def test_vllm_takes_whole_prompts_first_and_no_decodes_with_them():
    spec = SchedulerSpec(name=SchedulerName.VLLM, max_tokens=12, max_batch=2)
    states = _states(_trace([5, 6, 7], [2, 2, 2]), spec)
    states.arrive(3)
    first = states.next_batch(0.0)
    assert [(e.request, e.tokens) for e in first] == [(0, 5), (1, 6)]  # 2 running at most, 11 of 12 tokens
    states.complete(first, 0.0)
    second = states.next_batch(0.0)  # request 2 waits for room: decodes only
    assert [(e.request, e.decode, e.context) for e in second] == [(0, True, 5), (1, True, 6)]
    states.complete(second, 0.0)  # both finish (2 tokens each): their slots are free again
    assert len(states.free_slots) == 2 and states.done is False
    third = states.next_batch(0.0)
    assert [(e.request, e.tokens) for e in third] == [(2, 7)]


def test_a_request_in_flight_joins_no_other_batch():
    spec = SchedulerSpec(name=SchedulerName.SARATHI, chunk=64)
    states = _states(_trace([4, 4], [3, 3]), spec, p=3)
    states.arrive(1)
    first = states.next_batch(0.0)
    assert [e.request for e in first] == [0]
    states.arrive(2)
    second = states.next_batch(0.0)  # request 0 is still in flight: only the new one
    assert [e.request for e in second] == [1]
    assert states.next_batch(0.0) == []  # a third batch may fly, but every request is in one
    states.complete(first, 0.0)
    assert [(e.request, e.decode) for e in states.next_batch(0.0)] == [(0, True)]


def test_slots_bound_the_requests_running_at_once_and_the_cache_never_preempts():
    trace = _trace([3, 40, 3, 17, 9], [4, 30, 2, 8, 5])
    spec = SchedulerSpec(name=SchedulerName.ORCA, max_tokens=100, max_batch=2)
    states = _states(trace, spec)
    # every slot at the longest request (70 tokens: 5 blocks of 16), the 1% watermark on top
    assert cache_blocks(trace, 2, 16) == 12
    states.arrive(5)
    while not states.done:
        entries = states.next_batch(0.0)
        slots = [e.slot for e in entries]
        assert len(set(slots)) == len(entries) <= 2 and all(0 <= s < 2 for s in slots)
        states.complete(entries, 0.0)
    assert states.req[:, PREEMPTED].sum() == 0 and np.array_equal(states.req[:, MADE], trace.decode_tokens)


def test_profile_batches_stay_within_the_cache_and_the_slots():
    trace = _trace([20, 100], [8, 30])
    slots = 2
    for entries in profile_batches(trace, SchedulerSpec(chunk=64), slots):
        assert entries
        assert all(0 <= e.slot < slots for e in entries)
        assert all(e.context + e.tokens <= int(trace.total_tokens.max()) for e in entries)
        assert len({e.slot for e in entries}) == len(entries)


def test_a_request_longer_than_the_context_is_refused_before_launch():
    model = load_model("tiny")
    trace = _trace([model.context_length - 4], [8])
    with pytest.raises(PipeschedError, match=r"num_prefill_tokens=.*context is 1024"):
        check_serve_inputs(model, trace, ServeRunOptions())


def test_a_scheduler_the_real_run_does_not_run_is_refused():
    with pytest.raises(PipeschedError, match="scheduler=static"):
        check_serve_inputs(load_model("tiny"), _trace([8], [2]),
                           ServeRunOptions(scheduler=SchedulerSpec(name=SchedulerName.STATIC)))


@pytest.fixture(scope="module")
def served():
    pytest.importorskip("torch")
    trace = _trace([12, 40, 7, 25], [6, 3, 9, 5], arrivals=[0.0, 0.02, 0.05, 0.3])
    options = ServeRunOptions(p=2, dtype="float64", scheduler=SchedulerSpec(chunk=16, max_batch=3), timeout_s=120)
    return trace, serve_run(load_model("tiny"), trace, options=options)


@pytest.mark.torch
@pytest.mark.slow
def test_a_pipelined_cached_run_makes_the_tokens_of_the_whole_model_without_a_cache(served):
    import torch

    from pipesched.runtime.serve_model import reference_tokens
    from pipesched.runtime.torch_model import torch_dtype

    trace, report = served
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(256, (int(n),), generator=generator) for n in trace.prefill_tokens]
    for request, prompt in enumerate(prompts):
        expected = reference_tokens(load_model("tiny"), prompt, int(trace.decode_tokens[request]), seed=0,
                                    dtype=torch_dtype("float64"))
        assert report.tokens[request].tolist() == expected.tolist()


@pytest.mark.torch
@pytest.mark.slow
def test_measured_times_are_in_order_and_every_token_is_timed(served):
    trace, report = served
    run = report.run
    assert run.source == "measured"
    assert np.all(trace.arrived_at <= run.scheduled_at)
    assert np.all(run.scheduled_at < run.first_token_at)
    assert np.all(run.first_token_at <= run.finished_at)
    assert np.array_equal(np.diff(run.token_offsets), trace.decode_tokens)
    for r in range(len(trace)):
        times = run.token_times[run.token_offsets[r]:run.token_offsets[r + 1]]
        assert np.all(np.diff(times) > 0)
    log = run.iterations
    for stage in range(2):  # a stage runs one iteration at a time, each batch after the one before
        rows = np.flatnonzero(log.stage == stage)
        assert np.all(log.start[rows][1:] >= log.end[rows][:-1])
        assert np.array_equal(log.batch[rows], np.arange(rows.size))
    first, second = np.flatnonzero(log.stage == 0), np.flatnonzero(log.stage == 1)
    assert np.all(log.start[second] >= log.end[first])  # stage 1 takes a batch after stage 0 sent it
    # at most p = 2 batches in flight: batch b + 2 starts on stage 0 after batch b left stage 1
    assert np.all(log.start[first][2:] >= log.end[second][:-2])
    assert np.all(run.kv.blocks[0] <= run.kv.capacity_blocks[0]) and run.kv.blocks[0][-1] == 0


# --- the check: fits, the predicted deployment, the comparison ------------------------------
ROWS = (LatencyRow(0, 1.5e-3, 4e-5, 2e-7, 6e-4, 2e-6), LatencyRow(1, 1.0e-3, 3e-5, 1e-7, 5e-4, 1e-6))


def _row_seconds(row: LatencyRow, entries) -> float:
    """The fitted form, written out: base + per prefill token + per attention unit + per
    decode + per KV token read."""
    prefill = sum(e.tokens for e in entries if not e.decode)
    attention = sum(e.tokens * (e.context + e.tokens) for e in entries if not e.decode)
    decodes = [e for e in entries if e.decode]
    return (row.base_s + row.prefill_token_s * prefill + row.prefill_attention_s * attention
            + row.decode_request_s * len(decodes) + row.kv_token_s * sum(e.context + 1 for e in decodes))


def test_the_fit_recovers_the_rows_that_made_the_profile():
    trace = _trace([20, 100, 64], [8, 30, 4])
    options = ServeRunOptions(scheduler=SchedulerSpec(chunk=64, max_batch=4))
    slots = 3
    batches = profile_batches(trace, options.scheduler, slots)
    ranks = [RankServeResult(profile=[(i, (_row_seconds(row, b),) * 3) for i, b in enumerate(batches)])
             for row in ROWS]
    for fitted, row in zip(fit_stage_rows(ranks, trace, options, slots), ROWS, strict=True):
        for name in ("base_s", "prefill_token_s", "prefill_attention_s", "decode_request_s", "kv_token_s"):
            assert getattr(fitted, name) == pytest.approx(getattr(row, name), rel=1e-6, abs=1e-12)


def test_the_link_fit_recovers_latency_and_bandwidth_on_one_clock():
    latency, bandwidth, per_token = 50e-6, 2e9, 64 * 4  # seconds, bytes/s, bytes of one token's hidden state
    sent, received = [], []
    clock = 10**9
    for tokens in (1, 16, 64, 256):
        for _ in range(3):
            clock += 10**6
            sent.append((0, tokens, clock))
            received.append((0, tokens, clock + round((latency + tokens * per_token / bandwidth) * 1e9)))
    (fit,) = fit_links([RankServeResult(link_sent=sent), RankServeResult(link_received=received)], per_token)
    assert fit.latency_s == pytest.approx(latency, rel=1e-3)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-3)


def test_one_request_alone_is_predicted_as_its_stage_times_and_sends():
    model = load_model("tiny")
    trace = _trace([40], [3])
    options = ServeRunOptions(p=2, scheduler=SchedulerSpec(chunk=64, max_batch=4))
    link = LinkFit(0, 1e-4, 1e8, (1,), (1e-4,))
    overhead = 3e-4
    deployment = predicted_deployment(model, trace, options, ROWS, (link,), cpu_overhead_s=overhead, slots=1)
    run = simulate_serving(deployment, trace)

    def send(tokens: int) -> float:
        return link.latency_s + tokens * model.hidden_size * 4 / link.bandwidth

    prefill = [BatchEntry(0, 0, 0, 40, True, False)]
    ttft = overhead + _row_seconds(ROWS[0], prefill) + send(40) + _row_seconds(ROWS[1], prefill)
    assert run.first_token_at[0] == pytest.approx(ttft, rel=1e-9)
    for step, context in enumerate((40, 41), start=1):  # each later token: one decode through both stages
        decode = [BatchEntry(0, 0, context, 1, True, True)]
        gap = overhead + _row_seconds(ROWS[0], decode) + send(1) + _row_seconds(ROWS[1], decode)
        assert run.token_times[step] - run.token_times[step - 1] == pytest.approx(gap, rel=1e-9)


def test_the_comparison_is_the_signed_relative_error_per_request():
    model = load_model("tiny")
    trace = _trace([30, 12, 50], [4, 6, 2], arrivals=[0.0, 0.001, 0.5])
    options = ServeRunOptions(p=2, scheduler=SchedulerSpec(chunk=32, max_batch=4))
    deployment = predicted_deployment(model, trace, options, ROWS, (LinkFit(0, 0.0, float("inf"), (), ()),),
                                      cpu_overhead_s=0.0, slots=3)
    measured = simulate_serving(deployment, trace)
    # a prediction 20% slower in every stage and link: every latency is 1.2 times as long
    # when the arrivals are stretched alike (same batches, same order)
    slow = dataclasses.replace(trace, arrived_at=trace.arrived_at * 1.2)
    scaled = tuple(dataclasses.replace(row, **{k: getattr(row, k) * 1.2 for k in
                                                 ("base_s", "prefill_token_s", "prefill_attention_s",
                                                  "decode_request_s", "kv_token_s")}) for row in ROWS)
    predicted = simulate_serving(predicted_deployment(model, slow, options, scaled,
                                                      (LinkFit(0, 0.0, float("inf"), (), ()),),
                                                      cpu_overhead_s=0.0, slots=3), slow)
    for metric in compare_runs(measured, predicted):
        assert metric.errors == pytest.approx(np.full(metric.errors.size, 0.2))
        assert metric.median_abs_error == pytest.approx(0.2)


@pytest.mark.torch
@pytest.mark.slow
def test_serve_check_runs_profiles_predicts_and_reports_one_json_shape():
    pytest.importorskip("torch")
    trace = _trace([24, 9, 30], [5, 7, 3], arrivals=[0.0, 0.04, 0.08])
    options = ServeRunOptions(p=2, profile_repeats=3, scheduler=SchedulerSpec(chunk=32, max_batch=2), timeout_s=120)
    report = serve_check(load_model("tiny"), trace, options=options)
    out = report.to_dict()
    assert set(out["metrics"]) == {"ttft_s", "tpot_s", "e2e_s"}
    assert [row["stage"] for row in out["latency_model"]] == [0, 1]
    assert out["passed"] == all(m["median_abs_error"] <= out["tolerance"] for m in out["metrics"].values())
    # the prediction ran the same requests to their last token
    assert np.array_equal(np.diff(report.predicted.token_offsets), trace.decode_tokens)
    run = report.measured.to_dict(per_request=True)
    assert [r["output_tokens"] for r in run["per_request"]] == trace.decode_tokens.tolist()
    assert run["p"] == 2 and run["requests"] == 3 and run["source"] == "measured"
    measured_ttft = report.measured.run.first_token_at - trace.arrived_at
    assert [r["ttft_s"] for r in run["per_request"]] == pytest.approx(measured_ttft.tolist())


def test_host_delays_find_a_hop_the_link_does_not_explain_and_no_return_in_a_simulated_run():
    model = load_model("tiny")
    trace = _trace([30, 12, 50, 8], [4, 6, 2, 5], arrivals=[0.0, 0.001, 0.02, 0.03])
    options = ServeRunOptions(p=2, scheduler=SchedulerSpec(chunk=32, max_batch=4))
    link = LinkFit(0, 5e-5, 1e9, (), ())
    hidden = model.hidden_size * 4
    plain = simulate_serving(predicted_deployment(model, trace, options, ROWS, (link,), cpu_overhead_s=2e-4,
                                                  slots=4), trace)
    none = host_delays(plain, (link,), hidden)
    assert none.hop_s[0] == pytest.approx(0.0, abs=1e-12) and none.return_s == pytest.approx(0.0, abs=1e-12)
    assert none.pickup_s[0] == pytest.approx(0.0, abs=1e-12)  # a free stage starts what is in hand at once
    slowed = simulate_serving(predicted_deployment(model, trace, options, ROWS, (link,), cpu_overhead_s=2e-4,
                                                   slots=4, hop_s=(3e-3,)), trace)
    assert host_delays(slowed, (link,), hidden).hop_s[0] == pytest.approx(3e-3, rel=1e-9)


def test_a_model_the_machine_cannot_serve_in_the_timeout_is_refused_before_launch():
    trace = _trace([512] * 4, [64] * 4)
    with pytest.raises(PipeschedError, match=r"model=gpt3-1\.3b: serving these 4 requests is expected"):
        check_serve_inputs(load_model("gpt3-1.3b"), trace, ServeRunOptions(timeout_s=1.0))
    check_serve_inputs(load_model("tiny"), trace, ServeRunOptions(timeout_s=1.0))  # tiny is far quicker


@pytest.mark.torch
@pytest.mark.slow
def test_each_measured_iteration_carries_its_model_flops(served):
    _, report = served
    log = report.run.iterations
    costs = kernel_stage_costs(load_model("tiny"), ServeRunOptions(p=2, dtype="float64",
                                                                   scheduler=SchedulerSpec(chunk=16, max_batch=3)))
    for row in range(len(log)):
        batch = int(log.batch[row])
        entries = report.ranks[0].entries[batch]
        attention = sum(e.tokens * (e.context + e.tokens) for e in entries if not e.decode)
        expected = costs[int(log.stage[row])].flops(int(log.prefill_tokens[row] + log.decodes[row]), attention,
                                                    int(log.kv_tokens[row]))
        assert log.flops[row] == pytest.approx(expected) and expected > 0


def _row_parts(row: LatencyRow, entries) -> tuple[float, float]:
    """The fitted form split by hand: (base + decodes + KV read, prefill tokens + attention)."""
    prefill = sum(e.tokens for e in entries if not e.decode)
    attention = sum(e.tokens * (e.context + e.tokens) for e in entries if not e.decode)
    decodes = [e for e in entries if e.decode]
    rest = row.base_s + row.decode_request_s * len(decodes) + row.kv_token_s * sum(e.context + 1 for e in decodes)
    return rest, row.prefill_token_s * prefill + row.prefill_attention_s * attention


def test_load_factors_are_the_runs_speed_on_each_kind_of_work_and_scale_the_rows():
    """A run whose stages did their prefill work and the rest at their own speeds against the
    rows (stage 0: 1.3 and 1.6 times, stage 1: 0.8 and 0.9) has those load factors (rank 0's
    time to form each batch, before its row, aside)."""
    model = load_model("tiny")
    trace = _trace([40, 12], [3, 2])
    options = ServeRunOptions(p=2, scheduler=SchedulerSpec(chunk=64, max_batch=4))
    link = LinkFit(0, 1e-4, 1e8, (1,), (1e-4,))
    costs = predicted_deployment(model, trace, options, ROWS, (link,), cpu_overhead_s=0.0, slots=2).instances[0].stages
    batches = [[BatchEntry(0, 0, 0, 40, True, False)],
               [BatchEntry(0, 0, 40, 1, True, True), BatchEntry(1, 1, 0, 12, True, False)],
               [BatchEntry(0, 0, 41, 1, True, True), BatchEntry(1, 1, 12, 1, True, True)],
               [BatchEntry(1, 1, 13, 1, True, True)]]
    overhead_ns = [300_000, 200_000, 250_000, 220_000]
    speeds = ((1.3, 1.6), (0.8, 0.9))
    ranks = [RankServeResult(), RankServeResult()]
    clock = 0
    for batch, entries in enumerate(batches):
        for stage, (rank, (rest, prefill)) in enumerate(zip(ranks, speeds, strict=True)):
            parts = _row_parts(ROWS[stage], entries)
            took = round((rest * parts[0] + prefill * parts[1]) * 1e9)
            clock += overhead_ns[batch] if stage == 0 else 0  # rank 0 forms the batch, then its row starts
            rank.batch.append(batch)
            rank.start_ns.append(clock)
            rank.end_ns.append(clock + took)
            clock += took + 10_000
    measured = SimpleNamespace(run=SimpleNamespace(iterations=iteration_log(ranks, batches, 0, costs)),
                               ranks=(SimpleNamespace(entries=batches),))
    for found, speed in zip(load_factors(measured, costs), speeds, strict=True):
        assert found == pytest.approx(speed, rel=1e-4)
    for row, scaled, (rest, prefill) in zip(ROWS, scaled_rows(ROWS, speeds), speeds, strict=True):
        parts = _row_parts(row, batches[1])
        assert _row_seconds(scaled, batches[1]) == pytest.approx(rest * parts[0] + prefill * parts[1], rel=1e-12)
    # a pickup wait after the link lengthens every batch of the stage behind it, by itself
    first, second = scaled_rows(ROWS, ((1.0, 1.0), (1.0, 1.0)), (2e-4,))
    assert _row_seconds(first, batches[1]) == pytest.approx(_row_seconds(ROWS[0], batches[1]), rel=1e-12)
    assert _row_seconds(second, batches[1]) == pytest.approx(_row_seconds(ROWS[1], batches[1]) + 2e-4, rel=1e-12)
