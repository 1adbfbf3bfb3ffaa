"""Measured communication lanes: a real 2-rank run records every point-to-point message.

The messages a schedule sends come from the communication pass (``passes.communication
.messages``, with the dependency edges each carries); every one must be a transfer row of the
measured timeline, posted after its producing op ended and taken before any op that reads it
started. The check page and the run page then draw and name the lanes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from pipesched.dependencies import dependencies
from pipesched.generators import generate
from pipesched.model import load_model
from pipesched.pairing import Comparison
from pipesched.passes.communication import messages
from pipesched.render.html import measured_section, render_comparison_html
from pipesched.runtime.runs import RunOptions, run_schedules
from pipesched.timeline import ALLREDUCE

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MODEL = load_model("tiny")
OPTIONS = RunOptions(micro_batch_size=1, seq_len=8, dtype="float32", steps=1, warmup=1, timeout_s=120)
# per runtime, the families run: plain point-to-point; replicas with their all-reduces; a V
# whose turn stays on one rank (no message there)
FAMILIES = {"ours": ("1f1b", "dualpipe"), "pytorch": ("zb-v",)}
CASES = [(runtime, index) for runtime, names in FAMILIES.items() for index in range(len(names))]


@pytest.fixture(scope="module")
def launched():
    return {runtime: run_schedules([generate(name, 2, 4) for name in names], MODEL, options=OPTIONS, runtime=runtime)
            for runtime, names in FAMILIES.items()}


@pytest.fixture(scope="module")
def runs(launched):
    return launched["ours"]


def _row_of(timeline, device: int, op) -> int:
    rows = [r for r in np.flatnonzero(timeline.op_device == device) if timeline.op(int(r)) == op]
    assert len(rows) == 1, (device, op)
    return int(rows[0])


@pytest.mark.parametrize(("runtime", "index"), CASES, ids=[f"{r}-{FAMILIES[r][i]}" for r, i in CASES])
def test_every_message_is_a_transfer_between_its_producer_and_its_consumers(launched, runtime, index):
    result = launched[runtime][index]
    assert result.runtime == runtime
    schedule, timeline = result.schedule, result.timeline
    table = timeline.transfers
    sent = messages(schedule)
    plain = np.flatnonzero(table.kind != ALLREDUCE)
    assert len(plain) == len(sent) > 0
    rows = {(int(table.kind[r]), int(table.stage[r]), int(table.microbatch[r]), int(table.src_device[r]),
             int(table.dst_device[r])): int(r) for r in plain}
    assert len(rows) == len(plain)  # one row per message
    ops = list(schedule.ops())
    consumer, _, _ = dependencies(schedule).edges
    for m in range(len(sent)):
        key = (int(sent.kind[m]), int(sent.stage[m]), int(sent.microbatch[m]), int(sent.src[m]), int(sent.dst[m]))
        row = rows[key]
        start, end = table.start[row], table.end[row]
        assert start <= end
        assert table.nbytes[row] > 0
        assert table.channel_names[table.channel[row]] == f"{key[3]}->{key[4]}"
        producer = _row_of(timeline, *ops[int(sent.producer[m])])
        assert timeline.op_end[producer] <= start
        readers = consumer[sent.via == m]
        assert readers.size
        for reader in readers.tolist():
            assert timeline.op_start[_row_of(timeline, *ops[reader])] >= end
    if schedule.placement.num_replicas > 1:
        assert np.count_nonzero(table.kind == ALLREDUCE) > 0


def test_the_check_page_and_the_run_page_name_the_lanes(runs):
    timeline = runs[0].timeline
    count = int(np.count_nonzero(timeline.transfers.kind != ALLREDUCE))
    page = render_comparison_html([Comparison(predicted=timeline, measured=timeline, step_times=(timeline.makespan,))])
    assert "no communication lanes" not in page and f"{count} point-to-point transfers" in page
    data = json.loads(page.split('<script type="application/json" id="report-data">', 1)[1].split("</script>", 1)[0])
    assert len(data["timelines"][1]["transfers"]["start"]) == len(timeline.transfers)
    notes = measured_section(timeline)
    assert f"{count} point-to-point transfers" in notes


def test_run_html_draws_the_lanes(cli, tmp_path):
    page = tmp_path / "run.html"
    trace = tmp_path / "run.trace"
    result = cli("run", "1f1b", "-p", "2", "-m", "2", "--model", "tiny", "-s", "8", "--steps", "1", "--warmup", "1",
                 "--runtime", "ours", "--html", str(page), "--perfetto", str(trace))
    assert result.code == 0, result.err
    text = page.read_text()
    assert "point-to-point transfers" in text and "no communication lanes" not in text
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert any("0->1" in name for name in names) and any("1->0" in name for name in names)
