"""Profiling layers and stages in isolation, the link between ranks, and the prediction
check (simulate, run, compare) on the tiny model."""

from __future__ import annotations

import csv
import dataclasses
import doctest
import importlib
import json
import math
import statistics
import sys

import pytest

from cli_helpers import assert_one_line_error

pytest.importorskip("torch")

from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.io.stage_costs import parse_stage_costs
from pipesched.model import load_model
from pipesched.model.loading import parse_layer_csv
from pipesched.partition import uniform
from pipesched.runtime.profile import (
    LinkProfile,
    ProfileOptions,
    add_op_overhead,
    fit_link,
    layer_costs_csv,
    profile_layers,
    profile_link,
    profile_stages,
    stage_costs_csv,
)

MODEL = load_model("tiny")
OPTIONS = ProfileOptions(micro_batch_size=2, seq_len=16, warmup=1, repeats=3)


@pytest.mark.parametrize("name", ["pipesched.runtime", "pipesched.passes.communication", "pipesched.runtime.profile",
                                  "pipesched.runtime.check"])
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_missing_torch_says_how_to_install_it(monkeypatch):
    from pipesched.runtime.torch_import import require_torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(PipeschedError, match=r"^torch is not installed; install it with pip install 'pipesched\[torch\]'$"):
        require_torch()


@pytest.mark.slow
def test_importing_the_runtime_package_does_not_import_torch():
    import subprocess

    code = "import sys, pipesched.runtime, pipesched.cli.run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def layers():
    return profile_layers(MODEL, OPTIONS)


@pytest.mark.slow
def test_profile_layers_gives_every_layer_its_costs(layers):
    assert [layer.name for layer in layers] == list(MODEL.layer_names)
    assert [layer.kind for layer in layers] == list(MODEL.layer_kinds)
    embedding, block, head = layers[0], layers[1], layers[-1]
    # the embedding's input (token ids) has no gradient: I does nothing, W all the backward
    assert embedding.backward_input_s < embedding.backward_weight_s
    assert all(t > 0 for t in (block.forward_s, block.backward_input_s, block.backward_weight_s))
    hidden_bytes = 2 * 16 * MODEL.hidden_size * 4  # b x s x h float32
    assert embedding.output_bytes == block.output_bytes == hidden_bytes
    assert head.output_bytes == 0  # the last layer sends nothing on
    assert block.activation_bytes > hidden_bytes  # at least its input is kept
    # q, k+v, out: h*h + 2*h*h + h*h; MLP: 2*h*f; two RMSNorm weights: 2*h (h=64, f=256)
    assert block.params == 4 * 64 * 64 + 2 * 64 * 256 + 2 * 64
    # blocks of one model are alike: timed once, every block gets the numbers
    assert len({(layer.forward_s, layer.backward_input_s) for layer in layers[1:-1]}) == 1


def test_layer_csv_loads_as_a_measured_model(layers):
    model = parse_layer_csv(layer_costs_csv(layers), name="tiny-measured")
    assert [layer.kind for layer in model.measured] == list(MODEL.layer_kinds)
    for read, measured in zip(model.measured, layers, strict=True):
        assert read.forward_s == pytest.approx(measured.forward_s, rel=1e-6)


@pytest.mark.slow
def test_profile_stages_follows_the_partition():
    partition = uniform(MODEL.layer_kinds, 2)
    # two ranks time the stages at once, as busy as the cores of a 2-rank run
    costs = profile_stages(MODEL, [partition], dataclasses.replace(OPTIONS, ranks=2))[0]
    assert costs.num_stages == 2
    # stage 0 holds the embedding: I does nothing there, W runs the whole backward
    assert costs.backward_input[0] < 0.2 * costs.backward_weight[0]
    assert costs.output_bytes == (2 * 16 * MODEL.hidden_size * 4, 0.0)
    assert all(g > 0 for g in costs.grad_bytes)
    text = stage_costs_csv(add_op_overhead(costs, 1e-4))
    read = parse_stage_costs(text, num_stages=2)
    assert read.forward[1] == pytest.approx(costs.forward[1] + 1e-4, rel=1e-6)
    assert read.full_backward(0) == pytest.approx(costs.backward[0] + 1e-4, rel=1e-6)


