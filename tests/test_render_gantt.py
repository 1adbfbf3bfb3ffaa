"""Gantt pictures: valid PNG/SVG files with one box per op and transfer."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET

import pytest
from matplotlib.colors import to_hex

from cli_helpers import assert_one_line_error
from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.ops import B, F, Op
from pipesched.render import gantt
from pipesched.render.gantt import gantt_figure, render_gantt
from pipesched.render.style import KIND_NAMES, OOM_COLOR, device_color, time_scale
from pipesched.schedule import Placement, Schedule
from pipesched.simulate import Network
from pipesched.simulate.iterations import steady_state
from pipesched.slots import slot_table
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


@pytest.mark.slow
def test_large_timeline_skips_labels_and_stays_fast() -> None:
    timeline = simulated(split_backward(generate("1f1b", 16, 64)))
    built = gantt_figure([timeline])
    assert built.op_boxes == len(timeline) == 3072
    assert built.labels == 0  # 1 ms boxes in a 220 ms iteration are too thin for text
    width, height = png_size(render_gantt([timeline], fmt="png", dpi=80))
    assert width == 1120 and height > 1000


def _ops_axes(built) -> list:
    return [a for a in built.figure.axes if any(c.get_gid() and c.get_gid().startswith("ops-") for c in a.collections)]


def _steady(name: str):
    """Four iterations of ``name`` back to back on the uniform test network."""
    costs = StageCosts.uniform(4, forward=1e-3, backward_input=1e-3, backward_weight=0.8e-3)
    return steady_state(generate(name, 4, 8), costs, Network.uniform(4, latency=5e-6, bandwidth=50e9)).timeline


def test_each_panel_has_its_own_time_axis() -> None:
    timelines = [simulated(generate("gpipe", 4, 8)), simulated(generate("1f1b", 4, 16)), _steady("1f1b"),
                 slot_table(generate("1f1b", 4, 8))]
    built = gantt_figure(timelines, title="four schedules")
    ops_axes = _ops_axes(built)
    assert len(ops_axes) == 4
    # every panel ends at its own makespan, in the unit the report uses for its time unit
    scale = time_scale("s", max(t.makespan for t in timelines if t.unit == "s"))
    for axes, timeline in zip(ops_axes[:2], timelines[:2], strict=True):
        assert axes.get_xlim() == pytest.approx((0.0, timeline.makespan * scale.factor))
    assert ops_axes[0].get_xlim() != ops_axes[1].get_xlim()
    assert ops_axes[3].get_xlim() == pytest.approx((0.0, timelines[3].makespan))
    # iterations back to back: the second (the first steady one) with 3% of it either side,
    # its ends dashed, and the axis says so
    ends = timelines[2].iteration_end
    margin = 0.03 * (ends[1] - ends[0])
    assert ops_axes[2].get_xlim() == pytest.approx(((ends[0] - margin) * scale.factor, (ends[1] + margin) * scale.factor))
    dashed = [line.get_xdata()[0] for line in ops_axes[2].lines if line.get_linestyle() == "--"]
    assert dashed == pytest.approx([e * scale.factor for e in ends[:-1]])
    assert "one steady iteration of the 4" in built.figure.axes[built.figure.axes.index(ops_axes[2]) + 1].get_xlabel()
    # no two panels are joined, but each memory row follows its panel
    assert not any(ops_axes[0].get_shared_x_axes().joined(ops_axes[0], other) for other in ops_axes[1:])
    memory = built.figure.axes[built.figure.axes.index(ops_axes[0]) + 1]
    assert memory.get_shared_x_axes().joined(ops_axes[0], memory)
    assert built.figure._suptitle.get_text() == "four schedules"


def test_share_axis_puts_every_panel_of_a_unit_on_one_axis() -> None:
    timelines = [simulated(generate("gpipe", 4, 8)), simulated(generate("1f1b", 4, 16)),
                 slot_table(generate("1f1b", 4, 8))]
    ops_axes = _ops_axes(gantt_figure(timelines, share_axis=True))
    longest = max(timelines[0].makespan, timelines[1].makespan)
    scale = time_scale("s", longest)
    assert ops_axes[0].get_xlim() == ops_axes[1].get_xlim() == pytest.approx((0.0, longest * scale.factor))
    assert ops_axes[0].get_shared_x_axes().joined(ops_axes[0], ops_axes[1])
    # the slot table has its own unit, so its own axis
    assert not ops_axes[0].get_shared_x_axes().joined(ops_axes[0], ops_axes[2])
    assert ops_axes[2].get_xlim() == pytest.approx((0.0, timelines[2].makespan))


@pytest.mark.slow
def test_compare_draws_own_or_shared_axes(cli, tmp_path) -> None:
    own, shared = tmp_path / "own.svg", tmp_path / "shared.svg"
    base = ("compare", "--schedules", "1f1b,pipedream", "-p", "4", "-m", "8", "--levels", "sim")
    assert cli(*base, "--svg", str(own)).code == 0
    assert cli(*base, "--svg", str(shared), "--share-axis").code == 0
    # PipeDream runs iterations back to back: on one axis with it 1F1B's boxes take a
    # quarter of the width they take on 1F1B's own axis
    own_boxes, shared_boxes = svg_boxes(own.read_bytes(), "op-0"), svg_boxes(shared.read_bytes(), "op-0")
    assert len(own_boxes) == len(shared_boxes) > 0
    assert sum(w for w, _ in own_boxes.values()) > 2 * sum(w for w, _ in shared_boxes.values())
    assert_one_line_error(cli(*base, "--share-axis"), "share-axis=true", "--png, --svg or --html")
    assert not list(tmp_path.glob("*.png"))


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


def svg_boxes(data: bytes, link: str) -> dict[int, tuple[float, float]]:
    """Width and height (SVG units) of each box linked ``#<link>-<row>``."""
    root = ET.fromstring(data)
    out = {}
    for anchor in root.iter("{http://www.w3.org/2000/svg}a"):
        href = anchor.get("{http://www.w3.org/1999/xlink}href", "")
        found = re.fullmatch(rf"#{link}-(\d+)", href)
        if not found:
            continue
        path = next(anchor.iter("{http://www.w3.org/2000/svg}path"))
        numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", path.get("d"))]
        xs, ys = numbers[0::2], numbers[1::2]
        out[int(found.group(1))] = (max(xs) - min(xs), max(ys) - min(ys))
    return out


