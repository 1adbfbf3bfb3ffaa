"""Metrics of a timeline: bubbles, throughput, MFU, exposed and hidden communication, the
critical path, peak memory."""

from __future__ import annotations

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
    mfu,
    summarize,
    throughput,
)
from pipesched.simulate import Network, simulate
from pipesched.slot_table import slot_table
from simulate_helpers import random_costs, random_valid_schedule


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5), (8, 32)])
def test_bubble_definitions_on_the_1f1b_slot_table(p, m) -> None:
    timeline = slot_table(generate("1f1b", p, m))
    assert bubble_ratio(timeline) == pytest.approx((p - 1) / (m + p - 1))
    assert np.allclose(bubble_per_device(timeline), (p - 1) / (m + p - 1))
    assert bubble_over_work(timeline) == pytest.approx((p - 1) / m)


def test_throughput_and_mfu() -> None:
    schedule = generate("gpipe", 2, 4)
    costs = StageCosts.uniform(2, forward=0.5, backward_input=0.5, backward_weight=0.5)
    timeline = simulate(schedule, costs, Network.uniform(2, latency=0.0, bandwidth=float("inf")))
    # (m + p - 1)(F + B) = 5 x 1.5 s
    assert timeline.makespan == pytest.approx(7.5)
    samples, tokens = throughput(timeline, micro_batch_size=2, seq_len=100)
    assert samples == pytest.approx(8 / 7.5)
    assert tokens == pytest.approx(800 / 7.5)
    assert throughput(timeline)[1] is None
    assert mfu(timeline, flops_per_iteration=7.5e12, peak_flops=1e12) == pytest.approx(0.5)
    assert mfu(timeline, flops_per_iteration=7.5e12, peak_flops=[2e12, 2e12]) == pytest.approx(0.25)


def _reference_communication(timeline) -> tuple[np.ndarray, np.ndarray]:
    """Exposed and hidden communication by plain interval arithmetic."""
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
        busy = [(float(s), float(e)) for s, e, d in zip(timeline.op_start, timeline.op_end, timeline.op_device, strict=True)
                if d == device]
        overlap = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in merged for s2, e2 in busy)
        hidden.append(overlap)
        exposed.append(sum(e - s for s, e in merged) - overlap)
    return np.array(exposed), np.array(hidden)


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
