"""Write any set of views of some timelines at once (the ``--png/--svg/--perfetto/--html``
options of ``show``, ``simulate``, ``compare`` and ``run``), and the views of predicted
and measured pairs (``check --html/--perfetto``).

Every output path is checked before anything is drawn, and the files are written all or
none (``pipesched.io.files.write_all``), so a bad path costs nothing and a failure leaves no
partial file and replaces none. ``render_views`` draws without writing, for a command that
writes other files with them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipesched.errors import require
from pipesched.io.files import Output, check_outputs, write_all
from pipesched.pairing import Comparison, comparison_pairs
from pipesched.render.gantt import render_gantt
from pipesched.render.html import render_comparison_html, render_html
from pipesched.render.trace import render_comparison_trace, render_trace
from pipesched.runtime.check import CheckReport
from pipesched.timeline import Timeline

PathLike = str | os.PathLike[str]


def write_views(timelines: Sequence[Timeline], **views: object) -> list[Path]:
    """Render the requested views of ``timelines`` (``render_views``' keyword options) and
    write them all or none; returns the paths written, in the order png, svg, trace, html."""
    return write_all(render_views(timelines, **views))  # type: ignore[arg-type]


def render_views(
    timelines: Sequence[Timeline],
    *,
    png: PathLike | None = None,
    svg: PathLike | None = None,
    trace: PathLike | None = None,
    html: PathLike | None = None,
    comparison: Sequence[Mapping[str, object]] | None = None,
    title: str = "",
    distributions: Sequence[Mapping[str, object]] | None = None,
    share_axis: bool = False,
) -> list[Output]:
    """The requested views of ``timelines``, drawn, as the files to write, in the order
    png, svg, trace, html.

    comparison: rows of the three-level comparison table (column -> value) for the HTML
    report; title: the figure and page title; distributions: per schedule its Monte Carlo
    iteration times for the report's distribution plots (``render_html``); share_axis: every
    panel on one time axis (the Gantt chart's panels; the report opens with its "one time
    axis" box ticked) instead of each on its own.
    """
    require(len(timelines) >= 1, "timelines", 0, "give at least one timeline to draw")
    requested = [(field, path) for field, path in (("png", png), ("svg", svg), ("trace", trace), ("html", html))
                 if path is not None]
    check_outputs(requested)
    return [Output(path, _render(field, timelines, comparison, title, distributions, share_axis=share_axis), field)
            for field, path in requested]


def write_check_views(report: CheckReport, *, html: PathLike | None = None, trace: PathLike | None = None,
                      title: str = "") -> list[Path]:
    """A prediction check's comparison page and two-processes-per-device trace, titled with
    its ranking verdict; the paths written."""
    return write_comparison_views(report.comparisons(), html=html, trace=trace, summary=report.summary_rows(),
                                  title=f"{title}; {report.ranking_verdict}" if title else report.ranking_verdict)


def write_comparison_views(
    comparisons: Sequence[Comparison],
    *,
    trace: PathLike | None = None,
    html: PathLike | None = None,
    summary: Sequence[Mapping[str, object]] | None = None,
    title: str = "",
) -> list[Path]:
    """The trace (two processes per device) and the comparison page of predicted and
    measured timelines; returns the paths written, trace first."""
    require(len(comparisons) >= 1, "comparisons", 0, "give at least one predicted and measured pair")
    requested = [(field, path) for field, path in (("trace", trace), ("html", html)) if path is not None]
    check_outputs(requested)
    outputs = []
    for field, path in requested:
        if field == "trace":
            text = render_comparison_trace(comparison_pairs(comparisons))
        else:
            text = render_comparison_html(comparisons, summary=summary, title=title)
        outputs.append(Output(path, text, field))
    return write_all(outputs)


def _render(field: str, timelines: Sequence[Timeline], comparison, title: str, distributions=None, *,
            share_axis: bool = False) -> str | bytes:
    if field in ("png", "svg"):
        return render_gantt(timelines, fmt=field, title=title, share_axis=share_axis)
    if field == "trace":
        return render_trace(timelines)

    return render_html(timelines, comparison=comparison, title=title, distributions=distributions,
                       share_axis=share_axis)
