"""A serving run drawn: its Timeline (one op per iteration and stage group, kinds by content,
sends and KV moves as transfers, the KV cache as memory, a bounded window), the training
views reading it, and the request-level plots. Runs are written by hand here, every
expectation worked from the hand table."""

from __future__ import annotations

import base64
import dataclasses
import doctest
import json
import re

import numpy as np
import pytest
from rich.console import Console

import pipesched.serving.timeline as serving_timeline_module
from pipesched.enums import MemoryUnit, Preemption, SchedulerName
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.render.gantt import gantt_figure, render_gantt
from pipesched.render.html import render_html
from pipesched.render.serving import (
    PLOTS,
    probe_rows,
    request_figure,
    request_latencies,
    serving_figure,
    serving_report,
)
from pipesched.render.terminal import timeline_view
from pipesched.render.trace import trace_document
from pipesched.serving.capacity import Probe
from pipesched.serving.config import Disaggregation, Instances, SchedulerSpec, ServeConfig
from pipesched.serving.engine import simulate_serving
from pipesched.serving.records import IterationLog, KVMoves, KVTrace, ServeRun
from pipesched.serving.results import Summary, serve_result
from pipesched.serving.timeline import SERVING_RULES, iteration_kinds, serving_timeline
from pipesched.serving.trace import Trace
from pipesched.slots import slot_table
from pipesched.timeline import ACTIVATION, KV_CACHE, SWAP_IN, SWAP_OUT, Source
from pipesched.validation import validate
from pipesched.waits import WAIT_DEVICE, WAIT_NONE, WAIT_TRANSFER, waited_for
from serving_engine_helpers import Line, deployment, poisson_trace

BLOCK = 16  # tokens per KV block
BYTES_PER_TOKEN = (1024.0, 2048.0)  # per device, stage 0 and stage 1
SEND_BYTES = 8192.0

# one replica, 2 stages of tp 2 (ranks 0-1, 2-3); per batch: prefill tokens, decodes, KV
# tokens read, requests, and per stage (start, end, hidden state arrived at the next stage)
BATCHES = [
    (100, 0, 0, [0], [(0.000, 0.010, 0.011), (0.011, 0.021, 0.021)]),
    (50, 1, 100, [1, 0], [(0.010, 0.016, 0.017), (0.021, 0.027, 0.027)]),
    (0, 2, 151, [0, 1], [(0.016, 0.019, 0.020), (0.027, 0.030, 0.030)]),
    (0, 2, 153, [0, 1], [(0.030, 0.033, 0.034), (0.034, 0.037, 0.037)]),
]


def hand_log(batches, instances=None, first_ranks=None) -> IterationLog:
    """The IterationLog of ``batches`` (rows batch by batch, stage by stage)."""
    instances = instances or [0] * len(batches)
    rows = [(b, instances[b], s, st, en, se, pf, dc, kv)
            for b, (pf, dc, kv, _, stages) in enumerate(batches) for s, (st, en, se) in enumerate(stages)]

    def column(k, dtype):
        return np.array([r[k] for r in rows], dtype)

    ranks = first_ranks or (lambda i, s: 2 * s)
    members = np.array([m for b in batches for m in b[3]], np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(b[3]) for b in batches]))).astype(np.int64)
    return IterationLog(column(0, np.int64), column(1, np.int32), column(2, np.int32),
                        np.array([ranks(r[1], r[2]) for r in rows], np.int32), column(3, float), column(4, float),
                        column(6, np.int64), column(7, np.int64), column(8, np.int64), np.ones(len(rows)), members,
                        offsets, send_end=column(5, float), send_bytes=np.full(len(rows), SEND_BYTES))


