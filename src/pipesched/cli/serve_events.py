"""`pipesched serve simulate --events FILE`: a run while cluster events change the
deployment's devices; after the results, each change: its plan, what moved, its seconds
and the latency before, during and after it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

EventsFile = Annotated[str | None, typer.Option(
    "--events", help="YAML or CSV of cluster events (at_s, event lose or add, device): the deployment is "
                     "re-parallelised on the devices left at each")]


def print_changes(changes: list[dict[str, object]], console: Console) -> None:
    """One line per change of shape (``serving.events.reconfiguration_dicts``)."""
    for change in changes:
        plan, latency = change["plan"], change["latency"]
        what = ", ".join(f"{e['event']} device {e['device']}" for e in change["events"])
        console.print(f"at {change['at_s']:g} s ({what}): tp {plan['tp']} x p {plan['pp']} x {plan['replicas']} on "
                      f"{len(plan['devices'])} devices; {change['moved_bytes'] / 1e9:.2f} GB of weights moved "
                      f"({change['from_host_bytes'] / 1e9:.2f} GB from host memory) in {change['seconds']:.3f} s; "
                      f"{change['requests_in_flight']} requests in flight recomputed; mean E2E before "
                      f"{_seconds(latency['before'])}, during {_seconds(latency['during'])}, after "
                      f"{_seconds(latency['after'])}", highlight=False, markup=False, soft_wrap=True)


def _seconds(group: dict[str, object]) -> str:
    value = group["e2e_s_mean"]
    return "-" if value is None else f"{value:.3f} s"
