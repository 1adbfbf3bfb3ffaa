"""How far is the simulator from real runs? The prediction check over the schedule families
and several microbatch counts.

For every m: profile the stages in isolation, simulate each family, run it for real on P
local ranks, and compare the predicted iteration time with the measured median step time.
The link and the runtimes' per-op overheads are measured once, before all checks. Prints
one row per (m, family), then the median absolute error over all rows.

``cpu share`` is the CPU time the ranks' op threads got over the ops' duration: below
about 0.97 other processes on the machine took the ranks' cores during the run, which the
profile (taken on idle cores) cannot know about.

    python benchmarks/bench_accuracy.py                      # small model, p=2, m=4,8,16
    python benchmarks/bench_accuracy.py -p 4 --ms 8,16       # on a machine with >= 4 cores
    python benchmarks/bench_accuracy.py -p 8 --layers 14     # p=8: 16 stages with two per rank
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, generate
from pipesched.model import load_model
from pipesched.runtime.check import CheckReport, check_schedules
from pipesched.runtime.measure import cpu_share
from pipesched.runtime.profile import profile_link, profile_overhead
from pipesched.runtime.runs import RunOptions, choose_runtime

DEFAULT_FAMILIES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "v-half",
                    "v-min", "chimera", "hanayo", "dualpipe", "dualpipev")


def _buildable(names: list[str], p: int, m: int) -> list:
    schedules = []
    for name in names:
        try:
            schedules.append(generate(name, p, m))
        except Exception as exc:  # a family that does not take these sizes is left out, and said so
            print(f"  skip {name} at p={p}, m={m}: {exc}")
    return schedules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--layers", type=int, help="transformer blocks (default: the model's); p=8 with two "
                        "stages per rank needs at least 14 (16 stages, embedding and head included)")
    parser.add_argument("-b", "--micro-batch-size", type=int, default=2)
    parser.add_argument("-s", "--seq-len", type=int, default=128)
    parser.add_argument("-p", type=int, default=2)
    parser.add_argument("--ms", default="4,8,16", help="microbatch counts")
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runtime", default="auto", choices=("auto", "pytorch", "ours"))
    parser.add_argument("--repeats", type=int, default=10, help="profile repeats per op")
    parser.add_argument("--per-launch", type=int, default=0,
                        help="families run per launch of the ranks, their rows printed as each launch ends "
                             "(default 0: all in one launch)")
    args = parser.parse_args()

    model = load_model(args.model)
    if args.layers is not None:
        if args.layers < 1:
            parser.error(f"--layers {args.layers}: must be at least 1")
        model = dataclasses.replace(model, name=f"{model.name}-{args.layers}l", num_layers=args.layers)
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    options = RunOptions(micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, steps=args.steps,
                         warmup=args.warmup, timeout_s=1800)
    begun = time.time()
    print(f"model {model.name}, p={args.p}, micro-batch {args.micro_batch_size} x {args.seq_len}, float32, gloo, "
          f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f}")
    link = profile_link(backend="gloo")
    runtimes = {choose_runtime(s, args.runtime) for s in _buildable(names, args.p, max(int(m) for m in args.ms.split(",")))}
    overhead = {r: profile_overhead(runtime=r, model=model, micro_batch_size=args.micro_batch_size,
                                    seq_len=args.seq_len) for r in sorted(runtimes)}
    print(f"link: latency {link.latency * 1e6:.0f} us, bandwidth {link.bandwidth / 1e9:.2f} GB/s; per-op overhead "
          + ", ".join(f"{r} {s * 1e6:.0f} us" for r, s in overhead.items()))
    print(f"{'m':>3} {'schedule':18} {'runtime':8} {'predicted ms':>13} {'measured ms':>12} {'error':>8} {'cpu share':>10}")
    errors, clean = [], []
    for m in (int(x) for x in args.ms.split(",")):
        schedules = _buildable(names, args.p, m)
        size = args.per_launch if args.per_launch > 0 else len(schedules)
        rows = []
        for start in range(0, len(schedules), size):
            part = check_schedules(schedules[start:start + size], model, options=options, runtime=args.runtime,
                                   link=link, overhead_s=overhead, repeats=args.repeats)
            for row in part.rows:
                share = cpu_share(row.run.timeline)
                errors.append(abs(row.error))
                if share >= 0.97:
                    clean.append(abs(row.error))
                print(f"{m:>3} {row.schedule.name:18} {row.run.runtime:8} {row.predicted_s * 1e3:13.1f} "
                      f"{row.measured_s * 1e3:12.1f} {row.error:+8.1%} {share:10.3f}", flush=True)
            rows.extend(part.rows)
        report = CheckReport(rows=tuple(rows), link=link, overhead_s=overhead)
        print(f"    m={m}: median |error| {report.median_abs_error:.1%}; {report.ranking_verdict}")
    print(f"median |error| over {len(errors)} runs: {statistics.median(errors):.1%} "
          f"(max {max(errors):.1%}); over the {len(clean)} runs with cpu share >= 0.97: "
          + (f"{statistics.median(clean):.1%}" if clean else "none"))
    print(f"load average at the end {os.getloadavg()[0]:.2f}; took {time.time() - begun:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except PipeschedError as exc:
        raise SystemExit(f"bench_accuracy: error: {exc}") from None
