"""The communication-aware simulator: closed forms, the slot table, an independent longest
path, monotonicity, determinism, memory and the published findings."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, formula, generate
from pipesched.model import build_stage_costs, load_cluster, load_model
from pipesched.model.hardware import Cluster, DeviceSpec, LinkSpec
from pipesched.model.spec import TrainingSettings
from pipesched.ops import B, F, I, Op, W
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import Network, critical_path, simulate
from pipesched.simulate.graph import gradient_bytes
from pipesched.slots import inflight_per_device, slot_table
from pipesched.timeline import ALLREDUCE
from simulate_helpers import (
    longest_path_makespan,
    random_costs,
    random_valid_schedule,
    simulate_unless_blocked,
)

FREE = float("inf")


def free_network(p: int) -> Network:
    return Network.uniform(p, latency=0.0, bandwidth=FREE)


def costs_of(schedule: Schedule, *, f: float = 1.0, i: float = 1.0, w: float = 1.0, out: float = 0.0) -> StageCosts:
    return StageCosts.uniform(schedule.num_stages, forward=f, backward_input=i, backward_weight=w, output_bytes=out)


# sizes every family accepts (chimera: p even, m a multiple of p; dualpipe(v): m >= 2p)
FAMILY_SIZES = [(name, 4, 8) for name in FAMILIES]


# --- closed forms and the slot table ---------------------------------------------------------
@pytest.mark.parametrize(("p", "m", "f", "b"), [(2, 1, 1.0, 2.0), (4, 8, 1.5, 3.0), (5, 3, 0.7, 1.1), (8, 32, 1.0, 2.0)])
@pytest.mark.parametrize("family", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_times_f_plus_b(family, p, m, f, b) -> None:
    schedule = generate(family, p, m)
    timeline = simulate(schedule, costs_of(schedule, f=f, i=b / 2, w=b / 2), free_network(p))
    assert timeline.makespan == pytest.approx((m + p - 1) * (f + b), rel=1e-12)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 16, 3), (2, 6, 2), (8, 32, 2)])
def test_interleaved_closed_form(p, m, v) -> None:
    # chunk ops cost 1/v of a stage op: makespan m(F+B) + (p-1)(F+B)/v with m a multiple of p
    schedule = generate("interleaved-1f1b", p, m, v=v)
    f, b = 1.2, 2.6
    costs = costs_of(schedule, f=f / v, i=b / (2 * v), w=b / (2 * v))
    timeline = simulate(schedule, costs, free_network(p))
    assert timeline.makespan == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-12)


@pytest.mark.parametrize("family", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 12), (6, 12)])
def test_zero_bubble_closed_forms(family, p, m) -> None:
    schedule = generate(family, p, m)
    estimate = formula(family, p, m, costs=StageCosts.slots())
    assert estimate.exact
    timeline = simulate(schedule, costs_of(schedule), free_network(p))
    assert timeline.makespan == pytest.approx(estimate.makespan)
    if family == "zb-h1":
        # idle (p-1)(F+I-W) per device on top of m(F+I+W)
        assert timeline.makespan == pytest.approx(3 * m + (p - 1) * 1.0)


@pytest.mark.parametrize(("family", "p", "m"), FAMILY_SIZES)
def test_free_communication_reproduces_the_slot_table(family, p, m) -> None:
    schedule = generate(family, p, m)
    simulated = simulate(schedule, StageCosts.uniform(schedule.num_stages), free_network(p))
    table = slot_table(schedule)
    assert np.array_equal(simulated.op_start, table.op_start)
    assert np.array_equal(simulated.op_end, table.op_end)
    assert simulated.makespan == table.makespan


def test_timeline_shape_and_units() -> None:
    schedule = generate("1f1b", 4, 8)
    timeline = simulate(schedule, costs_of(schedule, out=1.0), Network.uniform(4, latency=0.1, bandwidth=10.0))
    assert timeline.source == "simulated" and timeline.unit == "s"
    assert [timeline.op(row) for row in range(len(timeline))] == [op for _, op in schedule.ops()]
    assert list(timeline.op_device) == [d for d, _ in schedule.ops()]
    # one activation after every F but the last stage's, one gradient after every B but the first's
    assert len(timeline.transfers) == 2 * (4 - 1) * 8
    assert np.allclose(timeline.transfers.end - timeline.transfers.start, 0.1 + 1.0 / 10.0)
    assert set(timeline.transfers.channel_names) == {"0->1", "1->0", "1->2", "2->1", "2->3", "3->2"}


# --- the engine against an independent longest path ---------------------------------------
def _family_strategy():
    return st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "chimera", "hanayo", "dualpipev"])


def _build(family: str, p: int, m: int) -> Schedule:
    if family == "chimera":
        even = 2 * max(1, p // 2)
        return generate("chimera", even, even * max(1, m // even))
    if family == "dualpipev":
        return generate(family, p, max(m, 2 * p))
    return generate(family, p, m)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=_family_strategy(), p=st.integers(2, 5), m=st.integers(1, 8), seed=st.integers(0, 10_000),
       latency=st.sampled_from([0.0, 0.05, 0.7]), bandwidth=st.sampled_from([0.5, 3.0, FREE]))
def test_without_contention_the_makespan_is_the_longest_path(family, p, m, seed, latency, bandwidth) -> None:
    schedule = random_valid_schedule(_build(family, p, m), seed)
    costs = random_costs(schedule.num_stages, seed)
    network = Network.uniform(schedule.num_devices, latency=latency, bandwidth=bandwidth)
    timeline = simulate(schedule, costs, network, contention=False)
    assert timeline.makespan == pytest.approx(longest_path_makespan(schedule, costs, latency, bandwidth), rel=1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=_family_strategy(), p=st.integers(2, 5), m=st.integers(1, 8), seed=st.integers(0, 10_000),
       contention=st.booleans(), overlap=st.booleans(), shared_nic=st.booleans())
def test_slower_links_never_shorten_the_iteration(family, p, m, seed, contention, overlap, shared_nic) -> None:
    schedule = random_valid_schedule(_build(family, p, m), seed)
    costs = random_costs(schedule.num_stages, seed)
    d = schedule.num_devices
    nodes = tuple(device // 2 for device in range(d))  # two devices per node

    def run(latency: float, bandwidth: float) -> float:
        inter = np.full((d, d), bandwidth)
        network = Network(latency=np.full((d, d), latency), bandwidth=inter, node_of=nodes, shared_nic=shared_nic)
        timeline = simulate_unless_blocked(schedule, costs, network, contention=contention, overlap=overlap)
        return math.nan if timeline is None else timeline.makespan

    base = run(0.1, 4.0)
    if math.isnan(base):  # a blocking runtime deadlocks on this table (and the reference agrees)
        return
    assert run(0.3, 4.0) >= base - 1e-12
    assert run(0.1, 1.0) >= base - 1e-12
    assert run(0.0, FREE) <= base + 1e-12


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=_family_strategy(), p=st.integers(2, 5), m=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_makespan_bounds_and_model_orderings(family, p, m, seed) -> None:
    schedule = random_valid_schedule(_build(family, p, m), seed)
    costs = random_costs(schedule.num_stages, seed)
    network = Network.uniform(schedule.num_devices, latency=0.2, bandwidth=2.0)
    runs = {(c, o): simulate_unless_blocked(schedule, costs, network, contention=c, overlap=o)
            for c in (True, False) for o in (True, False)}
    runs = {key: timeline for key, timeline in runs.items() if timeline is not None}
    busiest = max(sum(costs.duration(op) for op in ops) for ops in schedule.device_ops)
    for timeline in runs.values():
        assert timeline.makespan >= busiest - 1e-9
        # every op lasts its cost; a device runs its table in order without overlap
        durations = np.array([costs.duration(op) for _, op in schedule.ops()])
        assert np.allclose(timeline.op_end - timeline.op_start, durations)
        for device in range(schedule.num_devices):
            rows = np.flatnonzero(timeline.op_device == device)
            assert np.all(timeline.op_start[rows[1:]] >= timeline.op_end[rows[:-1]] - 1e-12)
    # contention and blocking only add waits (when a blocking runtime can run the table)
    assert runs[(True, True)].makespan >= runs[(False, True)].makespan - 1e-9
    if (False, False) in runs:
        assert runs[(False, False)].makespan >= runs[(False, True)].makespan - 1e-9
        assert runs[(True, False)].makespan >= runs[(True, True)].makespan - 1e-9


def test_two_runs_are_identical() -> None:
    schedule = random_valid_schedule(generate("zb-v", 4, 8), 7)
    costs = random_costs(schedule.num_stages, 7)
    network = Network.uniform(4, latency=0.05, bandwidth=2.0)
    a, b = simulate(schedule, costs, network), simulate(schedule, costs, network)
    for name in ("op_start", "op_end"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    for name in ("start", "end", "src_device", "dst_device", "channel"):
        assert np.array_equal(getattr(a.transfers, name), getattr(b.transfers, name))
    for x, y in zip(a.memory.values, b.memory.values, strict=True):
        assert np.array_equal(x, y)


# --- contention ---------------------------------------------------------------------------
def test_transfers_on_one_channel_queue_and_without_contention_overlap() -> None:
    # V shape on 2 devices: device 0 sends activations of stage 0 to device 1 back to back
    schedule = generate("gpipe", 2, 4)
    costs = StageCosts.uniform(2, forward=0.1, backward_input=0.1, backward_weight=0.1, output_bytes=1.0)
    network = Network.uniform(2, latency=0.0, bandwidth=1.0)  # each transfer takes 1.0 > F
    queued = simulate(schedule, costs, network, contention=True).transfers
    free = simulate(schedule, costs, network, contention=False).transfers
    forward = np.flatnonzero(queued.src_device == 0)
    # FIFO: each activation waits for the one before it on device 0's send channel
    starts = np.sort(queued.start[forward])
    assert np.allclose(np.diff(starts), 1.0)
    # without contention they start as soon as each F ends, 0.1 apart
    assert np.allclose(np.diff(np.sort(free.start[np.flatnonzero(free.src_device == 0)])), 0.1)


def test_nic_sharing_slows_concurrent_inter_node_sends() -> None:
    # 4 devices, 2 per node; two independent pipelines 0->2 and 1->3 cross nodes at once
    gpu = DeviceSpec("gpu", 1e12, 1e12, 1e12)
    fast = LinkSpec(bandwidth=1e12, latency=0.0)
    slow = LinkSpec(bandwidth=1.0, latency=0.0)
    placement = Placement(4, ((0, 2), (1, 3)))
    ops = ((Op(0, F, 0), Op(0, B, 0)), (Op(0, F, 1), Op(0, B, 1)), (Op(1, F, 0), Op(1, B, 0)), (Op(1, F, 1), Op(1, B, 1)))
    schedule = Schedule("pairs", placement, 2, ops, route=(0, 1))
    costs = StageCosts.uniform(2, output_bytes=1.0)
    per_device = simulate(schedule, costs, Network.from_cluster(Cluster("c", (gpu,) * 4, (0, 0, 1, 1), fast, slow)))
    per_node = simulate(schedule, costs, Network.from_cluster(Cluster("c", (gpu,) * 4, (0, 0, 1, 1), fast, slow,
                                                                      nic_per_device=False)))
    activations = per_node.transfers.kind == 0
    # one NIC per node: the two activations leave node 0 one after the other
    assert sorted(per_node.transfers.start[activations].tolist()) == [1.0, 2.0]
    assert sorted(per_device.transfers.start[per_device.transfers.kind == 0].tolist()) == [1.0, 1.0]
    assert per_node.makespan > per_device.makespan


def test_same_device_neighbours_need_no_transfer() -> None:
    # V shape: stages p-1 and p share the last device
    schedule = generate("zb-v", 3, 6)
    timeline = simulate(schedule, costs_of(schedule, out=1.0), Network.uniform(3, latency=0.1, bandwidth=1.0))
    transfers = timeline.transfers
    assert not np.any(transfers.src_device == transfers.dst_device)
    crossing = sum(1 for _, op in schedule.ops()
                   if (op.kind is F and op.stage < schedule.num_stages - 1
                       and schedule.device_of(op.stage + 1, op.microbatch) != schedule.device_of(op.stage, op.microbatch))
                   or (op.kind in (I, B) and op.stage > 0
                       and schedule.device_of(op.stage - 1, op.microbatch) != schedule.device_of(op.stage, op.microbatch)))
    assert len(transfers) == crossing == 2 * (2 * 3 - 2) * 6


def test_replicated_stages_all_reduce_their_gradients() -> None:
    schedule = generate("chimera", 4, 4)
    costs = StageCosts(*(((1.0,) * 4,) * 5), static_bytes=(18.0,) * 4)
    timeline = simulate(schedule, costs, Network.uniform(4, latency=0.5, bandwidth=1.0))
    reduces = np.flatnonzero(timeline.transfers.kind == ALLREDUCE)
    assert len(reduces) == schedule.num_stages
    # default size: 18 static bytes are one parameter, whose fp32 gradient is 4 bytes (as a
    # model's costs count it); a two-rank ring pays two latencies
    assert np.allclose(timeline.transfers.nbytes[reduces], 4.0)
    assert np.allclose(timeline.transfers.end[reduces] - timeline.transfers.start[reduces], 2 * 0.5 + 4.0)
    for row in reduces:
        stage = int(timeline.transfers.stage[row])
        pair = {int(timeline.transfers.src_device[row]), int(timeline.transfers.dst_device[row])}
        assert pair == {replica[stage] for replica in schedule.placement.replicas}
    assert timeline.makespan == pytest.approx(max(timeline.transfers.end.max(), timeline.op_end.max()))
    assert max(timeline.simulation.optimizer_step) == pytest.approx(timeline.makespan)



def test_a_stage_cost_file_and_a_model_all_reduce_the_same_gradient() -> None:
    # mixed-precision Adam: 2 + 4 + 12 = 18 static bytes per parameter, of which the fp32
    # gradient, 4 bytes, is what data parallel all-reduces
    file_costs = StageCosts((1.0,), (1.0,), (1.0,), (1.0,), (0.0,), static_bytes=(18e9,))
    assert gradient_bytes(file_costs, 0) == pytest.approx(4e9)
    model = build_stage_costs(load_model("tiny"), Placement.one_per_device(2), load_cluster("1x8-h100"),
                              TrainingSettings(seq_len=128))
    without_column = dataclasses.replace(model, grad_bytes=None)
    for stage in range(2):
        assert model.grad_bytes[stage] == pytest.approx(model.static_bytes[stage] * 4 / 18, rel=1e-12)
        assert gradient_bytes(without_column, stage) == pytest.approx(model.grad_bytes[stage], rel=1e-12)

# --- memory -------------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "p", "m"), [("gpipe", 4, 8), ("1f1b", 4, 8), ("interleaved-1f1b", 4, 8), ("zb-v", 4, 8)])
def test_memory_peak_counts_in_flight_activations(family, p, m) -> None:
    schedule = generate(family, p, m)
    costs = StageCosts(*(((1.0,) * schedule.num_stages,) * 3), (2.0,) * schedule.num_stages,
                       (0.0,) * schedule.num_stages, static_bytes=(5.0,) * schedule.num_stages, input_frees=0.0)
    timeline = simulate(schedule, costs, free_network(p), memory_capacity=[1e9] * p)
    stages_per_device = [sum(1 for d in schedule.placement.replicas[0] if d == device) for device in range(p)]
    expected = [5.0 * k + 2.0 * n for k, n in zip(stages_per_device, inflight_per_device(schedule), strict=True)]
    assert list(timeline.memory.peak) == pytest.approx(expected)
    assert timeline.memory.out_of_memory == (False,) * p
    for values, static in zip(timeline.memory.values, timeline.memory.static, strict=True):
        assert values[0] == static and values[-1] == pytest.approx(static)


def test_split_backward_frees_activations_in_two_steps() -> None:
    schedule = Schedule("one", Placement.one_per_device(1), 1, ((Op(0, F, 0), Op(0, I, 0), Op(0, W, 0)),))
    costs = StageCosts((1.0,), (1.0,), (1.0,), (10.0,), (0.0,), input_frees=0.3)
    memory = simulate(schedule, costs, free_network(1)).memory
    assert memory.times[0].tolist() == [0.0, 0.0, 2.0, 3.0]
    assert memory.values[0].tolist() == pytest.approx([0.0, 10.0, 7.0, 0.0])


def test_gradients_kept_for_w_are_held_from_i_to_w() -> None:
    # I frees 30% of the activations but leaves 4 bytes of output gradients that W consumes
    schedule = Schedule("one", Placement.one_per_device(1), 1, ((Op(0, F, 0), Op(0, I, 0), Op(0, W, 0)),))
    costs = StageCosts((1.0,), (1.0,), (1.0,), (10.0,), (0.0,), input_frees=0.3, kept_for_w_bytes=(4.0,))
    memory = simulate(schedule, costs, free_network(1)).memory
    assert memory.values[0].tolist() == pytest.approx([0.0, 10.0, 11.0, 0.0])
    # a full backward B never holds them
    fused = Schedule("one", Placement.one_per_device(1), 1, ((Op(0, F, 0), Op(0, B, 0)),))
    assert simulate(fused, costs, free_network(1)).memory.values[0].tolist() == pytest.approx([0.0, 10.0, 0.0])


def test_out_of_memory_flag_uses_the_capacity() -> None:
    schedule = generate("gpipe", 2, 4)
    costs = StageCosts.uniform(2, activation_bytes=10.0)
    timeline = simulate(schedule, costs, free_network(2), memory_capacity=[35.0, 45.0])
    assert timeline.memory.peak == (40.0, 40.0)
    assert timeline.memory.out_of_memory == (True, False)


# --- published findings -------------------------------------------------------------------
def test_gpipe_and_1f1b_take_equal_time_but_1f1b_needs_less_memory() -> None:
    # H100-like stage: 40 ms forward, 80 ms backward, a 16 MiB activation over 50 GB/s links
    p, m = 4, 16
    network = Network.uniform(p, latency=5e-6, bandwidth=50e9)
    costs = StageCosts.uniform(p, forward=0.04, backward_input=0.05, backward_weight=0.03,
                               activation_bytes=3e9, output_bytes=16 * 2**20)
    gpipe = simulate(generate("gpipe", p, m), costs, network)
    one_f_one_b = simulate(generate("1f1b", p, m), costs, network)
    assert gpipe.makespan == pytest.approx(one_f_one_b.makespan, rel=1e-2)
    assert max(one_f_one_b.memory.peak) < max(gpipe.memory.peak)
    assert max(one_f_one_b.memory.peak) == p * 3e9 and max(gpipe.memory.peak) == m * 3e9


def _chimera_speedup(m: int, bandwidth: float) -> float:
    p = 4
    network = Network.uniform(p, latency=0.0, bandwidth=bandwidth)
    costs = StageCosts.uniform(p, output_bytes=1.0)
    costs = StageCosts(costs.forward, costs.backward_input, costs.backward_weight, costs.activation_bytes,
                       costs.output_bytes, grad_bytes=(4.0,) * p)
    chimera = simulate(generate("chimera", p, m), costs, network).makespan
    baseline = simulate(generate("1f1b", p, m), costs, network).makespan
    return baseline / chimera


def test_chimera_gains_most_with_few_microbatches_and_loses_its_edge_on_slow_links() -> None:
    fast_few, fast_many = _chimera_speedup(4, FREE), _chimera_speedup(32, FREE)
    assert fast_few > 1.2
    assert fast_few > fast_many
    slow_few = _chimera_speedup(4, 1.0)  # an activation takes as long as a forward
    assert slow_few < fast_few
    assert slow_few <= 1.0 + 1e-9


# --- the critical path --------------------------------------------------------------------
def test_critical_path_is_a_gapless_chain_from_zero_to_the_end() -> None:
    schedule = generate("1f1b", 4, 8)
    timeline = simulate(schedule, costs_of(schedule, out=1.0), Network.uniform(4, latency=0.1, bandwidth=5.0))
    path = critical_path(timeline)
    starts, ends = [], []
    for is_transfer, row in zip(path.is_transfer, path.row, strict=True):
        source = timeline.transfers if is_transfer else None
        starts.append(source.start[row] if is_transfer else timeline.op_start[row])
        ends.append(source.end[row] if is_transfer else timeline.op_end[row])
    assert starts[0] == 0.0 and ends[-1] == pytest.approx(timeline.makespan)
    assert np.allclose(starts[1:], ends[:-1])
    assert path.is_transfer.any()  # transfers sit between stages on the chain
    assert path.compute_time(timeline) + path.transfer_time(timeline) == pytest.approx(timeline.makespan)


# --- bad input ----------------------------------------------------------------------------
def test_bad_inputs_raise_one_line_errors() -> None:
    schedule = generate("1f1b", 4, 8)
    with pytest.raises(PipeschedError, match="stage_costs=3 stages"):
        simulate(schedule, StageCosts.uniform(3), free_network(4))
    with pytest.raises(PipeschedError, match="devices=2"):
        simulate(schedule, StageCosts.uniform(4), free_network(2))
    with pytest.raises(PipeschedError, match="bandwidth=0"):
        Network.uniform(4, latency=0.0, bandwidth=0.0)
    with pytest.raises(PipeschedError, match="latency=nan"):
        Network.uniform(4, latency=math.nan, bandwidth=1.0)
    broken = schedule.with_ops((schedule.device_ops[0][1:], *schedule.device_ops[1:]))
    with pytest.raises(PipeschedError, match="needs one F"):
        simulate(broken, StageCosts.uniform(4), free_network(4))
    swapped = list(schedule.device_ops)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(PipeschedError, match="placement puts it on device"):
        simulate(schedule.with_ops(tuple(swapped)), StageCosts.uniform(4), free_network(4))
    # device 0 runs its backward before its forward: a local deadlock
    ops0 = schedule.device_ops[0]
    stuck = schedule.with_ops(((ops0[-1], *ops0[:-1]), *schedule.device_ops[1:]))
    with pytest.raises(PipeschedError, match="pipesched validate") as info:
        simulate(stuck, StageCosts.uniform(4), free_network(4))
    assert "\n" not in str(info.value)
