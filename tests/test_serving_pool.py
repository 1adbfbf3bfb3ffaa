"""Several models on one device pool (serve pool): placement, memory, swaps, the one-model
equivalence with serve simulate, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipesched.model.devices import HOST_COPY_LATENCY_S
from pipesched.serving.config import Instances, ServeConfig
from pipesched.serving.deployment import build_deployment
from pipesched.serving.engine import simulate_serving
from pipesched.serving.placement import run_groups
from pipesched.serving.pool import load_pool
from pipesched.serving.pool_result import serve_pool
from pipesched.serving.pool_search import PLACEMENTS, Scores, place
from pipesched.serving.results import serve_result
from pipesched.serving.timeline import serving_timeline
from pipesched.timeline import WEIGHT_MOVE

# two devices of 40 MB (90% for the models): one "small" model (15 MB of weights, 4 MB of
# workspace, 8 MB for one request of its 1,024-token context) fits a device, two do not
TIGHT = """name: tight
nodes:
  - devices_per_node: 2
    device: {preset: h100-sxm, memory: 40 MB, host_bandwidth: 2 GB/s, host_memory: 1 GiB}
intra_node: {bandwidth: 450 GB/s, latency: 3 us}
inter_node: {bandwidth: 50 GB/s, latency: 5 us}
"""
# four devices of 200 MB: several "small" and "tiny" models fit one device together
ROOMY = TIGHT.replace("tight", "roomy").replace("40 MB", "200 MB").replace("devices_per_node: 2",
                                                                            "devices_per_node: 4")


def _model(name: str, model: str, qps: float, seed: int, *, cv: float = 3.0, ttft: float = 0.2,
           tpot: float = 0.02, parallel: str = "[1x1]") -> str:
    return (f"  - name: {name}\n    model: {model}\n"
            f"    traffic: {{requests: 40, qps: {qps}, arrival: \"gamma:{cv}\", prompt_tokens: \"uniform:16-96\", "
            f"output_tokens: \"uniform:4-24\", seed: {seed}}}\n"
            f"    slo: {{ttft: {ttft}, tpot: {tpot}}}\n    parallel: {parallel}\n")


def _write(tmp_path, cluster: str, models: str, name: str = "pool.yaml") -> str:
    (tmp_path / "cluster.yaml").write_text(cluster)
    path = tmp_path / name
    path.write_text("pool: cluster.yaml\nscheduler: {name: sarathi, max_batch: 16, chunk: 256}\nmodels:\n" + models)
    return str(path)


@pytest.fixture
def swap_pool(tmp_path):
    return load_pool(_write(tmp_path, TIGHT, "".join(_model(n, "small", 30, s) for n, s in (("a", 1), ("b", 2),
                                                                                            ("c", 3)))))


@pytest.fixture
def mixed_pool(tmp_path):
    models = (_model("hot", "small", 60, 1) + _model("warm", "small", 20, 2, parallel="[1x1, 2x1]")
              + _model("cold", "tiny", 5, 3) + _model("bursty", "tiny", 40, 4, cv=6.0)
              + _model("rare", "small", 2, 5, parallel="[2x1]"))
    return load_pool(_write(tmp_path, ROOMY, models))


@pytest.mark.slow
def test_greedy_is_never_worse_than_the_baselines(swap_pool, mixed_pool):
    for pool in (swap_pool, mixed_pool):
        attained = {}
        for method in PLACEMENTS:
            scores = Scores(pool)
            placement = place(pool, method, scores)
            attained[method] = serve_pool(pool, placement).attainment
            # the search's per-group runs and the pool's one run agree
            assert scores.attainment(placement) == pytest.approx(attained[method])
        assert attained["greedy"] >= max(attained["dedicated"], attained["round-robin"]), attained
    assert attained["greedy"] > 0


def test_nothing_is_placed_beyond_a_device_or_its_host(swap_pool, mixed_pool):
    """What the run's instances hold (weights, workspace, their whole KV caches), summed
    over the models on each device, within kv_fraction of its memory; a swap group's
    models each alone, and all their weights within host memory."""
    for pool in (swap_pool, mixed_pool):
        fraction = pool.kv.kv_fraction
        for method in PLACEMENTS:
            placement = place(pool, method)
            used = [g for g, group in enumerate(placement.groups) if group.models]
            pooled = run_groups(pool, placement, used)
            run = pooled.run
            held: dict[int, list[tuple[float, float]]] = {}
            for i, firsts in enumerate(run.instance_devices):
                for stage, rank in enumerate(firsts):
                    costs = pooled.deployment.instances[i].stages[stage]
                    cache = run.kv.capacity_blocks[i] * run.kv.block_size * run.kv_bytes_per_token[i][stage]
                    held.setdefault(rank, []).append((costs.weight_bytes + costs.workspace_bytes + cache,
                                                      costs.weight_bytes))
            for g in placement.groups:
                for rank in range(g.first_rank, g.first_rank + g.size, g.tp):
                    device = pool.cluster.devices[rank]
                    totals = [total for total, _ in held[rank]]
                    if g.swapped:
                        assert max(totals) <= device.memory_bytes * fraction * (1 + 1e-12)
                        assert sum(w for _, w in held[rank]) <= device.host_memory_bytes
                    else:
                        assert sum(totals) <= device.memory_bytes * fraction * (1 + 1e-12), (method, rank)


def test_a_placement_beyond_memory_is_refused(swap_pool):
    from pipesched.errors import PipeschedError
    from pipesched.serving.placement import DeviceGroup, PoolPlacement

    # two "small" models together on one 40 MB device: 2 x 27 MB > 36 MB
    crowded = PoolPlacement("by hand", (DeviceGroup(0, 1, 1, (0, 1)),))
    with pytest.raises(PipeschedError, match="group=0: a, b do not fit"):
        serve_pool(swap_pool, crowded)
    assert serve_pool(swap_pool, PoolPlacement("by hand", (DeviceGroup(0, 1, 1, (0, 1), swapped=True),))).swaps


def test_a_swap_in_lasts_its_bytes_over_the_host_link_plus_latency(swap_pool):
    placement = place(swap_pool, "greedy")
    assert any(group.swapped for group in placement.groups)
    result = serve_pool(swap_pool, placement)
    assert result.swaps
    for swap in result.swaps:
        device = swap_pool.cluster.devices[swap.device]
        assert swap.end_s - swap.start_s == pytest.approx(swap.nbytes / device.host_bandwidth + HOST_COPY_LATENCY_S,
                                                          rel=1e-12)
    timeline = serving_timeline(result.run, window=(0.0, result.run.duration + 1.0),)
    loads = np.flatnonzero(timeline.transfers.kind == WEIGHT_MOVE)
    assert loads.size == len(result.swaps)
    durations = timeline.transfers.end[loads] - timeline.transfers.start[loads]
    expected = [s.nbytes / swap_pool.cluster.devices[s.device].host_bandwidth + HOST_COPY_LATENCY_S
                for s in result.swaps]
    assert sorted(durations) == pytest.approx(sorted(expected), rel=1e-12)


def test_weights_short_of_host_memory_come_from_disk(tmp_path):
    """Host memory below the three models' weights: the swap group keeps them on disk, and a
    load takes the bytes over the slower of the disk and host links, plus latency."""
    cluster = TIGHT.replace("host_memory: 1 GiB", "host_memory: 20 MB, disk_read_bandwidth: 0.5 GB/s, "
                                                  "disk_space: 10 GB")
    pool = load_pool(_write(tmp_path, cluster, "".join(_model(n, "small", 30, s) for n, s in (("a", 1), ("b", 2)))))
    result = serve_pool(pool, place(pool, "greedy"))
    assert result.swaps and {swap.source for swap in result.swaps} == {"disk"}
    for swap in result.swaps:
        device = pool.cluster.devices[swap.device]
        rate = min(device.disk_read_bandwidth, device.host_bandwidth)
        assert swap.end_s - swap.start_s == pytest.approx(swap.nbytes / rate + HOST_COPY_LATENCY_S, rel=1e-12)


@pytest.mark.slow
def test_the_pool_timeline_is_drawn(cli, tmp_path):
    path = _write(tmp_path, TIGHT, "".join(_model(n, "small", 30, s) for n, s in (("a", 1), ("b", 2), ("c", 3))))
    trace = tmp_path / "pool.json"
    out = cli("serve", "pool", path, "--perfetto", str(trace), "--json")
    assert out.code == 0, out.err
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    pool = load_pool(path)
    drawn = serving_timeline(serve_pool(pool, place(pool, "greedy")).run)  # the default window's
    shown = int(np.count_nonzero(drawn.transfers.kind == WEIGHT_MOVE))
    assert sum(1 for event in events if event.get("name") == "weights") == shown > 0
    assert len(json.loads(out.out)["swaps"]) >= shown


def test_models_sharing_a_device_run_one_batch_at_a_time(mixed_pool):
    """Co-resident models on one device: no two iterations on it overlap in time, and every
    model on it is served."""
    placement = place(mixed_pool, "round-robin")
    result = serve_pool(mixed_pool, placement)
    log = result.run.iterations
    for group in placement.groups:
        if len(group.models) < 2:
            continue
        rows = np.flatnonzero(log.first_device == group.first_rank)
        order = rows[np.argsort(log.start[rows], kind="stable")]
        assert np.all(log.start[order][1:] >= log.end[order][:-1] - 1e-12)
        assert len(np.unique(log.instance[rows])) == len(group.models)


def test_a_busy_resident_yields_to_a_waiting_model(tmp_path):
    """Model a busy for 2 s without a pause, model b's few requests early on: b is served
    long before a's traffic ends (a stops admitting once its residency has paid for its load,
    finishes what it holds, and b's weights come in), and a gets the devices back."""
    (tmp_path / "a.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                    + "".join(f"{0.005 * k:.3f},64,16\n" for k in range(400)))
    (tmp_path / "b.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                    + "".join(f"{0.1 + 0.01 * k:.3f},64,16\n" for k in range(5)))
    models = "".join(f"  - name: {name}\n    model: small\n    traffic: {{trace: {name}.csv}}\n"
                     "    slo: {ttft: 1, tpot: 0.1}\n" for name in ("a", "b"))
    pool = load_pool(_write(tmp_path, TIGHT.replace("devices_per_node: 2", "devices_per_node: 1"), models))
    result = serve_pool(pool, place(pool, "greedy"))
    assert [group.swapped for group in result.placement.groups] == [True]
    a, b = result.results
    assert b.requests == 5 and float((b.arrived_at + b.e2e_s).max()) < 1.0
    assert [swap.model for swap in result.swaps][:2] == ["b", "a"]
    a_done = a.arrived_at + a.e2e_s
    assert a_done.max() > 2.0 and a.requests == 400


def test_a_swapped_in_model_waits_for_its_weights(swap_pool):
    result = serve_pool(swap_pool, place(swap_pool, "greedy"))
    run, log = result.run, result.run.iterations
    for swap in result.swaps:
        mine = [i for i, name in enumerate(run.instance_kind) if name == swap.model]
        after = log.start[np.isin(log.instance, mine) & (log.end > swap.start_s)]
        assert after.size and after.min() >= swap.end_s - 1e-12
        # nothing else runs on the device while the weights come in
        busy = (log.first_device == swap.device) & (log.start < swap.end_s - 1e-12) & (log.end > swap.start_s + 1e-12)
        assert not busy.any()


def test_one_model_on_a_pool_is_serve_simulate_of_it(tmp_path):
    pool = load_pool(_write(tmp_path, ROOMY, _model("only", "small", 30, 7)))
    placement = place(pool, "dedicated")
    replicas = len(placement.groups)
    served = serve_pool(pool, placement).results[0].to_dict()
    config = ServeConfig(instances=Instances(tp=1, pp=1, count=replicas), scheduler=pool.scheduler, kv=pool.kv,
                         cpu_overhead_s=pool.cpu_overhead_s)
    alone = simulate_serving(build_deployment(config, pool.models[0].model, pool.cluster), pool.models[0].trace)
    expected = serve_result(alone, slo_ttft=0.2, slo_tpot=0.02).to_dict()
    assert json.dumps(served, sort_keys=True) == json.dumps(expected, sort_keys=True)


@pytest.mark.slow
def test_the_example_deployment_serves(cli):
    from importlib import resources

    path = resources.files("pipesched") / "data" / "pools" / "example.yaml"
    out = cli("serve", "pool", str(path), "--json")
    assert out.code == 0, out.err
    document = json.loads(out.out)
    assert set(document["models"]) == {"chat", "code", "summary", "large"}
    for entry in document["models"].values():
        assert entry["serving"] is None or {"ttft_s", "tpot_s", "slo_attainment"} <= set(entry["serving"])
    assert 0.0 <= document["slo_attainment"] <= 1.0
    assert set(document) == {"placement", "placement_s", "slo_attainment", "models", "swap_s", "swaps"}


@pytest.mark.parametrize(("models", "field"), [
    (_model("big", "llama3-70b", 1, 1), "model=big"),
    (_model("x", "no-such-model", 1, 1), "model="),
    (_model("x", "small", 1, 1).replace("tpot: 0.02", "").replace(", }", "}"), "slo.tpot"),
    (_model("x", "small", 1, 1).replace("requests: 40", "requests: -3"), "requests="),
    (_model("x", "small", 1, 1).replace("[1x1]", "[0x1]"), "parallel="),
    (_model("x", "small", 1, 1).replace("qps: 1", "qps: fast"), "qps="),
    (_model("x", "small", 1, 1) + _model("x", "tiny", 1, 2), "name=x"),
    (_model("x", "small", 1, 1).replace("seed: 1", "seed: 1, rate: 3"), "traffic=rate"),
    (_model("x", "small", 1, 1).replace("slo: {", "slo: {p99: 1, "), "slo=p99"),
])
def test_bad_deployments_are_one_error_line(cli, tmp_path, models, field):
    out = cli("serve", "pool", _write(tmp_path, TIGHT, models))
    assert out.code == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: ") and field in lines[0], out.err
    assert out.out == ""


def test_an_unknown_placement_is_one_error_line(cli, tmp_path):
    out = cli("serve", "pool", _write(tmp_path, TIGHT, _model("x", "small", 1, 1)), "--placement", "best")
    assert out.code == 2 and out.err.startswith("pipesched: error: placement=best") and out.out == ""
