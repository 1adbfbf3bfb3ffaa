"""Index lists as text: ``0-39``, ``0-3,6``, the form layer, stage and device choices take
on the command line and in files.

>>> parse_indices("0-3,6", field="stages", count=8)
(0, 1, 2, 3, 6)
>>> format_indices({0, 1, 2, 3, 6})
'0-3,6'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pipesched.errors import PipeschedError

_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
# no index list names more than this many things (layers, stages): larger is a typo
MAX_INDEX_COUNT = 1_000_000


def parse_indices(text: str, *, field: str, count: int, what: str = "indices") -> tuple[int, ...]:
    """Sorted distinct indices of ``A-B`` ranges and single ``A`` items separated by commas
    or spaces, each within 0..count-1 (``what`` names them in errors).

    Raises PipeschedError naming ``field`` and the bad item.
    """
    count = min(count, MAX_INDEX_COUNT)
    found: set[int] = set()
    items = [item for item in re.split(r"[,\s]+", str(text).strip()) if item]
    if not items:
        raise PipeschedError(f"{field}={str(text)[:40]!r}: give {what} like 0-3 or 0,2,5")
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            raise PipeschedError(f"{field}={item[:40]!r}: not an index or a range; give {what} like 0-3 or 0,2,5")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise PipeschedError(f"{field}={item}: the range goes backwards; write it low-high")
        if last >= count:
            raise PipeschedError(f"{field}={item}: outside the {count} {what} (0..{count - 1})")
        found.update(range(first, last + 1))
    return tuple(sorted(found))


def format_indices(indices: Iterable[int]) -> str:
    """Indices as ranges (``0-3,6``); an empty set gives ``""``."""
    ordered = sorted(set(indices))
    parts: list[str] = []
    k = 0
    while k < len(ordered):
        j = k
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[k]) if j == k else f"{ordered[k]}-{ordered[j]}")
        k = j + 1
    return ",".join(parts)
