"""A kind registered through the public rules API, with no other file changed: a ``P``
prefetch on the device's host link that needs its stage-microbatch's forward and holds a
buffer of half its activations. Validation, lowering and simulation, memory, waits, the
solver's memory model and the views all follow it; every expectation below is worked by
hand from the rule, not read back from the code."""

from __future__ import annotations

import json
import re

import pytest
from matplotlib.colors import to_hex
from rich.console import Console

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.io import grid, load_schedule, save_schedule
from pipesched.ops import B, F, I, Op, OpKind, W
from pipesched.render.gantt import gantt_figure, render_gantt
from pipesched.render.html import render_html
from pipesched.render.terminal import grid_view
from pipesched.render.trace import trace_document
from pipesched.render.waits import wait_texts
from pipesched.rules import AT_START, HOST_LINK, RULES, KindRule, MemoryEffect, Need
from pipesched.schedule import Placement, Schedule
from pipesched.search.problem import MemoryGrid
from pipesched.simulate import compile_graph, run
from pipesched.slots import slot_table
from pipesched.validation import LOCAL_ORDER, MEMORY, MISSING, validate
from pipesched.waits import WAIT_DEPENDENCY, waited_for

P = "P"
PREFETCH = KindRule(P, "prefetch into a host-link buffer", needs=(Need(0, (F,)),), cost="forward",
                    memory=MemoryEffect(whole=+0.5, at=AT_START), stream=HOST_LINK)
TOY = RULES.with_kind(PREFETCH, complete=(frozenset({F, P, B}), frozenset({F, P, I, W})))
TABLE = ["0F0 0P0 0F1 0P1 0B0 0B1", "1F0 1P0 1B0 1F1 1P1 1B1"]


def toy(lines: list[str]) -> Schedule:
    rows = tuple(tuple(Op.parse(token, TOY) for token in line.split()) for line in lines)
    return Schedule("toy", Placement.one_per_device(2), 2, rows, rules=TOY)


def test_validate_follows_the_toy_kind() -> None:
    assert validate(toy(TABLE)) == []
    missing = validate(toy(["0F0 0P0 0F1 0P1 0B0 0B1", "1F0 1P0 1B0 1F1 1B1"]))
    assert [(v.kind, v.ops) for v in missing] == [(MISSING, (Op(1, P, 1),))]
    assert missing[0].message.startswith("1P1 is missing")
    early = validate(toy(["0P0 0F0 0F1 0P1 0B0 0B1", TABLE[1]]))
    assert [v.kind for v in early] == [LOCAL_ORDER]
    assert early[0].message == "device 0 runs 0P0 (position 0) before 0F0 (position 1), which it needs"
    # a command that needs the table refuses it with the same first violation, in one line
    with pytest.raises(PipeschedError, match=r"^stage_microbatch=1,1: 1P1 is missing"):
        slot_table(toy(["0F0 0P0 0F1 0P1 0B0 0B1", "1F0 1P0 1B0 1F1 1B1"]))
    # in flight (slot units): F 1, P 0.5, B -1; device 0 reaches 3 at 0P1
    over = validate(toy(TABLE), activation_limit=2)
    assert [(v.kind, v.ops) for v in over] == [(MEMORY, (Op(0, P, 1),))]


def test_lowering_and_simulation_follow_the_toy_kind() -> None:
    # slots F = P = 1, B = 2; P runs on the host link once its F (the compute op before it) ends:
    #   d0 compute: 0F0 [0,1] 0F1 [1,2]            0B0 [4,6]   0B1 [7,9]
    #   d0 host:          0P0 [1,2] 0P1 [2,3]
    #   d1 compute:       1F0 [1,2] 1B0 [2,4] 1F1 [4,5] 1B1 [5,7]
    #   d1 host:                1P0 [2,3]          1P1 [5,6]
    timeline = slot_table(toy(TABLE))
    times = {str(timeline.op(r)): (timeline.op_start[r], timeline.op_end[r]) for r in range(len(timeline))}
    assert times == {"0F0": (0, 1), "0P0": (1, 2), "0F1": (1, 2), "0P1": (2, 3), "0B0": (4, 6), "0B1": (7, 9),
                     "1F0": (1, 2), "1P0": (2, 3), "1B0": (2, 4), "1F1": (4, 5), "1P1": (5, 6), "1B1": (5, 7)}
    assert timeline.makespan == 9.0


