"""Gantt charts (PNG, SVG) of one or several timelines, stacked on a shared time axis.

Each timeline gets a panel: one row per device (op boxes coloured by kind over a light grey
bar, so idle time shows as grey), then one thin row per communication channel with its
transfers, then, when the timeline has a memory trace, one memory curve per device. Boxes
are labelled with the microbatch (``F3``), or the op text (``5F3``) on devices holding
several stages, when wide enough. Timelines in the same unit share the time axis.

Boxes are drawn as one PolyCollection per panel so a timeline of a million ops still draws
in seconds. In SVG every op box is wrapped in a link ``#op-<panel>-<row>`` (and transfers
in ``#transfer-<panel>-<row>``), so the boxes can be found and counted.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipesched.errors import require
from pipesched.render.style import (
    IDLE_COLOR,
    KIND_COLORS,
    KIND_LETTERS,
    KIND_NAMES,
    LABEL_ON_KIND,
    OOM_COLOR,
    TRANSFER_COLORS,
    TRANSFER_NAMES,
    TimeScale,
    chunk_shade,
    lighten,
    memory_scale,
    time_scale,
)
from pipesched.render.summary import op_chunks, summarize
from pipesched.timeline import Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
# inches
FIGURE_WIDTH = 14.0
DEVICE_ROW = 0.26
LINK_ROW = 0.13
MEMORY_ROW = 0.2
PANEL_HEADER = 0.45
# approximate share of the figure width taken by the plotting area (for label fitting)
_PLOT_SHARE = 0.86
# at most this many box labels per figure: beyond that they are unreadable anyway
MAX_LABELS = 4000
# height of a box within its row (rows are 1 data unit apart)
_BOX = 0.78
_TRANSFER_BOX = 0.6


@dataclass(frozen=True)
class GanttFigure:
    """A built figure and what was drawn on it (for tests and callers)."""

    figure: Figure
    op_boxes: int  # one rectangle per op of every timeline
    transfer_boxes: int  # one rectangle per transfer of every timeline
    labels: int  # box labels drawn (small boxes get none)


def gantt_figure(timelines: Sequence[Timeline], *, title: str = "", width: float = FIGURE_WIDTH) -> GanttFigure:
    """Build the Gantt chart of ``timelines`` (panels top to bottom, in the given order)."""
    require(len(timelines) >= 1, "timelines", 0, "give at least one timeline to draw")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    heights = []
    for timeline in timelines:
        heights.append(PANEL_HEADER + DEVICE_ROW * timeline.num_devices + LINK_ROW * len(_channels(timeline)))
        if timeline.memory is not None:
            heights.append(0.35 + MEMORY_ROW * timeline.num_devices)
    legend_height = 0.45
    figure = Figure(
        figsize=(width, sum(heights) + legend_height + (0.4 if title else 0.1)),
        layout="constrained",
    )
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    if title:
        figure.suptitle(title, fontsize=12, fontweight="bold")

    scales = _shared_scales(timelines)
    first_of_unit: dict[str, Axes] = {}
    panel = 0
    op_boxes = transfer_boxes = labels = 0
    for index, timeline in enumerate(timelines):
        shared = first_of_unit.get(timeline.unit)
        axes = figure.add_subplot(grid[panel, 0], sharex=shared)
        first_of_unit.setdefault(timeline.unit, axes)
        panel += 1
        scale = scales[timeline.unit]
        drawn = _draw_panel(axes, timeline, index, scale, label_budget=MAX_LABELS - labels,
                            plot_width=width * _PLOT_SHARE)
        op_boxes += drawn[0]
        transfer_boxes += drawn[1]
        labels += drawn[2]
        memory_axes = None
        if timeline.memory is not None:
            memory_axes = figure.add_subplot(grid[panel, 0], sharex=axes)
            panel += 1
            _draw_memory(memory_axes, timeline, scale)
        last = memory_axes or axes
        last.set_xlabel(f"time ({scale.unit})", fontsize=9)
        axes.set_xlim(0, _span(timelines, timeline.unit) * scale.factor)

    handles = [Patch(facecolor=KIND_COLORS[k], label=f"{KIND_LETTERS[k]}  {KIND_NAMES[k]}")
               for k in _kinds_present(timelines)]
    handles += [Patch(facecolor=TRANSFER_COLORS[k], label=f"{TRANSFER_NAMES[k]} transfer")
                for k in _transfer_kinds_present(timelines)]
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return GanttFigure(figure, op_boxes, transfer_boxes, labels)


def render_gantt(timelines: Sequence[Timeline], *, fmt: str, title: str = "", dpi: int = 150) -> bytes:
    """The Gantt chart as PNG or SVG bytes."""
    require(fmt in FORMATS, "format", fmt, f"choose one of {', '.join(FORMATS)}")
    built = gantt_figure(timelines, title=title)
    buffer = io.BytesIO()
    if fmt == "png":
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(built.figure).print_png(buffer, dpi=dpi, metadata={"Software": "pipesched"})
    else:
        from matplotlib.backends.backend_svg import FigureCanvasSVG

        FigureCanvasSVG(built.figure).print_svg(buffer, metadata={"Creator": "pipesched", "Date": None})
    return buffer.getvalue()


# --- one panel -------------------------------------------------------------------------------
def _draw_panel(axes: Axes, timeline: Timeline, index: int, scale: TimeScale, *,
                label_budget: int, plot_width: float) -> tuple[int, int, int]:
    """Op boxes, idle bars, link rows and labels of one timeline; returns the counts drawn."""
    from matplotlib.collections import PolyCollection

    devices = timeline.num_devices
    channels = _channels(timeline)
    origin, span = timeline.origin, timeline.makespan
    x0 = (timeline.op_start - origin) * scale.factor
    x1 = (timeline.op_end - origin) * scale.factor
    y = timeline.op_device.astype(np.float64)

    # device rows: idle bar under the boxes
    axes.barh(np.arange(devices), span * scale.factor, left=0, height=_BOX, color=IDLE_COLOR, linewidth=0, zorder=1)

    chunk, chunks = op_chunks(timeline)
    colors = [lighten(KIND_COLORS[k], chunk_shade(c, n))
              for k, c, n in zip(timeline.op_kind.tolist(), chunk.tolist(), chunks[timeline.op_device].tolist())]
    boxes = PolyCollection(
        _rectangles(x0, x1, y, _BOX),
        facecolors=colors,
        edgecolors="white",
        linewidths=_edge_width(x1 - x0, span * scale.factor, plot_width),
        zorder=2,
    )
    boxes.set_gid(f"ops-{index}")
    boxes.set_urls([f"#op-{index}-{row}" for row in range(len(timeline))])
    axes.add_collection(boxes, autolim=False)

    # link rows: one per channel, below the devices, half height
    table = timeline.transfers
    link_y = {channel: devices + 0.5 * k + 0.25 for k, channel in enumerate(channels)}
    if len(table):
        t0 = (table.start - origin) * scale.factor
        t1 = (table.end - origin) * scale.factor
        ty = np.array([link_y[int(c)] for c in table.channel.tolist()])
        transfers = PolyCollection(
            _rectangles(t0, t1, ty, 0.5 * _TRANSFER_BOX),
            facecolors=[TRANSFER_COLORS[int(k)] for k in table.kind.tolist()],
            edgecolors="white",
            linewidths=_edge_width(t1 - t0, span * scale.factor, plot_width),
            zorder=2,
        )
        transfers.set_gid(f"transfers-{index}")
        transfers.set_urls([f"#transfer-{index}-{row}" for row in range(len(table))])
        axes.add_collection(transfers, autolim=False)
        axes.axhline(devices - 0.5 + 0.0, color="#999999", linewidth=0.5)

    labels = _draw_labels(axes, timeline, x0, x1, y, chunks, label_budget=label_budget,
                          inches_per_unit=plot_width / (_span_of(timeline) * scale.factor or 1.0))

    ticks = list(range(devices)) + [link_y[c] for c in channels]
    names = [f"d{d}" for d in range(devices)] + [_channel_name(table, c) for c in channels]
    axes.set_yticks(ticks, names)
    for tick in axes.get_yticklabels()[devices:]:
        tick.set_fontsize(6)
        tick.set_color("#555555")
    for tick in axes.get_yticklabels()[:devices]:
        tick.set_fontsize(8)
    axes.set_ylim(devices - 0.5 + 0.5 * len(channels) + (0.1 if channels else 0), -0.6)
    axes.tick_params(axis="y", length=0)
    axes.tick_params(axis="x", labelsize=8)
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)

    # idle share of each device, right of its row
    idle = timeline.idle_per_device() / span if span > 0 else np.zeros(devices)
    for device in range(devices):
        axes.annotate(f"{idle[device]:.0%} idle", xy=(1.0, device), xycoords=("axes fraction", "data"),
                      xytext=(4, 0), textcoords="offset points", va="center", fontsize=6.5, color="#555555")

    summary = summarize(timeline)
    axes.set_title(f"{summary.name}", loc="left", fontsize=10, fontweight="bold")
    axes.set_title(f"{summary.source} · {summary.headline()}", loc="right", fontsize=9, color="#333333")
    return len(timeline), len(table), labels


def _draw_labels(axes: Axes, timeline: Timeline, x0: np.ndarray, x1: np.ndarray, y: np.ndarray,
                 chunks: np.ndarray, *, label_budget: int, inches_per_unit: float) -> int:
    """Microbatch labels in boxes wide enough to hold them (7 pt text: ~0.055 in per char)."""
    widths = (x1 - x0) * inches_per_unit
    several = chunks[timeline.op_device] > 1
    lengths = np.where(several, 2 + np.floor(np.log10(np.maximum(timeline.op_stage, 1))), 1) + \
        1 + np.floor(np.log10(np.maximum(timeline.op_microbatch, 1)))
    fits = np.flatnonzero(widths >= 0.055 * lengths + 0.03)
    if len(fits) == 0 or len(fits) > label_budget:
        return 0
    for row in fits.tolist():
        kind = KIND_LETTERS[int(timeline.op_kind[row])]
        microbatch = int(timeline.op_microbatch[row])
        text = f"{int(timeline.op_stage[row])}{kind}{microbatch}" if several[row] else f"{kind}{microbatch}"
        axes.text((x0[row] + x1[row]) / 2, y[row], text, ha="center", va="center", fontsize=7,
                  color=LABEL_ON_KIND, zorder=3, clip_on=True)
    return len(fits)


def _draw_memory(axes: Axes, timeline: Timeline, scale: TimeScale) -> None:
    """One step curve per device, each in its own row, all on the same memory scale."""
    memory = timeline.memory
    assert memory is not None
    devices = len(memory.values)
    peaks = memory.peak
    top = max(max(peaks), 1e-30)
    capacities = memory.capacity
    show_capacity = capacities is not None and min(capacities) < 1.25 * top
    if show_capacity and capacities is not None:
        top = max(top, max(capacities))
    divisor, unit = memory_scale(memory.unit, max(peaks))
    end = (timeline.origin + timeline.makespan - timeline.origin) * scale.factor
    for device in range(devices):
        times = (np.asarray(memory.times[device], np.float64) - timeline.origin) * scale.factor
        values = np.asarray(memory.values[device], np.float64)
        base = device + 0.45
        if times.size:
            xs = np.append(times, max(end, float(times[-1])))
            ys = base - 0.85 * np.append(values, values[-1]) / top
            oom = memory.out_of_memory[device]
            color = OOM_COLOR if oom else "#5b6f8a"
            axes.fill_between(xs, base, ys, step="post", color=color, alpha=0.35, linewidth=0)
            axes.step(xs, ys, where="post", color=color, linewidth=0.8)
        if show_capacity and capacities is not None:
            axes.axhline(base - 0.85 * capacities[device] / top, color=OOM_COLOR, linewidth=0.6, linestyle="--")
        axes.annotate(f"peak {peaks[device] / divisor:.3g} {unit}", xy=(1.0, device), xycoords=("axes fraction", "data"),
                      xytext=(4, 0), textcoords="offset points", va="center", fontsize=6.5,
                      color=OOM_COLOR if memory.out_of_memory[device] else "#555555")
    axes.set_yticks(range(devices), [f"d{d}" for d in range(devices)], fontsize=8)
    axes.set_ylim(devices - 0.5, -0.5)
    axes.tick_params(axis="y", length=0)
    axes.tick_params(axis="x", labelsize=8)
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)
    note = f"memory in use per device (rows share one scale, full row = {top / divisor:.3g} {unit})"
    if show_capacity:
        note += "; dashed: capacity"
    axes.set_title(note, loc="left", fontsize=8, color="#333333")


# --- helpers ---------------------------------------------------------------------------------
def _rectangles(x0: np.ndarray, x1: np.ndarray, y: np.ndarray, height: float) -> np.ndarray:
    """Vertices (n, 4, 2) of boxes [x0, x1] x [y - height/2, y + height/2]."""
    low, high = y - height / 2, y + height / 2
    return np.stack([np.stack([x0, low], 1), np.stack([x0, high], 1),
                     np.stack([x1, high], 1), np.stack([x1, low], 1)], 1)


def _edge_width(widths: np.ndarray, span: float, plot_width: float) -> float:
    """A thin white edge separates touching boxes; none when boxes are under ~2 px."""
    if widths.size == 0 or span <= 0:
        return 0.0
    typical = float(np.median(widths)) / span * plot_width * 100
    return 0.4 if typical >= 2.0 else 0.0


def _channels(timeline: Timeline) -> list[int]:
    return sorted({int(c) for c in timeline.transfers.channel.tolist()})


def _channel_name(table, channel: int) -> str:
    name = table.channel_names[channel] if channel < len(table.channel_names) else f"channel {channel}"
    return name if len(name) <= 24 else name[:23] + "…"


def _span_of(timeline: Timeline) -> float:
    return timeline.makespan or 1.0


def _span(timelines: Sequence[Timeline], unit: str) -> float:
    return max(_span_of(t) for t in timelines if t.unit == unit)


def _shared_scales(timelines: Sequence[Timeline]) -> dict[str, TimeScale]:
    """One display unit per time unit, chosen from the longest timeline in that unit."""
    return {t.unit: time_scale(t.unit, _span(timelines, t.unit)) for t in timelines}


def _kinds_present(timelines: Sequence[Timeline]) -> list[int]:
    return sorted({int(k) for t in timelines for k in np.unique(t.op_kind)})


def _transfer_kinds_present(timelines: Sequence[Timeline]) -> list[int]:
    return sorted({int(k) for t in timelines for k in np.unique(t.transfers.kind)})
