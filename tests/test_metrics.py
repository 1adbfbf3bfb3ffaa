"""Metrics of a timeline: bubbles, throughput, MFU, exposed and hidden communication, the
critical path, peak memory."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.metrics import (
    bubble_over_work,
    bubble_per_device,
    bubble_ratio,
    communication_per_device,
    critical_path,
    iteration_microbatches,
    summarize,
    throughput,
    utilization,
)
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.simulate import Network, simulate
from pipesched.simulate.iterations import steady_state
from pipesched.slots import slot_table
from simulate_helpers import random_costs, random_valid_schedule


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5), (8, 32)])
def test_bubble_definitions_on_the_1f1b_slot_table(p, m) -> None:
    timeline = slot_table(generate("1f1b", p, m))
    assert bubble_ratio(timeline) == pytest.approx((p - 1) / (m + p - 1))
    assert np.allclose(bubble_per_device(timeline), (p - 1) / (m + p - 1))
    assert bubble_over_work(timeline) == pytest.approx((p - 1) / m)


def test_throughput_and_utilization() -> None:
    schedule = generate("gpipe", 2, 4)
    costs = StageCosts.uniform(2, forward=0.5, backward_input=0.5, backward_weight=0.5)
    timeline = simulate(schedule, costs, Network.uniform(2, latency=0.0, bandwidth=float("inf")))
    # (m + p - 1)(F + B) = 5 x 1.5 s
    assert timeline.makespan == pytest.approx(7.5)
    samples, tokens = throughput(timeline.makespan, microbatches=4, micro_batch_size=2, seq_len=100)
    assert samples == pytest.approx(8 / 7.5)
    assert tokens == pytest.approx(800 / 7.5)
    assert throughput(7.5, microbatches=4)[1] is None
    # d data-parallel pipelines: d x m x b samples per iteration
    assert throughput(7.5, microbatches=4, micro_batch_size=2, replicas=3)[0] == pytest.approx(3 * 8 / 7.5)
    assert utilization(7.5, flops_per_iteration=7.5e12, peak_flops=1e12, devices=2) == pytest.approx(0.5)
    assert utilization(7.5, flops_per_iteration=7.5e12, peak_flops=[2e12, 2e12]) == pytest.approx(0.25)


def test_iteration_microbatches_are_the_whole_microbatches_of_one_iteration() -> None:
    assert iteration_microbatches(slot_table(generate("1f1b", 4, 8))) == 8
    # a table of 4 iterations: 32 microbatches in its span, 8 per iteration of its steady state
    table = generate("pipedream", 4, 8, iterations=4)
    assert iteration_microbatches(slot_table(table)) == 32
    assert iteration_microbatches(steady_state(table, StageCosts.slots().broadcast(4)).timeline) == 8
    # Chimera's backward halving runs 2m half-size microbatches
    assert iteration_microbatches(slot_table(generate("chimera", 4, 8, backward_halving=1))) == 8


def _reference_communication(timeline, *, compute_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Exposed and hidden communication by plain interval arithmetic: the union of a
    device's transfer intervals, split by the union of its compute ops' intervals."""
    exposed, hidden = [], []
    transfers = timeline.transfers
    for device in range(timeline.num_devices):
        mine = sorted((float(s), float(e)) for s, e, a, b in zip(transfers.start, transfers.end,
                                                                  transfers.src_device, transfers.dst_device, strict=True)
                      if device in (a, b))
        merged: list[list[float]] = []
        for start, end in mine:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        busy = [(float(s), float(e)) for s, e, d, c in zip(timeline.op_start, timeline.op_end, timeline.op_device,
                                                           timeline.on_compute, strict=True)
                if d == device and (c or not compute_only)]
        overlap = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in merged for s2, e2 in _union(busy))
        hidden.append(overlap)
        exposed.append(sum(e - s for s, e in merged) - overlap)
    return np.array(exposed), np.array(hidden)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def test_exposed_and_hidden_communication_by_hand() -> None:
    # GPipe on 2 devices, F = B = 1 per op, each transfer 0.5 s
    schedule = generate("gpipe", 2, 2)
    costs = StageCosts.uniform(2, forward=1.0, backward_input=0.5, backward_weight=0.5, output_bytes=1.0)
    timeline = simulate(schedule, costs, Network.uniform(2, latency=0.0, bandwidth=2.0))
    exposed, hidden = communication_per_device(timeline)
    # device 0: act0 [1, 1.5] during F(0,1) (hidden), act1 [2, 2.5] idle (exposed),
    # grad0 [4.5, 5] idle (exposed), grad1 [5.5, 6] during B(0,0) (hidden);
    # device 1: act0 idle, act1 during F(1,0), grad0 during B(1,1), grad1 after its last op
    assert timeline.transfers.start.tolist() == [1.0, 2.0, 4.5, 5.5]
    assert hidden[0] == pytest.approx(1.0) and exposed[0] == pytest.approx(1.0)
    assert hidden[1] == pytest.approx(1.0) and exposed[1] == pytest.approx(1.0)
    ref_exposed, ref_hidden = _reference_communication(timeline)
    assert np.allclose(exposed, ref_exposed) and np.allclose(hidden, ref_hidden)


