"""Request-level views of a serving run: what its users saw, beside the timeline of its
stages.

- time to first token: its distribution over requests (an empirical CDF), with the p50, p90
  and p99 the results report and the TTFT SLO, the share of requests within it noted;
- time between tokens: the distribution of every gap between two output tokens of one
  request (the decode iterations a user waits through), with its percentiles and the TPOT SLO;
- latency against request rate: a capacity search's probes (``serving.capacity.Probe``
  records or their ``to_dict()``: see ``probe_rows``), TTFT and TBT p50 and p99 on a log
  scale and the SLO attainment on a second axis;
- KV-cache use over time: each instance's blocks in use over its capacity, a mark at each
  preemption (the run's recorded preemption times, and its swaps to host memory).

``serving_figure`` draws them as one PNG or SVG (matplotlib, imported when drawing);
``serving_report`` is the HTML page ``serve simulate --html`` writes: the results table,
these plots as inline SVG images, then the timeline report of a window of the run
(``pipesched.serving.timeline``) with its hovers.

The per-request figures are the results' (``serving.results.serve_result``), and the
percentiles and SLOs drawn are the result mapping's when one is given (``ServeResult.to_dict``,
the ``--json`` object: ``ttft_s`` and ``tbt_s`` with ``p50``, ``p90``, ``p99``, and
``slo_ttft_s``, ``slo_tpot_s``); without one, the sample's (numpy's linear percentiles).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from pipesched.errors import require
from pipesched.render.html import render_html
from pipesched.render.style import OOM_COLOR, device_color, time_scale
from pipesched.serving.records import ServeRun
from pipesched.serving.results import ServeResult, serve_result
from pipesched.serving.timeline import DEFAULT_VIEW_ITERATIONS, serving_timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOTS = ("ttft", "tbt", "rate", "kv")
PLOT_TITLES = {"ttft": "Time to first token", "tbt": "Time between tokens",
               "rate": "Latency against request rate", "kv": "KV cache over time"}
# what a probe of a capacity search carries (``serving.capacity.Probe``): its rate (requests/s),
# the share of requests within both SLOs, and latency summaries (seconds, with p50 and p99)
PROBE_FIELDS = ("qps", "attainment", "ttft_s", "tbt_s", "tpot_s")
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0))
PERCENTILE_COLORS = {"p50": "#3274b5", "p90": "#f28e2b", "p99": "#6a3d9a"}
SLO_COLOR = OOM_COLOR
FORMATS = ("png", "svg")
# inches of one plot
PLOT_WIDTH, PLOT_HEIGHT = 7.5, 3.0


def request_latencies(run: ServeRun) -> ServeResult:
    """The run's per-request figures, as the results define them (``serve_result``: TTFT,
    every gap between two tokens of a request), under no SLO."""
    return serve_result(run, slo_ttft=math.inf, slo_tpot=math.inf)


def probe_rows(probes: Sequence[object]) -> dict[str, np.ndarray]:
    """The probes' rate, attainment and latency percentiles as columns sorted by rate (NaN
    where a probe lacks one): ``qps``, ``attainment``, and ``ttft_p50_s``, ``ttft_p99_s``,
    ``tbt_p50_s``, ``tbt_p99_s``, ``tpot_p50_s``, ``tpot_p99_s``. Each probe is a capacity
    search's ``Probe`` or its ``to_dict()`` (``PROBE_FIELDS``: the latencies a mapping or a
    record with ``p50`` and ``p99``)."""
    def get(thing: object, name: str) -> object:
        return thing.get(name) if isinstance(thing, Mapping) else getattr(thing, name, None)

    def number(found: object) -> float:
        ok = isinstance(found, int | float) and not isinstance(found, bool)
        return float(found) if ok else float("nan")

    columns = {name: np.array([number(get(p, name)) for p in probes], np.float64) for name in ("qps", "attainment")}
    for latency in PROBE_FIELDS[2:]:
        for label in ("p50", "p99"):
            values = [number(get(get(p, latency), label)) if get(p, latency) is not None else float("nan")
                      for p in probes]
            columns[f"{latency[:-2]}_{label}_s"] = np.array(values, np.float64)
    require(bool(np.isfinite(columns["qps"]).all()), "probes.qps", "missing", "give each probe its request rate")
    order = np.argsort(columns["qps"], kind="stable")
    return {name: column[order] for name, column in columns.items()}


def request_figure(run: ServeRun, result: Mapping[str, object] | None = None, *,
                   probes: Sequence[object] | None = None, slo_ttft: float | None = None,
                   slo_tpot: float | None = None, plots: Sequence[str] = PLOTS,
                   latencies: ServeResult | None = None) -> Figure:
    """The matplotlib figure of ``plots`` (of PLOTS, module docstring), one axes each, top
    to bottom; the rate plot only with ``probes``; ``latencies``: the run's
    ``request_latencies`` when the caller has them already."""
    unknown = [name for name in plots if name not in PLOTS]
    require(not unknown, "plot", unknown[0] if unknown else "", f"choose among {', '.join(PLOTS)}")
    from matplotlib.figure import Figure

    shown = [name for name in plots if name != "rate" or probes]
    require(bool(shown), "plots", ",".join(plots), "give probes for the rate plot, or another plot")
    figure = Figure(figsize=(PLOT_WIDTH, PLOT_HEIGHT * len(shown)), layout="constrained")
    axes = figure.subplots(len(shown), 1, squeeze=False)[:, 0]
    if latencies is None and {"ttft", "tbt"} & set(shown):
        latencies = request_latencies(run)  # once for both plots
    for ax, name in zip(axes, shown, strict=True):
        ax.set_gid(f"plot-{name}")
        _draw(ax, name, run, latencies, result, probes, slo_ttft, slo_tpot)
    return figure


def serving_figure(run: ServeRun, result: Mapping[str, object] | None = None, *,
                   probes: Sequence[object] | None = None, slo_ttft: float | None = None,
                   slo_tpot: float | None = None, fmt: str = "png", plots: Sequence[str] = PLOTS,
                   latencies: ServeResult | None = None) -> bytes:
    """The request-level plots of ``run`` stacked in one PNG or SVG (``request_figure``)."""
    require(fmt in FORMATS, "format", fmt, f"choose one of {', '.join(FORMATS)}")
    return _save(request_figure(run, result, probes=probes, slo_ttft=slo_ttft, slo_tpot=slo_tpot, plots=plots,
                                latencies=latencies), fmt)


def _save(figure: Figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    metadata = {"Software": "pipesched"} if fmt == "png" else {"Creator": "pipesched", "Date": None}
    figure.savefig(buffer, format=fmt, dpi=150, metadata=metadata)
    return buffer.getvalue()


def _draw(ax: Axes, name: str, run: ServeRun, latencies: ServeResult | None, result, probes, slo_ttft,
          slo_tpot) -> None:
    slo_ttft = _slo(slo_ttft, result, "slo_ttft_s")
    slo_tpot = _slo(slo_tpot, result, "slo_tpot_s")
    if name == "ttft":
        _distribution(ax, latencies.ttft_s, _stats(result, "ttft_s"), (slo_ttft, "TTFT SLO"),
                      "time to first token", "requests")
    elif name == "tbt":
        _distribution(ax, latencies.tbt_s, _stats(result, "tbt_s"), (slo_tpot, "TPOT SLO"),
                      "time between tokens", "token gaps")
    elif name == "rate":
        _rate(ax, probe_rows(probes or ()), slo_ttft, slo_tpot)
    else:
        _kv(ax, run)


def _slo(given: float | None, result: Mapping[str, object] | None, key: str) -> float | None:
    """The SLO drawn: the one given, else the result's (None: none)."""
    if given is not None:
        return given
    found = result.get(key) if result is not None else None
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None