def hand_run(*, per_token=(BYTES_PER_TOKEN,), moves=None, sends=True) -> ServeRun:
    """Two requests through one replica of two stages (BATCHES); request 1 swapped out at 20 ms."""
    trace = Trace(np.array([0.0, 0.005]), np.array([100, 50]), np.array([3, 2]))
    log = hand_log(BATCHES)
    if not sends:
        log = IterationLog(*(getattr(log, name) for name in (
            "batch", "instance", "stage", "first_device", "start", "end", "prefill_tokens", "decodes", "kv_tokens",
            "flops", "members", "offsets")))
    kv = KVTrace((np.array([0.0, 0.010, 0.016, 0.037]),), (np.array([7, 7, 11, 0]),), (16,), BLOCK,
                 preempted_at=(np.array([0.020]),))
    if moves is None:
        moves = KVMoves(np.array([1]), ("swap-out",), np.array([2], np.int32), np.array([-1], np.int32),
                        np.array([1e6]), np.array([0.020]), np.array([0.022]))
    # tokens: request 0 at 21, 27, 30 ms... as the batches above make them
    token_times = np.array([0.021, 0.027, 0.030, 0.027, 0.037])
    return ServeRun(trace, ServeConfig(instances=Instances(tp=2, pp=2, count=1)), np.zeros(2, np.int32),
                    np.array([0.0, 0.010]), np.array([0.021, 0.027]), np.array([0.030, 0.037]), np.array([0, 1], np.int32),
                    token_times, np.array([0, 3, 5]), log, kv, ("replica",), ((0, 2),), (2,), 1e15, moves=moves,
                    kv_bytes_per_token=per_token)


def test_one_op_per_iteration_and_stage_group():
    timeline = serving_timeline(hand_run())
    assert len(timeline) == 8 and timeline.num_devices == 2 and timeline.source == Source.SIMULATED
    assert timeline.schedule.rules is SERVING_RULES and validate(timeline.schedule) == []
    # table order: stage 0's four iterations, then stage 1's, each at its hand time
    got = [(int(d), str(timeline.op(r)), float(timeline.op_start[r]), float(timeline.op_end[r]))
           for r, d in enumerate(timeline.op_device)]
    kinds = ["P", "M", "D", "D"]  # prefill only; prefill + decode; decodes only (twice)
    expected = [(s, f"{s}{kinds[b]}{b}", BATCHES[b][4][s][0], BATCHES[b][4][s][1]) for s in (0, 1) for b in range(4)]
    assert got == expected
    info = timeline.serving
    assert info.device_labels == ("r0 s0", "r0 s1")
    assert info.device_names == ("replica 0 · stage 0 · ranks 0-1", "replica 0 · stage 1 · ranks 2-3")
    assert info.batch.tolist() == [0, 1, 2, 3] and info.prefill_tokens.tolist() == [100, 50, 0, 0]
    assert info.kv_tokens.tolist() == [0, 100, 151, 153]
    assert [info.members[info.offsets[k]:info.offsets[k + 1]].tolist() for k in range(4)] == [[0], [1, 0], [0, 1], [0, 1]]
    assert info.how == "every iteration of the run (4)"
    assert timeline.schedule.name == "sarathi · 1 x TP2 PP2"  # the default scheduler, its shape


def test_iteration_kinds_by_content():
    letters = [SERVING_RULES.kinds[k].kind for k in iteration_kinds(np.array([7, 0, 3, 0]), np.array([0, 4, 1, 1]))]
    assert letters == ["P", "D", "M", "D"]


def test_hidden_state_sends_and_what_each_op_waited_for():
    timeline = serving_timeline(hand_run())
    table = timeline.transfers
    sends = np.flatnonzero(table.kind == ACTIVATION)
    # each batch's stage 0 sends to stage 1 from its end to the recorded arrival
    assert [(float(table.start[t]), float(table.end[t])) for t in sends] == [
        (BATCHES[b][4][0][1], BATCHES[b][4][0][2]) for b in range(4)]
    assert set(table.nbytes[sends].tolist()) == {SEND_BYTES}
    assert table.channel_names[table.channel[sends[0]]] == "r0 s0 → r0 s1"
    waits = waited_for(timeline)
    row = {str(timeline.op(r)): r for r in range(len(timeline))}
    # 1P0 started at 11 ms, when its hidden state arrived; 1M1 at 21 ms, when 1P0 freed the
    # stage (its input had arrived at 17 ms); 1D3 at 34 ms, its input again
    assert waits.cause[row["1P0"]] == WAIT_TRANSFER
    assert waits.cause[row["1M1"]] == WAIT_DEVICE and waits.ref[row["1M1"]] == row["1P0"]
    assert waits.cause[row["1D3"]] == WAIT_TRANSFER
    # without recorded sends the stage need stands: no transfers, the op before on stage 0
    bare = serving_timeline(hand_run(sends=False))
    assert len(bare.transfers.kind[bare.transfers.kind == ACTIVATION]) == 0
    bare_waits = waited_for(bare)
    assert int(bare_waits.ref[row["1P0"]]) == row["0P0"]


