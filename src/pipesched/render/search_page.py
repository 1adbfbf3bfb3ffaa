"""The HTML page of a design-space search (``pipesched search --html``): one self-contained
page, like the report (``render.html``), with

- the Pareto front of iteration time against peak memory, drawn: every evaluated
  configuration a dot coloured by its family (hover: its configuration and figures; click:
  its row in the tables and its timeline, when drawn, are selected), the configurations out
  of memory hollow and grey (at their simulated time, or the bound when they were never
  simulated), the front joined, the best ringed, the device memory a dashed line;
- the best configurations and the front as sortable tables with readable headers, numbers
  with thousands separators and utilizations as percentages;
- the simulated timelines of the best configuration and of points sampled evenly along the
  front (from the least memory to the fastest), zoomable as in the report: those the search
  simulated in this run (``SearchResult.timelines``; a store keeps no timelines, so a page
  of ``--show`` has none). The page simulates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from pipesched.render.html import (
    base_data,
    html_page,
    kind_legend,
    nice_ticks,
    sortable_table,
    timeline_data,
)
from pipesched.render.summary import summarize
from pipesched.search.results import SearchResult, json_row, simulate_command
from pipesched.search.store import EVALUATED, INVALID, OUT_OF_MEMORY, PRUNED, StoredRow
from pipesched.units import GiB

# configurations drawn as dots at most (an even sample of the rest beyond it), timelines at most
MAX_DOTS = 6000
MAX_TIMELINES = 6
WIDTH, HEIGHT, MARGIN = 880, 400, (24, 20, 52, 70)  # margins: top, right, bottom, left


def render_search_html(result: SearchResult, *, top: int = 20) -> str:
    """The page (see the module docstring) as text."""
    space = result.space
    heading = (f"search: {space['model']} on {space['cluster']}, global batch {space['global_batch']} x "
               f"{space['seq_len']} tokens")
    front = result.front
    best = result.best
    # the stored results and the timelines the search kept of the points it simulated (none
    # when the result was read from a store): no point is simulated again here
    kept = result.timelines
    shown = sampled_front([row for row in front if row.key in kept], best if best is not None and best.key in kept
                          else None)
    timelines = [kept[row.key] for row in shown]
    data = base_data()
    data["timelines"] = [timeline_data(t, summarize(t)) | {"name": f"{k + 1}. {_label(row)}"}
                         for k, (t, row) in enumerate(zip(timelines, shown, strict=True))]
    data["timelineKeys"] = [row.key for row in shown]  # the configuration each timeline draws
    counts = (f"{len(result.rows):,} points: {result.count(EVALUATED):,} evaluated, {result.count(OUT_OF_MEMORY):,} "
              f"out of memory, {result.count(PRUNED):,} pruned by the bound, {result.count(INVALID):,} invalid.")
    sections = [f"<header><h1>{escape(heading)}</h1><p class=\"note\">{escape(counts)}</p>"
                + (kind_legend(timelines) if timelines else "") + "</header>"]
    if best is not None:
        sections.append(f"<p class=\"figures\">Best: {escape(_label(best))}, {best.iteration_time_s:.4f} s, "
                        f"{best.throughput_tokens_per_s:,.0f} tokens/s. Reproduce with "
                        f"<code>{escape(simulate_command(space, best))}</code></p>")
    sections.append("<section><h2>Iteration time against peak memory</h2>" + family_legend(result.rows)
                    + pareto_svg(result.rows, front, best)
                    + '<p class="hint">Each dot is a configuration, coloured by its family (hover for it, click to '
                      "select its row and timeline); hollow grey ones do not fit in memory (at their simulated time, "
                      "or their lower bound when never simulated); the line joins the Pareto front, the ring marks "
                      "the fastest that fits, the dashed line is the device memory.</p></section>")
    ranked = [row for row in result.ranked if row.status == EVALUATED][:top]
    if ranked:
        sections.append("<section><h2>Fastest configurations that fit</h2>" + search_table("ranked", ranked)
                        + "</section>")
    if front:
        sections.append("<section><h2>Pareto front</h2>" + search_table("front", front) + "</section>")
    if timelines:
        sections.append('<section><h2>Timelines: the best and points along the front</h2><p class="hint">Wheel or '
                        "+ / − to zoom, drag to pan, double-click to reset; hover an op for its details; "
                        "click a dot above to outline its timeline.</p>"
                        '<div id="timelines"></div></section>')
    return html_page(heading, sections, data, scripts=("report.js", "search.js"))


def sampled_front(front: Sequence[StoredRow], best: StoredRow | None, count: int = MAX_TIMELINES) -> list[StoredRow]:
    """The best configuration, then up to ``count - 1`` points of the front evenly spaced by
    position along it (its least-memory end and its fastest end included)."""
    shown = [best] if best is not None else []
    others = [row for row in front if row is not best]
    wanted = count - len(shown)
    if wanted <= 0 or not others:
        return shown
    if len(others) <= wanted:
        return shown + others
    picks = sorted({round(k * (len(others) - 1) / (wanted - 1)) for k in range(wanted)}) if wanted > 1 else [0]
    return shown + [others[k] for k in picks]


# (column of ``json_row``, header, how its value is shown)
def _percent(value: object) -> str:
    return "-" if value is None else f"{float(value):.1%}"


def _count(value: object) -> str:
    return "-" if value is None else f"{float(value):,.0f}"


def _plain(value: object) -> str:
    return "-" if value is None else str(value)


SEARCH_COLUMNS = (
    ("schedule", "schedule", _plain),
    ("v", "chunks", _plain),
    ("dp", "DP", _plain),
    ("tp", "TP", _plain),
    ("pp", "PP", _plain),
    ("micro_batch_size", "micro-batch", _plain),
    ("m", "microbatches", _plain),
    ("recompute", "recompute", _plain),
    ("partition", "partition", _plain),
    ("zero", "ZeRO", _plain),
    ("ep", "EP", _plain),
    ("iteration_time_s", "iteration s", lambda v: "-" if v is None else f"{float(v):,.4f}"),
    ("throughput_tokens_per_s", "tokens/s", _count),
    ("mfu", "MFU", _percent),
    ("hfu", "HFU", _percent),
    ("max_peak_memory_bytes", "peak memory GiB", lambda v: "-" if v is None else f"{float(v) / GiB:,.2f}"),
)


def search_table(name: str, rows: Sequence[StoredRow]) -> str:
    """Rows of a search, sortable, each row carrying its configuration's key."""
    body = []
    for row in rows:
        values = json_row(row)
        body.append([("" if values[key] is None else repr(values[key]) if isinstance(values[key], int | float)
                      else str(values[key]), show(values[key])) for key, _, show in SEARCH_COLUMNS])
    return sortable_table(name, [header for _, header, _ in SEARCH_COLUMNS], body,
                          row_data=[row.key for row in rows], row_attribute="data-key")