def test_memory_follows_the_toy_kind() -> None:
    # F allocates 4 B as it starts, P 2 B (half of them) as it starts, B frees 4 B as it ends;
    # the same times as the slot table (free network, 1 s ops, B = 2 s); ties in table order
    graph = compile_graph(toy(TABLE), StageCosts.uniform(2, activation_bytes=4.0), None)
    memory = run(graph).memory
    assert [list(values) for values in memory.values] == [[0, 4, 6, 10, 12, 8, 4], [0, 4, 6, 2, 6, 8, 4]]
    assert memory.peak == (12.0, 8.0)
    # the solver's memory grid counts the prefetch buffer as the simulator does: 2 of 4 units
    grid = MemoryGrid(1.0, (4, 4), (2, 2), None)
    assert [grid.change(kind, 0, TOY) for kind in (F, P, B)] == [4, 2, -4]


def test_waits_follow_the_toy_kind() -> None:
    timeline = slot_table(toy(TABLE))
    waits = waited_for(timeline)
    texts = dict(zip((str(timeline.op(r)) for r in range(len(timeline))), wait_texts(timeline, waits), strict=True))
    # a prefetch waits for its forward (its need: a dependency, named before the device)
    assert texts["0P0"] == "dependency: 0F0 on device 0 ended at 1 slots"
    assert texts["1P1"] == "dependency: 1F1 on device 1 ended at 5 slots"
    rows = [r for r in range(len(timeline)) if str(timeline.op(r)) in ("0P0", "0P1", "1P0", "1P1")]
    assert (waits.cause[rows] == WAIT_DEPENDENCY).all()


def test_views_follow_the_toy_kind() -> None:
    timeline = slot_table(toy(TABLE))
    console = Console(width=120, record=True, color_system=None)
    console.print(grid_view(timeline, width=120, color=False))
    lines = console.export_text().splitlines()
    # the host-link rows hold the prefetches in their slots; the legend names the kind
    assert lines[3].split() == ["h0", "·", "0P0", "0P1", "·", "·", "·", "·", "·", "·"]
    assert lines[4].split() == ["h1", "·", "·", "1P0", "·", "·", "1P1", "·", "·", "·"]
    assert "P  prefetch into a host-link buffer" in lines[5]
    # the HTML page's data: the table's kinds by index, the prefetch last, in a colour of its own
    page = render_html([timeline])
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)[1])
    kinds = data["kinds"]
    assert kinds["letters"] == ["F", "I", "W", "B", "O", "R", "OVERLAP_F_B", "P"]
    assert kinds["names"][-1] == PREFETCH.summary
    assert kinds["colors"][-1] not in kinds["colors"][:-1]


def test_gantt_follows_the_toy_kind() -> None:
    timeline = slot_table(toy(TABLE))
    built = gantt_figure([timeline])
    legend = built.figure.legends[0]
    entries = {text.get_text(): to_hex(patch.get_facecolor())
               for patch, text in zip(legend.get_patches(), legend.get_texts(), strict=True)}
    # the legend names the prefetch (its letter and its rule's summary) in a colour of its own
    color = entries[f"P  {PREFETCH.summary}"]
    assert list(entries.values()).count(color) == 1
    # its four boxes are drawn in that colour, and only they
    ops = next(c for axes in built.figure.axes for c in axes.collections if c.get_gid() == "ops-0")
    drawn = [to_hex(face) for face in ops.get_facecolors()]
    prefetches = [r for r in range(len(timeline)) if timeline.op(r).kind == P]
    assert len(prefetches) == 4
    assert [r for r, face in enumerate(drawn) if face == color] == prefetches
    # the files: a PNG, and an SVG with every box (the prefetches too) in a countable link
    assert render_gantt([timeline], fmt="png").startswith(b"\x89PNG")
    svg = render_gantt([timeline], fmt="svg")
    assert {int(row) for row in re.findall(rb'xlink:href="#op-0-(\d+)"', svg)} == set(range(len(timeline)))


