"""The command-line options, each declared once, and their parsing.

The options of one concept form an ``OptionGroup`` (a frozen dataclass of them: the schedule
asked for here, the workload's in ``pipesched.cli.groups``, the views' in
``pipesched.cli.views``); ``command`` spreads a command's groups among its options and hands
it each group built from the parsed values. Every default comes from
``pipesched.experiments.DEFAULTS`` (the README's "Defaults").
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require, shorten
from pipesched.indices import MAX_INDEX_COUNT
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_NUMBER_CHARS,
    MAX_SAMPLES,
    MAX_WORKERS,
    check_number_text,
    check_rate,
)

if TYPE_CHECKING:  # the heavier modules load when options are parsed, not declared
    from pipesched.costs import StageCosts
    from pipesched.model.hardware import Cluster, DeviceSpec

# --- the schedule ------------------------------------------------------------------------
Devices = Annotated[int | None, typer.Option("-p", help=f"pipeline devices [default: {DEFAULTS.p}]")]
Microbatches = Annotated[int | None, typer.Option("-m", help=f"microbatches [default: {DEFAULTS.m}]")]
Chunks = Annotated[int | None, typer.Option("-v", help="chunks (stages) per device, for families that take it")]
FamilySettings = Annotated[list[str] | None, typer.Option(
    "--set", help="family option KEY=VALUE, e.g. activation_limit=6 (in-flight activations per device, in units "
                  "of one stage-microbatch's), or FAMILY.KEY=VALUE for one family of a "
                  "comparison (hanayo.waves=2); costs=F,I,W (slot lengths, e.g. 1,2,1) or costs=FILE.csv sets the "
                  "costs levels 1 and 2 use and the heuristics plan with; fb_cost=R makes an overlapped "
                  "forward-backward pair (a fused op) cost R x (F + B), 0.5 <= R <= 1")]
SteadyStateFlag = Annotated[bool, typer.Option(
    "--steady-state", help="run iterations back to back, each stage stepping its optimizer when its own last W is "
                           "done (no global check), and report the steady-state iteration (the ramp paid once)")]
# --- the analytical workload and machine --------------------------------------------------
Model = Annotated[str | None, typer.Option(
    "--model", help=f"model preset, config.json or YAML/CSV model file [default: {DEFAULTS.model}]")]
ClusterName = Annotated[str | None, typer.Option("--cluster", help=f"cluster preset or YAML file [default: {DEFAULTS.cluster}]")]
MicroBatchSize = Annotated[int | None, typer.Option(
    "--micro-batch-size", "-b", help=f"sequences per microbatch [default: {DEFAULTS.micro_batch_size}]")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", "-s", help=f"tokens per sequence [default: {DEFAULTS.seq_len}]")]
TensorParallel = Annotated[int | None, typer.Option(
    "--tensor-parallel", "-t",
    help=f"tensor-parallel degree; pipeline device d runs on cluster rank d x t [default: {DEFAULTS.tensor_parallel}]")]
ContextParallel = Annotated[int | None, typer.Option(
    "--cp", help="context-parallel degree: ranks that split every sequence (2 x cp must divide -s); a pipeline "
                 f"device then spans t x cp cluster ranks [default: {DEFAULTS.context_parallel}]")]
CpComm = Annotated[str | None, typer.Option(
    "--cp-comm", help="how the context-parallel ranks exchange keys and values: p2p (ring attention), a2a "
                      f"(Ulysses) or allgather [default: {DEFAULTS.cp_comm_type}]")]
ExpertParallel = Annotated[int | None, typer.Option(
    "--ep", help=f"expert-parallel degree: ranks the routed experts of a MoE block are split over, folded over the "
                 f"stage's tensor-parallel ranks and its data-parallel peers (Megatron-Core parallel folding) "
                 f"[default: {DEFAULTS.expert_parallel}]")]
ExpertTensorParallel = Annotated[int | None, typer.Option(
    "--etp", help="tensor-parallel ranks of each expert under --ep (parallel folding: attention keeps -t) "
                  "[default: -t]")]
MoeDispatcher = Annotated[str | None, typer.Option(
    "--moe-dispatcher", help=f"how tokens reach the experts under --ep: alltoall (a copy per selected expert, "
                             f"Megatron-Core's all-to-all) or deepep (a copy per destination GPU, across nodes once "
                             f"per node, forwarded over NVLink) [default: {DEFAULTS.moe_dispatcher}]")]
Recompute = Annotated[str | None, typer.Option(
    "--recompute", help=f"none, selective or full; per stage: full,none,none,selective, or MODE:STAGES items like "
                        f"full:0-3 (one bare MODE for the rest, default none) [default: {DEFAULTS.recompute}]")]
SequenceParallel = Annotated[bool | None, typer.Option(
    "--sequence-parallel/--no-sequence-parallel",
    help=f"split norms and dropouts across the tensor-parallel group too "
         f"[default: {'on' if DEFAULTS.sequence_parallel else 'off'}]")]
Dtype = Annotated[str | None, typer.Option(
    "--dtype", help=f"training dtype of the analytical costs: bf16, fp16, fp32, or fp8 (the linear layers' matmuls "
                    f"on FP8 tensor cores, activations in bf16) [default: {DEFAULTS.dtype}]")]
MatmulEfficiency = Annotated[float | None, typer.Option(
    "--matmul-efficiency", help="fraction of peak FLOP/s the devices' matmuls reach [default: the device preset's]")]
BandwidthEfficiency = Annotated[float | None, typer.Option(
    "--bandwidth-efficiency", help="fraction of memory bandwidth the devices reach [default: the device preset's]")]
DeviceName = Annotated[str | None, typer.Option(
    "--device", help=f"device preset (a100-40gb, h100-sxm, cpu, ...) [default: {DEFAULTS.device}, the default "
                     "cluster's]")]
DataParallelSize = Annotated[int | None, typer.Option(
    "--dp", help="data-parallel pipeline replicas: replica r runs on cluster ranks r x p x t onwards and every device "
                 "all-reduces its gradients with its peers [default: 1]")]
ZeroStage = Annotated[int | None, typer.Option(
    "--zero", help="ZeRO stage of the optimizer state: 0 (each data-parallel rank keeps all of it) or 1 (split over "
                   "the --dp replicas) [default: 0]")]
PartitionOption = Annotated[str | None, typer.Option(
    "--partition", help=f"layers to stages: uniform, balanced, memory, or a Megatron layout string like "
                        f"'Et*9|(t*10|)*6,t*10L' [default: {DEFAULTS.partition}]")]
StageCostsFile = Annotated[str | None, typer.Option(
    "--stage-costs",
    help="CSV of measured per-stage costs: stage,forward,backward_input,backward_weight,activation_bytes,output_bytes "
         "(with it, --frozen-layers names cost rows)")]
Latency = Annotated[float | None, typer.Option(
    "--latency", help="link latency in seconds: uniform links with --stage-costs [default: 0], or every link of the cluster")]
Bandwidth = Annotated[str | None, typer.Option(
    "--bandwidth", help="link bandwidth in bytes/s or inf: uniform links with --stage-costs [default: inf], or every "
                        "link of the cluster")]
MemoryLimit = Annotated[str | None, typer.Option(
    "--memory-limit", help="bytes per device like 8e10, or with a unit like 80GiB, parameters and optimizer state "
                           "included [default: the devices' memory, where known]")]
ActivationLimit = Annotated[int | None, typer.Option(
    "--activation-limit", help="in-flight stage-microbatches per device (activations held at once, in units of one "
                               "stage-microbatch's)")]
NoContention = Annotated[bool, typer.Option("--no-contention", help="transfers never wait for a busy channel")]
# --- what training does to the table ------------------------------------------------------
FrozenStages = Annotated[str | None, typer.Option(
    "--frozen-stages", help="stages whose layers are all frozen, like 0-3: the table drops their W, or their whole "
                            "backward when every stage before them is frozen too")]
FrozenLayers = Annotated[str | None, typer.Option(
    "--frozen-layers", help="layers that do not train: positions in the model's layer list (embedding first, as "
                            "`pipesched costs` lists them) like 0-39, or a fraction from the front like 0.5")]
Offload = Annotated[str | None, typer.Option(
    "--offload", help="activation offload to host memory over each device's host link: all, stages like 0-3, or a "
                      "fraction of every stage's microbatches like 0.5")]
HostBandwidth = Annotated[str | None, typer.Option(
    "--host-bandwidth", help="bytes/s (or 64GB/s) of every device's host link: with --stage-costs, or replacing the "
                             "cluster's")]
HostMemory = Annotated[str | None, typer.Option(
    "--host-memory", help="host memory each device's offloads may fill, bytes or 256GiB: with --stage-costs, or "
                          "replacing the cluster's")]
FreezePlan = Annotated[str | None, typer.Option(
    "--freeze-plan", help="CSV of frozen layers over training steps (start,end,frozen_layers): each step range "
                          "evaluated with its frozen set, and the total time")]
NoOverlap = Annotated[bool, typer.Option(
    "--no-overlap", help="blocking runtime: between steps of compute a device sends and receives in one batch and "
                         "waits for all of it (Megatron's non-overlapped p2p)")]
AsJson = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
# --- real runs (run, check, profile): the sizes this machine runs in seconds ---------------
RunDevices = Annotated[int | None, typer.Option(
    "-p", help=f"pipeline devices, one rank each [default: {DEFAULTS.run_p}]")]
RunMicrobatches = Annotated[int | None, typer.Option("-m", help=f"microbatches [default: {DEFAULTS.run_m}]")]
RunModel = Annotated[str, typer.Option(
    "--model", help=f"model preset (tiny, small, ...), config.json or YAML/CSV model file [default: {DEFAULTS.run_model}]",
    show_default=False)]
RunMicroBatchSize = Annotated[int, typer.Option(
    "--micro-batch-size", "-b", help=f"sequences per microbatch [default: {DEFAULTS.run_micro_batch_size}]",
    show_default=False)]
RunSeqLen = Annotated[int, typer.Option(
    "--seq-len", "-s", help=f"tokens per sequence [default: {DEFAULTS.run_seq_len}]", show_default=False)]
RunDtype = Annotated[str, typer.Option(
    "--dtype", help=f"runtime dtype: float32, float64 or bfloat16 [default: {DEFAULTS.run_dtype}]",
    show_default=False)]
Backend = Annotated[str, typer.Option("--backend", help="gloo (CPU ranks) or nccl (one GPU per rank) [default: gloo]",
                                      show_default=False)]
Steps = Annotated[int, typer.Option(
    "--steps", help=f"measured steps (after warm-up) [default: {DEFAULTS.run_steps}]", show_default=False)]
Warmup = Annotated[int, typer.Option(
    "--warmup", help=f"steps run first and not measured [default: {DEFAULTS.run_warmup}]", show_default=False)]
Runtime = Annotated[str, typer.Option(
    "--runtime", help="auto (PyTorch's runtime where it can, else ours), pytorch or ours [default: auto]",
    show_default=False)]
Timeout = Annotated[float, typer.Option(
    "--timeout", help=f"seconds before every rank is killed [default: {DEFAULTS.run_timeout:g}]", show_default=False)]
# --- variability: Monte Carlo over durations (pipesched.variability) ------------------------
Jitter = Annotated[str | None, typer.Option(
    "--jitter", help="lognormal factors with mean 1 on durations: a CV like 0.1 (every op kind and link), or "
                     "KIND=CV pairs: F=0.05,I=0.1,W=0.2,ops=0.1 (other kinds),link=0.3,link:0-1=0.5")]
JitterFile = Annotated[str | None, typer.Option(
    "--jitter-file", help="measured repeats (the FILE.repeats.csv `pipesched profile` writes): the kinds it holds "
                          "draw their factors from it")]
Straggler = Annotated[list[str] | None, typer.Option(
    "--straggler", help="DEVICE:FACTOR: that device's ops take FACTOR times as long (repeatable)")]
RandomStraggler = Annotated[str | None, typer.Option(
    "--random-straggler", help="P:SLOWDOWN: in each sampled iteration each device is slow with probability P")]
SlowLink = Annotated[list[str] | None, typer.Option(
    "--slow-link", help="A-B:FACTOR: transfers between devices A and B take FACTOR times as long (repeatable)")]
Samples = Annotated[int | None, typer.Option(
    "--samples", help=f"Monte Carlo iterations [default: {DEFAULTS.samples}; at most {MAX_SAMPLES:,}]")]
Seed = Annotated[int | None, typer.Option("--seed", help=f"seed of the random streams [default: {DEFAULTS.seed}]")]

# --- serving (serve simulate, capacity, search): the serve_ rows of the defaults --------------
ServeModel = Annotated[str | None, typer.Option(
    "--model", help=f"model preset, config.json or YAML/CSV model file [default: {DEFAULTS.serve_model}]")]
ServeCluster = Annotated[str | None, typer.Option(
    "--cluster", help=f"cluster preset or YAML file [default: {DEFAULTS.serve_cluster}]")]
ServeTensorParallel = Annotated[int | None, typer.Option(
    "--tensor-parallel", "-t", help=f"tensor-parallel degree: devices of one pipeline stage "
                                    f"[default: {DEFAULTS.serve_tensor_parallel}]")]
ServeStages = Annotated[int | None, typer.Option("-p", help=f"pipeline stages of one replica [default: {DEFAULTS.serve_p}]")]
Replicas = Annotated[int | None, typer.Option(
    "--replicas", help=f"copies of the model serving the trace; replica r holds cluster ranks r x p x t onwards "
                       f"[default: {DEFAULTS.replicas}]")]
Disaggregate = Annotated[str | None, typer.Option(
    "--disaggregate", help="PREFILL,DECODE: prefill and decode on instances of their own, each TPxPP or TPxPPxN "
                           "(N instances of TP x PP devices, default 1), like 2x1x2,4x1; the prefill instances take "
                           "the cluster's first ranks, the KV cache of each prompt goes to a decode instance over the "
                           "cluster's links (instead of -t, -p and --replicas)")]
SameDevices = Annotated[bool, typer.Option(
    "--same-devices", help="with --disaggregate: the decode instances on the prefill instances' devices (as many "
                           "instances of as many devices each, like 1x4,4x1: pipeline parallelism for prefill, tensor "
                           "parallelism for decode), taking them in turns; both layouts' weights stay on the devices, "
                           "the KV cache of each prompt is re-sharded between the layouts by an all-to-all")]
LatencyModelFile = Annotated[str | None, typer.Option(
    "--latency-model", help="CSV of a fitted latency model, stage,base_s,prefill_token_s,prefill_attention_s,"
                            "decode_request_s,kv_token_s, one row per stage: the stage times instead of the kernel "
                            "model's")]
CpuOverhead = Annotated[float | None, typer.Option(
    "--cpu-overhead", help=f"seconds of scheduling and launch per iteration [default: {DEFAULTS.cpu_overhead:g}]")]
SchedulerChoice = Annotated[str | None, typer.Option(
    "--scheduler", help=f"static, orca, vllm or sarathi (README \"Serving\") [default: {DEFAULTS.scheduler}]")]
MaxBatch = Annotated[int | None, typer.Option(
    "--max-batch", help=f"sequences one iteration batches [default: {DEFAULTS.max_batch}]")]
MaxTokens = Annotated[int | None, typer.Option(
    "--max-tokens", help=f"tokens one iteration batches (static, orca, vllm) [default: {DEFAULTS.max_tokens}]")]
Chunk = Annotated[int | None, typer.Option(
    "--chunk", help=f"Sarathi-Serve's token budget per iteration [default: {DEFAULTS.chunk}]")]
BlockSize = Annotated[int | None, typer.Option(
    "--block-size", help=f"tokens per paged KV-cache block [default: {DEFAULTS.block_size}]")]
Resident = Annotated[float | None, typer.Option(
    "--resident", help=f"share of each stage's layers kept on the GPU, in (0, 1]; the rest stream in from "
                       f"--resident-from every iteration, overlapped with the layers before them "
                       f"[default: {DEFAULTS.resident:g}]")]
ResidentFrom = Annotated[str | None, typer.Option(
    "--resident-from", help=f"where the layers --resident leaves off the GPU live: host or disk "
                            f"[default: {DEFAULTS.resident_from}]")]
KvFraction = Annotated[float | None, typer.Option(
    "--kv-fraction", help=f"share of device memory the weights, workspace and KV cache may use "
                          f"[default: {DEFAULTS.kv_fraction:g}]")]
PreemptionChoice = Annotated[str | None, typer.Option(
    "--preemption", help=f"recompute or swap, when the KV cache is full [default: {DEFAULTS.preemption}]")]
RoutingChoice = Annotated[str | None, typer.Option(
    "--routing", help=f"round-robin or least-loaded across replicas [default: {DEFAULTS.routing}]")]
RequestTrace = Annotated[str | None, typer.Option(
    "--trace", help="request trace CSV arrived_at,num_prefill_tokens,num_decode_tokens (the Splitwise and Vidur "
                    "traces' format; instead of the synthetic options)")]
Qps = Annotated[float | None, typer.Option("--qps", help=f"requests per second of a synthetic trace [default: {DEFAULTS.qps:g}]")]
ArrivalForm = Annotated[str | None, typer.Option(
    "--arrival", help=f"poisson or gamma:CV (CV the gaps' coefficient of variation) [default: {DEFAULTS.arrival}]")]
Requests = Annotated[int | None, typer.Option("--requests", help=f"requests of a synthetic trace [default: {DEFAULTS.requests}]")]
_LENGTH_FORMS = "fixed:N, uniform:LO-HI, lognormal:MEDIAN,SIGMA, zipf:S,MAX or trace:FILE"  # what --prompt-tokens and --output-tokens take
PromptTokens = Annotated[str | None, typer.Option(
    "--prompt-tokens", help=f"prompt lengths: {_LENGTH_FORMS} "
                            f"[default: {DEFAULTS.prompt_tokens}]")]
OutputTokens = Annotated[str | None, typer.Option(
    "--output-tokens", help=f"output lengths, the first token included; the forms of --prompt-tokens "
                            f"[default: {DEFAULTS.output_tokens}]")]
SloTtft = Annotated[float | None, typer.Option(
    "--slo-ttft", help=f"target seconds to the first token [default: {DEFAULTS.slo_ttft:g}]")]
SloTpot = Annotated[float | None, typer.Option(
    "--slo-tpot", help=f"target seconds per output token after the first [default: {DEFAULTS.slo_tpot:g}]")]
Attainment = Annotated[float | None, typer.Option(
    "--attainment", help=f"share of requests that must meet both SLOs [default: {DEFAULTS.attainment:g}]")]
PerRequest = Annotated[bool, typer.Option("--per-request", help="with --json: every request's arrival, TTFT, "
                                                                "end-to-end latency and output tokens")]
# --- real serving runs (serve run, serve check): the serve_run_ rows ---------------------------
ServeRunModel = Annotated[str, typer.Option(
    "--model", help=f"model preset (tiny, small, ...), config.json or YAML/CSV model file "
                    f"[default: {DEFAULTS.serve_run_model}]", show_default=False)]
ServeRunStages = Annotated[int, typer.Option(
    "-p", help=f"ranks, one pipeline stage each [default: {DEFAULTS.serve_run_p}]", show_default=False)]
ServeRunQps = Annotated[float | None, typer.Option(
    "--qps", help=f"requests per second of a synthetic trace [default: {DEFAULTS.serve_run_qps:g}]")]
ServeRunRequests = Annotated[int | None, typer.Option(
    "--requests", help=f"requests of a synthetic trace [default: {DEFAULTS.serve_run_requests}]")]
ServeRunPromptTokens = Annotated[str | None, typer.Option(
    "--prompt-tokens", help=f"prompt lengths: {_LENGTH_FORMS} "
                            f"[default: {DEFAULTS.serve_run_prompt_tokens}]")]
ServeRunOutputTokens = Annotated[str | None, typer.Option(
    "--output-tokens", help=f"output lengths, the first token included; the forms of --prompt-tokens "
                            f"[default: {DEFAULTS.serve_run_output_tokens}]")]
LatencyModelOut = Annotated[str | None, typer.Option(
    "--output", "-o", help="write the fitted latency model to this CSV (what --latency-model reads)")]
# --- searches: where the points are evaluated, what is printed -------------------------------
Workers = Annotated[int | None, typer.Option(
    "--workers", help=f"local worker processes, at most {MAX_WORKERS} [default: the CPU count]")]
RayFlag = Annotated[bool, typer.Option("--ray", help="run on a local Ray (loopback only) instead of a process pool")]
RayAddress = Annotated[str | None, typer.Option(
    "--ray-address", help="run on the Ray cluster at this HOST:PORT (ray start --head prints it)")]
Top = Annotated[int, typer.Option("--top", help="configurations to print (0: all)")]
Gpus = Annotated[int | None, typer.Option("--gpus", help="use the cluster's first N devices [default: all]")]


def parse_settings(pairs: list[str] | None) -> dict[str, object]:
    """``["waves=2", "activation_limit=4"]`` -> {"waves": 2, "activation_limit": 4}; numbers are
    converted, other values stay strings."""
    options: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PipeschedError(f"--set={shorten(pair)!r}: write KEY=VALUE, e.g. --set activation_limit=6")
        options[option_key(key)] = _number(value.strip())
    return options


def option_key(key: str) -> str:
    """An option's key as the families name it: dashes in the option's name read as
    underscores (``activation-limit``); a ``FAMILY.`` prefix keeps the family's own name.

    >>> option_key("zb-h1.activation-limit"), option_key(" m-w ")
    ('zb-h1.activation_limit', 'm_w')
    """
    family, dot, option = key.strip().rpartition(".")
    return f"{family}{dot}{option.replace('-', '_')}"


def _number(text: str) -> object:
    if len(text) > MAX_NUMBER_CHARS:  # no number is this long: the option says what it wants
        return text
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def whole_numbers(field: str, text: str | None) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4); None -> () (every value): the values a search tries."""
    if text is None:
        return ()
    values = []
    for part in split_names(text):
        try:
            values.append(int(part))
        except ValueError:
            raise PipeschedError(f"{field}={text[:40]!r}: give whole numbers separated by commas, e.g. 1,2,4") from None
    require(bool(values), field, repr(text), "give at least one value")
    return tuple(values)


