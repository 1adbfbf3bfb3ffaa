"""Real runs of schedules: choose a runtime, launch the ranks, and turn what they recorded
into measured Timelines and step times.

Step time: the makespan of a step's measured timeline (first op start to last op or
gradient all-reduce end, over all ranks), the same definition as the simulator's
``Timeline.makespan``. A run reports its median step (after warm-up): the measured step
whose time is the median, the lower of the two middle ones for an even number of steps, so
the step time reported is the time of the step whose timeline is kept and drawn.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require
from pipesched.limits import (
    MAX_MICRO_BATCH_SIZE,
    MAX_REPEATS,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    check_amount,
    check_count,
)
from pipesched.model import layer_params
from pipesched.model.spec import ModelSpec
from pipesched.partition import Partition, uniform
from pipesched.passes.communication import with_communication
from pipesched.rules import COMPUTE
from pipesched.runtime.launch import Fault, LaunchSpec, StatusCallback, launch
from pipesched.runtime.measure import (
    ELEMENT_BYTES,
    RankStep,
    StageTiming,
    measured_timeline,
    order_mismatch,
)
from pipesched.runtime.torch_import import require_torch
from pipesched.schedule import Schedule
from pipesched.timeline import MeasuredInfo, Timeline, median_step
from pipesched.units import GiB
from pipesched.validation import validate

BACKENDS = ("gloo", "nccl")
RUNTIMES = ("auto", "pytorch", "ours")
RUNTIME_DTYPES = ("float32", "float64", "bfloat16")
GLOO_RANKS_PER_CORE = 4  # most gloo ranks one CPU core may host
PROFILE_WARMUP = 3  # untimed repeats before the profile phase's timed ones


@dataclass(frozen=True)
class RunOptions:
    """How schedules are run for real."""

    micro_batch_size: int = DEFAULTS.run_micro_batch_size  # b, sequences per microbatch
    seq_len: int = DEFAULTS.run_seq_len  # s, tokens per sequence
    dtype: str = DEFAULTS.run_dtype  # runtime dtype: float32, float64 or bfloat16
    backend: str = "gloo"  # gloo (CPU ranks) or nccl (one GPU per rank)
    steps: int = DEFAULTS.run_steps  # measured steps
    warmup: int = DEFAULTS.run_warmup  # steps run first and not measured
    seed: int = 0  # weights and data
    timeout_s: float = DEFAULTS.run_timeout  # the whole launch, seconds; then every rank is killed
    threads: int = 1  # torch threads per rank
    pin_cpus: bool = True  # pin rank r to core r when the machine has a core per rank
    collect_grads: bool = False  # return the gradients of the last step (tests)
    # > 0: every rank also times the ops of its own stages in isolation, this many rounds (after
    # PROFILE_WARMUP untimed ones), all ranks at once, spread between the measured steps so
    # the profile sees the machine as the steps do; see RunResult.stage_timings
    profile_repeats: int = 0

    def __post_init__(self) -> None:
        for name, limit in (("micro_batch_size", MAX_MICRO_BATCH_SIZE), ("seq_len", MAX_SEQ_LEN),
                            ("steps", MAX_REPEATS), ("threads", MAX_THREADS)):
            check_count(name, getattr(self, name), limit)
        check_count("warmup", self.warmup, MAX_REPEATS, minimum=0)
        check_count("profile_repeats", self.profile_repeats, MAX_REPEATS, minimum=0)
        require(self.dtype in RUNTIME_DTYPES, "dtype", self.dtype, f"must be one of {', '.join(RUNTIME_DTYPES)}")
        require(self.backend in BACKENDS, "backend", self.backend,
                "must be gloo (CPU) or nccl (one GPU per rank)")
        check_amount("timeout", self.timeout_s, limit=MAX_TIMEOUT_S, above_minimum=True, unit="seconds")


@dataclass(frozen=True)
class RunJob:
    """One schedule to run: its partition of the model's layers and the runtime."""

    schedule: Schedule
    partition: Partition
    runtime: str  # "pytorch" or "ours"


@dataclass(frozen=True)
class PipelineTask:
    """What every rank of a pipeline launch receives."""

    model: ModelSpec
    jobs: tuple[RunJob, ...]
    options: RunOptions


@dataclass
class RankJobResult:
    """What one rank sends back for one job."""

    steps: list[RankStep]  # the measured steps
    losses: dict[int, float]  # microbatch -> loss, last step (ranks holding the last stage)
    grads: dict[str, np.ndarray] | None = None  # parameter -> gradient, last step
    profile: dict[tuple[int, int], StageTiming] | None = None  # (stage, replica) -> its timing


