"""`pipesched profile --collectives`: every collective kind timed on N local ranks with
torch.distributed (gloo on CPUs, NCCL on GPUs), fitted, and written as the calibration of a
cluster file's link (``pipesched.runtime.collective_profile``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from pipesched.cli.options import OptionGroup
from pipesched.cli.output import print_json, wrote
from pipesched.cli.progress import StatusLine
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.io.files import check_outputs, write_atomic
from pipesched.model.units import parse_quantity
from pipesched.runtime.collective_profile import calibration_yaml, check_sizes, profile_collectives


@dataclass(frozen=True)
class CollectiveOptions(OptionGroup):
    """Measure the collectives instead of a model's layers."""

    collectives: Annotated[bool, typer.Option(
        "--collectives", help="time all-reduce, all-gather, reduce-scatter, all-to-all and send/recv on --ranks "
                              "local ranks; write their fitted calibration as a cluster file's link (-o FILE.yaml)")] = \
        False
    sizes: Annotated[str, typer.Option(
        "--sizes", help="message sizes per rank, comma-separated, with --collectives (bytes, or 64KiB, 4MiB)")] = \
        DEFAULTS.profile_sizes
    link_bandwidth: Annotated[str | None, typer.Option(
        "--link-bandwidth", help="the link's line rate the fitted efficiency is a share of, with --collectives "
                                 "(450 GB/s; default: the measured bus bandwidth)")] = None

    def byte_sizes(self) -> tuple[int, ...]:
        parts = [part for part in self.sizes.split(",") if part.strip()]
        require(len(parts) >= 1, "sizes", self.sizes, "give one or more message sizes, e.g. 4KiB,1MiB")
        return check_sizes([int(parse_quantity(part.strip(), "bytes", "sizes")) for part in parts[:65]])


def profile_collectives_command(options: CollectiveOptions, *, ranks: int, device: str, repeats: int, warmup: int,
                                output: str, as_json: bool) -> None:
    """Run the sweep, print the fit, write the link YAML to ``output``."""
    require(output.endswith((".yaml", ".yml")), "output", output, "write the calibration to a .yaml file (-o FILE.yaml)")
    require(ranks >= 2, "ranks", ranks, "a collective needs at least 2 ranks; give --ranks 2 or more")
    require(device in ("cpu", "cuda"), "device", device, "must be cpu (gloo) or cuda (nccl)")
    check_outputs((("output", output),))
    sizes = options.byte_sizes()
    link = None if options.link_bandwidth is None else parse_quantity(options.link_bandwidth, "bandwidth",
                                                                      "link_bandwidth")
    backend = "nccl" if device == "cuda" else "gloo"
    with StatusLine(f"profile collectives on {ranks} {backend} ranks") as status:
        profile = profile_collectives(ranks=ranks, sizes=sizes, backend=backend, repeats=repeats, warmup=warmup,
                                      on_status=status)
    write_atomic(output, calibration_yaml(profile, link_bandwidth=link))
    fit = profile.fit
    if as_json:
        print_json({"backend": backend, "ranks": ranks, "launch_s": fit.launch, "step_s": fit.step,
                    "bus_bandwidth_bytes_per_s": fit.bus_bandwidth, "median_error": fit.median_error,
                    "missing": [kind.value for kind in profile.missing], "output": output,
                    "samples": [{"kind": kind.value, "bytes": size, "seconds": seconds}
                                for kind, size, seconds in profile.samples]})
        return
    wrote(output, " (a cluster file's intra_node link: paste it in, or --cluster with nodes added)")
    typer.echo(f"{ranks} {backend} ranks: launch {fit.launch * 1e6:.1f} us, step {fit.step * 1e6:.1f} us, "
               f"bus bandwidth {fit.bus_bandwidth / 1e9:.3g} GB/s (median error {fit.median_error:.1%})")
