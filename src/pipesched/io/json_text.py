"""JSON input (schedule files, Hugging Face config.json) with one-line errors: nesting of at
most MAX_NESTING levels, numbers of at most MAX_NUMBER_CHARS characters, finite floats, and
no ``NaN`` or ``Infinity``.

>>> load_json('{"a": [1, 2.5]}', field="model", source="config.json")
{'a': [1, 2.5]}
>>> load_json('{"a": 1e400}', field="model", source="config.json")
Traceback (most recent call last):
...
pipesched.errors.PipeschedError: model=config.json: number 1e400 is not finite; give a finite number
"""

from __future__ import annotations

import json
import math

from pipesched.errors import PipeschedError
from pipesched.limits import MAX_NESTING, MAX_NUMBER_CHARS


class _BadNumber(Exception):
    """A number the JSON text may not hold (the message says why)."""


def _check_length(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"a number of {len(text):,} characters ({text[:20]}...); numbers have at most "
                         f"{MAX_NUMBER_CHARS}")
    return text


def _integer(text: str) -> int:
    return int(_check_length(text))


def _real(text: str) -> float:
    value = float(_check_length(text))
    if not math.isfinite(value):
        raise _BadNumber(f"number {text} is not finite; give a finite number")
    return value


def _constant(name: str) -> float:
    raise _BadNumber(f"{name} is not a number JSON files may hold here; give a finite number")


def _depth(value: object) -> int:
    """Nesting depth of lists and objects (1 for a flat list), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING:
                stack.extend((child, depth + 1) for child in item if isinstance(child, list | dict))
    return deepest


def load_json(text: str, *, field: str, source: str) -> object:
    """Parse JSON ``text``; any problem becomes one line ``field=source: ...``."""
    try:
        data = json.loads(text, parse_int=_integer, parse_float=_real, parse_constant=_constant)
    except _BadNumber as exc:
        raise PipeschedError(f"{field}={source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PipeschedError(f"{field}={source}: not valid JSON at line {exc.lineno} column {exc.colno} "
                             f"({exc.msg}); fix the file") from None
    except RecursionError:
        raise PipeschedError(f"{field}={source}: nested deeper than {MAX_NESTING} levels; flatten it") from None
    if _depth(data) > MAX_NESTING:
        raise PipeschedError(f"{field}={source}: nested deeper than {MAX_NESTING} levels; flatten it")
    return data
