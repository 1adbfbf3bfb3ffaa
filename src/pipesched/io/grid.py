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

One line per device, ops in the order the device runs them, ``.`` for an idle step (ignored
on reading: only the order matters); the ops are of the kinds of the schedule's rules
(``loads`` reads them with the rules it is given, ``rules.RULES`` by default). ``dN:``
prefixes are optional; when present they must count up from d0. Header lines
``# key: value`` are optional: without ``placement`` each stage goes to the device whose row
holds it; ``stages`` and ``microbatches`` default to the largest index seen plus one.
Bidirectional schedules give one ``placement:`` line per replica and a ``route:`` line
(replica of each microbatch); a table with frozen stages names them in a ``frozen:`` line.
``params:`` holds the generator's parameters (JSON, for display) and ``execution:`` what the
simulation reads beyond the ops (JSON, ``Execution.to_dict``; files without it keep that in
``params``, see ``pipesched.io.execution``). Other ``#`` lines are comments.
"""

from __future__ import annotations

import json
import re

from pipesched.errors import PipeschedError, shorten
from pipesched.io.execution import read_execution
from pipesched.io.json_text import load_json
from pipesched.io.layout import step_rows
from pipesched.io.op_tokens import check_op_count, read_op
from pipesched.limits import (
    MAX_DEVICES,
    MAX_MICROBATCHES,
    MAX_REPLICAS,
    MAX_STAGES,
    check_name,
    check_table_size,
    parse_int,
)
from pipesched.ops import Op
from pipesched.rules import RULES, Rules
from pipesched.schedule import Execution, Placement, Schedule

IDLE = "."
# what the numbers of each header count, for errors
_WHAT = {"stages": "stages", "microbatches": "microbatches", "placement": "device index",
         "route": "replica index", "frozen": "stage index"}
_HEADER = re.compile(r"^#\s*([a-z]+)\s*:\s*(.*)$")
_DEVICE_PREFIX = re.compile(r"^d(\d+)\s*:")


def dumps(schedule: Schedule) -> str:
    """Grid text of ``schedule``; ``loads(dumps(s)) == s``."""
    lines = ["# pipesched schedule", f"# name: {schedule.name}",
             f"# stages: {schedule.num_stages}", f"# microbatches: {schedule.num_microbatches}"]
    lines += [f"# placement: {' '.join(map(str, replica))}" for replica in schedule.placement.replicas]
    if schedule.placement.num_replicas > 1:
        lines.append(f"# route: {' '.join(map(str, schedule.route))}")
    if schedule.frozen:
        lines.append(f"# frozen: {' '.join(map(str, sorted(schedule.frozen)))}")
    if schedule.params:
        lines.append(f"# params: {json.dumps(dict(schedule.params), sort_keys=True, default=str)}")
    if schedule.execution.to_dict():
        lines.append(f"# execution: {json.dumps(schedule.execution.to_dict(), sort_keys=True)}")
    rows = step_rows(schedule)
    # cells as wide as the widest plain op; a fused op's cell is wider (its row shifts right)
    width = max((len(str(op)) for _, op in schedule.ops()), default=1)
    for device, row in enumerate(rows):
        cells = [(str(op) if op is not None else IDLE).ljust(width) for op in row]
        lines.append(f"d{device}: {' '.join(cells)}".rstrip())
    return "\n".join(lines) + "\n"


def loads(text: str, *, source: str = "<text>", rules: Rules = RULES) -> Schedule:
    """Parse grid text of a schedule whose ops are of the kinds of ``rules`` (the schedule's
    rules); errors name ``source:line:column`` and the offending token."""
    header: dict[str, list[tuple[int, str]]] = {}
    rows: list[list[Op]] = []
    ops_read = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _HEADER.match(line)
            if match:
                entries = header.setdefault(match.group(1), [])
                if len(entries) >= MAX_REPLICAS:
                    raise PipeschedError(f"{source}:{number}:1: header {match.group(1)} given more than "
                                         f"{MAX_REPLICAS} times; give one line per replica at most")
                entries.append((number, match.group(2).strip()))
            continue
        if len(rows) >= MAX_DEVICES:
            raise PipeschedError(f"{source}:{number}:1: more than {MAX_DEVICES:,} device rows, over the limit of "
                                 "pipeline devices; give one row per device")
        body, offset = raw, 0
        prefix = _DEVICE_PREFIX.match(line)
        if prefix:
            label = prefix.group(1)
            if len(label) > len(str(MAX_DEVICES)) or int(label) != len(rows):
                raise PipeschedError(
                    f"{source}:{number}:1: device label d{shorten(label)} out of order; expected d{len(rows)}"
                )
            offset = raw.index(":") + 1
            body = raw[offset:]
        rows.append(_parse_row(body, offset, number, source, rules))
        ops_read += len(rows[-1])
        check_op_count(ops_read, source)
    if not rows:
        raise PipeschedError(f"{source}: no device rows; write one line of ops per device, e.g. d0: 0F0 0B0")
    return _build(rows, header, source, rules)


def _parse_row(body: str, offset: int, number: int, source: str, rules: Rules) -> list[Op]:
    ops = []
    for match in re.finditer(r"\S+", body):
        token = match.group(0)
        if token == IDLE:
            continue
        ops.append(read_op(token, where=f"{source}:{number}:{offset + match.start() + 1}",
                           hint="write STAGE KIND MICROBATCH like 2F0, 3I1, 3W1, 1B0, a fused pair like "
                                "(0F1;1B0)OVERLAP_F_B, or . for idle", rules=rules))
    return ops


def _ints(entry: tuple[int, str], key: str, source: str, *, limit: int, count: int) -> list[int]:
    """The whole numbers of header line ``entry``: at most ``count`` of them, each below ``limit``."""
    number, value = entry
    words = value.split(maxsplit=count)
    if len(words) > count:
        raise PipeschedError(f"{source}:{number}:1: header {key}: more than {count:,} numbers, over the limit; "
                             "give one number per stage or microbatch")
    return [parse_int(f"{source}:{number}:1: header {key}", word, limit, what=_WHAT[key]) for word in words]


def _one_int(header: dict[str, list[tuple[int, str]]], key: str, source: str, limit: int) -> int | None:
    if key not in header:
        return None
    values = _ints(header[key][0], key, source, limit=limit, count=1)
    if not values:
        number = header[key][0][0]
        raise PipeschedError(f"{source}:{number}:1: header {key} is empty; write a whole number or remove the line")
    return values[0]


def _build(rows: list[list[Op]], header: dict[str, list[tuple[int, str]]], source: str, rules: Rules) -> Schedule:
    seen = [atom for row in rows for op in row for atom in op.atoms]
    stages = _one_int(header, "stages", source, MAX_STAGES)
    if stages is None:
        stages = max((op.stage for op in seen), default=0) + 1
    microbatches = _one_int(header, "microbatches", source, MAX_MICROBATCHES)
    if microbatches is None:
        microbatches = max((op.microbatch for op in seen), default=0) + 1
    check_table_size(stages, microbatches)
    name = check_name(f"{source}: header name", header["name"][0][1]) if "name" in header else "custom"
    if "placement" in header:
        placement = Placement(len(rows), tuple(tuple(_ints(e, "placement", source, limit=MAX_DEVICES - 1,
                                                                     count=MAX_STAGES))
                                               for e in header["placement"]))
    else:
        placement = infer_placement(rows, stages, source)
    route = (tuple(_ints(header["route"][0], "route", source, limit=MAX_REPLICAS - 1, count=MAX_MICROBATCHES))
             if "route" in header else ())
    frozen = (frozenset(_ints(header["frozen"][0], "frozen", source, limit=MAX_STAGES - 1, count=MAX_STAGES))
              if "frozen" in header else frozenset())
    params: dict[str, object] = {}
    if "params" in header:
        number, value = header["params"][0]
        params = load_json(value, field="params", source=f"{source}:{number}")
        if not isinstance(params, dict):
            raise PipeschedError(f"{source}:{number}:1: header params is not a JSON object; remove the line or fix it")
    params, execution = _execution(header, params, placement.num_stages, microbatches, source)
    return Schedule(name, placement, microbatches, tuple(tuple(r) for r in rows), route, params, frozen=frozen,
                    execution=execution, rules=rules)


def _execution(header: dict[str, list[tuple[int, str]]], params: dict[str, object], stages: int,
               microbatches: int, source: str) -> tuple[dict[str, object], Execution]:
    """(display params, execution) of the ``execution:`` header, or of older files' params."""
    given = None
    where = f"{source}: header "
    if "execution" in header:
        number, value = header["execution"][0]
        given = load_json(value, field="execution", source=f"{source}:{number}")
        where = f"{source}:{number}:1: header "
    elif "params" in header:
        where = f"{source}:{header['params'][0][0]}:1: header "
    return read_execution(given, params, num_stages=stages, num_microbatches=microbatches, where=where)


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
