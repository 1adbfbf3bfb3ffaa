"""The memory tiers below a device: capacities and moves, against hand arithmetic."""

from __future__ import annotations

import pytest

from pipesched.enums import Tier
from pipesched.errors import PipeschedError
from pipesched.model.hardware import DeviceSpec
from pipesched.model.tiers import TIERS, move_seconds, tier_capacity

GB = 1e9


def _device(**tiers: float) -> DeviceSpec:
    return DeviceSpec("t", 1e14, 16 * GB, 300 * GB, **tiers)


def test_moves_take_bytes_over_the_links_bandwidth_each_way() -> None:
    d = _device(host_bandwidth=12.9 * GB, host_write_bandwidth=4.8 * GB, host_memory_bytes=200 * GB,
                disk_read_bandwidth=0.47 * GB, disk_write_bandwidth=0.3 * GB, disk_bytes=1500 * GB)
    assert move_seconds(d, 12.9 * GB, Tier.HOST, Tier.DEVICE) == pytest.approx(1.0)
    assert move_seconds(d, 4.8 * GB, Tier.DEVICE, Tier.HOST) == pytest.approx(1.0)
    # disk -> device goes through host memory: the slower of its two links sets the rate
    assert move_seconds(d, 0.47 * GB, Tier.DISK, Tier.DEVICE) == pytest.approx(1.0)
    assert move_seconds(d, 0.3 * GB, Tier.DEVICE, Tier.DISK) == pytest.approx(1.0)
    assert all(move_seconds(d, GB, tier, tier) == 0 for tier in TIERS)
    assert [tier_capacity(d, tier) for tier in TIERS] == [16 * GB, 200 * GB, 1500 * GB]


def test_the_way_back_defaults_to_the_way_there_and_a_missing_tier_is_refused() -> None:
    d = _device(host_bandwidth=10 * GB, host_memory_bytes=100 * GB)
    assert move_seconds(d, 10 * GB, Tier.DEVICE, Tier.HOST) == pytest.approx(1.0)
    assert tier_capacity(d, Tier.DISK) == 0
    with pytest.raises(PipeschedError, match="no disk tier"):
        move_seconds(d, GB, Tier.DISK, Tier.DEVICE)
