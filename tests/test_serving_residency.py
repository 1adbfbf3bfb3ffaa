"""Weights streamed each iteration (``--resident``): the closed form against the load and
compute recurrence it states, the load time against bytes over the host link, the memory it
frees for the KV cache, and throughput against residency; bad residencies as one error line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.enums import Tier
from pipesched.errors import PipeschedError
from pipesched.model import load_cluster, load_model
from pipesched.model.inference import STAGING_BLOCKS, streamed_seconds
from pipesched.search.serving import ServingSpace
from pipesched.serving.config import Instances, SchedulerSpec, ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.results import serve_result
from serving_engine_helpers import poisson_trace

MODEL, CLUSTER = "llama3-8b", "1x8-h100"
SMALL = ("--model", MODEL, "-t", "1", "-p", "1", "--requests", "12", "--qps", "4", "--prompt-tokens", "fixed:128",
         "--output-tokens", "fixed:16")


def _recurrence(resident_s: float, per_block: float, streamed: int, load_s: float) -> float:
    """The iteration as events: the resident blocks compute first; streamed block k's load
    waits for the link and for a free staging slot (block k - 2's compute over), its compute
    for block k - 1's and its own load."""
    load_end = [0.0] * (streamed + 1)
    compute_end = [resident_s] + [0.0] * streamed
    for k in range(1, streamed + 1):
        slot = compute_end[k - STAGING_BLOCKS] if k > STAGING_BLOCKS else 0.0
        load_end[k] = max(load_end[k - 1], slot) + load_s
        compute_end[k] = max(compute_end[k - 1], load_end[k]) + per_block
    return compute_end[-1]


def test_the_closed_form_is_the_load_and_compute_recurrence() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        blocks = int(rng.integers(1, 40))
        streamed = int(rng.integers(0, blocks + 1))
        compute = float(rng.uniform(0.001, 1.0))
        load = float(rng.uniform(0.0, 0.2)) * float(rng.choice([0.1, 1.0, 5.0]))
        per_block = compute / blocks
        expected = _recurrence(compute - streamed * per_block, per_block, streamed, load)
        assert streamed_seconds(compute, blocks, streamed, load) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_streaming_is_never_faster_than_compute_nor_slower_than_back_to_back() -> None:
    for load in (0.0, 0.01, 0.1, 1.0):
        for streamed in range(11):
            seconds = streamed_seconds(1.0, 10, streamed, load)
            assert 1.0 <= seconds <= 1.0 + streamed * load + 1e-12


def _deployment(resident: float, *, cluster=None, stages: int = 1, source: Tier = Tier.HOST):
    config = ServeConfig(instances=Instances(tp=1, pp=stages, count=1),
                         scheduler=SchedulerSpec(max_batch=16, chunk=256), resident=resident, stream_from=source)
    return build_deployment(config, load_model(MODEL), cluster or load_cluster(CLUSTER))


def test_a_streamed_block_loads_its_bytes_over_the_host_link() -> None:
    model, device = load_model(MODEL), load_cluster(CLUSTER).devices[0]
    # one block's parameters by hand: attention q, o (h x h), k, v (h x kv heads x head dim), the
    # gated MLP's three (h x ffn) matrices and two norms, bf16
    h, kv = model.hidden_size, model.num_kv_heads * model.kv_channels
    params = 2 * h * h + 2 * h * kv + 3 * h * model.ffn_hidden_size + 2 * h
    stages = _deployment(0.25, stages=2).instances[0].stages
    assert sum(stage.blocks for stage in stages) == model.num_layers
    stage = stages[0]
    assert stage.streamed_blocks == stage.blocks - stage.blocks // 4
    assert stage.block_weight_bytes == pytest.approx(2.0 * params, rel=1e-3)
    assert stage.block_load_s == pytest.approx(2.0 * params / device.host_bandwidth, rel=1e-3)


def test_full_residency_is_the_plain_deployment() -> None:
    plain = build_deployment(ServeConfig(instances=Instances(tp=1, pp=1, count=1),
                                         scheduler=SchedulerSpec(max_batch=16, chunk=256)),
                             load_model(MODEL), load_cluster(CLUSTER))
    full = _deployment(1.0)
    trace = poisson_trace(10, 4.0, prompt=(64, 256), output=(4, 16))
    a, b = simulate_serving(plain, trace), simulate_serving(full, trace)
    assert np.array_equal(a.token_times, b.token_times)
    assert plain.instances[0].kv_capacity_blocks == full.instances[0].kv_capacity_blocks


def test_streamed_blocks_free_their_memory_for_the_kv_cache() -> None:
    full, quarter = _deployment(1.0).instances[0], _deployment(0.25).instances[0]
    stage = quarter.stages[0]
    freed = (stage.streamed_blocks - STAGING_BLOCKS) * stage.block_weight_bytes
    block_bytes = stage.kv_bytes_per_token * 16  # the default block of 16 tokens
    extra = quarter.kv_capacity_blocks - full.kv_capacity_blocks
    assert math.floor(freed / block_bytes) - 1 <= extra <= math.ceil(freed / block_bytes) + 1


def test_throughput_is_monotone_in_residency() -> None:
    trace = poisson_trace(12, 2.0, prompt=(64, 256), output=(8, 24), seed=1)
    throughput = [serve_result(simulate_serving(_deployment(f), trace)).throughput_tokens_per_s
                  for f in (0.125, 0.25, 0.5, 0.75, 1.0)]
    assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(throughput))
    assert throughput[0] < throughput[-1]


