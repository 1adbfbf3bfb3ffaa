"""JSON form of a schedule: everything the grid text holds, for programs."""

from __future__ import annotations

import json

from pipesched.errors import PipeschedError
from pipesched.ops import Op
from pipesched.schedule import Placement, Schedule

FORMAT = "pipesched-schedule"
VERSION = 1


def to_dict(schedule: Schedule) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": schedule.name,
        "stages": schedule.num_stages,
        "microbatches": schedule.num_microbatches,
        "placement": [list(r) for r in schedule.placement.replicas],
        "route": list(schedule.route),
        "params": dict(schedule.params),
        "devices": [[str(op) for op in ops] for ops in schedule.device_ops],
        **({"frozen": sorted(schedule.frozen)} if schedule.frozen else {}),
    }


def dumps(schedule: Schedule) -> str:
    return json.dumps(to_dict(schedule), indent=1, default=str) + "\n"


def loads(text: str, *, source: str = "<json>") -> Schedule:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PipeschedError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PipeschedError(f"{source}: field format={data.get('format') if isinstance(data, dict) else None!r}: expected {FORMAT!r}")
    for key in ("name", "placement", "microbatches", "devices"):
        if key not in data:
            raise PipeschedError(f"{source}: field {key} is missing; see `pipesched show 1f1b -p 2 -m 2 --format json`")
    devices = data["devices"]
    if not isinstance(devices, list) or not all(isinstance(row, list) for row in devices):
        raise PipeschedError(f"{source}: field devices must be a list of lists of op strings")
    rows = []
    for device, row in enumerate(devices):
        ops = []
        for index, token in enumerate(row):
            try:
                ops.append(Op.parse(str(token)))
            except PipeschedError:
                raise PipeschedError(f"{source}: devices[{device}][{index}]={token!r}: not an op; write like 2F0") from None
        rows.append(tuple(ops))
    try:
        placement = Placement(len(rows), tuple(tuple(int(x) for x in r) for r in data["placement"]))
        return Schedule(str(data["name"]), placement, int(data["microbatches"]), tuple(rows),
                        tuple(int(x) for x in data.get("route", ())), dict(data.get("params", {})),
                        frozen=frozenset(int(x) for x in data.get("frozen", ())))
    except (TypeError, ValueError) as exc:
        raise PipeschedError(f"{source}: malformed schedule fields ({exc})") from None
