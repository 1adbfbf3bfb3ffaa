"""Collectives as NCCL runs them (pipesched.model.collectives): the laws of the model, its
closed form written out by hand, the choice of algorithm and protocol, the calibration in
cluster files and their bad input."""

from __future__ import annotations

import dataclasses
import doctest
import itertools
import json
import math
import re

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.enums import Collective
from pipesched.errors import PipeschedError
from pipesched.model import collectives, load_cluster, load_device, parse_cluster
from pipesched.model.clusters import INFINIBAND_400G, NVLINK, homogeneous_cluster
from pipesched.model.collectives import (
    INFINIBAND_NDR,
    NVLINK_H100,
    CollectiveLevel,
    collective_choice,
    collective_seconds,
    group_levels,
    link_levels,
)
from pipesched.model.hardware import CollectiveCalibration

SIZES = [2.0**k for k in range(4, 34)]  # 16 B to 8 GiB
H100 = load_device("h100-sxm")


def _nvlink(ranks: int) -> tuple[CollectiveLevel, ...]:
    return link_levels(NVLINK, ranks)


def _two_nodes(per_node: int = 8) -> tuple[CollectiveLevel, ...]:
    cluster = homogeneous_cluster(H100, 2 * per_node, devices_per_node=per_node)
    return group_levels(cluster, tuple(range(2 * per_node)))


def _busbw(calibration: CollectiveCalibration, bandwidth: float, protocol: int, nbytes: float) -> float:
    ramp = calibration.ramp_bytes
    return bandwidth * calibration.efficiency * calibration.protocol_bandwidth[protocol] * (
        (nbytes + ramp) / (nbytes + 2 * ramp))


def test_the_doctests_run():
    assert doctest.testmod(collectives).failed == 0


@pytest.mark.parametrize("kind", list(Collective))
@pytest.mark.parametrize("levels", [_nvlink(2), _nvlink(8), _two_nodes(), _two_nodes(2)], ids=["2", "8", "2x8", "2x2"])
def test_time_never_falls_as_the_message_grows(kind, levels):
    times = [collective_seconds(kind, size, levels) for size in SIZES]
    assert all(later >= earlier for earlier, later in itertools.pairwise(times))


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_the_achieved_bus_bandwidth_ramps_with_the_message_to_its_peak(ranks):
    """busbw = 2 (n-1) / n x B / t grows with B and tends to the link's calibrated peak
    (370 GB/s of NVLink 4's 450; NVLink SHARP's 273 GB/s of algorithm bandwidth on 8)."""
    levels = _nvlink(ranks)
    factor = 2 * (ranks - 1) / ranks
    busbw = [factor * size / collective_seconds(Collective.ALL_REDUCE, size, levels) for size in SIZES]
    assert all(later >= earlier * (1 - 1e-9) for earlier, later in itertools.pairwise(busbw))
    peak = 450e9 * NVLINK_H100.efficiency
    if ranks >= NVLINK_H100.switch_min_ranks:
        peak = max(peak, factor * 450e9 * NVLINK_H100.switch_bandwidth)
    huge = 2.0**45
    assert factor * huge / collective_seconds(Collective.ALL_REDUCE, huge, levels) == pytest.approx(peak, rel=1e-3)
    assert busbw[-1] < peak


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_small_messages_cost_the_ll_protocol_latency(ranks):
    """A 16-byte all-reduce: NCCL's LL ring, one launch and 2 (n-1) steps of its latency."""
    choice = collective_choice(Collective.ALL_REDUCE, 16, _nvlink(ranks))
    assert (choice.algorithm, choice.protocol) == ("ring", "LL")
    latency = NVLINK_H100.base_latency[0] + 2 * (ranks - 1) * NVLINK_H100.step_latency[0]
    assert choice.seconds == pytest.approx(latency, rel=1e-3)


def test_the_closed_form_by_hand():
    """4 ranks, 2 MiB: Simple's ring, base + 6 steps + 6/4 of the bytes at the ramped bus
    bandwidth (benchmarks/data: NCCL measured 26 us on 4 H100s)."""
    nbytes, c = 2 * 2**20, NVLINK_H100
    expected = c.base_latency[2] + 6 * c.step_latency[2] + 6 / 4 * nbytes / _busbw(c, 450e9, 2, nbytes)
    choice = collective_choice(Collective.ALL_REDUCE, nbytes, _nvlink(4))
    assert (choice.algorithm, choice.protocol) == ("ring", "Simple")
    assert choice.seconds == pytest.approx(expected, rel=1e-12)
    assert choice.seconds == pytest.approx(26e-6, rel=0.2)


