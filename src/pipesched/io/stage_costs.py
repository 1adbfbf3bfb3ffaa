"""Stage-cost files: what one microbatch costs on each stage, measured by the user.

CSV, one row per stage, with the header::

    stage,forward,backward_input,backward_weight,activation_bytes,output_bytes

Times in seconds, sizes in bytes. A full backward B costs backward_input + backward_weight;
an optional ``backward`` column gives B's time instead. Optional ``static_bytes``
(parameters + gradients + optimizer state of the stage) and ``grad_bytes`` (what its
replicas all-reduce) columns feed the memory trace and the all-reduce; ``kept_for_w_bytes``
(gradients a split backward's I computes and its W still needs) adds to memory from I to W; ``frozen`` (0 or
1) marks a stage whose layers are all frozen (no weight gradient: the schedule drops its W,
or its whole backward when every stage before it is frozen too). An optional ``fb`` column
gives the measured time of an overlapped pair (DualPipe's F&B, a fused ``OVERLAP_F_B`` op)
whose forward runs the stage (``StageCosts.fused_time``). Columns may come in
any order; every stage 0..S-1 appears exactly once (rows in any order).

>>> costs = parse_stage_costs(
...     "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\\n"
...     "0,0.010,0.010,0.008,2e9,1.6e7\\n"
...     "1,0.012,0.0125,0.0075,2e9,1.6e7\\n")
>>> costs.full_backward(1)
0.02
"""

from __future__ import annotations

import csv
import io
import math
import os

from pipesched.costs import StageCosts
from pipesched.errors import PipeschedError, shorten
from pipesched.io.files import read_text, write_atomic
from pipesched.limits import (
    MAX_AMOUNT,
    MAX_SECONDS,
    MAX_STAGES,
    check_amount,
    check_count,
    check_number_text,
    parse_int,
)

REQUIRED_COLUMNS = ("stage", "forward", "backward_input", "backward_weight", "activation_bytes", "output_bytes")
OPTIONAL_COLUMNS = ("backward", "static_bytes", "grad_bytes", "kept_for_w_bytes", "frozen", "fb")
# the StageCosts field of a column whose name differs from it
_FIELDS = {"fb": "forward_backward"}
_UNITS = {"forward": "seconds", "backward_input": "seconds", "backward_weight": "seconds",
          "backward": "seconds", "activation_bytes": "bytes", "output_bytes": "bytes",
          "static_bytes": "bytes", "grad_bytes": "bytes", "kept_for_w_bytes": "bytes", "frozen": "0 or 1",
          "fb": "seconds"}


def parse_stage_costs(text: str, *, source: str = "<text>", num_stages: int | None = None) -> StageCosts:
    """Read stage costs from CSV text; ``num_stages`` (when known) is the stage count the
    file must cover. Every problem raises PipeschedError naming the line, field and value."""
    if num_stages is not None:
        check_count("stages", num_stages, MAX_STAGES, what="stages")
    lines = _lines(text, source)
    if not lines:
        raise PipeschedError(f"stage_costs={source}: empty file; write the header {','.join(REQUIRED_COLUMNS)} and one row per stage")
    header_line, header = lines[0]
    columns = [cell.strip() for cell in header]
    known = set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    for column in columns:
        if column not in known:
            raise PipeschedError(
                f"{source}:{header_line}: column={column!r}: unknown; the header is "
                f"{','.join(REQUIRED_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})"
            )
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise PipeschedError(f"{source}:{header_line}: column={duplicated[0]!r}: appears twice in the header; keep one")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise PipeschedError(
            f"{source}:{header_line}: column={missing[0]!r}: missing from the header; the header is "
            f"{','.join(REQUIRED_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})"
        )
    values: dict[int, dict[str, float]] = {}
    for number, row in lines[1:]:
        cells = [cell.strip() for cell in row]
        if len(cells) != len(columns):
            raise PipeschedError(
                f"{source}:{number}: row has {len(cells)} fields, the header {len(columns)}; give one value per column"
            )
        record = dict(zip(columns, cells, strict=True))
        stage = _stage(record["stage"], source, number)
        if stage in values:
            raise PipeschedError(f"{source}:{number}: stage={stage}: appears twice; give one row per stage")
        if num_stages is not None and stage >= num_stages:
            raise PipeschedError(
                f"{source}:{number}: stage={stage}: extra row; the schedule has {num_stages} stages (0..{num_stages - 1})"
            )
        values[stage] = {name: _amount(record[name], name, source, number) for name in columns if name != "stage"}
    count = num_stages if num_stages is not None else (max(values) + 1 if values else 0)
    if count == 0:
        raise PipeschedError(f"stage_costs={source}: no stage rows; give one row per stage after the header")
    for stage in range(count):
        if stage not in values:
            raise PipeschedError(
                f"{source}: stage={stage}: missing row; give one row per stage 0..{count - 1}"
            )

    def column(name: str) -> tuple[float, ...] | None:
        if name not in columns:
            return None
        return tuple(values[stage][name] for stage in range(count))

    frozen = column("frozen")
    return StageCosts(
        frozen=None if frozen is None else tuple(flag == 1.0 for flag in frozen),
        forward=column("forward"),
        backward_input=column("backward_input"),
        backward_weight=column("backward_weight"),
        activation_bytes=column("activation_bytes"),
        output_bytes=column("output_bytes"),
        backward=column("backward"),
        static_bytes=column("static_bytes"),
        grad_bytes=column("grad_bytes"),
        kept_for_w_bytes=column("kept_for_w_bytes"),
        forward_backward=column("fb"),
    )


