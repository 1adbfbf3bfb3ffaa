"""`pipesched costs` and `pipesched partition`: per-layer costs of a model on a device, and
its layers split into pipeline stages."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.table import Table

from pipesched.cli.groups import ModelOptions
from pipesched.cli.options import (
    AsJson,
    Chunks,
    ClusterName,
    DeviceName,
    Devices,
    FrozenLayers,
    MemoryLimit,
    Microbatches,
    PartitionOption,
    command,
    parse_memory_limit,
    refuse_with,
)
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_json
from pipesched.cli.pair import cluster_ranks, layer_pairs, pair_rows, pair_table
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require, shorten
from pipesched.experiments.setup import check_partition
from pipesched.generators import generate
from pipesched.limits import MAX_DEVICES, MAX_MICROBATCHES, MAX_STAGES, check_count
from pipesched.model import (
    LAYER_COLUMNS,
    METHODS,
    Cluster,
    LayerCost,
    StagePlan,
    TrainingSettings,
    homogeneous_cluster,
    layer_costs,
    load_cluster,
    load_device,
    plan_stages,
)
from pipesched.model.freezing import parse_frozen_layers
from pipesched.model.recompute import recompute_modes, uniform_mode
from pipesched.model.transformer import LayerOps, layer_ops
from pipesched.partition import format_layout, parse_layout
from pipesched.schedule import Placement, Schedule
from pipesched.units import GiB, MiB

PlanSchedule = Annotated[str | None, typer.Option("--schedule", help="schedule family for in-flight memory")]
ShowLayout = Annotated[bool, typer.Option("--layout", help="print the Megatron layout string")]
ShowOps = Annotated[bool, typer.Option("--ops", help="list every kernel of each layer and its collectives")]
ShowPair = Annotated[bool, typer.Option("--pair", help="each layer's overlapped forward-backward pair (DualPipe's F&B): "
                                         "its time, communication, and the part hidden behind compute")]



@command
def costs(*, model: ModelOptions, device: DeviceName = None, ops: ShowOps = False, pair: ShowPair = False,
          cluster: ClusterName = None, as_json: AsJson = False) -> None:
    """Per-layer costs of one microbatch: forward, backward-input, backward-weight seconds,
    activation bytes, parameters and the bytes sent to the next layer; with --ops every
    kernel of each layer (its shape, FLOPs, bytes, times and whether compute or memory sets
    them) and its tensor-parallel collectives, at training sizes or a decode step's (-b 32
    -s 1: 32 requests of one new token each).

    \b
    Examples:
      pipesched costs --model llama3-8b --device h100-sxm -b 1 -s 4096
      pipesched costs --model llama3-70b --device h100-sxm -t 4 -b 32 -s 1 --ops
      pipesched costs --model deepseek-v3 --device h100-sxm --ep 64 --dtype fp8 -s 4096 --pair
    """
    refuse_with("pair", {"ops": ops} if pair else {}, "which lists each layer's pair, not its kernels")
    require(pair or cluster is None, "cluster", cluster, "only --pair runs layers on a cluster's links; add --pair "
            "or drop --cluster")
    if pair:
        _print_pairs(model, device, cluster, as_json)
    else:
        _print_layers(model, device, ops, as_json)


def _header(spec_name: str, device_name: str, settings: TrainingSettings) -> dict[str, object]:
    """The keys every costs result starts with: the model, the device and the settings."""
    return {"model": spec_name, "device": device_name, "micro_batch_size": settings.micro_batch_size,
            "seq_len": settings.seq_len, "tensor_parallel": settings.tensor_parallel,
            "recompute": settings.recompute, "dtype": settings.dtype,
            "sequence_parallel": settings.sequence_parallel, "context_parallel": settings.context_parallel,
            "cp_comm_type": settings.cp_comm_type}


def _print_pairs(model: ModelOptions, device: str | None, cluster: str | None, as_json: bool) -> None:
    """``costs --pair``: each layer's overlapped pair with its tensor and expert groups on a
    cluster's links (--device: eight to a node)."""
    spec, settings = model.spec(), model.settings()
    hardware = _cluster(model, device, cluster, cluster_ranks(settings))
    hardware = load_cluster(hardware) if isinstance(hardware, str) else hardware
    pairs = layer_pairs(spec, hardware, settings)
    if as_json:
        print_json(_header(spec.name, hardware.devices[0].name, settings) | {"layers": pair_rows(pairs)})
    else:
        output_console().print(pair_table(f"{spec.name} on {hardware.name}", pairs))


