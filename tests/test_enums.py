"""The closed vocabularies (``pipesched.enums``): outputs keep their words, and the library
compares members, never the words themselves."""

from __future__ import annotations

import ast
import json
from enum import StrEnum
from pathlib import Path

import pytest

import pipesched.enums as enums
from pipesched.compare import compare
from pipesched.enums import Level, MemoryUnit, Role, Stream, TimeUnit
from pipesched.generators import generate
from pipesched.rules import RULES, stage_roles

SOURCE = Path(enums.__file__).parent
VOCABULARIES = [value for value in vars(enums).values()
                if isinstance(value, type) and issubclass(value, StrEnum) and value not in (StrEnum, enums.Word)]
WORDS = {member.value for vocabulary in VOCABULARIES for member in vocabulary}


def test_members_print_and_serialize_as_their_words() -> None:
    for vocabulary in VOCABULARIES:
        for member in vocabulary:
            assert member == member.value and str(member) == member.value and repr(member) == repr(member.value)
            assert json.loads(json.dumps({member: [member]})) == {member.value: [member.value]}


def test_results_carry_members_that_read_as_the_old_words() -> None:
    result = compare(["1f1b"], p=2, m=4, levels=("formula", "table"))
    assert [r.level for r in result.results] == [Level.FORMULA, Level.TABLE]
    assert all(r.time_unit is TimeUnit.SLOT and r.memory_unit is MemoryUnit.ACTIVATION_UNITS for r in result.results)
    shown = json.loads(json.dumps(result.to_dict()))
    assert shown["levels"] == ["formula", "table"] and [r["level"] for r in shown["records"]] == ["formula", "table"]
    # stage 0 frozen with nothing before it trains: no backward; stage 1 trains
    assert stage_roles(2, {0}) == (Role.FORWARD_ONLY, Role.TRAINS)
    assert {rule.stream for rule in RULES} == set(Stream)
    assert generate("1f1b", 2, 2).roles == ("trains", "trains")


def _compared_words(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every comparison of a vocabulary's word as a string literal in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [x for operand in operands
                        for x in ([operand] if not isinstance(operand, ast.Tuple | ast.List | ast.Set) else operand.elts)]
            found += [(node.lineno, x.value) for x in literals
                      if isinstance(x, ast.Constant) and isinstance(x.value, str) and x.value in WORDS]
    return found


@pytest.mark.parametrize("path", sorted(SOURCE.rglob("*.py")), ids=lambda p: str(p.relative_to(SOURCE)))
def test_no_code_compares_a_vocabulary_word_as_a_string(path: Path) -> None:
    assert not _compared_words(path), f"compare the enums.py member instead of the word: {_compared_words(path)}"
