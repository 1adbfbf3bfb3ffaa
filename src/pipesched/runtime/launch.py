"""Start P rank processes on this machine, watch them, and never leave one behind.

Each rank is ``python -m pipesched.runtime.worker`` in a session (process group) of its
own, so it and anything it starts can be killed together. The ranks meet through a
``FileStore`` in a private temporary folder (no port to pick), read their task from a
pickle there, report progress in a small shared file, and leave either a result pickle or
a one-line error. The launcher:

- returns the ranks' results when every rank exits cleanly;
- on the first rank that fails, waits a moment for the others to report, kills every
  process group, and raises a PipeschedError naming the cause: a rank killed by a signal
  (the out-of-memory killer, a user) before any other, else the earliest error reported
  (later ones are usually peers losing their connection);
- after ``timeout_s``, kills every process group and raises a PipeschedError saying where
  each unfinished rank was (step, op), which names a hang or a deadlock;
- when it is itself terminated (SIGTERM or SIGHUP: ``timeout``, a closed terminal, a job
  scheduler) or interrupted (Ctrl-C), kills every process group before it exits. A
  launcher killed outright (SIGKILL) takes its ranks with it too: each rank asks the
  kernel to kill it when its parent dies (Linux), and exits at once if the launcher is gone
  before it asked. The folder it leaves behind then is removed by the next launch.

Torch is not imported here: the parent process only starts and watches.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipesched.errors import PipeschedError, require

POLL_S = 0.02  # seconds between checks of the rank processes
STATUS_EVERY_S = 0.5  # seconds between status reports to ``on_status``
GRACE_S = 1.0  # seconds the other ranks get to report after the first failure
KILL_WAIT_S = 5.0  # seconds to wait for a killed process to be reaped
PROGRESS_FIELDS = 4  # per rank: job, step, op position, 1 while running
_PROGRESS_FORMAT = "<" + "q" * PROGRESS_FIELDS
PROGRESS_BYTES = struct.calcsize(_PROGRESS_FORMAT)
FAULTS = ("crash", "hang", "kill")
FOLDER_PREFIX = "pipesched-run-"
OWNER_FILE = "launcher"  # in the run folder: "PID START" of the launcher that made it
LAUNCHER_PID_VARIABLE = "PIPESCHED_LAUNCHER_PID"
HANG_S = 3600.0  # how long an injected hang sleeps (the launcher's timeout ends it first)
MESSAGE_CHARS = 400  # characters of a rank's error report
# what an error says, in lower case, when memory ran out: PyTorch's CUDA and CPU allocators,
# the C++ and C libraries (ENOMEM), Python's MemoryError
MEMORY_MARKERS = ("out of memory", "outofmemory", "cannot allocate memory", "can't allocate memory",
                  "failed to allocate", "bad_alloc", "defaultcpuallocator")
MEMORY_HINT = "out of memory; try a smaller model (--model), micro-batch (-b) or sequence (-s)"
StatusCallback = Callable[[str], None]  # takes one status line of a running launch


@dataclass(frozen=True)
class Fault:
    """A failure injected on purpose, to test that failures end runs cleanly."""

    kind: str  # "crash": the rank raises; "hang": it sleeps forever; "kill": it gets SIGKILL
    rank: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``crash:1``, ``hang:0`` or ``kill:0``."""
        kind, _, rank = text.partition(":")
        require(kind in FAULTS and rank.isdigit() and len(rank) <= 6, "fault", text,
                "write crash:RANK, hang:RANK or kill:RANK, e.g. crash:1")
        return cls(kind, int(rank))


@dataclass(frozen=True)
class LaunchSpec:
    """What every rank receives: its handler's name and the task (pickled)."""

    handler: str  # a key of pipesched.runtime.worker.HANDLERS
    task: object
    world_size: int
    backend: str  # "gloo" or "nccl"
    timeout_s: float
    threads: int = 1  # torch threads per rank
    pin_cpus: bool = False  # pin rank r to CPU core r (when there are enough cores)
    fault: Fault | None = None


class Progress:
    """The shared progress file: each rank writes where it is; the launcher reads it."""

    def __init__(self, path: Path, rank: int) -> None:
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), 0)
        self._offset = rank * PROGRESS_BYTES

    def update(self, job: int, step: int, position: int) -> None:
        struct.pack_into(_PROGRESS_FORMAT, self._map, self._offset, job, step, position, 1)

    def close(self) -> None:
        self._map.close()
        self._file.close()


class InjectedFault(RuntimeError):
    """Raised on purpose by an injected ``crash`` fault."""


