"""Context parallelism: each of cp ranks holds s / cp tokens of every sequence (two chunks, for
causal load balancing), computes 1 / cp of the attention and exchanges keys and values with
the others (p2p ring, a2a, allgather). Ring attention's overlap condition is checked against
a hand computation of one ring step's transfer and one block's attention; the layouts, the
search space and the commands take cp."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.enums import Collective, Group
from pipesched.errors import PipeschedError
from pipesched.experiments.point import Point
from pipesched.model import (
    data_parallel_groups,
    load_cluster,
    load_device,
    load_model,
    pipeline_ranks,
)
from pipesched.model.collectives import CollectiveLevel
from pipesched.model.groups import GroupLevels
from pipesched.model.kernels import flash_attention_time
from pipesched.model.spec import TrainingSettings
from pipesched.model.transformer import (
    hardware_flops_per_iteration,
    layer_costs,
    layer_ops,
    layer_plans,
    model_flops_per_iteration,
)
from pipesched.schedule import Placement
from pipesched.search.space import SearchSpace

MODEL = load_model("llama3-8b")  # 32 heads, 8 key/value heads of 128, hidden 4096
H100 = load_device("h100-sxm")
FREE = (CollectiveLevel(4, 0.0, math.inf),)  # a context group on links that cost nothing


def _on(levels: tuple[CollectiveLevel, ...]) -> GroupLevels:
    return GroupLevels(((Group.CONTEXT, levels),))


def _block(settings: TrainingSettings, levels: tuple[CollectiveLevel, ...]):
    return layer_costs(MODEL, H100, settings, groups=_on(levels))[1]


def _hand(seq_len: int, cp: int, bandwidth: float, latency: float, *, backward: bool = False) -> float:
    """Ring attention's exposed exchange of one block, by hand: cp - 1 hand-offs of this rank's
    K and V (bf16, s / cp tokens, 8 heads of 128; in I with dK and dV too), each beside the
    attention of one block of s / cp queries against s / cp keys (one causal flash kernel)."""
    tokens = seq_len / cp
    kv = tokens * 2 * 8 * 128 * 2 * (2 if backward else 1)
    transfer = kv / bandwidth + latency
    traffic = 2 * tokens * (2 * 32 * 128 + 2 * 8 * 128)  # bytes: Q, K, V read, O written
    block = flash_attention_time(H100, heads=32, seq=tokens, head_dim=128, traffic=traffic, backward=backward)
    return (cp - 1) * max(0.0, transfer - block)


def _settings(seq_len: int, cp: int, comm: str = "p2p") -> TrainingSettings:
    return TrainingSettings(seq_len=seq_len, tensor_parallel=1, context_parallel=cp, cp_comm_type=comm,
                            recompute="selective")


@pytest.mark.parametrize("backward", [False, True])
def test_ring_exchange_is_hidden_above_the_blocks_compute_and_exposed_below(backward: bool) -> None:
    settings = _settings(16384, 4)
    free = _block(settings, FREE)
    tokens = 16384 / 4
    kv = tokens * 2 * 8 * 128 * 2 * (2 if backward else 1)
    traffic = 2 * tokens * (2 * 32 * 128 + 2 * 8 * 128)
    block = flash_attention_time(H100, heads=32, seq=tokens, head_dim=128, traffic=traffic, backward=backward)
    balanced = kv / (block - 5e-6)  # bytes/s at which one hand-off takes exactly one block's attention
    for bandwidth in (4 * balanced, 1.01 * balanced, 0.5 * balanced, 0.1 * balanced):
        cost = _block(settings, (CollectiveLevel(4, 5e-6, bandwidth),))
        exposed = (cost.backward_input_s - free.backward_input_s) if backward else (cost.forward_s - free.forward_s)
        expected = _hand(16384, 4, bandwidth, 5e-6, backward=backward)
        assert exposed == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert (expected == 0) == (bandwidth > balanced)


def test_ring_exchange_exposure_grows_as_the_block_shrinks() -> None:
    """One sequence over more and more ranks: each block (s / cp tokens) shrinks, its transfer
    linearly and its attention quadratically, so the large blocks hide the exchange and below
    the overlap condition's size ever more of it is exposed."""
    link = (CollectiveLevel(8, 5e-6, 25e9),)
    exposed = []
    for cp in (2, 4, 8, 16, 32, 64):
        settings = _settings(131072, cp)
        levels = (dataclasses.replace(link[0], ranks=cp),)
        cost, free = _block(settings, levels), _block(settings, (dataclasses.replace(FREE[0], ranks=cp),))
        exposed.append(cost.forward_s - free.forward_s)
        assert exposed[-1] == pytest.approx(_hand(131072, cp, 25e9, 5e-6), rel=1e-9, abs=1e-12)
    assert exposed[:3] == [0.0, 0.0, 0.0]
    assert 0 < exposed[3] < exposed[4] < exposed[5]