def _stats(result: Mapping[str, object] | None, key: str) -> dict[str, float] | None:
    """The result's percentiles of ``key`` (seconds), when it has them."""
    found = result.get(key) if result is not None else None
    if not isinstance(found, Mapping):
        return None
    return {label: float(found[label]) for label, _ in PERCENTILES if isinstance(found.get(label), int | float)}


def _distribution(ax: Axes, values: np.ndarray, stats, target: tuple[float | None, str], what: str,
                  counted: str) -> None:
    """An empirical CDF of ``values`` (seconds) with its percentiles and the SLO ``target``
    (seconds or None, and its name)."""
    slo, slo_name = target
    ax.set_title(f"{what}: {values.size:,} {counted}", loc="left", fontsize=10)
    if values.size == 0:
        ax.text(0.5, 0.5, f"no {counted}", ha="center", va="center", transform=ax.transAxes)
        return
    top = max(float(values.max()), slo or 0.0)
    scale = time_scale("s", top)
    ordered = np.sort(values) * scale.factor
    share = np.arange(1, ordered.size + 1) / ordered.size
    ax.step(np.concatenate(([0.0], ordered)), np.concatenate(([0.0], share)), where="post", color="#333333",
            linewidth=1.2)
    for label, q in PERCENTILES:
        at = stats[label] if stats and label in stats else float(np.percentile(values, q))
        ax.axvline(at * scale.factor, color=PERCENTILE_COLORS[label], linewidth=1, linestyle=":",
                   label=f"{label} {scale.format(at)}")
    if slo is not None:
        within = float(np.mean(values <= slo))
        ax.axvline(slo * scale.factor, color=SLO_COLOR, linewidth=1.4, linestyle="--",
                   label=f"{slo_name} {scale.format(slo)}: {within:.1%} of {counted} within")
    ax.set_xlabel(f"{what} ({scale.unit})", fontsize=9)
    ax.set_ylabel(f"share of {counted}", fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, top * scale.factor * 1.03)
    ax.legend(fontsize=8, loc="lower right")


