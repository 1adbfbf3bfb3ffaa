"""Assertions shared by the command-line tests."""

from __future__ import annotations


def assert_one_line_error(result, *fragments: str) -> None:
    """The command failed the way every bad input must: exit 2, one `pipesched: error:` line
    holding each fragment, no traceback."""
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("pipesched: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.err