def slot_costs_option(value: object) -> StageCosts:
    """``--set costs=...``: ``F,I,W`` slot lengths, or a stage-cost CSV file."""
    text = str(value)
    if text.lower().endswith(".csv") or Path(text).is_file():
        from pipesched.io.stage_costs import load_stage_costs

        return load_stage_costs(text)
    from pipesched.costs import StageCosts

    return StageCosts.parse_slots(text)


def family_options(pairs: list[str] | None) -> tuple[dict[str, object], StageCosts | None, float | None]:
    """Family options from ``--set``, the slot costs ``costs=...`` names (None: F = I = W =
    1), and ``fb_cost`` (what a fused overlapped pair costs over F + B, at every level; None:
    the costs' own). The costs stay among the options too: the families that take them plan
    with them."""
    options = parse_settings(pairs)
    fb_cost = options.pop("fb_cost", None)
    if fb_cost is not None:
        if not isinstance(fb_cost, int | float) or isinstance(fb_cost, bool) or not 0.5 <= fb_cost <= 1.0:
            raise PipeschedError(f"fb_cost={str(fb_cost)[:40]}: give an overlapped pair's time over F + B, a number "
                                 "in [0.5, 1] (1: no overlap)")
        fb_cost = float(fb_cost)
    if "costs" not in options:
        return options, None, fb_cost
    costs = slot_costs_option(options["costs"])
    options["costs"] = costs
    return options, costs, fb_cost


