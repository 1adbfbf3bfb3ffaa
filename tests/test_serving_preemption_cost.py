"""What preemption costs, part by part: the parts tile each preemption's span, save and
reload are the swapped bytes over the host link's two bandwidths (computed here from the
moves, not from the engine's sums), recompute is the recompute mode's, and a run without
preemption costs nothing."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipesched.enums import Preemption, SchedulerName
from pipesched.serving.config import Disaggregation, Instances, SchedulerSpec, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.records import PREEMPTION_PARTS
from pipesched.serving.results import serve_result
from serving_engine_helpers import HOST_LINK, Line, deployment, poisson_trace

LINE = Line(base=0.003, token=2e-5, attention=3e-10, decode=1e-5, kv=2e-7, send=1e-6)
WRITE_BANDWIDTH = HOST_LINK.bandwidth / 5  # device -> host slower than host -> device, as FlexGen measured
PP = 2


def _run(name: SchedulerName, preemption: Preemption, capacity: int = 300):
    config = ServeConfig(instances=Instances(tp=1, pp=PP, count=1),
                         scheduler=SchedulerSpec(name=name, max_batch=32, chunk=512, preemption=preemption),
                         cpu_overhead_s=0.001)
    built = dataclasses.replace(deployment(config, line=LINE, capacity_blocks=capacity),
                                host_write_bandwidth=WRITE_BANDWIDTH)
    trace = poisson_trace(150, 60.0, prompt=(100, 600), output=(20, 300), seed=3)
    return simulate_serving(built, trace)


@pytest.mark.parametrize("name", [SchedulerName.VLLM, SchedulerName.SARATHI])
@pytest.mark.parametrize("preemption", list(Preemption))
def test_the_parts_tile_each_preemption(name: SchedulerName, preemption: Preemption) -> None:
    run = _run(name, preemption)
    costs = run.preemption_s
    assert run.preemptions.sum() > 0
    assert (costs >= -1e-12).all()
    parts, total = costs[:, :len(PREEMPTION_PARTS)], costs[:, len(PREEMPTION_PARTS)]
    assert np.allclose(parts.sum(axis=1), total, rtol=1e-9, atol=1e-12)
    preempted = run.preemptions > 0
    assert (total[preempted] > 0).all() and (costs[~preempted] == 0).all()
    # a preemption lies within its request's life: its spans sum to less than its end to end
    assert (total <= run.finished_at - run.trace.arrived_at + 1e-9).all()
    save, reload, recompute = costs[:, 0], costs[:, 1], costs[:, 2]
    if preemption == Preemption.RECOMPUTE:
        assert save.sum() == 0 and reload.sum() == 0 and recompute.sum() > 0
    else:
        assert save.sum() > 0 and reload.sum() > 0


def test_save_and_reload_are_the_bytes_over_each_direction_of_the_host_link() -> None:
    run = _run(SchedulerName.VLLM, Preemption.SWAP)
    moves = run.moves
    kinds = np.array(moves.kind)
    per_device = moves.nbytes / PP  # every stage holds its layers' share of each token's cache
    save = np.zeros(len(run.trace))
    reload = np.zeros(len(run.trace))
    out, back = kinds == "swap-out", kinds == "swap-in"
    np.add.at(save, moves.request[out], HOST_LINK.latency + per_device[out] / WRITE_BANDWIDTH)
    np.add.at(reload, moves.request[back], HOST_LINK.latency + per_device[back] / HOST_LINK.bandwidth)
    assert out.sum() > 0
    assert np.allclose(run.preemption_s[:, 0], save, rtol=1e-9)
    assert np.allclose(run.preemption_s[:, 1], reload, rtol=1e-9)


def test_a_run_without_preemption_costs_nothing() -> None:
    run = _run(SchedulerName.SARATHI, Preemption.SWAP, capacity=100_000)
    assert run.preemptions.sum() == 0 and (run.preemption_s == 0).all()
    cost = serve_result(run).to_dict()["preemption_cost_s"]
    assert set(cost) == {*PREEMPTION_PARTS, "total"} and set(cost.values()) == {0.0}


def test_the_json_and_the_summary_carry_the_split(cli) -> None:
    flags = ("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "1", "--requests", "60", "--qps", "50",
             "--kv-fraction", "0.25", "--preemption", "swap", "--scheduler", "vllm", "--prompt-tokens",
             "fixed:2048", "--output-tokens", "fixed:512")
    result = cli(*flags, "--json", "--per-request")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    cost = out["preemption_cost_s"]
    assert out["preemptions"] > 0 and cost["save"] > 0 and cost["reload"] > 0
    assert cost["total"] == pytest.approx(sum(cost[name] for name in PREEMPTION_PARTS))
    per_request = sum(row["preemption_cost_s"]["total"] for row in out["per_request"])
    assert per_request == pytest.approx(cost["total"])
    text = cli(*flags).out
    assert "save" in text and "reload" in text and "recompute" in text and "queueing" in text


@pytest.mark.parametrize("preemption", list(Preemption))
def test_the_parts_tile_each_preemption_on_decode_instances(preemption: Preemption) -> None:
    config = ServeConfig(scheduler=SchedulerSpec(name=SchedulerName.SARATHI, max_batch=32, preemption=preemption),
                         disaggregate=Disaggregation(Instances(1, 1, 1), Instances(1, 2, 2)))
    trace = poisson_trace(150, 40.0, prompt=(100, 600), output=(20, 300), seed=3)
    run = simulate_serving(deployment(config, line=LINE, capacity_blocks=300), trace)
    costs = run.preemption_s
    assert run.preemptions.sum() > 0 and (costs >= -1e-12).all()
    assert np.allclose(costs[:, :len(PREEMPTION_PARTS)].sum(axis=1), costs[:, len(PREEMPTION_PARTS)], rtol=1e-9)
    assert ((costs[:, len(PREEMPTION_PARTS)] > 0) == (run.preemptions > 0)).all()