@pytest.mark.slow
def test_profile_phase_of_a_run_times_every_stage_copy():
    from pipesched.runtime.runs import RunOptions, run_schedules

    options = RunOptions(seq_len=16, steps=2, warmup=1, profile_repeats=3)
    chimera, one_f_one_b = run_schedules([generate("chimera", 2, 2), generate("1f1b", 2, 2)], MODEL, options=options)
    # Chimera keeps every stage on both ranks: two timings per stage
    assert sorted(chimera.stage_timings) == [0, 1]
    assert [len(t) for t in chimera.stage_timings.values()] == [2, 2]
    assert [len(t) for t in one_f_one_b.stage_timings.values()] == [1, 1]
    first = one_f_one_b.stage_timings[0][0]
    assert first.backward_input < first.backward_weight  # I does nothing on stage 0
    assert run_schedules([generate("1f1b", 2, 2)], MODEL, options=RunOptions(seq_len=16, steps=1))[0].stage_timings is None


@pytest.mark.slow
def test_profile_command_writes_stage_costs(cli, tmp_path):
    target = tmp_path / "stages.csv"
    result = cli("profile", "--model", "tiny", "-s", "16", "--repeats", "2", "--warmup", "1", "--no-link",
                 "-p", "2", "-v", "2", "-o", str(target))
    assert result.code == 0, result.err
    assert "(3|2|2|3)" in result.err and "per-op overhead of the ours runtime" in result.out  # "wrote" lines on stderr
    costs = parse_stage_costs(target.read_text(), num_stages=4)
    assert costs.backward is not None and all(f > 0 for f in costs.forward)
    # every repeat is kept beside the costs, counted as they are (the per-op overhead included)
    repeats = tmp_path / "stages.repeats.csv"
    rows = list(csv.DictReader(repeats.open()))
    for stage in range(4):
        for kind, column in (("F", "forward"), ("I", "backward_input"), ("W", "backward_weight"), ("B", "backward")):
            times = [float(r["seconds"]) for r in rows if r["stage"] == str(stage) and r["kind"] == kind]
            assert len(times) == 2
            assert statistics.median(times) == pytest.approx(getattr(costs, column)[stage], rel=1e-6)
    drawn = cli("simulate", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "2", "--stage-costs", str(target),
                "--jitter-file", str(repeats), "--samples", "50", "--json")
    assert drawn.code == 0, drawn
    spread = json.loads(drawn.out)["variability"]
    assert spread["samples"] == 50 and "measured repeats" in spread["model"]


def test_fit_link_separates_latency_from_bandwidth():
    sizes = [8, 1_000_000, 2_000_000, 4_000_000]
    link = fit_link("gloo", sizes, [5e-5 + n / 2e9 for n in sizes])
    assert link.latency == pytest.approx(5e-5, rel=1e-3)
    assert link.bandwidth == pytest.approx(2e9, rel=1e-6)


@pytest.mark.slow
def test_profile_link_between_two_ranks():
    link = profile_link(repeats=3)
    assert 0 < link.latency < 0.05
    assert link.bandwidth > 1e6
    assert len(link.one_way_s) == len(link.sizes)


@pytest.mark.slow
def test_profile_command_writes_layer_costs(cli, tmp_path):
    target = tmp_path / "tiny.csv"
    result = cli("profile", "--model", "tiny", "-s", "16", "--repeats", "3", "--warmup", "1", "--no-link",
                 "-o", str(target))
    assert result.code == 0, result.err
    assert f"wrote {target}" in result.err
    model = load_model(str(target))
    assert [layer.name for layer in model.measured] == list(MODEL.layer_names)


def test_profile_command_refuses_an_unwritable_output_before_measuring(cli, tmp_path):
    result = cli("profile", "--model", "tiny", "-o", str(tmp_path / "missing" / "x.csv"))
    assert result.code == 2
    assert "does not exist" in result.err