def parse_bandwidth(text: str | None) -> float | None:
    """``--bandwidth`` text -> bytes/s (``inf`` allowed); None when not given."""
    if text is None:
        return None
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(check_number_text("bandwidth", text))
    except ValueError:
        raise PipeschedError(f"bandwidth={shorten(text)!r}: not a number; give bytes/s like 2.5e10, or inf") from None
    if not value > 0 or math.isnan(value):
        raise PipeschedError(f"bandwidth={shorten(text)}: must be > 0 bytes/s (use inf for free links)")
    if not value <= MAX_AMOUNT:
        raise PipeschedError(f"bandwidth={shorten(text)}: over the limit of {MAX_AMOUNT:g} bytes/s; write inf for "
                             "free links")
    return check_rate("bandwidth", value, infinite=True)


def parse_memory_limit(text: str | None) -> float | None:
    """``--memory-limit`` text (bytes, or with a unit like 80GiB) -> bytes; None when not
    given."""
    return parse_amount(text, "bytes", "memory-limit")


def parse_amount(text: str | None, quantity: str, field: str) -> float | None:
    """``--host-bandwidth`` / ``--host-memory`` text (a number, or with a unit) -> base
    units, > 0; None when not given."""
    if text is None:
        return None
    from pipesched.model.units import parse_quantity

    value = parse_quantity(text, quantity, field)
    if not value > 0:
        raise PipeschedError(f"{field}={text[:40]}: must be > 0")
    return check_rate(field, value) if quantity == "bandwidth" else value