@dataclass
class RankContext:
    """What a rank's handler gets besides the spec: its work folder, progress and fault."""

    folder: Path
    rank: int
    progress: Progress
    fault: Fault | None = None

    def before_op(self, job: int):
        """The hook a runtime calls before each compute op of ``job``: (step, position) -> None.

        It records progress, and fires the injected fault at the first op of the first step.
        """
        progress, fault, rank = self.progress, self.fault, self.rank

        def hook(step: int, position: int) -> None:
            progress.update(job, step, position)
            if fault is not None and fault.rank == rank and job == 0 and step == 0 and position == 0:
                if fault.kind == "crash":
                    raise InjectedFault(f"injected crash on rank {rank} before its first op")
                if fault.kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(HANG_S)

        return hook


def read_progress(path: Path, world_size: int) -> list[tuple[int, int, int, int]]:
    data = path.read_bytes()
    return [struct.unpack_from(_PROGRESS_FORMAT, data, r * PROGRESS_BYTES) for r in range(world_size)]


def _source_root() -> str:
    """The folder holding the ``pipesched`` package, so ranks import this very copy."""
    return str(Path(__file__).resolve().parents[2])


def _environment(spec: LaunchSpec) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(spec.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    env[LAUNCHER_PID_VARIABLE] = str(os.getpid())  # a rank exits when this process is gone
    root = _source_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(spec: LaunchSpec, *, describe: Sequence[str] = (), on_status: StatusCallback | None = None) -> list[object]:
    """Run ``spec`` on ``spec.world_size`` ranks; the results of ranks 0..P-1 in order.

    ``describe[j]`` names job j in hang reports and status lines (e.g. the schedule's name).
    ``on_status`` is given a short status line (where the slowest rank is) every
    STATUS_EVERY_S while the ranks run.
    """
    remove_abandoned_folders()
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as folder:
        work = Path(folder)
        (work / OWNER_FILE).write_text(_owner(os.getpid()) or "", encoding="utf-8")
        (work / "task.pkl").write_bytes(pickle.dumps(spec))
        progress_path = work / "progress.bin"
        progress_path.write_bytes(bytes(PROGRESS_BYTES * spec.world_size))
        processes = []
        with _terminate_as_exit():
            try:
                _start_and_watch(processes, spec, work, folder, describe, on_status)
            finally:
                kill_all(processes)
        return [pickle.loads((work / f"rank{rank}.result").read_bytes()) for rank in range(spec.world_size)]


def _owner(pid: int) -> str | None:
    """``"PID START"``: a process and its start time (Linux clock ticks after boot), which
    tell it apart from a later process given the same id; None when it is not running."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return f"{pid} {fields[19]}"  # field 22 of stat: starttime


def remove_abandoned_folders() -> list[Path]:
    """Remove the run folders of launchers that were killed outright (they could not clean
    up); a folder whose launcher still runs, or that names none, is left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            if not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            recorded = (folder / OWNER_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        pid = recorded.split()[0] if recorded else ""
        if pid.isdigit() and _owner(int(pid)) != recorded:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@contextlib.contextmanager
def _terminate_as_exit():
    """Turn SIGTERM and SIGHUP into SystemExit while ranks run, so that ``launch`` kills them
    on its way out (by default those signals end Python without running ``finally``)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, leave) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start_and_watch(processes: list[subprocess.Popen], spec: LaunchSpec, work: Path, folder: str,
                     describe: Sequence[str], on_status: StatusCallback | None) -> None:
    """Start the ranks (appending each to ``processes`` at once, for the caller's cleanup)
    and watch them to the end."""
    for rank in range(spec.world_size):
        log = (work / f"rank{rank}.log").open("wb")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "pipesched.runtime.worker", folder, str(rank)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=_environment(spec), start_new_session=True, close_fds=True,
        ))
        log.close()
    _watch(processes, spec, work, describe, on_status)


def _watch(processes: list[subprocess.Popen], spec: LaunchSpec, work: Path, describe: Sequence[str],
           on_status: StatusCallback | None) -> None:
    deadline = time.monotonic() + spec.timeout_s
    exits: dict[int, float] = {}  # rank -> when the launcher saw it exit (monotonic seconds)
    next_status = time.monotonic() + STATUS_EVERY_S
    while True:
        if on_status is not None and time.monotonic() >= next_status:
            on_status(status_line(read_progress(work / "progress.bin", spec.world_size), describe))
            next_status = time.monotonic() + STATUS_EVERY_S
        codes = [proc.poll() for proc in processes]
        _note_exits(codes, exits)
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            _settle(processes, time.monotonic() + GRACE_S, exits)
            raise PipeschedError(_failure_message(processes, work, exits))
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            pending = [rank for rank, code in enumerate(codes) if code is None]
            raise PipeschedError(_hang_message(pending, spec, work, describe))
        time.sleep(POLL_S)


def _note_exits(codes: Sequence[int | None], exits: dict[int, float]) -> None:
    now = time.monotonic()
    for rank, code in enumerate(codes):
        if code is not None:
            exits.setdefault(rank, now)


def _settle(processes: list[subprocess.Popen], until: float, exits: dict[int, float]) -> None:
    """Give the surviving ranks until ``until`` to notice the failure and report."""
    while time.monotonic() < until:
        codes = [proc.poll() for proc in processes]
        _note_exits(codes, exits)
        if all(code is not None for code in codes):
            return
        time.sleep(POLL_S)


def _failure_message(processes: list[subprocess.Popen], work: Path, exits: dict[int, float]) -> str:
    """The cause of a failed launch on one line: the first rank a signal killed (its peers
    then fail to reach it, which is not the cause), else the earliest error a rank reported,
    else the first rank that exited with an error status."""
    signalled = sorted((exits.get(rank, math.inf), rank) for rank, proc in enumerate(processes)
                       if proc.returncode is not None and proc.returncode < 0)
    if signalled:
        rank = signalled[0][1]
        return f"rank {rank} failed first: {_signal_reason(-processes[rank].returncode)}"
    reports = []
    for rank, proc in enumerate(processes):
        path = work / f"rank{rank}.error"
        if path.exists():
            report = json.loads(path.read_text(encoding="utf-8"))
            reports.append((report["time"], rank, report["message"]))
        elif proc.returncode not in (None, 0):
            reports.append((math.inf, rank, _exit_reason(proc.returncode, work / f"rank{rank}.log")))
    reports.sort()
    _, rank, message = reports[0]
    return f"rank {rank} failed: {message}"


def _signal_reason(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:  # what the kernel's out-of-memory killer sends
        return f"killed by {name}, most likely {MEMORY_HINT}"
    return f"killed by {name}"


def rank_error_message(exc: BaseException) -> str:
    """What a rank raised, on one line of at most about MESSAGE_CHARS characters: its type
    and message; when memory ran out anywhere in its chain of causes (a runtime wraps the
    allocator's error in its own, e.g. "Failed to run stage backward"), the allocation
    failure too, and what to change."""
    message = _one_line(exc)
    memory = _memory_error(exc)
    if memory is None:
        return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + " ..."
    # the rank's own error and the allocator's each shortened, so the hint always fits
    share = (MESSAGE_CHARS - len(MEMORY_HINT)) // 2
    message = message if len(message) <= share else message[:share] + " ..."
    if memory is not exc:
        cause = _one_line(memory)
        message += f" (caused by {cause if len(cause) <= share else cause[:share] + ' ...'})"
    return f"{message}: {MEMORY_HINT}"


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _memory_error(exc: BaseException) -> BaseException | None:
    """The first exception in ``exc``'s chain (itself, then its causes and contexts) that
    says memory ran out, or None."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        text = _one_line(link).lower()
        if isinstance(link, MemoryError) or any(marker in text for marker in MEMORY_MARKERS):
            return link
        pending += [cause for cause in (link.__cause__, link.__context__) if cause is not None]
    return None


def _exit_reason(code: int, log: Path) -> str:
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f"exited with status {code}" + (f" ({lines[-1].strip()})" if lines else "")


def status_line(progress: Sequence[tuple[int, int, int, int]], describe: Sequence[str]) -> str:
    """Where a launch is: how many ranks have started, then the slowest rank's job, step
    and op (from the progress file's ``(job, step, op position, started)`` per rank)."""
    started = [(job, step, position) for job, step, position, running in progress if running]
    if len(started) < len(progress):
        return f"{len(started)} of {len(progress)} ranks started"
    job, step, position = min(started)
    name = describe[job] if job < len(describe) else f"job {job}"
    return f"{name}, step {step + 1}, op {position + 1} (slowest rank)"


def _hang_message(pending: list[int], spec: LaunchSpec, work: Path, describe: Sequence[str]) -> str:
    where = []
    for rank, (job, step, position, started) in enumerate(read_progress(work / "progress.bin", spec.world_size)):
        if rank not in pending:
            continue
        if not started:
            where.append(f"rank {rank} never reached its first op")
            continue
        name = f"{describe[job]} " if job < len(describe) else ""
        where.append(f"rank {rank} at {name}step {step} op #{position}")
    return (f"timeout={spec.timeout_s:g}s: {len(pending)} of {spec.world_size} ranks did not finish "
            f"({'; '.join(where)}); a rank hung or the schedule deadlocks at run time; "
            "raise the timeout if the run is only slow")


def kill_all(processes: list[subprocess.Popen]) -> None:
    """Kill every rank's process group and reap the ranks."""
    for proc in processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in processes:
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # a rank's own helpers left in its group after it exited
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