@dataclass(frozen=True)
class RunResult:
    """A schedule run for real."""

    schedule: Schedule
    runtime: str  # "pytorch" or "ours"
    backend: str
    step_times: tuple[float, ...]  # seconds, each measured step
    timeline: Timeline  # the median step (source "measured", unit "s"; see the module docstring)
    timelines: tuple[Timeline, ...]  # every measured step
    losses: tuple[float, ...]  # per microbatch, last step
    grads: dict[str, np.ndarray] | None = field(default=None, compare=False)
    # profile phase (RunOptions.profile_repeats): stage -> the timing of each of its copies
    stage_timings: dict[int, tuple[StageTiming, ...]] | None = field(default=None, compare=False)

    @property
    def step_time(self) -> float:
        """The median step's time, seconds (see the module docstring)."""
        return float(self.step_times[median_step(self.step_times)])

    def to_dict(self, model_name: str) -> dict:
        """The JSON shape of ``pipesched run --json``."""
        schedule = self.schedule
        return {
            "schedule": schedule.name, "p": schedule.num_devices, "m": schedule.num_microbatches,
            "num_stages": schedule.num_stages, "model": model_name, "runtime": self.runtime,
            "backend": self.backend, "partition": self.timeline.measured.partition,
            "step_time_s": self.step_time, "step_times_s": list(self.step_times),
            "loss": self.loss, "losses": list(self.losses),
            "timeline": timeline_records(self.timeline),
        }

    @property
    def loss(self) -> float:
        """Mean microbatch loss of the last step."""
        return float(np.mean(self.losses))


def stage_partition(model: ModelSpec, num_stages: int, partition: Partition | None = None) -> Partition:
    """The given partition (checked) or the uniform one: equal blocks, embedding first, head last."""
    if partition is None:
        return uniform(model.layer_kinds, num_stages)
    require(partition.num_stages == num_stages, "partition", partition,
            f"has {partition.num_stages} stages; the schedule has {num_stages}")
    require(partition.num_layers == model.num_cost_layers, "partition", partition,
            f"covers {partition.num_layers} layers; {model.name} has {model.num_cost_layers}")
    require(all(size > 0 for size in partition.sizes), "partition", partition,
            "has an empty stage; a real run needs at least one layer per stage")
    return partition


def capacity_problem(num_ranks: int, backend: str) -> str | None:
    """Why this machine cannot host ``num_ranks`` ranks on ``backend`` (what it has), or None."""
    if backend == "gloo":
        cores = len(os.sched_getaffinity(0))
        limit = cores * GLOO_RANKS_PER_CORE
        if num_ranks > limit:
            return f"this machine has {cores} CPU cores and hosts at most {limit} gloo ranks ({GLOO_RANKS_PER_CORE} per core)"
        return None

    torch = require_torch()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if num_ranks > gpus:
        return f"the nccl backend needs one GPU per rank and this machine has {gpus}"
    return None


def check_capacity(num_ranks: int, backend: str) -> None:
    """Refuse before launching when the machine cannot host ``num_ranks`` ranks."""
    problem = capacity_problem(num_ranks, backend)
    if problem is not None:
        fix = "use fewer ranks" if backend == "gloo" else "use fewer ranks or --backend gloo"
        raise PipeschedError(f"p={num_ranks}: {problem}; {fix}")


def weight_bytes_per_rank(model: ModelSpec, schedule: Schedule, partition: Partition, dtype: str) -> list[float]:
    """The least memory each rank of a real run needs, bytes: the weights and gradients of
    the stages it holds (every replica's), in the runtime dtype. Activations, buffers and
    the interpreter come on top."""
    params = layer_params(model)
    per_stage = [sum(params[i] for i in partition.layers(stage)) for stage in range(partition.num_stages)]
    need = [0.0] * schedule.num_devices
    for replica in schedule.placement.replicas:
        for stage, device in enumerate(replica):
            need[device] += 2 * ELEMENT_BYTES[dtype] * per_stage[stage]
    return need