def test_kv_cache_is_the_memory_trace():
    timeline = serving_timeline(hand_run())
    memory = timeline.memory
    assert memory.unit == MemoryUnit.BYTES
    # blocks 7, 7, 11, then 0 at the end: x 16 tokens x the stage's bytes per token per device
    for stage, per_token in enumerate(BYTES_PER_TOKEN):
        assert memory.values[stage].tolist() == [b * BLOCK * per_token for b in (7, 7, 11, 0)]
        assert memory.capacity[stage] == 16 * BLOCK * per_token
    assert memory.times[0].tolist() == [0.0, 0.010, 0.016, 0.037]
    assert not any(memory.out_of_memory)
    tokens = serving_timeline(hand_run(per_token=())).memory
    assert tokens.unit == MemoryUnit.KV_TOKENS and tokens.values[1].tolist() == [112.0, 112.0, 176.0, 0.0]


def test_kv_moves_are_transfers_on_their_links():
    timeline = serving_timeline(hand_run())
    table = timeline.transfers
    swap = int(np.flatnonzero(table.kind == SWAP_OUT)[0])
    # rank 2 is stage 1's group; host memory is that device's own host link
    assert (int(table.src_device[swap]), int(table.dst_device[swap])) == (1, 1)
    assert table.channel_names[table.channel[swap]] == "r0 s1 host link"
    assert (float(table.start[swap]), float(table.end[swap]), float(table.nbytes[swap])) == (0.020, 0.022, 1e6)
    assert timeline.serving.transfer_request[swap] == 1
    assert (timeline.serving.transfer_request[table.kind == ACTIVATION] == -1).all()


def disaggregated_run() -> ServeRun:
    """A prefill instance of 1 stage (ranks 0-1) and a decode instance of 2 stages (ranks
    2-3, 4-5); one request's cache sent from rank 0 to rank 2 after its prefill."""
    batches = [(64, 0, 0, [0], [(0.0, 0.004, 0.004)]),
               (0, 1, 64, [0], [(0.006, 0.007, 0.0075), (0.0075, 0.0085, 0.0085)])]
    log = hand_log(batches, instances=[0, 1], first_ranks=lambda i, s: 0 if i == 0 else 2 + 2 * s)
    moves = KVMoves(np.array([0]), ("transfer",), np.array([0], np.int32), np.array([2], np.int32),
                    np.array([4096.0]), np.array([0.004]), np.array([0.006]))
    kv = KVTrace((np.array([0.0, 0.004]), np.array([0.006, 0.0085])), (np.array([4, 0]), np.array([5, 0])),
                 (8, 8), BLOCK)
    config = ServeConfig(disaggregate=Disaggregation(Instances(tp=2, pp=1, count=1), Instances(tp=2, pp=2, count=1)))
    return ServeRun(Trace(np.array([0.0]), np.array([64]), np.array([2])), config, np.array([1], np.int32),
                    np.array([0.0]), np.array([0.004]), np.array([0.0085]), np.zeros(1, np.int32),
                    np.array([0.004, 0.0085]), np.array([0, 2]), log, kv, ("prefill", "decode"), ((0,), (2, 4)),
                    (2, 2), 1e15, moves=moves)


def test_disaggregated_instances_are_rows_of_their_own():
    timeline = serving_timeline(disaggregated_run())
    info = timeline.serving
    assert info.device_labels == ("pf0 s0", "dc0 s0", "dc0 s1")
    assert info.device_names[2] == "decode 0 · stage 1 · ranks 4-5"
    assert timeline.schedule.name == "sarathi · prefill 1 x TP2 PP1 + decode 1 x TP2 PP2"
    # the prefill on device 0 only, the decode batch on devices 1 and 2: global stages 0, 1, 2
    assert [str(timeline.op(r)) for r in range(len(timeline))] == ["0P0", "1D1", "2D1"]
    assert validate(timeline.schedule) == []
    table = timeline.transfers
    moved = int(np.flatnonzero(table.kind == KV_CACHE)[0])
    assert (int(table.src_device[moved]), int(table.dst_device[moved])) == (0, 1)
    assert table.channel_names[table.channel[moved]] == "pf0 s0 → dc0 s0"
    # the decode instance's first stage needs nothing from the prefill instance's last: 1D1
    # starts its device and waits for nothing; 2D1 waits for 1D1's hidden state
    waits = waited_for(timeline)
    assert waits.cause[1] == WAIT_NONE and waits.cause[2] == WAIT_TRANSFER
    # each device's memory is its own instance's cache, from the window's start
    assert timeline.memory.values[0].tolist() == [4 * BLOCK, 0.0]
    assert timeline.memory.times[2].tolist() == [0.0, 0.006, 0.0085]
    assert timeline.memory.values[2].tolist() == [0.0, 5 * BLOCK, 0.0]


