"""Fuzz every input surface of the `pipesched` command at scale and report what breaks the
error contract: a hang (no answer within the time limit), a process over 1 GiB of address
space, an exit status other than 0, 1 or 2, a traceback, more than one error line, a
changed input file, a file left behind by a failed command.

    python benchmarks/fuzz_inputs.py [--cases 10000] [--batch 50] [--alone 200] [--seed 13] [--timeout 20]

The cases come from the hypothesis strategies of tests/fuzz_inputs.py (the suite's fuzz test
runs a few hundred of them): schedule files in grid text, PyTorch CSV and JSON, stage-cost
CSV, model config.json / YAML / layer CSV, cluster YAML, and numeric flags of every command.
They run ``--batch`` at a time in driver processes; ``--alone`` more run one process each.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from fuzz_inputs import MEMORY_LIMIT_BYTES, TIMEOUT_S, cases, problems, run_alone, run_cases

MiB = 2.0**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases run in batches")
    parser.add_argument("--batch", type=int, default=50, help="cases per driver process")
    parser.add_argument("--alone", type=int, default=200, help="further cases run one process each")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds a case may take")
    args = parser.parse_args()

    records: list[tuple[object, dict]] = []  # (case, outcome)
    began = time.monotonic()

    @seed(args.seed)
    @settings(max_examples=max(1, args.cases // args.batch), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(cases(), min_size=args.batch, max_size=args.batch))
    def batches(batch):
        records.extend(zip(batch, run_cases(batch, timeout_s=args.timeout), strict=True))
        print(f"\r{len(records):,} cases, {time.monotonic() - began:.0f} s", end="", file=sys.stderr, flush=True)

    batches()
    batched = len(records)

    @seed(args.seed + 1)
    @settings(max_examples=max(1, args.alone), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def alone(case):
        records.append((case, run_alone(case, timeout_s=args.timeout)))

    if args.alone:
        alone()
    elapsed = time.monotonic() - began
    print(file=sys.stderr)
    _report(records, batched, elapsed, args)


def _report(records, batched: int, elapsed: float, args) -> None:
    by_surface: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    findings = []
    for case, outcome in records:
        by_surface[case.surface][outcome.get("code")] += 1
        found = problems(case, outcome)
        if found:
            findings.append((case, outcome, found))
    seconds = [outcome["seconds"] for _, outcome in records if "seconds" in outcome]
    peak = max((outcome.get("peak_rss_bytes", 0) for _, outcome in records), default=0)
    print(f"command: python benchmarks/fuzz_inputs.py --cases {args.cases} --batch {args.batch} "
          f"--alone {args.alone} --seed {args.seed} --timeout {args.timeout:g}")
    print(f"{len(records):,} cases ({batched:,} in batches of {args.batch} per driver process, "
          f"{len(records) - batched:,} one process each) in {elapsed:.0f} s; limits per process: "
          f"{args.timeout:g} s per case, {MEMORY_LIMIT_BYTES / 2**30:g} GiB of address space (RLIMIT_AS)")
    print(f"cases breaking the contract: {len(findings)}")
    print()
    print(f"{'surface':28} {'cases':>7} {'exit 0':>7} {'exit 1':>7} {'exit 2':>7} {'other':>6}")
    for surface in sorted(by_surface):
        counts = by_surface[surface]
        other = sum(n for code, n in counts.items() if code not in (0, 1, 2))
        print(f"{surface:28} {sum(counts.values()):7,} {counts[0]:7,} {counts[1]:7,} {counts[2]:7,} {other:6,}")
    print()
    if seconds:
        ordered = sorted(seconds)
        print(f"seconds per case (batched): median {statistics.median(ordered):.3f}, "
              f"99th percentile {ordered[int(0.99 * (len(ordered) - 1))]:.3f}, max {ordered[-1]:.2f}")
    print(f"largest resident memory of a driver process (all its cases so far): {peak / MiB:.0f} MiB")
    slowest = sorted((r for r in records if "seconds" in r[1]), key=lambda r: -r[1]["seconds"])[:5]
    print("slowest cases:")
    for case, outcome in slowest:
        print(f"  {outcome['seconds']:6.2f} s  exit {outcome.get('code')}  {case.describe()[:150]}")
    for case, outcome, found in findings[:50]:
        print()
        print(f"FOUND {'; '.join(found)}")
        print(f"  {case.describe()[:400]}")
        detail = outcome.get("raised") or outcome.get("err") or ""
        print("  " + "\n  ".join(detail.strip().splitlines()[-6:]))


if __name__ == "__main__":
    main()