@pytest.mark.slow
def test_short_transfers_are_drawn_at_least_one_unit_wide() -> None:
    # 0.1 us transfers in a panel of about 20 ms: a ten-thousandth of a pixel at their length
    timeline = with_transfers(generate("1f1b", 4, 8), comm=1e-7)
    data = render_gantt([timeline], fmt="svg")
    widths = svg_boxes(data, "transfer-0")
    assert len(widths) == len(timeline.transfers)
    assert min(width for width, _ in widths.values()) >= 1.0  # SVG units (1 pt); PNG pixels below
    built = gantt_figure([timeline])
    collection = next(c for axes in built.figure.axes for c in axes.collections if c.get_gid() == "transfers-0")
    built.figure.set_dpi(150)
    axes = next(axes for axes in built.figure.axes if collection in axes.collections)
    for path in collection.get_paths():
        pixels = axes.transData.transform(path.vertices)
        assert pixels[:, 0].max() - pixels[:, 0].min() >= 1.5
    # every link row says how busy it is: short transfers never read as unused
    texts = [t.get_text() for axes in built.figure.axes for t in axes.texts]
    busy = [t for t in texts if t.endswith("busy")]
    assert len(busy) == len(set(timeline.transfers.channel.tolist())) and "0.0% busy" not in busy


def test_legend_lists_every_colour_drawn_with_its_kind_and_chunk() -> None:
    timeline = slot_table(generate("dualpipev", 4, 8))
    built = gantt_figure([timeline])
    legend = built.figure.legends[0]
    entries = {to_hex(patch.get_facecolor()): text.get_text()
               for patch, text in zip(legend.get_patches(), legend.get_texts(), strict=True)}
    ops = next(c for axes in built.figure.axes for c in axes.collections if c.get_gid() == "ops-0")
    drawn = {to_hex(color) for color in ops.get_facecolors()}
    assert drawn <= set(entries) and len(drawn) == len(entries) - 1  # and idle
    # independently: each device's chunk is the rank of the stage among its stages
    present = set()
    for device, ops_of in enumerate(timeline.schedule.device_ops):
        stages = sorted({atom.stage for op in ops_of for atom in op.atoms})
        for row in timeline.rows_of_device(device).tolist():
            present.add((int(timeline.box_kind[row]), stages.index(int(timeline.op_stage[row])) + 1))
    labels = set(entries.values())
    for kind, chunk in present:
        assert any(KIND_NAMES[kind] in label and f"chunk {chunk}" in label for label in labels), (kind, chunk)
    assert any("overlapped forward + backward" in label for label in labels)


def test_memory_keeps_device_colours_and_reds_only_what_is_over_capacity() -> None:
    # 1F1B holds 4, 3, 2, 1 stage-microbatches of 2 GiB over 10 GiB static: 18, 16, 14, 12 GiB
    timeline = with_transfers(generate("1f1b", 4, 8), capacity=15 * GIB)
    assert timeline.memory.out_of_memory == (True, True, False, False)
    built = gantt_figure([timeline])
    axes = built.figure.axes[1]
    lines = [line for line in axes.get_lines() if line.get_linestyle() == "-"]
    assert [to_hex(line.get_color()) for line in lines] == [device_color(d) for d in range(4)]
    assert OOM_COLOR not in {to_hex(line.get_color()) for line in lines}
    over = sorted(c.get_gid() for c in axes.collections if (c.get_gid() or "").startswith("over-capacity"))
    assert over == ["over-capacity-d0", "over-capacity-d1"]
    assert "out of memory: d0, d1" in axes.get_title(loc="right")
