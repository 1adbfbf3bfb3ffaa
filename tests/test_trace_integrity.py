"""The Perfetto trace opened beyond its schema: every flow's two ends pair up and bind to a
slice, each track's events run forward in time, counters never go negative."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from itertools import pairwise

import pytest

from pipesched.costs import StageCosts
from pipesched.generators import generate
from pipesched.passes.offload import OffloadPolicy, offload
from pipesched.render.trace import render_comparison_trace, render_trace
from pipesched.simulate import Network, simulate
from pipesched.simulate.iterations import steady_state
from pipesched.slots import slot_table
from render_timelines import GIB, measured_like, simulated, split_backward


def _offloading():
    schedule = offload(generate("1f1b", 4, 8), OffloadPolicy(stages=(0, 1)))
    costs = StageCosts.uniform(4, forward=1e-3, backward_input=1e-3, backward_weight=1e-3, output_bytes=2**20,
                               activation_bytes=GIB)
    network = Network.uniform(4, latency=5e-6, bandwidth=50e9)
    network = dataclasses.replace(network, host_bandwidth=(2e9,) * 4, host_latency=(0.0,) * 4)
    return simulate(schedule, costs, network)


TRACES = {
    "out of memory": lambda: render_trace([simulated(generate("1f1b", 4, 8), capacity=3 * GIB)]),
    "fused pairs": lambda: render_trace([simulated(generate("dualpipev", 4, 8))]),
    "offloads": lambda: render_trace([_offloading()]),
    "steady state": lambda: render_trace([steady_state(generate("pipedream", 4, 8, iterations=4),
                                                       StageCosts.slots().broadcast(4)).timeline]),
    "several": lambda: render_trace([slot_table(generate("zb-v", 4, 8)), simulated(split_backward(
        generate("gpipe", 4, 6)))]),
    "predicted and measured": lambda: render_comparison_trace([
        (predicted, measured_like(predicted, seed=2))
        for predicted in (simulated(generate("1f1b", 2, 4)), simulated(split_backward(generate("1f1b", 2, 4))))]),
}


@pytest.fixture(scope="module", params=sorted(TRACES))
def trace(request, tmp_path_factory) -> tuple[dict, str]:
    text = TRACES[request.param]()
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    path.write_text(text)
    return json.loads(text), str(path)


def _tracks(events) -> dict[tuple[int, int], list[dict]]:
    """The slices of each (process, thread), in file order."""
    tracks = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            tracks[(event["pid"], event["tid"])].append(event)
    return tracks


def test_every_flow_pairs_one_start_with_one_finish_bound_to_slices(trace) -> None:
    check_flows(trace[0])


def test_each_track_runs_forward_in_time(trace) -> None:
    check_tracks(trace[0])


def test_counters_are_never_negative(trace) -> None:
    check_counters(trace[0])


def test_a_trace_the_cli_writes_holds_together(cli, tmp_path) -> None:
    # the default scenario: links, memory over time, devices out of memory, fused pairs
    path = tmp_path / "dualpipev.json"
    assert cli("simulate", "dualpipev", "-p", "4", "-m", "8", "--perfetto", str(path), "--no-timeline").code == 0
    document = json.loads(path.read_text())
    assert any(e["name"] == "out of memory" for e in document["traceEvents"])
    check_flows(document)
    check_tracks(document)
    check_counters(document)


def check_flows(document: dict) -> None:
    """Every flow id has one start and one finish, of one category and name, forward in
    time, each inside a slice of its thread."""
    events = document["traceEvents"]
    ends = defaultdict(list)
    for event in events:
        if event["ph"] in ("s", "t", "f"):
            ends[event["id"]].append(event)
    assert ends, "the trace has flows"
    tracks = _tracks(events)
    for flow, pair in ends.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], (flow, pair)
        start, finish = sorted(pair, key=lambda e: e["ph"] == "f")
        assert start["cat"] == finish["cat"] and start["name"] == finish["name"]
        # a flow runs forward in time, from inside one slice to inside another
        assert start["ts"] <= finish["ts"], pair
        for end in pair:
            inside = [s for s in tracks[(end["pid"], end["tid"])] if s["ts"] <= end["ts"] <= s["ts"] + s["dur"]]
            assert inside, end


def check_tracks(document: dict) -> None:
    """Each thread's slices and each counter's samples in time order, slices nested or apart."""
    events = document["traceEvents"]
    for key, track in _tracks(events).items():
        starts = [e["ts"] for e in track]
        assert starts == sorted(starts), key
        # slices on one thread follow each other (or nest): none starts inside another and
        # ends past it
        for before, after in pairwise(track):
            assert after["ts"] >= before["ts"] + before["dur"] - 1e-3 or \
                after["ts"] + after["dur"] <= before["ts"] + before["dur"] + 1e-3, (key, before, after)
    counters = defaultdict(list)
    for event in events:
        if event["ph"] == "C":
            counters[(event["pid"], event["name"])].append(event["ts"])
    assert all(times == sorted(times) for times in counters.values()), counters.keys()


def check_counters(document: dict) -> None:
    values = [value for event in document["traceEvents"] if event["ph"] == "C" for value in event["args"].values()]
    assert all(isinstance(v, int | float) and v >= 0 for v in values)