def host_memory_available() -> float | None:
    """Bytes this machine can still give (Linux: MemAvailable, within a cgroup's limit)."""
    try:
        meminfo = Path("/proc/meminfo").read_text(encoding="utf-8")
    except OSError:
        return None
    available = next((float(line.split()[1]) * 1024 for line in meminfo.splitlines()
                      if line.startswith("MemAvailable:")), None)
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit, used = ((cgroup / name).read_text(encoding="utf-8").strip() for name in ("memory.max", "memory.current"))
        if limit.isdigit() and used.isdigit():
            room = float(limit) - float(used)
            available = room if available is None else min(available, room)
    except OSError:
        pass
    return available


def memory_problem(need: Sequence[float], backend: str) -> str | None:
    """Why the ranks cannot hold ``need`` bytes each on this machine (what it has), or None."""
    if backend == "gloo":
        available = host_memory_available()
        total = sum(need)
        if available is not None and total > available:
            return (f"its {len(need)} ranks need at least {total / GiB:,.1f} GiB for weights and gradients "
                    f"and this machine has {available / GiB:,.1f} GiB available")
        return None

    torch = require_torch()
    for rank, nbytes in enumerate(need):
        if rank < torch.cuda.device_count():
            capacity = torch.cuda.get_device_properties(rank).total_memory
            if nbytes > capacity:
                return (f"rank {rank} needs at least {nbytes / GiB:,.1f} GiB for weights and gradients "
                        f"and GPU {rank} has {capacity / GiB:,.1f} GiB")
    return None


def check_memory(model: ModelSpec, jobs: Sequence[tuple[Schedule, Partition]], options: RunOptions) -> None:
    """Refuse before launching when the ranks' weights and gradients cannot fit."""
    for schedule, partition in jobs:
        problem = memory_problem(weight_bytes_per_rank(model, schedule, partition, options.dtype), options.backend)
        if problem is not None:
            raise PipeschedError(f"model={model.name}: {problem}; use a smaller model (tiny, small), more ranks "
                                 f"or a smaller dtype")


def choose_runtime(schedule: Schedule, runtime: str) -> str:
    """``pytorch`` or ``ours`` for this schedule; raises when the requested one cannot run it.

    auto: PyTorch's runtime where it can express the schedule, ours otherwise.
    """
    require(runtime in RUNTIMES, "runtime", runtime, f"must be one of {', '.join(RUNTIMES)}")
    problems = validate(schedule)
    if problems:
        raise PipeschedError(
            f"schedule={schedule.name}: neither runtime can run it: the table is invalid ({problems[0]}); "
            "run `pipesched validate` for the report"
        )

    with_communication(schedule)
    if runtime == "ours":
        return "ours"
    from pipesched.runtime.pytorch_runtime import pytorch_limitation

    reason = pytorch_limitation(schedule)
    if reason is None:
        return "pytorch"
    if runtime == "pytorch":
        raise PipeschedError(f"schedule={schedule.name}: PyTorch's runtime cannot run it: {reason}; "
                             "use --runtime ours (or auto)")
    return "ours"


def check_runnable(schedule: Schedule) -> None:
    """Raise PipeschedError when a real run cannot execute ``schedule``: it trains every
    stage, keeps activations on the device, flushes every step, runs whole microbatches and
    checkpoints no stage."""
    require(not schedule.frozen, "schedule", schedule.name,
            "has frozen stages, which real runs do not execute yet; run the table without freezing")
    require(all(schedule.rules[op.kind].stream == COMPUTE for _, op in schedule.ops()), "schedule", schedule.name,
            "offloads activations, which real runs do not execute yet; run the table without offload ops")
    require(not schedule.execution.asynchronous, "schedule", schedule.name,
            "an asynchronous pipeline has no flushed step to run for real (its weights would need versions the "
            "runtime does not keep); run pipedream-flush, its synchronous baseline, or simulate it")
    require(schedule.microbatch_fraction == 1.0 and not schedule.execution.microbatch_scales, "schedule",
            schedule.name, "runs microbatches of part of a sequence (Chimera's backward halving, TeraPipe's token "
            "slices), which a real run does not split; run forward doubling with twice -m and half -b, or "
            "simulate it")
    require(not schedule.recompute_stages, "schedule", schedule.name,
            "checkpoints stages (execution.recompute_stages), which real runs do not execute yet; run the table "
            "without them (synthesize without --allow-recompute)")


