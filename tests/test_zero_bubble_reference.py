"""ZB-1p and ZB-2p against the zero-bubble reference heuristic itself.

tests/reference/zero_bubble/ holds the tables sail-sg/zero-bubble-pipeline-parallelism's own
scheduler produced on ten cost sets (uniform, the paper's F:I:W shape with a link latency,
uneven stages, slow links, cheap and heavy W; memory limits p and 2p M_B; several M_W),
recorded by tests/reference/make_zero_bubble_reference.py. Our tables must equal them op for
op. Those files are the reference's output: ``--update-golden`` never rewrites them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError
from pipesched.generators import formula, generate
from pipesched.slots import table_metrics
from pipesched.validation import validate

CASES = sorted((Path(__file__).parent / "reference" / "zero_bubble").glob("*.txt"))


def read_case(path: Path) -> tuple[dict[str, str], list[list[str]]]:
    fields: dict[str, str] = {}
    tables: list[list[str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.partition(":")
        if key.startswith("d") and key[1:].isdigit():
            tables.append(value.split())
        else:
            fields[key] = value.strip()
    return fields, tables


def numbers(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def test_the_recorded_cases_are_there():
    assert len(CASES) == 10
    families = {read_case(path)[0]["family"] for path in CASES}
    assert families == {"zb-1p", "zb-2p"}


@pytest.mark.parametrize("path", CASES, ids=[path.stem for path in CASES])
def test_tables_equal_the_reference_heuristic(path):
    fields, expected = read_case(path)
    p, m = int(fields["p"]), int(fields["m"])
    m_w = float(fields["m_w"])
    costs = StageCosts(
        numbers(fields["forward"]), numbers(fields["backward_input"]), numbers(fields["backward_weight"]),
        [1.0] * p, [0.0] * p,
        input_frees=1.0 - m_w,  # M_W from the costs: the family's default
    )
    schedule = generate(fields["family"], p, m, costs=costs, latency=float(fields["latency"]))
    assert schedule.params["m_w"] == pytest.approx(m_w)
    assert [[str(op) for op in ops] for ops in schedule.device_ops] == expected
    assert validate(schedule) == []


def test_memory_accounting_follows_the_paper():
    # with M_W = M_B (I frees nothing) the limit counts stage-microbatches in flight, as
    # ZB-H1's memory; a smaller M_W lets more microbatches wait for their W
    p, m = 6, 24
    full = generate("zb-2p", p, m, m_w=1.0)
    assert max(table_metrics(full).peak_inflight) <= 2 * p
    assert validate(full, activation_limit=2 * p) == []
    half = generate("zb-2p", p, m, m_w=0.5)
    assert max(table_metrics(half).peak_inflight) > 2 * p
    assert generate("zb-2p", p, m).params["m_w"] == 0.5  # default: 1 - input_frees of F = I = W = 1


def test_automatic_schedules_meet_the_handcrafted_forms_at_equal_costs():
    # what the formulas' notes say: ZB-1p idles ZB-H1's (p-1)(F+I-W); ZB-2p ZB-H2's from
    # m = 2p-1 on and at most that with fewer microbatches
    for p in (2, 3, 5, 8):
        for m in range(1, 3 * p + 1):
            one = formula("zb-1p", p, m)
            assert not one.exact
            assert max(table_metrics(generate("zb-1p", p, m)).idle_per_device) == one.idle
            two = formula("zb-2p", p, m)
            idle = max(table_metrics(generate("zb-2p", p, m)).idle_per_device)
            assert idle == two.idle if m >= 2 * p - 1 else idle <= two.idle


def test_a_slow_link_changes_the_table():
    fast = generate("zb-2p", 4, 12)
    slow = generate("zb-2p", 4, 12, latency=2.0)
    assert fast.device_ops != slow.device_ops
    assert validate(slow) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"activation_limit": 0.5}, "activation_limit=0.5: give the activation memory per device in units of M_B"),
        ({"m_w": 1.5}, "m_w=1.5: give M_W / M_B"),
        ({"latency": -1}, "latency=-1: give the link latency"),
        ({"latency": "fast"}, "latency=fast: give the link latency"),
        ({"waves": 2}, "option=waves: zb-1p does not take it"),
    ],
)
def test_bad_options_name_the_field(options, message):
    with pytest.raises(PipeschedError) as caught:
        generate("zb-1p", 4, 8, **options)
    assert str(caught.value).startswith(message)
