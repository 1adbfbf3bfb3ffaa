"""Gantt charts (PNG, SVG) of one or several timelines, stacked, each on its own time axis.

Each timeline gets a panel: one row per device (op boxes coloured by kind over a light grey
bar, so idle time shows as grey), then one thin row per device host link with its offloads
and reloads (devices that offload), then one thin row per communication channel with its
transfers, then, when the timeline has a memory trace, one memory curve per device (and
one host-memory curve per device that offloads, dashed, on the same scale). Boxes
are labelled with the microbatch (``F3``), or the op text (``5F3``) on devices holding
several stages, when wide enough. Each panel shows the range the HTML report opens it on
(of iterations back to back one steady iteration, every iteration end dashed), in the
display unit of the longest timeline of its unit; ``share_axis`` puts the panels of a unit
on one axis, as the report's "one time axis" toggle does.

What is drawn is what the legend lists: every op kind present (an overlapped
forward-backward pair too) in each chunk shade present, every transfer kind. A transfer is
drawn at least MIN_TRANSFER_WIDTH wide (about 3 px at 150 dpi, over one SVG unit), so
microsecond transfers stay visible in a panel seconds long; each link row says how busy the
link is. Memory curves keep their device's colour (``style.device_color``); only the
memory above a device's capacity is red, and the panel names the devices out of memory.

Boxes are drawn as one PolyCollection per panel (one compound path per colour beyond
COLLECTION_LIMIT boxes), so p=16, m=64 draws in about a second and a million ops in tens
of seconds. In SVG every op box is wrapped in a link ``#op-<panel>-<row>`` (and transfers
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
    HOST_MEMORY_COLOR,
    IDLE_COLOR,
    LABEL_ON_KIND,
    OOM_COLOR,
    TRANSFER_COLORS,
    TRANSFER_NAMES,
    TimeScale,
    chunk_names,
    chunk_shade,
    device_color,
    device_labels,
    home_window,
    kind_styles,
    lighten,
    memory_scale,
    op_label,
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
# inches left of the plots (device and link names) and right of them (idle share, peaks)
MARGIN_LEFT = 0.85
MARGIN_RIGHT = 0.95
# Agg draws at most 2**16 pixels a side; tall comparison figures get a lower resolution
MAX_PIXELS = 30000
# at most this many box labels per figure: beyond that they are unreadable anyway
MAX_LABELS = 4000
# boxes per panel drawn as separate, linked shapes; larger panels draw one path per colour
COLLECTION_LIMIT = 100_000
# height of a box within its row (rows are 1 data unit apart)
_BOX = 0.78
_TRANSFER_BOX = 0.6
# a device's memory capacity line (red is only for memory above it)
CAPACITY_COLOR = "#333333"
# inches: the narrowest a transfer is drawn (1.44 pt in SVG, 3 px in a 150 dpi PNG)
MIN_TRANSFER_WIDTH = 0.02
# legend: inches per row, and per entry: the patch and gaps plus ~0.062 in per 8 pt character
LEGEND_ROW = 0.2
LEGEND_ENTRY = 0.45
LEGEND_CHARACTER = 0.062


@dataclass(frozen=True)
class GanttFigure:
    """A built figure and what was drawn on it (for tests and callers)."""

    figure: Figure
    op_boxes: int  # one rectangle per op of every timeline
    transfer_boxes: int  # one rectangle per transfer of every timeline
    labels: int  # box labels drawn (small boxes get none)


def gantt_figure(timelines: Sequence[Timeline], *, title: str = "", width: float = FIGURE_WIDTH,
                 share_axis: bool = False) -> GanttFigure:
    """Build the Gantt chart of ``timelines`` (panels top to bottom, in the given order).

    Each panel has its own time axis, the range the HTML report opens it on
    (``style.home_window``: the whole timeline, or of iterations back to back one steady
    iteration, each iteration's end dashed); ``share_axis`` puts every panel of a time unit
    on one axis from 0 to the longest of them, as the report's "one time axis" toggle does.

    The layout is computed here in inches (fixed margins, one block per panel) rather than
    by matplotlib's layout engines, which take seconds on figures with many panels.
    """
    require(len(timelines) >= 1, "timelines", 0, "give at least one timeline to draw")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    # blocks top to bottom: (timeline index, "ops" or "memory", inches above, height, inches below)
    blocks: list[tuple[int, str, float, float, float]] = []
    for index, timeline in enumerate(timelines):
        rows = DEVICE_ROW * timeline.num_devices + LINK_ROW * (len(_channels(timeline)) + len(_host_lanes(timeline))) + 0.1
        below = 0.3 if timeline.memory is not None else 0.55
        blocks.append((index, "ops", PANEL_HEADER, rows, below))
        if timeline.memory is not None:
            blocks.append((index, "memory", 0.3, MEMORY_ROW * timeline.num_devices, 0.55))
    top = 0.55 if title else 0.1
    legend = _legend_entries(timelines)
    widest = LEGEND_ENTRY + LEGEND_CHARACTER * max(len(label) for _, label in legend)
    columns = max(1, min(len(legend), int((width - 0.4) // widest)))
    bottom = 0.2 + LEGEND_ROW * -(-len(legend) // columns)
    height = top + sum(above + rows + below for _, _, above, rows, below in blocks) + bottom
    figure = Figure(figsize=(width, height))
    if title:
        figure.suptitle(title, fontsize=12, fontweight="bold", y=1 - 0.15 / height, va="top", parse_math=False)

    scales = _shared_scales(timelines)
    windows = [_window(timelines, t, share_axis=share_axis) for t in timelines]
    first_of_unit: dict[str, Axes] = {}
    panel_axes: dict[int, Axes] = {}
    op_boxes = transfer_boxes = labels = 0
    cursor = height - top
    left, plot_width = MARGIN_LEFT / width, (width - MARGIN_LEFT - MARGIN_RIGHT) / width
    for index, kind, above, rows, below in blocks:
        cursor -= above + rows
        box = [left, cursor / height, plot_width, rows / height]
        cursor -= below
        timeline = timelines[index]
        scale = scales[timeline.unit]
        # a memory row shares its panel's axis; with share_axis every panel of a unit shares one
        axes = figure.add_axes(box, sharex=panel_axes.get(index) or (first_of_unit.get(timeline.unit)
                                                                      if share_axis else None))
        first_of_unit.setdefault(timeline.unit, axes)
        panel_axes.setdefault(index, axes)
        low, high = windows[index]
        axes.set_xlim(low * scale.factor, high * scale.factor)
        last_block = kind == "memory" or timeline.memory is None
        if last_block:
            axes.set_xlabel(_axis_label(timeline, scale, windows[index]), fontsize=9, labelpad=2, parse_math=False)
        if kind == "memory":
            _draw_memory(axes, timeline, scale)
            _mark_iterations(axes, timeline, scale)
            continue
        # inches of plot per displayed time unit in this panel's window
        inches_per_unit = (width - MARGIN_LEFT - MARGIN_RIGHT) / (max(high - low, 1e-300) * scale.factor)
        drawn = _draw_panel(axes, timeline, index, scale, label_budget=MAX_LABELS - labels,
                            inches_per_unit=inches_per_unit, window=windows[index])
        op_boxes += drawn[0]
        transfer_boxes += drawn[1]
        labels += drawn[2]
        _mark_iterations(axes, timeline, scale)

    handles = [Patch(facecolor=color, label=label) for color, label in legend]
    figure.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.05 / height),
                  ncol=columns, fontsize=8, frameon=False)
    return GanttFigure(figure, op_boxes, transfer_boxes, labels)


def _legend_entries(timelines: Sequence[Timeline]) -> list[tuple[str, str]]:
    """(colour, label) of everything drawn: each op kind in each chunk shade present (the
    colours ``_op_colors`` gives, the kind styles of each timeline's rules), each transfer
    kind, idle; memory colours are per device."""
    # (kind index, chunk, chunks, the kind's colour, its legend text)
    combos: set[tuple[int, int, int, str, str]] = set()
    for timeline in timelines:
        styles = kind_styles(timeline.schedule.rules)
        chunk, chunks = op_chunks(timeline)
        drawn = np.unique(np.stack([timeline.box_kind, chunk, chunks[timeline.op_device]], 1).astype(np.int64), axis=0)
        combos |= {(kind, c, n, styles.colors[kind], f"{styles.marks[kind]}  {styles.names[kind]}")
                   for kind, c, n in drawn.tolist()}
    entries: list[tuple[str, str]] = []
    for _, chunk, chunks, base, label in sorted(combos):
        color = lighten(base, chunk_shade(chunk, chunks))
        if chunks > 1:
            label += f" · {chunk_names(chunks)[chunk]}"
        # a first chunk's colour is its kind's own: listed once, under its first label
        if color not in {known for known, _ in entries}:
            entries.append((color, label))
    entries += [(TRANSFER_COLORS[k], f"{TRANSFER_NAMES[k]} transfer") for k in _transfer_kinds_present(timelines)]
    entries.append((IDLE_COLOR, "idle"))
    return entries


def render_gantt(timelines: Sequence[Timeline], *, fmt: str, title: str = "", dpi: int = 150,
                 share_axis: bool = False) -> bytes:
    """The Gantt chart as PNG or SVG bytes (``share_axis``: see ``gantt_figure``)."""
    require(fmt in FORMATS, "format", fmt, f"choose one of {', '.join(FORMATS)}")
    built = gantt_figure(timelines, title=title, share_axis=share_axis)
    buffer = io.BytesIO()
    # Figure.savefig picks the Agg (PNG) or SVG canvas itself; pyplot is never involved
    metadata = {"Software": "pipesched"} if fmt == "png" else {"Creator": "pipesched", "Date": None}
    height = built.figure.get_figheight()
    built.figure.savefig(buffer, format=fmt, dpi=min(dpi, MAX_PIXELS / height), metadata=metadata)
    return buffer.getvalue()


# --- one panel -------------------------------------------------------------------------------
def _draw_panel(axes: Axes, timeline: Timeline, index: int, scale: TimeScale, *,
                label_budget: int, inches_per_unit: float, window: tuple[float, float]) -> tuple[int, int, int]:
    """Op boxes, idle bars, link rows and labels of one timeline; returns the counts drawn."""
    from matplotlib.colors import to_rgba

    devices = timeline.num_devices
    channels = _channels(timeline)
    hosts = _host_lanes(timeline)
    origin, span = timeline.origin, timeline.makespan
    x0 = (timeline.op_start - origin) * scale.factor
    x1 = (timeline.op_end - origin) * scale.factor
    y = timeline.op_device.astype(np.float64)
    # host-link ops in their device's thin host row, below the device rows
    host_y = {device: devices - 0.25 + 0.5 * k for k, device in enumerate(hosts)}
    on_host = ~timeline.on_compute
    if on_host.any():
        lanes = np.zeros(devices)
        lanes[hosts] = [host_y[d] for d in hosts]
        y = np.where(on_host, lanes[timeline.op_device], y)

    # device rows: idle bar under the boxes
    axes.barh(np.arange(devices), span * scale.factor, left=0, height=_BOX, color=IDLE_COLOR, linewidth=0, zorder=1)

    chunk, chunks = op_chunks(timeline)
    palette, color = _op_colors(timeline.box_kind, chunk, chunks[timeline.op_device],
                                kind_styles(timeline.schedule.rules).colors)
    _draw_boxes(axes, _rectangles(x0, x1, y, np.where(on_host, 0.5 * _TRANSFER_BOX, _BOX)), palette, color,
                gid=f"ops-{index}", link=f"op-{index}", edge=_edge_width(x1 - x0, inches_per_unit))

    # link rows: one per channel, below the devices and host links, half height
    table = timeline.transfers
    link_y = {channel: devices - 0.25 + 0.5 * (len(hosts) + k) for k, channel in enumerate(channels)}
    if len(table):
        t0 = (table.start - origin) * scale.factor
        t1 = (table.end - origin) * scale.factor
        lane = np.zeros(max(channels) + 1)
        lane[channels] = [link_y[c] for c in channels]
        transfer_palette = np.array([to_rgba(c) for c in TRANSFER_COLORS])
        # microsecond transfers in a long panel: widened to MIN_TRANSFER_WIDTH, no edge
        t1 = np.maximum(t1, t0 + MIN_TRANSFER_WIDTH / inches_per_unit)
        _draw_boxes(axes, _rectangles(t0, t1, lane[table.channel], 0.5 * _TRANSFER_BOX), transfer_palette,
                    table.kind.astype(np.int64), gid=f"transfers-{index}", link=f"transfer-{index}", edge=0.0)
        _annotate_link_use(axes, timeline, channels, link_y)
    if len(table) or hosts:
        axes.axhline(devices - 0.5, color="#999999", linewidth=0.5)

    # no labels for the boxes outside the panel's window (they are not shown)
    hidden = on_host | (x1 <= window[0] * scale.factor) | (x0 >= window[1] * scale.factor)
    labels = _draw_labels(axes, timeline, x0, x1, y, chunks, label_budget=label_budget,
                          inches_per_unit=inches_per_unit, skip=hidden)

    ticks = list(range(devices)) + [host_y[d] for d in hosts] + [link_y[c] for c in channels]
    rows_named = device_labels(timeline)
    names = (list(rows_named) + [f"{rows_named[d]} host link" for d in hosts]
             + [_channel_name(table, c) for c in channels])
    axes.set_yticks(ticks, names)
    for tick in axes.get_yticklabels()[devices:]:
        tick.set_parse_math(False)
        tick.set_fontsize(6)
        tick.set_color("#555555")
    for tick in axes.get_yticklabels()[:devices]:
        tick.set_fontsize(8)
    thin = len(channels) + len(hosts)
    axes.set_ylim(devices - 0.5 + 0.5 * thin + (0.1 if thin else 0), -0.6)
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
    # names come from input files: drawn as plain text, never as $math$
    axes.set_title(summary.name, loc="left", fontsize=10, fontweight="bold", parse_math=False)
    axes.set_title(f"{summary.source} · {summary.headline()}", loc="right", fontsize=9, color="#333333")
    return len(timeline), len(table), labels


def _annotate_link_use(axes: Axes, timeline: Timeline, channels: list[int], link_y: dict[int, float]) -> None:
    """Right of each link row: the share of the iteration its transfers keep the link busy
    (overlapping transfers counted once), so a link of short transfers does not read as unused."""
    table = timeline.transfers
    span = timeline.makespan
    for channel in channels:
        mine = np.flatnonzero(table.channel == channel)
        share = _union_length(table.start[mine], table.end[mine]) / span if span > 0 else 0.0
        # a link in use never reads as 0.0%
        text = f"{share:.1%} busy" if share >= 0.0005 or share == 0 else "<0.1% busy"
        axes.annotate(text, xy=(1.0, link_y[channel]),
                      xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points", va="center",
                      fontsize=5.5, color="#555555")


def _union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length covered by intervals [start, end) (overlaps counted once)."""
    order = np.argsort(start, kind="stable")
    covered, reach = 0.0, -np.inf
    for low, high in zip(start[order].tolist(), end[order].tolist(), strict=True):
        if high > reach:
            covered += high - max(low, reach)
            reach = high
    return covered


def _draw_labels(axes: Axes, timeline: Timeline, x0: np.ndarray, x1: np.ndarray, y: np.ndarray,
                 chunks: np.ndarray, *, label_budget: int, inches_per_unit: float, skip: np.ndarray) -> int:
    """Microbatch labels in boxes wide enough to hold them (7 pt text: ~0.055 in per char);
    none on the rows ``skip`` marks (the thin host-link boxes)."""
    widths = np.where(skip, 0.0, (x1 - x0) * inches_per_unit)
    several = chunks[timeline.op_device] > 1
    lengths = np.where(several, 2 + np.floor(np.log10(np.maximum(timeline.op_stage, 1))), 1) + \
        1 + np.floor(np.log10(np.maximum(timeline.op_microbatch, 1)))
    fused = np.flatnonzero(timeline.box_kind != timeline.op_kind)
    lengths[fused] = [len(op_label(timeline, row, several_stages=bool(several[row]))) for row in fused.tolist()]
    fits = np.flatnonzero(widths >= 0.055 * lengths + 0.03)
    if len(fits) == 0 or len(fits) > label_budget:
        return 0
    for row in fits.tolist():
        text = op_label(timeline, row, several_stages=bool(several[row]))
        axes.text((x0[row] + x1[row]) / 2, y[row], text, ha="center", va="center", fontsize=7,
                  color=LABEL_ON_KIND, zorder=3, clip_on=True)
    return len(fits)


def _draw_memory(axes: Axes, timeline: Timeline, scale: TimeScale) -> None:
    """One step curve per device, each in its own row, all on the same memory scale."""
    memory = timeline.memory
    assert memory is not None
    devices = len(memory.values)
    peaks = memory.peak
    top = max(max(peaks), max(timeline.host_memory.peak) if timeline.host_memory is not None else 0.0, 1e-30)
    capacities = memory.capacity
    show_capacity = capacities is not None and min(capacities) < 1.25 * top
    if show_capacity and capacities is not None:
        top = max(top, max(capacities))
    divisor, unit = memory_scale(memory.unit, max(peaks))
    end = timeline.makespan * scale.factor
    for device in range(devices):
        times = (np.asarray(memory.times[device], np.float64) - timeline.origin) * scale.factor
        values = np.asarray(memory.values[device], np.float64)
        base = device + 0.45
        color = device_color(device)
        if times.size:
            xs = np.append(times, max(end, float(times[-1])))
            ys = base - 0.85 * np.append(values, values[-1]) / top
            axes.fill_between(xs, base, ys, step="post", color=color, alpha=0.35, linewidth=0)
            axes.step(xs, ys, where="post", color=color, linewidth=0.8)
            if capacities is not None and memory.out_of_memory[device]:
                # only what is over the capacity is red (rows grow upwards: smaller y is more)
                line = base - 0.85 * capacities[device] / top
                axes.fill_between(xs, line, np.minimum(ys, line), step="post", color=OOM_COLOR, alpha=0.8,
                                  linewidth=0, gid=f"over-capacity-d{device}")
        if show_capacity and capacities is not None:
            axes.axhline(base - 0.85 * capacities[device] / top, color=CAPACITY_COLOR, linewidth=0.6, linestyle="--")
        host = timeline.host_memory
        if host is not None and host.values[device].size and host.peak[device] > 0:
            times = (np.asarray(host.times[device], np.float64) - timeline.origin) * scale.factor
            xs = np.append(times, max(end, float(times[-1])))
            ys = base - 0.85 * np.append(host.values[device], host.values[device][-1]) / top
            axes.step(xs, ys, where="post", color=HOST_MEMORY_COLOR, linewidth=0.8, linestyle="--")
        axes.annotate(f"peak {peaks[device] / divisor:.3g} {unit}", xy=(1.0, device), xycoords=("axes fraction", "data"),
                      xytext=(4, 0), textcoords="offset points", va="center", fontsize=6.5,
                      color=OOM_COLOR if memory.out_of_memory[device] else "#555555")
    axes.set_yticks(range(devices), device_labels(timeline), fontsize=8)
    axes.set_ylim(devices - 0.5, -0.5)
    axes.tick_params(axis="y", length=0)
    axes.tick_params(axis="x", labelsize=8)
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)
    what = "KV cache in use per stage group" if timeline.serving is not None else "memory in use per device"
    note = f"{what} (rows share one scale, full row = {top / divisor:.3g} {unit})"
    if timeline.host_memory is not None:
        note += "; dashed grey: host memory of offloaded activations"
    if show_capacity:
        note += "; dashed: capacity"
    axes.set_title(note, loc="left", fontsize=8, color="#333333")
    short = [d for d, oom in enumerate(memory.out_of_memory) if oom]
    if short:
        labels = device_labels(timeline)
        axes.set_title(f"out of memory: {', '.join(labels[d] for d in short)} (red: above capacity)", loc="right",
                       fontsize=8, fontweight="bold", color=OOM_COLOR)


# --- helpers ---------------------------------------------------------------------------------
def _op_colors(kind: np.ndarray, chunk: np.ndarray, chunks: np.ndarray,
               colors: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(RGBA palette, palette index per op): each op takes its kind's colour (``colors``, by
    kind index), lightened for later chunks of its device; one palette entry per distinct
    (kind, chunk, chunks)."""
    from matplotlib.colors import to_rgba

    combos, inverse = np.unique(np.stack([kind, chunk, chunks], 1).astype(np.int64), axis=0, return_inverse=True)
    palette = np.array([to_rgba(lighten(colors[k], chunk_shade(c, n))) for k, c, n in combos.tolist()])
    return palette, inverse.reshape(-1)


def _draw_boxes(axes: Axes, boxes: np.ndarray, palette: np.ndarray, color: np.ndarray, *, gid: str,
                link: str, edge: float) -> None:
    """Draw boxes (n, 4, 2) filled with ``palette[color]``.

    Up to COLLECTION_LIMIT boxes: one PolyCollection with ``gid`` and a link
    ``#<link>-<row>`` per box (countable in SVG). Beyond it, one compound path per colour:
    a matplotlib Path object per box would take tens of seconds for a million boxes.
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    if len(boxes) <= COLLECTION_LIMIT:
        collection = PolyCollection(boxes, facecolors=palette[color], edgecolors="white", linewidths=edge, zorder=2)
        collection.set_gid(gid)
        collection.set_urls([f"#{link}-{row}" for row in range(len(boxes))])
        axes.add_collection(collection, autolim=False)
        return
    closed = np.concatenate([boxes, boxes[:, :1]], axis=1)  # (n, 5, 2)
    codes = np.array([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY], np.uint8)
    for index in np.unique(color).tolist():
        chosen = closed[color == index]
        path = Path(chosen.reshape(-1, 2), np.tile(codes, len(chosen)))
        patch = PathPatch(path, facecolor=palette[index], linewidth=0, zorder=2)
        patch.set_gid(f"{gid}-{index}")
        # add_artist, not add_patch: updating data limits walks every vertex in Python
        axes.add_artist(patch)


def _rectangles(x0: np.ndarray, x1: np.ndarray, y: np.ndarray, height: float | np.ndarray) -> np.ndarray:
    """Vertices (n, 4, 2) of boxes [x0, x1] x [y - height/2, y + height/2]."""
    low, high = y - height / 2, y + height / 2
    return np.stack([np.stack([x0, low], 1), np.stack([x0, high], 1),
                     np.stack([x1, high], 1), np.stack([x1, low], 1)], 1)


def _edge_width(widths: np.ndarray, inches_per_unit: float) -> float:
    """A thin white edge separates touching boxes; none when a typical box is under
    0.02 in (the edges would hide the colours)."""
    if widths.size == 0:
        return 0.0
    return 0.4 if float(np.median(widths)) * inches_per_unit >= 0.02 else 0.0


def _host_lanes(timeline: Timeline) -> list[int]:
    """The devices with ops on their host link."""
    return sorted({int(d) for d in timeline.op_device[~timeline.on_compute].tolist()})


def _channels(timeline: Timeline) -> list[int]:
    return sorted({int(c) for c in timeline.transfers.channel.tolist()})


def _channel_name(table, channel: int) -> str:
    name = table.channel_names[channel] if channel < len(table.channel_names) else f"channel {channel}"
    return name if len(name) <= 16 else name[:15] + "…"


def _window(timelines: Sequence[Timeline], timeline: Timeline, *, share_axis: bool) -> tuple[float, float]:
    """The time range (the timeline's unit, from its start) its panel shows."""
    if share_axis:
        return 0.0, _span(timelines, timeline.unit)
    low, high = home_window(timeline)
    return (low, high) if high > low else (0.0, 1.0)


def _axis_label(timeline: Timeline, scale: TimeScale, window: tuple[float, float]) -> str:
    """The time axis' label; it says when the panel shows part of its timeline."""
    label = f"time ({scale.unit})"
    if timeline.iterations > 2 and window[1] - window[0] < timeline.makespan:
        label += f"; one steady iteration of the {timeline.iterations} back to back (dashed: iteration ends)"
    elif timeline.iterations > 1:
        label += "; dashed: iteration ends"
    return label


def _mark_iterations(axes: Axes, timeline: Timeline, scale: TimeScale) -> None:
    """A dashed line at the end of each iteration of iterations back to back (not the last)."""
    for end in timeline.iteration_end[:-1]:
        axes.axvline(end * scale.factor, color="#555555", linewidth=0.7, linestyle="--", zorder=4)


def _span(timelines: Sequence[Timeline], unit: str) -> float:
    """The longest iteration among the timelines in ``unit`` (1 if all are empty)."""
    return max(t.makespan for t in timelines if t.unit == unit) or 1.0


def _shared_scales(timelines: Sequence[Timeline]) -> dict[str, TimeScale]:
    """One display unit per time unit, chosen from the longest timeline in that unit."""
    return {t.unit: time_scale(t.unit, _span(timelines, t.unit)) for t in timelines}


def _transfer_kinds_present(timelines: Sequence[Timeline]) -> list[int]:
    return sorted({int(k) for t in timelines for k in np.unique(t.transfers.kind)})