def long_run(batches: int = 50, peak: int = 30) -> ServeRun:
    """One stage, one decode batch per ms; the KV cache fullest when batch ``peak`` starts."""
    rows = [(0, 1, 10, [0], [(k * 1e-3, (k + 1) * 1e-3, (k + 1) * 1e-3)]) for k in range(batches)]
    log = hand_log(rows)
    blocks = np.where(np.arange(batches) == peak, 9, 3)
    kv = KVTrace((np.arange(batches) * 1e-3,), (blocks,), (10,), BLOCK)
    return ServeRun(Trace(np.array([0.0]), np.array([1]), np.array([batches + 1])),
                    ServeConfig(instances=Instances(tp=1, pp=1, count=1)), np.zeros(1, np.int32), np.array([0.0]),
                    np.array([1e-3]), np.array([batches * 1e-3]), np.zeros(1, np.int32),
                    np.arange(1, batches + 2) * 1e-3, np.array([0, batches + 1]), log, kv, ("replica",), ((0,),),
                    (1,), 1e15)


def test_the_default_window_is_around_the_fullest_cache():
    timeline = serving_timeline(long_run(), iterations=10)
    # 10 batches centred on batch 30 (5 before it): 25..34
    assert timeline.serving.batch.tolist() == list(range(25, 35))
    assert timeline.serving.how.startswith("10 of the run's 50 iterations, around 0.03 s")
    assert "90% of its blocks" in timeline.serving.how
    # near the end the window keeps its size: 40..49
    assert serving_timeline(long_run(peak=48), iterations=10).serving.batch.tolist() == list(range(40, 50))


def test_an_explicit_window_takes_the_iterations_running_in_it():
    timeline = serving_timeline(long_run(), window=(0.0105, 0.0135))
    # batches run [k, k+1) ms: 10, 11, 12 and 13 overlap 10.5..13.5 ms
    assert timeline.serving.batch.tolist() == [10, 11, 12, 13]
    assert timeline.serving.window == (0.010, 0.014)
    assert [int(mb) for mb in timeline.op_microbatch] == [0, 1, 2, 3]


@pytest.mark.parametrize(("window", "fragment"), [
    ((0.02, 0.01), r"^window=\(0\.02, 0\.01\): give \(start, end\) seconds"),
    ((1.0, 2.0), r"^window=1\.\.2: no iteration runs in it; the run spans 0 to 0\.05 s$"),
    ((float("nan"), 1.0), r"^window=\(nan, 1\.0\): give"),
])
def test_a_bad_window_is_one_line(window, fragment):
    with pytest.raises(PipeschedError, match=fragment):
        serving_timeline(long_run(), window=window)


def test_a_window_of_too_many_iterations_is_refused(monkeypatch):
    monkeypatch.setattr("pipesched.serving.timeline.MAX_VIEW_ITERATIONS", 3)
    with pytest.raises(PipeschedError, match=r"^window=0\.\.0\.01: 10 iterations; a view draws at most 3"):
        serving_timeline(long_run(), window=(0.0, 0.01))
    with pytest.raises(PipeschedError, match=r"^iterations=0: give a whole number"):
        serving_timeline(long_run(), iterations=0)


def report_data(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)[1])


