"""How numbers and counts read in what pipesched prints: counts with the noun in the right
number, and numbers to a few significant digits that keep their trailing zeros."""

from __future__ import annotations

# nouns whose plural is not the singular + "s"
_PLURALS = {"microbatch": "microbatches", "stage-microbatch": "stage-microbatches", "search": "searches"}


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one.

    >>> counted(1, "microbatch"), counted(8, "microbatch"), counted(0, "violation")
    ('1 microbatch', '8 microbatches', '0 violations')
    """
    return f"{count:,} {noun if count == 1 else _PLURALS.get(noun, noun + 's')}"


def significant(value: float, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits, trailing zeros kept (a column of them
    reads alike: 3.900 beside 3.257, not 3.9).

    >>> significant(3.9), significant(3.11), significant(1234.5), significant(0.000123456)
    ('3.900', '3.110', '1234', '0.0001235')
    """
    return f"{value:#.{digits}g}".rstrip(".")