def check_training(frozen_layers: str | None, offload: str | None) -> None:
    """The frozen layers and offload texts are well formed (their indices are checked
    against the model and the table once those are known)."""
    from pipesched.model.freezing import parse_frozen_layers
    from pipesched.passes.offload import OffloadPolicy

    if frozen_layers:
        parse_frozen_layers(frozen_layers, _ANY_COUNT)
    if offload:
        OffloadPolicy.parse(offload, _ANY_COUNT)


# an index bound large enough to check the form of index text before its real bound is known
_ANY_COUNT = MAX_INDEX_COUNT


# --- option groups: the options of one concept, declared once, shared by every command -----
class OptionGroup:
    """A frozen dataclass whose fields are the options of one concept, each typed with its
    ``Annotated`` option above (or with a smaller group, whose options it takes in);
    ``command`` spreads them among a command's options."""

    @classmethod
    def parameters(cls) -> list[inspect.Parameter]:
        """The group's options as the keyword parameters typer reads."""
        hints = typing.get_type_hints(cls, include_extras=True)
        parameters: list[inspect.Parameter] = []
        for item in dataclasses.fields(cls):
            kind = hints[item.name]
            parameters += kind.parameters() if is_group(kind) else [inspect.Parameter(
                item.name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=item.default)]
        return parameters

    @classmethod
    def from_values(cls, values: dict[str, object]) -> OptionGroup:
        """The group of the parsed ``values`` (its own are taken out of them)."""
        hints = typing.get_type_hints(cls, include_extras=True)
        return cls(**{item.name: hints[item.name].from_values(values) if is_group(hints[item.name])
                      else values.pop(item.name) for item in dataclasses.fields(cls)})

    def given(self) -> dict[str, object]:
        """Flag (without its dashes) -> value, of every option of the group."""
        hints = typing.get_type_hints(type(self), include_extras=True)
        flags: dict[str, object] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            flags |= value.given() if is_group(hints[item.name]) else {_flag(item.name, hints[item.name]): value}
        return flags