def test_eight_ranks_reduce_large_buffers_in_the_switch():
    """NVLink SHARP: Simple's launch plus the switch's latency, the buffer once at the
    switch's algorithm bandwidth, whatever the group size."""
    nbytes, c = 2.0**32, NVLINK_H100
    ramp = c.switch_ramp_bytes
    expected = c.base_latency[2] + c.switch_latency + nbytes / (450e9 * c.switch_bandwidth
                                                               * (nbytes + ramp) / (nbytes + 2 * ramp))
    choice = collective_choice(Collective.ALL_REDUCE, nbytes, _nvlink(8))
    assert choice.algorithm == "switch" and choice.seconds == pytest.approx(expected, rel=1e-12)
    # not on 4 ranks, nor on an NVSwitch that does not reduce (A100)
    assert collective_choice(Collective.ALL_REDUCE, nbytes, _nvlink(4)).algorithm == "ring"
    a100 = load_cluster("2x8-a100")
    assert collective_choice(Collective.ALL_REDUCE, nbytes, group_levels(a100, tuple(range(8)))).algorithm == "ring"


@pytest.mark.parametrize("levels", [_nvlink(8), _two_nodes()], ids=["node", "two nodes"])
def test_reduce_scatter_and_all_gather_make_an_all_reduce_plus_one_launch(levels):
    """A ring all-reduce is a reduce-scatter then an all-gather in one kernel: run apart they
    cost one launch more (at 4 GiB, where every one runs Simple's ring)."""
    nbytes = 2.0**32
    choices = [collective_choice(kind, nbytes, levels)
               for kind in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)]
    if levels[-1].calibration.switch_bandwidth > 0:  # without the switch's own algorithm
        levels = tuple(dataclasses.replace(level, calibration=dataclasses.replace(level.calibration,
                                                                                  switch_bandwidth=0))
                       for level in levels)
        choices[0] = collective_choice(Collective.ALL_REDUCE, nbytes, levels)
    assert {(c.algorithm, c.protocol) for c in choices} == {("ring", "Simple")}
    launch = max(level.calibration.base_latency[2] for level in levels)
    assert choices[1].seconds + choices[2].seconds == pytest.approx(choices[0].seconds + launch, rel=1e-12)


def test_plain_levels_keep_the_plain_ring():
    """Without a calibration every formula is the alpha-beta ring: all-gather +
    reduce-scatter = all-reduce."""
    ring = (CollectiveLevel(4, 1e-5, 1e9),)
    rs = collective_seconds(Collective.REDUCE_SCATTER, 8e9, ring)
    assert rs == pytest.approx(3 / 4 * 8 + 3e-5)
    assert rs + collective_seconds(Collective.ALL_GATHER, 8e9, ring) == pytest.approx(
        collective_seconds(Collective.ALL_REDUCE, 8e9, ring))
    assert collective_choice(Collective.ALL_REDUCE, 8e9, ring).protocol == ""


@pytest.mark.parametrize("kind", list(Collective))
def test_across_nodes_is_never_faster_than_inside_one(kind):
    inside = _nvlink(8)
    for per_node in (1, 2, 4):
        cluster = homogeneous_cluster(H100, 8, devices_per_node=per_node)
        across = group_levels(cluster, tuple(range(8)))
        assert len(across) == (2 if per_node > 1 else 1)
        for size in SIZES[::3]:
            assert collective_seconds(kind, size, across) >= collective_seconds(kind, size, inside) * (1 - 1e-12)


def test_the_tree_runs_across_many_nodes_for_mid_messages():
    """One rank on each of 16 nodes: NCCL's tree (2 log2 16 steps) beats the ring's 30 steps
    of latency at small messages; the ring's bandwidth wins at large ones."""
    cluster = homogeneous_cluster(H100, 16, devices_per_node=1)
    levels = group_levels(cluster, tuple(range(16)))
    assert levels[-1].calibration.fabric == "infiniband"
    assert collective_choice(Collective.ALL_REDUCE, 2**10, levels).algorithm == "tree"
    assert collective_choice(Collective.ALL_REDUCE, 2**32, levels).algorithm == "ring"
    tree = collective_choice(Collective.ALL_REDUCE, 2**10, levels)
    c, bandwidth = INFINIBAND_NDR, levels[-1].bandwidth
    expected = c.base_latency[0] + 2 * math.log2(16) * c.step_latency[0] + 2**10 / (
        collectives.TREE_SHARE * bandwidth * c.efficiency * c.protocol_bandwidth[0])
    assert tree.protocol == "LL" and tree.seconds == pytest.approx(expected, rel=1e-12)


