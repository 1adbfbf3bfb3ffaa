"""`pipesched serve pool DEPLOYMENT.yaml`: several models on one device pool, placed
(greedy against the simulator, or a baseline) and served; per model its serving metrics,
the placement, the pool's SLO attainment and the weight swaps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipesched.cli.options import AsJson, command
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_json, print_whole, wrote
from pipesched.cli.views import Html, Trace
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.io.files import check_outputs, write_all

# the pool's placement and run, and the views, load when the command runs (not with `serve`)
if TYPE_CHECKING:
    from pipesched.serving.pool_result import PoolResult

DeploymentFile = Annotated[str, typer.Argument(metavar="DEPLOYMENT.yaml", help="the pool's deployment file, or a built-in one by name (example): its devices, models, traffic, "
                                                    "SLOs and allowed TPxPP shapes")]
PlacementMethod = Annotated[str, typer.Option(
    "--placement", help="greedy (AlpaServe's, against the simulator), dedicated (one model per device group) or "
                        "round-robin")]


@command
def pool_command(*, deployment: DeploymentFile, placement: PlacementMethod = DEFAULTS.placement,
                 as_json: AsJson = False, html: Html = None, perfetto: Trace = None) -> None:
    """Serve several models on one device pool: place their replicas (TP x PP) on device
    groups under memory, serve every model's traffic there (a group's models one batch at a
    time; a model whose weights do not fit beside the others swapped in over the host link),
    and report each model's metrics, the placement, the SLO attainment and the swaps.

    \b
    Examples:
      pipesched serve pool example
      pipesched serve pool example --placement round-robin --json
    """
    from pipesched.serving.pool import load_pool
    from pipesched.serving.pool_result import serve_pool, timed
    from pipesched.serving.pool_search import PLACEMENTS, check_placeable, place

    require(placement in PLACEMENTS, "placement", placement, f"choose {' or '.join(PLACEMENTS)}")
    check_outputs([(name, path) for name, path in (("html", html), ("perfetto", perfetto)) if path is not None])
    pool = load_pool(deployment)
    check_placeable(pool)
    found, seconds = timed(place, pool, placement)
    result = serve_pool(pool, found, placement_s=seconds)
    if (html or perfetto) and result.run is not None:
        from pipesched.render.views import render_views
        from pipesched.serving.timeline import serving_timeline

        outputs = render_views([serving_timeline(result.run)], trace=perfetto, html=html,
                               title=f"serve pool: {deployment} ({placement})")
        for path in write_all(outputs):
            wrote(path)
    if as_json:
        print_json(result.to_dict())
        return
    print_pool(result)


def print_pool(result: PoolResult) -> None:
    """The placement's groups, then a line per model, then the attainment and swaps."""
    console = output_console()
    table = Table(title=f"placement ({result.placement.method}, found in {result.placement_s:.2f} s)")
    for heading in ("ranks", "TPxPP", "models", "weights"):
        table.add_column(heading)
    for group in result.placement.to_dict(result.pool)["groups"]:
        ranks = group["ranks"]
        table.add_row(f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]), f"{group['tp']}x{group['pp']}",
                      ", ".join(group["models"]), "swapped" if group["swapped"] else "resident")
    print_whole(console, table)
    models = Table(title="models")
    for heading in ("model", "replicas", "requests", "SLO met", "TTFT p90 (s)", "TPOT p90 (s)", "tokens/s"):
        models.add_column(heading, justify="left" if heading == "model" else "right")
    for m, (traffic, served) in enumerate(zip(result.pool.models, result.results, strict=True)):
        replicas = str(len(result.placement.replicas(m)))
        if served is None:
            models.add_row(traffic.name, replicas, f"{len(traffic.trace):,}", "0.0% (not placed)", "-", "-", "-")
            continue
        numbers = served.to_dict()
        models.add_row(traffic.name, replicas, f"{served.requests:,}", f"{served.slo_attainment:.1%}",
                       f"{numbers['ttft_s']['p90']:.4f}", f"{numbers['tpot_s']['p90']:.4f}",
                       f"{served.throughput_tokens_per_s:,.0f}")
    print_whole(console, models)
    swap_s = sum(swap.end_s - swap.start_s for swap in result.swaps)
    console.print(f"SLO attainment: {result.attainment:.1%} of all requests; weight swaps: {len(result.swaps):,} "
                  f"({swap_s:.2f} s of loading)", highlight=False, markup=False)
