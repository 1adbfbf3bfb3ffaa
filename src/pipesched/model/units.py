"""Quantities with units in hardware files: ``450 GB/s``, ``400 Gb/s``, ``80 GiB``, ``3 us``,
``989 TFLOP/s``. A bare number is taken in base units (bytes, bytes/s, seconds, FLOP/s)."""

from __future__ import annotations

import re

from pipesched.errors import invalid
from pipesched.limits import MAX_AMOUNT, MAX_NUMBER_CHARS, MAX_SECONDS, check_amount
from pipesched.units import GB, KB, MB, PB, TB, GiB, KiB, MiB, TiB

_PREFIX = {"": 1.0, "k": KB, "K": KB, "M": MB, "G": GB, "T": TB, "P": PB,
           "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": TiB}

# unit suffix (after the prefix) -> (quantity, factor to base units)
_UNITS = {
    "B": ("bytes", 1.0),
    "B/s": ("bandwidth", 1.0),
    "b/s": ("bandwidth", 1.0 / 8),  # bits per second
    "bps": ("bandwidth", 1.0 / 8),
    "FLOP/s": ("flops", 1.0),
    "FLOPS": ("flops", 1.0),
    "s": ("time", 1.0),
}
_BASE_UNITS = {"bytes": "bytes", "bandwidth": "bytes/s", "time": "seconds", "flops": "FLOP/s"}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_QUANTITY = re.compile(r"^\s*([0-9.eE+-]+)\s*([A-Za-zµ/]*)\s*$")


def parse_quantity(value: object, quantity: str, field: str) -> float:
    """Read a number or a string with a unit as ``quantity`` (bytes, bandwidth, time, flops).

    >>> parse_quantity("400 Gb/s", "bandwidth", "link")
    50000000000.0
    >>> parse_quantity("3 us", "time", "latency")
    3e-06
    >>> parse_quantity(80, "bytes", "memory")
    80.0
    """
    if isinstance(value, bool):
        raise invalid(field, value, f"must be a number or a {quantity} with a unit")
    if isinstance(value, int | float):
        number = value
    else:
        text = str(value) if isinstance(value, str) else ""
        match = _QUANTITY.match(text) if len(text) <= 2 * MAX_NUMBER_CHARS else None
        if match is None:
            raise invalid(field, value, f"must be a number or a {quantity} with a unit such as {_example(quantity)}")
        try:
            number = float(match.group(1))
        except ValueError:
            raise invalid(field, value, f"must be a number or a {quantity} with a unit such as {_example(quantity)}") from None
        unit = match.group(2)
        if unit:
            number *= _unit_factor(unit, quantity, field, value)
    limit = MAX_SECONDS if quantity == "time" else MAX_AMOUNT
    return check_amount(field, number, limit=limit, unit=_BASE_UNITS[quantity])


def _unit_factor(unit: str, quantity: str, field: str, value: object) -> float:
    if quantity == "time":
        if unit in _TIME_UNITS:
            return _TIME_UNITS[unit]
        raise invalid(field, value, f"unknown time unit {unit!r}; use one of {', '.join(_TIME_UNITS)}")
    for suffix, (kind, factor) in _UNITS.items():
        prefix = unit[: len(unit) - len(suffix)]
        if unit.endswith(suffix) and kind == quantity and prefix in _PREFIX:
            return _PREFIX[prefix] * factor
    raise invalid(field, value, f"unknown {quantity} unit {unit!r}; for example {_example(quantity)}")


def _example(quantity: str) -> str:
    return {"bytes": "80 GiB", "bandwidth": "450 GB/s or 400 Gb/s", "time": "3 us",
            "flops": "989 TFLOP/s"}[quantity]
