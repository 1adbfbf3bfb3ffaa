"""The figures a benchmark reports for ``side_by_side.py``: one line each,
``figure NAME VALUE UNIT higher|lower`` (which way is better), beside its own text."""

from __future__ import annotations

PREFIX = "figure"


def figure(name: str, value: float, unit: str, *, better: str = "higher") -> None:
    """Print one figure line (``better``: "higher" for rates, "lower" for times)."""
    assert better in ("higher", "lower") and " " not in name and " " not in unit
    print(f"{PREFIX} {name} {value!r} {unit} {better}", flush=True)


def parse(text: str) -> dict[str, tuple[float, str, str]]:
    """NAME -> (value, unit, better) of every figure line in a benchmark's output."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == PREFIX:
            found[parts[1]] = (float(parts[2]), parts[3], parts[4])
    return found