def test_a_faster_host_link_never_makes_a_run_slower() -> None:
    cluster = load_cluster(CLUSTER)
    device = cluster.devices[0]
    fast = dataclasses.replace(cluster, devices=tuple(dataclasses.replace(d, host_bandwidth=2 * device.host_bandwidth)
                                                      for d in cluster.devices))
    trace = poisson_trace(10, 4.0, prompt=(64, 256), output=(4, 16), seed=2)
    slow_run = simulate_serving(_deployment(0.5), trace)
    fast_run = simulate_serving(_deployment(0.5, cluster=fast), trace)
    assert (fast_run.finished_at <= slow_run.finished_at + 1e-12).all()
    assert fast_run.finished_at.max() < slow_run.finished_at.max()


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, math.nan])
def test_a_residency_outside_zero_one_is_refused(bad: float) -> None:
    with pytest.raises(PipeschedError, match="resident="):
        ServeConfig(resident=bad)


def test_a_missing_disk_tier_is_one_error() -> None:
    with pytest.raises(PipeschedError, match="disk"):
        _deployment(0.5, source=Tier.DISK)


@pytest.mark.slow
def test_serve_simulate_takes_resident(cli) -> None:
    plain = json.loads(cli("serve", "simulate", *SMALL, "--json").out)
    half = cli("serve", "simulate", *SMALL, "--resident", "0.5", "--json")
    assert half.code == 0, half.err
    streamed = json.loads(half.out)
    assert streamed["throughput_tokens_per_s"] < plain["throughput_tokens_per_s"]


@pytest.mark.parametrize("flags,fragment", [(("--resident", "0"), "resident=0"),
                                            (("--resident", "1.25"), "resident=1.25"),
                                            (("--resident", "0.5", "--resident-from", "tape"), "resident-from=tape"),
                                            (("--resident", "0.5", "--resident-from", "disk"), "disk")])
def test_bad_residency_is_one_error_line(cli, flags, fragment) -> None:
    assert_one_line_error(cli("serve", "simulate", *SMALL, *flags), fragment)


@pytest.mark.slow
def test_serve_residency_prints_and_draws_a_curve_per_model(cli, tmp_path) -> None:
    png, html = tmp_path / "curve.png", tmp_path / "curve.html"
    result = cli("serve", "residency", *SMALL, "--models", "llama3-8b,llama3-70b", "--fractions", "1,0.25,0.5",
                 "--png", str(png), "--html", str(html), "--json")
    assert result.code == 0, result.err
    rows = json.loads(result.out)["rows"]
    assert [(row["model"], row["resident"]) for row in rows] == [
        (model, share) for model in ("llama3-8b", "llama3-70b") for share in (0.25, 0.5, 1.0)]
    small = [row["throughput_tokens_per_s"] for row in rows if row["model"] == "llama3-8b"]
    assert small == sorted(small) and small[0] < small[-1]
    # 70B does not fit one H100 whole: its curve starts where it does
    big = {row["resident"]: row for row in rows if row["model"] == "llama3-70b"}
    assert big[0.25]["fits"] and not big[1.0]["fits"] and big[1.0]["throughput_tokens_per_s"] is None
    assert png.read_bytes().startswith(b"\x89PNG") and 'id="residency-curve"' in html.read_text()
    text = cli("serve", "residency", *SMALL, "--fractions", "0.5,1")
    assert text.code == 0 and "llama3-8b" in text.out and "tokens/s" in text.out


@pytest.mark.parametrize("flags,fragment", [(("--fractions", "0.5,2"), "fractions=2"),
                                            (("--fractions", "half"), "fractions="),
                                            (("--resident", "0.5"), "resident=0.5")])
def test_serve_residency_refuses_bad_fractions(cli, flags, fragment) -> None:
    assert_one_line_error(cli("serve", "residency", *SMALL, *flags), fragment)


@pytest.mark.slow
def test_serve_search_and_capacity_take_resident(cli, tmp_path) -> None:
    # a TPOT of 0.1 s: met with every layer on the GPU (about 8 ms a token), not with half of
    # them streamed over PCIe every iteration (about 0.13 s)
    assert cli("serve", "capacity", *SMALL, "--json").code == 0
    assert_one_line_error(cli("serve", "capacity", *SMALL, "--resident", "0.5"), "slo_tpot=0.1")
    search = ("serve", "search", *SMALL[:2], *SMALL[6:], "-t", "1", "--pipeline", "1", "--replicas", "1",
              "--scheduler", "sarathi", "--db", str(tmp_path / "serve.sqlite"), "--workers", "1")
    assert_one_line_error(cli(*search, "--resident", "0.5"), "slo_tpot=0.1")
    space = ServingSpace(model=MODEL, tensor_parallel=(1,), pipeline=(1, 2), replicas=(1,), resident=(0.25,),
                         resident_from="host")
    assert {point.config.resident for point in space.points()} == {0.25}
