"""`pipesched serve`: its option groups, the summary and JSON of a simulation, capacity, the
serving search from the command line, and every bad input as one error line."""

from __future__ import annotations

import json

import click
import pytest
import typer

from cli_helpers import assert_one_line_error
from pipesched.cli.groups import (
    BatchOptions,
    CacheOptions,
    DeploymentOptions,
    RequestOptions,
    SloOptions,
    parse_disaggregation,
    serving_point,
)
from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError
from pipesched.serving.config import Instances, KVSettings, SchedulerSpec

# a small scenario that runs in a fraction of a second: Llama-3-8B, 2 stages of 1 H100
SMALL = ("--model", "llama3-8b", "-t", "1", "-p", "2", "--requests", "40", "--qps", "4")
ISSUE_KEYS = {"requests", "ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "requests_per_s", "slo_attainment",
              "goodput_requests_per_s", "preemptions", "kv_peak_fraction", "stage_busy"}


def _serve_commands() -> dict[str, click.Command]:
    from pipesched.cli import app

    group = typer.main.get_group(app)
    serve = group.get_command(None, "serve")
    return {name: serve.get_command(None, name) for name in serve.list_commands(None)}


def _flags(command) -> set[str]:
    return {flag for param in command.params for flag in getattr(param, "opts", ())}


def test_the_serve_group_lists_its_commands(cli) -> None:
    result = cli("serve", "--help")
    assert result.code == 0
    for name in ("simulate", "capacity", "search", "run", "check", "residency", "pool"):
        assert f"  {name} " in result.out
    assert set(_serve_commands()) == {"simulate", "capacity", "search", "run", "check", "residency", "pool",
                                      "offline"}
    bare = cli("serve")  # as bare `pipesched`: the help, and success
    assert bare.code == 0 and bare.err == "" and bare.out == result.out


@pytest.mark.parametrize("name", ["simulate", "capacity"])
def test_the_serving_commands_take_the_serving_groups_whole(name) -> None:
    flags = _flags(_serve_commands()[name])
    for group in (DeploymentOptions, BatchOptions, CacheOptions, RequestOptions, SloOptions):
        wanted = {info.__metadata__[0].param_decls[0] if info.__metadata__[0].param_decls else
                  info.__metadata__[0].default for info in (p.annotation for p in group.parameters())}
        assert wanted <= flags, (name, group.__name__, wanted - flags)


def test_every_unset_option_is_the_defaults_row() -> None:
    point = serving_point(DeploymentOptions(), BatchOptions(), CacheOptions(), RequestOptions(), SloOptions())
    assert (point.model, point.cluster) == (DEFAULTS.serve_model, DEFAULTS.serve_cluster)
    assert point.config.instances == Instances(DEFAULTS.serve_tensor_parallel, DEFAULTS.serve_p, DEFAULTS.replicas)
    scheduler = point.config.scheduler
    assert (str(scheduler.name), scheduler.chunk, scheduler.max_batch, scheduler.max_tokens, str(scheduler.preemption)) == (
        DEFAULTS.scheduler, DEFAULTS.chunk, DEFAULTS.max_batch, DEFAULTS.max_tokens, DEFAULTS.preemption)
    assert point.config.kv == KVSettings(DEFAULTS.block_size, DEFAULTS.kv_fraction)
    assert (str(point.config.routing), point.config.cpu_overhead_s) == (DEFAULTS.routing, DEFAULTS.cpu_overhead)
    workload = point.workload
    assert (workload.requests, workload.qps, workload.arrival, workload.prompt_tokens, workload.output_tokens,
            workload.seed) == (DEFAULTS.requests, DEFAULTS.qps, DEFAULTS.arrival, DEFAULTS.prompt_tokens,
                               DEFAULTS.output_tokens, DEFAULTS.seed)
    assert (point.targets.slo_ttft, point.targets.slo_tpot, point.targets.attainment) == (
        DEFAULTS.slo_ttft, DEFAULTS.slo_tpot, DEFAULTS.attainment)
    # and the library's records start from the same rows
    assert SchedulerSpec() == scheduler


def test_a_disaggregated_split_reads_both_sides() -> None:
    split = parse_disaggregation("2x1x2,4x2")
    assert (split.prefill, split.decode) == (Instances(2, 1, 2), Instances(4, 2, 1))
    for text in ("2x1", "2x1,4", "2x1,4x1,8x1", "2y1,4x1", "0x1,4x1"):
        with pytest.raises(PipeschedError, match="disaggregate"):
            parse_disaggregation(text)


