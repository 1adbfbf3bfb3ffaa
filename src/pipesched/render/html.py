"""The HTML report: one self-contained page (styles, script and data inlined; nothing is
fetched), for one or several timelines.

The page opens with a headline (the fastest schedule that fits) and a table of contents,
then a sortable metrics table (with each bubble's breakdown, ``pipesched.bubbles``) and the
comparison table when given, whose rows link to the timelines and whose sorting reorders
them; per timeline an interactive chart on its own time axis (a steady state opens on one
steady iteration; a toggle puts every panel on one axis; ctrl+wheel or buttons to zoom, drag
to pan, shift+drag to measure a window; hovering an op shows its stage, microbatch, start,
end, duration and what it waited for, hovering an idle gap what the gap waited for; a search
box lights up ops by kind, stage, microbatch or device in every panel; a toggle marks the
critical path, listed under the chart; a thin row per device host link with its activation
offloads and reloads) with the memory curves (and, dashed, the host memory each device's
offloads hold)
under it. Tables are built here with every label escaped; the charts are drawn in the page
from one compact JSON blob (columns of numbers, not one object per op), so 8 schedules of
p=16, m=64 stay near 2 MB.

The comparison page (``render_comparison_html``, ``pipesched check --html``; check.js) puts,
per schedule, the predicted and the measured timeline one above the other on one time axis
(zoom and pan move both), keeps every op in its kind's colour and outlines it by how far its
measured duration is from the predicted one (a toggle fills by it instead), links each op to
its counterpart (hovering one outlines the other), outlines the op where the timelines first
part (``Deviations.parting``), tables the error per op kind and the largest deviations, and
plots the measured step times against the prediction and its Monte Carlo p50-p99 band,
marking the step drawn (a run's median step, whose time it reports). Every error is the
prediction's, (predicted - measured) / measured (``pairing.prediction_error``: positive when
the prediction is longer than the run), every difference predicted - measured.

A measured timeline in the report (``run --html``) adds its run's steps and what the
measurement lacks (``measured_section``); Monte Carlo distributions (``compare --jitter
--html``) each get a time axis and a count axis, and the pairwise figures the terminal
prints (``distribution_data``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from importlib import resources

import numpy as np

from pipesched.bubbles import BUBBLE_PARTS, bubble_breakdown
from pipesched.errors import require
from pipesched.pairing import (
    PARTING_SHARE,
    Comparison,
    Deviations,
    deviations,
    kind_errors,
    prediction_error,
)
from pipesched.render.style import (
    IDLE_COLOR,
    LISTED_REQUESTS,
    OOM_COLOR,
    TRANSFER_COLORS,
    TRANSFER_NAMES,
    TimeScale,
    chunk_shade,
    format_memory,
    home_window,
    kind_styles,
    lighten,
    memory_scale,
    time_scale,
)
from pipesched.render.summary import (
    Summary,
    bubble_parts_text,
    op_chunks,
    report_headline,
    summarize,
)
from pipesched.render.terminal import format_cell
from pipesched.rules import RULES, Rules
from pipesched.simulate.critical import critical_path
from pipesched.timeline import ALLREDUCE, Timeline, median_step
from pipesched.variability.distribution import paired_comparison
from pipesched.waits import WAIT_NAMES, waited_for

# no request may leave the page: everything it needs is inline
CONTENT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def render_html(
    timelines: Sequence[Timeline],
    *,
    comparison: Sequence[Mapping[str, object]] | None = None,
    title: str = "",
    distributions: Sequence[Mapping[str, object]] | None = None,
    share_axis: bool = False,
    extra_sections: Sequence[tuple[str, str, str]] = (),
) -> str:
    """The report page as text (``share_axis``: it opens with every panel on one time axis;
    ``extra_sections``: (anchor, heading, HTML) sections placed before the timelines, listed
    in the contents: a serving run's results and request plots).

    distributions: per schedule ``{"name", "samples" (iteration times, seconds),
    "deterministic" (seconds), optionally "fastest" (share of samples)}``, drawn as
    histograms on one time axis (``distribution_data``)."""
    require(len(timelines) >= 1, "timelines", 0, "give at least one timeline for the report")
    summaries = [summarize(t) for t in timelines]
    heading = title or "pipeline schedule report: " + ", ".join(s.name for s in summaries)
    data = base_data(timelines[0].schedule.rules)
    # one display unit per base unit (slots or seconds), so panels can share one time axis
    scales = {unit: time_scale(unit, max(t.makespan for t in timelines if t.unit == unit))
              for unit in {t.unit for t in timelines}}
    data["timelines"] = [timeline_data(t, s, scale=scales[t.unit])
                         for t, s in zip(timelines, summaries, strict=True)]
    contents = [("metrics", "Metrics")]
    sections = [
        f'<header><h1>{escape(heading)}</h1><p class="report-headline" id="report-headline">'
        f"{escape(report_headline(summaries))}</p>{kind_legend(timelines)}</header>",
        '<section id="metrics"><h2>Metrics</h2>' + metrics_table_html(summaries) + _definitions() + "</section>",
    ]
    if comparison:
        # several schedules side by side, or one schedule's figures (simulate's rates)
        name = "Comparison" if len(comparison) > 1 else "Figures"
        contents.append(("comparison", name))
        sections.append(_comparison_section_html(name, comparison, summaries))
    sections.extend(measured_section(t) for t in timelines if t.measured is not None)
    if distributions:
        contents.append(("distributions", "Iteration time distributions"))
        data["distributions"] = distribution_data(distributions)
        sections.append(_distributions_section(data["distributions"]))
    for anchor, name, body in extra_sections:
        contents.append((anchor, name))
        sections.append(f'<section id="{escape(anchor, quote=True)}"><h2>{escape(name)}</h2>{body}</section>')
    contents.append(("timelines-section", "Timelines"))
    sections.append(_timelines_section(share_axis))
    sections.insert(1, _contents(contents, summaries))
    return html_page(heading, sections, data)


def _comparison_section_html(name: str, comparison: Sequence[Mapping[str, object]], summaries: Sequence[Summary]) -> str:
    """The comparison table, each row linked to its schedule's first timeline panel."""
    panel_of = {s.name: k for k, s in reversed(list(enumerate(summaries)))}
    links = [f"timeline-{panel_of[str(row.get('schedule'))]}" if str(row.get("schedule")) in panel_of else ""
             for row in comparison]
    return (f'<section id="comparison"><h2>{name}</h2>'
            + comparison_table_html(comparison, row_data=links) + "</section>")


def _distributions_section(distributions: dict) -> str:
    """The iteration time histograms' section (drawn in the page from ``distributions``)."""
    return ('<section id="distributions-section"><h2>Iteration time distributions</h2><p class="hint">Monte Carlo '
            "samples per schedule, every plot on the same time axis and count axis; hover a bar for its range and "
            "count.</p>" + _order_note(distributions) + '<div id="distributions"></div></section>')


def _timelines_section(share_axis: bool) -> str:
    """The timeline panels' section, with its tools (``share_axis``: opening on one time axis)."""
    return ('<section id="timelines-section"><h2>Timelines</h2><p class="hint">Each panel has its own time axis '
            "(a steady state shows one steady iteration, its iteration ends dashed). Ctrl+wheel or + / − to zoom "
            "around what is visible, drag to pan, shift+drag to measure a time window, double-click to reset; "
            "hover an op or an idle gap for what it waited for, click an op to pin its microbatch.</p>"
            + _timeline_tools(share_axis=share_axis) + '<div id="timelines"></div></section>')


def _contents(contents: Sequence[tuple[str, str]], summaries: Sequence[Summary]) -> str:
    """The table of contents: the sections, then a link to every schedule's panel."""
    sections = "".join(f'<li><a href="#{anchor}">{escape(name)}</a></li>' for anchor, name in contents)
    panels = "".join(f'<a href="#timeline-{k}">{escape(s.name)}</a>' for k, s in enumerate(summaries))
    return f'<nav class="contents" aria-label="contents"><ul>{sections}</ul><p class="panel-links">{panels}</p></nav>'


def _timeline_tools(*, share_axis: bool = False) -> str:
    return ('<div class="timeline-tools" id="timeline-tools">'
            '<label>find <input type="search" id="op-search" placeholder="mb 3, F, stage 2, dev 1" '
            'aria-label="find ops by kind, stage, microbatch or device"></label>'
            '<span id="search-count" class="hint" aria-live="polite"></span>'
            f'<label><input type="checkbox" id="share-axis"{" checked" if share_axis else ""}> one time axis for all '
            'panels</label>'
            '<label><input type="checkbox" id="show-critical"> critical path</label></div>')


def html_page(heading: str, sections: Sequence[str], data: dict, *, scripts: Sequence[str] = ("report.js",),
              styles: Sequence[str] = ("report.css", "pages.css")) -> str:
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_POLICY}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(heading)}</title>",
        *(f"<style>{_asset(name)}</style>" for name in styles),
        "</head><body>",
        *sections,
        '<div id="tooltip" role="tooltip" hidden></div>',
        f'<script type="application/json" id="report-data">{script_json(data)}</script>',
        *(f"<script>{_asset(name)}</script>" for name in scripts),
        "</body></html>",
    ])


