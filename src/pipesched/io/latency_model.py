"""Fitted latency-model files (``--latency-model FILE``): a stage's iteration time as
DistServe fits it from measurements, one CSV row per pipeline stage::

    stage,base_s,prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s
    0,0.0021,1.9e-05,3.1e-10,6.0e-05,1.2e-08

An iteration of stage s takes ``base_s + prefill_token_s x prefill tokens +
prefill_attention_s x sum over chunks of chunk x (context + chunk) + decode_request_s x
decode requests + kv_token_s x KV tokens the decodes read`` (seconds; the columns in any
order, every stage 0..S-1 once, rows in any order). ``pipesched.model.inference`` turns the
rows into stage iteration costs and fits them from measured iterations.

>>> rows = parse_latency_model("stage,base_s,prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s\\n"
...                            "0,0.002,2e-5,3e-10,6e-5,1e-8\\n")
>>> rows[0].prefill_token_s, parse_latency_model(dumps_latency_model(rows)) == rows
(2e-05, True)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

from pipesched.errors import PipeschedError, shorten
from pipesched.io.files import read_text, write_atomic
from pipesched.io.stage_costs import stage_rows
from pipesched.limits import MAX_SECONDS, MAX_STAGES, check_count, parse_float, parse_int


@dataclass(frozen=True)
class LatencyRow:
    """One stage's fitted latency model (``--latency-model FILE``, CSV ``stage,base_s,
    prefill_token_s,prefill_attention_s,decode_request_s,kv_token_s``; DistServe's form): an
    iteration takes ``base_s + prefill_token_s x prefill tokens + prefill_attention_s x sum
    of chunk x (context + chunk) + decode_request_s x decode requests + kv_token_s x KV
    tokens the decodes read`` on that stage."""

    stage: int
    base_s: float
    prefill_token_s: float
    prefill_attention_s: float
    decode_request_s: float
    kv_token_s: float

    def __post_init__(self) -> None:
        check_count("stage", self.stage, MAX_STAGES - 1, minimum=0, what="stage index")
        for name in COLUMNS[1:]:
            object.__setattr__(self, name, _seconds(f"stage {self.stage}: {name}", getattr(self, name)))


def _seconds(field: str, value: object) -> float:
    """A coefficient of the fitted form: finite seconds (per unit) from 0 to MAX_SECONDS."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise PipeschedError(f"{field}={shorten(value)}: must be finite seconds from 0 to {MAX_SECONDS:g}")
    return float(value)


COLUMNS = tuple(field.name for field in fields(LatencyRow))


def parse_latency_model(text: str, *, source: str = "<text>", num_stages: int | None = None) -> tuple[LatencyRow, ...]:
    """The rows of a latency-model CSV, by stage; ``num_stages`` (when known) is the number
    of stages the file must cover. A problem raises PipeschedError naming the line, the
    column and the value."""
    lines = stage_rows(text, source)
    if not lines:
        raise PipeschedError(f"latency_model={source}: empty file; write the header {','.join(COLUMNS)} and "
                             "one row per stage")
    header_line, header = lines[0]
    columns = [cell.strip() for cell in header]
    if sorted(columns) != sorted(COLUMNS):
        raise PipeschedError(f"{source}:{header_line}: header={shorten(','.join(columns))}: give the columns "
                             f"{','.join(COLUMNS)}")
    rows: dict[int, LatencyRow] = {}
    for number, cells in lines[1:]:
        if len(cells) != len(columns):
            raise PipeschedError(f"{source}:{number}: row has {len(cells)} fields, the header {len(columns)}; "
                                 "give one value per column")
        row = _row(dict(zip(columns, (cell.strip() for cell in cells), strict=True)), source, number)
        if row.stage in rows:
            raise PipeschedError(f"{source}:{number}: stage={row.stage}: appears twice; give one row per stage")
        rows[row.stage] = row
    count = num_stages if num_stages is not None else len(rows)
    missing = [stage for stage in range(count) if stage not in rows]
    extra = sorted(stage for stage in rows if stage >= count)
    if missing or extra:
        which = f"stage={missing[0]}: missing" if missing else f"stage={extra[0]}: extra row"
        raise PipeschedError(f"latency_model={source}: {which}; give one row for each stage 0..{count - 1}")
    return tuple(rows[stage] for stage in range(count))


def _row(record: dict[str, str], source: str, line: int) -> LatencyRow:
    where = f"{source}:{line}"
    stage = parse_int(f"{where}: stage", record["stage"], MAX_STAGES - 1, minimum=0, what="stage index")
    values = {name: _seconds(f"{where}: {name}", parse_float(f"{where}: {name}", record[name]))
              for name in COLUMNS[1:]}
    return LatencyRow(stage=stage, **values)


def load_latency_model(path: str | os.PathLike[str], *, num_stages: int | None = None) -> tuple[LatencyRow, ...]:
    """The rows of the latency-model file at ``path`` (a bounded read)."""
    return parse_latency_model(read_text(path, "latency_model"), source=str(path), num_stages=num_stages)


def dumps_latency_model(rows: tuple[LatencyRow, ...] | list[LatencyRow]) -> str:
    """The CSV text of ``rows`` (every number as repr writes it: read back exactly)."""
    lines = [",".join(COLUMNS)]
    lines += [",".join(repr(getattr(row, name)) for name in COLUMNS) for row in sorted(rows, key=lambda r: r.stage)]
    return "\n".join(lines) + "\n"


def save_latency_model(rows: tuple[LatencyRow, ...] | list[LatencyRow], path: str | os.PathLike[str]) -> None:
    """Write ``rows`` to ``path`` atomically (all of it or nothing)."""
    write_atomic(path, dumps_latency_model(rows), "latency_model")