# dot colours of the families, in order of first appearance (then repeating)
FAMILY_PALETTE = ("#3274b5", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
                  "#ff9da7", "#4e79a7")
OOM_DOT = "#8c959f"
# configurations out of memory drawn up to this factor of the capacity (and of the slowest fitting time)
OOM_REACH = 1.5


def family_colors(rows: Sequence[StoredRow]) -> dict[str, str]:
    """A colour per family, in sorted family order."""
    families = sorted({row.family for row in rows})
    return {family: FAMILY_PALETTE[k % len(FAMILY_PALETTE)] for k, family in enumerate(families)}


def family_legend(rows: Sequence[StoredRow]) -> str:
    items = [f'<span><span class="dot" style="background:{color}"></span>{escape(family)}</span>'
             for family, color in family_colors(rows).items()]
    items.append(f'<span><span class="dot" style="border:1.5px solid {OOM_DOT}"></span>out of memory</span>')
    return '<p class="family-legend">' + "".join(items) + "</p>"


def _label(row: StoredRow) -> str:
    chunks = f" v{row.v}" if row.v is not None else ""
    return (f"{row.family}{chunks}, dp {row.dp} x pp {row.p} x tp {row.tp}, b {row.micro_batch_size} x m "
            f"{row.m}, recompute {row.recompute}, {row.partition} partition, ZeRO-{row.zero}")


def _time_of(row: StoredRow) -> float | None:
    """Where a dot sits: the simulated iteration time, or for a configuration never simulated
    (out of memory before it) its lower bound."""
    return row.iteration_time_s if row.iteration_time_s is not None else row.bound_s


