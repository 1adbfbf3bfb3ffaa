"""A kind registered through the public rules API, with no other file changed: a ``P``
prefetch on the device's host link that needs its stage-microbatch's forward and holds a
buffer of half its activations. Validation, lowering and simulation, memory, waits, the
solver's memory model and the views all follow it; every expectation below is worked by
hand from the rule, not read back from the code."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.ops import B, F, I, Op, W
from pipesched.render.html import render_html
from pipesched.render.terminal import grid_view
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
    rows = tuple(tuple(Op(int(t[0]), P if t[1] == P else Op.parse(t).kind, int(t[2:])) for t in line.split())
                 for line in lines)
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