def test_trace_follows_the_toy_kind() -> None:
    timeline = slot_table(toy(TABLE))
    events = trace_document([timeline])["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = {e["name"]: e for e in events if e["ph"] == "X" and "stage" in e["args"]}
    # each prefetch a slice named by its op text, in its kind's category, on its device's
    # host-link thread, at its slot times (1 slot = 1000 us), waiting for its forward
    for name, (start, end) in {"0P0": (1, 2), "0P1": (2, 3), "1P0": (2, 3), "1P1": (5, 6)}.items():
        event = slices[name]
        assert (event["cat"], event["args"]["kind"]) == (PREFETCH.summary, P)
        assert threads[(event["pid"], event["tid"])] == "host link"
        assert (event["ts"], event["dur"]) == (1000.0 * start, 1000.0 * (end - start))
        assert event["args"]["waited for event"] == slices[name.replace(P, "F")]["args"]["event"]
    assert len(slices) == len(timeline)


def test_op_text_and_the_grid_format_read_the_toy_kind_with_its_rules() -> None:
    # written by hand: the prefetch is an op like any other, read as the kind the rules hold
    assert Op.parse("1P0", TOY) == Op(1, P, 0) and Op.parse("1P0.2", TOY).step == 2
    assert Op.parse("(0F1;1P0)OVERLAP_F_B", TOY).parts == (Op(0, F, 1), Op(1, P, 0))
    schedule = toy(TABLE)
    text = grid.dumps(schedule)
    # each device's row holds its ops in table order (``.`` an idle step between them)
    rows = [[token for token in line.split()[1:] if token != "."] for line in text.splitlines() if line.startswith("d")]
    assert rows == [line.split() for line in TABLE]
    again = grid.loads(text, rules=TOY)
    assert again == schedule and again.rules is TOY and validate(again) == []
    # the default rules (every OpKind) know no P: one line naming the token and their kinds
    assert {str(rule.kind) for rule in RULES} == {kind.value for kind in OpKind}
    known = r"their kinds: F, I, W, B, O, R \(fused: OVERLAP_F_B\)$"
    with pytest.raises(PipeschedError, match=r"^<text>:\d+:9: bad op token '0P0': P is not a kind of the rules; " + known):
        grid.loads(text)
    with pytest.raises(PipeschedError, match=r"^op='0P0': not an op; P is not a kind of the rules; " + known):
        Op.parse("0P0")


@pytest.mark.parametrize("suffix", [".txt", ".json"])
def test_a_schedule_file_of_the_toy_kind_is_read_with_its_rules(tmp_path, suffix) -> None:
    schedule = toy(TABLE)
    path = save_schedule(schedule, tmp_path / f"toy{suffix}")
    again = load_schedule(path, rules=TOY)
    assert again == schedule and again.rules is TOY
    with pytest.raises(PipeschedError, match=r"bad op token '0P0': P is not a kind of the rules"):
        load_schedule(path)


def test_a_schedule_file_of_an_unknown_kind_is_one_line_naming_the_known_kinds(cli, tmp_path) -> None:
    path = tmp_path / "toy.txt"
    path.write_text(grid.dumps(toy(TABLE)))
    assert_one_line_error(cli("validate", str(path)), "toy.txt:", "bad op token '0P0'", "P is not a kind of the rules",
                          "their kinds: F, I, W, B, O, R (fused: OVERLAP_F_B)")