def test_simulate_json_has_the_issues_keys_and_one_shape(cli) -> None:
    result = cli("serve", "simulate", *SMALL, "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert set(data) >= ISSUE_KEYS and "per_request" not in data
    assert data["requests"] == 40
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(data[key]) == {"mean", "p50", "p90", "p99"}
        assert data[key]["p50"] <= data[key]["p90"] <= data[key]["p99"]
    # every request's end-to-end latency holds its first token, and the run's rate its requests
    assert data["e2e_s"]["p50"] >= data["ttft_s"]["p50"]
    assert data["requests_per_s"] == pytest.approx(40 / data["duration_s"])
    assert 0.0 <= data["slo_attainment"] <= 1.0
    assert data["goodput_requests_per_s"] == pytest.approx(data["slo_attainment"] * data["requests_per_s"])
    assert len(data["stage_busy"]) == 1 and len(data["stage_busy"][0]) == 2
    per_request = json.loads(cli("serve", "simulate", *SMALL, "--json", "--per-request").out)["per_request"]
    assert len(per_request) == 40
    assert {"arrived_at", "ttft_s", "e2e_s", "output_tokens"} <= set(per_request[0])
    assert sum(row["ttft_s"] for row in per_request) / 40 == pytest.approx(data["ttft_s"]["mean"])


def test_simulate_prints_the_summary(cli) -> None:
    result = cli("serve", "simulate", *SMALL)
    assert result.code == 0, result
    for fragment in ("TTFT", "TPOT", "E2E", "p99", "throughput:", "SLOs (TTFT <= 2 s, TPOT <= 0.1 s)", "goodput",
                     "preemptions:", "KV cache peak", "stage busy", "pipeline bubble", "llama3-8b on 1x8-h100"):
        assert fragment in result.out, fragment


@pytest.mark.slow
def test_simulate_writes_its_report_chart_and_trace(cli, tmp_path) -> None:
    paths = {name: tmp_path / f"serve.{ext}" for name, ext in (("html", "html"), ("png", "png"), ("perfetto", "json"))}
    result = cli("serve", "simulate", *SMALL, *(arg for name, path in paths.items() for arg in (f"--{name}", str(path))))
    assert result.code == 0, result
    for path in paths.values():
        assert f"wrote {path}" in result.err
    assert paths["html"].read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    events = json.loads(paths["perfetto"].read_text())
    assert any(event.get("ph") == "X" for event in (events["traceEvents"] if isinstance(events, dict) else events))
    # one path for two views is refused before any work, and nothing is written
    clash = tmp_path / "twice.png"
    assert_one_line_error(cli("serve", "simulate", *SMALL, "--png", str(clash), "--svg", str(clash)), "svg=")
    assert not clash.exists()


def test_a_trace_file_is_served_as_written(cli, tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,5\n0.5,200,3\n1.0,50,8\n")
    data = json.loads(cli("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "2", "--trace", str(path),
                          "--json", "--per-request").out)
    assert [row["arrived_at"] for row in data["per_request"]] == [0.0, 0.5, 1.0]
    assert [row["output_tokens"] for row in data["per_request"]] == [5, 3, 8]
    faster = json.loads(cli("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "2", "--trace", str(path),
                            "--qps", "4", "--json", "--per-request").out)
    # --qps with a trace keeps its requests and scales its spacing to that rate: 2 gaps in 0.5 s
    assert [row["arrived_at"] for row in faster["per_request"]] == pytest.approx([0.0, 0.25, 0.5])



def test_a_fitted_latency_model_gives_a_lone_requests_times_exactly(cli, tmp_path) -> None:
    """One request on one stage: its prefill is one iteration of the fitted form, every later
    token one decode iteration reading the context so far (the issue's hand computation)."""
    model = tmp_path / "latency.csv"
    model.write_text("stage,base_s,prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s\n"
                     "0,0.004,2e-5,1e-10,1e-5,1e-7\n")
    trace = tmp_path / "one.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,4\n")
    result = cli("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "1", "--trace", str(trace),
                 "--latency-model", str(model), "--cpu-overhead", "0.001", "--json", "--per-request")
    assert result.code == 0, result
    (request,) = json.loads(result.out)["per_request"]
    # every iteration: the scheduler's overhead, then the stage's fitted time
    ttft = 0.001 + 0.004 + 2e-5 * 100 + 1e-10 * 100 * (0 + 100)
    decodes = [0.001 + 0.004 + 1e-5 + 1e-7 * (100 + k) for k in range(1, 4)]
    assert request["ttft_s"] == pytest.approx(ttft, rel=1e-12)
    assert request["e2e_s"] == pytest.approx(ttft + sum(decodes), rel=1e-12)
    assert request["tpot_s"] == pytest.approx(sum(decodes) / 3, rel=1e-12)
    short = cli("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "2", "--trace", str(trace),
                "--latency-model", str(model))
    assert_one_line_error(short, "latency_model=1 stages", "one row per pipeline stage (2)")

@pytest.mark.slow
def test_capacity_meets_the_slos_below_it_and_misses_them_above(cli) -> None:
    sizes = ("--model", "llama3-8b", "-t", "1", "-p", "2", "--requests", "60", "--slo-ttft", "0.5",
             "--slo-tpot", "0.05")
    result = cli("serve", "capacity", *sizes, "--json")
    assert result.code == 0, result
    found = json.loads(result.out)
    assert found["max_qps"] > 0 and len(found["probes"]) >= 2
    for share, meets in ((0.95, True), (1.1, False)):
        run = json.loads(cli("serve", "simulate", *sizes, "--qps", str(found["max_qps"] * share), "--json").out)
        assert (run["slo_attainment"] >= DEFAULTS.attainment) is meets, (share, run["slo_attainment"])
    line = cli("serve", "capacity", *sizes)
    assert line.out.startswith("capacity: ") and "requests/s" in line.out


@pytest.mark.slow
def test_capacity_writes_the_report_at_its_rate_with_every_rate_probed(cli, tmp_path) -> None:
    path = tmp_path / "capacity.html"
    result = cli("serve", "capacity", "--model", "llama3-8b", "-t", "1", "-p", "2", "--requests", "40",
                 "--slo-ttft", "0.3", "--slo-tpot", "0.03", "--html", str(path))
    assert result.code == 0, result
    assert f"wrote {path}" in result.err
    page = path.read_text(encoding="utf-8")
    assert "Latency against request rate" in page and "Time to first token" in page


@pytest.mark.slow
def test_serve_search_ranks_resumes_and_shows(cli, tmp_path) -> None:
    db = str(tmp_path / "serve.sqlite")
    argv = ("serve", "search", "--model", "llama3-8b", "--gpus", "2", "-t", "1,2", "--pipeline", "1",
            "--replicas", "1", "--scheduler", "sarathi", "--requests", "100", "--db", db, "--workers", "1")
    first = cli(*argv, "--json")
    assert first.code == 0, first
    (search,) = json.loads(first.out)["searches"]
    assert search["points"] == 2 and search["evaluated_now"] == 2
    rates = [row["qps_per_gpu"] for row in search["rows"]]
    assert rates == sorted(rates, reverse=True)
    again = json.loads(cli(*argv, "--json").out)["searches"][0]
    assert again["evaluated_now"] == 0 and again["rows"] == search["rows"]
    shown = cli("serve", "search", "--db", db, "--show")
    assert shown.code == 0 and "best: " in shown.out and "serve capacity" in shown.out


def test_serve_search_tries_each_residency_as_a_point(cli, tmp_path) -> None:
    # every layer on the GPU against half of them streamed over the host link each iteration:
    # one point per residency, the streamed one slower (throughput falls with residency)
    db = str(tmp_path / "serve.sqlite")
    argv = ("serve", "search", "--model", "llama3-8b", "--gpus", "1", "-t", "1", "--pipeline", "1", "--replicas", "1",
            "--scheduler", "sarathi", "--requests", "200", "--prompt-tokens", "fixed:128", "--output-tokens",
            "fixed:16", "--slo-ttft", "0.5", "--slo-tpot", "0.15", "--resident", "1,0.5", "--db", db, "--workers", "1")
    result = cli(*argv, "--json")
    assert result.code == 0, result
    (search,) = json.loads(result.out)["searches"]
    assert search["points"] == 2 and search["space"]["resident"] == [0.5, 1.0]
    by_residency = {row["resident"]: row for row in search["rows"]}
    assert set(by_residency) == {0.5, 1.0}
    assert by_residency[1.0]["max_qps"] > by_residency[0.5]["max_qps"] > 0
    shown = cli("serve", "search", "--db", db, "--show")
    assert shown.code == 0 and "resident" in shown.out and "--resident 1 " not in shown.out


# --- bad input: one line naming the field and the fix, exit 2 ----------------------------------
def _trace(tmp_path, rows: str):
    path = tmp_path / "bad.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    return str(path)


def test_an_unsorted_or_negative_arrival_is_refused(cli, tmp_path) -> None:
    unsorted = _trace(tmp_path, "0,10,2\n2,10,2\n1,10,2\n")
    assert_one_line_error(cli("serve", "simulate", "--model", "llama3-8b", "--trace", unsorted), "arrived_at", "sort")
    negative = _trace(tmp_path, "-1,10,2\n")
    assert_one_line_error(cli("serve", "simulate", "--model", "llama3-8b", "--trace", negative), "arrived_at")


def test_a_prompt_longer_than_the_context_is_refused(cli, tmp_path) -> None:
    long = _trace(tmp_path, "0,9000,10\n")  # llama3-8b reads 8,192 tokens
    assert_one_line_error(cli("serve", "simulate", "--model", "llama3-8b", "-t", "1", "-p", "2", "--trace", long),
                          "num_prefill_tokens=9000", "context")


def test_a_cache_that_cannot_hold_one_request_is_refused(cli) -> None:
    # Llama-3-70B's 131 GiB of bf16 weights on one H100
    result = cli("serve", "simulate", "--model", "llama3-70b", "-t", "1", "-p", "1", "--requests", "4")
    assert_one_line_error(result, "kv_cache=0 blocks", "cannot hold one request", "-t", "-p", "--kv-fraction")


def test_slos_no_rate_meets_are_refused(cli) -> None:
    result = cli("serve", "capacity", "--model", "llama3-8b", "-t", "1", "-p", "2", "--requests", "4",
                 "--slo-ttft", "1e-6")
    assert_one_line_error(result, "slo_ttft=1e-06", "relax")


def test_slos_no_configuration_meets_end_a_search(cli, tmp_path) -> None:
    result = cli("serve", "search", "--model", "llama3-8b", "--gpus", "1", "-t", "1", "--pipeline", "1",
                 "--replicas", "1", "--scheduler", "sarathi", "--requests", "4", "--slo-tpot", "1e-6",
                 "--db", str(tmp_path / "s.sqlite"), "--workers", "1")
    assert_one_line_error(result, "slo_ttft=2: no configuration of the search meets the SLOs", "slo_tpot=1e-06",
                          "relax")


def test_a_size_the_model_cannot_take_is_named(cli, tmp_path) -> None:
    result = cli("serve", "search", "--model", "llama3-8b", "--gpus", "3", "-t", "3", "--pipeline", "1",
                 "--replicas", "1", "--scheduler", "sarathi", "--requests", "4", "--db", str(tmp_path / "s.sqlite"))
    assert_one_line_error(result, "tensor_parallel=3: must divide num_heads=32", "no configuration of the search")


def test_a_trace_too_short_to_load_the_deployment_has_no_capacity_to_rank(cli, tmp_path) -> None:
    """Four requests served at once meet the SLOs at any rate: the search says so rather than
    ranking an unbounded figure."""
    result = cli("serve", "search", "--model", "llama3-8b", "--gpus", "2", "-t", "1", "--pipeline", "2",
                 "--replicas", "1", "--scheduler", "vllm", "--requests", "4", "--db", str(tmp_path / "s.sqlite"),
                 "--workers", "1")
    assert_one_line_error(result, "requests=4: no rate up to", "give more requests")


def test_a_disaggregated_split_larger_than_the_cluster_is_refused(cli) -> None:
    assert_one_line_error(cli("serve", "simulate", "--disaggregate", "4x2x1,4x1x2", "--requests", "4"), "16")
    assert_one_line_error(cli("serve", "simulate", "--disaggregate", "4x2", "--requests", "4"), "disaggregate=4x2",
                          "PREFILL,DECODE")
    assert_one_line_error(cli("serve", "simulate", "--disaggregate", "2x1,2x1", "-t", "2"), "tensor-parallel=2",
                          "not with --disaggregate")


@pytest.mark.parametrize(("argv", "fragments"), [
    (("--scheduler", "fcfs"), ("scheduler=fcfs", "sarathi")),
    (("--preemption", "drop"), ("preemption=drop", "swap")),
    (("--routing", "random"), ("routing=random", "least-loaded")),
    (("--arrival", "uniform"), ("arrival",)),
    (("--prompt-tokens", "normal:5"), ("prompt_tokens",)),
    (("--requests", "0"), ("requests=0",)),
    (("--kv-fraction", "1.5"), ("kv_fraction=1.5",)),
    (("--per-request",), ("per-request", "--json")),
    (("--slo-tpot", "0"), ("slo_tpot=0",)),
])
def test_each_bad_option_is_one_line(cli, argv, fragments) -> None:
    assert_one_line_error(cli("serve", "simulate", *argv), *fragments)


def test_a_trace_refuses_the_synthetic_options(cli, tmp_path) -> None:
    path = _trace(tmp_path, "0,10,2\n")
    assert_one_line_error(cli("serve", "simulate", "--trace", path, "--requests", "5"), "requests=5",
                          "not with --trace")



# --- real runs -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.torch
def test_serve_run_measures_every_request(cli) -> None:
    pytest.importorskip("torch")
    result = cli("serve", "run", "--requests", "4", "--slo-ttft", "0.5", "--json", "--per-request")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert (data["model"], data["p"], data["requests"], data["source"]) == (
        DEFAULTS.serve_run_model, DEFAULTS.serve_run_p, 4, "measured")
    assert set(data) >= ISSUE_KEYS and data["slo_ttft_s"] == 0.5  # serve simulate's keys, under the SLOs asked for
    assert len(data["per_request"]) == 4
    assert all(row["ttft_s"] <= row["e2e_s"] for row in data["per_request"])
    assert data["slo_attainment"] == sum(row["meets_slo"] for row in data["per_request"]) / 4


@pytest.mark.slow
@pytest.mark.torch
def test_serve_check_writes_the_fitted_model_that_simulate_reads(cli, tmp_path) -> None:
    pytest.importorskip("torch")
    fitted = tmp_path / "fitted.csv"
    result = cli("serve", "check", "--requests", "4", "-o", str(fitted), "--json")
    assert result.code == 0, result
    report = json.loads(result.out)
    assert set(report["metrics"]) == {"ttft_s", "tpot_s", "e2e_s"}
    assert report["passed"] == all(m["median_abs_error"] <= report["tolerance"] for m in report["metrics"].values())
    assert f"wrote {fitted}" in result.err
    rows = fitted.read_text().splitlines()
    assert rows[0] == "stage,base_s,prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s"
    assert len(rows) == 1 + DEFAULTS.serve_run_p
    simulated = cli("serve", "simulate", "--model", "tiny", "-t", "1", "-p", str(DEFAULTS.serve_run_p),
                    "--latency-model", str(fitted), "--requests", "4", "--prompt-tokens", "uniform:16-128",
                    "--output-tokens", "uniform:8-32", "--json")
    assert simulated.code == 0, simulated


def test_real_runs_refuse_what_they_cannot_serve(cli, tmp_path) -> None:
    long = _trace(tmp_path, "0,2000,8\n")  # tiny reads 1,024 tokens
    assert_one_line_error(cli("serve", "run", "--trace", long), "num_prefill_tokens=2000", "context")
    assert_one_line_error(cli("serve", "run", "--requests", "2", "--scheduler", "static"), "scheduler=static")


@pytest.mark.parametrize(("argv", "fragments"), [
    (("--scheduler", "fcfs"), ("scheduler=fcfs", "sarathi")),
    (("--preemption", "drop"), ("preemption=drop", "swap")),
    (("-t", "a"), ("tensor-parallel='a'", "whole numbers")),
    (("-t", "16"), ("gpus=8", "widen --tensor-parallel")),
    (("--workers", "0"), ("workers=0",)),
    (("--resident", "0,1"), ("resident=0", "(0, 1]")),
    (("--resident", "half"), ("resident='half'", "separated by commas")),
])
def test_a_bad_search_option_is_one_line_and_leaves_no_store(cli, tmp_path, argv, fragments) -> None:
    db = tmp_path / "s.sqlite"
    assert_one_line_error(cli("serve", "search", "--requests", "10", "--db", str(db), *argv), *fragments)
    assert not db.exists()
