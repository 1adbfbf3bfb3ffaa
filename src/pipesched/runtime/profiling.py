"""The profiling workflow of ``pipesched profile``: time a model's layers (or a partition's
stages) in isolation, the runtime's per-op overhead and the link between ranks, and write
the cost file the simulator reads, the link beside it (``FILE.link.yaml``) and every timed
repeat (``FILE.repeats.csv``, what ``--jitter-file`` draws from).

The files are written after every measurement, all or none, so a measurement that fails
leaves none behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipesched.errors import PipeschedError, require, shorten
from pipesched.io.files import Output, check_outputs, write_all
from pipesched.limits import MAX_DEVICES, MAX_LAYERS, MAX_STAGES, check_count, parse_int
from pipesched.model.spec import ModelSpec
from pipesched.partition import Partition
from pipesched.runtime.launch import StatusCallback
from pipesched.runtime.profile import (
    ProfileOptions,
    add_op_overhead,
    check_link_capacity,
    device_preset_for,
    layer_costs,
    layer_costs_csv,
    layer_costs_yaml,
    link_yaml,
    measurement_notes,
    measuring_device,
    profile_layer_timings,
    profile_link,
    profile_overhead,
    profile_stage_timings,
    stage_costs_csv,
    stage_costs_from_timings,
)
from pipesched.runtime.runs import stage_partition
from pipesched.variability.measured import repeats_csv

RUNTIMES = ("ours", "pytorch")  # whose per-op overhead per-stage costs carry


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile and where to write it: per layer (``p`` None) or per stage of ``p``
    ranks of ``v`` stages each, split by ``partition`` (layers per stage like ``3|4|3``;
    None: uniform)."""

    output: str | Path
    p: int | None = None
    v: int = 1
    partition: str | None = None
    runtime: str = "ours"
    link: bool = True

    def paths(self) -> tuple[Path, Path, Path]:
        """(cost file, link file, repeats file), each checked as a writable output: for
        ``-o FILE.csv`` (or ``FILE.yaml``), ``FILE.link.yaml`` and ``FILE.repeats.csv``."""
        target = Path(self.output)
        found = check_outputs((("output", target), ("output", target.with_suffix(".link.yaml")),
                               ("output", target.with_suffix(".repeats.csv"))))
        return found[0], found[1], found[2]


def parse_partition(text: str) -> Partition:
    """Layers per stage written like ``3|4|3``."""
    parts = text.split("|", maxsplit=MAX_STAGES)
    require(len(parts) <= MAX_STAGES, "partition", text, f"more than {MAX_STAGES:,} stages, over the limit")
    if not all(part.strip().isdigit() for part in parts):
        raise PipeschedError(f"partition={shorten(text)!r}: write layers per stage like 3|4|3")
    return Partition.from_sizes([parse_int("partition", part, MAX_LAYERS, minimum=0, what="layers") for part in parts])


def profile_to_files(spec: ModelSpec, options: ProfileOptions, request: ProfileRequest,
                     on_status: StatusCallback | None = None) -> dict[str, object]:
    """Measure and write the files (see the module docstring); returns what was written and
    measured as the JSON shape of ``pipesched profile --json``."""
    target, link_path, repeats_path = request.paths()
    require(request.runtime in RUNTIMES, "runtime", request.runtime, "must be ours or pytorch")
    p = request.p
    as_yaml = target.suffix in (".yaml", ".yml")
    require(not (as_yaml and p is not None), "output", str(target),
            "per-stage costs (-p) are a CSV; name the output .csv, or drop -p for a per-layer YAML")
    if p is None:
        require(request.partition is None, "partition", request.partition, "needs -p (per-stage costs)")
    else:
        check_count("p", p, MAX_DEVICES, what="pipeline devices")
        check_count("v", request.v, MAX_STAGES, what="stages")
        check_count("stages", p * request.v, MAX_STAGES, what="stages (p x v)")
    backend = options.backend
    if request.link:  # refuse a link this machine cannot measure before timing anything
        check_link_capacity(backend)
    summary: dict[str, object] = {"model": spec.name, "device": options.device, "output": str(target)}
    if p is None:
        timings = profile_layer_timings(spec, options, on_status=on_status)
        layers = layer_costs(spec, timings)
        repeats = repeats_csv([t.repeat_seconds() for t in timings], index="layer")
        if as_yaml:  # the measured-layer model file, headed by how it was measured
            name, memory = measuring_device(options.device)
            text = layer_costs_yaml(layers, name=f"{spec.name}-measured",
                                    measured_on=device_preset_for(name, memory) if options.device == "cuda" else "",
                                    notes=measurement_notes(spec, options, name))
        else:
            text = layer_costs_csv(layers)
        summary["layers"] = [{"name": layer.name, "forward_s": layer.forward_s, "backward_input_s": layer.backward_input_s,
                              "backward_weight_s": layer.backward_weight_s} for layer in layers]
    else:
        given = parse_partition(request.partition) if request.partition else None
        chosen = stage_partition(spec, p * request.v, given)
        timings = profile_stage_timings(spec, [chosen], options, on_status=on_status)[0]
        overhead = profile_overhead(runtime=request.runtime, backend=backend, model=spec,
                                    micro_batch_size=options.micro_batch_size, seq_len=options.seq_len,
                                    dtype=options.dtype, on_status=on_status)
        costs = add_op_overhead(stage_costs_from_timings(timings, dtype=options.dtype), overhead)
        # each repeat counted as the cost file counts its median: with the per-op overhead
        repeats = repeats_csv([t.repeat_seconds(offset_s=overhead) for t in timings])
        text = stage_costs_csv(costs)
        summary.update(partition=str(chosen), per_op_overhead_s=overhead)
    outputs = [Output(target, text), Output(repeats_path, repeats)]
    if request.link:
        measured = profile_link(backend=backend, on_status=on_status)
        outputs.append(Output(link_path, link_yaml(measured, overhead_s=summary.get("per_op_overhead_s"))))
        summary.update(latency_s=measured.latency, bandwidth_bytes_per_s=measured.bandwidth, link_file=str(link_path))
    summary["repeats_file"] = str(repeats_path)
    write_all(outputs)  # after every measurement, all or none: a failure leaves no file behind
    return summary