def test_an_all_to_all_moves_the_others_share():
    """Each of g ranks keeps 1 / g of its dispatch and sends the rest; a doubled buffer at
    large sizes costs twice its bytes' time."""
    levels = _nvlink(8)
    big = 2.0**33
    t1, t2 = (collective_seconds(Collective.ALL_TO_ALL, n, levels) for n in (big, 2 * big))
    share = 7 / 8 * big
    assert t2 - t1 == pytest.approx(share / _busbw(NVLINK_H100, 450e9, 2, 2 * share) * 2
                                    - share / _busbw(NVLINK_H100, 450e9, 2, share), rel=1e-9)


def test_an_all_to_all_across_nodes_goes_at_the_point_to_point_rate():
    """One rank on each of 8 nodes: a large all-to-all sends 7/8 of its buffer at the
    InfiniBand link's p2p_efficiency (not the all-reduce's efficiency), with Simple's launch,
    one step and a peer_latency for each of the 6 further peers (the sends overlap)."""
    cluster = homogeneous_cluster(H100, 8, devices_per_node=1)
    levels = group_levels(cluster, tuple(range(8)))
    c, bandwidth, big = INFINIBAND_NDR, levels[-1].bandwidth, 2.0**32
    assert c.p2p_efficiency > c.efficiency
    expected = (c.base_latency[2] + c.step_latency[2] + 6 * c.peer_latency
                + 7 / 8 * big / (bandwidth * c.p2p_efficiency))
    choice = collective_choice(Collective.ALL_TO_ALL, big, levels)
    assert (choice.algorithm, choice.protocol) == ("direct", "Simple")
    assert choice.seconds == pytest.approx(expected, rel=1e-12)
    send = collective_choice(Collective.SEND_RECV, big, levels)
    assert send.seconds == pytest.approx(c.base_latency[2] + c.step_latency[2] + big / (bandwidth * c.p2p_efficiency),
                                         rel=1e-12)


def test_an_all_to_alls_latency_grows_by_the_peer_latency_not_a_step_per_peer():
    """Sends posted at once overlap: a tiny all-to-all over 8 ranks costs 4 peer_latency
    more than over 4 (7 peers against 3); a plain (uncalibrated) link still pays a step per
    peer."""
    calibration = dataclasses.replace(NVLINK_H100, peer_latency=1e-6)
    tiny = 16.0
    small, large = (collective_seconds(Collective.ALL_TO_ALL, tiny, (CollectiveLevel(n, 3e-6, 450e9, calibration),))
                    for n in (4, 8))
    assert large - small == pytest.approx(4 * 1e-6, rel=1e-3)
    plain = [collective_seconds(Collective.ALL_TO_ALL, 0.0, (CollectiveLevel(n, 3e-6, 450e9),)) for n in (4, 8)]
    assert plain == pytest.approx([3 * 3e-6, 7 * 3e-6], rel=1e-12)


def test_p2p_efficiency_zero_means_the_collectives_efficiency():
    same = dataclasses.replace(NVLINK_H100, p2p_efficiency=0.0)
    explicit = dataclasses.replace(NVLINK_H100, p2p_efficiency=NVLINK_H100.efficiency)
    for calibration in (same, explicit):
        assert calibration.point_to_point_efficiency == NVLINK_H100.efficiency
    times = [collective_seconds(Collective.ALL_TO_ALL, 2.0**30, (CollectiveLevel(8, 3e-6, 450e9, c),))
             for c in (same, explicit)]
    assert times[0] == times[1]


def test_arrays_are_timed_each_with_its_own_choice():
    sizes = np.array([0.0, 16.0, 2.0**21, 2.0**32])
    for kind in Collective:
        listed = collective_seconds(kind, sizes, _nvlink(8))
        assert listed == pytest.approx([collective_seconds(kind, float(s), _nvlink(8)) for s in sizes], rel=1e-12)