def run_schedules(schedules: Sequence[Schedule], model: ModelSpec, *, options: RunOptions | None = None,
                  runtime: str = "auto", partitions: Sequence[Partition | None] | None = None,
                  fault: Fault | None = None, on_status: StatusCallback | None = None) -> list[RunResult]:
    """Run each schedule for real, one after the other in a single launch of P ranks.

    All schedules must have the same number of devices P. ``partitions[i]`` fixes schedule
    i's layer partition (default: uniform). ``fault`` injects a crash, hang or kill (tests).
    ``on_status`` receives status lines while the ranks run (see ``launch``).
    """
    options = options or RunOptions()
    require(len(schedules) >= 1, "schedules", 0, "give at least one schedule")
    num_ranks = schedules[0].num_devices
    for schedule in schedules:
        require(schedule.num_devices == num_ranks, "schedule", schedule.name,
                f"has {schedule.num_devices} devices; every schedule of one run needs {num_ranks}")
        check_runnable(schedule)

    require_torch()

    from pipesched.runtime.torch_model import check_buildable

    check_buildable(model)
    check_capacity(num_ranks, options.backend)
    given = list(partitions) if partitions is not None else [None] * len(schedules)
    require(len(given) == len(schedules), "partitions", len(given), f"give one per schedule ({len(schedules)})")
    chosen = [stage_partition(model, schedule.num_stages, partition)
              for schedule, partition in zip(schedules, given, strict=True)]
    check_memory(model, list(zip(schedules, chosen, strict=True)), options)  # before any rank starts
    jobs = tuple(RunJob(schedule, partition, choose_runtime(schedule, runtime))
                 for schedule, partition in zip(schedules, chosen, strict=True))
    spec = LaunchSpec(handler="pipeline", task=PipelineTask(model, jobs, options), world_size=num_ranks,
                      backend=options.backend, timeout_s=options.timeout_s, threads=options.threads,
                      pin_cpus=options.pin_cpus and options.backend == "gloo", fault=fault)
    per_rank: list[list[RankJobResult]] = launch(spec, describe=[job.schedule.name for job in jobs],
                                                 on_status=on_status)
    return [_assemble(job, [ranks[j] for ranks in per_rank], options) for j, job in enumerate(jobs)]


def _assemble(job: RunJob, ranks: list[RankJobResult], options: RunOptions) -> RunResult:
    schedule = job.schedule
    empty = np.zeros(0)
    info = MeasuredInfo(runtime=job.runtime, backend=options.backend, partition=str(job.partition),
                        dtype=options.dtype, micro_batch_size=options.micro_batch_size, seq_len=options.seq_len,
                        step=0, op_wait_s=empty, op_cpu_s=empty)
    timelines = tuple(
        measured_timeline(schedule, [rank.steps[i] for rank in ranks], info=dataclasses.replace(info, step=i))
        for i in range(options.steps)
    )
    for timeline in timelines:
        mismatch = order_mismatch(schedule, timeline)
        if mismatch is not None:
            raise PipeschedError(f"schedule={schedule.name}: the {job.runtime} runtime ran ops out of table order ({mismatch})")
    times = tuple(t.makespan for t in timelines)
    # each step's timeline knows the run's other steps (the HTML report shows their spread)
    timelines = tuple(dataclasses.replace(t, measured=dataclasses.replace(t.measured, step_times_s=times))
                      for t in timelines)
    losses: dict[int, float] = {}
    grads: dict[str, np.ndarray] | None = {} if options.collect_grads else None
    timings: dict[int, list[StageTiming]] | None = {} if options.profile_repeats else None
    for rank in ranks:
        losses.update(rank.losses)
        if grads is not None and rank.grads:
            grads.update(rank.grads)
        if timings is not None and rank.profile:
            for (stage, _), timing in sorted(rank.profile.items()):
                timings.setdefault(stage, []).append(timing)
    return RunResult(
        schedule=schedule,
        runtime=job.runtime,
        backend=options.backend,
        step_times=times,
        timeline=timelines[median_step(times)],
        timelines=timelines,
        losses=tuple(losses[mb] for mb in sorted(losses)),
        grads=grads,
        stage_timings=None if timings is None else {stage: tuple(t) for stage, t in sorted(timings.items())},
    )


def timeline_records(timeline: Timeline) -> list[dict]:
    """Every op of a timeline as a JSON-ready dict, in the timeline's row order (with the
    time each measured op waited before it ran)."""
    waits = timeline.measured.op_wait_s if timeline.measured is not None else None
    return [
        {"device": int(timeline.op_device[row]), "op": str(timeline.op(row)),
         "start_s": float(timeline.op_start[row]), "end_s": float(timeline.op_end[row]),
         **({"wait_s": float(waits[row])} if waits is not None else {})}
        for row in range(len(timeline))
    ]