def _rate(ax: Axes, rows: dict[str, np.ndarray], slo_ttft: float | None, slo_tpot: float | None) -> None:
    """Latency percentiles (log scale) and SLO attainment against the request rate."""
    qps = rows["qps"]
    ax.set_title(f"latency against request rate: {qps.size} rates", loc="left", fontsize=10)
    styles = (("ttft_p50_s", "TTFT p50", "#3274b5", "-"), ("ttft_p99_s", "TTFT p99", "#3274b5", "--"),
              ("tbt_p50_s", "TBT p50", "#4e9f50", "-"), ("tbt_p99_s", "TBT p99", "#4e9f50", "--"))
    for key, label, color, line in styles:
        if np.isfinite(rows[key]).any():
            ax.plot(qps, rows[key], marker="o", markersize=3, color=color, linestyle=line, label=label)
    for slo, label, line in ((slo_ttft, "TTFT SLO", "--"), (slo_tpot, "TPOT SLO", ":")):
        if slo is not None:
            ax.axhline(slo, color=SLO_COLOR, linewidth=1, linestyle=line, label=f"{label} {time_scale('s', slo).format(slo)}")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (requests/s)", fontsize=9)
    ax.set_ylabel("latency (s)", fontsize=9)
    if np.isfinite(rows["attainment"]).any():
        share = ax.twinx()
        share.plot(qps, rows["attainment"], color="#777777", marker="s", markersize=3, label="SLO attainment")
        share.set_ylim(0, 1.05)
        share.set_ylabel("share of requests within the SLOs", fontsize=9)
        share.legend(fontsize=8, loc="lower left")
    ax.legend(fontsize=8, loc="upper left")