def test_the_html_report_carries_each_batch_for_its_hovers():
    data = report_data(render_html([serving_timeline(hand_run())]))
    panel = data["timelines"][0]
    serving = panel["serving"]
    assert serving["deviceLabels"] == ["r0 s0", "r0 s1"]
    assert serving["prefillTokens"] == [100, 50, 0, 0] and serving["decodes"] == [0, 1, 2, 2]
    assert serving["kvTokens"] == [0, 100, 151, 153] and serving["requestRows"] == [[0], [1, 0], [0, 1], [0, 1]]
    assert data["kinds"]["letters"] == ["P", "D", "M"]
    assert len(set(data["kinds"]["colors"])) == 3
    assert panel["headline"] == "window 37 ms: 4 of 4 iterations · idle 40.5% · KV cache peak 352.00 KiB"
    # a training report carries no serving data
    assert "serving" not in report_data(render_html([slot_table(generate("1f1b", 2, 2))]))["timelines"][0]


def test_idle_share_in_the_headline_is_the_stages_idle_time():
    timeline = serving_timeline(hand_run())
    # stage 0 busy 10 + 6 + 3 + 3 = 22 of 37 ms, stage 1 busy 10 + 6 + 3 + 3 = 22 of 37 ms
    assert timeline.bubble_ratio() == pytest.approx(1 - 44 / 74)


def test_the_trace_names_stage_groups_and_batch_contents():
    events = trace_document([serving_timeline(hand_run())])["traceEvents"]
    processes = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    name = "sarathi · 1 x TP2 PP2"
    assert processes == [f"{name} · replica 0 · stage 0 · ranks 0-1", f"{name} · replica 0 · stage 1 · ranks 2-3",
                         f"{name} · critical path"]
    op = next(e for e in events if e["ph"] == "X" and e["name"] == "1M1")
    assert (op["args"]["batch"], op["args"]["requests"], op["args"]["request rows"]) == (1, 2, [1, 0])
    assert (op["args"]["prefill tokens"], op["args"]["decodes"], op["args"]["kv tokens read"]) == (50, 1, 100)
    assert op["cat"] == "mixed prefill + decode iteration"
    swap = next(e for e in events if e["ph"] == "X" and e["name"] == "swap-out")
    assert swap["args"]["request"] == 1 and swap["args"]["bytes"] == 1e6


def test_the_gantt_chart_and_terminal_label_rows_by_stage_group():
    timeline = serving_timeline(hand_run())
    built = gantt_figure([timeline])
    ops_axes = built.figure.axes[0]
    labels = [tick.get_text() for tick in ops_axes.get_yticklabels()]
    assert labels[:2] == ["r0 s0", "r0 s1"] and "r0 s1 host link" in labels
    assert built.op_boxes == 8 and built.transfer_boxes == 5
    legend = [text.get_text() for text in built.figure.legends[0].get_texts()]
    assert {"P  prefill iteration", "D  decode iteration", "M  mixed prefill + decode iteration",
            "activation transfer", "swap-out transfer"} <= set(legend)
    assert render_gantt([timeline], fmt="svg").count(b'xlink:href="#op-0-') == 8
    console = Console(width=120, record=True, color_system=None)
    console.print(timeline_view(timeline, width=120))
    lines = console.export_text().splitlines()
    assert lines[0].startswith("sarathi · 1 x TP2 PP2 (simulated): window 37 ms: 4 of 4 iterations")
    assert lines[1].startswith("r0 s0 ") and lines[2].startswith("r0 s1 ")


def test_request_latencies_by_hand():
    found = request_latencies(hand_run())
    # arrivals 0 and 5 ms; first tokens at 21 and 27 ms
    assert found.ttft_s.tolist() == pytest.approx([0.021, 0.022])
    # request 0's tokens at 21, 27, 30 ms; request 1's at 27, 37 ms: no gap across requests
    assert found.tbt_s.tolist() == pytest.approx([0.006, 0.003, 0.010])


def test_probes_are_read_from_capacity_probes_or_their_dicts():
    fast, slow = Summary(0.1, 0.1, 0.2, 0.3), Summary(0.2, 0.2, 0.5, 0.9)
    gap = Summary(0.01, 0.01, 0.02, 0.03)
    record = Probe(4.0, 0.5, False, 2.0, slow, gap, gap, slow)
    rows = probe_rows([record, Probe(2.0, 1.0, True, 2.0, fast, gap, gap, fast).to_dict(), {"qps": 3.0}])
    assert rows["qps"].tolist() == [2.0, 3.0, 4.0]  # sorted by rate
    assert rows["ttft_p99_s"][[0, 2]].tolist() == [0.3, 0.9] and np.isnan(rows["ttft_p99_s"][1])
    assert rows["tbt_p50_s"][[0, 2]].tolist() == [0.01, 0.01] and rows["attainment"][[0, 2]].tolist() == [1.0, 0.5]
    with pytest.raises(PipeschedError, match=r"^probes\.qps=missing: give each probe its request rate"):
        probe_rows([{"ttft_s": {"p50": 0.2}}])


