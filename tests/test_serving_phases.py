"""Phase-dependent parallelism (``--disaggregate ... --same-devices``): prefill as a pipeline
and decode tensor-parallel on the same devices, taking them in turns; each prompt's KV
cache re-sharded between the layouts by an all-to-all, timed against a hand computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.enums import Collective
from pipesched.errors import PipeschedError
from pipesched.model import load_cluster, load_model
from pipesched.model.collectives import collective_seconds, group_levels
from pipesched.serving.config import Disaggregation, Instances, ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.timeline import serving_timeline
from pipesched.serving.trace import Trace
from pipesched.timeline import KV_CACHE
from serving_engine_helpers import poisson_trace

MODEL, CLUSTER = "llama3-8b", "1x8-h100"


def _config(prefill: Instances, decode: Instances, *, shared: bool = True) -> ServeConfig:
    return ServeConfig(disaggregate=Disaggregation(prefill, decode, shared=shared))


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(CLUSTER)


def test_the_reshard_is_an_all_to_all_of_each_devices_share(model, cluster):
    """One prompt, prefill PP2 and decode TP2 on ranks 0 and 1: the cache moves once, as an
    all-to-all of each device's half between the two."""
    config = _config(Instances(1, 2), Instances(2, 1))
    deployment = build_deployment(config, model, cluster)
    assert [plan.devices for plan in deployment.instances] == [(0, 1), (0,)]
    prompt = 300
    run = simulate_serving(deployment, Trace(np.array([0.0]), np.array([prompt]), np.array([8])))
    moves = [k for k in range(len(run.moves)) if run.moves.kind[k] == "transfer"]
    assert len(moves) == 1
    k = moves[0]
    # the whole cache: keys and values of every layer, bf16
    whole = prompt * 2 * model.num_kv_heads * model.kv_channels * 2 * model.num_layers
    assert run.moves.nbytes[k] == pytest.approx(whole, rel=1e-12)
    # the engine's link is the all-to-all of each device's half (the collectives' model) as a
    # line through its time at no bytes and at a gigabyte of cache
    levels = group_levels(cluster, (0, 1))
    at_zero = collective_seconds(Collective.ALL_TO_ALL, 0.0, levels)
    at_gigabyte = collective_seconds(Collective.ALL_TO_ALL, 1e9 / 2, levels)
    expected = at_zero + (at_gigabyte - at_zero) * whole / 1e9
    assert run.moves.end[k] - run.moves.start[k] == pytest.approx(expected, rel=1e-9)
    timeline = serving_timeline(run)
    drawn = np.flatnonzero(timeline.transfers.kind == KV_CACHE)
    assert drawn.size == 1  # from the prefill's last stage (row 1) to the decode stage (row 2) on the same ranks
    assert (int(timeline.transfers.src_device[drawn[0]]), int(timeline.transfers.dst_device[drawn[0]])) == (1, 2)


def test_the_two_layouts_take_the_devices_in_turns(model, cluster):
    """No device runs a prefill stage and the decode stage at once, and both phases run."""
    deployment = build_deployment(_config(Instances(1, 4), Instances(4, 1)), model, cluster)
    run = simulate_serving(deployment, poisson_trace(30, 8.0, prompt=(64, 512), output=(8, 32)))
    log = run.iterations
    tp = np.array([deployment.instances[i].tp for i in log.instance])
    assert {deployment.instances[i].kind for i in np.unique(log.instance)} == {"prefill", "decode"}
    for rank in range(4):
        rows = np.flatnonzero((log.first_device <= rank) & (rank < log.first_device + tp))
        order = rows[np.argsort(log.start[rows], kind="stable")]
        assert np.all(log.start[order][1:] >= log.end[order][:-1] - 1e-12), rank
    assert np.isfinite(run.finished_at).all()


def test_the_caches_split_what_both_layouts_weights_leave(model, cluster):
    """Each side's cache holds half of what both layouts' weights and workspace leave, so
    together they hold no more than one device's memory after both."""
    shared = build_deployment(_config(Instances(1, 2), Instances(2, 1)), model, cluster)
    prefill, decode = shared.instances
    kv = shared.config.kv
    device = cluster.devices[0].memory_bytes * kv.kv_fraction
    both = (prefill.stages[0].device_weight_bytes + prefill.stages[0].workspace_bytes
            + decode.stages[0].device_weight_bytes + decode.stages[0].workspace_bytes)
    per_block = [stage.kv_bytes_per_token * kv.block_size for stage in (prefill.stages[0], decode.stages[0])]
    assert prefill.kv_capacity_blocks == int((device - both) / 2 // per_block[0])
    assert decode.kv_capacity_blocks == int((device - both) / 2 // per_block[1])
    assert shared.config.devices == 2


def test_separate_devices_are_unchanged_by_the_flag_off(model, cluster):
    apart = build_deployment(_config(Instances(1, 2), Instances(2, 1), shared=False), model, cluster)
    assert apart.sharing is None and [plan.devices for plan in apart.instances] == [(0, 1), (2,)]


def test_unequal_sides_on_the_same_devices_are_refused():
    with pytest.raises(PipeschedError, match="disaggregate=1x2x1,1x1x1"):
        _config(Instances(1, 2), Instances(1, 1))


@pytest.mark.slow
def test_serve_simulate_same_devices(cli):
    out = cli("serve", "simulate", "--model", MODEL, "--disaggregate", "1x2,2x1", "--same-devices", "--requests", "8",
              "--json")
    assert out.code == 0, out.err
    assert json.loads(out.out)["requests"] == 8
    assert_one_line_error(cli("serve", "simulate", "--same-devices", "--requests", "8"), "same-devices")
    assert_one_line_error(cli("serve", "simulate", "--disaggregate", "1x2,1x1", "--same-devices"), "disaggregate=")
