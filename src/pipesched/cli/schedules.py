"""`pipesched list`, `show`, `validate`: the schedule table commands (and the preset lists).

Only light modules load at the top: `validate` reads and checks a file without numpy,
rich or the generators' drawing code."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from pipesched import io
from pipesched.cli.options import (
    ActivationLimit,
    AsJson,
    FrozenStages,
    ScheduleOptions,
    command,
    family_options,
)
from pipesched.cli.output import console, print_json
from pipesched.cli.views import ViewPaths
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, shorten, suggest
from pipesched.io.files import Output
from pipesched.limits import MAX_OPS, check_count
from pipesched.units import GiB
from pipesched.validation import REPORTED_VIOLATIONS, format_report, require_valid, validate
from pipesched.wording import counted

if TYPE_CHECKING:
    from pipesched.costs import StageCosts
    from pipesched.schedule import Schedule

LISTS = ("families", "models", "devices", "clusters")
# --set keys that are not a family's options, so a schedule file takes them too: the slot
# costs of levels 1 and 2 (costs=F,I,W) and a fused pair's cost over F + B (fb_cost, taken
# out by family_options)
NOT_FAMILY_OPTIONS = ("costs",)


def list_command(
    what: Annotated[str, typer.Argument(metavar="[families|models|devices|clusters]",
                                        help="what to list")] = "families",
    as_json: AsJson = False,
) -> None:
    """List the schedule families (with their options and constraints), or the built-in
    models, devices or clusters that --model, --device and --cluster take by name.

    \b
    Examples:
      pipesched list
      pipesched list devices
      pipesched list models --json
    """
    if what not in LISTS:
        raise PipeschedError(f"list={shorten(what)!r}: unknown list{suggest(what, LISTS)}; "
                             f"choose one of {', '.join(LISTS)}")
    rows = {"families": _families, "models": _models, "devices": _devices, "clusters": _clusters}[what]()
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"{what} (pipesched list {what} --json for all fields)" if what != "families" else "schedule families")
    columns = [column for column in rows[0] if column in _SHOWN[what]]
    for column in columns:
        table.add_column(column.replace("_", " "), justify="left" if column in _LEFT else "right")
    for row in rows:
        table.add_row(*(_cell(row[column]) for column in columns))
    console().print(table)


_LEFT = {"name", "chunks", "options", "constraints", "summary", "devices", "links", "device"}
_SHOWN = {
    "families": ("name", "chunks", "options", "constraints", "summary"),
    "models": ("name", "parameters_billion", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "num_experts"),
    "devices": ("name", "peak_tflops", "memory_gib", "memory_bandwidth_tb_s", "matmul_efficiency",
                "bandwidth_efficiency"),
    "clusters": ("name", "num_devices", "num_nodes", "devices", "links"),
}


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _families() -> list[dict]:
    from pipesched.generators import FAMILIES

    return [{"name": family.name,
             "chunks": f"v (default {family.default_v})" if family.takes_v else str(family.chunks),
             "default_v": family.default_v if family.takes_v else family.chunks,
             "takes_v": family.takes_v, "options": list(family.options),
             "constraints": family.constraints, "summary": family.summary} for family in FAMILIES.values()]


def _models() -> list[dict]:
    from pipesched.model import MODELS, layer_params

    rows = []
    for spec in MODELS.values():
        fields = {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)
                  if field.name not in ("measured", "measured_on")}
        rows.append({"name": spec.name, "parameters_billion": sum(layer_params(spec)) / 1e9,
                     **{key: value for key, value in fields.items() if key != "name"}})
    return rows


def _devices() -> list[dict]:
    from pipesched.model import DEVICES

    return [{"name": d.name, "peak_tflops": d.peak_flops / 1e12, "memory_gib": d.memory_bytes / GiB,
             "memory_bandwidth_tb_s": d.memory_bandwidth / 1e12, "matmul_efficiency": d.matmul_efficiency,
             "bandwidth_efficiency": d.bandwidth_efficiency, "peak_flops": d.peak_flops,
             "memory_bytes": d.memory_bytes, "memory_bandwidth": d.memory_bandwidth} for d in DEVICES.values()]


def _clusters() -> list[dict]:
    from pipesched.model import cluster_presets, load_cluster

    rows = []
    for name in cluster_presets():
        cluster = load_cluster(name)
        kinds: dict[str, int] = {}
        for device in cluster.devices:
            kinds[device.name] = kinds.get(device.name, 0) + 1
        intra, inter = cluster.intra_node, cluster.inter_node
        rows.append({
            "name": cluster.name, "num_devices": cluster.num_devices, "num_nodes": max(cluster.node_of) + 1,
            "devices": [f"{count} x {kind}" for kind, count in kinds.items()],
            "links": f"intra {intra.bandwidth / 1e9:g} GB/s {intra.latency * 1e6:g} us, "
                     f"inter {inter.bandwidth / 1e9:g} GB/s {inter.latency * 1e6:g} us"
                     + ("" if cluster.nic_per_device else " (one NIC per node)"),
            "intra_node": {"bandwidth": intra.bandwidth, "latency": intra.latency},
            "inter_node": {"bandwidth": inter.bandwidth, "latency": inter.latency},
            "nic_per_device": cluster.nic_per_device,
        })
    return rows


Format = Annotated[str | None, typer.Option(
    "--format", help="grid | csv (PyTorch compute-only) | csv-comms (PyTorch compute+comms) | json [default: grid, "
                     "or what the -o file's extension names: .json json, .csv csv]")]
ShowOutput = Annotated[str | None, typer.Option(
    "-o", "--output", help="write to this file instead of stdout, in the format its extension names (.json, .csv, "
                           "else grid text)")]
ScheduleName = Annotated[str, typer.Argument(metavar="NAME|FILE",
                                             help="schedule family (see `pipesched list`) or a schedule file")]


@command
def show(*, name: ScheduleName, schedule: ScheduleOptions, fmt: Format = None, output: ShowOutput = None,
         frozen_stages: FrozenStages = None, views: ViewPaths) -> None:
    """Generate a schedule and print it as a table (or write it as grid text, CSV or JSON).
    On a terminal the table is time-aligned (every slot the same columns, cut into bands at
    the terminal's width, coloured by op kind unless NO_COLOR); to a pipe, with -o or with
    --format grid it is the grid text. --png/--svg/--perfetto/--html draw its idealized slot
    table (F = I = W = 1 slot, or the lengths --set costs=F,I,W gives). --frozen-stages
    generates it for those frozen stages.

    \b
    Examples:
      pipesched show zb-h1 -p 4 -m 6
      pipesched show interleaved-1f1b -p 4 -m 8 -v 2 --format csv -o sched.csv
      pipesched show zb-v -p 4 -m 8 --set activation_limit=6 --svg zb-v.svg
      pipesched show zb-h1 -p 4 -m 8 --set costs=1,2,1
    """
    from pipesched.slots import slot_table

    views.check(("output", output))
    # on a terminal, with no --format or -o: the time-aligned grid instead of the grid text
    terminal = console() if output is None and fmt is None else None
    fmt = _format(output, fmt)
    table = load_or_generate(name, p=schedule.p, m=schedule.m, v=schedule.v, settings=schedule.family_settings,
                             frozen_stages=frozen_stages)
    options, costs, fb_cost = schedule.family_options()
    slots = _slots(costs, fb_cost)
    text = io.dumps(table, fmt)
    summary = _grid_summary(name, table, slots, costs, options, schedule.v) if output is None and fmt == "grid" else ""
    aligned = terminal is not None and terminal.is_terminal
    # every output is made before any is written: the files all or none, then stdout
    timelines = [slot_table(table, slots)] if views.any or aligned else []
    views.write(timelines, title=f"{table.name}: idealized slot table",
                others=[Output(output, text)] if output is not None else ())
    if aligned and terminal is not None:
        _print_aligned(terminal, timelines[0], summary)
    elif output is None:
        sys.stdout.write(text + summary)


def _format(output: str | None, fmt: str | None) -> str:
    """The format ``--format`` names, or the ``-o`` file's extension, or grid text."""
    fmt = io.output_format(output, fmt) if output is not None else fmt or "grid"
    if fmt not in io.FORMATS:
        raise PipeschedError(f"format={shorten(fmt)!r}: unknown; choose one of {', '.join(io.FORMATS)}")
    return fmt


def _slots(costs: StageCosts | None, fb_cost: float | None) -> StageCosts:
    """The slot lengths of the idealized table: ``--set costs`` (else 1, 1, 1), with ``fb_cost``."""
    from pipesched.costs import StageCosts

    slots = costs if costs is not None else StageCosts.slots()
    return slots if fb_cost is None else slots.with_pair_cost(fb_cost)


def _print_aligned(terminal, timeline, summary: str) -> None:
    """The time-aligned grid of a slot table on the terminal, in colour unless NO_COLOR,
    and the summary lines wrapped between words at the terminal's width."""
    from rich.text import Text

    from pipesched.render.terminal import grid_view

    terminal.print(Text(f"{timeline.schedule.name}: time-aligned slot table (`--format grid` or a pipe prints "
                        "the grid text)", style="bold"))
    terminal.print(grid_view(timeline, width=max(terminal.width, 24),
                             color=terminal.color_system is not None and not terminal.no_color))
    for line in summary.splitlines():
        terminal.print(Text(line), highlight=False)


def _grid_summary(name: str, schedule: Schedule, slots, costs, options: dict[str, object], v: int | None) -> str:
    """The comment lines under a printed grid: the slot table's makespan, bubble and
    in-flight activations, and for a family its closed form's."""
    from pipesched.generators import FAMILIES, formula, get_family
    from pipesched.slots import one_f_one_b_units, table_metrics

    metrics = table_metrics(schedule, slots)
    lengths = (f"F={slots.f:g}, I={slots.i:g}, W={slots.w:g}, B={slots.b:g}" if costs is not None and costs.is_uniform
               else "F=I=W=1, B=2" if costs is None else "given stage costs")
    # show counts the table's own stage ops and stage-microbatches; compare, 1F1B stages'
    scale = one_f_one_b_units(schedule)
    as_compare = "" if scale == 1 else f"; {metrics.makespan * scale:g} in 1F1B-stage slots, as compare counts"
    units = "" if scale == 1 else f" ({metrics.activation_units:g} in 1F1B-stage units)"
    text = (f"# slot makespan {metrics.makespan:g} (stage-op slots: {lengths}{as_compare}), bubble ratio "
            f"{metrics.bubble_ratio:.3f}, peak in-flight per device {list(metrics.peak_inflight)} "
            f"stage-microbatches{units}\n")
    if name in FAMILIES:
        est = formula(name, schedule.num_devices, int(schedule.iteration_microbatches),
                      v=v, costs=slots,
                      **{k: x for k, x in options.items() if k in get_family(name).options and k != "costs"})
        text += (f"# formula: makespan {est.makespan:g}, bubble ratio {est.bubble_ratio:.3f}, "
                 f"peak in-flight {est.peak_inflight:g}{'' if est.exact else ' (approximate)'}"
                 f"{' (the family without frozen stages)' if schedule.frozen else ''}\n")
    return text


def carried_partition(schedule: Schedule) -> str | None:
    """The partition a schedule file carries (``params["partition"]``, a Megatron layout
    string, as ``synthesize`` writes it): what ``--partition`` defaults to for its model."""
    layout = schedule.params.get("partition")
    if layout is not None and not isinstance(layout, str):
        raise PipeschedError(f"params.partition={shorten(str(layout))}: give a Megatron layout string like "
                             "'Et*8|t*8|t*8|t*8L', or remove it")
    return layout


def load_or_generate(name: str, *, p: int | None, m: int | None, v: int | None,
                     settings: list[str] | None = None, frozen_stages: str | None = None,
                     default_p: int = DEFAULTS.p, default_m: int = DEFAULTS.m) -> Schedule:
    """A family name generates (p and m default to ``default_p`` and ``default_m``: the
    analytical commands' DEFAULTS, or the real runs'); anything else is read as a
    schedule file, which fixes its own sizes. ``--set costs=...`` reaches the families that
    plan with costs (the zero-bubble heuristics); a file takes none of the families' options,
    and must be a valid schedule. ``frozen_stages`` (text like ``0-3``) freezes those stages
    (``generate(..., frozen=...)``, or ``freeze`` for a file)."""
    from pipesched.generators import FAMILIES, generate, get_family
    from pipesched.indices import parse_indices

    if name in FAMILIES:
        options, _, _ = family_options(settings)
        if "costs" in options and "costs" not in get_family(name).options:
            del options["costs"]  # only levels 1 and 2 use them for this family
        p, m = p if p is not None else default_p, m if m is not None else default_m
        schedule = generate(name, p, m, v=v, **options)
        if frozen_stages:
            frozen = parse_indices(frozen_stages, field="frozen-stages", count=schedule.num_stages, what="stages")
            schedule = generate(name, p, m, v=v, frozen=frozen, **options)
        return schedule
    if any(ch in name for ch in "./\\"):
        for flag, value in (("p", p), ("m", m), ("v", v)):
            if value is not None:
                raise PipeschedError(f"{flag}={value}: a schedule file fixes its own sizes; drop -{flag}")
        options, _, _ = family_options(settings)
        for key, value in options.items():
            if key not in NOT_FAMILY_OPTIONS:
                raise PipeschedError(f"{key}={shorten(value)}: a family option, and a schedule file is not "
                                     f"generated; drop --set {key}")
        schedule = require_valid(io.load_schedule(name), name)
        if frozen_stages:
            from pipesched.passes.freeze import freeze

            schedule = freeze(schedule, parse_indices(frozen_stages, field="frozen-stages",
                                                      count=schedule.num_stages, what="stages"))
        return schedule
    get_family(name)  # raises the unknown-family error listing the known names
    raise AssertionError("unreachable")


def validate_file(
    path: Annotated[str, typer.Argument(metavar="FILE", help="schedule file: grid text, PyTorch CSV (.csv) or JSON (.json)")],
    activation_limit: ActivationLimit = None,
    as_json: AsJson = False,
) -> None:
    """Check a schedule file: exit 0 valid, 1 violations (with the report), 2 unreadable.

    \b
    Examples:
      pipesched validate sched.csv
      pipesched validate sched.csv --activation-limit 11 --json
    """
    if activation_limit is not None:
        check_count("activation-limit", activation_limit, MAX_OPS, what="in-flight stage-microbatches")
    schedule = io.load_schedule(path)
    violations = validate(schedule, activation_limit=activation_limit)
    if as_json:
        kinds: dict[str, int] = {}
        for violation in violations:
            kinds[violation.kind] = kinds.get(violation.kind, 0) + 1
        print_json({
            "file": path, "valid": not violations, "schedule": schedule.name, "p": schedule.num_devices,
            "m": schedule.num_microbatches, "num_stages": schedule.num_stages, "num_ops": schedule.num_ops,
            "violation_count": len(violations), "violations_by_kind": kinds,
            "violations": [{"kind": v.kind, "message": v.message, "ops": [str(op) for op in v.ops],
                            "device": v.device} for v in violations[:REPORTED_VIOLATIONS]],
        })
        if violations:
            raise typer.Exit(1)
        return
    if violations:
        sys.stdout.write(format_report(schedule, violations) + "\n")
        raise typer.Exit(1)
    sys.stdout.write(
        f"{path}: valid ({counted(schedule.num_devices, 'device')}, {counted(schedule.num_stages, 'stage')}, "
        f"{counted(schedule.num_microbatches, 'microbatch')}, {counted(schedule.num_ops, 'op')})\n"
    )


def register(app: typer.Typer) -> None:
    app.command("list")(list_command)
    app.command("show")(show)
    app.command("validate")(validate_file)