def base_data(rules: Rules = RULES) -> dict:
    """What every page's script reads, with the kinds of ``rules`` (the page's timelines')."""
    styles = kind_styles(rules)
    return {
        "kinds": {"letters": styles.letters, "names": styles.names, "colors": styles.colors},
        "transferKinds": {"names": TRANSFER_NAMES, "colors": TRANSFER_COLORS},
        "waitNames": WAIT_NAMES,
        "bubbleParts": BUBBLE_PARTS,
        "idleColor": IDLE_COLOR,
        "oomColor": OOM_COLOR,
    }


# bars of each distribution plot (one set of bins for every schedule)
DISTRIBUTION_BINS = 40


def distribution_data(distributions: Sequence[Mapping[str, object]], *, bins: int = DISTRIBUTION_BINS) -> dict:
    """Histograms of every schedule's samples on common bins, with their deterministic
    time, mean, p50, p99, the share of samples in which each is fastest and in which each is
    faster than the next by mean, and the share of samples whose order of the schedules
    differs from the order by mean (``variability.distribution.paired_comparison``, as the
    terminal prints them; samples on common random numbers, so sample i of each belong
    together; without equal sample counts, the given ``fastest`` only)."""
    samples = [np.asarray(d["samples"], np.float64) for d in distributions]
    lo = min(float(x.min()) for x in samples)
    hi = max(max(float(x.max()) for x in samples), *(float(d["deterministic"]) for d in distributions))
    lo = min(lo, *(float(d["deterministic"]) for d in distributions))
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-6, 1e-12)
    scale = time_scale("s", hi)
    edges = np.linspace(lo, hi, bins + 1)
    names = [str(d["name"]) for d in distributions]
    paired = (paired_comparison(names, samples)
              if len(samples) > 1 and len({x.size for x in samples}) == 1 and len(set(names)) == len(names) else None)
    rank = {name: k for k, name in enumerate(paired.names)} if paired is not None else {}
    rows = []
    for d, name, values in zip(distributions, names, samples, strict=True):
        counts, _ = np.histogram(values, bins=edges)
        k = rank.get(name)
        fastest = paired.fastest[k] if k is not None else d.get("fastest")
        rows.append({
            "name": name,
            "samples": int(values.size),
            "counts": counts.tolist(),
            "deterministic": float(d["deterministic"]) * scale.factor,
            "mean": float(values.mean()) * scale.factor,
            "p50": float(np.percentile(values, 50)) * scale.factor,
            "p99": float(np.percentile(values, 99)) * scale.factor,
            "fastest": None if fastest is None else float(fastest),
            # share of samples faster than the schedule ranked next by mean, and that one's name
            "fasterThanNext": None if k is None or paired.beats_next[k] is None else float(paired.beats_next[k]),
            "next": None if k is None or k + 1 >= len(paired.names) else paired.names[k + 1],
        })
    return {"unit": scale.unit, "edges": (edges * scale.factor).tolist(), "rows": rows,
            "orderDiffers": None if paired is None else paired.flip_share}