@pytest.mark.slow
def test_check_command_compares_prediction_and_run(cli, tmp_path):
    page, trace = tmp_path / "check.html", tmp_path / "check.trace.json"
    result = cli("check", "--schedules", "gpipe,zb-h1", "-p", "2", "-m", "3", "--model", "tiny", "-s", "16",
                 "--steps", "2", "--warmup", "1", "--json", "--html", str(page), "--perfetto", str(trace))
    assert result.code == 0, result.err
    data = json.loads(result.out)
    # the views: both timelines of both schedules, two processes per device in the trace
    assert f"wrote {trace}" in result.err and f"wrote {page}" in result.err
    processes = [name for _, name in sorted((e["pid"], e["args"]["name"]) for e in json.loads(trace.read_text())
                                            ["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"
                                            and "critical path" not in e["args"]["name"])]
    assert processes == [f"{name} · device {d} · {side}" for name in ("gpipe", "zb-h1") for d in (0, 1)
                         for side in ("predicted", "measured")]
    text = page.read_text()
    assert text.count('class="comparison"') == 2 and 'id="deviations-1-table"' in text
    assert [row["schedule"] for row in data["rows"]] == ["gpipe", "zb-h1"]
    for row in data["rows"]:
        assert row["predicted_s"] > 0 and row["measured_s"] > 0
        assert row["error"] == pytest.approx((row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    assert data["median_abs_error"] == pytest.approx(statistics.median(abs(r["error"]) for r in data["rows"]))
    assert sorted(data["predicted_order"]) == sorted(data["measured_order"]) == ["gpipe", "zb-h1"]
    # one pair: judged (tau +1 or -1 as it agrees) or too noisy to judge (no tau)
    assert data["rank_correlation"] == {True: 1.0, False: -1.0, None: None}[data["ranking_agrees"]]
    assert data["pairs"][0]["judged"] == (data["ranking_agrees"] is not None)
    assert data["latency_s"] > 0 and set(data["per_op_overhead_s"]) == {"pytorch"}
    # the measured spread of the step times beside the distribution the profiled repeats predict
    for row in data["rows"]:
        steps = row["measured_spread"]
        assert steps["min_s"] == min(row["step_times_s"]) and steps["max_s"] == max(row["step_times_s"])
        predicted = row["predicted_distribution"]
        assert predicted["samples"] > 0 and predicted["min_s"] <= predicted["p50_s"] <= predicted["p99_s"]


@pytest.mark.slow
def test_check_returns_both_timelines_for_overlays():
    from pipesched.runtime.check import check_schedules
    from pipesched.runtime.runs import RunOptions

    schedules = [generate("1f1b", 2, 2)]
    link = LinkProfile("gloo", latency=1e-4, bandwidth=1e9, sizes=(), one_way_s=())
    report = check_schedules(schedules, MODEL, options=RunOptions(seq_len=16, steps=1, warmup=1), link=link,
                             overhead_s={"pytorch": 0.0}, repeats=2)
    (predicted, measured), = report.timeline_pairs()
    assert predicted.source == "simulated" and measured.source == "measured"
    assert predicted.schedule is measured.schedule is schedules[0]
    assert math.isfinite(report.rows[0].error)


@pytest.mark.parametrize("link", ["--link", "--no-link"])
def test_profile_on_a_missing_gpu_is_refused_before_anything_is_written(cli, tmp_path, monkeypatch, link):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    target = tmp_path / "gpu.csv"
    target_link = tmp_path / "gpu.link.yaml"
    result = cli("profile", "--model", "tiny", "--device", "cuda", link, "-o", str(target))
    fix = "--no-link" if link == "--link" else "--device cpu"
    assert_one_line_error(result, "this machine has 0", fix)
    assert not target.exists() and not target_link.exists()


@pytest.mark.slow
def test_profile_writes_a_yaml_model_file_headed_by_how_it_was_measured(cli, tmp_path):
    target = tmp_path / "tiny.yaml"
    result = cli("profile", "--model", "tiny", "-s", "16", "--repeats", "2", "--warmup", "1", "--no-link",
                 "-o", str(target))
    assert result.code == 0, result.err
    text = target.read_text()
    assert text.startswith("# Per-layer costs of tiny, measured by `pipesched profile` on ")
    assert "torch " in text and "micro-batch 2 x 16 tokens" in text and "medians of 2 timed repeats" in text
    measured = load_model(str(target))
    assert measured.name == "tiny-measured" and measured.measured_on == ""  # CPU times are used as they are
    assert [layer.kind for layer in measured.measured] == list(MODEL.layer_kinds)
    assert all(layer.forward_s > 0 and layer.backward_weight_s > 0 for layer in measured.measured)
    assert measured.measured[1].params == _block_parameter_count()


def _block_parameter_count() -> int:
    import torch

    from pipesched.runtime.torch_model import build_layer

    return sum(p.numel() for p in build_layer(MODEL, 1, seed=0, dtype=torch.float32, device="cpu").parameters())


def test_per_stage_profile_is_refused_as_yaml(cli, tmp_path):
    target = tmp_path / "stages.yaml"
    result = cli("profile", "--model", "tiny", "-p", "2", "--no-link", "-o", str(target))
    assert_one_line_error(result, "output=", "per-stage costs (-p) are a CSV")
    assert not target.exists()
