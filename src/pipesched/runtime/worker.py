"""The rank process: ``python -m pipesched.runtime.worker FOLDER RANK`` (started by
``pipesched.runtime.launch``). It joins the process group, runs its handler, and leaves a
result pickle or a one-line error report in FOLDER."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

from pipesched.runtime.launch import (
    LAUNCHER_PID_VARIABLE,
    LaunchSpec,
    Progress,
    RankContext,
    rank_error_message,
)
from pipesched.runtime.torch_import import require_torch

PR_SET_PDEATHSIG = 1  # prctl option: the signal this process gets when its parent dies


def _report_error(folder: Path, rank: int, exc: BaseException) -> None:
    report = {"time": time.time(), "message": rank_error_message(exc), "traceback": traceback.format_exc()}
    (folder / f"rank{rank}.error").write_text(json.dumps(report), encoding="utf-8")


def _pin(rank: int, world_size: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= world_size:
        os.sched_setaffinity(0, {cores[rank]})


def _die_with_launcher() -> None:
    """Ask the kernel to kill this rank when the launcher dies (Linux), and exit now if the
    launcher is already gone: a rank lives in a session of its own, so nothing else would
    end it if the launcher were killed outright."""
    launcher = os.environ.get(LAUNCHER_PID_VARIABLE)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if launcher and os.getppid() != int(launcher):
        sys.exit(1)


def main(argv: list[str]) -> int:
    folder, rank = Path(argv[0]), int(argv[1])
    _die_with_launcher()
    progress = None
    try:
        spec: LaunchSpec = pickle.loads((folder / "task.pkl").read_bytes())
        if spec.pin_cpus:
            _pin(rank, spec.world_size)
        progress = Progress(folder / "progress.bin", rank)

        torch = require_torch()
        torch.set_num_threads(spec.threads)
        dist = torch.distributed
        store = dist.FileStore(str(folder / "store"), spec.world_size)
        dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world_size,
                                timeout=timedelta(seconds=spec.timeout_s))
        from pipesched.runtime.rank_tasks import HANDLERS

        result = HANDLERS[spec.handler](spec, RankContext(folder, rank, progress, spec.fault))
        dist.barrier()
        dist.destroy_process_group()
        temporary = folder / f"rank{rank}.result.tmp"
        temporary.write_bytes(pickle.dumps(result))
        temporary.replace(folder / f"rank{rank}.result")
        return 0
    except BaseException as exc:
        _report_error(folder, rank, exc)
        return 1
    finally:
        if progress is not None:
            progress.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
