"""A run decided while it runs: a policy picks what each idle device does next from the state
of the run, where a schedule's table fixes it in advance (continuous batching, request
admission: which requests join the next step is known only once they have arrived).

Work is a set of jobs (``Job``): a key, a release time (a request arrives at t), the keys
of the jobs it needs done first (a decode step needs the request's previous step), and the
bytes it takes on its device when it starts and gives back when it ends (a decode step
appends one token's KV cache; the request's last step frees the whole cache). The loop goes
from event to event (an arrival, the end of a launch). At each event time, once the
launches ending then have ended, it hands the policy a ``PolicyState`` (the time, the idle
devices, the jobs ready to run, the launches running, the bytes in use per device) when
some device is idle and some job is ready, and starts the launches the policy returns: a
``Launch(device, keys)`` runs those ready jobs together, as one op of ``duration(device,
jobs)`` on an idle device. The run is deterministic: ready jobs are listed by (release
time, order given), idle devices in index order, and the policy is asked once per event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from pipesched.errors import PipeschedError, require
from pipesched.limits import MAX_DEVICES, MAX_OPS


@dataclass(frozen=True)
class Job:
    """One unit of work a policy may launch (a request's prefill or one decode step)."""

    key: Hashable
    release: float = 0.0  # seconds: it may not start earlier (its request's arrival)
    needs: tuple[Hashable, ...] = ()  # keys of jobs that must have ended first
    alloc_bytes: float = 0.0  # device bytes taken when its launch starts
    free_bytes: float = 0.0  # device bytes given back when its launch ends


@dataclass(frozen=True)
class Launch:
    """Jobs (their keys) run together as one op on ``device``."""

    device: int
    keys: tuple[Hashable, ...]


@dataclass(frozen=True)
class Running:
    """A launch in progress: its jobs, device and times."""

    device: int
    jobs: tuple[Job, ...]
    start: float
    end: float


@dataclass(frozen=True)
class PolicyState:
    """What a policy sees at ``time``."""

    time: float
    idle: tuple[int, ...]  # devices running nothing, in index order
    ready: tuple[Job, ...]  # released, needs ended, not launched; by (release, order given)
    running: tuple[Running, ...]
    memory: tuple[float, ...]  # bytes in use per device


Policy = Callable[[PolicyState], Sequence[Launch]]
Duration = Callable[[int, tuple[Job, ...]], float]


@dataclass(frozen=True, eq=False)
class PolicyRun:
    """When each job ran (arrays in the order the jobs were given) and every launch."""

    jobs: tuple[Job, ...]
    start: np.ndarray  # float64 seconds
    end: np.ndarray  # float64 seconds
    device: np.ndarray  # int32
    launches: tuple[Running, ...]  # in start order
    peak_memory: tuple[float, ...]  # bytes per device

    @property
    def makespan(self) -> float:
        return float(self.end.max(initial=0.0))

    def times(self) -> dict[Hashable, tuple[float, float]]:
        """(start, end) of each job, by key."""
        return {job.key: (float(s), float(e)) for job, s, e in zip(self.jobs, self.start, self.end, strict=True)}


def first_come_first_served(state: PolicyState) -> list[Launch]:
    """Each idle device runs the earliest ready job, alone."""
    return [Launch(device, (job.key,)) for device, job in zip(state.idle, state.ready, strict=False)]


def batching(max_batch: int) -> Policy:
    """Continuous batching: each idle device runs up to ``max_batch`` of the earliest ready
    jobs together (a request joins the next step once it has arrived)."""
    require(max_batch >= 1, "max_batch", max_batch, "batch at least one job")

    def policy(state: PolicyState) -> list[Launch]:
        launches, ready = [], list(state.ready)
        for device in state.idle:
            if not ready:
                break
            launches.append(Launch(device, tuple(job.key for job in ready[:max_batch])))
            del ready[:max_batch]
        return launches

    return policy


def run_policy(policy: Policy, jobs: Sequence[Job], *, num_devices: int, duration: Duration) -> PolicyRun:
    """Run ``jobs`` on ``num_devices`` devices, the ``policy`` choosing every launch (see
    the module docstring). Raises PipeschedError when the policy launches a job that is not
    ready or on a busy device, or leaves jobs that can never run.

    Three requests arriving at 0, 1 and 1.5; a step of b requests takes 1 + b: the second
    and third join one batch once the first has run.

    >>> jobs = [Job("a", 0.0), Job("b", 1.0), Job("c", 1.5)]
    >>> run_policy(batching(2), jobs, num_devices=1, duration=lambda _d, batch: 1.0 + len(batch)).times()
    {'a': (0.0, 2.0), 'b': (2.0, 5.0), 'c': (2.0, 5.0)}
    """
    require(1 <= num_devices <= MAX_DEVICES, "devices", num_devices, f"give 1 to {MAX_DEVICES} devices")
    require(len(jobs) <= MAX_OPS, "jobs", len(jobs), f"at most {MAX_OPS:,} jobs in one run")
    loop = _Loop(tuple(jobs), num_devices, duration)
    time = 0.0
    while time is not None:
        loop.finish_until(time)
        state = loop.state(time)
        if state.idle and state.ready:
            for launch in policy(state):
                loop.start(launch, time)
        time = loop.next_event(time)
    return loop.result()


class _Loop:
    """The state of one policy run (see ``run_policy``)."""

    def __init__(self, jobs: tuple[Job, ...], num_devices: int, duration: Duration) -> None:
        self.jobs, self.duration = jobs, duration
        self.index = {job.key: k for k, job in enumerate(jobs)}
        require(len(self.index) == len(jobs), "jobs", "a repeated key", "give every job its own key")
        for job in jobs:
            unknown = [need for need in job.needs if need not in self.index]
            require(not unknown, "job", job.key, f"needs {unknown[0] if unknown else ''!r}, which is not a job")
            require(bool(np.isfinite(job.release)) and job.release >= 0, "release", job.release,
                    "a release time is a finite number of seconds >= 0")
        self.start_at = np.full(len(jobs), np.nan)
        self.end_at = np.full(len(jobs), np.nan)
        self.device = np.full(len(jobs), -1, np.int32)
        self.ended = np.zeros(len(jobs), np.bool_)
        self.running: list[Running] = []
        self.launches: list[Running] = []
        self.memory = [0.0] * num_devices
        self.peak = [0.0] * num_devices

    def state(self, time: float) -> PolicyState:
        busy = {run.device for run in self.running}
        idle = tuple(d for d in range(len(self.memory)) if d not in busy)
        ready = sorted((k for k, job in enumerate(self.jobs) if self._ready(k, time)),
                       key=lambda k: (self.jobs[k].release, k))
        return PolicyState(time, idle, tuple(self.jobs[k] for k in ready), tuple(self.running), tuple(self.memory))

    def _ready(self, k: int, time: float) -> bool:
        job = self.jobs[k]
        return (self.device[k] < 0 and job.release <= time
                and all(self.ended[self.index[need]] for need in job.needs))

    def start(self, launch: Launch, time: float) -> None:
        device = launch.device
        require(0 <= device < len(self.memory) and all(run.device != device for run in self.running),
                "launch device", device, "launch on an idle device (PolicyState.idle)")
        require(len(launch.keys) > 0, "launch", "no jobs", "launch one job or more")
        rows = [self.index.get(key, -1) for key in launch.keys]
        for key, k in zip(launch.keys, rows, strict=True):
            require(k >= 0 and self._ready(k, time), "launch job", key, "launch jobs of PolicyState.ready, once each")
        require(len(set(rows)) == len(rows), "launch job", "a repeated key", "launch each job once")
        jobs = tuple(self.jobs[k] for k in rows)
        seconds = float(self.duration(device, jobs))
        require(bool(np.isfinite(seconds)) and seconds >= 0, "duration", seconds, "a finite number of seconds >= 0")
        run = Running(device, jobs, time, time + seconds)
        self.running.append(run)
        self.launches.append(run)
        self.start_at[rows], self.end_at[rows], self.device[rows] = time, run.end, device
        self.memory[device] += sum(job.alloc_bytes for job in jobs)
        self.peak[device] = max(self.peak[device], self.memory[device])

    def finish_until(self, time: float) -> None:
        """End every launch that ends at or before ``time``."""
        for run in [run for run in self.running if run.end <= time]:
            self.running.remove(run)
            self.ended[[self.index[job.key] for job in run.jobs]] = True
            self.memory[run.device] -= sum(job.free_bytes for job in run.jobs)

    def next_event(self, time: float) -> float | None:
        """The next end or arrival after ``time``; None when every job has ended."""
        times = [run.end for run in self.running]
        times += [job.release for k, job in enumerate(self.jobs) if self.device[k] < 0 and job.release > time]
        if times:
            return min(times)
        if not self.ended.all():
            waiting = next(job.key for k, job in enumerate(self.jobs) if self.device[k] < 0)
            raise PipeschedError(f"job={waiting!r}: the policy left it waiting with nothing left to run or arrive; "
                                 "launch every ready job eventually")
        return None

    def result(self) -> PolicyRun:
        return PolicyRun(self.jobs, self.start_at, self.end_at, self.device, tuple(self.launches), tuple(self.peak))