def test_offloads_neither_hide_nor_expose_communication() -> None:
    # 1F1B offloading stage 0: the host link's offloads and reloads run beside the compute
    # stream; communication is split by the compute ops alone, and exposed is never negative
    schedule = offload(generate("1f1b", 4, 8), OffloadPolicy(stages=(0, 1)))
    costs = dataclasses.replace(StageCosts.uniform(4, forward=1.0, backward_input=1.0, backward_weight=1.0,
                                                   output_bytes=1.0, activation_bytes=2.0))
    network = Network.uniform(4, latency=0.05, bandwidth=2.0)
    network = dataclasses.replace(network, host_bandwidth=(1.0,) * 4, host_latency=(0.0,) * 4)
    timeline = simulate(schedule, costs, network)
    assert (~timeline.on_compute).any()
    exposed, hidden = communication_per_device(timeline)
    ref_exposed, ref_hidden = _reference_communication(timeline, compute_only=True)
    assert np.all(exposed >= 0.0)
    assert np.allclose(exposed, ref_exposed) and np.allclose(hidden, ref_hidden)


@pytest.mark.parametrize("seed", range(6))
def test_communication_split_matches_interval_arithmetic(seed) -> None:
    family = ["1f1b", "zb-v", "chimera"][seed % 3]
    schedule = random_valid_schedule(generate(family, 4, 8), seed)
    costs = random_costs(schedule.num_stages, seed)
    timeline = simulate(schedule, costs, Network.uniform(4, latency=0.05, bandwidth=2.0))
    exposed, hidden = communication_per_device(timeline)
    ref_exposed, ref_hidden = _reference_communication(timeline)
    assert np.allclose(exposed, ref_exposed) and np.allclose(hidden, ref_hidden)
    assert np.all(exposed >= -1e-12) and np.all(hidden >= -1e-12)


def test_critical_path_of_a_slot_table() -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    path = critical_path(timeline)
    assert not path.is_transfer.any()
    assert timeline.op_start[path.row[0]] == 0.0
    assert timeline.op_end[path.row[-1]] == timeline.makespan
    assert np.array_equal(timeline.op_start[path.row[1:]], timeline.op_end[path.row[:-1]])
    assert path.compute_time(timeline) == timeline.makespan
    assert len(path.describe(timeline)) == len(path)


def test_summarize_collects_every_metric() -> None:
    schedule = generate("1f1b", 4, 8)
    costs = StageCosts.uniform(4, forward=1.0, output_bytes=1.0, activation_bytes=2.0)
    timeline = simulate(schedule, costs, Network.uniform(4, latency=0.1, bandwidth=10.0), memory_capacity=[7.0] * 4)
    metrics = summarize(timeline, micro_batch_size=1, seq_len=10, flops_per_iteration=1.0, peak_flops=1.0)
    assert metrics.iteration_time == timeline.makespan
    assert metrics.peak_memory == (8.0, 6.0, 4.0, 2.0)
    assert metrics.out_of_memory == (True, False, False, False)
    assert metrics.critical_path_transfers > 0
    assert metrics.critical_path_compute + metrics.critical_path_comm == pytest.approx(timeline.makespan)
    assert metrics.throughput_tokens_per_s == pytest.approx(10 * 8 / timeline.makespan)
    assert sum(metrics.exposed_comm) > 0
    json.dumps(metrics.to_dict())
    table = summarize(slot_table(schedule))
    assert table.unit == "slot" and table.throughput_samples_per_s is None and table.peak_memory is None


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_mfu_counts_model_flops_and_hfu_the_recompute(cli, recompute) -> None:
    # MFU as PaLM and Megatron-LM define it: 6 x (matmul parameters) + 12 L s h per token
    # (attention scores and context, forward and backward), no recompute, over the
    # pipeline's p x t devices' peak; HFU adds the forward the backward redoes
    from pipesched.model import load_cluster, load_model

    p, m, t, s = 4, 8, 2, 4096
    result = cli("simulate", "1f1b", "-p", str(p), "-m", str(m), "--model", "llama3-8b", "--cluster", "1x8-h100",
                 "-t", str(t), "--recompute", recompute, "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    model = load_model("llama3-8b")
    h, depth, f, vocab = model.hidden_size, model.num_layers, model.ffn_hidden_size, model.vocab_size
    kv = h // model.num_heads * model.num_kv_heads
    block_params = 2 * h * h + 2 * h * kv + 3 * h * f  # q, o; k, v; gated MLP
    attention_forward = 4 * s * h  # per token per layer: scores and context
    per_token = 6 * (depth * block_params + h * vocab) + 3 * depth * attention_forward
    peak = load_cluster("1x8-h100").devices[0].peak_flops
    capacity = data["iteration_time_s"] * p * t * peak
    assert data["mfu"] == pytest.approx(m * s * per_token / capacity, rel=1e-9)
    redone = {"none": 0.0, "selective": depth * attention_forward,
              "full": depth * (2 * block_params + attention_forward)}[recompute]
    assert data["hfu"] == pytest.approx(m * s * (per_token + redone) / capacity, rel=1e-9)
    if recompute == "none":
        assert data["hfu"] == pytest.approx(data["mfu"])
