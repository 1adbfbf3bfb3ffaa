"""Validation: deliberately broken tables give the expected typed violations."""

from __future__ import annotations

import pytest

from pipesched import io
from pipesched.errors import PipeschedError
from pipesched.generators import generate
from pipesched.ops import Op
from pipesched.slots import slot_table
from pipesched.validation import (
    DEADLOCK,
    DUPLICATE,
    LOCAL_ORDER,
    MEMORY,
    MISSING,
    MIXED_BACKWARD,
    OUT_OF_RANGE,
    PLACEMENT,
    format_report,
    validate,
)


def kinds(text: str, **kw) -> list[str]:
    return [v.kind for v in validate(io.loads(text), **kw)]


def test_generated_schedules_are_valid() -> None:
    for name in ("gpipe", "1f1b"):
        for p, m in ((2, 1), (4, 8), (8, 3)):
            assert validate(generate(name, p, m)) == []


def test_duplicate_op() -> None:
    assert kinds("# microbatches: 1\nd0: 0F0 0F0 0B0\nd1: 1F0 1B0\n") == [DUPLICATE]


def test_missing_ops() -> None:
    violations = validate(io.loads("# microbatches: 2\nd0: 0F0 0B0 0F1 0B1\nd1: 1F0 1B0 1F1\n"))
    assert [(v.kind, v.ops) for v in violations] == [(MISSING, (Op(1, "B", 1),))]


def test_split_backward_needs_both_halves() -> None:
    assert kinds("d0: 0F0 0I0\nd1: 1F0 1I0 1W0\n") == [MISSING]
    assert kinds("d0: 0F0 0B0 0W0\nd1: 1F0 1B0\n") == [MIXED_BACKWARD]


def test_out_of_range_and_placement() -> None:
    text = "# stages: 2\n# microbatches: 1\n# placement: 0 1\nd0: 0F0 0B0 1F0\nd1: 1B0 0F3\n"
    found = kinds(text)
    assert OUT_OF_RANGE in found and PLACEMENT in found


def test_local_order() -> None:
    violations = validate(io.loads("d0: 0B0 0F0\nd1: 1F0 1B0\n"))
    assert [v.kind for v in violations] == [LOCAL_ORDER]
    assert violations[0].device == 0


def test_weight_before_input_is_local_order() -> None:
    assert kinds("d0: 0F0 0W0 0I0\nd1: 1F0 1I0 1W0\n") == [LOCAL_ORDER]


def test_cross_device_cycle_names_the_waiting_ops() -> None:
    schedule = io.loads("d0: 0F0 0B0 0F1 0B1\nd1: 1F1 1F0 1B0 1B1\n")
    violations = validate(schedule)
    assert [v.kind for v in violations] == [DEADLOCK]
    assert set(violations[0].ops) == {Op.parse(t) for t in ("0B0", "1B0", "1F1", "0F1")}
    report = format_report(schedule, violations)
    assert ">0B0<" in report and ">1F1<" in report and "ERROR HERE" in report


def test_cycle_excludes_devices_that_only_wait_on_it() -> None:
    # devices 0 and 1 wait on each other; device 2 is blocked too, but outside the cycle
    text = "d0: 0F0 0B0 0F1 0B1\nd1: 1F0 1F1 1B0 1B1\nd2: 2F1 2F0 2B0 2B1\n"
    violations = validate(io.loads(text))
    assert [v.kind for v in violations] == [DEADLOCK]
    message = violations[0].message
    assert "device 0 waits at 0B0 for 1B0" in message and "device 1 waits at 1F1 for 0F1" in message
    assert "device 2" not in message


def test_activation_limit() -> None:
    gpipe = io.dumps(generate("gpipe", 2, 4))
    assert kinds(gpipe, activation_limit=4) == []
    violations = validate(io.loads(gpipe), activation_limit=3)
    assert [v.kind for v in violations] == [MEMORY, MEMORY]
    assert violations[0].ops == (Op.parse("0F3"),)
    one_f_one_b = io.dumps(generate("1f1b", 2, 4))
    assert kinds(one_f_one_b, activation_limit=2) == []


@pytest.mark.parametrize(
    "text,expected",
    [
        ("d0: 0F0 0B0\nd1: 1F0 1B0\n", []),
        ("d0: 0F0\nd1: 1F0 1B0\n", [MISSING]),
    ],
)
def test_small_tables(text: str, expected: list[str]) -> None:
    assert kinds(text) == expected


def test_one_index_pass_reports_every_problem_and_commands_raise_the_first() -> None:
    # device 1 holds 0F1 (stage 0 lives on device 0), 1F0 twice, and stage 1 microbatch 1
    # lacks its backward: the one pass finds all three, in table order, then duplicates,
    # then incomplete stage-microbatches
    tables = ("0F0 0B0 0B1", "0F1 1F0 1F0 1B0 1F1")
    broken = generate("1f1b", 2, 2).with_ops(tuple(tuple(map(Op.parse, line.split())) for line in tables))
    found = validate(broken)
    assert [(v.kind, v.message) for v in found] == [
        (PLACEMENT, "0F1 is on device 1, but the placement puts it on device 0 (stage 0, microbatch 1)"),
        (DUPLICATE, "1F0 appears 2 times"),
        (MISSING, "1B1 is missing (or 1I1 and 1W1, or 2 other complete sets)"),
    ]
    # a command that needs a valid table names the first of them, as one line
    with pytest.raises(PipeschedError) as caught:
        slot_table(broken)
    assert str(caught.value) == ("op=0F1: is on device 1, but the placement puts it on device 0 (stage 0, "
                                 "microbatch 1); run `pipesched validate` on the schedule for the full report")
