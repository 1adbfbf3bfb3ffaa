"""Profiling for the simulator: layer and stage op times measured in isolation, the
runtime's per-op overhead, and point-to-point latency and bandwidth between ranks.

Everything is measured in rank processes started like a real run's (one torch thread,
pinned to a core, on the same backend), never inside the run being predicted:

- ``profile_layers``: each layer alone (the embedding, a transformer block, the head with
  its loss), as the measured-layer CSV rows ``pipesched.model.load_model`` reads. Blocks of
  one model have the same shape, so one block is timed and every block gets its numbers.
- ``profile_stages``: each stage of a partition alone, with the op code a run executes
  (``stage_ops``), so the first stage's I/W split (I does nothing, W the whole backward)
  and the last stage's loss come out as in a run. Stages with the same layer kinds and
  count are timed once.
- ``profile_overhead``: the runtime's fixed cost per op, outside the op's compute (posting
  sends and receives, bookkeeping), from a 2-rank run of a probe model with almost no
  compute but the run's boundary tensors: the median gap between consecutive ops of a
  rank, less any wait for data.
- ``profile_link``: two ranks exchange messages, both directions at once (a pipeline's
  activations and gradients cross in its steady state; replicas trade gradients);
  latency is the time of the smallest message, bandwidth the least-squares slope over the
  larger ones. Each size keeps its fastest exchange: an idle rank waiting in a blocking
  receive can take milliseconds to wake up (idle virtual CPUs do), while in a run the
  receiver is busy computing when its data arrives.

The simulator reads the stage-cost CSV (``pipesched simulate --stage-costs FILE --latency S
--bandwidth B``); ``link_yaml`` writes the link figures beside the cost file.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import itertools
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import yaml

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, require
from pipesched.generators import generate
from pipesched.io.stage_costs import dumps_stage_costs
from pipesched.limits import (
    MAX_DEVICES,
    MAX_MICRO_BATCH_SIZE,
    MAX_REPEATS,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    check_amount,
    check_count,
)
from pipesched.model import layer_params
from pipesched.model.loading import LAYER_COLUMNS
from pipesched.model.spec import LayerCost, ModelSpec
from pipesched.partition import Partition
from pipesched.runtime.launch import LaunchSpec, StatusCallback, launch
from pipesched.runtime.measure import ELEMENT_BYTES, StageTiming
from pipesched.runtime.runs import RunOptions, capacity_problem, memory_problem, run_schedules
from pipesched.runtime.torch_import import require_torch
from pipesched.units import GiB

PROFILE_DEVICES = ("cpu", "cuda")
# message sizes of the link measurement, bytes: the smallest gives latency, the rest bandwidth (up
# to the size of a stage's gradients, which replicated stages exchange)
LINK_SIZES = (8, 262144, 1048576, 4194304, 16777216)


def probe_model(model: ModelSpec | None = None) -> ModelSpec:
    """The overhead probe: a model with almost no compute, whose stage boundaries carry the
    same hidden states as ``model``'s (the runtime's per-op cost grows with what it sends).

    >>> probe_model().hidden_size
    8
    """
    if model is None:
        return ModelSpec(name="overhead-probe", num_layers=2, hidden_size=8, num_heads=1, num_kv_heads=1,
                         ffn_hidden_size=8, vocab_size=8)
    return ModelSpec(name="overhead-probe", num_layers=2, hidden_size=model.hidden_size, num_heads=model.num_heads,
                     num_kv_heads=model.num_kv_heads, ffn_hidden_size=8, vocab_size=8, head_dim=model.head_dim)


@dataclass(frozen=True)
class ProfileOptions:
    """How layers and stages are timed."""

    micro_batch_size: int = 2  # b, sequences per microbatch
    seq_len: int = 64  # s, tokens per sequence
    dtype: str = "float32"  # float32, float64 or bfloat16
    device: str = "cpu"  # cpu or cuda
    warmup: int = 3  # untimed repeats first
    repeats: int = 10  # timed repeats; the median is kept
    seed: int = 0
    threads: int = 1  # torch threads (as in a run)
    # ranks timing the same ops at the same time, each on its own core (or GPU): the machine
    # is then as busy as during a run with that many ranks (cores that share a physical core
    # or memory bandwidth slow each other down)
    ranks: int = 1
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        require(self.device in PROFILE_DEVICES, "device", self.device, "must be cpu or cuda")
        for name, limit in (("micro_batch_size", MAX_MICRO_BATCH_SIZE), ("seq_len", MAX_SEQ_LEN),
                            ("repeats", MAX_REPEATS), ("threads", MAX_THREADS), ("ranks", MAX_DEVICES)):
            check_count(name, getattr(self, name), limit)
        check_count("warmup", self.warmup, MAX_REPEATS, minimum=0)
        check_amount("timeout", self.timeout_s, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


@dataclass(frozen=True)
class ProfileTask:
    """What the profiling rank receives: runs of layers (start, stop) to time."""

    model: ModelSpec
    ranges: tuple[tuple[int, int], ...]
    options: ProfileOptions


@dataclass(frozen=True)
class LinkProfile:
    """Point-to-point link between two ranks of this machine."""

    backend: str
    latency: float  # seconds, one-way time of the smallest message
    bandwidth: float  # bytes/s
    sizes: tuple[int, ...]  # bytes
    one_way_s: tuple[float, ...]  # fastest exchange of each size (both directions at once), seconds


def _time_ranges(model: ModelSpec, ranges: Sequence[tuple[int, int]], options: ProfileOptions,
                 on_status: StatusCallback | None = None) -> list[StageTiming]:
    """Every range timed by ``options.ranks`` ranks at once; each field is the median over
    the ranks of their medians."""
    problem = capacity_problem(options.ranks, options.backend)
    if problem is not None:
        fix = "profile with --device cpu" if options.device == "cuda" else "use fewer --ranks"
        raise PipeschedError(f"device={options.device}, ranks={options.ranks}: {problem}; {fix}")
    # each rank holds one range of layers at a time, its weights and gradients: the largest
    # range must fit on every rank
    params = layer_params(model)
    largest = max(2 * ELEMENT_BYTES[options.dtype] * sum(params[start:end]) for start, end in ranges)
    problem = memory_problem([largest] * options.ranks, options.backend)
    if problem is not None:
        raise PipeschedError(f"model={model.name}: {problem}; profile a smaller model or fewer --ranks")
    spec = LaunchSpec(handler="profile", task=ProfileTask(model, tuple(ranges), options), world_size=options.ranks,
                      backend=options.backend, timeout_s=options.timeout_s, threads=options.threads,
                      pin_cpus=options.device == "cpu")
    per_rank: list[list[StageTiming]] = launch(spec, describe=[f"timing {len(ranges)} layer runs"],
                                               on_status=on_status)
    return [median_timing(timings) for timings in zip(*per_rank, strict=True)]


def median_timing(timings: Sequence[StageTiming]) -> StageTiming:
    """Field by field median of several timings of the same stage; their repeats together."""
    def median(name: str) -> float:
        return float(statistics.median(getattr(t, name) for t in timings))

    first = timings[0]
    repeats: dict[str, list[float]] = {}
    for timing in timings:
        for kind, times in timing.repeats:
            repeats.setdefault(kind, []).extend(times)
    return StageTiming(forward=median("forward"), backward_input=median("backward_input"),
                       backward_weight=median("backward_weight"), backward=median("backward"),
                       activation_bytes=first.activation_bytes, output_bytes=first.output_bytes, params=first.params,
                       repeats=tuple((kind, tuple(times)) for kind, times in repeats.items()))


def _kind_key(model: ModelSpec, layers: range) -> tuple[str, ...]:
    """Stages with the same layer kinds in the same order cost the same (blocks are alike)."""
    kinds = model.layer_kinds
    return tuple(kinds[i] for i in layers)


def profile_layers(model: ModelSpec, options: ProfileOptions | None = None, *,
                   on_status: StatusCallback | None = None) -> tuple[LayerCost, ...]:
    """Per-layer costs measured in isolation, one row per layer of the model (``on_status``:
    status lines while the ranks time them, see ``launch``)."""
    return layer_costs(model, profile_layer_timings(model, options, on_status=on_status))


def profile_layer_timings(model: ModelSpec, options: ProfileOptions | None = None, *,
                          on_status: StatusCallback | None = None) -> list[StageTiming]:
    """The timing of every layer of the model in isolation (layers of one kind are timed once)."""
    from pipesched.runtime.torch_model import check_buildable

    options = options or ProfileOptions()
    check_buildable(model)
    count = model.num_cost_layers
    distinct: dict[tuple[str, ...], int] = {}
    for index in range(count):
        distinct.setdefault(_kind_key(model, range(index, index + 1)), index)
    timings = dict(zip(distinct, _time_ranges(model, [(i, i + 1) for i in distinct.values()], options,
                                                  on_status), strict=True))
    return [timings[_kind_key(model, range(index, index + 1))] for index in range(count)]


def layer_costs(model: ModelSpec, timings: Sequence[StageTiming]) -> tuple[LayerCost, ...]:
    """The measured-layer rows of the model from one timing per layer."""
    return tuple(LayerCost(name=name, forward_s=t.forward, backward_input_s=t.backward_input,
                           backward_weight_s=t.backward_weight, activation_bytes=t.activation_bytes,
                           params=t.params, output_bytes=t.output_bytes, kind=kind)
                 for name, kind, t in zip(model.layer_names, model.layer_kinds, timings, strict=True))


def profile_stages(model: ModelSpec, partitions: Sequence[Partition],
                   options: ProfileOptions | None = None, *, on_status: StatusCallback | None = None) -> list[StageCosts]:
    """Stage costs of each partition, every distinct stage timed once in isolation."""
    return [stage_costs_from_timings(stages, dtype=(options or ProfileOptions()).dtype)
            for stages in profile_stage_timings(model, partitions, options, on_status=on_status)]


def profile_stage_timings(model: ModelSpec, partitions: Sequence[Partition],
                          options: ProfileOptions | None = None, *,
                          on_status: StatusCallback | None = None) -> list[list[StageTiming]]:
    """The timing of every stage of each partition, every distinct stage timed once in isolation."""
    from pipesched.runtime.torch_model import check_buildable

    options = options or ProfileOptions()
    check_buildable(model)
    wanted: dict[tuple[str, ...], tuple[int, int]] = {}
    for partition in partitions:
        for stage in range(partition.num_stages):
            layers = partition.layers(stage)
            wanted.setdefault(_stage_key(model, layers), (layers.start, layers.stop))
    timings = dict(zip(wanted, _time_ranges(model, list(wanted.values()), options, on_status), strict=True))
    return [[timings[_stage_key(model, partition.layers(s))] for s in range(partition.num_stages)]
            for partition in partitions]


def _stage_key(model: ModelSpec, layers: range) -> tuple[object, ...]:
    # first and last stage differ from a middle one with the same kinds (stage 0's I/W split)
    return (layers.start == 0, layers.stop == model.num_cost_layers, *_kind_key(model, layers))


def stage_costs_from_timings(stages: Sequence[StageTiming], *, dtype: str = "float32") -> StageCosts:
    """StageCosts from one timing per stage (sizes in the runtime ``dtype``)."""
    element_bytes = ELEMENT_BYTES[dtype]

    def column(name: str) -> tuple[float, ...]:
        return tuple(float(getattr(t, name)) for t in stages)

    params = column("params")
    return StageCosts(
        forward=column("forward"),
        backward_input=column("backward_input"),
        backward_weight=column("backward_weight"),
        backward=column("backward"),
        activation_bytes=column("activation_bytes"),
        output_bytes=column("output_bytes"),
        # a run keeps weights and gradients in the runtime dtype (no optimizer state)
        static_bytes=tuple(2 * n * element_bytes for n in params),
        grad_bytes=tuple(n * element_bytes for n in params),
    )


def add_op_overhead(costs: StageCosts, overhead_s: float) -> StageCosts:
    """``costs`` with the runtime's fixed per-op cost (seconds) added to every op's time."""
    return costs.with_op_overhead(overhead_s)


def profile_overhead(*, runtime: str = "ours", backend: str = "gloo", model: ModelSpec | None = None,
                     micro_batch_size: int = 1, seq_len: int = 4, dtype: str = "float32", steps: int = 5,
                     timeout_s: float = 300.0, on_status: StatusCallback | None = None) -> float:
    """The runtime's fixed cost per op outside its compute, seconds (see the module docstring).

    With ``model`` (and the run's micro-batch size, sequence length and dtype) the probe's
    stage boundaries carry tensors of the run's size.
    """
    options = RunOptions(micro_batch_size=micro_batch_size, seq_len=seq_len, dtype=dtype, steps=steps, warmup=2,
                         backend=backend, timeout_s=timeout_s)
    result = run_schedules([generate("1f1b", 2, 8)], probe_model(model), options=options, runtime=runtime,
                           on_status=on_status)[0]
    gaps = []
    for timeline in result.timelines:
        waits = timeline.measured.op_wait_s
        for device in range(timeline.num_devices):
            rows = np.flatnonzero(timeline.op_device == device)
            for before, after in itertools.pairwise(rows):
                gaps.append(timeline.op_start[after] - timeline.op_end[before] - waits[after])
    return max(0.0, float(statistics.median(gaps)))


def check_link_capacity(backend: str) -> None:
    """Refuse when this machine cannot host the two ranks a link measurement needs (with
    nccl: two GPUs)."""
    problem = capacity_problem(2, backend)
    if problem is not None:
        raise PipeschedError(f"link: measuring it needs two ranks and {problem}; skip it (CLI: --no-link)")


def profile_link(*, backend: str = "gloo", repeats: int = 20, timeout_s: float = 300.0,
                 on_status: StatusCallback | None = None) -> LinkProfile:
    """Latency and bandwidth between two ranks of this machine (two-way exchanges)."""
    check_link_capacity(backend)
    spec = LaunchSpec(handler="p2p", task={"sizes": LINK_SIZES, "repeats": repeats}, world_size=2,
                      backend=backend, timeout_s=timeout_s, pin_cpus=backend == "gloo")
    measured = launch(spec, describe=["link exchange"], on_status=on_status)[0]
    return fit_link(backend, measured["sizes"], measured["one_way_s"])


def fit_link(backend: str, sizes: Sequence[int], one_way_s: Sequence[float]) -> LinkProfile:
    """latency = one-way time of the smallest message; bandwidth = 1 / slope of a
    least-squares line through the other sizes.

    >>> link = fit_link("gloo", [8, 1000, 2000], [1e-5, 2e-5, 3e-5])
    >>> round(link.bandwidth)
    100000000
    """
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    times = np.asarray(one_way_s, dtype=np.float64)
    order = np.argsort(sizes_arr)
    sizes_arr, times = sizes_arr[order], times[order]
    slope = float(np.polyfit(sizes_arr[1:], times[1:], 1)[0]) if len(sizes_arr) > 2 else 0.0
    bandwidth = 1.0 / slope if slope > 0 else float("inf")
    return LinkProfile(backend=backend, latency=float(times[0]), bandwidth=bandwidth,
                       sizes=tuple(int(s) for s in sizes_arr), one_way_s=tuple(float(t) for t in times))


# --- files --------------------------------------------------------------------------------
def layer_costs_csv(layers: Sequence[LayerCost]) -> str:
    """The measured-layer CSV (``pipesched.model.load_model`` reads it), with the kind column."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow((*LAYER_COLUMNS, "kind"))
    for layer in layers:
        writer.writerow([layer.name, *(f"{getattr(layer, c):.9g}" for c in LAYER_COLUMNS[1:]), layer.kind])
    return buffer.getvalue()


def layer_costs_yaml(layers: Sequence[LayerCost], *, name: str, measured_on: str = "",
                     notes: Sequence[str] = ()) -> str:
    """The measured-layer YAML model file (``pipesched.model.load_model`` reads it): ``notes``
    as comment lines first (how the numbers were measured), then ``name``, ``measured_on``
    (a device preset, so that costs scale to other devices by peak FLOP/s) and the layers.

    >>> from pipesched.model.spec import LayerCost
    >>> text = layer_costs_yaml([LayerCost("block.0", 1e-3, 1e-3, 1e-3, 8.0, 4.0, 2.0, kind="t")],
    ...                         name="m", notes=["measured on a test"])
    >>> text.splitlines()[0]
    '# measured on a test'
    """
    header = "".join(f"# {line}\n" for line in notes)
    data: dict[str, object] = {"name": name}
    if measured_on:
        data["measured_on"] = measured_on
    body = yaml.safe_dump(data, sort_keys=False)
    rows = []
    for layer in layers:
        cells = [f"name: {layer.name}", f"kind: {layer.kind}",
                 *(f"{column}: {getattr(layer, column):.9g}" for column in LAYER_COLUMNS[1:])]
        rows.append("  - {" + ", ".join(cells) + "}\n")
    return header + body + "layers:\n" + "".join(rows)


# GPU names (as torch.cuda.get_device_name reports them) -> device presets (pipesched.model.devices)
_GPU_PRESETS = (("H200", "h200"), ("H100", "h100-sxm"), ("B200", "b200"), ("MI300X", "mi300x"))


def device_preset_for(device_name: str, memory_bytes: float = 0.0) -> str:
    """The device preset a GPU of this name is, or "" when none fits.

    >>> device_preset_for("NVIDIA H200")
    'h200'
    >>> device_preset_for("NVIDIA A100-SXM4-40GB", 40 * 2**30)
    'a100-40gb'
    >>> device_preset_for("Intel(R) Xeon(R) Platinum")
    ''
    """
    for fragment, preset in _GPU_PRESETS:
        if fragment in device_name:
            return preset
    if "A100" in device_name:
        return "a100-80gb" if memory_bytes > 48 * GiB else "a100-40gb"
    return ""


def measuring_device(device: str) -> tuple[str, float]:
    """(name, memory bytes) of what ``profile --device DEVICE`` timed on: for cuda the first
    GPU, for cpu this machine's CPU model (memory 0)."""
    torch = require_torch()
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        return properties.name, float(properties.total_memory)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip(), 0.0
    except OSError:
        pass

    return platform.processor() or platform.machine(), 0.0


def measurement_notes(model: ModelSpec, options: ProfileOptions, device_name: str) -> list[str]:
    """How a profile was taken, as lines for the head of its file."""
    torch = require_torch()
    threads = "" if options.device == "cuda" else f", {options.threads} torch thread(s) pinned to a core"
    return [
        f"Per-layer costs of {model.name}, measured by `pipesched profile` on {device_name}",
        f"({options.device}, {options.ranks} rank(s) timing at once{threads}, "
        f"{len(os.sched_getaffinity(0))} CPU cores visible), torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}.",
        f"Each layer alone in {options.dtype}, micro-batch {options.micro_batch_size} x {options.seq_len} tokens: "
        f"F, I (stage_backward_input) and W (stage_backward_weight) are medians of {options.repeats} timed "
        f"repeats after {options.warmup} untimed warm-up repeat(s)"
        + (", each ended by torch.cuda.synchronize." if options.device == "cuda" else "."),
        "One transformer block is timed and every block gets its numbers (blocks of one model have one shape);",
        "activation_bytes are the tensors autograd saves in F; output_bytes the hidden state sent to the next layer.",
    ]


def stage_costs_csv(costs: StageCosts) -> str:
    """The stage-cost CSV the simulator reads (``pipesched.io.stage_costs``), to 9 digits:
    the times and activation sizes measured, not the static bytes (the run measured holds
    no optimizer state: its parameter memory is not a training run's)."""
    return dumps_stage_costs(dataclasses.replace(costs, static_bytes=None, grad_bytes=None), digits=9)


def link_yaml(link: LinkProfile, *, overhead_s: float | None = None) -> str:
    """The measured link (and per-op overhead) as YAML, with the simulator flags to use them.

    With the per-op overhead, ``device`` holds both fixed costs as the device fields of a
    cluster file (``pipesched.model.clusters``): ``op_overhead`` is the runtime's per-op
    cost, ``transfer_setup`` the whole fixed cost of one transfer between two ranks here
    (the latency, which includes the wire: give the cluster's link latency 0 with it).

    >>> text = link_yaml(LinkProfile("gloo", 5e-5, 1e9, (8,), (5e-5,)), overhead_s=2e-4)
    >>> yaml.safe_load(text)["device"]
    {'op_overhead': 0.0002, 'transfer_setup': 5e-05}
    """
    data: dict[str, object] = {
        "backend": link.backend,
        "latency_s": link.latency,
        "bandwidth_bytes_per_s": link.bandwidth,
        "exchange": {"sizes_bytes": list(link.sizes), "seconds": list(link.one_way_s)},
    }
    header = f"# simulate with: --latency {link.latency:.6g} --bandwidth {link.bandwidth:.6g}\n"
    if overhead_s is not None:
        data["per_op_overhead_s"] = overhead_s
        data["device"] = {"op_overhead": overhead_s, "transfer_setup": link.latency}
        header += "# device: the fixed costs as cluster-file device fields, e.g. {preset: h200, op_overhead: ..., transfer_setup: ...}\n"
    return header + yaml.safe_dump(data, sort_keys=False)