def is_group(kind: object) -> bool:
    """Whether ``kind`` (a type hint) is an OptionGroup."""
    return isinstance(kind, type) and issubclass(kind, OptionGroup)


def _flag(name: str, annotation: object) -> str:
    """The long flag an option is typed with (``--jitter-file`` -> ``jitter-file``), else its name."""
    for info in getattr(annotation, "__metadata__", ()):
        for declared in getattr(info, "param_decls", None) or (info.default,):
            if isinstance(declared, str) and declared.startswith("--"):
                return declared[2:].split("/")[0]
    return name


def command(function: Callable[..., None]) -> Callable[..., None]:
    """``function`` as typer reads it: each parameter typed with an OptionGroup becomes the
    group's options, in its place, and ``function`` receives the group built from their
    parsed values. Two options of one name are a programming error."""
    hints = typing.get_type_hints(function, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, type[OptionGroup]] = {}
    for parameter in inspect.signature(function).parameters.values():
        kind = hints[parameter.name]
        if is_group(kind):
            groups[parameter.name] = kind
            parameters += kind.parameters()
        else:
            parameters.append(parameter.replace(annotation=kind, kind=inspect.Parameter.KEYWORD_ONLY))
    names = [parameter.name for parameter in parameters]
    if len(set(names)) != len(names):
        raise TypeError(f"{function.__name__}: options named twice: {sorted({n for n in names if names.count(n) > 1})}")

    @functools.wraps(function)
    def parsed(**values: object) -> None:
        for name, kind in groups.items():
            values[name] = kind.from_values(values)
        return function(**values)

    parsed.__signature__ = inspect.Signature(parameters)
    parsed.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return parsed


