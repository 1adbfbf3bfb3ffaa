"""A benchmark run on two source trees in turn, in one run, so that both see the same load:
the median of each figure per tree and their ratio (new over old; above 1 is better for a
rate, below 1 for a time).

    python benchmarks/side_by_side.py --old OTHER_CHECKOUT/src [--new src] [--repeat 3] \\
        bench_search.py --quick

The benchmark (a script in this folder, with its own arguments) runs ``--repeat`` times per
tree, alternating old and new, each run a fresh process with ``PYTHONPATH`` set to the
tree; its ``figure`` lines (``figures.py``) are collected. The machine may be shared:
absolute figures move with the load, their ratio much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from figures import parse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _shown(source: str) -> str:
    """A tree as the report names it: relative to this checkout, else by its folder names."""
    path = Path(source).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else f"<other checkout>/{path.name}"


def run_once(script: str, arguments: list[str], source: str) -> dict[str, tuple[float, str, str]]:
    env = dict(os.environ, PYTHONPATH=str(Path(source).resolve()))
    done = subprocess.run([sys.executable, str(HERE / script), *arguments], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script} on {_shown(source)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return parse(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the src folder to compare against")
    parser.add_argument("--new", default=str(ROOT / "src"), help="the src folder of this checkout (default)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tree")
    parser.add_argument("script", help="a benchmark of this folder, e.g. bench_search.py")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, tuple[float, str, str]]]] = {"old": [], "new": []}
    print(f"{args.script} {' '.join(args.arguments)}: old {_shown(args.old)}, new {_shown(args.new)}, "
          f"{args.repeat} runs each, alternating; load average before {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    for _ in range(args.repeat):
        for which in ("old", "new"):
            runs[which].append(run_once(args.script, args.arguments, getattr(args, which)))
    print(f"{'figure':40} {'old (median)':>14} {'new (median)':>14} {'new/old':>8}  unit, better")
    names = [name for name in runs["new"][0] if all(name in run for run in runs["old"] + runs["new"])]
    for name in names:
        old = statistics.median(run[name][0] for run in runs["old"])
        new = statistics.median(run[name][0] for run in runs["new"])
        _, unit, better = runs["new"][0][name]
        ratio = new / old if old else float("nan")
        print(f"{name:40} {old:14.4g} {new:14.4g} {ratio:8.3f}  {unit}, {better}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