def lines_by_label(ax) -> dict[str, object]:
    handles, labels = ax.get_legend_handles_labels()
    return dict(zip(labels, handles, strict=True))


def test_distributions_draw_the_results_percentiles_and_the_slo():
    run = hand_run()
    result = {"ttft_s": {"mean": 0.0215, "p50": 0.0215, "p90": 0.0219, "p99": 0.02199}}
    figure = request_figure(run, result, slo_ttft=0.0215, slo_tpot=0.005, plots=("ttft", "tbt"))
    ttft, tbt = figure.axes
    lines = lines_by_label(ttft)
    # the result's p50 drawn (ms); the SLO line says one of the two requests (21 of 21, 22 ms) is within it
    assert lines["p50 21.5 ms"].get_xdata()[0] == pytest.approx(21.5)
    assert lines["TTFT SLO 21.5 ms: 50.0% of requests within"].get_xdata()[0] == pytest.approx(21.5)
    # the CDF reaches 1 at the slowest request
    curve = ttft.lines[0]
    assert curve.get_ydata()[-1] == 1.0 and curve.get_xdata()[-1] == pytest.approx(22.0)
    # no result for TBT: numpy's percentiles of the three gaps; the TPOT SLO holds one of three (3 ms)
    gaps = np.array([6.0, 3.0, 10.0])
    assert lines_by_label(tbt)[f"p50 {np.percentile(gaps, 50):.4g} ms"].get_xdata()[0] == pytest.approx(6.0)
    assert "TPOT SLO 5 ms: 33.3% of token gaps within" in lines_by_label(tbt)


def test_the_rate_plot_and_kv_plot():
    probes = [{"qps": 1.0, "ttft_s": {"p50": 0.1, "p99": 0.3}, "attainment": 1.0},
              {"qps": 3.0, "ttft_s": {"p50": 0.2, "p99": 0.9}, "attainment": 0.5}]
    figure = request_figure(hand_run(), probes=probes, slo_ttft=0.5, plots=("rate", "kv"))
    by_label = {ax.get_ylabel(): ax for ax in figure.axes}
    rate, kv = by_label["latency (s)"], by_label["blocks in use / capacity"]
    share = by_label["share of requests within the SLOs"]
    assert lines_by_label(rate)["TTFT p99"].get_ydata().tolist() == [0.3, 0.9]
    assert share.lines[0].get_ydata().tolist() == [1.0, 0.5]
    assert lines_by_label(rate)["TTFT SLO 500 ms"].get_ydata()[0] == 0.5
    # blocks 7, 7, 11, 0 of 16; the preemption at 20 ms marked at 11/16
    curve = lines_by_label(kv)["replica 0 (16 blocks)"]
    assert curve.get_ydata().tolist() == [7 / 16, 7 / 16, 11 / 16, 0.0, 0.0]
    marks = lines_by_label(kv)["preemption"]
    assert marks.get_xdata().tolist() == pytest.approx([20.0]) and marks.get_ydata().tolist() == [11 / 16]
    # no probes: the rate plot is left out
    assert len(request_figure(hand_run()).axes) == len(PLOTS) - 1


@pytest.mark.slow
def test_figure_files_and_bad_input():
    assert serving_figure(hand_run(), fmt="png").startswith(b"\x89PNG")
    assert b"<svg" in serving_figure(hand_run(), fmt="svg")
    with pytest.raises(PipeschedError, match=r"^format=gif: choose one of png, svg$"):
        serving_figure(hand_run(), fmt="gif")
    with pytest.raises(PipeschedError, match=r"^plot=bubble: choose among ttft, tbt, rate, kv$"):
        request_figure(hand_run(), plots=("bubble",))


