"""Gantt pictures: valid PNG/SVG files with one box per op and transfer."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET

import pytest

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.ops import B, F, Op
from pipesched.render import gantt
from pipesched.render.gantt import gantt_figure, render_gantt
from pipesched.schedule import Placement, Schedule
from pipesched.slot_table import slot_table
from render_timelines import GIB, simulated, split_backward, with_transfers

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_of_a_slot_table() -> None:
    timeline = slot_table(generate("1f1b", 4, 8))
    data = render_gantt([timeline], fmt="png", dpi=100)
    width, height = png_size(data)
    assert width == 1400  # 14 in at 100 dpi
    assert 150 < height < 800
    assert 10_000 < len(data) < 2_000_000
    built = gantt_figure([timeline])
    assert built.op_boxes == len(timeline) == 64
    assert built.transfer_boxes == 0
    # wide boxes at this size: every op gets its label
    assert built.labels == 64


def test_figure_draws_one_rectangle_per_op_and_transfer() -> None:
    timeline = with_transfers(generate("gpipe", 4, 6))
    built = gantt_figure([timeline])
    collections = {c.get_gid(): c for axes in built.figure.axes for c in axes.collections if c.get_gid()}
    assert len(collections["ops-0"].get_paths()) == len(timeline) == built.op_boxes
    assert len(collections["transfers-0"].get_paths()) == len(timeline.transfers) == built.transfer_boxes
    # an ops panel and a memory panel
    assert len(built.figure.axes) == 2


def test_svg_wraps_every_op_in_a_countable_link() -> None:
    timelines = [with_transfers(generate("1f1b", 4, 8), capacity=16 * GIB), slot_table(generate("gpipe", 3, 5))]
    data = render_gantt(timelines, fmt="svg")
    root = ET.fromstring(data)  # well-formed XML
    assert root.tag.endswith("svg")
    links = re.findall(rb'xlink:href="#(op|transfer)-(\d+)-(\d+)"', data)
    ops = {(int(panel), int(row)) for kind, panel, row in links if kind == b"op"}
    transfers = {(int(panel), int(row)) for kind, panel, row in links if kind == b"transfer"}
    assert ops == {(0, r) for r in range(len(timelines[0]))} | {(1, r) for r in range(len(timelines[1]))}
    assert transfers == {(0, r) for r in range(len(timelines[0].transfers))}
    assert sum(1 for kind, _, _ in links if kind == b"op") == len(timelines[0]) + len(timelines[1])
    text = data.decode()
    assert "time (ms)" in text and "time (slots)" in text and "OUT OF MEMORY" in text


def test_large_timeline_skips_labels_and_stays_fast() -> None:
    timeline = simulated(split_backward(generate("1f1b", 16, 64)))
    built = gantt_figure([timeline])
    assert built.op_boxes == len(timeline) == 3072
    assert built.labels == 0  # 1 ms boxes in a 220 ms iteration are too thin for text
    width, height = png_size(render_gantt([timeline], fmt="png", dpi=80))
    assert width == 1120 and height > 1000


def test_several_schedules_stack_on_a_shared_time_axis() -> None:
    timelines = [simulated(generate("gpipe", 4, 8)), simulated(generate("1f1b", 4, 8)),
                 slot_table(generate("1f1b", 4, 8))]
    built = gantt_figure(timelines, title="three schedules")
    ops_axes = [a for a in built.figure.axes if any(c.get_gid() and c.get_gid().startswith("ops-") for c in a.collections)]
    assert len(ops_axes) == 3
    # the two simulated panels share one axis (seconds); the slot table has its own
    assert ops_axes[0].get_xlim() == ops_axes[1].get_xlim()
    assert ops_axes[0].get_shared_x_axes().joined(ops_axes[0], ops_axes[1])
    assert not ops_axes[0].get_shared_x_axes().joined(ops_axes[0], ops_axes[2])
    assert built.figure._suptitle.get_text() == "three schedules"


def test_devices_with_several_stages_name_the_stage() -> None:
    # a V-shaped table by hand: stages 0 and 3 on device 0, stages 1 and 2 on device 1
    placement = Placement.vshape(2)
    rows = [[], []]
    for mb in range(2):
        for stage in range(4):
            rows[placement.device(stage)].append(Op(stage, F, mb))
        for stage in reversed(range(4)):
            rows[placement.device(stage)].append(Op(stage, B, mb))
    schedule = Schedule("v-test", placement, 2, tuple(tuple(r) for r in rows))
    timeline = slot_table(schedule)
    built = gantt_figure([timeline])
    texts = {t.get_text() for t in built.figure.axes[0].texts}
    assert {"0F0", "3F0", "3B1", "1B1"} <= texts


def test_unknown_format_is_a_user_error() -> None:
    with pytest.raises(PipeschedError, match=r"^format=pdf: "):
        render_gantt([slot_table(generate("1f1b", 2, 2))], fmt="pdf")


def test_large_panels_draw_one_path_per_colour_with_a_box_per_op(monkeypatch) -> None:
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    monkeypatch.setattr(gantt, "COLLECTION_LIMIT", 10)
    timeline = with_transfers(generate("1f1b", 4, 8))
    built = gantt_figure([timeline])
    patches = [a for a in built.figure.axes[0].get_children()
               if isinstance(a, PathPatch) and str(a.get_gid()).startswith(("ops-", "transfers-"))]
    boxes = {kind: sum(int((p.get_path().codes == Path.MOVETO).sum()) for p in patches
                       if p.get_gid().startswith(kind)) for kind in ("ops-", "transfers-")}
    assert boxes == {"ops-": len(timeline), "transfers-": len(timeline.transfers)}
    assert len({p.get_gid() for p in patches if p.get_gid().startswith("ops-")}) == 2  # F and B
    assert png_size(render_gantt([timeline], fmt="png", dpi=50))[0] == 700


def test_names_are_drawn_as_plain_text_not_math() -> None:
    # as mathtext these would fail to draw (unknown command, bad \frac)
    name, title = r"zb $\undefined$ v", r"title $\frac{1}$"
    schedule = generate("1f1b", 2, 2)
    odd = slot_table(schedule.with_ops(schedule.device_ops, name=name))
    assert png_size(render_gantt([odd], fmt="png", title=title, dpi=50))[0] == 700
    built = gantt_figure([odd], title=title)
    assert built.figure.axes[0].get_title(loc="left") == name
