"""The rank process: ``python -m pipesched.runtime.worker FOLDER RANK`` (started by
``pipesched.runtime.launch``). It joins the process group, runs its handler, and leaves a
result pickle or a one-line error report in FOLDER."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

from pipesched.runtime.launch import LaunchSpec, Progress, RankContext


def _report_error(folder: Path, rank: int, exc: BaseException) -> None:
    message = " ".join(f"{type(exc).__name__}: {exc}".split())
    if len(message) > 400:
        message = message[:400] + " ..."
    report = {"time": time.time(), "message": message, "traceback": traceback.format_exc()}
    (folder / f"rank{rank}.error").write_text(json.dumps(report), encoding="utf-8")


def _pin(rank: int, world_size: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= world_size:
        os.sched_setaffinity(0, {cores[rank]})


def main(argv: list[str]) -> int:
    folder, rank = Path(argv[0]), int(argv[1])
    progress = None
    try:
        spec: LaunchSpec = pickle.loads((folder / "task.pkl").read_bytes())
        if spec.pin_cpus:
            _pin(rank, spec.world_size)
        progress = Progress(folder / "progress.bin", rank)
        from pipesched.runtime.torch_import import require_torch

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
