"""How long does the command take to start? Each command runs ``--runs`` times as a fresh
process (the median wall-clock time and CPU time are reported); the interpreter alone is
the floor. The target: `pipesched --help` and `pipesched validate FILE` under 0.3 s.

    python benchmarks/bench_startup.py [--runs 11] [--source DIR]

``--source`` (default: ``PYTHONPATH``, else this checkout's ``src``) times another
checkout's ``src`` folder (e.g. an older commit's export) with this interpreter, for a
before/after comparison (``side_by_side.py`` runs both in turn). CPU time (user + system
of the child) is less disturbed than wall time by other work on the machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import figure

TARGET_S = 0.3
ROOT = Path(__file__).resolve().parent.parent


def _time(command: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``command`` over ``runs`` runs (after one warm-up)."""
    walls, cpus = [], []
    for run in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begun = time.perf_counter()
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        wall = time.perf_counter() - begun
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if run:  # the first run warms the file cache
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def _shown(source: str) -> str:
    """The timed src folder as the results file names it: relative to this checkout, or
    another checkout's, without this machine's paths."""
    path = Path(source).resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return f"<other checkout>/{path.name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--source", default=os.environ.get("PYTHONPATH") or str(ROOT / "src"),
                        help="the src folder to time (default: PYTHONPATH, else this checkout's)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=args.source)
    with tempfile.TemporaryDirectory() as folder:
        schedule = Path(folder) / "zb-v.txt"
        subprocess.run([sys.executable, "-m", "pipesched", "show", "zb-v", "-p", "8", "-m", "32", "-o", str(schedule)],
                       env=env, check=True)
        pipesched = [sys.executable, "-m", "pipesched"]
        cases = [
            ("python -c pass (the floor)", [sys.executable, "-c", "pass"], False),
            ("pipesched --help", [*pipesched, "--help"], True),
            ("pipesched validate FILE (zb-v p=8 m=32)", [*pipesched, "validate", str(schedule)], True),
            ("pipesched list", [*pipesched, "list"], False),
            ("pipesched show 1f1b -p 4 -m 8", [*pipesched, "show", "1f1b", "-p", "4", "-m", "8"], False),
            ("pipesched simulate --help", [*pipesched, "simulate", "--help"], False),
        ]
        load = os.getloadavg()[0]
        print(f"source {_shown(args.source)}; {args.runs} runs each; load average {load:.2f} on {os.cpu_count()} CPUs")
        print(f"{'command':42} {'wall s (median)':>16} {'cpu s (median)':>15}  target")
        for label, command, targeted in cases:
            wall, cpu = _time(command, env, args.runs)
            verdict = ("under" if wall < TARGET_S else "OVER") + f" {TARGET_S:g} s" if targeted else ""
            print(f"{label:42} {wall:16.3f} {cpu:15.3f}  {verdict}")
            name = "_".join(label.split("(")[0].split())
            figure(f"{name}_wall", wall, "s", better="lower")
            figure(f"{name}_cpu", cpu, "s", better="lower")


if __name__ == "__main__":
    main()
