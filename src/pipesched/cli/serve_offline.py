"""`pipesched serve offline`: a fixed block of sequences run to its end with weights, KV cache
and activations placed across device memory, host memory and disk (FlexGen's block
schedule), or the placement with the most tokens per second (--optimize)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from pipesched.cli.groups import given_or
from pipesched.cli.options import AsJson, OptionGroup, command
from pipesched.cli.output import console as output_console
from pipesched.cli.output import print_json
from pipesched.cli.views import ViewPaths
from pipesched.defaults import DEFAULTS
from pipesched.errors import require
from pipesched.model import load_cluster, load_device, load_model
from pipesched.units import GB

# the offloading model, its search and its timeline load when the command runs (not with `serve`)
if TYPE_CHECKING:
    from pipesched.serving.offload import OfflineRun, OffloadPolicy

OfflineModel = Annotated[str | None, typer.Option(
    "--model", help=f"model preset, config.json or YAML/CSV model file [default: {DEFAULTS.offline_model}]")]
OfflineDevice = Annotated[str | None, typer.Option(
    "--device", help=f"device preset, with its host memory and disk [default: {DEFAULTS.offline_device}]")]
OfflineCluster = Annotated[str | None, typer.Option(
    "--cluster", help="cluster preset or YAML file whose first device runs the block (instead of --device)")]
_SHARES = "percentages G,C,D in device memory, host memory and disk, summing to 100"
Weights = Annotated[str | None, typer.Option(
    "--weights", help=f"the weights' {_SHARES} (each tensor whole on one tier) [default: {DEFAULTS.offline_weights}]")]
Cache = Annotated[str | None, typer.Option(
    "--cache", help=f"the KV cache's {_SHARES} [default: {DEFAULTS.offline_cache}]")]
Activations = Annotated[str | None, typer.Option(
    "--activations", help=f"the hidden states' {_SHARES} [default: {DEFAULTS.offline_activations}]")]
GpuBatch = Annotated[int | None, typer.Option(
    "--gpu-batch", help=f"sequences of one GPU batch [default: {DEFAULTS.offline_gpu_batch}]")]
NumBatches = Annotated[int | None, typer.Option(
    "--num-batches", help=f"GPU batches of the block (it holds gpu-batch x num-batches sequences) "
                          f"[default: {DEFAULTS.offline_num_batches}]")]
PromptLen = Annotated[int | None, typer.Option(
    "--prompt-len", help=f"prompt tokens of every sequence [default: {DEFAULTS.offline_prompt_len}]")]
GenLen = Annotated[int | None, typer.Option(
    "--gen-len", help=f"tokens generated for every sequence [default: {DEFAULTS.offline_gen_len}]")]
Optimize = Annotated[bool, typer.Option(
    "--optimize", help="choose the placement, gpu batch and batch count with the most tokens/s that fit (a grid "
                       "search with the block schedule's cost); not with --weights, --cache, --activations, "
                       "--gpu-batch, --num-batches")]
NoHostAttention = Annotated[bool, typer.Option(
    "--no-host-attention", help="bring the host's share of the KV cache to the device for attention instead of "
                                "attending over it on the host (FlexGen's compute delegation)")]
NoOverlap = Annotated[bool, typer.Option(
    "--no-overlap", help="run each step's loads, stores and compute one after another (FlexGen's --overlap False)")]


@dataclass(frozen=True)
class OfflinePolicyOptions(OptionGroup):
    """The placement and the block's shape asked for (None: the default, or --optimize's)."""

    weights: Weights = None
    cache: Cache = None
    activations: Activations = None
    gpu_batch: GpuBatch = None
    num_batches: NumBatches = None
    optimize: Optimize = False
    no_host_attention: NoHostAttention = False
    no_overlap: NoOverlap = False

    def policy(self) -> OffloadPolicy:
        """The policy asked for, each unset field its default."""
        from pipesched.serving.offload import OffloadPolicy, TierShares

        return OffloadPolicy(
            TierShares.parse("weights", self.weights or DEFAULTS.offline_weights),
            TierShares.parse("cache", self.cache or DEFAULTS.offline_cache),
            TierShares.parse("activations", self.activations or DEFAULTS.offline_activations),
            gpu_batch=given_or(self.gpu_batch, DEFAULTS.offline_gpu_batch),
            num_batches=given_or(self.num_batches, DEFAULTS.offline_num_batches),
            host_attention=not self.no_host_attention, overlap=not self.no_overlap)

    def check(self) -> OfflinePolicyOptions:
        given = [name for name in ("weights", "cache", "activations", "gpu_batch", "num_batches")
                 if getattr(self, name) is not None]
        require(not (self.optimize and given), given[0].replace("_", "-") if given else "optimize",
                getattr(self, given[0]) if given else "", "--optimize chooses it; drop one or the other")
        return self


def print_offline(run: OfflineRun, console: Console, *, note: str = "") -> None:
    """The run in a few lines: block, placement, times, throughput, memory per tier, busy streams."""
    policy = run.policy
    lines = [
        f"{run.model} on {run.device}: {run.sequences:,} sequences ({policy.gpu_batch} x {policy.num_batches} GPU "
        f"batches) of {run.task.prompt_len} prompt + {run.task.gen_len} generated tokens{note}",
        f"placement (device, host, disk %): weights {policy.weights} (as placed: {run.weights_placed}), "
        f"cache {policy.cache}, activations {policy.activations}; host attention "
        f"{'on' if run.delegated else 'off'}, overlap {'on' if policy.overlap else 'off'}",
        f"time: prefill {run.prefill_s:,.2f} s + decode {run.decode_s:,.2f} s = {run.total_s:,.2f} s",
        f"throughput: {run.throughput_tokens_per_s:,.3f} generated tokens/s",
        "peak memory: " + "; ".join(f"{name} {peak / GB:,.2f} of {cap / GB:,.1f} GB" for name, peak, cap in
                                    zip(("device", "host", "disk"), run.peak_bytes, run.capacity_bytes, strict=True)),
        "busy: " + ", ".join(f"{name} {seconds / run.total_s:.0%}" for name, seconds in run.busy_s.items()
                             if seconds > 0),
    ]
    for line in lines:
        console.print(line, highlight=False, markup=False)


@command
def offline_command(*, policy: OfflinePolicyOptions, views: ViewPaths, model: OfflineModel = None,
                    device: OfflineDevice = None, cluster: OfflineCluster = None, prompt_len: PromptLen = None,
                    gen_len: GenLen = None, as_json: AsJson = False) -> None:
    """Run a block of sequences to its end, offloading to host memory and disk: FlexGen's zig-zag
    block schedule (unit by unit across the GPU batches, each step overlapping the next
    unit's weight load, the next batch's cache and hidden-state load, the previous batch's
    store and the compute); tokens/s, prefill and decode time, peak memory per tier; --optimize
    chooses the placement and block; --html / --png / --perfetto draw the first tokens.

    \b
    Examples:
      pipesched serve offline
      pipesched serve offline --model opt-30b --weights 20,80,0 --cache 0,100,0 --activations 0,100,0 --gpu-batch 48 --num-batches 3
      pipesched serve offline --model opt-175b --optimize --json
    """
    from pipesched.serving.offload import OfflineTask, offline_units
    from pipesched.serving.offload_timeline import offline_timeline, view_tokens

    require(device is None or cluster is None, "cluster", cluster, "give --device or --cluster, not both")
    policy.check()
    views.check()
    spec = load_model(model or DEFAULTS.offline_model)
    hardware = load_cluster(cluster).devices[0] if cluster else load_device(device or DEFAULTS.offline_device)
    task = OfflineTask(given_or(prompt_len, DEFAULTS.offline_prompt_len), given_or(gen_len, DEFAULTS.offline_gen_len))
    run, note = _offline_run(policy, spec, hardware, task)
    if views.any:
        tokens = view_tokens(run, len(offline_units(spec, hardware, task, run.policy.gpu_batch)))
        views.write([offline_timeline(spec, hardware, run)],
                    title=f"serve offline: {run.model} on {run.device}, the first {tokens} of {task.gen_len} tokens")
    if as_json:
        print_json(run.to_dict())
    else:
        print_offline(run, output_console(), note=note)


def _offline_run(policy: OfflinePolicyOptions, spec, hardware, task) -> tuple:
    """The run of the placement asked for, or of the one ``--optimize`` finds (with a note of
    how many it tried)."""
    from pipesched.serving.offload import offline_run
    from pipesched.serving.offload_search import optimize_policy

    if not policy.optimize:
        return offline_run(spec, hardware, task, policy.policy()), ""
    found = optimize_policy(spec, hardware, task, host_attention=not policy.no_host_attention,
                            overlap=not policy.no_overlap)
    return found.run, f"; --optimize: best of {found.feasible:,} fitting of {found.evaluated:,} tried"

