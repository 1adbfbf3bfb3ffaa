"""Extension point (c): an all-to-all among a group of devices as transfers that share
links with the pipeline's messages, and fused ops made of compute and communication phases
whose overlapped time comes from the phases. Times by hand in the comments."""

from __future__ import annotations

import doctest
import importlib

import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.ops import B, F
from pipesched.simulate import Network, compile_graph, run
from pipesched.simulate.collective import with_all_to_all
from pipesched.simulate.phases import COMPUTE, LINK, Phase, overlapped, phase_durations, serial_time
from pipesched.timeline import ALL_TO_ALL


def rows_of(schedule) -> list[str]:
    return [str(op) for _, op in schedule.ops()]


def toy_graph(contention: bool = True):
    """1F1B on two devices, one microbatch: F = 1, B = 2; 2 bytes of activation at 1 byte/s."""
    schedule = generate("1f1b", 2, 1)
    network = Network.uniform(2, latency=0.0, bandwidth=1.0)
    costs = StageCosts.uniform(2, output_bytes=2.0)
    return schedule, compile_graph(schedule, costs, network, contention=contention)


def test_all_to_all_shares_the_links_of_point_to_point_messages():
    schedule, graph = toy_graph()
    rows = rows_of(schedule)
    # each device's forward dispatches to the other, each backward waits for what it receives:
    # 3 bytes from device 0 to 1, 4 bytes from 1 to 0
    graph = with_all_to_all(graph, [rows.index("0F0"), rows.index("1F0")], [rows.index("0B0"), rows.index("1B0")],
                            [[0.0, 3.0], [4.0, 0.0]])
    timeline = run(graph)
    table = timeline.transfers
    pair = {(int(a), int(b)): (float(s), float(e)) for a, b, k, s, e in
            zip(table.src_device, table.dst_device, table.kind, table.start, table.end, strict=True) if k == ALL_TO_ALL}
    # 0F0 [0,1]; on the link 0->1 the activation (2 s) goes first [1,3], then the 3-byte part [3,6]
    # 1F0 [3,4] sends its 4-byte part 1->0 [4,8]; 1B0 waits for the part it receives: [6,8]
    # the gradient 1->0 queues behind the part on that link [8,10]; 0B0 [10,12]
    assert pair == {(0, 1): (3.0, 6.0), (1, 0): (4.0, 8.0)}
    got = {name: (float(s), float(e)) for name, s, e in zip(rows, timeline.op_start, timeline.op_end, strict=True)}
    assert got == {"0F0": (0, 1), "0B0": (10, 12), "1F0": (3, 4), "1B0": (6, 8)}
    assert timeline.makespan == 12.0