def load_stage_costs(path: str | os.PathLike[str], *, num_stages: int | None = None) -> StageCosts:
    """Read a stage-cost CSV file (see the module docstring)."""
    return parse_stage_costs(read_text(path, "stage_costs"), source=str(path), num_stages=num_stages)


def dumps_stage_costs(costs: StageCosts) -> str:
    """The CSV text of ``costs``; ``parse_stage_costs`` reads it back to equal costs."""
    columns = list(REQUIRED_COLUMNS)
    columns += [name for name in OPTIONAL_COLUMNS if getattr(costs, _FIELDS.get(name, name)) is not None]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for stage in range(costs.num_stages):
        writer.writerow([stage, *(_cell(getattr(costs, _FIELDS.get(name, name))[stage]) for name in columns[1:])])
    return out.getvalue()


def _cell(value: float | bool) -> str:
    return str(int(value)) if isinstance(value, bool) else repr(value)


def save_stage_costs(costs: StageCosts, path: str | os.PathLike[str]) -> None:
    write_atomic(path, dumps_stage_costs(costs))


def _lines(text: str, source: str) -> list[tuple[int, list[str]]]:
    """The non-blank rows with their line numbers: a header and at most MAX_STAGES rows."""
    lines = []
    reader = csv.reader(io.StringIO(text))
    try:
        for number, row in enumerate(reader, start=1):
            if any(cell.strip() for cell in row):
                if len(lines) > MAX_STAGES:
                    raise PipeschedError(f"{source}:{number}: more than {MAX_STAGES:,} stage rows, over the limit "
                                         "of stages; give one row per stage")
                lines.append((number, row))
    except csv.Error as exc:
        raise PipeschedError(f"{source}:{reader.line_num}: not a CSV row ({shorten(str(exc))}); "
                             "write one comma-separated row per stage") from None
    return lines


def _stage(text: str, source: str, line: int) -> int:
    if not text.strip().lstrip("+-").isdigit():
        raise PipeschedError(f"{source}:{line}: stage={shorten(text)!r}: not a whole number; number the stages 0, 1, 2, ...")
    return parse_int(f"{source}:{line}: stage", text, MAX_STAGES - 1, minimum=0, what="stage index")


def _amount(text: str, name: str, source: str, line: int) -> float:
    try:
        value = float(check_number_text(f"{source}:{line}: {name}", text))
    except ValueError:
        raise PipeschedError(f"{source}:{line}: {name}={text!r}: not a number; give {_UNITS[name]}") from None
    if not math.isfinite(value) or value < 0:
        raise PipeschedError(f"{source}:{line}: {name}={shorten(text)}: must be a finite number >= 0 ({_UNITS[name]})")
    if name == "frozen" and value not in (0.0, 1.0):
        raise PipeschedError(f"{source}:{line}: frozen={shorten(text)}: give 1 for a stage whose layers are all frozen, "
                             "else 0")
    limit = MAX_SECONDS if _UNITS[name] == "seconds" else MAX_AMOUNT
    return check_amount(f"{source}:{line}: {name}", value, limit=limit, unit=_UNITS[name])
