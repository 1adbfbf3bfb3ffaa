"""What the layer model adds at pipeline scale: a fixed cost per pipeline op and per
transfer, the gradients a split backward keeps from I to W, and allocator fragmentation."""

from __future__ import annotations

import dataclasses
import math

import pytest

from model_helpers import one_device
from pipesched.generators import generate
from pipesched.model import (
    build_stage_costs,
    homogeneous_cluster,
    layer_costs,
    load_device,
    load_model,
    pipeline_ranks,
)
from pipesched.schedule import Placement
from pipesched.simulate import Network, simulate

H100 = load_device("h100-sxm")
SETTINGS = one_device(seq_len=2048)
MODEL = load_model("gpt3-1.3b")


def costs_on(device, *, placement=None):
    placement = placement or Placement.one_per_device(4)
    cluster = homogeneous_cluster(device, placement.num_devices)
    return build_stage_costs(MODEL, placement, cluster, SETTINGS, method="uniform")


def test_every_op_pays_the_fixed_cost_once():
    free = dataclasses.replace(H100, op_overhead_s=0.0)
    paid, unpaid = costs_on(H100), costs_on(free)
    fixed = H100.op_overhead_s
    assert fixed > 0
    for stage in range(4):
        assert paid.forward[stage] == pytest.approx(unpaid.forward[stage] + fixed)
        assert paid.backward_input[stage] == pytest.approx(unpaid.backward_input[stage] + fixed)
        assert paid.backward_weight[stage] == pytest.approx(unpaid.backward_weight[stage] + fixed)
        # B is one op: it pays once, not as I + W
        assert paid.full_backward(stage) == pytest.approx(unpaid.full_backward(stage) + fixed)


def test_thin_chunks_multiply_the_fixed_costs():
    # interleaving 4 chunks per device runs 4 times the ops: each chunk's time shrinks but not its fixed cost
    flat = costs_on(H100)
    looped = costs_on(H100, placement=Placement.looped(4, 4))
    assert sum(looped.forward) == pytest.approx(sum(flat.forward) + 12 * H100.op_overhead_s)


def test_transfers_pay_their_set_up_on_top_of_the_link():
    cluster = homogeneous_cluster(H100, 16)
    network = Network.from_cluster(cluster)
    assert network.latency[0, 1] == pytest.approx(cluster.intra_node.latency + H100.transfer_setup_s)
    assert network.latency[0, 8] == pytest.approx(cluster.inter_node.latency + H100.transfer_setup_s)


def test_a_gpt_block_keeps_its_weight_matmuls_output_gradients_for_w():
    # dW = X^T dY needs dY of QKV (3h), projection (h), MLP up (4h) and down (h): 18 s b h bytes in bf16
    b, s = 2, 2048
    h = MODEL.hidden_size
    block = layer_costs(MODEL, H100, one_device(micro_batch_size=b, seq_len=s))[1]
    assert math.isclose(block.kept_for_w_bytes, 18 * s * b * h)
    # W's inputs (14 s b h) plus these gradients: a deferred W holds nearly all of a microbatch's activations
    assert math.isclose(block.weight_input_bytes, 14 * s * b * h)
    embedding = layer_costs(MODEL, H100, one_device(micro_batch_size=b, seq_len=s))[0]
    assert embedding.kept_for_w_bytes == embedding.output_bytes  # its whole backward is W


def test_stage_activations_carry_the_allocator_fragmentation():
    exact = costs_on(dataclasses.replace(H100, memory_fragmentation=1.0))
    fragmented = costs_on(H100)
    assert H100.memory_fragmentation > 1
    for stage in range(4):
        assert fragmented.activation_bytes[stage] == pytest.approx(H100.memory_fragmentation * exact.activation_bytes[stage])
        assert fragmented.kept_for_w_bytes[stage] == pytest.approx(H100.memory_fragmentation * exact.kept_for_w_bytes[stage])
    assert fragmented.static_bytes == exact.static_bytes  # parameters and optimizer state are allocated once
    assert fragmented.input_frees == pytest.approx(exact.input_frees)


def _peak(family: str, costs, p: int) -> float:
    schedule = generate(family, p, 4 * p)
    cluster = homogeneous_cluster(H100, p)
    network = Network.from_cluster(cluster, ranks=pipeline_ranks(schedule.placement, cluster, 1))
    memory = simulate(schedule, costs, network).memory
    return max(peak - static for peak, static in zip(memory.peak, memory.static, strict=True))


def test_zero_bubble_memory_relative_to_1f1b_counts_the_gradients_kept_for_w():
    # selective recompute keeps what a FlashAttention layer keeps (34 s b h): W's inputs
    # (14) and the output gradients I leaves for W (18) are then nearly all of it
    p = 4
    settings = one_device(seq_len=2048, recompute="selective")
    costs = build_stage_costs(MODEL, Placement.one_per_device(p), homogeneous_cluster(H100, p), settings,
                              method="uniform")
    without = dataclasses.replace(costs, kept_for_w_bytes=None)
    ratio = _peak("zb-h1", costs, p) / _peak("1f1b", costs, p)
    ratio_without = _peak("zb-h1", without, p) / _peak("1f1b", without, p)
    assert ratio > ratio_without + 0.2  # the last device defers W of p - 1 microbatches
    assert _peak("1f1b", costs, p) == pytest.approx(_peak("1f1b", without, p))  # B never holds them


def test_profiled_fixed_costs_go_into_a_cluster_file_as_device_fields():
    import yaml

    from pipesched.model import parse_cluster
    from pipesched.runtime.profile import LinkProfile, link_yaml

    measured = yaml.safe_load(link_yaml(LinkProfile("gloo", 4e-5, 1e9, (8,), (4e-5,)), overhead_s=3e-4))["device"]
    fields = ", ".join(f"{key}: {value}" for key, value in measured.items())
    cluster = parse_cluster(
        "nodes:\n"
        f"  - {{devices_per_node: 2, device: {{preset: h200, {fields}, flash_forward_efficiency: 0.355, "
        "flash_backward_efficiency: 0.335, memory_fragmentation: 1.25, kernel_overhead: 4 us, sm_count: 114}}\n"
        "intra_node: {bandwidth: 450 GB/s, latency: 0}\n"
        "inter_node: {bandwidth: 400 Gb/s, latency: 5 us}\n")
    device = cluster.devices[0]
    assert (device.op_overhead_s, device.transfer_setup_s) == (3e-4, 4e-5)
    assert (device.flash_forward_efficiency, device.memory_fragmentation, device.sm_count) == (0.355, 1.25, 114)
    assert device.kernel_overhead_s == pytest.approx(4e-6)
    assert Network.from_cluster(cluster).latency[0, 1] == pytest.approx(4e-5)  # the measured fixed cost


@pytest.mark.parametrize(("entry", "field"), [
    ("{preset: h200, op_overhead: -3 us}", "op_overhead"),
    ("{preset: h200, memory_fragmentation: 0.5}", "memory_fragmentation"),
    ("{preset: h200, sm_count: 0}", "sm_count"),
    ("{preset: h200, flash_forward_efficiency: yes}", "flash_forward_efficiency"),
])
def test_bad_device_fields_in_a_cluster_file_name_the_field(entry, field):
    from pipesched.errors import PipeschedError
    from pipesched.model import parse_cluster

    with pytest.raises(PipeschedError, match=field):
        parse_cluster(f"nodes:\n  - {{devices_per_node: 1, device: {entry}}}\n"
                      "intra_node: {bandwidth: 1 GB/s}\ninter_node: {bandwidth: 1 GB/s}\n")