def _order_note(data: dict) -> str:
    share = data["orderDiffers"]
    if share is None:
        return ""
    return (f'<p class="order-note">The order of the schedules differs from the order by mean in {share:.1%} '
            "of the samples.</p>")


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart, at most about ``count``
    intervals) from at or below ``lo`` to at or above ``hi``.

    >>> nice_ticks(113.2, 129.5)
    [110, 115, 120, 125, 130]
    """
    span = hi - lo if hi > lo else abs(hi) or 1.0
    step = 10 ** math.floor(math.log10(span / count))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(lo / step) * step
    return [first + k * step for k in range(math.ceil((hi - first) / step) + 1)]


# the step-time strip of a measured run, pixels
STRIP_WIDTH, STRIP_HEIGHT, STRIP_LEFT, STRIP_RIGHT = 880, 70, 16, 16


def measured_section(timeline: Timeline) -> str:
    """A measured timeline's run: the spread of its steps drawn (the step shown marked), and
    what the measurement holds beside the op times and what it lacks."""
    info = timeline.measured
    steps = np.asarray(info.step_times_s or (timeline.makespan,), np.float64)
    scale = time_scale("s", float(steps.max()))
    median = float(steps[median_step(steps)])  # the run's median step (the lower middle one of an even count)
    low, high = np.percentile(steps, (25, 75))
    figures = (f"{len(steps)} measured step{'' if len(steps) == 1 else 's'}: "
               + ", ".join(f"{t * scale.factor:.4g}" for t in steps) + f" {scale.unit}; median {scale.format(median)}, "
               f"spread {scale.format(float(steps.max() - steps.min()))} "
               f"({(steps.max() - steps.min()) / median:.1%} of the median), IQR {scale.format(float(high - low))}; "
               f"the timeline drawn is step {info.step + 1}, {scale.format(timeline.makespan)}.")
    waits = np.asarray(info.op_wait_s, np.float64)
    waited = ([float(waits[timeline.op_device == d].sum()) for d in range(timeline.num_devices)]
              if len(waits) == len(timeline) else [])
    holds = []
    holds.append(_lanes_text(timeline))
    if waited:
        holds.append("time ops waited for their inputs inside their spans: "
                     + ", ".join(f"d{d} {scale.format(w)}" for d, w in enumerate(waited)))
    if timeline.memory is None:
        holds.append("no memory curves: the run does not record memory")
    return (f'<section class="measured"><h2>Measured run: {escape(timeline.schedule.name)}</h2>'
            f'<p class="figures">{escape(figures)}</p>{_strip_svg(steps, median, timeline.makespan, scale)}'
            '<ul class="measured-notes">' + "".join(f"<li>{escape(h)}</li>" for h in holds) + "</ul></section>")


def _strip_svg(steps: np.ndarray, median: float, drawn: float, scale: TimeScale) -> str:
    """Each step a dot on a time axis, the step drawn ringed, the median a bar."""
    lo, hi = float(steps.min()), float(steps.max())
    pad = max((hi - lo) * 0.1, hi * 0.01, 1e-12)
    lo, hi = lo - pad, hi + pad
    width = STRIP_WIDTH - STRIP_LEFT - STRIP_RIGHT

    def x(value: float) -> float:
        return STRIP_LEFT + (value - lo) / (hi - lo) * width

    parts = [f'<svg class="step-strip" viewBox="0 0 {STRIP_WIDTH} {STRIP_HEIGHT}" width="100%" role="img" '
             'aria-label="measured step times" xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{STRIP_LEFT}" x2="{STRIP_LEFT + width}" y1="40" y2="40" stroke="#8c959f"/>']
    for tick in nice_ticks(lo * scale.factor, hi * scale.factor):
        px = x(tick / scale.factor)
        if not STRIP_LEFT <= px <= STRIP_LEFT + width:
            continue
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="40" y2="44" stroke="#8c959f"/><text x="{px:.1f}" y="56" '
                     f'text-anchor="middle" font-size="11" fill="#57606a">{tick:.4g}</text>')
    parts.append(f'<text x="{STRIP_LEFT + width / 2:.0f}" y="68" text-anchor="middle" font-size="11" '
                 f'fill="#57606a">step time ({scale.unit})</text>')
    parts.append(f'<line class="step-median" x1="{x(median):.1f}" x2="{x(median):.1f}" y1="14" y2="40" '
                 'stroke="#1f2328" stroke-width="2"/>')
    for k, value in enumerate(steps.tolist()):
        ring = ' stroke="#c0392b" stroke-width="2"' if value == drawn else ""
        parts.append(f'<circle data-step="{k}" cx="{x(value):.1f}" cy="{27 + (k % 3 - 1) * 6}" r="5" fill="#3274b5" '
                     f'fill-opacity="0.75"{ring}><title>step {k + 1}: {value * scale.factor:.4g} {scale.unit}'
                     f"{' (drawn below)' if value == drawn else ''}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


# deviations shown per schedule in the comparison page's table
DEVIATIONS_SHOWN = 50


def render_comparison_html(
    comparisons: Sequence[Comparison],
    *,
    summary: Sequence[Mapping[str, object]] | None = None,
    title: str = "",
    shown: int = DEVIATIONS_SHOWN,
) -> str:
    """The comparison page (module docstring) of predicted and measured timelines.

    summary: flat rows (column -> value) for the table at the top, one per schedule.
    """
    require(len(comparisons) >= 1, "comparisons", 0, "give at least one predicted and measured pair")
    heading = title or "prediction vs measurement: " + ", ".join(c.predicted.schedule.name for c in comparisons)
    data = base_data()
    data["timelines"] = []
    data["comparisons"] = []
    drawn = [t for c in comparisons for t in (c.predicted, c.measured)]
    sections = [f"<header><h1>{escape(heading)}</h1>{kind_legend(drawn)}{_deviation_legend()}</header>"]
    if summary:
        sections.append("<section><h2>Predicted and measured</h2>" + comparison_table_html(summary)
                        + f'<p class="note">{escape(PREDICTED_NOTE)}</p></section>')
    for k, comparison in enumerate(comparisons):
        predicted, measured = comparison.predicted, comparison.measured
        scale = time_scale(predicted.unit, max(predicted.makespan, measured.makespan))
        found = deviations(predicted, measured)
        first = len(data["timelines"])
        data["timelines"].extend(_paired_timelines(comparison, found, k, first, scale))
        parting = found.parting(predicted.makespan)  # predicted row where the timelines first part
        data["comparisons"].append(_comparison_data(comparison, found, parting, first, scale))
        sections.append(_comparison_section(k, comparison, found, parting, scale, shown))
    return html_page(heading, sections, data, scripts=("report.js", "check.js"))


def _paired_timelines(comparison: Comparison, found: Deviations, k: int, first: int, scale: TimeScale) -> list[dict]:
    """The predicted and the measured timeline of pair ``k`` (rows ``first`` and the next of
    the page's timelines), each op linked to its counterpart and shaded by its deviation."""
    predicted, measured = comparison.predicted, comparison.measured
    relative = np.round(found.relative, 4)
    back = np.full(len(measured), -1, np.int64)  # predicted row of each measured row
    back[found.partner[found.partner >= 0]] = np.flatnonzero(found.partner >= 0)
    entries = []
    for side, (timeline, links, shades) in enumerate((
            (predicted, found.partner, relative),
            (measured, back, np.where(back >= 0, relative[np.maximum(back, 0)], np.nan)))):
        entry = timeline_data(timeline, summarize(timeline), scale=scale)
        entry.update(view=f"pair-{k}", pairWith=first + 1 - side, links=links.tolist(),
                     deviation=[None if math.isnan(x) else float(x) for x in shades])
        entries.append(entry)
    return entries


def _comparison_data(comparison: Comparison, found: Deviations, parting: int, first: int, scale: TimeScale) -> dict:
    """One pair's figures for the page: its times in ``scale``, each step's error, where the
    timelines part."""
    predicted, measured = comparison.predicted, comparison.measured
    return {
        "name": predicted.schedule.name,
        "predicted": first,
        "measured": first + 1,
        "timeUnit": scale.unit,
        "predictedTime": predicted.makespan * scale.factor,
        "predictedP50": None if comparison.predicted_p50 is None else comparison.predicted_p50 * scale.factor,
        "predictedP99": None if comparison.predicted_p99 is None else comparison.predicted_p99 * scale.factor,
        "measuredTime": measured.makespan * scale.factor,  # the step drawn: the median step of a run
        "steps": [t * scale.factor for t in comparison.step_times],
        # each step's prediction error, against the prediction and against its p50
        "stepError": _errors(predicted.makespan, comparison.step_times),
        "stepErrorP50": None if comparison.predicted_p50 is None else _errors(comparison.predicted_p50,
                                                                             comparison.step_times),
        "parting": parting,  # predicted row where the timelines first part, -1 if they never do
        "partingWith": -1 if parting < 0 else int(found.partner[parting]),
    }


def _comparison_section(k: int, comparison: Comparison, found: Deviations, parting: int, scale: TimeScale,
                        shown: int) -> str:
    """Pair ``k``'s section: its figures, the two timelines, the error per kind, the largest
    ``shown`` deviations and the step times."""
    predicted, measured = comparison.predicted, comparison.measured
    return (
        f'<section class="comparison" data-comparison="{k}"><h2>{escape(predicted.schedule.name)}</h2>'
        f"{_figures_note(comparison, scale)}"
        '<p class="hint">Top: predicted; bottom: measured, on one time axis (ctrl+wheel or + / − to zoom, '
        "drag to pan, double-click to reset). Hover an op to outline its counterpart.</p>"
        f"{_parting_note(predicted, found, parting, scale)}{_lanes_note(measured)}"
        f'<div class="pair" id="pair-{k}"></div>'
        f"<h3>Error per op kind</h3>{_kind_table(k, predicted, found, scale)}"
        f'<h3>Largest deviations</h3><div class="deviations">'
        f"{_deviation_table(k, predicted, found, scale, shown)}</div>"
        f'<h3>Step times</h3><div class="steps" id="steps-{k}"></div></section>'
    )


def _errors(predicted: float, measured: Sequence[float]) -> list[float | None]:
    """The prediction error against each measured value (None where it has none)."""
    errors = np.atleast_1d(prediction_error(predicted, np.asarray(measured, np.float64)))
    return [None if math.isnan(e) else float(e) for e in errors.tolist()]


# what the page's two predictions are (runtime/check.py predict)
PREDICTED_NOTE = ("predicted: the simulation with every op at the median of its profiled repeats (the timeline drawn "
                  "on top); predicted p50 / p99: the same costs over Monte Carlo iterations in which every op draws "
                  "its time from its profiled repeats; measured: the median step (the timeline drawn below). "
                  "Every error on this page, as in the terminal and --json, is the prediction's: (predicted − "
                  "measured) / measured, positive when the prediction is longer than the run, negative when the "
                  "run is slower than predicted; every Δ is predicted − measured.")


def _figures_note(comparison: Comparison, scale: TimeScale) -> str:
    predicted, measured = comparison.predicted.makespan, comparison.measured.makespan
    parts = [f"predicted {scale.format(predicted)} (every op at its median cost)"]
    if comparison.predicted_p50 is not None and comparison.predicted_p99 is not None:
        parts.append(f"predicted p50 {scale.format(comparison.predicted_p50)} and p99 "
                     f"{scale.format(comparison.predicted_p99)} (every op drawn from its profiled repeats)")
    parts.append(f"measured {scale.format(measured)} (the median step): error {prediction_error(predicted, measured):+.1%}"
                 " (predicted − measured) / measured")
    return f'<p class="figures">{escape("; ".join(parts))}.</p>'


def _parting_note(predicted: Timeline, found, parting: int, scale: TimeScale) -> str:
    share = f"{PARTING_SHARE:.0%} of the predicted iteration"
    if parting < 0:
        return f'<p class="parting-note">The timelines never part: every measured start is within {share}.</p>'
    off = float(found.start[parting])  # predicted - measured: negative when the op started late
    return (f'<p class="parting-note">The timelines first part at {escape(str(predicted.op(parting)))} on '
            f"d{int(predicted.op_device[parting])}: predicted start {scale.format(found.predicted_start[parting])}, "
            f"measured {scale.format(found.measured_start[parting])} ({scale.format(abs(off))} "
            f"{'later' if off < 0 else 'earlier'}, more than {share}); both boxes are outlined dashed.</p>")


def _lanes_text(measured: Timeline) -> str:
    """What a measured timeline's communication lanes hold (runtime/measure.py records them)."""
    table = measured.transfers
    reduces = int(np.count_nonzero(table.kind == ALLREDUCE))
    plain = len(table) - reduces
    if not len(table):
        return "no communication lanes: no message or all-reduce crossed between the run's ranks"
    parts = []
    if plain:
        parts.append(f"{plain} point-to-point transfer{'' if plain == 1 else 's'} (each from its send posted on the "
                     "sender to its receive taken on the receiver, so it also holds any time the data waited there)")
    if reduces:
        parts.append(f"{reduces} replica all-reduce{'' if reduces == 1 else 's'}")
    return "communication lanes: the run recorded " + " and ".join(parts)


def _lanes_note(measured: Timeline) -> str:
    """The check page's line on the measured timeline's lanes, drawn under its compute rows."""
    if len(measured.transfers):
        return f'<p class="hint lanes-note">The measured timeline\'s {escape(_lanes_text(measured))}.</p>'
    return f'<p class="hint lanes-note">The measured timeline has {escape(_lanes_text(measured))}.</p>'


def _kind_table(k: int, predicted: Timeline, found, scale: TimeScale) -> str:
    """Per op kind: how many ops, the mean and median of their durations' prediction error
    (predicted - measured) / measured, and the summed difference predicted - measured."""
    header = ("op kind", "ops", "mean error", "median error", f"summed Δ duration ({scale.unit})")
    styles = kind_styles(predicted.schedule.rules)
    rows = [[(styles.names[e.kind], f"{styles.letters[e.kind]} {styles.names[e.kind]}"), (e.count, f"{e.count:,}"),
             (repr(e.mean), f"{e.mean:+.1%}"), (repr(e.median), f"{e.median:+.1%}"),
             (repr(e.total), f"{e.total * scale.factor:+.4g}")] for e in kind_errors(predicted, found)]
    return sortable_table(f"kinds-{k}", header, rows)


def _deviation_table(k: int, timeline: Timeline, found, scale: TimeScale, shown: int) -> str:
    """The ``shown`` ops whose measured duration is farthest from the prediction, largest
    first; the Δ duration column sorts by size, either sign. Δ = predicted - measured."""
    unit = scale.unit
    header = ("op", "device", f"predicted start ({unit})", f"measured start ({unit})", f"Δ start ({unit})",
              f"predicted duration ({unit})", f"measured duration ({unit})", f"Δ duration ({unit})", "Δ duration %")
    rows, links = [], []
    factor = scale.factor

    def number(value: float) -> tuple[str, str]:
        return repr(float(value)), f"{value * factor:.4g}"

    for row in found.largest(shown).tolist():
        partner = int(found.partner[row])
        relative = found.relative[row]
        delta = found.duration[row]
        rows.append([
            (str(timeline.op(row)), str(timeline.op(row))),
            (int(timeline.op_device[row]), f"d{int(timeline.op_device[row])}"),
            number(found.predicted_start[row]), number(found.measured_start[row]), number(found.start[row]),
            number(found.predicted_duration[row]), number(found.measured_duration[row]),
            (repr(abs(float(delta))), f"{delta * factor:+.4g}"),
            ("" if math.isnan(relative) else repr(float(relative)), "-" if math.isnan(relative) else f"{relative:+.1%}"),
        ])
        links.append(f"{k}:{row}:{partner}")
    table = sortable_table(f"deviations-{k}", header, rows, row_data=links)
    return table.replace('<th scope="col" tabindex="0">Δ duration', '<th scope="col" tabindex="0" aria-sort="descending">Δ duration', 1)


def _deviation_legend() -> str:
    return ('<p class="legend deviation-legend"><span>ops keep their kind\'s colour; the outline tells the '
            'prediction error of their duration ((predicted − measured) / measured):</span>'
            '<span class="gradient" aria-hidden="true"></span><span>−50% (the run slower than predicted) … +50% '
            '(faster)</span><label><input type="checkbox" id="deviation-fill"> fill ops by deviation</label></p>')


def script_json(data: object) -> str:
    """Compact JSON that is safe inside a ``<script>`` element (no ``</script>``, no
    ``<!--``): ``<``, ``>`` and ``&`` become JSON escapes.

    >>> script_json({"name": "</script>"})
    '{"name":"\\\\u003c/script\\\\u003e"}'
    """
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


@dataclass(frozen=True)
class _Clock:
    """A timeline's times in its display unit: ``factor`` display units per time unit, kept
    to ``digits`` decimals (a millionth of the iteration), measured from ``origin``."""

    factor: float
    digits: int
    origin: float

    @classmethod
    def of(cls, timeline: Timeline, scale: TimeScale) -> _Clock:
        span = timeline.makespan * scale.factor
        return cls(scale.factor, max(0, 6 - math.floor(math.log10(span))) if span > 0 else 6, timeline.origin)

    def times(self, values) -> list[float]:
        """Instants, from the iteration start."""
        return np.round((np.asarray(values, np.float64) - self.origin) * self.factor, self.digits).tolist()

    def durations(self, values: np.ndarray) -> list:
        """Lengths of time (an array of any shape)."""
        return np.round(values * self.factor, self.digits).tolist()

    def duration(self, value: float) -> float:
        return round(value * self.factor, self.digits)


def timeline_data(timeline: Timeline, summary: Summary, *, scale: TimeScale | None = None) -> dict:
    """One timeline as columns: times in its display unit (``scale``, default the one that
    suits its length) from the iteration start, rounded to a millionth of the iteration."""
    scale = scale or time_scale(timeline.unit, timeline.makespan)
    clock = _Clock.of(timeline, scale)
    chunk, chunks = op_chunks(timeline)
    path = critical_path(timeline)
    fused = np.flatnonzero(timeline.box_kind != timeline.op_kind).tolist()
    return {
        "name": summary.name,
        "source": summary.source,
        "unit": timeline.unit,
        "timeUnit": scale.unit,
        "makespan": clock.duration(timeline.makespan),
        "headline": summary.headline(),
        "devices": timeline.num_devices,
        "chunks": chunks.tolist(),
        "idle": clock.durations(timeline.idle_per_device()),
        # iterations back to back: when each ended; the view opens on one steady iteration
        "iterationEnd": [clock.duration(e) for e in timeline.iteration_end],
        "home": [clock.duration(x) for x in home_window(timeline)],
        "critical": {"ops": path.row[~path.is_transfer].tolist(), "transfers": path.row[path.is_transfer].tolist()},
        "gaps": _gaps_data(timeline, clock),
        # a fused op's text (its parts', ``(0F3;7B1)OVERLAP_F_B``) by the row of its first part
        "fused": {str(row): str(timeline.entry(row)) for row in fused},
        "ops": _ops_data(timeline, chunk, clock),
        "transfers": _transfers_data(timeline.transfers, clock),
        "channels": _channel_names(timeline.transfers),
        **_memory_data(timeline, clock),
        **_serving_data(timeline),
    }


def _serving_data(timeline: Timeline) -> dict:
    """A serving timeline's row labels and, per microbatch (a batch of the run), what it
    batched, for the hovers (nothing for any other timeline)."""
    info = timeline.serving
    if info is None:
        return {}
    counts = np.diff(info.offsets)
    return {"serving": {
        "deviceLabels": list(info.device_labels),
        "deviceNames": list(info.device_names),
        "batch": info.batch.tolist(),
        "instance": info.instance.tolist(),
        "prefillTokens": info.prefill_tokens.tolist(),
        "decodes": info.decodes.tolist(),
        "kvTokens": info.kv_tokens.tolist(),
        "requests": counts.tolist(),
        # the first request rows of each batch (the hover lists them)
        "requestRows": [info.members[a:min(a + LISTED_REQUESTS, b)].tolist()
                        for a, b in zip(info.offsets[:-1].tolist(), info.offsets[1:].tolist(), strict=True)],
        "transferRequest": info.transfer_request.tolist(),
        "how": info.how,
    }}


def _gaps_data(timeline: Timeline, clock: _Clock) -> dict:
    """Idle gaps of the compute streams and the time of each BUBBLE_PARTS part in them."""
    gaps = bubble_breakdown(timeline)
    return {
        "device": gaps.device.tolist(),
        "start": clock.times(gaps.start),
        "end": clock.times(gaps.end),
        "row": gaps.row.tolist(),
        "parts": clock.durations(gaps.parts),
    }


def _ops_data(timeline: Timeline, chunk: np.ndarray, clock: _Clock) -> dict:
    """The ops' columns: where they run, what they are, when, and what each waited for."""
    waits = waited_for(timeline)
    return {
        "device": timeline.op_device.tolist(),
        "stage": timeline.op_stage.tolist(),
        "kind": timeline.box_kind.tolist(),
        "microbatch": timeline.op_microbatch.tolist(),
        "chunk": chunk.tolist(),
        "start": clock.times(timeline.op_start),
        "end": clock.times(timeline.op_end),
        "cause": waits.cause.tolist(),  # WAIT_* code, see waits.py
        "ref": waits.ref.tolist(),  # op row or transfer row of the cause
    }


def _transfers_data(table, clock: _Clock) -> dict:
    """The transfers' columns: between which devices, of what, how large, on which channel, when."""
    return {
        "src": table.src_device.tolist(),
        "dst": table.dst_device.tolist(),
        "kind": table.kind.tolist(),
        "stage": table.stage.tolist(),
        "microbatch": table.microbatch.tolist(),
        "bytes": table.nbytes.tolist(),
        "channel": table.channel.tolist(),
        "start": clock.times(table.start),
        "end": clock.times(table.end),
    }


def _channel_names(table) -> list[str]:
    """The name of every channel up to the highest one a transfer uses."""
    return [table.channel_names[c] if c < len(table.channel_names) else f"channel {c}"
            for c in range(int(table.channel.max(initial=-1)) + 1)]


def _memory_data(timeline: Timeline, clock: _Clock) -> dict:
    """The device memory curves, the devices whose host link offloads and reloads
    activations (and which ops run there), and the host memory of what they offloaded."""
    data = {"memory": None, "hostLanes": [], "onHost": None, "hostMemory": None}
    on_host = ~timeline.on_compute
    if on_host.any():
        data["hostLanes"] = sorted({int(d) for d in timeline.op_device[on_host].tolist()})
        data["onHost"] = on_host.tolist()
    memory, host = timeline.memory, timeline.host_memory
    if memory is None:
        return data
    largest = max(max(memory.peak, default=0.0), max(host.peak, default=0.0) if host is not None else 0.0)
    divisor, unit = memory_scale(memory.unit, largest)
    data["memory"] = {"unit": unit, **_memory_curves(memory, divisor, clock), "oom": list(memory.out_of_memory)}
    if host is not None:
        # host memory of offloaded activations, in the device curves' unit
        data["hostMemory"] = _memory_curves(host, divisor, clock)
    return data


def _memory_curves(memory, divisor: float, clock: _Clock) -> dict:
    """Memory curves (times, values, peaks and capacities per device) in units of ``divisor``."""
    return {
        "times": [clock.times(t) for t in memory.times],
        "values": [np.round(np.asarray(v, np.float64) / divisor, 4).tolist() for v in memory.values],
        "peak": [round(p / divisor, 4) for p in memory.peak],
        "capacity": None if memory.capacity is None else [round(c / divisor, 4) for c in memory.capacity],
    }


def metrics_table_html(summaries: Sequence[Summary]) -> str:
    """The key metrics, one row per timeline; sortable in the page (``data-value``)."""
    header = ("schedule", "level", "devices", "stages", "microbatches", "ops", "iteration time",
              "bubble", "bubble / work", "bubble from", "critical path: compute + comm",
              "comm exposed / hidden (sum of devices)", "peak memory")
    if summaries and all(s.serving is not None for s in summaries):
        # a serving window: its devices are stage groups, its microbatches iterations, its span no iteration
        header = ("run", "level", "stage groups", "stages", "iterations", "ops", "window", "idle", "idle / work",
                  "idle from", "critical path: compute + comm", "comm exposed / hidden (sum of stage groups)",
                  "KV cache peak")
    rows = []
    for s in summaries:
        scale = time_scale(s.unit, s.iteration_time)
        memory = ("", "-") if s.peak_memory is None or s.memory_unit is None else (
            repr(s.peak_memory), format_memory(s.peak_memory, s.memory_unit) + (" (OOM)" if s.out_of_memory else ""))
        cells = [
            (s.name, s.name), (s.source, s.source), (s.devices, s.devices), (s.stages, s.stages),
            (s.microbatches, f"{s.microbatches:g}"), (s.ops, s.ops),
            (repr(s.iteration_time), scale.format(s.iteration_time)), (repr(s.bubble_ratio), f"{s.bubble_ratio:.1%}"),
            (repr(s.bubble_over_work), f"{s.bubble_over_work:.1%}"),
            (repr(max(s.bubble_parts, default=0.0)), bubble_parts_text(s)),
            (repr(s.critical_comm), f"{scale.format(s.critical_compute)} + {_format_time(s.unit, s.critical_comm)}"),
            (repr(s.exposed_comm), f"{_format_time(s.unit, s.exposed_comm)} / {_format_time(s.unit, s.hidden_comm)}"),
            memory,
        ]
        rows.append(cells)
    return sortable_table("metrics", header, rows, row_data=[f"timeline-{k}" for k in range(len(summaries))])


def _format_time(unit: str, time: float) -> str:
    """A time in the unit that suits its own size (``2.61 ms`` beside a ``3.9 s`` iteration)."""
    return time_scale(unit, time).format(time, digits=3)


def comparison_table_html(rows: Sequence[Mapping[str, object]], *, row_data: Sequence[str] | None = None) -> str:
    """Any flat rows (column -> value), columns in first-seen order; sortable; ``row_data``
    links each row (``sortable_table``)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    body = []
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            sort_key = repr(float(value)) if isinstance(value, int | float) and not isinstance(value, bool) else format_cell(value)
            cells.append((sort_key, format_cell(value)))
        body.append(cells)
    return sortable_table("comparison", columns, body, row_data=row_data)


def sortable_table(name: str, header: Sequence[str], rows: Sequence[Sequence[tuple[object, object]]], *,
                   row_data: Sequence[str] | None = None, row_attribute: str = "data-link") -> str:
    """A table whose header cells sort it (report.js); each cell is (sort key, shown text);
    ``row_data`` gives each row a ``row_attribute`` attribute."""
    head = "".join(f'<th scope="col" tabindex="0">{escape(str(h))}</th>' for h in header)
    links = row_data if row_data is not None else [None] * len(rows)
    body = "".join(
        ("<tr>" if link is None else f'<tr {row_attribute}="{escape(link, quote=True)}">')
        + "".join(f'<td data-value="{escape(str(key), quote=True)}">{escape(str(text))}</td>'
                  for key, text in row) + "</tr>"
        for row, link in zip(rows, links, strict=True)
    )
    return (f'<div class="table-wrap"><table class="sortable" id="{name}-table">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def kind_legend(timelines: Sequence[Timeline]) -> str:
    """Swatches of every op kind drawn in ``timelines`` (a fused pair's kind too), each
    kind's chunk shades where a device holds several chunks, and the transfer kinds."""
    kinds = sorted({int(k) for t in timelines for k in np.unique(t.box_kind[t.drawn()])})
    chunks = max((int(op_chunks(t)[1].max(initial=1)) for t in timelines), default=1)
    transfer_kinds = sorted({int(k) for t in timelines for k in np.unique(t.transfers.kind)})
    styles = kind_styles(timelines[0].schedule.rules)
    items = []
    for k in kinds:
        shades = "".join(f'<span class="swatch" style="background:{lighten(styles.colors[k], chunk_shade(c, chunks))}"'
                         f' title="chunk {c}"></span>' for c in range(chunks))
        items.append(f'<span data-kind="{escape(styles.names[k], quote=True)}">{shades}'
                     f"{escape(styles.letters[k])} {escape(styles.names[k])}</span>")
    items += [f'<span><span class="swatch" style="background:{TRANSFER_COLORS[k]}"></span>'
              f"{escape(TRANSFER_NAMES[k])} transfer</span>" for k in transfer_kinds]
    items.append(f'<span><span class="swatch" style="background:{IDLE_COLOR}"></span>idle</span>')
    if chunks > 1:
        items.append(f'<span class="hint">shades: a device\'s chunks 0 to {chunks - 1}, later chunks lighter</span>')
    return '<p class="legend">' + "".join(items) + "</p>"


def _definitions() -> str:
    return ('<p class="note">Bubble: idle compute time over (devices × iteration time); '
            "bubble / work: idle over busy time. Peak memory: the worst device. "
            "Click a column header to sort.</p>")


def _asset(name: str) -> str:
    return (resources.files("pipesched.render") / "assets" / name).read_text(encoding="utf-8")
