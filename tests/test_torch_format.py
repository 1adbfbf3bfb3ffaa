"""Our CSV against PyTorch's own parser and lowering passes."""

from __future__ import annotations

import csv
import io as _io

import pytest

from pipesched import io
from pipesched.generators import FAMILIES, generate

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def _torch_rows(text: str):
    return [[torch_schedules._Action.from_str(cell) for cell in row] for row in csv.reader(_io.StringIO(text))]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"])
def test_pytorch_parses_our_csv_to_the_same_actions(name: str) -> None:
    if name not in FAMILIES:
        pytest.fail(f"family {name} is not registered")
    schedule = generate(name, 4, 8)
    rows = _torch_rows(io.dumps(schedule, "csv"))
    for device, row in enumerate(rows):
        actions = [a for a in row if a is not None]
        assert [str(a) for a in actions] == [str(op) for op in schedule.device_ops[device]]
        assert [a.computation_type.value for a in actions] == [op.kind.value for op in schedule.device_ops[device]]


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v", "dualpipev"])
def test_pytorch_lowering_accepts_our_tables(name: str) -> None:
    if name not in FAMILIES:
        pytest.fail(f"family {name} is not registered")
    schedule = generate(name, 4, 8)
    rows = _torch_rows(io.dumps(schedule, "csv"))
    compute = {rank: [a for a in row if a is not None] for rank, row in enumerate(rows)}
    stage_to_rank = dict(enumerate(schedule.placement.replicas[0]))
    lowered = torch_schedules._add_send_recv(
        compute, stage_to_rank=lambda s: stage_to_rank[s], num_stages=schedule.num_stages
    )
    sends = sum(1 for actions in lowered.values() for a in actions if a.computation_type.value.startswith("SEND"))
    crossings = sum(
        1 for _, op in schedule.ops()
        if op.kind.value in "FIB"
        and 0 <= op.stage + (1 if op.kind.value == "F" else -1) < schedule.num_stages
        and stage_to_rank[op.stage] != stage_to_rank[op.stage + (1 if op.kind.value == "F" else -1)]
    )
    assert sends == crossings


def test_our_loader_reads_pytorch_generated_table(tmp_path) -> None:
    """PyTorch's 1F1B rank tables (its `_get_1f1b_rank_ops` with one local stage), written with
    the same csv writer its `_dump_csv` uses, load to our 1f1b table."""
    p, m = 4, 8
    path = tmp_path / "torch.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        for rank in range(p):
            warmup = min(p - 1 - rank, m)
            row = torch_schedules._get_1f1b_rank_ops(
                1, p, warmup, m - warmup, warmup, rank,
                forward_stage_index=lambda op, r=rank: r, backward_stage_index=lambda op, r=rank: r,
            )
            writer.writerow(row)
    loaded = io.load_schedule(path)
    assert loaded.device_ops == generate("1f1b", p, m).device_ops
    assert loaded.name == "torch"
