"""What a rank process does, by handler name: run pipeline jobs (with an optional profile
phase), time layers in isolation, or measure the link between two ranks. Runs inside
``pipesched.runtime.worker`` after the process group is up."""

from __future__ import annotations

import itertools
import time

from pipesched.io import torch_csv
from pipesched.runtime.collective_profile import run_collectives
from pipesched.runtime.executor import Executor, RankSetup, hosted_modules, replicated_stages
from pipesched.runtime.gpu import CudaRecorder
from pipesched.runtime.launch import LaunchSpec, RankContext
from pipesched.runtime.measure import HostRecorder
from pipesched.runtime.runs import PROFILE_WARMUP, PipelineTask, RankJobResult, RunJob, RunOptions
from pipesched.runtime.serve_worker import run_serve
from pipesched.runtime.torch_import import require_torch
from pipesched.runtime.torch_model import build_stage, make_batch, torch_dtype

torch = require_torch()
dist = torch.distributed


def _device(spec: LaunchSpec, rank: int) -> torch.device:
    if spec.backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _recorder(spec: LaunchSpec, rank: int):
    if spec.backend == "nccl":
        return CudaRecorder(rank)
    return HostRecorder(rank)


def run_pipeline(spec: LaunchSpec, context: RankContext) -> list[RankJobResult]:
    """Run every job of the task; each: warm-up steps, then measured steps."""
    rank = context.rank
    task: PipelineTask = spec.task
    options = task.options
    device = _device(spec, rank)
    dtype = torch_dtype(options.dtype)
    # the step barrier goes over gloo even with NCCL p2p, so host clocks line up
    control = dist.new_group(backend="gloo") if spec.backend == "nccl" else None
    results = []
    for index, job in enumerate(task.jobs):
        results.append(_run_job(spec, context, index, job, device, dtype, control))
    return results


def _run_job(spec: LaunchSpec, context: RankContext, index: int, job: RunJob, device, dtype,
             control) -> RankJobResult:
    rank = context.rank
    task: PipelineTask = spec.task
    options = task.options
    schedule = job.schedule
    modules = {
        (stage, replica): build_stage(task.model, job.partition.layers(stage), seed=options.seed, dtype=dtype, device=device)
        for stage, replica in hosted_modules(schedule, rank)
    }
    batch = make_batch(task.model, microbatches=schedule.num_microbatches, micro_batch_size=options.micro_batch_size,
                       seq_len=options.seq_len, seed=options.seed, device=device)
    # every rank creates every pair group, in the same order (new_group is collective)
    replicated = replicated_stages(schedule)
    reduce_groups = {stage: dist.new_group(list(pair), backend=spec.backend)
                     for stage, pair in sorted(replicated.items())}
    setup = RankSetup(
        schedule=schedule, rank=rank, modules=modules, batch=batch,
        boundary_shape=(options.micro_batch_size, options.seq_len, task.model.hidden_size),
        dtype=dtype, device=device, recorder=_recorder(spec, rank),
        before_op=context.before_op(index),
        reduce_groups={stage: group for stage, group in reduce_groups.items() if rank in replicated[stage]},
    )
    timers = _stage_timers(setup, options) if options.profile_repeats else {}
    rounds = -(-options.profile_repeats // options.steps)  # profile rounds before each measured step
    if job.runtime == "pytorch":
        from pipesched.runtime.pytorch_runtime import PyTorchRunner

        csv_path = context.folder / f"job{index}-rank{rank}.csv"
        csv_path.write_text(torch_csv.dumps(schedule), encoding="utf-8")
        runner = PyTorchRunner(setup, csv_path)
    else:
        runner = Executor(setup)
    steps = []
    losses: dict[int, float] = {}
    for step in range(options.warmup + options.steps):
        if timers and step >= options.warmup:
            _profile_round(timers, rounds, control)
        dist.barrier(group=control)
        record, losses = runner.step(step)
        if step >= options.warmup:
            steps.append(record)
    grads = None
    if options.collect_grads:
        grads = {}
        for module in modules.values():
            for name, grad in module.named_grads().items():
                if grad is not None:
                    grads[name] = grad.detach().double().cpu().numpy()
    dist.barrier(group=control)
    for group in reduce_groups.values():
        dist.destroy_process_group(group)
    profile = {key: timer.timing() for key, timer in timers.items()} if timers else None
    return RankJobResult(steps=steps, losses=losses, grads=grads, profile=profile)


def _stage_timers(setup: RankSetup, options: RunOptions) -> dict:
    """A warmed-up timer for each stage copy on this rank (the profile phase's start)."""
    from pipesched.runtime.layer_timing import StageTimer

    last = setup.schedule.num_stages - 1
    timers = {}
    for (stage, replica), module in sorted(setup.modules.items()):
        timer = StageTimer(module, first=stage == 0, last=stage == last, tokens=setup.batch.tokens[0],
                           targets=setup.batch.targets[0], hidden_shape=setup.boundary_shape, seed=options.seed)
        timer.sample(PROFILE_WARMUP, record=False)
        module.zero_grad(set_to_none=True)
        timers[(stage, replica)] = timer
    return timers


def _profile_round(timers: dict, rounds: int, control) -> None:
    """Time this rank's stages in isolation between two measured steps, all ranks at once.
    Every round is recorded: keeping only the rounds that fit some time window would favor
    the fast ones."""
    dist.barrier(group=control)
    for timer in timers.values():
        timer.sample(rounds)
        timer.module.zero_grad(set_to_none=True)


# --- point-to-point latency and bandwidth ---------------------------------------------------
def run_p2p(spec: LaunchSpec, context: RankContext) -> dict:
    """Ranks 0 and 1 exchange a message of each size, both directions at once (as a
    pipeline's activations and gradients cross in its steady state, and as replicas trade
    gradients); the fastest exchange of each size is its one-way time.

    Returns {"sizes": bytes, "one_way_s": seconds} on rank 0 (empty elsewhere).
    """
    rank = context.rank
    sizes, repeats = spec.task["sizes"], spec.task["repeats"]
    device = _device(spec, rank)
    peer = 1 - rank
    times = []
    for index, size in enumerate(sizes):
        context.progress.update(0, index, 0)
        mine = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        theirs = torch.empty_like(mine)
        samples = []
        for repeat in range(repeats + 2):
            dist.barrier()
            begun = time.perf_counter_ns()
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
            for work in works:
                work.wait()
            if spec.backend == "nccl":
                torch.cuda.synchronize()
            if repeat >= 2:  # the first two exchanges set up the connection
                samples.append((time.perf_counter_ns() - begun) * 1e-9)
        times.append(min(samples))
    return {"sizes": list(sizes), "one_way_s": times} if rank == 0 else {}


# --- layer and stage timing ------------------------------------------------------------------
def run_profile(spec: LaunchSpec, context: RankContext) -> list:
    """Time runs of layers in isolation; with several ranks, all at the same time."""
    from pipesched.runtime.layer_timing import time_ranges

    _device(spec, context.rank)
    timed = itertools.count()

    def sync() -> None:  # before each run of layers: say which, then start with the other ranks
        context.progress.update(0, next(timed), 0)
        dist.barrier()

    return time_ranges(spec.task, rank=context.rank, sync=sync)


HANDLERS = {"pipeline": run_pipeline, "p2p": run_p2p, "profile": run_profile, "serve": run_serve,
            "collectives": run_collectives}
