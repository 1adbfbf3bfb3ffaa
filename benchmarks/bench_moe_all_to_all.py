"""How close is the all-to-all model to DeepEP's published dispatch and combine figures for
the DeepSeek-V3 configuration on H800s (``benchmarks/data/deepep_all_to_all.csv``, its
header says where from)?

Each row is timed with ``collective_seconds`` (the one entry every layer cost times a
collective with) over the ``8x8-h800`` cluster's levels, on the bytes DeepEP moves:

- normal kernels (training and prefill, 4096 tokens per rank): a token goes once to each
  distinct node it routes to (top-4 groups, a group = a node) over RDMA, and is forwarded
  over NVLink to each distinct GPU there; the two run at once, the slower sets the time.
  Intranode (EP 8) everything is the NVLink all-to-all. The figure DeepEP reports is the
  bottleneck domain's logical bytes (its own node or rank included) over that time;
- low-latency kernels (decode, 128 tokens per rank): one copy per selected expert, the
  hierarchical all-to-all over NVLink inside a node and RDMA across nodes; the time is
  DeepEP's latency and the copies' bytes over it its bandwidth.

Routing is uniform (DeepEP's tests draw random scores): the expected number of distinct
nodes and GPUs a token reaches is a closed form of drawing 8 experts without replacement.
Prints the measured and predicted figure of every row and its error, and the largest error.

    python benchmarks/bench_moe_all_to_all.py
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from pipesched.enums import Collective
from pipesched.model import load_cluster
from pipesched.model.collectives import collective_seconds, group_levels

DATA = Path(__file__).parent / "data" / "deepep_all_to_all.csv"
CLUSTER = "8x8-h800"
HIDDEN, EXPERTS, TOP_K, TOP_GROUPS, NODE_SIZE = 7168, 256, 8, 4, 8
# bytes of one token: FP8 with one fp32 scale per 128 elements (dispatch), BF16 (combine)
TOKEN_BYTES = {"dispatch": HIDDEN + HIDDEN // 128 * 4, "combine": 2 * HIDDEN}
TARGET = 0.25  # the bound on every row's relative error


def reached(slots: int, per_slot: int, chosen: int) -> float:
    """Expected slots (nodes, GPUs) holding at least one of ``chosen`` experts drawn
    without replacement from ``slots`` x ``per_slot``."""
    total = slots * per_slot
    return slots * (1.0 - math.comb(total - per_slot, chosen) / math.comb(total, chosen))


def _routing(ep: int) -> tuple[float, float]:
    """Distinct nodes and distinct GPUs one token reaches at EP ``ep`` (normal kernels)."""
    nodes = ep // NODE_SIZE
    if nodes <= 1:
        return 1.0, reached(ep, EXPERTS // ep, TOP_K)
    groups = min(nodes, TOP_GROUPS)  # the nodes a token may route to, then top-8 among their experts
    per_node = EXPERTS // nodes
    return reached(groups, per_node, TOP_K), reached(groups * NODE_SIZE, per_node // NODE_SIZE, TOP_K)


def _levels(ep: int):
    """The levels of an all-to-all over the cluster's first ``ep`` GPUs (nodes of 8)."""
    return group_levels(load_cluster(CLUSTER), range(ep))


def normal_bandwidth(op: str, ep: int, tokens: int) -> float:
    """Predicted bottleneck bandwidth of a normal-kernel dispatch or combine, bytes/s."""
    levels = _levels(ep)
    nodes, gpus = _routing(ep)
    unit = tokens * TOKEN_BYTES[op]
    nvlink = collective_seconds(Collective.ALL_TO_ALL, gpus * unit, levels[:1])
    if len(levels) == 1:
        return gpus * unit / nvlink
    rdma = collective_seconds(Collective.ALL_TO_ALL, nodes * unit, levels[1:])
    return nodes * unit / max(nvlink, rdma)


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
