"""The residency curve drawn: output tokens per second against the share of each stage's
layers kept on the GPU, a line per model, and beside it each model's throughput over its
own at full residency (the models that fit there) (how much faster than the share the throughput falls). PNG or SVG
(matplotlib, imported when drawing), or an HTML page of the plot and the rows' table."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from html import escape

from pipesched.errors import require
from pipesched.experiments.residency import ResidencyRow
from pipesched.render.style import device_color

FORMATS = ("png", "svg")
WIDTH, HEIGHT = 10.0, 3.6  # inches


def residency_figure(rows: Sequence[ResidencyRow], *, fmt: str = "png", title: str = "") -> bytes:
    """The curve of ``rows`` (``residency_curve``) as PNG or SVG bytes."""
    require(fmt in FORMATS, "format", fmt, f"choose one of {', '.join(FORMATS)}")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH, HEIGHT), layout="constrained")
    absolute, relative = figure.subplots(1, 2)
    for index, model in enumerate(dict.fromkeys(row.model for row in rows)):
        mine = sorted((row for row in rows if row.model == model and row.fits), key=lambda row: row.resident)
        if not mine:
            continue
        shares = [row.resident for row in mine]
        throughput = [row.throughput_tokens_per_s for row in mine]
        color = device_color(index)
        absolute.plot(shares, throughput, marker="o", color=color, label=model)
        if mine[-1].resident == 1.0 and throughput[-1] > 0:  # relative to full residency, where the model fits
            relative.plot(shares, [value / throughput[-1] for value in throughput], marker="o", color=color,
                          label=model)
    relative.plot([0, 1], [0, 1], linestyle=":", color="#888888", label="throughput = residency")
    absolute.set(xlabel="share of layers resident on the GPU", ylabel="output tokens/s", xlim=(0, 1.02), ylim=(0, None))
    relative.set(xlabel="share of layers resident on the GPU", ylabel="throughput over full residency",
                 xlim=(0, 1.02), ylim=(0, 1.05))
    absolute.legend(fontsize="small")
    relative.legend(fontsize="small")
    if title:
        figure.suptitle(title, fontsize="medium")
    buffer = io.BytesIO()
    metadata = {"Software": "pipesched"} if fmt == "png" else {"Creator": "pipesched", "Date": None}
    figure.savefig(buffer, format=fmt, dpi=150, metadata=metadata)
    return buffer.getvalue()


COLUMNS = (("model", "model"), ("resident", "resident"), ("throughput_tokens_per_s", "tokens/s"),
           ("ttft_p50_s", "TTFT p50 (s)"), ("tpot_p50_s", "TPOT p50 (s)"), ("kv_capacity_blocks", "KV blocks"),
           ("device_weight_bytes", "weights on GPU (GB)"))


def residency_cells(row: ResidencyRow) -> list[str]:
    """One row's cells, in COLUMNS order, as the terminal and the page print them."""
    if not row.fits:
        return [row.model, f"{row.resident:g}", "does not fit", "-", "-", "-", "-"]
    return [row.model, f"{row.resident:g}", f"{row.throughput_tokens_per_s:,.1f}", f"{row.ttft_p50_s:.4f}",
            f"{row.tpot_p50_s:.4f}", f"{row.kv_capacity_blocks:,}", f"{row.device_weight_bytes / 1e9:.2f}"]


def residency_report(rows: Sequence[ResidencyRow], *, title: str = "") -> str:
    """An HTML page: the curve (inline SVG) and the rows."""
    image = base64.b64encode(residency_figure(rows, fmt="svg", title=title)).decode("ascii")
    head = "".join(f"<th>{escape(label)}</th>" for _, label in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in residency_cells(row)) + "</tr>"
                   for row in rows)
    heading = escape(title or "throughput against residency")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{heading}</title></head><body>"
            f"<h1>{heading}</h1><img id=\"residency-curve\" src=\"data:image/svg+xml;base64,{image}\" width=\"100%\">"
            f"<table id=\"residency-rows\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>")