def test_cluster_files_set_the_calibration():
    text = """
nodes: [{count: 2, devices_per_node: 8, device: h100-sxm}]
intra_node:
  bandwidth: 450 GB/s
  latency: 3 us
  collectives: {efficiency: 0.9, step_latency: [1 us, 2 us, 3 us], ramp: 1 MiB, switch_bandwidth: 0,
                p2p_efficiency: 0.7, peer_latency: 0.4 us}
inter_node: {bandwidth: 400 Gb/s, latency: 5 us, collectives: {fabric: ethernet, base_latency: [9 us, 9 us, 9 us]}}
"""
    cluster = parse_cluster(text)
    intra, inter = cluster.intra_node.collectives, cluster.inter_node.collectives
    assert (intra.efficiency, intra.step_latency, intra.ramp_bytes, intra.switch_bandwidth) == (
        0.9, (1e-6, 2e-6, 3e-6), 2**20, 0.0)
    assert (intra.p2p_efficiency, intra.peer_latency) == (0.7, pytest.approx(0.4e-6))
    assert intra.base_latency == NVLINK_H100.base_latency  # the rest from the H100 default
    assert inter.fabric == "ethernet" and inter.base_latency == (9e-6,) * 3
    assert inter.efficiency == INFINIBAND_NDR.efficiency
    # a file without any keeps the defaults, as the presets do
    preset = load_cluster("4x8-h100")
    assert (preset.intra_node.collectives, preset.inter_node.collectives) == (NVLINK.collectives,
                                                                             INFINIBAND_400G.collectives)