def _print_layers(model: ModelOptions, device: str | None, ops: bool, as_json: bool) -> None:
    """``costs`` and ``costs --ops``: each layer's costs, or its kernels and collectives."""
    spec, chip, settings = model.spec(), model.device(device), model.settings()
    layers = layer_costs(spec, chip, settings)
    listed = layer_ops(spec, chip, settings) if ops else None
    if as_json:
        rows = [_layer_row(layer) for layer in layers] if listed is None else [_ops_row(entry) for entry in listed]
        print_json(_header(spec.name, chip.name, settings) | {"layers": rows})
    elif listed is None:
        output_console().print(_layer_table(spec.name, chip.name, settings, layers))
    else:
        for table in _ops_tables(spec.name, chip.name, settings, listed):
            output_console().print(table)


def _layer_row(layer: LayerCost) -> dict[str, object]:
    return {column: getattr(layer, column) for column in LAYER_COLUMNS} | {"flops": layer.flops, "kind": layer.kind}


def _ops_row(entry: LayerOps) -> dict[str, object]:
    """A layer's costs with its kernels (``ops``) and collectives."""
    ops = [{"name": op.name, "m": op.m, "n": op.n, "k": op.k, "groups": op.groups, "flops": op.flops,
            "bytes": op.traffic, "forward_s": op.forward_s, "backward_input_s": op.backward_input_s,
            "backward_weight_s": op.backward_weight_s, "bound": op.bound} for op in entry.kernels]
    collectives = [{"name": c.name, "bytes": c.traffic, "group": c.group, "forward_s": c.forward_s,
                    "backward_s": c.backward_s, "hidden_s": c.hidden_s, "algorithm": c.algorithm,
                    "protocol": c.protocol} for c in entry.collectives]
    return _layer_row(entry.cost) | {"ops": ops, "collectives": collectives}


def _ops_tables(model: str, device: str, settings: TrainingSettings, listed: list[LayerOps]) -> list[Table]:
    """A table per distinct layer (the blocks of a model are alike: one table, with their
    count): a row per kernel and collective, microseconds, and the layer's totals."""
    groups: dict[tuple, list[LayerOps]] = {}
    for entry in listed:
        key = (entry.cost.kind, entry.kernels, entry.collectives)
        groups.setdefault(key, []).append(entry)
    tables = []
    for entries in groups.values():
        names = entries[0].cost.name if len(entries) == 1 else \
            f"{entries[0].cost.name} ... {entries[-1].cost.name} ({len(entries)} alike)"
        table = Table(title=f"{model} on {device}: {names}, b={settings.micro_batch_size} s={settings.seq_len} "
                            f"t={settings.tensor_parallel}{_context(settings)}; times in us")
        for column in ("op", "m", "n", "k", "GFLOP", "MB", "F", "I", "W", "bound"):
            table.add_column(column, justify="left" if column in ("op", "bound") else "right")
        entry = entries[0]
        for op in entry.kernels:
            shape = [f"{value:g}" if op.groups else "" for value in (op.m, op.n, op.k)]
            table.add_row(op.name, *shape, f"{op.flops / 1e9:.3f}", f"{op.traffic / 1e6:.2f}",
                          *(f"{t * 1e6:.1f}" for t in (op.forward_s, op.backward_input_s, op.backward_weight_s)),
                          str(op.bound))
        for collective in entry.collectives:
            table.add_row(f"{collective.name} ({collective.group})", "", "", "", "",
                          f"{collective.traffic / 1e6:.2f}", f"{collective.forward_s * 1e6:.1f}",
                          f"{collective.backward_s * 1e6:.1f}", "",
                          "/".join(x for x in (collective.algorithm, collective.protocol) if x))
        cost = entry.cost
        table.add_section()
        table.add_row("total" + (" (I with recompute)" if cost.recompute_s else ""), "", "", "",
                      f"{cost.forward_flops / 1e9:.3f}", "",
                      *(f"{t * 1e6:.1f}" for t in (cost.forward_s, cost.backward_input_s, cost.backward_weight_s)), "")
        tables.append(table)
    return tables


def _context(settings: TrainingSettings) -> str:
    """The context-parallel split of a table's title, when there is one."""
    return f" cp={settings.context_parallel} ({settings.cp_comm_type})" if settings.context_parallel > 1 else ""