def pareto_svg(rows: Sequence[StoredRow], front: Sequence[StoredRow], best: StoredRow | None) -> str:
    """The scatter of configurations, x peak memory (GiB), y iteration time (s)."""
    evaluated = [row for row in rows if row.status == EVALUATED]
    if not evaluated:
        return '<p class="note">No configuration fits in memory: nothing to draw.</p>'
    evaluated, over = _sampled_dots(rows, evaluated, front)
    capacity = min((row.capacity_bytes for row in rows if row.capacity_bytes), default=None)
    axes, over = _Axes.spanning(evaluated, over, capacity)
    colors = family_colors(rows)
    parts = [f'<svg class="pareto" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
             'aria-label="iteration time against peak memory" xmlns="http://www.w3.org/2000/svg">',
             '<rect x="0" y="0" width="100%" height="100%" fill="#fff"/>', *axes.grid_svg()]
    if capacity:
        parts.append(f'<line x1="{axes.x(capacity / GiB):.1f}" x2="{axes.x(capacity / GiB):.1f}" y1="{axes.top}" '
                     f'y2="{axes.top + axes.plot_h}" stroke="#c0392b" stroke-dasharray="5 4"/>')
    # out of memory: hollow grey, only where they fall inside the axes of the configurations that fit
    parts.extend(_oom_dot(row, axes) for row in over if axes.inside(row))
    on_front = {row.key for row in front}
    parts.extend(_config_dot(row, colors, axes) for row in evaluated if row.key not in on_front)
    if front:
        parts.extend(_front_svg(front, colors, axes))
    if best is not None:
        parts.append(f'<circle class="best" cx="{axes.x(best.peak_memory_bytes / GiB):.1f}" '
                     f'cy="{axes.y(best.iteration_time_s):.1f}" r="9" fill="none" stroke="#c0392b" stroke-width="2" '
                     f'pointer-events="none"><title>best: {escape(_tip(best))}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _sampled_dots(rows: Sequence[StoredRow], evaluated: list[StoredRow],
                  front: Sequence[StoredRow]) -> tuple[list[StoredRow], list[StoredRow]]:
    """The configurations that fit and those out of memory (with a peak and a time) to draw:
    at most MAX_DOTS of each, evenly spaced, the front always among the first."""
    over = [row for row in rows if row.status == OUT_OF_MEMORY and row.peak_memory_bytes is not None
            and _time_of(row) is not None]
    if len(evaluated) > MAX_DOTS:
        step = len(evaluated) / MAX_DOTS
        sample = [evaluated[int(k * step)] for k in range(MAX_DOTS)]
        evaluated = list({row.key: row for row in (*sample, *front)}.values())
    if len(over) > MAX_DOTS:
        over = [over[int(k * len(over) / MAX_DOTS)] for k in range(MAX_DOTS)]
    return evaluated, over


