"""The three-level comparison and `pipesched compare`."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error
from pipesched.compare import LEVELS, compare
from pipesched.costs import StageCosts
from pipesched.experiments import Point
from pipesched.generators import FAMILIES, generate

FAST = Point(stage_costs=StageCosts.uniform(4, output_bytes=1.0))



def test_formula_and_table_levels_in_1f1b_stage_slots() -> None:
    result = compare(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"], p=4, m=8, levels=("formula", "table"))
    assert result.schedules == ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
    one = result.result("1f1b", "table")
    assert one.iteration_time == 33.0 and one.time_unit == "slot"
    assert one.bubble_ratio == pytest.approx(3 / 11)
    assert one.peak_memory == 4.0 and result.result("gpipe", "formula").peak_memory == 8.0
    # interleaved (v = 2): chunk slots count half: m(F+B) + (p-1)(F+B)/2 = 24 + 4.5
    assert result.result("interleaved-1f1b", "table").iteration_time == pytest.approx(28.5)
    assert result.result("zb-h1", "formula").iteration_time == pytest.approx(27.0)
    assert result.ranking("table") == ["zb-h1", "interleaved-1f1b", "1f1b", "gpipe"]
    # equal times share a rank
    assert result.result("gpipe", "table").rank == result.result("1f1b", "table").rank == 3


def test_families_that_cannot_build_are_skipped_with_the_reason() -> None:
    result = compare(["1f1b", "chimera", "dualpipe"], p=3, m=6, levels=("table",))
    assert result.schedules == ("1f1b",)
    reasons = dict(result.skipped)
    assert set(reasons) == {"chimera", "dualpipe"}
    assert "even" in reasons["chimera"]


def test_sim_level_and_a_ranking_that_changes_between_levels() -> None:
    # Chimera beats 1F1B in the slot table at m = p, but not once its extra gradient
    # all-reduce (and every activation) crosses slow links
    costs = StageCosts.uniform(4, output_bytes=1.0)
    costs = StageCosts(costs.forward, costs.backward_input, costs.backward_weight, costs.activation_bytes,
                       costs.output_bytes, grad_bytes=(4.0,) * 4)
    slow = Point(stage_costs=costs, bandwidth=0.5)
    result = compare(["1f1b", "chimera"], p=4, m=4, levels=("table", "sim"), workload=slow)
    table_order, sim_order = result.ranking("table"), result.ranking("sim")
    assert table_order == ["chimera", "1f1b"] and sim_order == ["1f1b", "chimera"]
    changed = result.rank_changes()
    assert {r.schedule for r in changed} == {"1f1b", "chimera"}
    assert all(r.level == "sim" for r in changed)
    assert result.result("chimera", "sim").previous_rank == 1
    sim = result.result("1f1b", "sim")
    assert sim.time_unit == "s" and sim.memory_unit == "bytes" and sim.throughput_samples_per_s > 0


def test_records_are_flat_and_serializable() -> None:
    result = compare(["gpipe", "1f1b", "zb-v"], p=4, m=8, workload=FAST)
    records = result.to_records()
    assert len(records) == 3 * len(LEVELS)
    for record in records:
        assert all(not isinstance(value, dict | list | tuple) for value in record.values())
        assert {"schedule", "level", "bubble_ratio", "rank", "rank_changed"} <= set(record)
        # the unit in the key: seconds and bytes at the sim level, slots and activation units below
        sim = record["level"] == "sim"
        assert ("iteration_time_s" in record) == sim and ("iteration_time_slots" in record) != sim
        assert ("max_peak_memory_bytes" in record) == sim and ("peak_activation_units" in record) != sim
    json.dumps(result.to_dict())


def test_stage_costs_split_into_chunks_for_interleaved_families() -> None:
    result = compare(["1f1b", "interleaved-1f1b"], p=4, m=8, levels=("sim",), costs=StageCosts.uniform(4))
    # free links: the simulated time equals the slot table's with F = I = W = 1
    assert result.result("1f1b", "sim").iteration_time == pytest.approx(33.0)
    assert result.result("interleaved-1f1b", "sim").iteration_time == pytest.approx(28.5)


def test_progress_reports_every_step() -> None:
    seen = []
    compare(["gpipe", "1f1b"], p=4, m=4, levels=("formula", "table"), progress=lambda d, t, label: seen.append((d, t)))
    assert seen[-1] == (4, 4) and all(t == 4 for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_cli_compare_two_levels(cli) -> None:
    result = cli("compare", "--schedules", "gpipe,1f1b,chimera", "-p", "3", "-m", "6", "--levels", "formula,table")
    assert result.code == 0, result
    assert "formula (slots)" in result.out and "table (slots)" in result.out
    assert "skipped chimera" in result.out


def test_cli_compare_json(cli, tmp_path) -> None:
    costs = tmp_path / "costs.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes,grad_bytes\n"
                     + "".join(f"{s},1,1,1,1,1,4\n" for s in range(4)), encoding="utf-8")
    result = cli("compare", "--schedules", "1f1b,chimera", "-p", "4", "-m", "4", "--stage-costs", str(costs),
                 "--bandwidth", "0.5", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    sim = {r["schedule"]: r for r in data["records"] if r["level"] == "sim"}
    assert sim["1f1b"]["rank"] == 1 and sim["chimera"]["rank_changed"]


def test_cli_compare_default_scenario_ranks_every_family(cli) -> None:
    result = cli("compare")
    assert result.code == 0, result
    assert "llama3-70b on 4x8-h100" in result.out
    for name in FAMILIES:
        assert name in result.out
    assert "simulated (s)" in result.out and "rank changed" in result.out


def test_cli_compare_bad_input(cli) -> None:
    assert_one_line_error(cli("compare", "--levels", "formula,magic"), "levels=magic")
    assert_one_line_error(cli("compare", "--schedules", "1f1b,nope", "--levels", "table"), "unknown family")
    assert_one_line_error(cli("compare", "--bandwidth", "0", "--stage-costs", "x.csv"), "x.csv")


def test_wide_records_put_levels_side_by_side() -> None:
    from pipesched.compare import compare

    result = compare(["gpipe", "1f1b", "zb-h1"], p=4, m=8, levels=("formula", "table"))
    rows = result.to_wide_records()
    assert [row["schedule"] for row in rows] == result.ranking("table")
    zb = next(row for row in rows if row["schedule"] == "zb-h1")
    assert zb["formula time (slots)"] == zb["table time (slots)"] == 27
    assert zb["table rank"] == 1 and zb["rank changes"] == "-"
    gpipe = next(row for row in rows if row["schedule"] == "gpipe")
    assert gpipe["table act."] == 8 and gpipe["formula act."] == 8


def test_cli_compare_with_nothing_comparable_fails_and_writes_nothing(cli, tmp_path) -> None:
    # measured layers already hold their tensor parallelism; the default scenario asks for 4
    model = tmp_path / "measured.yaml"
    model.write_text("name: m\nlayers:\n" + "".join(
        f"  - {{name: {name}, forward_s: 0.01, backward_input_s: 0.01, backward_weight_s: 0.01, "
        f"activation_bytes: 1000, params: 1000, output_bytes: 100}}\n"
        for name in ("embedding", "block.0", "block.1", "block.2", "head")))
    report = tmp_path / "report.html"
    result = cli("compare", "--model", str(model), "-p", "2", "-m", "4", "--schedules", "1f1b,zb-h1",
                 "--html", str(report))
    assert_one_line_error(result, "no schedule could be compared: 1f1b (and 1 more schedules): sim:",
                          "tensor_parallel=4")
    assert not report.exists()
    result = cli("compare", "--model", str(model), "-t", "1", "-p", "2", "-m", "4", "--schedules", "1f1b,zb-h1")
    assert result.code == 0, result.err
    assert "m (measured layers) on 4x8-h100" in result.out and "tokens" not in result.out.splitlines()[0]


def test_every_command_gives_v_to_the_families_the_registry_says_take_it(cli, tmp_path) -> None:
    listed = {family["name"]: family["takes_v"] for family in json.loads(cli("list", "families", "--json").out)}
    takers = [name for name, takes in listed.items() if takes]
    assert "hanayo" in takers and listed == {name: family.takes_v for name, family in FAMILIES.items()}
    result = compare(takers, p=4, m=8, v=4, levels=("table",), keep_timelines=True)
    assert not result.skipped
    for name, timeline in zip(result.ranking("table"), result.timelines, strict=True):
        # compare builds the table show and simulate build for -v 4: 4 stages on every device
        assert timeline.schedule.num_stages == 16, name
        assert timeline.schedule.device_ops == generate(name, 4, 8, v=4).device_ops
    costs = tmp_path / "c.csv"
    costs.write_text("stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,0\n")
    for name in takers:
        shown = cli("simulate", name, "-p", "4", "-m", "8", "-v", "4", "--stage-costs", str(costs), "--json")
        assert json.loads(shown.out)["num_stages"] == 16, name


def test_schedules_that_fit_rank_before_those_out_of_memory(cli) -> None:
    # the default scenario: PipeDream is the fastest but over the H100's memory
    result = cli("compare", "--schedules", "pipedream,1f1b,gpipe,zb-v,zb-h2", "--levels", "table,sim", "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    assert "fit in memory" in data["ranking"]
    sim = [r for r in data["records"] if r["level"] == "sim"]
    fits = sorted((r for r in sim if not r["any_out_of_memory"]), key=lambda r: r["iteration_time_s"])
    over = sorted((r for r in sim if r["any_out_of_memory"]), key=lambda r: r["iteration_time_s"])
    assert fits and over and min(r["iteration_time_s"] for r in over) < max(r["iteration_time_s"] for r in fits)
    assert [r["rank"] for r in fits + over] == list(range(1, len(sim) + 1))
    text = cli("compare", "--schedules", "pipedream,1f1b,gpipe,zb-v,zb-h2", "--levels", "table,sim").out
    assert "rank: by iteration time, the schedules that fit in memory before those out of memory" in text
    # model and hardware FLOPs utilization side by side, as the JSON has them
    assert "MFU / HFU" in text
    assert all(f"{r['mfu']:.1%} / {r['hfu']:.1%}" in text for r in sim)
