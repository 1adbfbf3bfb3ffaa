"""Option parsing shared by several commands."""

from __future__ import annotations

from pipesched.errors import PipeschedError
from pipesched.limits import MAX_NUMBER_CHARS


def parse_settings(pairs: list[str] | None) -> dict[str, object]:
    """``["waves=2", "memory_limit=4"]`` -> {"waves": 2, "memory_limit": 4}; numbers are
    converted, other values stay strings."""
    options: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PipeschedError(f"--set={pair!r}: write KEY=VALUE, e.g. --set waves=2")
        options[key.strip().replace("-", "_")] = _number(value.strip())
    return options


def _number(text: str) -> object:
    if len(text) > MAX_NUMBER_CHARS:  # no number is this long: the option says what it wants
        return text
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def split_names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
