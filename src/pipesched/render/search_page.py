"""The HTML page of a design-space search (``pipesched search --html``): one self-contained
page, like the report (``render.html``), with

- the Pareto front of iteration time against peak memory, drawn: every evaluated
  configuration a dot (hover: its configuration and figures), the front joined, the best
  ringed, the device memory a dashed line;
- the best configurations and the front as sortable tables;
- the simulated timelines of the best configuration and the other points of the front,
  zoomable as in the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from pipesched.render.html import _base_data, _legend, _page, comparison_table_html, timeline_data
from pipesched.render.summary import summarize
from pipesched.search.results import SearchResult, json_row, row_point, simulate_command
from pipesched.search.store import EVALUATED, INVALID, OUT_OF_MEMORY, PRUNED, StoredRow

GiB = 2.0**30
# configurations drawn as dots at most (an even sample of the rest beyond it), timelines at most
MAX_DOTS = 6000
MAX_TIMELINES = 6
WIDTH, HEIGHT, MARGIN = 880, 400, (24, 20, 52, 70)  # margins: top, right, bottom, left


def render_search_html(result: SearchResult, *, top: int = 20) -> str:
    """The page (see the module docstring) as text."""
    from pipesched.experiments.simulation import simulate_point

    space = result.space
    heading = (f"search: {space['model']} on {space['cluster']}, global batch {space['global_batch']} x "
               f"{space['seq_len']} tokens")
    front = result.front
    best = result.best
    shown = [best] if best is not None else []
    shown += [row for row in front if row is not best][: MAX_TIMELINES - len(shown)]
    timelines = [simulate_point(row_point(space, row)).timeline for row in shown]
    data = _base_data()
    data["timelines"] = [timeline_data(t, summarize(t)) for t in timelines]
    counts = (f"{len(result.rows):,} points: {result.count(EVALUATED):,} evaluated, {result.count(OUT_OF_MEMORY):,} "
              f"out of memory, {result.count(PRUNED):,} pruned by the bound, {result.count(INVALID):,} invalid.")
    sections = [f"<header><h1>{escape(heading)}</h1><p class=\"note\">{escape(counts)}</p>"
                + (_legend(timelines) if timelines else "") + "</header>"]
    if best is not None:
        sections.append(f"<p class=\"note\">Best: {escape(_label(best))}, {best.iteration_time_s:.4f} s, "
                        f"{best.throughput_tokens_per_s:,.0f} tokens/s. Reproduce with "
                        f"<code>{escape(simulate_command(space, best))}</code></p>")
    sections.append("<section><h2>Iteration time against peak memory</h2>" + pareto_svg(result.rows, front, best)
                    + '<p class="hint">Each dot is a configuration that was simulated (hover for it); the line joins '
                      "the Pareto front, the ring marks the fastest that fits, the dashed line is the device "
                      "memory.</p></section>")
    ranked = [row for row in result.ranked if row.status == EVALUATED][:top]
    if ranked:
        sections.append("<section><h2>Fastest configurations that fit</h2>"
                        + comparison_table_html([_table_row(r) for r in ranked]) + "</section>")
    if front:
        sections.append("<section><h2>Pareto front</h2>" + comparison_table_html([_table_row(r) for r in front])
                        + "</section>")
    if timelines:
        sections.append('<section><h2>Timelines: the best and the front</h2><p class="hint">Wheel or + / − to '
                        "zoom, drag to pan, double-click to reset; hover an op for its details.</p>"
                        '<div id="timelines"></div></section>')
    return _page(heading, sections, data)


def _label(row: StoredRow) -> str:
    chunks = f" v{row.v}" if row.v is not None else ""
    return (f"{row.schedule}{chunks}, dp {row.dp} x pp {row.pp} x tp {row.tp}, b {row.micro_batch_size} x m "
            f"{row.m}, recompute {row.recompute}, {row.partition} partition, ZeRO-{row.zero}")


def _table_row(row: StoredRow) -> dict:
    values = json_row(row)
    values["peak_memory_gib"] = round(row.peak_memory_bytes / GiB, 2)
    del values["max_peak_memory_bytes"], values["fits"]
    return values


def _ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    span = hi - lo if hi > lo else abs(hi) or 1.0
    step = 10 ** math.floor(math.log10(span / count))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(lo / step) * step
    return [first + k * step for k in range(math.ceil((hi - first) / step) + 1)]


def pareto_svg(rows: Sequence[StoredRow], front: Sequence[StoredRow], best: StoredRow | None) -> str:
    """The scatter of evaluated configurations, x peak memory (GiB), y iteration time (s)."""
    evaluated = [row for row in rows if row.status == EVALUATED]
    if not evaluated:
        return '<p class="note">No configuration fits in memory: nothing to draw.</p>'
    if len(evaluated) > MAX_DOTS:
        step = len(evaluated) / MAX_DOTS
        sample = [evaluated[int(k * step)] for k in range(MAX_DOTS)]
        evaluated = list({row.key: row for row in (*sample, *front)}.values())
    capacity = min((row.capacity_bytes for row in rows if row.capacity_bytes), default=None)
    memory = [row.peak_memory_bytes / GiB for row in evaluated]
    times = [row.iteration_time_s for row in evaluated]
    x_ticks = _ticks(min(memory), max(memory + ([capacity / GiB] if capacity else [])))
    y_ticks = _ticks(min(times), max(times))
    top, right, bottom, left = MARGIN
    plot_w, plot_h = WIDTH - left - right, HEIGHT - top - bottom

    def x(gib: float) -> float:
        return left + (gib - x_ticks[0]) / (x_ticks[-1] - x_ticks[0] or 1.0) * plot_w

    def y(seconds: float) -> float:
        return top + plot_h - (seconds - y_ticks[0]) / (y_ticks[-1] - y_ticks[0] or 1.0) * plot_h

    parts = [f'<svg class="pareto" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
             'aria-label="iteration time against peak memory" xmlns="http://www.w3.org/2000/svg">',
             '<rect x="0" y="0" width="100%" height="100%" fill="#fff"/>']
    for value in x_ticks:
        parts.append(f'<line x1="{x(value):.1f}" x2="{x(value):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#eceff2"/>'
                     f'<text x="{x(value):.1f}" y="{top + plot_h + 16}" text-anchor="middle" font-size="11" '
                     f'fill="#57606a">{value:g}</text>')
    for value in y_ticks:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eceff2"/>'
                     f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#57606a">{value:.4g}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle" font-size="12" '
                 'fill="#57606a">peak memory of the worst device (GiB)</text>'
                 f'<text x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" font-size="12" fill="#57606a" '
                 f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">iteration time (s)</text>')
    if capacity:
        parts.append(f'<line x1="{x(capacity / GiB):.1f}" x2="{x(capacity / GiB):.1f}" y1="{top}" '
                     f'y2="{top + plot_h}" stroke="#c0392b" stroke-dasharray="5 4"/>')
    on_front = {row.key for row in front}
    for row, gib, seconds in zip(evaluated, memory, times, strict=True):
        if row.key in on_front:
            continue
        parts.append(f'<circle cx="{x(gib):.1f}" cy="{y(seconds):.1f}" r="2.6" fill="#8c959f" fill-opacity="0.55">'
                     f"<title>{escape(_tip(row))}</title></circle>")
    if front:
        path = []
        for k, row in enumerate(front):
            px, py = x(row.peak_memory_bytes / GiB), y(row.iteration_time_s)
            if k:
                path.append(f"{px:.1f},{y(front[k - 1].iteration_time_s):.1f}")
            path.append(f"{px:.1f},{py:.1f}")
        parts.append(f'<polyline points="{" ".join(path)}" fill="none" stroke="#0969da" stroke-width="1.6"/>')
        for row in front:
            parts.append(f'<circle class="front" cx="{x(row.peak_memory_bytes / GiB):.1f}" '
                         f'cy="{y(row.iteration_time_s):.1f}" r="4.2" fill="#0969da">'
                         f"<title>{escape(_tip(row))}</title></circle>")
    if best is not None:
        parts.append(f'<circle class="best" cx="{x(best.peak_memory_bytes / GiB):.1f}" '
                     f'cy="{y(best.iteration_time_s):.1f}" r="8" fill="none" stroke="#c0392b" stroke-width="2">'
                     f"<title>best: {escape(_tip(best))}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def _tip(row: StoredRow) -> str:
    return (f"{_label(row)}: {row.iteration_time_s:.4f} s, {row.throughput_tokens_per_s:,.0f} tokens/s, "
            f"peak {row.peak_memory_bytes / GiB:.1f} GiB")
