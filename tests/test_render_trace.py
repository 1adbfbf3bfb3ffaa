"""Perfetto / Chrome trace: structure per the trace event format, events one to one with
the timeline's ops and transfers."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import replace
from itertools import pairwise

import pytest

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render.trace import render_trace
from pipesched.simulate import critical_path
from pipesched.slots import slot_table
from render_timelines import GIB, simulated, split_backward, with_transfers

# keys every event of a phase must carry (Trace Event Format)
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "M": {"name", "ph", "pid", "args"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "s": {"name", "cat", "ph", "id", "ts", "pid", "tid"},
    "f": {"name", "cat", "ph", "id", "ts", "pid", "tid", "bp"},
    "i": {"name", "ph", "ts", "pid", "s"},
}


def load(timelines) -> dict:
    return json.loads(render_trace(timelines))


def check_format(document: dict) -> list[dict]:
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    for event in events:
        assert event["ph"] in REQUIRED, event
        assert REQUIRED[event["ph"]] <= set(event), event
        if "ts" in event:
            assert isinstance(event["ts"], int | float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "M":
            assert event["name"] in {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
    return events


def slices(events) -> dict[tuple[int, int], list[tuple[float, float, dict]]]:
    out = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            out[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"], event))
    return out


def enclosing(threads, pid, tid, ts) -> list[dict]:
    return [e for start, end, e in threads[(pid, tid)] if start <= ts <= end]


@pytest.mark.parametrize("make", [
    lambda: with_transfers(generate("1f1b", 4, 8), capacity=16 * GIB),
    lambda: simulated(split_backward(generate("gpipe", 4, 6))),
])
def test_events_match_the_timeline_one_to_one(make) -> None:
    timeline = make()
    events = check_format(load([timeline]))
    xs = [e for e in events if e["ph"] == "X" and e["cat"] != "critical path"]
    ops = [e for e in xs if e["cat"] != "transfer"]
    transfers = [e for e in xs if e["cat"] == "transfer"]
    assert len(ops) == len(timeline) and len(transfers) == len(timeline.transfers)
    # timestamps: microseconds from the iteration start
    for row, event in enumerate(ops):
        assert event["name"] == str(timeline.op(row))
        assert event["pid"] == 1 + int(timeline.op_device[row])
        assert event["ts"] == pytest.approx((timeline.op_start[row] - timeline.origin) * 1e6, abs=1e-3)
        assert event["dur"] == pytest.approx((timeline.op_end[row] - timeline.op_start[row]) * 1e6, abs=2e-3)
        assert event["args"]["stage"] == timeline.op_stage[row]
        assert event["args"]["microbatch"] == timeline.op_microbatch[row]
    table = timeline.transfers
    for row, event in enumerate(transfers):
        assert event["pid"] == 1 + int(table.src_device[row])
        assert event["args"]["dst device"] == table.dst_device[row]
        assert event["ts"] == pytest.approx((table.start[row] - timeline.origin) * 1e6, abs=1e-3)


def test_processes_threads_and_counters() -> None:
    timeline = with_transfers(generate("1f1b", 4, 8))
    events = check_format(load([timeline]))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {**{d + 1: f"1f1b · device {d}" for d in range(4)}, 5: "1f1b · critical path"}
    assert all(names[(d + 1, 1)] == "compute" for d in range(4))
    # one send thread per link a device sends on; every transfer sits on its link's thread
    for event in events:
        if event.get("cat") == "transfer":
            src, dst = event["args"]["src device"], event["args"]["dst device"]
            assert names[(event["pid"], event["tid"])] == f"send link d{src}->d{dst}"
    # slices on one thread never overlap
    for items in slices(events).values():
        items.sort(key=lambda item: item[0])
        assert all(a[1] <= b[0] + 1e-6 for a, b in pairwise(items))
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == sum(len(t) for t in timeline.memory.times)
    peak = max(e["args"]["bytes"] for e in counters)
    assert peak == max(timeline.memory.peak)


def test_flows_go_from_each_transfer_to_its_receiving_op() -> None:
    timeline = simulated(generate("1f1b", 4, 8))
    events = check_format(load([timeline]))
    threads = slices(events)
    starts = [e for e in events if e["ph"] == "s" and e["cat"] == "dependency"]
    finishes = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "dependency"}
    assert len(starts) == len(finishes) == len(timeline.transfers)  # no all-reduce with one replica
    assert len({e["id"] for e in starts}) == len(starts)
    for start in starts:
        finish = finishes[start["id"]]
        assert (start["cat"], start["name"]) == (finish["cat"], finish["name"])
        sender = enclosing(threads, start["pid"], start["tid"], start["ts"])
        receiver = enclosing(threads, finish["pid"], finish["tid"], finish["ts"])
        assert len(sender) == 1 and sender[0]["cat"] == "transfer"
        assert len(receiver) == 1 and receiver[0]["name"] == start["name"].removeprefix("to ")
        # the data goes where the transfer says, to the op that needs it
        assert receiver[0]["pid"] == 1 + sender[0]["args"]["dst device"]
        assert receiver[0]["args"]["microbatch"] == sender[0]["args"]["microbatch"]
        assert receiver[0]["ts"] >= sender[0]["ts"] + sender[0]["dur"] - 1e-3


def test_slot_table_trace_uses_1000_us_slots_and_flows_between_ops() -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    document = load([timeline])
    events = check_format(document)
    assert "1 slot = 1000 us" in document["otherData"]["time unit"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "critical path"]
    assert [e["ts"] for e in ops] == [1000.0 * t for t in timeline.op_start]
    # cross-device dependencies: 3 activations and 3 gradients per microbatch
    flows = Counter(e["ph"] for e in events if e["ph"] in "sf" and e["cat"] == "dependency")
    assert flows == {"s": 6 * 8, "f": 6 * 8}
    threads = slices(events)
    for event in events:
        if event["ph"] in "sf":
            assert len(enclosing(threads, event["pid"], event["tid"], event["ts"])) == 1


def test_several_timelines_get_their_own_processes() -> None:
    timelines = [slot_table(generate("gpipe", 2, 2)), slot_table(generate("1f1b", 3, 3))]
    events = check_format(load(timelines))
    processes = sorted((e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name")
    assert processes == [(1, "gpipe · device 0"), (2, "gpipe · device 1"), (3, "gpipe · critical path"),
                         (4, "1f1b · device 0"), (5, "1f1b · device 1"), (6, "1f1b · device 2"),
                         (7, "1f1b · critical path")]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "critical path"]
    assert len(ops) == len(timelines[0]) + len(timelines[1])
    # event names are unique across the timelines of one trace
    assert len({e["args"]["event"] for e in ops}) == len(ops)


def test_no_timelines_is_a_user_error() -> None:
    with pytest.raises(PipeschedError, match=r"^timelines=0: "):
        render_trace([])


def test_overlapping_transfers_go_to_extra_lanes() -> None:
    timeline = with_transfers(generate("gpipe", 3, 6))
    table = timeline.transfers
    # stretch every transfer backwards so those sharing a link overlap
    stretched = replace(table, start=table.start - 5 * (table.end - table.start))
    events = check_format(load([replace(timeline, transfers=stretched)]))
    for items in slices(events).values():
        items.sort(key=lambda item: item[0])
        assert all(a[1] <= b[0] + 1e-6 for a, b in pairwise(items))
    names = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert "send link d0->d1 2" in names
    assert sum(1 for e in events if e.get("cat") == "transfer") == len(table)


def by_event(events) -> dict[str, dict]:
    """The op and transfer slices by their ``args.event`` name (the critical-path track's
    copies left out)."""
    return {e["args"]["event"]: e for e in events if e["ph"] == "X" and e["cat"] != "critical path"}


def flow_pairs(events, category) -> list[tuple[dict, dict]]:
    finishes = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == category}
    return [(e, finishes[e["id"]]) for e in events if e["ph"] == "s" and e["cat"] == category]


def bound(threads, event) -> dict:
    inside = [e for e in enclosing(threads, event["pid"], event["tid"], event["ts"]) if e["dur"] > 0]
    assert len(inside) == 1, event
    return inside[0]


def test_each_transfer_has_a_flow_from_its_producer_and_to_its_consumer() -> None:
    timeline = simulated(generate("1f1b", 4, 8))
    events = check_format(load([timeline]))
    threads, named = slices(events), by_event(events)
    sends = {bound(threads, f)["args"]["event"]: bound(threads, s) for s, f in flow_pairs(events, "send")}
    receives = {bound(threads, s)["args"]["event"]: bound(threads, f) for s, f in flow_pairs(events, "dependency")}
    table = timeline.transfers
    assert len(sends) == len(receives) == len(table)
    for row in range(len(table)):
        transfer = named[f"transfer {row}"]
        producer, consumer = sends[f"transfer {row}"], receives[f"transfer {row}"]
        # the rule, stated on its own: an activation leaves F(s) for F(s+1), a gradient
        # leaves B(s) for B(s-1), both of the transfer's microbatch
        stage, mb = int(table.stage[row]), int(table.microbatch[row])
        kind, step = ("F", 1) if table.kind[row] == 0 else ("B", -1)
        assert producer["name"] == f"{stage}{kind}{mb}" and producer["pid"] == transfer["pid"]
        assert consumer["name"] == f"{stage + step}{kind}{mb}"
        assert consumer["pid"] == 1 + transfer["args"]["dst device"]
        # the transfer names both ends by their event names
        assert transfer["args"]["producer"] == producer["args"]["event"]
        assert transfer["args"]["consumer"] == consumer["args"]["event"]
        assert producer["ts"] + producer["dur"] <= transfer["ts"] + 1e-3 <= consumer["ts"] + 1e-3
    # each arrow is named after what it carries to
    assert all(s["name"] == f"sends {bound(threads, f)['name']}" for s, f in flow_pairs(events, "send"))


def test_ops_flow_to_the_later_ops_of_their_device_that_need_them() -> None:
    timeline = slot_table(split_backward(generate("1f1b", 3, 4)))
    events = check_format(load([timeline]))
    threads = slices(events)
    pairs = {(bound(threads, s)["name"], bound(threads, f)["name"]) for s, f in flow_pairs(events, "same device")}
    # per stage and microbatch: F -> I (the activations it keeps) and I -> W
    expected = {(f"{s}{a}{mb}", f"{s}{b}{mb}") for s in range(3) for mb in range(4) for a, b in (("F", "I"), ("I", "W"))}
    assert pairs == expected


def test_fused_ops_flows_bind_to_the_drawn_box() -> None:
    timeline = slot_table(generate("dualpipev", 4, 8))
    events = check_format(load([timeline]))
    threads = slices(events)
    for category in ("dependency", "same device"):
        pairs = flow_pairs(events, category)
        assert pairs
        for start, finish in pairs:
            assert bound(threads, start) is not bound(threads, finish)


def test_critical_flag_and_track_follow_the_critical_path() -> None:
    timeline = simulated(generate("1f1b", 4, 8))
    path = critical_path(timeline)
    events = check_format(load([timeline]))
    named = by_event(events)
    expected = {f"{'transfer' if t else 'op'} {row}" for t, row in zip(path.is_transfer.tolist(), path.row.tolist(),
                                                                        strict=True)}
    assert {name for name, e in named.items() if e["args"]["critical"]} == expected
    track = [e for e in events if e["ph"] == "X" and e["cat"] == "critical path"]
    assert [e["args"]["event"] for e in track] == [
        f"{'transfer' if t else 'op'} {row}" for t, row in zip(path.is_transfer.tolist(), path.row.tolist(), strict=True)]
    assert {e["pid"] for e in track} == {5}
    for copy in track:
        original = named[copy["args"]["event"]]
        assert (copy["ts"], copy["dur"], copy["name"]) == (original["ts"], original["dur"], original["name"])


def test_wait_reason_names_the_event_that_released_the_op() -> None:
    timeline = simulated(generate("1f1b", 4, 8))
    events = check_format(load([timeline]))
    named = by_event(events)
    ops = [e for e in named.values() if e["cat"] != "transfer"]
    for op in ops:
        ref = op["args"].get("waited for event")
        if ref is None:
            assert op["args"]["waited for"].startswith("nothing") and op["ts"] == 0
            continue
        cause = named[ref]
        # the releasing event ended when the op started, and the words say the same kind
        assert cause["ts"] + cause["dur"] == pytest.approx(op["ts"], abs=2e-3)
        assert op["args"]["waited for"].startswith("transfer") == ref.startswith("transfer ")


def test_capacity_counter_and_out_of_memory_instants() -> None:
    capacity = 16 * GIB
    timeline = with_transfers(generate("gpipe", 4, 8), capacity=capacity)
    memory = timeline.memory
    events = check_format(load([timeline]))
    capacities = [e for e in events if e["ph"] == "C" and e["name"] == "memory capacity"]
    assert {e["pid"] for e in capacities} == {1, 2, 3, 4}
    assert all(e["args"]["bytes"] == capacity for e in capacities)
    instants = [e for e in events if e["ph"] == "i"]
    expected = []
    for device in range(4):
        below = True
        for time, value in zip(memory.times[device].tolist(), memory.values[device].tolist(), strict=True):
            if below and value > capacity:
                expected.append((device + 1, round((time - timeline.origin) * 1e6, 3)))
            below = value <= capacity
    assert expected
    assert sorted((e["pid"], e["ts"]) for e in instants) == sorted(expected)
    assert {e["pid"] for e in instants} == {d + 1 for d, oom in enumerate(memory.out_of_memory) if oom}
    assert all(e["name"] == "out of memory" and e["args"]["bytes"] > capacity for e in instants)


def test_no_capacity_no_out_of_memory_marker() -> None:
    events = check_format(load([with_transfers(generate("gpipe", 4, 8))]))
    assert not [e for e in events if e["ph"] == "i" or e["name"] == "memory capacity"]