def test_costs_ops_splits_the_ring_exchange_into_exposed_and_hidden() -> None:
    settings = _settings(16384, 4)
    link = (CollectiveLevel(4, 5e-6, 10e9),)
    ring = next(c for c in layer_ops(MODEL, H100, settings, groups=_on(link))[1].collectives
                if c.name == "kv ring exchange")
    whole = 3 * ((16384 / 4) * 2 * 8 * 128 * 2 / 10e9 + 5e-6)  # cp - 1 hand-offs, none overlapped
    assert ring.group is Group.CONTEXT
    assert ring.forward_s == pytest.approx(_hand(16384, 4, 10e9, 5e-6), rel=1e-9)
    assert ring.forward_s + ring.hidden_s == pytest.approx(whole, rel=1e-9)


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_context_parallelism_splits_work_and_memory_but_not_the_model(comm: str) -> None:
    """The cp ranks together do the work of one: model and hardware FLOPs of an iteration
    equal the unsplit model's; each rank keeps 1 / cp of every activation, and the whole
    parameters."""
    whole, split = _settings(8192, 1), _settings(8192, 4, comm)
    for count in (model_flops_per_iteration, hardware_flops_per_iteration):
        assert count(MODEL, split, 8) == pytest.approx(count(MODEL, whole, 8), rel=1e-12)
    for recompute in ("none", "selective", "full"):
        one = layer_costs(MODEL, H100, dataclasses.replace(whole, recompute=recompute))
        four = layer_costs(MODEL, H100, dataclasses.replace(split, recompute=recompute))
        for a, b in zip(one, four, strict=True):
            assert b.activation_bytes == pytest.approx(a.activation_bytes / 4, rel=1e-12), (recompute, a.name)
            assert b.params == a.params


def test_the_exchanges_move_the_bytes_megatron_moves() -> None:
    tokens = 8192 / 4  # this rank's
    q, kv = tokens * 32 * 128 * 2, tokens * 8 * 128 * 2  # bytes of Q (or O), of K (or V)
    plans = {comm: layer_plans(MODEL, _settings(8192, 4, comm))[1].collectives for comm in ("p2p", "a2a", "allgather")}
    ring = [(c.kind, c.nbytes, c.backward, c.steps) for c in plans["p2p"] if c.group is Group.CONTEXT]
    assert ring == [(Collective.SEND_RECV, 2 * kv, False, 3), (Collective.SEND_RECV, 4 * kv, True, 3)]
    ulysses = [(c.kind, c.nbytes, c.backward) for c in plans["a2a"] if c.group is Group.CONTEXT]
    assert ulysses == [(Collective.ALL_TO_ALL, size, backward) for backward in (False, True) for size in (q, kv, kv, q)]
    gathered = [(c.kind, c.nbytes, c.backward) for c in plans["allgather"] if c.group is Group.CONTEXT]
    assert gathered == [(Collective.ALL_GATHER, 4 * 2 * kv, False), (Collective.ALL_GATHER, 4 * 2 * kv, True),
                        (Collective.REDUCE_SCATTER, 4 * 2 * kv, True)]
    assert not any(c.group is Group.CONTEXT for c in layer_plans(MODEL, _settings(8192, 1))[1].collectives)


def test_bad_context_parallel_sizes_name_the_field_and_the_fix() -> None:
    with pytest.raises(PipeschedError, match=r"context_parallel=3: .*2 x cp must divide seq_len=4096"):
        TrainingSettings(seq_len=4096, context_parallel=3)
    with pytest.raises(PipeschedError, match="context_parallel=4096"):
        TrainingSettings(seq_len=4096, context_parallel=4096)  # 2 x cp = 8192 does not divide 4096
    with pytest.raises(PipeschedError, match="cp_comm_type=ring"):
        TrainingSettings(cp_comm_type="ring")
    with pytest.raises(PipeschedError, match="num_kv_heads=8 is no multiple of 16"):
        layer_costs(MODEL, H100, TrainingSettings(seq_len=4096, tensor_parallel=1, context_parallel=16,
                                                  cp_comm_type="a2a"))
    with pytest.raises(PipeschedError, match="context_parallel=2: a stage-cost file"):
        Point(stage_costs=StageCosts.uniform(4), cp=2)


