"""Stage-cost files: what one microbatch costs on each stage, measured by the user.

CSV, one row per stage, with at least the header::

    stage,forward,backward_input,backward_weight,activation_bytes,output_bytes

Times in seconds, sizes in bytes. A full backward B costs backward_input + backward_weight;
an optional ``backward`` column gives B's time instead. Optional ``static_bytes``
(parameters + gradients + optimizer state of the stage) and ``grad_bytes`` (what its
replicas all-reduce) columns feed the memory trace and the all-reduce; ``kept_for_w_bytes``
(gradients a split backward's I computes and its W still needs) adds to memory from I to W; ``frozen`` (0 or
1) marks a stage whose layers are all frozen (no weight gradient: the schedule drops its W,
or its whole backward when every stage before it is frozen too); ``recompute_s`` is the part
of I (and B) that redoes the forward. An optional ``fb`` column
gives the measured time of an overlapped pair (DualPipe's F&B, a fused ``OVERLAP_F_B`` op)
whose forward runs the stage (``StageCosts.fused_time``). Three columns hold one value for
all stages, the same on every row: ``input_frees`` (the share of the activations an I frees,
default 0.5), ``fb_cost`` (without ``fb``: a pair's time over F + B, default 1) and ``unit``
(``s``, or ``slot`` for the idealized table's op lengths; default ``s``). Every column is a
field of ``StageCosts`` (``pipesched.costs.COST_FIELDS`` declares each: its meaning, its
column, what a missing column means), so every field written is read back. Columns may come
in any order; every stage 0..S-1 appears exactly once (rows in any order).

>>> costs = parse_stage_costs(
...     "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\\n"
...     "0,0.010,0.010,0.008,2e9,1.6e7\\n"
...     "1,0.012,0.0125,0.0075,2e9,1.6e7\\n")
>>> costs.full_backward(1)
0.02
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os

from pipesched.costs import COST_FIELDS, WORDS, CostField, Quantity, StageCosts, check_value
from pipesched.errors import PipeschedError, shorten
from pipesched.io.files import read_text, write_atomic
from pipesched.limits import MAX_STAGES, check_count, check_number_text, parse_int

# the field of each column
_BY_COLUMN = {spec.column: spec for spec in COST_FIELDS}
REQUIRED_COLUMNS = ("stage", *(spec.column for spec in COST_FIELDS if spec.required))
OPTIONAL_COLUMNS = tuple(spec.column for spec in COST_FIELDS if not spec.required)
# what a field for all stages is when its column is absent (StageCosts' own default)
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(StageCosts)}
_HEADER_HINT = f"the header is {','.join(REQUIRED_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})"


def parse_stage_costs(text: str, *, source: str = "<text>", num_stages: int | None = None) -> StageCosts:
    """Read stage costs from CSV text; ``num_stages`` (when known) is the stage count the
    file must cover. Every problem raises PipeschedError naming the line, field and value."""
    if num_stages is not None:
        check_count("stages", num_stages, MAX_STAGES, what="stages")
    lines = stage_rows(text, source)
    if not lines:
        raise PipeschedError(f"stage_costs={source}: empty file; write the header {','.join(REQUIRED_COLUMNS)} and one row per stage")
    header_line, header = lines[0]
    columns = _header([cell.strip() for cell in header], source, header_line)
    values: dict[int, dict[str, object]] = {}
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
        values[stage] = {name: _cell_value(_BY_COLUMN[name], record[name], source, number)
                         for name in columns if name != "stage"}
    count = num_stages if num_stages is not None else (max(values) + 1 if values else 0)
    if count == 0:
        raise PipeschedError(f"stage_costs={source}: no stage rows; give one row per stage after the header")
    for stage in range(count):
        if stage not in values:
            raise PipeschedError(
                f"{source}: stage={stage}: missing row; give one row per stage 0..{count - 1}"
            )
    # a column not in the file: the field's default (StageCosts' own)
    return StageCosts(**{_BY_COLUMN[name].name: _field_value(_BY_COLUMN[name], values, count, source)
                         for name in columns if name != "stage"})


def _header(columns: list[str], source: str, line: int) -> list[str]:
    """The header's columns, each a known one, none twice, none required missing."""
    for column in columns:
        if column != "stage" and column not in _BY_COLUMN:
            raise PipeschedError(f"{source}:{line}: column={column!r}: unknown; {_HEADER_HINT}")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise PipeschedError(f"{source}:{line}: column={duplicated[0]!r}: appears twice in the header; keep one")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise PipeschedError(f"{source}:{line}: column={missing[0]!r}: missing from the header; {_HEADER_HINT}")
    return columns


def _field_value(spec: CostField, values: dict[int, dict[str, object]], count: int, source: str) -> object:
    """Field ``spec`` from its column: one value per stage, or the one value every row gives."""
    column = tuple(values[stage][spec.column] for stage in range(count))
    if spec.per_stage:
        return column
    differs = next((stage for stage in range(count) if column[stage] != column[0]), None)
    if differs is not None:
        raise PipeschedError(f"{source}: stage={differs}: {spec.column}={column[differs]} differs from stage 0's "
                             f"{column[0]}; it holds one value for all stages: give the same on every row")
    return column[0]


def load_stage_costs(path: str | os.PathLike[str], *, num_stages: int | None = None) -> StageCosts:
    """Read a stage-cost file (see the module docstring)."""
    return parse_stage_costs(read_text(path, "stage_costs"), source=str(path), num_stages=num_stages)


def dumps_stage_costs(costs: StageCosts, *, digits: int | None = None) -> str:
    """The CSV text of ``costs``: the required columns, every other field given (a field for
    all stages when it is not its default); ``parse_stage_costs`` reads it back to equal
    costs. Numbers exactly (``repr``), or to ``digits`` significant digits."""
    written = [spec for spec in COST_FIELDS if _written(spec, costs)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["stage", *(spec.column for spec in written)])
    for stage in range(costs.num_stages):
        row = (getattr(costs, spec.name)[stage] if spec.per_stage else getattr(costs, spec.name) for spec in written)
        writer.writerow([stage, *(_cell(value, digits) for value in row)])
    return out.getvalue()


def _written(spec: CostField, costs: StageCosts) -> bool:
    value = getattr(costs, spec.name)
    if spec.required or spec.per_stage:
        return value is not None
    return value != _DEFAULTS[spec.name]


def _cell(value: object, digits: int | None) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if digits is None else f"{value:.{digits}g}"
    return str(value)


def save_stage_costs(costs: StageCosts, path: str | os.PathLike[str]) -> None:
    write_atomic(path, dumps_stage_costs(costs))


def stage_rows(text: str, source: str) -> list[tuple[int, list[str]]]:
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


def _cell_value(spec: CostField, text: str, source: str, line: int) -> object:
    """One cell of field ``spec``'s column, as StageCosts holds it (bounded by its quantity)."""
    where = f"{source}:{line}: {spec.column}"
    if spec.quantity is Quantity.UNIT:
        return check_value(spec, text, where)
    try:
        value = float(check_number_text(where, text))
    except ValueError:
        raise PipeschedError(f"{where}={text!r}: not a number; give {WORDS[spec.quantity]}") from None
    if not math.isfinite(value) or value < 0:
        raise PipeschedError(f"{where}={shorten(text)}: must be a finite number >= 0 ({WORDS[spec.quantity]})")
    return check_value(spec, value, where)