def test_a_three_way_all_to_all_queues_on_each_members_channels():
    schedule = generate("1f1b", 3, 1)
    network = Network.uniform(3, latency=0.0, bandwidth=1.0)
    graph = compile_graph(schedule, StageCosts.uniform(3), network)  # F = 1, B = 2, messages of 0 bytes
    rows = rows_of(schedule)
    graph = with_all_to_all(graph, [rows.index(f"{s}F0") for s in range(3)], [rows.index(f"{s}B0") for s in range(3)],
                            [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    timeline = run(graph)
    table = timeline.transfers
    pair = {(int(a), int(b)): (float(s), float(e)) for a, b, k, s, e in
            zip(table.src_device, table.dst_device, table.kind, table.start, table.end, strict=True) if k == ALL_TO_ALL}
    # a member's two parts share its send channel, a receiver's two its receive channel, and
    # the pipeline's messages queue with them: 0F0 ends at 1: 0->1 [1,2], 0->2 [2,3]; 1F0 [1,2]
    # sends its activation to device 2 once 0->2 frees device 2's receive channel [3,3], then
    # 1->0 [3,4] and 1->2 [4,5]; 2F0 [3,4] sends 2->0 [4,5], then 2->1 [5,6]
    assert pair == {(0, 1): (1, 2), (0, 2): (2, 3), (1, 0): (3, 4), (1, 2): (4, 5), (2, 0): (4, 5), (2, 1): (5, 6)}
    got = {name: (float(s), float(e)) for name, s, e in zip(rows, timeline.op_start, timeline.op_end, strict=True)}
    # each backward waits for the last part it receives: 2B0 after 1->2 [5,7]; 1B0 after its
    # gradient (7) [7,9]; 0B0 after its gradient (9) [9,11]
    assert got == {"0F0": (0, 1), "1F0": (1, 2), "2F0": (3, 4), "2B0": (5, 7), "1B0": (7, 9), "0B0": (9, 11)}


def test_without_contention_the_parts_do_not_queue():
    schedule, graph = toy_graph(contention=False)
    rows = rows_of(schedule)
    graph = with_all_to_all(graph, [rows.index("0F0"), rows.index("1F0")], [rows.index("0B0"), rows.index("1B0")],
                            [[0.0, 3.0], [4.0, 0.0]])
    timeline = run(graph)
    got = {name: (float(s), float(e)) for name, s, e in zip(rows, timeline.op_start, timeline.op_end, strict=True)}
    # the 0->1 part [1,4] beside the activation [1,3]; 1F0 [3,4]; 1B0 [4,6]; part 1->0 [4,8],
    # gradient [6,8]: 0B0 [8,10]
    assert got == {"0F0": (0, 1), "0B0": (8, 10), "1F0": (3, 4), "1B0": (4, 6)}


def test_all_to_all_needs_a_network():
    schedule = generate("1f1b", 2, 1)
    graph = compile_graph(schedule, StageCosts.uniform(2))
    with pytest.raises(PipeschedError, match="network"):
        with_all_to_all(graph, [0, 2], [1, 3], [[0, 1], [1, 0]])


# a mixture-of-experts forward and backward: attention, dispatch, experts, combine
FORWARD = (Phase(COMPUTE, 2.0, "attention"), Phase(LINK, 1.0, "dispatch"), Phase(COMPUTE, 2.0, "experts"),
           Phase(LINK, 1.0, "combine"))
BACKWARD = (Phase(COMPUTE, 3.0, "experts"), Phase(LINK, 2.0, "dispatch"), Phase(COMPUTE, 3.0, "attention"),
            Phase(LINK, 2.0, "combine"))


def test_overlapped_pair_interleaves_communication_with_the_other_compute():
    pair = overlapped(FORWARD, BACKWARD)
    # F attention [0,2] (ties go to F); F dispatch [2,3] while B's experts compute [2,5];
    # F experts [5,7] while B's dispatch [5,7]; F combine [7,8] while B's attention [7,10]; B combine [10,12]
    assert pair.start == ((0, 2, 5, 7), (2, 5, 7, 10))
    assert pair.end == ((2, 3, 7, 8), (5, 7, 10, 12))
    assert pair.makespan == 12.0
    alone = serial_time(FORWARD) + serial_time(BACKWARD)  # 6 + 10
    assert max(serial_time(FORWARD), serial_time(BACKWARD)) < pair.makespan < alone


def test_a_fused_entry_takes_its_phases_time_end_to_end():
    schedule = generate("dualpipe", 4, 8)
    graph = compile_graph(schedule, StageCosts.uniform(4, backward_input=5.0, backward_weight=5.0))
    phases = {F: FORWARD, B: BACKWARD}
    durations = phase_durations(graph, lambda op: phases.get(op.kind))
    timeline = run(graph, op_durations=durations)
    fused = plain_f = 0
    row = 0
    for entry in (entry for ops in schedule.device_ops for entry in ops):
        span = float(timeline.op_end[row] - timeline.op_start[row])
        if entry.parts:
            kinds = tuple(part.kind for part in entry.parts)
            # (F, B): the interleaving above, 12; (F, I): I has no phases, one compute phase of
            # its own 5: F attention [0,2], F dispatch [2,3] beside I [2,7], F experts [7,9], combine [9,10]
            assert span == (12.0 if kinds == (F, B) else 10.0), entry
            fused += 1
        elif entry.kind == F:
            assert span == serial_time(FORWARD)
            plain_f += 1
        row += len(entry.atoms)
    assert fused and plain_f


@pytest.mark.parametrize("name", ["pipesched.simulate.phases", "pipesched.simulate.policy"])
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