def test_a_stage_spans_t_x_cp_ranks_and_reduces_gradients_over_its_context_ranks() -> None:
    cluster = load_cluster("4x8-h100")
    placement = Placement.one_per_device(4)
    assert pipeline_ranks(placement, cluster, 2, context_parallel=4) == (0, 8, 16, 24)
    assert data_parallel_groups(placement, cluster, 2, 1, context_parallel=4)[1] == (8, 10, 12, 14)
    assert data_parallel_groups(placement, cluster, 2, 2, context_parallel=2) == (
        (0, 2, 16, 18), (4, 6, 20, 22), (8, 10, 24, 26), (12, 14, 28, 30))
    with pytest.raises(PipeschedError, match="8 x context_parallel 2 = 64"):
        pipeline_ranks(placement, cluster, 8, context_parallel=2)
    point = Point("1f1b", p=4, m=4, model="llama3-8b", cluster="4x8-h100", tp=2, cp=4, seq_len=8192)
    network = point.setup().network_for(point.build_schedule())
    assert network.replicas == 1 and network.reduces_gradients
    assert network.data_parallel.levels[0][0].ranks == 4


def test_the_search_space_splits_devices_over_t_cp_p_and_d() -> None:
    space = SearchSpace(model="llama3-8b", cluster="1x8-h100", global_batch=8, seq_len=8192, schedules=("1f1b",),
                        partitions=("balanced",), recompute=("selective",), zero=(0,), tensor_parallel=(2,),
                        context_parallel=(1, 2))
    layouts = space.layouts()
    assert {layout.cp for layout in layouts} == {1, 2}
    assert all(layout.tp * layout.cp * layout.pp * layout.dp == 8 for layout in layouts)
    points = space.points()
    assert {point.cp for point in points} == {1, 2}
    assert all(point.tp * point.cp * point.p * point.dp == 8 for point in points)
    with pytest.raises(PipeschedError, match="context_parallel=3"):
        SearchSpace(model="llama3-8b", cluster="1x8-h100", seq_len=8192, context_parallel=(3,))


CP_RUN = ["1f1b", "-p", "2", "-m", "4", "--model", "llama3-8b", "--cluster", "1x8-h100", "-t", "2", "-s", "8192"]


@pytest.mark.slow
def test_simulate_and_compare_take_cp(cli) -> None:
    plain = cli("simulate", *CP_RUN, "--json")
    split = cli("simulate", *CP_RUN, "--cp", "2", "--json")
    ulysses = cli("simulate", *CP_RUN, "--cp", "2", "--cp-comm", "a2a", "--json")
    for result in (plain, split, ulysses):
        assert result.code == 0, result
    one, two = json.loads(plain.out), json.loads(split.out)
    # half the tokens per rank: the iteration is shorter, the peak smaller
    assert two["iteration_time_s"] < one["iteration_time_s"]
    assert max(two["peak_memory_bytes"]) < max(one["peak_memory_bytes"])
    compared = cli("compare", "--schedules", "1f1b,gpipe", "-p", "2", "-m", "4", "--model", "llama3-8b",
                   "--cluster", "1x8-h100", "-t", "2", "-s", "8192", "--cp", "2", "--levels", "sim")
    assert compared.code == 0, compared
    costs = cli("costs", "--model", "llama3-8b", "-s", "8192", "-t", "1", "--cp", "4", "--ops", "--json")
    assert costs.code == 0, costs
    names = [c["name"] for c in json.loads(costs.out)["layers"][1]["collectives"]]
    assert "kv ring exchange" in names


def test_bad_cp_on_the_command_line_is_one_error_line(cli) -> None:
    assert_one_line_error(cli("simulate", *CP_RUN, "--cp", "3"), "context_parallel=3", "2 x cp must divide")
    assert_one_line_error(cli("simulate", *CP_RUN, "--cp", "8"), "cluster=1x8-h100", "context_parallel 8")
    assert_one_line_error(cli("simulate", *CP_RUN, "--cp", "2", "--cp-comm", "ring"), "cp_comm_type=ring")