@pytest.mark.slow
def test_the_serving_report_page():
    result = {"requests": 2, "ttft_s": {"mean": 0.0215, "p50": 0.0215, "p90": 0.0219, "p99": 0.02199},
              "throughput_tokens_per_s": 135.1, "per_request": [{"arrived_at": 0.0}]}
    probes = [{"qps": 1.0, "ttft_s": {"p50": 0.1, "p99": 0.3}}]
    page = serving_report(hand_run(), result, probes=probes, slo_ttft=0.025)
    plots = re.findall(r'<figure class="serving-plot" data-plot="(\w+)"><img src="data:image/svg\+xml;base64,([^"]+)"',
                       page)
    assert [name for name, _ in plots] == ["ttft", "tbt", "rate", "kv"]
    assert all(base64.b64decode(image).lstrip().startswith(b"<?xml") for _, image in plots)
    # the results table, the sections in the contents, the window drawn, and the timeline's data
    assert "<th>ttft_s</th><td>21.5 ms</td><td>21.5 ms</td><td>21.9 ms</td><td>21.99 ms</td>" in page
    assert "<th>throughput_tokens_per_s</th><td>135.1</td>" in page
    for anchor in ("serving-results", "serving-requests", "serving-window", "timelines-section"):
        assert f'href="#{anchor}"' in page and f'id="{anchor}"' in page
    assert "The timeline below draws every iteration of the run (4); the run spans 0 to 0.037 s." in page
    assert report_data(page)["timelines"][0]["serving"]["batch"] == [0, 1, 2, 3]


# an engine run: 2 replicas of 2 stages, every stage a latency line (serving_engine_helpers)
LINE = Line(base=0.003, token=2e-5, attention=3e-10, decode=1e-5, kv=2e-7, send=1e-6)


def engine_run(capacity: int = 300, preemption: Preemption = Preemption.RECOMPUTE) -> ServeRun:
    config = ServeConfig(instances=Instances(tp=1, pp=2, count=2),
                         scheduler=SchedulerSpec(name=SchedulerName.SARATHI, max_batch=32, chunk=512,
                                                 preemption=preemption))
    trace = poisson_trace(120, 40.0, prompt=(100, 600), output=(20, 200), seed=3)
    return simulate_serving(deployment(config, line=LINE, capacity_blocks=capacity), trace)


@pytest.mark.slow
def test_an_engine_run_drawn():
    run = engine_run()
    log = run.iterations
    timeline = serving_timeline(run, iterations=50)
    info = timeline.serving
    assert len(info.batch) == 50 and len(timeline) == 2 * 50
    # every op is its log row: (instance, stage) as device instance x 2 + stage, the same times
    rows = {(int(b), int(i) * 2 + int(s)): (float(a), float(e))
            for b, i, s, a, e in zip(log.batch, log.instance, log.stage, log.start, log.end, strict=True)}
    drawn = {(int(info.batch[mb]), int(d)): (float(a), float(e)) for mb, d, a, e in
             zip(timeline.op_microbatch, timeline.op_device, timeline.op_start, timeline.op_end, strict=True)}
    assert drawn == {key: rows[key] for key in drawn}
    # the window holds the moment the fullest cache was fullest
    shares = [(float(b.max()) / c, float(t[np.argmax(b)])) for t, b, c in
              zip(run.kv.times, run.kv.blocks, run.kv.capacity_blocks, strict=True)]
    at = max(shares)[1]
    assert timeline.op_start.min() <= at <= timeline.op_end.max()
    # each hidden state takes the line's send time: 1 us per token of its batch
    table = timeline.transfers
    sends = np.flatnonzero(table.kind == ACTIVATION)
    tokens = info.prefill_tokens[table.microbatch[sends]] + info.decodes[table.microbatch[sends]]
    assert (table.end[sends] - table.start[sends]).tolist() == pytest.approx((LINE.send * tokens).tolist())
    # the KV cache per device: blocks x block size x the stage's bytes per token (1e5 here)
    instance = 1
    blocks = run.kv.blocks[instance][(run.kv.times[instance] > timeline.origin)
                                     & (run.kv.times[instance] <= timeline.origin + timeline.makespan)]
    assert timeline.memory.values[2][1:].tolist() == (blocks * run.kv.block_size * 1e5).tolist()
    # the views draw it
    assert render_gantt([timeline], fmt="png").startswith(b"\x89PNG")
    assert len(trace_document([timeline])["traceEvents"]) > len(timeline)
    assert "report-data" in serving_report(run, serve_result(run).to_dict())