def _layer_table(model: str, device: str, settings: TrainingSettings, layers: list) -> Table:
    """A row per layer of its costs, and their totals."""
    table = Table(title=f"{model} on {device}: b={settings.micro_batch_size} s={settings.seq_len} "
                        f"t={settings.tensor_parallel}{_context(settings)} recompute={settings.recompute}")
    for column in ("layer", "F ms", "I ms", "W ms", "act MiB", "params M", "out MiB", "GFLOP"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    for layer in layers:
        table.add_row(layer.name, f"{layer.forward_s * 1e3:.3f}", f"{layer.backward_input_s * 1e3:.3f}",
                      f"{layer.backward_weight_s * 1e3:.3f}", f"{layer.activation_bytes / MiB:.1f}",
                      f"{layer.params / 1e6:.2f}", f"{layer.output_bytes / MiB:.2f}", f"{layer.flops / 1e9:.2f}")
    table.add_section()
    table.add_row("total", *(f"{sum(getattr(x, f) for x in layers) * 1e3:.3f}"
                             for f in ("forward_s", "backward_input_s", "backward_weight_s")),
                  f"{sum(x.activation_bytes for x in layers) / MiB:.1f}",
                  f"{sum(x.params for x in layers) / 1e6:.2f}", "", f"{sum(x.flops for x in layers) / 1e9:.2f}")
    return table


def _cluster(model: ModelOptions, device: str | None, cluster: str | None, ranks: int) -> Cluster:
    """One device preset on every rank, or a cluster (neither: the default cluster)."""
    if device is not None and cluster is not None:
        raise PipeschedError(f"device={shorten(device)}: not with --cluster; give one of --device NAME or "
                             "--cluster NAME|FILE")
    built = homogeneous_cluster(load_device(device), ranks) if device is not None else \
        load_cluster(cluster or DEFAULTS.cluster)
    return model.cluster(built)


def _layer_span(kinds: list[str], first_block: int) -> str:
    """``E t0-7``, ``t8-15``, ``t24-31 L``: layout letters, blocks numbered in model order."""
    if not kinds:
        return "(empty)"
    parts = []
    block = first_block
    run = 0
    for kind in [*kinds, ""]:
        if kind == "t":
            run += 1
            continue
        if run:
            parts.append(f"t{block}" if run == 1 else f"t{block}-{block + run - 1}")
            block += run
            run = 0
        if kind:
            parts.append(kind)
    return " ".join(parts)


def _plan_json(plan: StagePlan, layout: str) -> str:
    stages = []
    for s in range(plan.costs.num_stages):
        stages.append({
            "stage": s, "rank": plan.ranks[s], "device": plan.devices[s].name,
            "layers": [layer.name for layer in plan.layers[s]],
            "forward_s": plan.costs.forward[s], "backward_input_s": plan.costs.backward_input[s],
            "backward_weight_s": plan.costs.backward_weight[s], "send_s": plan.send_s[s],
            "stage_s": plan.stage_s[s], "activation_bytes": plan.costs.activation_bytes[s],
            "static_bytes": plan.costs.static(s), "output_bytes": plan.costs.output_bytes[s],
            "inflight": plan.inflight[s] if plan.inflight is not None else None,
            "recompute": plan.recompute[s], "frozen": bool(plan.costs.frozen[s]) if plan.costs.frozen else False,
        })
    return json.dumps({
        "model": plan.model.name, "method": plan.method, "sizes": list(plan.partition.sizes),
        "layout": layout, "bottleneck_s": plan.bottleneck_s, "stages": stages,
        "peak_memory_bytes": list(plan.device_peak_bytes) if plan.device_peak_bytes is not None else None,
        "memory_capacity_bytes": list(plan.device_memory),
    }, indent=1)


def _print_plan(plan: StagePlan, layout: str | None) -> None:
    console = output_console()
    run = plan.settings
    per_stage = len(set(plan.recompute)) > 1
    recompute = "per stage" if per_stage else run.recompute
    table = Table(title=f"{plan.model.name}: {plan.costs.num_stages} stages ({plan.method}), "
                        f"b={run.micro_batch_size} s={run.seq_len} t={run.tensor_parallel} recompute={recompute}; "
                        "times in ms per microbatch, memory in GiB")
    columns = ["stage", "cluster rank", "device", "layers", "F", "I", "W", "send", "total", "static", "act/mb"]
    if per_stage:
        columns += ["recompute"]
    if plan.costs.frozen is not None:
        columns += ["frozen"]
    if plan.inflight is not None:
        columns += ["in flight"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("device", "layers") else "right")
    costs = plan.costs
    blocks = 0
    for s in range(costs.num_stages):
        kinds = [x.kind for x in plan.layers[s]]
        row = [str(s), str(plan.ranks[s]), plan.devices[s].name, _layer_span(kinds, blocks),
               f"{costs.forward[s] * 1e3:.2f}", f"{costs.backward_input[s] * 1e3:.2f}",
               f"{costs.backward_weight[s] * 1e3:.2f}", f"{plan.send_s[s] * 1e3:.2f}",
               f"{plan.stage_s[s] * 1e3:.2f}", f"{costs.static(s) / GiB:.2f}",
               f"{costs.activation_bytes[s] / GiB:.2f}"]
        blocks += kinds.count("t")
        if per_stage:
            row += [plan.recompute[s]]
        if plan.costs.frozen is not None:
            frozen = sum(layer.frozen for layer in plan.layers[s])
            row += ["all" if plan.costs.frozen[s] else (f"{frozen} layers" if frozen else "-")]
        if plan.inflight is not None:
            row += [str(plan.inflight[s])]
        table.add_row(*row)
    console.print(table)
    console.print(f"bottleneck stage: {plan.bottleneck_s * 1e3:.2f} ms per microbatch (F + I + W + sends); "
                  f"sizes {plan.partition}")
    if plan.device_peak_bytes is not None:
        memory = Table(title="peak memory per pipeline rank (static + what its ops hold at once, as simulate counts it)")
        for column in ("pipeline rank", "stages", "peak GiB", "capacity GiB", "fits"):
            memory.add_column(column, justify="right")
        for device, (peak, capacity) in enumerate(zip(plan.device_peak_bytes, plan.device_memory, strict=True)):
            held = ", ".join(str(s) for replica in plan.placement.replicas for s, d in enumerate(replica) if d == device)
            memory.add_row(str(device), held, f"{peak / GiB:.2f}", f"{capacity / GiB:.2f}",
                           "yes" if peak <= capacity else "NO")
        console.print(memory)
    if layout is not None:
        console.print(f"layout: {layout}", highlight=False, markup=False)


@command
def partition(*, model: ModelOptions, device: DeviceName = None, cluster: ClusterName = None, p: Devices = None,
              v: Chunks = None, partition: PartitionOption = None, schedule: PlanSchedule = None,
              microbatches: Microbatches = None, show_layout: ShowLayout = False, memory_limit: MemoryLimit = None,
              frozen_layers: FrozenLayers = None, as_json: AsJson = False) -> None:
    """Split a model's layers into p x v pipeline stages and show each stage's time and memory
    (frozen layers cost less: the balanced split gives their stages more of them).

    \b
    Examples:
      pipesched partition --model llama3-70b --cluster 4x8-h100 -p 8 -t 4 --layout
      pipesched partition --model llama3-8b --device h100-sxm -p 4 -t 1 --partition memory --schedule 1f1b -m 8
    """
    p, microbatches = DEFAULTS.p if p is None else p, DEFAULTS.m if microbatches is None else microbatches
    check_count("p", p, MAX_DEVICES, what="pipeline devices")
    if v is not None:
        check_count("v", v, MAX_STAGES, what="stages")
    check_count("stages", p * (v or 1), MAX_STAGES, what="stages (p x v)")
    limit = parse_memory_limit(memory_limit)
    spec = model.spec()
    # a method, or a Megatron layout string that fixes the stages (the one --partition of every command)
    partition = partition or DEFAULTS.partition
    check_partition(partition, spec.layer_kinds)
    method = partition if partition in METHODS else DEFAULTS.partition
    recompute = model.recompute or DEFAULTS.recompute
    settings = model.settings(recompute=uniform_mode(recompute) or "none")
    if frozen_layers:
        settings = dataclasses.replace(settings, frozen_layers=parse_frozen_layers(frozen_layers, spec.num_cost_layers))
    built = _planned_table(schedule, p, microbatches, v, method)
    placement = built.placement if built is not None else Placement.looped(p, v or 1)
    hardware = _cluster(model, device, cluster, placement.num_devices * settings.stage_width)
    given = None if partition in METHODS else parse_layout(partition, spec.layer_kinds,
                                                           num_stages=placement.num_stages)
    modes = None if uniform_mode(recompute) is not None else recompute_modes(recompute, placement.num_stages)
    plan = plan_stages(spec, placement, hardware, settings, method=method, partition=given, schedule=built,
                       memory_limit=limit, recompute=modes)
    layout = format_layout(plan.partition, spec.layer_kinds)
    if as_json:
        typer.echo(_plan_json(plan, layout))
        return
    _print_plan(plan, layout if show_layout else None)


def _planned_table(schedule: str | None, p: int, m: int, v: int | None, method: str) -> Schedule | None:
    """The table whose in-flight counts the memory partition reads (``--schedule``), or None."""
    if schedule is None:
        require(method != "memory", "partition", method, "needs --schedule NAME and -m M for the in-flight counts")
        return None
    check_count("m", m, MAX_MICROBATCHES, what="microbatches")
    return generate(schedule, p, m, v=v)


def register(app: typer.Typer) -> None:
    app.command("costs")(costs)
    app.command("partition")(partition)
