"""How close is the all-to-all model to DeepEP's published dispatch and combine figures for
the DeepSeek-V3 configuration on H800s (``benchmarks/data/deepep_all_to_all.csv``, its
header says where from)?

Each row is timed by the layer model over the ``8x8-h800`` cluster's levels:

- normal kernels (training and prefill, 4096 tokens per rank): the dispatch and combine
  all-to-alls of a DeepSeek-V3 MoE block's plan (``layer_plans``) under
  ``moe_dispatcher="deepep"``, timed by ``plan_collective_seconds`` on the expert group the
  stage plan gives it (``expert_group_levels``). A token goes once to each distinct node its
  experts are on (node-limited routing, at most 4) over RDMA and is forwarded over NVLink to
  each distinct GPU there; the two legs run at once, the slower sets the time
  (``ModelSpec.routed_destinations``: uniform routing, as DeepEP's tests draw it). The
  figure DeepEP reports is the bottleneck domain's logical bytes (its own node or rank
  included) over that time: the plan's bytes of that leg over its seconds;
- low-latency kernels (decode, 128 tokens per rank): one copy per selected expert, the
  hierarchical all-to-all (``collective_seconds``) over NVLink inside a node and RDMA across
  nodes; the time is DeepEP's latency and the copies' bytes over it its bandwidth.

Prints the measured and predicted figure of every row and its error, and the largest error.

    python benchmarks/bench_moe_all_to_all.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from pipesched.enums import Collective
from pipesched.model import TrainingSettings, load_cluster, load_model
from pipesched.model.collectives import collective_seconds, group_levels
from pipesched.model.groups import expert_group_levels
from pipesched.model.transformer import layer_plans, plan_collective_seconds

DATA = Path(__file__).parent / "data" / "deepep_all_to_all.csv"
CLUSTER = "8x8-h800"
MODEL = load_model("deepseek-v3")  # hidden 7168, top-8 of 256 experts, a token's experts on at most 4 nodes
HIDDEN, TOP_K = MODEL.hidden_size, MODEL.experts_per_token
# bytes of one token of the low-latency kernels: FP8 with one fp32 scale per 128 elements
# (dispatch), BF16 (combine)
TOKEN_BYTES = {"dispatch": HIDDEN + HIDDEN // 128 * 4, "combine": 2 * HIDDEN}
TARGET = 0.25  # the bound on every row's relative error


def _levels(ep: int):
    """The levels of an all-to-all over the cluster's first ``ep`` GPUs (nodes of 8)."""
    return group_levels(load_cluster(CLUSTER), range(ep))


def normal_bandwidth(op: str, ep: int, tokens: int) -> float:
    """Predicted bottleneck bandwidth of a normal-kernel dispatch or combine, bytes/s: the
    plan's all-to-all on the expert group of a one-stage pipeline's first device."""
    settings = TrainingSettings(micro_batch_size=1, seq_len=tokens, tensor_parallel=1, expert_parallel=ep,
                                dtype="fp8", moe_dispatcher="deepep")
    plan = layer_plans(MODEL, settings)[1 + MODEL.first_dense_layers]
    collective = next(c for c in plan.collectives if c.name == f"{op} all-to-all")
    groups = expert_group_levels(load_cluster(CLUSTER), settings, 0, 1)
    seconds = plan_collective_seconds(collective, settings, load_cluster(CLUSTER).intra_node, groups)
    return (collective.across_nodes or collective.nbytes) / seconds


def low_latency(op: str, ep: int, tokens: int) -> tuple[float, float]:
    """Predicted seconds and bandwidth (bytes/s) of a low-latency dispatch or combine."""
    levels = _levels(ep)
    copies = tokens * TOP_K * TOKEN_BYTES[op]
    seconds = collective_seconds(Collective.ALL_TO_ALL, copies, levels)
    return seconds, copies / seconds


def _rows() -> list[dict[str, str]]:
    with DATA.open(encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def main() -> None:
    print(f"DeepEP all-to-all on {CLUSTER}: measured vs predicted (collective_seconds)")
    print(f"{'kernel':<12} {'op':<9} {'EP':>3} {'domain':<7} {'GB/s':>6} {'model':>6} {'error':>7} "
          f"{'us':>5} {'model':>6} {'error':>7}")
    worst = 0.0
    for row in _rows():
        op, ep, tokens = row["op"], int(row["ep"]), int(row["tokens"])
        measured = float(row["bandwidth_gbps"]) * 1e9
        latency = ""
        if row["kernel"] == "normal":
            predicted = normal_bandwidth(op, ep, tokens)
        else:
            seconds, predicted = low_latency(op, ep, tokens)
            measured_s = float(row["latency_us"]) * 1e-6
            error_s = (seconds - measured_s) / measured_s
            worst = max(worst, abs(error_s))
            latency = f"{measured_s * 1e6:>5.0f} {seconds * 1e6:>6.0f} {error_s:>+7.1%}"
        error = (predicted - measured) / measured
        worst = max(worst, abs(error))
        print(f"{row['kernel']:<12} {op:<9} {ep:>3} {row['domain']:<7} {measured / 1e9:>6.0f} {predicted / 1e9:>6.0f} "
              f"{error:>+7.1%} {latency}")
    print(f"largest |error| {worst:.1%} (target {TARGET:.0%})")


if __name__ == "__main__":
    main()
