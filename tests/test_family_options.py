"""Family options (``--set KEY=VALUE``): every option bounded before a table is built, the
table they ask for within the limits the readers apply, and the same options accepted the
same way by every command."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error
from pipesched.errors import PipeschedError
from pipesched.generators import FAMILIES, formula, generate
from pipesched.limits import (
    FAMILY_OPTIONS,
    MAX_ITERATIONS,
    MAX_MICROBATCHES,
    MAX_STAGES,
    MAX_V_HEURISTIC_DEVICES,
    MAX_WAVES,
)


def test_every_option_of_every_family_has_bounds():
    for family in FAMILIES.values():
        assert set(family.options) <= set(FAMILY_OPTIONS), family.name


# Options that size the table, as the families define them: Hanayo runs 2 chunks per wave
# on each device, PipeDream one continuous 1F1B over iterations x m microbatches, Chimera's
# backward halving 2m half-size microbatches.
def stages_and_microbatches(name: str, p: int, m: int, options: dict) -> tuple[int, int]:
    if name == "hanayo":
        return 2 * options.get("waves", 1) * p, m
    if name in ("pipedream", "pipedream-2bw"):
        return p, options.get("iterations", 1) * m
    if name == "chimera":
        return p, 2 * m if options.get("backward_halving") else m
    if name == "terapipe":
        return p, options["slices"] * m
    raise AssertionError(name)


OVER_THE_LIMITS = [
    ("hanayo", 4, 8, {"waves": 1_000_000}, "waves=1000000"),
    ("hanayo", 4, 8, {"waves": 5000}, "waves=5000"),
    ("hanayo", 4, 8, {"waves": MAX_WAVES}, "waves="),  # within its own bound, over the stages
    ("pipedream", 64, 5000, {"iterations": 64}, "iterations=64"),
    ("pipedream-2bw", 4, MAX_MICROBATCHES // 2 + 1, {"iterations": 2}, "iterations=2"),
    ("chimera", 4, MAX_MICROBATCHES, {"backward_halving": 1}, "backward_halving=1"),
]


@pytest.mark.parametrize(("name", "p", "m", "options", "fragment"), OVER_THE_LIMITS)
def test_options_that_size_the_table_are_bounded_before_it_is_built(cli, tmp_path, name, p, m, options, fragment):
    stages, microbatches = stages_and_microbatches(name, p, m, options)
    assert stages > MAX_STAGES or microbatches > MAX_MICROBATCHES or options.get("waves", 0) > MAX_WAVES
    out = tmp_path / "table.txt"
    settings = [arg for key, value in options.items() for arg in ("--set", f"{key}={value}")]
    result = cli("show", name, "-p", str(p), "-m", str(m), *settings, "-o", str(out))
    assert_one_line_error(result, fragment)
    assert not out.exists()
    with pytest.raises(PipeschedError, match=fragment):
        formula(name, p, m, **options)  # the closed form describes the same table: refused too


@pytest.mark.parametrize(("option", "value"), [
    ("waves", 0), ("waves", 2.5), ("waves", MAX_WAVES + 1), ("iterations", 0), ("iterations", MAX_ITERATIONS + 1),
    ("versions", -1), ("activation_limit", 1e308), ("latency", 1e308), ("latency", -1), ("m_w", 2),
    ("forward_doubling", 2), ("fused", "yes"),
])
def test_out_of_bounds_option_values_are_refused_by_show_and_compare_alike(cli, option, value):
    family = next(family for family in FAMILIES.values() if option in family.options)
    other = "1f1b" if family.name != "1f1b" else "gpipe"
    shown = cli("show", family.name, "-p", "4", "-m", "8", "--set", f"{option}={value}")
    assert_one_line_error(shown, f"{option}=")
    # one family of several: refused, not listed as skipped
    compared = cli("compare", "--schedules", f"{family.name},{other}", "-p", "4", "-m", "8", "--levels", "formula",
                   "--set", f"{family.name}.{option}={value}")
    assert_one_line_error(compared, f"{option}=")
    assert compared.err == shown.err


def test_compare_takes_the_options_of_families_with_dashes_in_their_names(cli):
    shown = cli("show", "zb-h1", "-p", "4", "-m", "8", "--set", "activation_limit=4")
    assert shown.code == 0, shown.err
    slot_makespan = float(shown.out.split("# slot makespan ", 1)[1].split()[0])
    for setting in ("zb-h1.activation_limit=4", "zb-h1.activation-limit=4"):
        compared = cli("compare", "--schedules", "zb-h1", "-p", "4", "-m", "8", "--levels", "table", "--json",
                       "--set", setting)
        assert compared.code == 0, compared.err
        [row] = json.loads(compared.out)["records"]
        assert row["iteration_time_slots"] == slot_makespan


# The largest table each family may generate along each axis the readers bound: the most
# microbatches (on the fewest devices), and the most stages (families whose options or v
# set them), each within MAX_OPS.
def largest_tables():
    for name in FAMILIES:
        if name != "terapipe":
            yield name, 2, MAX_MICROBATCHES, {}
    yield "terapipe", 2, MAX_MICROBATCHES // 4, {"slices": 4}  # each sequence 4 microbatches of the table
    yield "chimera", 2, MAX_MICROBATCHES // 2, {"backward_halving": 1}
    yield "pipedream", 2, MAX_MICROBATCHES // MAX_ITERATIONS, {"iterations": MAX_ITERATIONS}
    yield "pipedream-2bw", 2, MAX_MICROBATCHES // 2, {"iterations": 2}
    waves = MAX_STAGES // (2 * 2)
    yield "hanayo", 2, 4, {"waves": waves}  # the most stages; MAX_OPS bounds it as any table


@pytest.mark.slow
@pytest.mark.parametrize(("name", "p", "m", "options"), list(largest_tables()))
def test_the_largest_table_a_family_generates_is_read_back_by_validate(cli, tmp_path, name, p, m, options):
    out = tmp_path / "largest.txt"
    settings = [arg for key, value in options.items() for arg in ("--set", f"{key}={value}")]
    shown = cli("show", name, "-p", str(p), "-m", str(m), *settings, "-o", str(out))
    assert shown.code == 0, shown.err
    checked = cli("validate", str(out))
    assert checked.code == 0, checked.err
    assert "valid" in checked.out
    stages, microbatches = (stages_and_microbatches(name, p, m, options) if options
                            else (generate(name, 2, 4).num_stages, m))
    assert f"{stages:,} stages, {microbatches:,} microbatches" in checked.out


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_slot_costs_reach_compare_as_they_reach_show(cli, name):
    # show's closed form at F=1, I=2, W=1 is the formula level of compare
    shown = cli("show", name, "-p", "4", "-m", "8", "--set", "costs=1,2,1")
    assert shown.code == 0, shown.err
    formula_makespan = float(shown.out.split("# formula: makespan ", 1)[1].split(",")[0])
    compared = cli("compare", "--schedules", name, "-p", "4", "-m", "8", "--levels", "formula", "--json",
                   "--set", "costs=1,2,1")
    assert compared.code == 0, compared.err
    [row] = json.loads(compared.out)["records"]
    assert row["iteration_time_slots"] == formula_makespan


@pytest.mark.slow
def test_the_zb_v_heuristic_is_bounded_in_devices_and_the_handcrafted_table_is_not(cli) -> None:
    # the heuristic's warm-up sweeps grow with p squared: over its bound it is refused at once
    refused = cli("show", "zb-v", "-p", str(MAX_V_HEURISTIC_DEVICES + 1), "-m", "8", "--set", "activation_limit=600")
    assert_one_line_error(refused, f"p={MAX_V_HEURISTIC_DEVICES + 1}", "zb-v heuristic")
    # the handcrafted ZB-V builds only the microbatches it keeps: p = 1024 with m = 8 (a V
    # that would need 2p - 1 = 2047 microbatches to fill) has 3 x 2p x m ops
    schedule = generate("zb-v", 1024, 8)
    assert schedule.num_ops == 3 * 2 * 1024 * 8