def test_preemptions_are_recorded_and_marked():
    run = engine_run(capacity=60)
    # one recorded time per preemption, each when its instance's cache was in use
    assert sum(len(times) for times in run.kv.preempted_at) == int(run.preemptions.sum()) > 0
    kv = lines_by_label(request_figure(run, plots=("kv",)).axes[0])["preemption"]
    assert len(kv.get_xdata()) == len(run.kv.preempted_at[0])


def test_an_engine_run_records_each_rows_send_and_the_stages_kv_bytes():
    # 3 stages, each with its own KV bytes per token; stages 0 and 1 send 8 KiB a token
    config = ServeConfig(instances=Instances(tp=1, pp=3, count=2),
                         scheduler=SchedulerSpec(name=SchedulerName.SARATHI, max_batch=32, chunk=256))
    built = deployment(config, line=LINE)
    hidden = 8192.0
    plans = tuple(dataclasses.replace(plan, stages=tuple(
        dataclasses.replace(costs, kv_bytes_per_token=1e5 * (s + 1), hidden_bytes_per_token=0.0 if s == 2 else hidden)
        for s, costs in enumerate(plan.stages))) for plan in built.instances)
    run = simulate_serving(dataclasses.replace(built, instances=plans), poisson_trace(40, 50.0, seed=4))
    assert run.kv_bytes_per_token == ((1e5, 2e5, 3e5),) * 2
    log = run.iterations
    tokens = (log.prefill_tokens + log.decodes).astype(float)
    sending = log.stage < 2
    # the line's send: 1 us a token to the next stage, arrived there at send_end; none from the last
    assert (log.send_end - log.end)[sending].tolist() == pytest.approx((LINE.send * tokens[sending]).tolist())
    assert np.array_equal(log.send_end[~sending], log.end[~sending])
    assert np.array_equal(log.send_bytes, np.where(sending, hidden * tokens, 0.0))
    # a batch's next stage starts once its hidden state has arrived
    order = np.lexsort((log.stage, log.batch))
    before, after = order[:-1], order[1:]
    same = log.batch[before] == log.batch[after]
    assert bool((log.start[after][same] >= log.send_end[before][same] - 1e-12).all())


@pytest.mark.parametrize("preemption", list(Preemption))
def test_each_preemption_is_timed_on_its_instance(preemption):
    run = engine_run(capacity=60, preemption=preemption)
    for i, times in enumerate(run.kv.preempted_at):
        # one time per preemption of the requests this replica serves, in time order, each a
        # moment its scheduler formed a batch (a KV-cache record of this instance then)
        assert len(times) == int(run.preemptions[run.instance == i].sum()) > 0
        assert bool((np.diff(times) >= 0).all()) and np.isin(times, run.kv.times[i]).all()
    split = Disaggregation(prefill=Instances(tp=1, pp=2, count=1), decode=Instances(tp=1, pp=1, count=2))
    config = ServeConfig(disaggregate=split, scheduler=SchedulerSpec(name=SchedulerName.VLLM, max_batch=32,
                                                                     preemption=preemption))
    run = simulate_serving(deployment(config, line=LINE, capacity_blocks=200),
                           poisson_trace(200, 40.0, prompt=(100, 600), output=(20, 300), seed=9))
    assert sum(len(times) for times in run.kv.preempted_at) == int(run.preemptions.sum()) > 0


def test_the_module_examples_run():
    failures, tried = doctest.testmod(serving_timeline_module, verbose=False)
    assert tried >= 2 and failures == 0


def test_swaps_of_an_engine_run_are_drawn_on_host_links():
    run = engine_run(capacity=60, preemption=Preemption.SWAP)
    timeline = serving_timeline(run, iterations=200)
    table = timeline.transfers
    low, high = timeline.origin, timeline.origin + timeline.makespan
    moves = run.moves
    shown = (moves.start < high) & (moves.end > low)
    swaps = (table.kind == SWAP_OUT) | (table.kind == SWAP_IN)
    # every swap overlapping the window, each on the host link of its instance's first stage
    assert int(swaps.sum()) == int(shown.sum()) > 0
    assert {table.channel_names[c] for c in table.channel[swaps]} <= {"r0 s0 host link", "r1 s0 host link"}
    assert sorted(table.start[swaps].tolist()) == sorted(moves.start[shown].tolist())
    with pytest.raises(PipeschedError, match=r"^iterations=True: give a whole number"):
        serving_timeline(run, iterations=True)
