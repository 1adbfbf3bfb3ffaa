"""Schedule synthesis: solver time, optimality gap, and the margin over the built-in families.

    python benchmarks/bench_synthesis.py            # every case
    python benchmarks/bench_synthesis.py --quick    # the p=4 case only

Cases (one stage per device; every time is the simulator's without contention, which is
what the solver models):

- ``uniform p4 m8``: F = I = W = 1 s, activations 1 B, a cap of p x activations per device
  (1F1B's memory: p stage-microbatches on device 0), free links. Target: proven optimal in
  under 10 s and not slower than ZB-H1.
- ``uniform p8 m32``: the same at p = 8, m = 32. Target: within 2% of the bound in under 60 s.
- ``default p8 m32, 1F1B memory``: the default scenario's stages (Llama-3-70B, tensor
  parallel 4, on 4 x 8 H100: uneven first and last stages, NVLink and InfiniBand links)
  with each device's static bytes + p x its stage's activations. Targets: within 2% of the
  bound in under 60 s; faster than every built-in one-stage-per-device family that fits.
- ``default p8 m32, device memory``: the same stages under the H100's 80 GiB.
  Target: faster than every built-in one-stage-per-device family that fits.
- the 1F1B-memory case again with the memory rule written as CP-SAT's reservoir constraint
  (comparison), and the default model and cluster at p = 16, m = 256 (tensor parallel 2,
  12,288 ops): a size the solver does not close in a minute, where the result is the best
  schedule the heuristics and the solver found, with the solver's lower bound.

For each case the script prints the synthesis result and every built-in candidate (each
one-stage-per-device family as generated, and the zero-bubble heuristic with the stage
costs and the in-flight count the cap allows) with its makespan and whether it fits.
"""

from __future__ import annotations

import argparse
import math
import time

from pipesched.costs import StageCosts
from pipesched.defaults import DEFAULTS
from pipesched.experiments import Point
from pipesched.schedule import Placement, Schedule
from pipesched.search.baseline import candidates
from pipesched.search.plans import Plan, evaluate, fits, in_microbatch_order
from pipesched.search.problem import SynthesisProblem
from pipesched.search.synthesis import synthesize
from pipesched.simulate import Network


def uniform_case(p: int, m: int) -> tuple[StageCosts, Network, int, tuple[float, ...]]:
    return StageCosts.uniform(p), Network.uniform(p, latency=0.0, bandwidth=math.inf), m, (float(p),) * p


def default_case(*, device_memory: bool, p: int = DEFAULTS.p, m: int = DEFAULTS.m,
                 tensor_parallel: int = DEFAULTS.tensor_parallel):
    """The default scenario's model and cluster (optionally at another pipeline size)."""
    setup = Point("1f1b", p=p, m=m, tp=tensor_parallel).setup()
    placement = Schedule("synthesized", Placement.one_per_device(p), m, ((),) * p)
    costs, network = setup.costs_for(placement), setup.network_for(placement)
    if device_memory:
        return costs, network, m, tuple(network.capacity[:p])
    return costs, network, m, tuple(costs.static(s) + p * costs.activation_bytes[s] for s in range(p))


def run_case(name: str, case, *, time_limit: float, targets: str, memory_rule: str = "counting") -> list[str]:
    costs, network, m, limit = case
    began = time.perf_counter()
    result = synthesize(costs, network, m, memory_limit=limit, time_limit=time_limit, memory_rule=memory_rule)
    wall = time.perf_counter() - began
    lines = [
        f"## {name}  (time limit {time_limit:g} s, memory rule {memory_rule}; targets: {targets})",
        f"synthesized: {result.status} ({result.method}; solver {result.solver_status}) in {wall:.2f} s, "
        f"makespan {result.makespan_s:.6g} s, lower bound {result.lower_bound_s:.6g} s, gap {result.gap:.3%}, "
        f"time grid {result.time_unit_s:.3g} s, memory grid exact: {result.memory_exact}",
        f"peak memory / cap per device: {', '.join(f'{a / b:.4f}' for a, b in zip(result.timeline.memory.peak, limit, strict=True))}",
        "built-in one-stage-per-device candidates (simulated, no contention):",
    ]
    beaten = []
    # families with a full backward (B) as well as the split ones (I and W)
    for split in (False, True):
        problem = SynthesisProblem(costs, network, m, limit, split_backward=split)
        for family, options, schedule in candidates(problem):
            evaluation = evaluate(problem, Plan(in_microbatch_order(schedule.device_ops), source=family))
            fit = fits(problem, evaluation)
            shown = ", ".join(f"{k}={v}" if k != "costs" else "stage costs" for k, v in options.items())
            ratio = evaluation.makespan / result.makespan_s
            lines.append(f"  {family:15} {('(' + shown + ')') if shown else '':40} {evaluation.makespan:10.6g} s  "
                         f"{'fits' if fit else 'OOM '}  {ratio:.4f}x the synthesized time")
            if fit:
                beaten.append(ratio)
    if beaten:
        lines.append(f"fastest fitting family / synthesized: {min(beaten):.4f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the p=4 case")
    args = parser.parse_args()
    cases = [("uniform p4 m8, 1F1B memory", uniform_case(4, 8), 10.0, "optimal in < 10 s, <= ZB-H1", "counting")]
    if not args.quick:
        one_f_one_b = default_case(device_memory=False)
        cases += [
            ("uniform p8 m32, 1F1B memory", uniform_case(8, 32), 60.0, "gap < 2% in < 60 s", "counting"),
            ("default scenario p8 m32, 1F1B memory", one_f_one_b, 60.0,
             "gap < 2% in < 60 s, faster than every fitting family", "counting"),
            ("default scenario p8 m32, 80 GiB device memory", default_case(device_memory=True), 60.0,
             "faster than every fitting family", "counting"),
            # the same rule written as CP-SAT's reservoir constraint, for comparison
            ("default scenario p8 m32, 1F1B memory", one_f_one_b, 60.0, "(comparison only)", "reservoir"),
            ("default model and cluster, p16 m256, tensor parallel 2, 1F1B memory",
             default_case(device_memory=False, p=16, m=256, tensor_parallel=2), 60.0,
             "(a size the solver does not close: the best schedule found and the solver's bound)", "counting"),
        ]
    for name, case, limit, targets, rule in cases:
        print("\n".join(run_case(name, case, time_limit=limit, targets=targets, memory_rule=rule)),
              end="\n\n", flush=True)


if __name__ == "__main__":
    main()
