"""NCCL's collectives on H100 nodes: pipesched's collective model against published
measurements (benchmarks/data/nccl_dgx_h100.csv, sources in its header and README),
and what the model gives across the target's whole range (2 KB - 64 MB on 2, 4, 8 GPUs)
beside the former model, for the rows nothing was published for.

    python benchmarks/bench_collectives.py > benchmarks/results/collectives.txt

Each row is timed by ``collective_seconds`` over the levels ``group_levels`` gives the
ranks on a cluster of H100 nodes (the calibrated NVLink and InfiniBand links of the
presets), and by the former model beside it (inside a node the tensor-parallel ring of the
layer costs, 450 GB/s and 3 us per step; across nodes the data-parallel levels, 50 GB/s and
5 us plus the device's transfer set-up per step). Error = model / measured - 1. Rows with NCCL forced to
one algorithm (``NCCL_ALGO=RING``) are printed but not in the summary: the model times what
NCCL picks.

Target: the all-reduce within 20% median for 2, 4 and 8 GPUs, 2 KB - 64 MB, where rows exist.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from pipesched.enums import Collective
from pipesched.model import load_device
from pipesched.model.clusters import homogeneous_cluster
from pipesched.model.collectives import (
    CollectiveLevel,
    collective_choice,
    group_levels,
    link_levels,
)
from pipesched.model.hardware import LinkSpec

DATA = Path(__file__).parent / "data" / "nccl_dgx_h100.csv"
# the former model: the links of the presets without a calibration
PLAIN_NVLINK, PLAIN_INFINIBAND = LinkSpec(450e9, 3e-6), LinkSpec(50e9, 5e-6)
TARGET_LOW, TARGET_HIGH = 2e3, 64 * 2**20  # bytes of the target's range


def _rows() -> list[dict[str, str]]:
    with DATA.open(encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def _levels(gpus: int, nodes: int, *, plain: bool) -> tuple[CollectiveLevel, ...]:
    if plain and nodes == 1:  # the former tensor-parallel ring, as layer costs timed it
        return link_levels(PLAIN_NVLINK, gpus)
    per_node = gpus // nodes
    links = {"intra_node": PLAIN_NVLINK, "inter_node": PLAIN_INFINIBAND} if plain else {}
    cluster = homogeneous_cluster(load_device("h100-sxm"), gpus, devices_per_node=per_node, **links)
    return group_levels(cluster, tuple(range(gpus)))


def main() -> None:
    summary: dict[tuple, list[tuple[float, float, float]]] = {}
    print(f"{'source':15} {'kind':10} {'gpus':>4} {'nodes':>5} {'algo':8} {'bytes':>12} {'measured us':>12} "
          f"{'model us':>10} {'choice':14} {'error':>7} {'former us':>10} {'error':>7}")
    for row in _rows():
        kind, gpus, nodes = Collective(row["collective"]), int(row["gpus"]), int(row["nodes"])
        nbytes, measured = float(row["bytes"]), float(row["time_us"]) * 1e-6
        choice = collective_choice(kind, nbytes, _levels(gpus, nodes, plain=False))
        former = collective_choice(kind, nbytes, _levels(gpus, nodes, plain=True)).seconds
        error, former_error = choice.seconds / measured - 1, former / measured - 1
        print(f"{row['source']:15} {kind.value:10} {gpus:4d} {nodes:5d} {row['algorithm']:8} {nbytes:12.0f} "
              f"{measured * 1e6:12.1f} {choice.seconds * 1e6:10.1f} {choice.algorithm + '/' + choice.protocol:14} "
              f"{error:+7.1%} {former * 1e6:10.1f} {former_error:+7.1%}")
        if row["algorithm"] == "default":
            in_target = kind is Collective.ALL_REDUCE and TARGET_LOW <= nbytes <= TARGET_HIGH and nodes == 1
            summary.setdefault((kind.value, gpus, nodes, in_target), []).append((error, former_error, nbytes))
    print()
    print(f"{'kind':10} {'gpus':>4} {'nodes':>5} {'range':18} {'rows':>4} {'median':>8} {'worst':>8} "
          f"{'former median':>14} {'former worst':>13}  target")
    for (kind, gpus, nodes, in_target), errors in sorted(summary.items()):
        model = [e for e, _, _ in errors]
        former = [f for _, f, _ in errors]
        sizes = [b for _, _, b in errors]
        span = f"{min(sizes) / 2**20:g}-{max(sizes) / 2**20:g} MiB"
        verdict = ("PASS" if abs(statistics.median(model)) <= 0.2 else "MISS") if in_target else "-"
        print(f"{kind:10} {gpus:4d} {nodes:5d} {span:18} {len(errors):4d} {statistics.median(model):+8.1%} "
              f"{max(model, key=abs):+8.1%} {statistics.median(former):+14.1%} {max(former, key=abs):+13.1%}  {verdict}")
    print()
    print("the model over the target's range (no published rows for most of it): all-reduce, us")
    sizes = [2**k for k in range(11, 27, 3)]  # 2 KiB to 64 MiB
    print(f"{'gpus':>4} " + " ".join(f"{size / 2**10:>9g}K" for size in sizes))
    for gpus in (2, 4, 8):
        model = [collective_choice(Collective.ALL_REDUCE, size, _levels(gpus, 1, plain=False)) for size in sizes]
        former = [collective_choice(Collective.ALL_REDUCE, size, _levels(gpus, 1, plain=True)) for size in sizes]
        print(f"{gpus:4d} " + " ".join(f"{c.seconds * 1e6:10.1f}" for c in model) + "  model")
        print(f"{'':4} " + " ".join(f"{c.seconds * 1e6:10.1f}" for c in former) + "  former")
        print(f"{'':4} " + " ".join(f"{c.algorithm + '/' + c.protocol:>10}" for c in model))
    print()
    print("target rows missing (no published text found): all-reduce on 2 and 8 GPUs for 2 KB - 64 MB, "
          "on 4 GPUs below 0.5 MiB and above 4 MiB (benchmarks/data/README.md)")


if __name__ == "__main__":
    main()
