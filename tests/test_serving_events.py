"""Cluster events: a run without any is the plain run; what happened before an event is the
plain run's (the engine is causal); the weight moves are the bytes a device lacks over the
link from where they live; requests in flight pause for the change and all finish; the
timeline shows the moves; bad events files are one error line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error
from pipesched.model import load_cluster, load_model
from pipesched.serving.config import Instances, SchedulerSpec, ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.events import ClusterEvent, simulate_with_events
from pipesched.serving.timeline import serving_timeline
from pipesched.timeline import WEIGHT_MOVE
from serving_engine_helpers import poisson_trace

MODEL, CLUSTER = "llama3-8b", "1x8-h100"


def _config(tp: int = 1, replicas: int = 2) -> ServeConfig:
    return ServeConfig(instances=Instances(tp=tp, pp=1, count=replicas), scheduler=SchedulerSpec(max_batch=16, chunk=256))


def _trace():
    return poisson_trace(40, 8.0, prompt=(64, 256), output=(16, 64), seed=4)


def _events(*triples) -> tuple[ClusterEvent, ...]:
    return tuple(ClusterEvent(at, kind, device) for at, kind, device in triples)


def test_no_events_is_the_plain_run() -> None:
    model, cluster, config, trace = load_model(MODEL), load_cluster(CLUSTER), _config(), _trace()
    plain = simulate_serving(build_deployment(config, model, cluster), trace)
    changed = simulate_with_events(config, model, cluster, trace, ())
    assert changed.reconfigurations == ()
    assert np.array_equal(changed.run.token_times, plain.token_times)
    assert np.array_equal(changed.run.finished_at, plain.finished_at)


def test_before_an_event_the_run_is_the_plain_one_and_every_request_finishes() -> None:
    model, cluster, config, trace = load_model(MODEL), load_cluster(CLUSTER), _config(), _trace()
    at = float(trace.arrived_at[20])
    plain = simulate_serving(build_deployment(config, model, cluster), trace)
    run = simulate_with_events(config, model, cluster, trace, _events((at, "lose", 1))).run
    assert (np.diff(run.token_offsets) == trace.decode_tokens).all() and not np.isnan(run.finished_at).any()
    for r in range(len(trace)):
        mine = run.token_times[run.token_offsets[r]:run.token_offsets[r + 1]]
        theirs = plain.token_times[plain.token_offsets[r]:plain.token_offsets[r + 1]]
        assert np.array_equal(mine[mine <= at], theirs[theirs <= at])


def test_an_added_device_loads_the_model_from_a_peer_over_its_link() -> None:
    model, cluster, trace = load_model(MODEL), load_cluster(CLUSTER), _trace()
    config = _config(replicas=1)
    whole = build_deployment(config, model, cluster).instances[0].stages[0].weight_bytes
    at = float(trace.arrived_at[10])
    change = simulate_with_events(config, model, cluster, trace, _events((at, "add", 5))).reconfigurations[0]
    assert change.pool == (0, 5) and change.config.instances == Instances(1, 1, 2)
    (move,) = change.moves
    assert (move.src, move.dst) == (0, 5)
    assert move.nbytes == pytest.approx(whole, rel=1e-9)
    link = cluster.intra_node  # ranks 0 and 5 share the node
    assert change.seconds == pytest.approx(link.latency + cluster.devices[0].transfer_setup_s + whole / link.bandwidth)


def test_a_lost_shard_comes_back_from_host_memory() -> None:
    model, cluster, trace = load_model(MODEL), load_cluster(CLUSTER), _trace()
    config = _config(tp=2, replicas=1)
    half = build_deployment(config, model, cluster).instances[0].stages[0].weight_bytes
    whole = build_deployment(_config(replicas=1), model, cluster).instances[0].stages[0].weight_bytes
    at = float(trace.arrived_at[10])
    change = simulate_with_events(config, model, cluster, trace, _events((at, "lose", 1))).reconfigurations[0]
    assert change.pool == (0,) and change.config.instances == Instances(1, 1, 1)
    assert all(move.src == -1 and move.dst == 0 for move in change.moves)
    # device 0 held its half of every layer: the other half comes over the host link
    assert change.from_host_bytes == pytest.approx(whole - half, rel=0.02)
    assert change.seconds == pytest.approx(change.from_host_bytes / cluster.devices[0].host_bandwidth, rel=1e-9)


def test_requests_in_flight_pause_for_the_change_and_the_timeline_shows_the_moves() -> None:
    model, cluster, trace = load_model(MODEL), load_cluster(CLUSTER), _trace()
    config = _config(tp=2, replicas=1)
    at = float(trace.arrived_at[10])
    changed = simulate_with_events(config, model, cluster, trace, _events((at, "lose", 1)))
    run, change = changed.run, changed.reconfigurations[0]
    assert change.in_flight > 0
    assert not ((run.token_times > at) & (run.token_times < at + change.seconds)).any()
    assert (run.iterations.start[run.iterations.start > at] >= at + change.seconds).all()
    timeline = serving_timeline(run, window=(at - 0.5, at + change.seconds + 0.5))
    assert (timeline.transfers.kind == WEIGHT_MOVE).any()


def _cli_flags(tmp_path, text: str, name: str = "events.yaml") -> tuple[str, ...]:
    path = tmp_path / name
    path.write_text(text)
    return ("serve", "simulate", "--model", MODEL, "-t", "1", "-p", "1", "--replicas", "2", "--requests", "30",
            "--qps", "6", "--prompt-tokens", "fixed:128", "--output-tokens", "fixed:32", "--events", str(path))


def test_serve_simulate_events_json_and_summary(cli, tmp_path) -> None:
    flags = _cli_flags(tmp_path, "at_s,event,device\n2,lose,1\n3,add,4\n", "events.csv")
    result = cli(*flags, "--json")
    assert result.code == 0, result.err
    changes = json.loads(result.out)["reconfigurations"]
    assert [change["at_s"] for change in changes] == [2.0, 3.0]
    for change in changes:
        assert {"at_s", "plan", "moved_bytes", "seconds", "latency"} <= set(change)
        assert set(change["latency"]) == {"before", "during", "after"}
    assert changes[0]["plan"]["devices"] == [0] and changes[1]["plan"]["devices"] == [0, 4]
    assert changes[1]["moved_bytes"] > 0 and changes[1]["plan"]["moves"][0]["src"] == 0
    text = cli(*flags)
    assert text.code == 0 and "at 2 s (lose device 1)" in text.out and "add device 4" in text.out


@pytest.mark.parametrize("text,fragment", [
    ("- {at_s: 1, event: lose, device: 9}\n", "events[0].device=9"),
    ("- {at_s: 2, event: lose, device: 1}\n- {at_s: 1, event: add, device: 3}\n", "events[1].at_s=1"),
    ("- {at_s: 1, event: lose, device: 5}\n", "events[0].device=5"),
    ("- {at_s: 1, event: add, device: 0}\n", "events[0].device=0"),
    ("- {at_s: 1, event: explode, device: 0}\n", "events[0].event=explode"),
    ("- {at_s: 1, event: lose}\n", "events[0]="),
    ("[]\n", "events="),
])
def test_bad_events_are_one_error_line(cli, tmp_path, text, fragment) -> None:
    assert_one_line_error(cli(*_cli_flags(tmp_path, text)), fragment)


def test_streamed_blocks_are_not_moved() -> None:
    model, cluster, trace = load_model(MODEL), load_cluster(CLUSTER), _trace()
    config = ServeConfig(instances=Instances(tp=1, pp=1, count=1), scheduler=SchedulerSpec(max_batch=16, chunk=256),
                         resident=0.5)
    stage = build_deployment(config, model, cluster).instances[0].stages[0]
    at = float(trace.arrived_at[10])
    change = simulate_with_events(config, model, cluster, trace, _events((at, "add", 3))).reconfigurations[0]
    # the new replica receives what its peer keeps on the GPU; the streamed blocks stay in host memory
    held = stage.weight_bytes - stage.streamed_blocks * stage.block_weight_bytes
    assert change.moved_bytes == pytest.approx(held, rel=1e-9)
