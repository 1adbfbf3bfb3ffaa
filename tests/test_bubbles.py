"""The bubble breakdown: every idle gap of every device, split into what it waited for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipesched.bubbles import BUBBLE_PARTS, bubble_breakdown
from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.metrics import offload_exposed
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.simulate import Network, simulate
from pipesched.slots import slot_table
from render_timelines import simulated


def test_breakdown_of_1f1b_by_hand() -> None:
    # 1F1B, p=2, m=3, F = 1 slot, B = 2 slots:
    #   d0: F0 0-1, F1 1-2, idle 2-4 (waits for 1B0), B0 4-6, F2 6-7, B1 7-9, idle 9-10 (waits for 1B2), B2 10-12
    #   d1: idle 0-1 (warm-up), F0 1-2, B0 2-4, F1 4-5, B1 5-7, F2 7-8, B2 8-10, idle 10-12 (cool-down)
    found = bubble_breakdown(slot_table(generate("1f1b", 2, 3)))
    assert found.device.tolist() == [0, 0, 1, 1]
    assert list(zip(found.start.tolist(), found.end.tolist(), strict=True)) == [(2, 4), (9, 10), (0, 1), (10, 12)]
    shares = dict(zip(BUBBLE_PARTS, found.totals.tolist(), strict=True))
    assert shares == {"warm-up and cool-down": 3.0, "dependency stalls": 3.0, "exposed communication": 0.0,
                      "memory waits": 0.0}
    assert found.idle == 6.0
    assert found.shares()["dependency stalls"] == 0.5


@pytest.mark.parametrize("family", ["1f1b", "zb-h1", "interleaved-1f1b"])
def test_parts_sum_to_idle_time(family: str) -> None:
    timeline = simulated(generate(family, 4, 8))
    found = bubble_breakdown(timeline)
    assert found.idle == pytest.approx(float(timeline.idle_per_device().sum()), rel=1e-9)
    assert np.allclose(found.parts.sum(axis=1), found.end - found.start)
    # communication is exposed only in gaps ended by an op whose input came by a transfer
    assert found.totals[2] > 0
    table = timeline.transfers
    flying = sum(float(table.end[t] - table.start[t]) for t in range(len(table)))
    assert found.totals[2] <= flying


def test_memory_waits_are_the_exposed_reloads() -> None:
    # 1F1B offloading stages 0 and 1 over a slow host link: backwards wait for their reloads
    schedule = offload(generate("1f1b", 4, 8), OffloadPolicy(stages=(0, 1)))
    costs = StageCosts.uniform(4, forward=1.0, backward_input=1.0, backward_weight=1.0, output_bytes=1.0,
                               activation_bytes=2.0)
    network = dataclasses.replace(Network.uniform(4, latency=0.05, bandwidth=2.0), host_bandwidth=(0.5,) * 4,
                                  host_latency=(0.0,) * 4)
    timeline = simulate(schedule, costs, network)
    found = bubble_breakdown(timeline)
    assert found.totals[3] > 0
    assert found.totals[3] == pytest.approx(float(offload_exposed(timeline).sum()))
    assert found.idle == pytest.approx(float(timeline.idle_per_device().sum()))
