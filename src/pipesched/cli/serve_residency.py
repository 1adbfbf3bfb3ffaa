"""`pipesched serve residency`: throughput against the share of each stage's layers kept on
the GPU (the rest streamed over the host link every iteration), a curve per model, printed
and drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipesched.cli.groups import (
    BatchOptions,
    CacheOptions,
    DeploymentOptions,
    RequestOptions,
    SloOptions,
    serving_point,
)
from pipesched.cli.options import AsJson, command, split_names
from pipesched.cli.output import console, print_json, print_whole, wrote
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.io.files import Output, check_outputs, write_all

# the curve's experiment and its pictures load when the command runs (not with `serve`)
if TYPE_CHECKING:
    from pipesched.experiments.residency import ResidencyRow

Fractions = Annotated[str | None, typer.Option(
    "--fractions", help=f"residencies to simulate, shares in (0, 1] [default: {DEFAULTS.residency_fractions}]")]
Png = Annotated[str | None, typer.Option("--png", help="write the residency curves (PNG) to this file")]
Svg = Annotated[str | None, typer.Option("--svg", help="write the residency curves (SVG) to this file")]
Html = Annotated[str | None, typer.Option("--html", help="write a page of the curves and the table to this file")]
Models = Annotated[str | None, typer.Option(
    "--models", help="models to draw a curve each for, like llama3-8b,llama3-70b [default: --model]")]


@command
def residency_command(*, deployment: DeploymentOptions, batch: BatchOptions, cache: CacheOptions,
                      requests: RequestOptions, slo: SloOptions, fractions: Fractions = None, models: Models = None,
                      html: Html = None, png: Png = None, svg: Svg = None, as_json: AsJson = False) -> None:
    """Throughput against residency: the same requests served with each share of every
    stage's layers kept on the GPU (--fractions), the rest streamed in from host memory (or
    disk, --resident-from) every iteration, for each model (--models); the freed memory
    goes to the KV cache. --png / --svg the curves, --html a page with them and the table.

    \b
    Examples:
      pipesched serve residency --model llama3-8b -t 1 -p 1 --requests 50
      pipesched serve residency --models llama3-8b,llama3-70b -t 1 -p 1 --requests 20 --png residency.png
    """
    from pipesched.experiments.residency import parse_fractions, residency_curve
    from pipesched.render.residency import residency_figure, residency_report

    require(deployment.resident is None, "resident", deployment.resident, "give the residencies with --fractions")
    check_outputs([(name, path) for name, path in (("html", html), ("png", png), ("svg", svg)) if path is not None])
    point = serving_point(deployment, batch, cache, requests, slo)
    shares = parse_fractions(fractions or DEFAULTS.residency_fractions)
    rows = residency_curve(point, shares, models=split_names(models) if models else ())
    title = f"throughput against residency on {point.cluster}"
    outputs = [Output(path, residency_figure(rows, fmt=fmt, title=title), fmt)
               for fmt, path in (("png", png), ("svg", svg)) if path is not None]
    if html is not None:
        outputs.append(Output(html, residency_report(rows, title=title), "html"))
    for written in write_all(outputs):
        wrote(written)
    if as_json:
        print_json({"cluster": point.cluster, "rows": [row.to_dict() for row in rows]})
        return
    _print(rows, title)


def _print(rows: tuple[ResidencyRow, ...], title: str) -> None:
    from pipesched.render.residency import COLUMNS, residency_cells

    table = Table(title=title)
    for key, label in COLUMNS:
        table.add_column(label, justify="left" if key == "model" else "right")
    for row in rows:
        table.add_row(*residency_cells(row))
    print_whole(console(), table)
