"""Partitioners: balanced against brute force, memory-aware search, uniform, Megatron layouts,
in-flight memory, and stage costs built from a model on a cluster."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_helpers import one_device
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.model import (
    build_stage_costs,
    homogeneous_cluster,
    layer_costs,
    load_cluster,
    load_device,
    load_model,
    plan_stages,
)
from pipesched.ops import F, I, Op, W
from pipesched.partition import (
    Partition,
    device_peak_bytes,
    expand_layout,
    format_layout,
    inflight_per_stage,
    min_bottleneck,
    parse_layout,
    stage_values,
    uniform,
)
from pipesched.schedule import Placement, Schedule
from pipesched.slots import inflight_per_device


def all_partitions(layers: int, stages: int):
    """Every split of ``layers`` into ``stages`` non-empty runs (the brute-force reference)."""
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        yield Partition((0, *cuts, layers))


def brute_force(compute, forward, backward, memory=None, caps=None):
    stages, layers = compute.shape
    best = math.inf
    for partition in all_partitions(layers, stages):
        if memory is not None and np.any(stage_values(partition, memory) > caps):
            continue
        value = stage_values(partition, compute, send_forward=forward, send_backward=backward).max()
        best = min(best, value)
    return best


@st.composite
def instances(draw):
    layers = draw(st.integers(1, 7))
    stages = draw(st.integers(1, layers))
    cells = st.integers(0, 20)
    def matrix():
        return np.array(draw(st.lists(cells, min_size=stages * layers, max_size=stages * layers)),
                        dtype=float).reshape(stages, layers)
    return matrix(), matrix() / 4, matrix() / 4


@settings(max_examples=80, deadline=None)
@given(instances())
def test_balanced_equals_brute_force(instance):
    compute, forward, backward = instance
    result = min_bottleneck(compute, send_forward=forward, send_backward=backward)
    assert result.value == pytest.approx(brute_force(compute, forward, backward))
    assert result.partition.num_stages == compute.shape[0] and min(result.partition.sizes) >= 1
    values = stage_values(result.partition, compute, send_forward=forward, send_backward=backward)
    assert values.max() == pytest.approx(result.value)


@settings(max_examples=60, deadline=None)
@given(instances(), st.integers(5, 40))
def test_memory_capped_balanced_equals_brute_force(instance, cap):
    compute, memory, _ = instance
    memory = memory * 4
    caps = np.full(compute.shape[0], float(cap))
    expected = brute_force(compute, None, None, memory, caps)
    result = min_bottleneck(compute, memory=memory, memory_cap=caps)
    if math.isinf(expected):
        assert result is None
        # the smallest cap that fits is the min-max of the stage memories
        smallest = min(stage_values(p, memory).max() for p in all_partitions(compute.shape[1], compute.shape[0]))
        assert min_bottleneck(memory).value == pytest.approx(smallest)
        assert smallest > cap
    else:
        assert result.value == pytest.approx(expected)
        assert np.all(stage_values(result.partition, memory) <= caps)


def test_uniform_spreads_every_layer():
    kinds = "E" + "t" * 30 + "L"
    partition = uniform(kinds, 4)  # 30 blocks on 4 stages: nothing silently dropped
    assert partition.num_layers == 32 and partition.sizes == (8, 8, 8, 8)
    assert kinds[partition.layers(0)[0]] == "E"
    assert uniform("E" + "t" * 32 + "L", 4).sizes == (9, 8, 8, 9)
    assert uniform("tttt", 4).sizes == (1, 1, 1, 1)
    with pytest.raises(PipeschedError, match="only 3 layers"):
        uniform("EtL", 4)


@pytest.mark.parametrize(("name", "p"), [("llama3-8b", 2), ("llama3-8b", 4), ("llama3-8b", 8)])
def test_balanced_beats_uniform_with_a_heavy_head(name, p):
    model = load_model(name)
    cluster = load_cluster("1x8-h100")
    placement = Placement.one_per_device(p)
    settings = one_device(seq_len=4096)
    balanced = plan_stages(model, placement, cluster, settings, method="balanced")
    even = plan_stages(model, placement, cluster, settings, method="uniform")
    assert balanced.bottleneck_s < 0.99 * even.bottleneck_s
    assert balanced.partition.sizes[-1] < even.partition.sizes[-1]  # the head stage gets fewer blocks


def test_heterogeneous_devices_get_work_by_speed():
    model = load_model("llama3-8b")
    cluster = load_cluster("mixed-h100-a100")
    placement = Placement.one_per_device(16)
    plan = plan_stages(model, placement, cluster, one_device(seq_len=2048), method="uniform")
    assert [d.name for d in plan.devices[:2]] == ["h100-sxm", "h100-sxm"] and plan.devices[-1].name == "a100-80gb"
    two = plan_stages(model, Placement.one_per_device(2), _two_kinds(), one_device(seq_len=2048))
    fast, slow = two.partition.sizes
    assert fast > slow  # the H100 stage takes more blocks than the A100 stage


def _two_kinds():
    from pipesched.model import Cluster

    h100, a100 = load_device("h100-sxm"), load_device("a100-80gb")
    base = load_cluster("1x8-h100")
    return Cluster("two", (h100, a100), (0, 0), base.intra_node, base.inter_node)


def test_stage_costs_sum_the_layers():
    model = load_model("small")
    settings = one_device(seq_len=256)
    cluster = homogeneous_cluster(load_device("cpu"), 4)
    plan = plan_stages(model, Placement.looped(2, 2), homogeneous_cluster(load_device("cpu"), 2), settings)
    costs = plan.costs
    layers = layer_costs(model, load_device("cpu"), settings)
    assert math.isclose(sum(costs.forward), sum(x.forward_s for x in layers))
    assert math.isclose(sum(costs.static_bytes), 18 * sum(x.params for x in layers))
    assert math.isclose(sum(costs.grad_bytes), 4 * sum(x.params for x in layers))
    assert costs.output_bytes[0] == layers[1].output_bytes
    assert 0 < costs.input_frees < 1
    assert plan.ranks == (0, 1, 0, 1)
    # a given partition is used as is
    fixed = build_stage_costs(model, Placement.one_per_device(4), cluster, settings,
                              partition=Partition.from_sizes([1, 4, 4, 1]))
    assert math.isclose(fixed.forward[0], layers[0].forward_s)


def test_boundary_sends_follow_the_links():
    model = load_model("llama3-8b")
    cluster = load_cluster("4x8-h100")
    settings = one_device(seq_len=4096, tensor_parallel=8)
    plan = plan_stages(model, Placement.one_per_device(4), cluster, settings, method="uniform")
    assert plan.ranks == (0, 8, 16, 24)  # one node per pipeline rank
    hidden = 4096 * 4096 * 2
    # the link's latency and bandwidth, plus the set-up of a transfer on an H100
    one_send = cluster.inter_node.transfer_time(hidden) + load_device("h100-sxm").transfer_setup_s
    assert plan.send_s == pytest.approx((one_send, 2 * one_send, 2 * one_send, one_send))
    with pytest.raises(PipeschedError, match="spans two nodes"):
        plan_stages(model, Placement.one_per_device(2), cluster, one_device(tensor_parallel=12))
    with pytest.raises(PipeschedError, match="has 32 devices"):
        plan_stages(model, Placement.one_per_device(8), cluster, settings)


def test_inflight_counts_match_the_slot_table():
    one_f_one_b = generate("1f1b", 4, 8)
    assert inflight_per_stage(one_f_one_b) == [4, 3, 2, 1]
    assert inflight_per_stage(one_f_one_b) == inflight_per_device(one_f_one_b)
    assert inflight_per_stage(generate("gpipe", 4, 8)) == [8, 8, 8, 8]
    costs = dataclasses.replace(StageCosts.uniform(4, activation_bytes=10.0), static_bytes=(1.0, 2.0, 3.0, 4.0))
    peaks = device_peak_bytes(one_f_one_b, costs)
    assert peaks == [41.0, 32.0, 23.0, 14.0]


@pytest.mark.parametrize(("kept", "peak"), [(4.0, 10.0), (8.0, 13.0)])
def test_device_peaks_count_what_i_frees_and_the_gradients_it_keeps_for_w(kept, peak):
    # one stage-microbatch of 10 B: F holds 10; I frees half (5) and leaves `kept` for W;
    # W frees the other 5 and the kept gradients: the peak is max(10, 10 - 5 + kept)
    schedule = Schedule("one", Placement.one_per_device(1), 1, ((Op(0, F, 0), Op(0, I, 0), Op(0, W, 0)),))
    costs = StageCosts((1.0,), (1.0,), (1.0,), (10.0,), (0.0,), static_bytes=(2.0,), input_frees=0.5,
                       kept_for_w_bytes=(kept,))
    assert device_peak_bytes(schedule, costs) == [2.0 + peak]


def test_partition_and_simulate_give_the_same_device_peaks(cli):
    workload = ("--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2")
    planned = json.loads(cli("partition", *workload, "-p", "4", "--schedule", "zb-v", "-m", "8", "--json").out)
    simulated = json.loads(cli("simulate", "zb-v", "-p", "4", "-m", "8", *workload, "--json").out)
    assert planned["peak_memory_bytes"] == pytest.approx(simulated["peak_memory_bytes"], rel=1e-12)


def test_memory_method_fits_and_reports_the_smallest_memory():
    model = load_model("llama3-70b")
    cluster = load_cluster("4x8-h100")
    settings = one_device(seq_len=4096, tensor_parallel=8)
    schedule = generate("1f1b", 4, 8)
    plan = plan_stages(model, schedule.placement, cluster, settings, method="memory", schedule=schedule)
    balanced = plan_stages(model, schedule.placement, cluster, settings, method="balanced", schedule=schedule)
    assert max(balanced.device_peak_bytes) > 80 * 2**30  # the time-balanced split does not fit
    assert max(plan.device_peak_bytes) <= 80 * 2**30
    assert plan.partition.sizes[0] < balanced.partition.sizes[0]  # stage 0 holds 4 microbatches
    with pytest.raises(PipeschedError, match=r"smallest memory that fits is (\d+\.\d+) GiB") as info:
        plan_stages(model, schedule.placement, cluster, settings, method="memory", schedule=schedule,
                    memory_limit=40 * 2**30)
    smallest = float(info.value.args[0].split("fits is ")[1].split(" GiB")[0]) * 2**30
    # just above the reported figure a partition fits
    fits = plan_stages(model, schedule.placement, cluster, settings, method="memory", schedule=schedule,
                       memory_limit=smallest * 1.001)
    assert max(fits.device_peak_bytes) <= smallest * 1.001
    with pytest.raises(PipeschedError, match="needs a schedule"):
        plan_stages(model, schedule.placement, cluster, settings, method="memory")


def test_memory_method_plans_by_inflight_counts_and_names_each_schedule():
    """Two schedules that hold as many microbatches per stage get the same memory-method
    partition (the one the partitioner finds for those counts), each its own device peaks,
    and an error that names the schedule asked about."""
    model = load_model("llama3-70b")
    cluster = load_cluster("4x8-h100")
    settings = one_device(seq_len=4096, tensor_parallel=8)
    short, long = generate("1f1b", 4, 8), generate("1f1b", 4, 16)
    assert inflight_per_stage(short) == inflight_per_stage(long)
    one = plan_stages(model, short.placement, cluster, settings, method="memory", schedule=short)
    other = plan_stages(model, long.placement, cluster, settings, method="memory", schedule=long)
    assert other.partition == one.partition and other.costs == one.costs
    assert one.device_peak_bytes == tuple(device_peak_bytes(short, one.costs))
    assert other.device_peak_bytes == tuple(device_peak_bytes(long, other.costs))
    renamed = dataclasses.replace(long, name="my-1f1b")
    for schedule in (short, renamed):
        with pytest.raises(PipeschedError, match=f"fits under schedule {schedule.name};"):
            plan_stages(model, schedule.placement, cluster, settings, method="memory", schedule=schedule,
                        memory_limit=40 * 2**30)


MEGATRON_EXAMPLE = "Et*3|(tt|)*29,m|L"  # DeepSeek-V3 on PP16 x VPP2, from Megatron's docs
DEEPSEEK_KINDS = "E" + "t" * 61 + "mL"


def test_megatron_example_layout_round_trips():
    partition = parse_layout(MEGATRON_EXAMPLE, DEEPSEEK_KINDS, num_stages=32)
    assert partition.sizes == (4,) + (2,) * 29 + (1, 1)
    assert format_layout(partition, DEEPSEEK_KINDS) == MEGATRON_EXAMPLE


def test_layout_forms():
    assert expand_layout("E||t|L") == ["E", "", "t", "L"]
    assert parse_layout("E||t|L", "EtL").sizes == (1, 0, 1, 1)
    assert format_layout(Partition.from_sizes([1, 0, 1, 1]), "EtL") == "E||t|L"
    assert format_layout(Partition.from_sizes([2, 2, 2]), "Ettttt") == "Et|tt|tt"
    assert format_layout(Partition.from_sizes([2, 2, 2, 2]), "Ettttttt") == "Et|(tt|)*2,tt"
    assert parse_layout("Et|tt|tt", "Ettttt").sizes == (2, 2, 2)
    assert format_layout(uniform("E" + "t" * 32 + "L", 4), "E" + "t" * 32 + "L") == "Et*8|(t*8|)*2,t*8L"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from("Etm"), min_size=1, max_size=12), st.data())
def test_layouts_round_trip(body, data):
    kinds = "".join(body) + "L"
    stages = data.draw(st.integers(1, 8))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(kinds)), min_size=stages - 1, max_size=stages - 1)))
    partition = Partition((0, *cuts, len(kinds)))
    text = format_layout(partition, kinds)
    assert parse_layout(text, kinds) == partition
    assert format_layout(parse_layout(text, kinds), kinds) == text


@pytest.mark.parametrize(("text", "message"), [
    ("Et*3|L", "has 3 't' layers, the model has 4"),
    ("Ett|ttX|L", "unexpected 'X'"),
    ("tE|tttL", "layer 0 is 't' but the model's is 'E'"),
    ("", "is empty"),
])
def test_layout_errors(text, message):
    with pytest.raises(PipeschedError, match=message):
        parse_layout(text, "EttttL")


def test_layout_stage_count_must_match():
    with pytest.raises(PipeschedError, match="has 2 stages; the pipeline has 4"):
        parse_layout("Ett|ttL", "EttttL", num_stages=4)


@pytest.mark.parametrize("method", ["uniform", "balanced"])
def test_a_plan_by_compute_is_shared_by_every_schedule_and_carries_each_ones_counts(method):
    """Only the memory method partitions by the in-flight counts: under the others two
    schedules of one placement get the plan made without a schedule (its stage costs
    computed once), each with its own in-flight counts and device peaks."""
    model, cluster = load_model("llama3-8b"), load_cluster("1x8-h100")
    placement = Placement.one_per_device(4)
    settings = one_device(seq_len=2048)
    alone = plan_stages(model, placement, cluster, settings, method=method)
    plans = {name: plan_stages(model, placement, cluster, settings, method=method, schedule=generate(name, 4, 8))
             for name in ("1f1b", "gpipe")}
    assert plans["1f1b"].inflight != plans["gpipe"].inflight
    for name, plan in plans.items():
        schedule = generate(name, 4, 8)
        assert plan.partition == alone.partition and plan.costs is alone.costs
        assert plan.inflight == tuple(inflight_per_stage(schedule))
        assert plan.device_peak_bytes == tuple(device_peak_bytes(schedule, alone.costs))
