"""FP8 GEMMs at DeepGEMM's published H800 rates (pipesched/data/kernels/deepgemm_h800.csv)."""

from __future__ import annotations

import csv
import dataclasses
import itertools
from importlib import resources

import numpy as np
import pytest

from pipesched.errors import PipeschedError
from pipesched.model import TrainingSettings, load_cluster, load_model
from pipesched.model.clusters import parse_cluster
from pipesched.model.devices import load_device
from pipesched.model.groups import expert_group_levels
from pipesched.model.kernel_tables import (
    gemm_efficiency,
    load_gemm_table,
    parse_gemm_table,
    tables_of,
)
from pipesched.model.kernels import matmul_time
from pipesched.model.phases import chunk_pair, layer_phases
from pipesched.model.transformer import layer_ops

TABLE = "deepgemm_h800"
FP8_PEAK = 1979e12  # H800 SXM dense FP8 FLOP/s (NVIDIA's data sheet)


def _csv_rows() -> list[dict[str, str]]:
    """The data file read with the standard library alone (not the loader)."""
    text = (resources.files("pipesched") / "data" / "kernels" / f"{TABLE}.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def test_the_loader_reads_every_row_of_the_table():
    rows = load_gemm_table(TABLE)
    raw = _csv_rows()
    assert len(rows) == len(raw) > 0
    assert [(r.table, r.groups, r.m, r.n, r.k, r.tflops) for r in rows] == [
        (e["table"], int(e["groups"]), int(e["m"]), int(e["n"]), int(e["k"]), float(e["tflops"])) for e in raw]
    assert {r.table for r in rows} == {"normal", "contiguous", "masked", "wgrad", "grouped_wgrad"}
    assert sum(map(_reachable, raw)) == len(raw) - 2  # all but the two one-group masked rows


def _reachable(entry: dict[str, str]) -> bool:
    """A row a GEMM of its own shape reads: one group reads the dense tables (a masked
    kernel of one group is a grouped kernel, one point of the grouped curve)."""
    return entry["table"] in tables_of(grouped=int(entry["groups"]) > 1, weight_gradient=entry["table"].endswith("wgrad"))


@pytest.mark.parametrize("entry", [e for e in _csv_rows() if _reachable(e)], ids=lambda e: f"{e['table']}-{e['groups']}x{e['m']}x{e['n']}x{e['k']}")
def test_a_tabled_shape_runs_at_its_tables_rate(entry):
    groups, m, n, k = (int(entry[c]) for c in ("groups", "m", "n", "k"))
    weight_gradient = entry["table"].endswith("wgrad")
    expected = float(entry["tflops"]) * 1e12 / FP8_PEAK
    assert gemm_efficiency(TABLE, FP8_PEAK, groups=groups, m=m, n=n, k=k,
                           weight_gradient=weight_gradient) == pytest.approx(expected, rel=1e-12)


def test_a_tabled_forward_gemm_takes_its_flops_over_the_tables_rate():
    h800 = load_device("h800")
    # DeepGEMM's 4096 x 7168 x 16384 (DeepSeek-V3's attention output projection): 1358 TFLOP/s
    seconds = matmul_time(h800, 4096, 7168, 16384, fp8=True)
    assert seconds == pytest.approx(2 * 4096 * 7168 * 16384 / 1358e12 + h800.kernel_overhead_s, rel=1e-12)


@pytest.mark.parametrize("weight_gradient", [False, True])
@pytest.mark.parametrize("groups", [1, 4])
def test_efficiency_is_bounded_and_grows_with_the_tokens(groups, weight_gradient):
    tokens = np.geomspace(1, 1 << 16, 200)
    for n, other in ((4096, 7168), (7168, 2048), (2112, 7168), (24576, 1536), (300, 100000)):
        if weight_gradient:  # the weight is other x n, reduced over the tokens
            values = [gemm_efficiency(TABLE, FP8_PEAK, groups=groups, m=other, n=n, k=t, weight_gradient=True)
                      for t in tokens]
        else:
            values = [gemm_efficiency(TABLE, FP8_PEAK, groups=groups, m=t, n=n, k=other) for t in tokens]
        assert all(0 < v <= 1 for v in values)
        assert all(a <= b for a, b in itertools.pairwise(values))


def test_weight_gradients_run_slower_than_the_forward_of_the_same_projection():
    # DeepSeek-V3's q/kv down-projection: forward 4096 x 2112 x 7168, its weight gradient
    # 7168 x 2112 reduced over the 4096 tokens
    forward = gemm_efficiency(TABLE, FP8_PEAK, groups=1, m=4096, n=2112, k=7168)
    weight = gemm_efficiency(TABLE, FP8_PEAK, groups=1, m=7168, n=2112, k=4096, weight_gradient=True)
    assert weight < forward


def test_bf16_and_untabled_fp8_times_do_not_read_the_table():
    h800 = load_device("h800")
    plain = dataclasses.replace(h800, fp8_gemm_table="")
    for shape in ((4096, 7168, 16384), (8192, 4096, 7168), (7, 4096, 7168)):
        assert matmul_time(h800, *shape) == matmul_time(plain, *shape)
        assert matmul_time(h800, *shape, weight_gradient=True) == matmul_time(plain, *shape)
    model = load_model("deepseek-v3")
    settings = TrainingSettings(seq_len=4096, tensor_parallel=1)
    costs = [[(k.forward_s, k.backward_input_s, k.backward_weight_s) for k in layer.kernels]
             for layer in (layer_ops(model, device, settings)[4] for device in (h800, plain))]
    assert costs[0] == costs[1]


def test_a_bad_table_is_refused_with_the_field():
    with pytest.raises(PipeschedError, match=r"fp8_gemm_table"):
        load_gemm_table("no-such-table")
    with pytest.raises(PipeschedError, match=r"row 1\.tflops"):
        parse_gemm_table("table,groups,m,n,k,tflops\nnormal,1,64,64,64,-3\n", source="t")
    with pytest.raises(PipeschedError, match=r"h800\.fp8_gemm_table"):
        dataclasses.replace(load_device("h800"), fp8_gemm_table="deepgemm_h900")


def test_a_cluster_file_names_or_clears_the_table():
    text = """name: one
nodes:
  - count: 1
    devices:
      - {preset: h800}
      - {preset: h800, fp8_gemm_table: ""}
      - {name: hopper-like, peak_flops: 989 TFLOP/s, fp8_peak_flops: 1979 TFLOP/s, memory: 80 GiB,
         memory_bandwidth: 3.35 TB/s, fp8_gemm_table: deepgemm_h800}
intra_node: {bandwidth: 450 GB/s, latency: 3 us}
inter_node: {bandwidth: 400 Gb/s, latency: 5 us}
"""
    devices = parse_cluster(text, source="one").devices
    assert [d.fp8_gemm_table for d in devices] == [TABLE, "", TABLE]
    with pytest.raises(PipeschedError, match=r"fp8_gemm_table"):
        parse_cluster(text.replace('fp8_gemm_table: ""', "fp8_gemm_table: 3"), source="one")


def test_the_dualpipe_pair_lies_between_its_longer_part_and_the_two_back_to_back():
    cluster = load_cluster("8x8-h800")
    settings = TrainingSettings(micro_batch_size=1, seq_len=4096, dtype="fp8", recompute="none",
                                tensor_parallel=1, expert_parallel=64, sequence_parallel=False,
                                moe_dispatcher="deepep")
    groups = expert_group_levels(cluster, settings, 0, settings.tensor_parallel)
    ops = layer_ops(load_model("deepseek-v3"), cluster.devices[0], settings, tp_link=cluster.intra_node,
                    groups=groups)
    chunk = [layer_phases(entry) for entry in ops[4:8]]
    cost = chunk_pair(chunk, chunk, comm_sm_fraction=cluster.devices[0].comm_sm_fraction)
    assert max(cost.forward_s, cost.backward_s) <= cost.pair_s <= cost.forward_s + cost.backward_s