@pytest.mark.parametrize(("collectives_yaml", "fragment"), [
    ("{efficiency: 1.5}", "collectives.efficiency=1.5"),
    ("{efficiency: 0}", "collectives.efficiency=0"),
    ("{step_latency: [1 us, 2 us]}", "intra_node.collectives.step_latency"),
    ("{step_latency: [1 us, 2 us, -3 us]}", "collectives.step_latency"),
    ("{ramp: -1}", "intra_node.collectives.ramp"),
    ("{switch_min_ranks: 1}", "collectives.switch_min_ranks=1"),
    ("{protocol_bandwidth: [0.5, 2, 1]}", "collectives.protocol_bandwidth"),
    ("{p2p_efficiency: 1.2}", "collectives.p2p_efficiency=1.2"),
    ("{peer_latency: -1 us}", "intra_node.collectives.peer_latency"),
    ("{speed: 3}", "intra_node.collectives.speed"),
    ("[1, 2]", "intra_node.collectives"),
])
def test_bad_calibrations_name_the_field(tmp_path, collectives_yaml, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(f"""
nodes: [{{devices_per_node: 8, device: h100-sxm}}]
intra_node: {{bandwidth: 450 GB/s, latency: 3 us, collectives: {collectives_yaml}}}
inter_node: {{bandwidth: 400 Gb/s, latency: 5 us}}
""")
    with pytest.raises(PipeschedError, match=re.escape(fragment)):
        parse_cluster(path.read_text())


@pytest.mark.slow
def test_a_bad_calibration_is_one_error_line_in_a_command(cli, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""
nodes: [{devices_per_node: 8, device: h100-sxm}]
intra_node: {bandwidth: 450 GB/s, latency: 3 us, collectives: {efficiency: 1.5}}
inter_node: {bandwidth: 400 Gb/s, latency: 5 us}
""")
    result = cli("simulate", "1f1b", "-p", "2", "-m", "4", "--model", "tiny", "--cluster", str(path))
    assert_one_line_error(result, "collectives.efficiency=1.5", "must be in")


def test_costs_ops_lists_the_calibrated_collectives(cli):
    """``costs --ops`` times each tensor-parallel all-reduce with the calibrated NVLink (the
    closed form by hand) and says what NCCL runs it with."""
    result = cli("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "4", "-b", "1", "-s", "256",
                 "--ops", "--json")
    assert result.code == 0, result
    block = json.loads(result.out)["layers"][1]
    reduces = [c for c in block["collectives"] if c["forward_s"] > 0]
    assert reduces
    for row in reduces:
        nbytes, c = row["bytes"], NVLINK_H100
        p = ("LL", "LL128", "Simple").index(row["protocol"])
        expected = c.base_latency[p] + 6 * c.step_latency[p] + 6 / 4 * nbytes / _busbw(c, 450e9, p, nbytes)
        assert row["algorithm"] == "ring" and row["forward_s"] == pytest.approx(expected, rel=1e-12)
    table = cli("costs", "--model", "llama3-8b", "--device", "h100-sxm", "-t", "4", "-b", "1", "-s", "256", "--ops")
    assert "ring/Simple" in table.out or "ring/LL" in table.out


def test_the_fit_recovers_the_constants_of_the_closed_form():
    """Samples made by ``launch + steps x step + share x bytes / busbw`` (written out here
    per kind, 4 ranks) give those constants back, and the calibration made of them times
    every sample as measured."""
    launch, step, busbw, n = 12e-6, 3e-6, 40e9, 4
    terms = {Collective.ALL_REDUCE: (6, 6 / 4), Collective.ALL_GATHER: (3, 3 / 4), Collective.REDUCE_SCATTER: (3, 3 / 4),
             Collective.ALL_TO_ALL: (3, 3 / 4), Collective.SEND_RECV: (1, 1.0)}
    samples = [(kind, size, launch + steps * step + share * size / busbw)
               for kind, (steps, share) in terms.items() for size in (4096.0, 2.0**20, 2.0**24)]
    fit = collectives.fit_collectives(n, samples)
    assert (fit.launch, fit.step, fit.bus_bandwidth) == pytest.approx((launch, step, busbw), rel=1e-6)
    assert fit.median_error < 1e-9
    calibration = fit.calibration(2 * busbw)
    assert calibration.efficiency == pytest.approx(0.5)
    levels = (CollectiveLevel(n, 0.0, 2 * busbw, calibration),)
    for kind, size, seconds in samples:
        assert collective_seconds(kind, size, levels) == pytest.approx(seconds, rel=1e-6)
    with pytest.raises(PipeschedError, match="ranks=1"):
        collectives.fit_collectives(1, samples)


@pytest.mark.parametrize(("args", "fragment"), [
    (("--ranks", "1", "-o", "x.yaml"), "ranks=1"),
    (("--ranks", "2", "-o", "x.csv"), "output=x.csv"),
    (("--ranks", "2", "--sizes", "1KiB,-4", "-o", "x.yaml"), "sizes"),
    (("--ranks", "2", "--sizes", "8GiB", "-o", "x.yaml"), "sizes"),
    (("--ranks", "2", "--link-bandwidth", "fast", "-o", "x.yaml"), "link_bandwidth"),
])
def test_profile_collectives_refuses_bad_input_before_launching(cli, tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(cli("profile", "--collectives", *args), fragment)
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
def test_profile_collectives_on_two_gloo_ranks_writes_a_link_the_loader_reads(cli, tmp_path):
    """Two gloo ranks, tiny messages: the YAML written is a cluster file's intra_node link,
    and loaded it times each measured collective as the fit does."""
    pytest.importorskip("torch")
    out = tmp_path / "link.yaml"
    result = cli("profile", "--collectives", "--ranks", "2", "--sizes", "1KiB,16KiB", "--repeats", "2",
                 "--warmup", "1", "-o", str(out), "--json")
    assert result.code == 0, result
    report = json.loads(result.out)
    assert report["backend"] == "gloo" and report["ranks"] == 2
    assert {row["kind"] for row in report["samples"]} | set(report["missing"]) == {k.value for k in Collective}
    text = "nodes: [{devices_per_node: 2, device: h100-sxm}]\ninter_node: {bandwidth: 400 Gb/s}\n" + out.read_text()
    cluster = parse_cluster(text)
    calibration = cluster.intra_node.collectives
    assert calibration.base_latency == pytest.approx((report["launch_s"],) * 3)
    assert calibration.step_latency == pytest.approx((report["step_s"],) * 3)
    assert cluster.intra_node.bandwidth * calibration.efficiency == pytest.approx(report["bus_bandwidth_bytes_per_s"])
    levels = group_levels(cluster, (0, 1))
    for row in report["samples"]:
        steps, share = collectives._ring_terms(Collective(row["kind"]), 2)
        expected = report["launch_s"] + steps * report["step_s"] + share * row["bytes"] / report[
            "bus_bandwidth_bytes_per_s"]
        assert collective_seconds(Collective(row["kind"]), row["bytes"], levels) == pytest.approx(expected, rel=1e-9)


def test_a_fit_of_latency_bound_samples_keeps_a_finite_bandwidth():
    """Times that do not grow with the bytes (tiny messages, noise) give no slope: the
    bandwidth is the fastest throughput seen, share x bytes / seconds."""
    samples = [(Collective.ALL_REDUCE, 1024.0, 2e-5), (Collective.ALL_REDUCE, 16384.0, 1.9e-5),
               (Collective.ALL_GATHER, 1024.0, 1.5e-5), (Collective.ALL_GATHER, 16384.0, 1.4e-5)]
    fit = collectives.fit_collectives(2, samples)
    assert fit.bus_bandwidth == pytest.approx(max(1.0 * 16384 / 1.9e-5, 0.5 * 16384 / 1.4e-5))
    assert math.isfinite(fit.calibration(fit.bus_bandwidth).efficiency)
