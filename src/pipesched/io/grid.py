"""The human-editable grid text format.

```
# pipesched schedule
# name: 1f1b
# stages: 4
# microbatches: 8
# placement: 0 1 2 3
d0: 0F0 0F1 0F2 0F3 .   .   .   0B0 ...
d1: .   1F0 1F1 1F2 .   .   1B0 ...
```

One line per device, ops in the order the device runs them, ``.`` for an idle step (ignored on
reading: only the order matters). ``dN:`` prefixes are optional; when present they must
count up from d0. Header lines ``# key: value`` are optional: without ``placement`` each stage
goes to the device whose row holds it; ``stages`` and ``microbatches`` default to the largest
index seen plus one. Bidirectional schedules give one ``placement:`` line per replica and a
``route:`` line (replica of each microbatch). Other ``#`` lines are comments.
"""

from __future__ import annotations

import json
import re

from pipesched.errors import PipeschedError
from pipesched.io.layout import step_rows
from pipesched.ops import Op
from pipesched.schedule import Placement, Schedule

IDLE = "."
_HEADER = re.compile(r"^#\s*([a-z]+)\s*:\s*(.*)$")
_DEVICE_PREFIX = re.compile(r"^d(\d+)\s*:")


def dumps(schedule: Schedule) -> str:
    """Grid text of ``schedule``; ``loads(dumps(s)) == s``."""
    lines = ["# pipesched schedule", f"# name: {schedule.name}",
             f"# stages: {schedule.num_stages}", f"# microbatches: {schedule.num_microbatches}"]
    lines += [f"# placement: {' '.join(map(str, replica))}" for replica in schedule.placement.replicas]
    if schedule.placement.num_replicas > 1:
        lines.append(f"# route: {' '.join(map(str, schedule.route))}")
    if schedule.params:
        lines.append(f"# params: {json.dumps(dict(schedule.params), sort_keys=True, default=str)}")
    rows = step_rows(schedule)
    # cells as wide as the widest plain op; a fused op's cell is wider (its row shifts right)
    width = max((len(str(op)) for _, op in schedule.ops()), default=1)
    for device, row in enumerate(rows):
        cells = [(str(op) if op is not None else IDLE).ljust(width) for op in row]
        lines.append(f"d{device}: {' '.join(cells)}".rstrip())
    return "\n".join(lines) + "\n"


def loads(text: str, *, source: str = "<text>") -> Schedule:
    """Parse grid text; errors name ``source:line:column`` and the offending token."""
    header: dict[str, list[tuple[int, str]]] = {}
    rows: list[list[Op]] = []
    row_lines: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _HEADER.match(line)
            if match:
                header.setdefault(match.group(1), []).append((number, match.group(2).strip()))
            continue
        body, offset = raw, 0
        prefix = _DEVICE_PREFIX.match(line)
        if prefix:
            if int(prefix.group(1)) != len(rows):
                raise PipeschedError(
                    f"{source}:{number}:1: device label d{prefix.group(1)} out of order; expected d{len(rows)}"
                )
            offset = raw.index(":") + 1
            body = raw[offset:]
        rows.append(_parse_row(body, offset, number, source))
        row_lines.append(number)
    if not rows:
        raise PipeschedError(f"{source}: no device rows; write one line of ops per device, e.g. d0: 0F0 0B0")
    return _build(rows, header, source)


def _parse_row(body: str, offset: int, number: int, source: str) -> list[Op]:
    ops = []
    for match in re.finditer(r"\S+", body):
        token = match.group(0)
        if token == IDLE:
            continue
        try:
            ops.append(Op.parse(token))
        except PipeschedError:
            column = offset + match.start() + 1
            raise PipeschedError(
                f"{source}:{number}:{column}: bad op token {token!r}; write STAGE KIND MICROBATCH like 2F0, 3I1, 3W1, 1B0, a fused pair like (0F1;1B0)OVERLAP_F_B, or . for idle"
            ) from None
    return ops


def _ints(entry: tuple[int, str], key: str, source: str) -> list[int]:
    number, value = entry
    try:
        return [int(x) for x in value.split()]
    except ValueError:
        raise PipeschedError(f"{source}:{number}:1: header {key}={value!r}: expected whole numbers separated by spaces") from None


def _build(rows: list[list[Op]], header: dict[str, list[tuple[int, str]]], source: str) -> Schedule:
    seen = [atom for row in rows for op in row for atom in op.atoms]
    stages = _ints(header["stages"][0], "stages", source)[0] if "stages" in header else max((op.stage for op in seen), default=0) + 1
    microbatches = (_ints(header["microbatches"][0], "microbatches", source)[0] if "microbatches" in header
                    else max((op.microbatch for op in seen), default=0) + 1)
    name = header["name"][0][1] if "name" in header else "custom"
    if "placement" in header:
        placement = Placement(len(rows), tuple(tuple(_ints(e, "placement", source)) for e in header["placement"]))
    else:
        placement = infer_placement(rows, stages, source)
    route = tuple(_ints(header["route"][0], "route", source)) if "route" in header else ()
    params: dict[str, object] = {}
    if "params" in header:
        number, value = header["params"][0]
        try:
            params = json.loads(value)
        except json.JSONDecodeError:
            raise PipeschedError(f"{source}:{number}:1: header params is not a JSON object; remove the line or fix it") from None
    return Schedule(name, placement, microbatches, tuple(tuple(r) for r in rows), route, params)


def infer_placement(rows: list[list[Op]], num_stages: int, source: str) -> Placement:
    """Each stage on the device whose row holds it (one replica)."""
    device_of: dict[int, int] = {}
    for device, row in enumerate(rows):
        for op in (atom for entry in row for atom in entry.atoms):
            previous = device_of.setdefault(op.stage, device)
            if previous != device:
                raise PipeschedError(
                    f"{source}: stage {op.stage} appears on devices {previous} and {device}; "
                    "give a '# placement:' line per replica and a '# route:' line for replicated stages"
                )
    missing = [s for s in range(num_stages) if s not in device_of]
    if missing:
        raise PipeschedError(f"{source}: stage {missing[0]} has no ops, so its device is unknown; add a '# placement:' header")
    return Placement(len(rows), (tuple(device_of[s] for s in range(num_stages)),))