@dataclass(frozen=True)
class ScheduleOptions(OptionGroup):
    """The schedule asked for: a family's sizes and options."""

    p: Devices = None
    m: Microbatches = None
    v: Chunks = None
    family_settings: FamilySettings = None

    def sizes(self) -> tuple[int, int]:
        """(p, m), each unset one from DEFAULTS."""
        return (DEFAULTS.p if self.p is None else self.p, DEFAULTS.m if self.m is None else self.m)

    def family_options(self) -> tuple[dict[str, object], StageCosts | None, float | None]:
        """See ``family_options``."""
        return family_options(self.family_settings)

    def request(self) -> dict[str, object]:
        """The fields of the schedule asked for (``ScheduleRequest``) that ``--set`` gives:
        the family options, the slot costs and ``fb_cost``, as every command's points take them."""
        options, slot_costs, fb_cost = self.family_options()
        return {"options": tuple(sorted(options.items())), "slot_costs": slot_costs, "fb_cost": fb_cost}


def tuned_device(device: DeviceSpec, matmul_efficiency: float | None,
                 bandwidth_efficiency: float | None) -> DeviceSpec:
    """``device`` with the efficiencies given (None: its own)."""
    changes = {name: value for name, value in (("matmul_efficiency", matmul_efficiency),
                                               ("bandwidth_efficiency", bandwidth_efficiency)) if value is not None}
    return dataclasses.replace(device, **changes) if changes else device


def tuned_cluster(cluster: str | Cluster, matmul_efficiency: float | None,
                  bandwidth_efficiency: float | None) -> str | Cluster:
    """The cluster (a name or file, or a Cluster) with every device's efficiencies given;
    the name itself when none is given."""
    if matmul_efficiency is None and bandwidth_efficiency is None:
        return cluster
    from pipesched.model import load_cluster

    built = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return dataclasses.replace(built, devices=tuple(tuned_device(device, matmul_efficiency, bandwidth_efficiency)
                                                    for device in built.devices))


def refuse_with(option: str, given: Mapping[str, object], why: str) -> None:
    """Refuse, before any work, each option of ``given`` (flag -> value; None, False or
    empty: not given) that a command cannot honour together with ``--option``: ``why``
    says what ``--option`` does instead."""
    for flag, value in given.items():
        if value is not None and value is not False and value != [] and value != ():
            raise PipeschedError(f"{flag}={shorten(value)}: not with --{option}, {why}; drop --{flag}")