@dataclass(frozen=True)
class _Axes:
    """The plot's axes: ticks of peak memory (GiB) and iteration time (s), and the plot area
    in pixels inside MARGIN."""

    x_ticks: list[float]
    y_ticks: list[float]
    top: float = MARGIN[0]
    left: float = MARGIN[3]
    plot_w: float = WIDTH - MARGIN[3] - MARGIN[1]
    plot_h: float = HEIGHT - MARGIN[0] - MARGIN[2]

    @classmethod
    def spanning(cls, evaluated: list[StoredRow], over: list[StoredRow],
                 capacity: float | None) -> tuple[_Axes, list[StoredRow]]:
        """Axes over the configurations that fit, the capacity, and those out of memory up to
        half the capacity past it (returned: the ones within that reach)."""
        memory = [row.peak_memory_bytes / GiB for row in evaluated]
        times = [row.iteration_time_s for row in evaluated]
        reach = OOM_REACH * (capacity / GiB if capacity else max(memory))
        over = [row for row in over
                if row.peak_memory_bytes / GiB <= reach and _time_of(row) <= OOM_REACH * max(times)]
        x_ticks = nice_ticks(min(memory), max(memory + ([capacity / GiB] if capacity else [])
                                          + [row.peak_memory_bytes / GiB for row in over]))
        over_times = [_time_of(row) for row in over]
        y_ticks = nice_ticks(min(times + over_times), max(times + over_times))
        return cls(x_ticks, y_ticks), over

    def x(self, gib: float) -> float:
        return self.left + (gib - self.x_ticks[0]) / (self.x_ticks[-1] - self.x_ticks[0] or 1.0) * self.plot_w

    def y(self, seconds: float) -> float:
        return self.top + self.plot_h - (seconds - self.y_ticks[0]) / (self.y_ticks[-1] - self.y_ticks[0] or 1.0) * self.plot_h

    def inside(self, row: StoredRow) -> bool:
        gib, seconds = row.peak_memory_bytes / GiB, _time_of(row)
        return self.x_ticks[0] <= gib <= self.x_ticks[-1] and self.y_ticks[0] <= seconds <= self.y_ticks[-1]

    def grid_svg(self) -> list[str]:
        """Grid lines and tick labels of both axes, and the axes' titles."""
        top, left, plot_w, plot_h = self.top, self.left, self.plot_w, self.plot_h
        parts = [f'<line x1="{self.x(value):.1f}" x2="{self.x(value):.1f}" y1="{top}" y2="{top + plot_h}" '
                 f'stroke="#eceff2"/><text x="{self.x(value):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                 f'font-size="11" fill="#57606a">{value:,g}</text>' for value in self.x_ticks]
        parts.extend(f'<line x1="{left}" x2="{left + plot_w}" y1="{self.y(value):.1f}" y2="{self.y(value):.1f}" '
                     f'stroke="#eceff2"/><text x="{left - 6}" y="{self.y(value) + 4:.1f}" text-anchor="end" '
                     f'font-size="11" fill="#57606a">{value:.4g}</text>' for value in self.y_ticks)
        parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle" font-size="12" '
                     'fill="#57606a">peak memory of the worst device (GiB)</text>'
                     f'<text x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" font-size="12" fill="#57606a" '
                     f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">iteration time (s)</text>')
        return parts


def _oom_dot(row: StoredRow, axes: _Axes) -> str:
    """A configuration out of memory: a hollow grey dot, at its lower bound where not simulated."""
    simulated = row.iteration_time_s is not None
    return (f'<circle class="oom" data-key="{escape(row.key, quote=True)}" cx="{axes.x(row.peak_memory_bytes / GiB):.1f}" '
            f'cy="{axes.y(_time_of(row)):.1f}" r="2.8" fill="none" stroke="{OOM_DOT}" stroke-opacity="0.7">'
            f"<title>out of memory{'' if simulated else ' (at its lower bound)'}: "
            f"{escape(_label(row))}; {escape(row.reason)}</title></circle>")


def _config_dot(row: StoredRow, colors: dict[str, str], axes: _Axes) -> str:
    """A configuration that fits, off the front: a small dot in its family's colour."""
    return (f'<circle data-key="{escape(row.key, quote=True)}" cx="{axes.x(row.peak_memory_bytes / GiB):.1f}" '
            f'cy="{axes.y(row.iteration_time_s):.1f}" r="3" fill="{colors[row.family]}" fill-opacity="0.6">'
            f"<title>{escape(_tip(row))}</title></circle>")


def _front_svg(front: Sequence[StoredRow], colors: dict[str, str], axes: _Axes) -> list[str]:
    """The Pareto front: a staircase through its configurations, each a ringed dot."""
    path = []
    for k, row in enumerate(front):
        px, py = axes.x(row.peak_memory_bytes / GiB), axes.y(row.iteration_time_s)
        if k:
            path.append(f"{px:.1f},{axes.y(front[k - 1].iteration_time_s):.1f}")
        path.append(f"{px:.1f},{py:.1f}")
    parts = [f'<polyline points="{" ".join(path)}" fill="none" stroke="#1f2328" stroke-width="1.2" '
             'stroke-opacity="0.7"/>']
    parts.extend(f'<circle class="front" data-key="{escape(row.key, quote=True)}" '
                 f'cx="{axes.x(row.peak_memory_bytes / GiB):.1f}" cy="{axes.y(row.iteration_time_s):.1f}" r="5" '
                 f'fill="{colors[row.family]}" stroke="#1f2328" stroke-width="1">'
                 f"<title>{escape(_tip(row))}</title></circle>" for row in front)
    return parts


def _tip(row: StoredRow) -> str:
    utilization = "" if row.mfu is None else f", MFU {row.mfu:.1%}"
    return (f"{_label(row)}: {row.iteration_time_s:,.4f} s, {row.throughput_tokens_per_s:,.0f} tokens/s{utilization}, "
            f"peak {row.peak_memory_bytes / GiB:,.1f} GiB")
