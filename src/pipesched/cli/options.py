"""The command-line options, each declared once, and their parsing into experiment points.

Every default comes from ``pipesched.experiments.DEFAULTS`` (the README's "Defaults").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.experiments.defaults import DEFAULTS
from pipesched.experiments.point import Point

# --- the schedule ------------------------------------------------------------------------
Devices = Annotated[int | None, typer.Option("-p", help=f"pipeline devices [default: {DEFAULTS.p}]")]
Microbatches = Annotated[int | None, typer.Option("-m", help=f"microbatches [default: {DEFAULTS.m}]")]
Chunks = Annotated[int | None, typer.Option("-v", help="chunks (stages) per device, for families that take it")]
FamilySettings = Annotated[list[str] | None, typer.Option(
    "--set", help="family option KEY=VALUE, e.g. memory_limit=6, or FAMILY.KEY=VALUE for one family of a "
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
Recompute = Annotated[str | None, typer.Option("--recompute", help=f"none, selective or full [default: {DEFAULTS.recompute}]")]
PartitionOption = Annotated[str | None, typer.Option(
    "--partition", help=f"layers to stages: uniform, balanced, memory, or a Megatron layout string like "
                        f"'Et*9|(t*10|)*6,t*10L' [default: {DEFAULTS.partition}]")]
StageCostsFile = Annotated[str | None, typer.Option(
    "--stage-costs",
    help="CSV of measured per-stage costs: stage,forward,backward_input,backward_weight,activation_bytes,output_bytes")]
Latency = Annotated[float | None, typer.Option(
    "--latency", help="link latency in seconds: uniform links with --stage-costs [default: 0], or every link of the cluster")]
Bandwidth = Annotated[str | None, typer.Option(
    "--bandwidth", help="link bandwidth in bytes/s or inf: uniform links with --stage-costs [default: inf], or every "
                        "link of the cluster")]
NoContention = Annotated[bool, typer.Option("--no-contention", help="transfers never wait for a busy channel")]
NoOverlap = Annotated[bool, typer.Option("--no-overlap", help="blocking runtime: no compute while a device sends or receives")]
AsJson = Annotated[bool, typer.Option("--json", help="print the result as JSON")]


def parse_settings(pairs: list[str] | None) -> dict[str, object]:
    """``["waves=2", "memory_limit=4"]`` -> {"waves": 2, "memory_limit": 4}; numbers are
    converted, other values stay strings."""
    options: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PipeschedError(f"--set={pair!r}: write KEY=VALUE, e.g. --set memory_limit=6")
        options[key.strip().replace("-", "_")] = _number(value.strip())
    return options


def _number(text: str) -> object:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def slot_costs_option(value: object) -> StageCosts:
    """``--set costs=...``: ``F,I,W`` slot lengths, or a stage-cost CSV file."""
    text = str(value)
    if text.lower().endswith(".csv") or Path(text).is_file():
        from pipesched.io.stage_costs import load_stage_costs

        return load_stage_costs(text)
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
    try:
        value = float(text)
    except ValueError:
        raise PipeschedError(f"bandwidth={text[:40]!r}: not a number; give bytes/s like 2.5e10, or inf") from None
    if not value > 0 or math.isnan(value):
        raise PipeschedError(f"bandwidth={text[:40]}: must be > 0 bytes/s (use inf for free links)")
    return value


def workload(
    *,
    model: str | None = None,
    cluster: str | None = None,
    micro_batch_size: int | None = None,
    seq_len: int | None = None,
    tensor_parallel: int | None = None,
    recompute: str | None = None,
    partition: str | None = None,
    stage_costs: str | None = None,
    latency: float | None = None,
    bandwidth: str | None = None,
    no_contention: bool = False,
    no_overlap: bool = False,
    steady_state: bool = False,
) -> Point:
    """The template point the workload options ask for: a stage-cost file on uniform links,
    or a model on a cluster (each unset option from DEFAULTS)."""
    engine = {"contention": not no_contention, "overlap": not no_overlap, "latency": latency,
              "steady_state": steady_state}
    if stage_costs is not None:
        model_options = {"--model": model, "--cluster": cluster, "--tensor-parallel": tensor_parallel,
                         "--recompute": recompute, "--partition": partition}
        given = [name for name, value in model_options.items() if value is not None]
        if given:
            raise PipeschedError(f"{given[0].lstrip('-')}={model_options[given[0]]}: not with --stage-costs; "
                                 "give either a model and cluster or a stage-cost file")
        from pipesched.io.stage_costs import load_stage_costs

        costs = load_stage_costs(stage_costs)
        return Point(stage_costs=costs, micro_batch_size=micro_batch_size or DEFAULTS.micro_batch_size,
                     seq_len=seq_len or DEFAULTS.seq_len, bandwidth=parse_bandwidth(bandwidth), **engine)
    return Point(
        model=model or DEFAULTS.model,
        cluster=cluster or DEFAULTS.cluster,
        micro_batch_size=micro_batch_size if micro_batch_size is not None else DEFAULTS.micro_batch_size,
        seq_len=seq_len if seq_len is not None else DEFAULTS.seq_len,
        tp=tensor_parallel if tensor_parallel is not None else DEFAULTS.tensor_parallel,
        recompute=recompute or DEFAULTS.recompute,
        partition=partition or DEFAULTS.partition,
        bandwidth=parse_bandwidth(bandwidth),
        **engine,
    )
