"""JSON form of a schedule: everything the grid text holds, for programs.

``params`` are the generator's parameters, for display; ``execution`` is what the
simulation reads beyond the ops (``Execution.to_dict``; files without it keep that in
``params``, see ``pipesched.io.execution``)."""

from __future__ import annotations

import json

from pipesched.errors import PipeschedError, shorten
from pipesched.io.execution import read_execution
from pipesched.io.json_text import load_json
from pipesched.io.op_tokens import check_op_count, read_op
from pipesched.limits import (
    MAX_DEVICES,
    MAX_MICROBATCHES,
    MAX_OPS,
    MAX_REPLICAS,
    MAX_STAGES,
    check_count,
    check_name,
    check_table_size,
)
from pipesched.rules import RULES, Rules
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
        "execution": schedule.execution.to_dict(),
        "devices": [[str(op) for op in ops] for ops in schedule.device_ops],
        **({"frozen": sorted(schedule.frozen)} if schedule.frozen else {}),
    }


def dumps(schedule: Schedule) -> str:
    return json.dumps(to_dict(schedule), indent=1, default=str) + "\n"


def loads(text: str, *, source: str = "<json>", rules: Rules = RULES) -> Schedule:
    """Parse a JSON schedule whose ops are of the kinds of ``rules`` (the schedule's rules)."""
    data = load_json(text, field="schedule_file", source=source)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise PipeschedError(f"{source}: field format={shorten(found)!r}: expected {FORMAT!r}")
    for key in ("name", "placement", "microbatches", "devices"):
        if key not in data:
            raise PipeschedError(f"{source}: field {key} is missing; see `pipesched show 1f1b -p 2 -m 2 --format json`")
    name = check_name(f"{source}: field name", data["name"])
    microbatches = check_count(f"{source}: field microbatches", data["microbatches"], MAX_MICROBATCHES,
                               what="microbatches")
    devices = _list(data["devices"], f"{source}: field devices", MAX_DEVICES, "a list of device rows")
    rows = []
    ops_read = 0
    for device, row in enumerate(devices):
        row = _list(row, f"{source}: field devices[{device}]", MAX_OPS, "a list of op strings")
        ops = []
        for index, token in enumerate(row):
            if not isinstance(token, str):
                raise PipeschedError(f"{source}: devices[{device}][{index}]={shorten(token)!r}: not an op; write like 2F0")
            ops.append(read_op(token, where=f"{source}: devices[{device}][{index}]", hint="write like 2F0",
                               rules=rules))
        ops_read += len(ops)
        check_op_count(ops_read, source)
        rows.append(tuple(ops))
    replicas = _list(data["placement"], f"{source}: field placement", MAX_REPLICAS, "a list of replicas")
    placement = Placement(len(rows), tuple(
        tuple(check_count(f"{source}: placement[{r}][{s}]", device, MAX_DEVICES - 1, minimum=0, what="device index")
              for s, device in enumerate(_list(replica, f"{source}: field placement[{r}]", MAX_STAGES, "a list of devices")))
        for r, replica in enumerate(replicas)))
    check_table_size(placement.num_stages, microbatches)
    route = tuple(check_count(f"{source}: route[{mb}]", replica, MAX_REPLICAS - 1, minimum=0, what="replica index")
                  for mb, replica in enumerate(_list(data.get("route", []), f"{source}: field route", MAX_MICROBATCHES,
                                                     "a list of replica indices")))
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise PipeschedError(f"{source}: field params={shorten(params)}: must be a JSON object")
    params, execution = read_execution(data.get("execution"), params, num_stages=placement.num_stages,
                                       num_microbatches=microbatches, where=f"{source}: field ")
    frozen = frozenset(
        check_count(f"{source}: frozen[{k}]", stage, MAX_STAGES - 1, minimum=0, what="stage index")
        for k, stage in enumerate(_list(data.get("frozen", []), f"{source}: field frozen", MAX_STAGES,
                                        "a list of stage indices")))
    return Schedule(name, placement, microbatches, tuple(rows), route, params, frozen=frozen, execution=execution,
                    rules=rules)


def _list(value: object, field: str, limit: int, what: str) -> list:
    if not isinstance(value, list):
        raise PipeschedError(f"{field}={shorten(value)}: must be {what}")
    if len(value) > limit:
        raise PipeschedError(f"{field}: {len(value):,} entries, over the limit of {limit:,}")
    return value