def _kv(ax: Axes, run: ServeRun) -> None:
    """Each instance's share of its KV blocks in use over time, its preemptions marked."""
    kv = run.kv
    ax.set_title(f"KV cache in use: {len(kv.times)} instance{'s' if len(kv.times) != 1 else ''}, "
                 f"{int(run.preemptions.sum()):,} preemptions", loc="left", fontsize=10)
    end = max(float(run.finished_at.max()) if len(run.trace) else 0.0,
              max((float(t[-1]) for t in kv.times if len(t)), default=0.0))
    scale = time_scale("s", end)
    swaps = np.asarray(run.moves.kind, dtype=object) == "swap-out" if len(run.moves) else np.zeros(0, np.bool_)
    for instance, (times, blocks, capacity) in enumerate(zip(kv.times, kv.blocks, kv.capacity_blocks, strict=True)):
        if not len(times):
            continue
        share = np.asarray(blocks, np.float64) / max(capacity, 1)
        xs = np.append(np.asarray(times, np.float64), end) * scale.factor
        color = device_color(instance)
        label = f"{run.instance_kind[instance]} {instance} ({capacity:,} blocks)"
        ax.step(xs, np.append(share, share[-1]), where="post", color=color, linewidth=1, label=label)
        marks = _preemption_times(run, instance, swaps)
        if marks.size:
            at = np.searchsorted(np.asarray(times, np.float64), marks, side="right") - 1
            ax.plot(marks * scale.factor, share[np.maximum(at, 0)], linestyle="none", marker="v", color=SLO_COLOR,
                    markersize=5, label="preemption" if instance == 0 else None)
    ax.axhline(1.0, color="#333333", linewidth=0.8, linestyle="--")
    ax.set_ylim(0, 1.08)
    ax.set_xlim(0, end * scale.factor if end > 0 else 1.0)
    ax.set_xlabel(f"time ({scale.unit})", fontsize=9)
    ax.set_ylabel("blocks in use / capacity", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")


def _preemption_times(run: ServeRun, instance: int, swaps: np.ndarray) -> np.ndarray:
    """When ``instance`` preempted a request: the run's record, else its swaps to host memory."""
    recorded = run.kv.preempted_at
    if recorded and instance < len(recorded):
        return np.asarray(recorded[instance], np.float64)
    if not swaps.any():
        return np.zeros(0)
    moved = np.flatnonzero(swaps)
    return run.moves.start[moved[run.instance[run.moves.request[moved]] == instance]]


def serving_report(run: ServeRun, result: Mapping[str, object] | None = None, *,
                   probes: Sequence[object] | None = None, title: str = "", slo_ttft: float | None = None,
                   slo_tpot: float | None = None, window: tuple[float, float] | None = None,
                   iterations: int = DEFAULT_VIEW_ITERATIONS, latencies: ServeResult | None = None) -> str:
    """The HTML page of a serving run (module docstring): ``result`` its results mapping
    (``ServeResult.to_dict()``: the ``--json`` object), ``probes`` a capacity search's rates,
    ``window`` / ``iterations`` the part of the run the timeline draws
    (``serving_timeline``), ``latencies`` the run's ``ServeResult`` when the caller has one
    (its per-request arrays do not depend on the SLOs)."""
    timeline = serving_timeline(run, window=window, iterations=iterations)
    sections = []
    if result:
        sections.append(("serving-results", "Results", _results_html(result)))
    plots = [name for name in PLOTS if name != "rate" or probes]
    latencies = latencies if latencies is not None else request_latencies(run)  # once for every plot
    figures = "".join(_figure_html(run, name, result, probes, slo_ttft, slo_tpot, latencies) for name in plots)
    sections.append(("serving-requests", "Requests", '<div class="serving-plots">' + figures + "</div>"))
    assert timeline.serving is not None
    first, last = timeline.serving.run_span
    note = (f'<p class="note">The timeline below draws {escape(timeline.serving.how)}; the run spans '
            f"{first:.6g} to {last:.6g} s.</p>")
    sections.append(("serving-window", "Window", note))
    heading = title or f"serving report: {len(run.trace):,} requests"
    return render_html([timeline], title=heading, extra_sections=sections)


def _figure_html(run: ServeRun, name: str, result, probes, slo_ttft, slo_tpot, latencies: ServeResult) -> str:
    """One plot as an inline SVG image (its own document, so no two plots' ids collide)."""
    image = serving_figure(run, result, probes=probes, slo_ttft=slo_ttft, slo_tpot=slo_tpot, fmt="svg", plots=(name,),
                           latencies=latencies)
    source = "data:image/svg+xml;base64," + base64.b64encode(image).decode("ascii")
    return (f'<figure class="serving-plot" data-plot="{name}"><img src="{source}" alt="{escape(PLOT_TITLES[name])}" '
            f'width="100%"><figcaption>{escape(PLOT_TITLES[name])}</figcaption></figure>')


def _results_html(result: Mapping[str, object]) -> str:
    """The latency figures as a table (mean and percentiles per latency), then every other
    scalar of the results."""
    latency = [(key, value) for key, value in result.items()
               if isinstance(value, Mapping) and {"mean", "p50"} <= set(value)]
    head = "".join(f"<th>{escape(h)}</th>" for h in ("latency", "mean", "p50", "p90", "p99"))
    body = ""
    for key, value in latency:
        cells = "".join(f"<td>{_seconds(value.get(label))}</td>" for label in ("mean", "p50", "p90", "p99"))
        body += f"<tr><th>{escape(key)}</th>{cells}</tr>"
    scalars = "".join(f"<tr><th>{escape(key)}</th><td>{escape(_scalar(value))}</td></tr>"
                      for key, value in result.items()
                      if isinstance(value, int | float | str) and not isinstance(value, bool))
    return (f'<div class="table-wrap"><table id="serving-latency"><thead><tr>{head}</tr></thead><tbody>{body}'
            f'</tbody></table></div><div class="table-wrap"><table id="serving-figures"><tbody>{scalars}'
            "</tbody></table></div>")


def _seconds(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return escape(time_scale("s", abs(float(value))).format(float(value)))


def _scalar(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
