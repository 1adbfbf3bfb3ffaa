"""A serving workload: requests, each arriving at a time with a prompt and an output length.

``Trace`` is the one record of it (columnar, one row per request, sorted by arrival). The
file format is the public Splitwise and Vidur traces' CSV, ``arrived_at,num_prefill_tokens,
num_decode_tokens``: arrival in seconds from the start, prompt tokens, output tokens (the
first output token is the prefill's; each later one is one decode iteration).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import numpy as np

from pipesched.defaults import DEFAULTS
from pipesched.errors import PipeschedError, require, shorten
from pipesched.io.files import read_text, write_atomic
from pipesched.limits import (
    MAX_NUMBER_CHARS,
    MAX_QPS,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    MAX_SERVED_TOKENS,
    check_amount,
    check_count,
    parse_float,
    parse_int,
)


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests in arrival order; arrays of equal length, one row each."""

    arrived_at: np.ndarray  # float64 seconds, >= 0, non-decreasing
    prefill_tokens: np.ndarray  # int64 >= 1: prompt tokens
    decode_tokens: np.ndarray  # int64 >= 1: output tokens, the first (made by the prefill) included

    def __post_init__(self) -> None:
        arrived = np.ascontiguousarray(self.arrived_at, np.float64)
        prefill = np.ascontiguousarray(self.prefill_tokens, np.int64)
        decode = np.ascontiguousarray(self.decode_tokens, np.int64)
        require(arrived.ndim == 1 and arrived.shape == prefill.shape == decode.shape, "trace",
                f"{arrived.shape}, {prefill.shape}, {decode.shape}", "give one arrival and two lengths per request")
        check_count("requests", int(arrived.shape[0]), MAX_REQUESTS, what="requests")
        bad = np.flatnonzero(~np.isfinite(arrived) | (arrived < 0) | (arrived > MAX_SECONDS))
        require(bad.size == 0, "arrived_at", arrived[bad[0]] if bad.size else "",
                f"arrivals are seconds from the start, 0 to {MAX_SECONDS:g} (request {bad[0] if bad.size else 0})")
        unsorted = np.flatnonzero(np.diff(arrived) < 0)
        require(unsorted.size == 0, "arrived_at", arrived[unsorted[0] + 1] if unsorted.size else "",
                f"sort the requests by arrival (request {unsorted[0] + 1 if unsorted.size else 0} arrives "
                "before the one above it)")
        for name, column in (("num_prefill_tokens", prefill), ("num_decode_tokens", decode)):
            bad = np.flatnonzero((column < 1) | (column > MAX_SEQ_LEN))
            require(bad.size == 0, name, column[bad[0]] if bad.size else "",
                    f"token counts are whole numbers from 1 to {MAX_SEQ_LEN:,} (request {bad[0] if bad.size else 0})")
        object.__setattr__(self, "arrived_at", arrived)
        object.__setattr__(self, "prefill_tokens", prefill)
        object.__setattr__(self, "decode_tokens", decode)

    def __len__(self) -> int:
        return int(self.arrived_at.shape[0])

    @property
    def total_tokens(self) -> np.ndarray:
        """Prompt plus output tokens of each request: its KV cache when it ends."""
        return self.prefill_tokens + self.decode_tokens


# --- the CSV file -----------------------------------------------------------------------------
ARRIVED = "arrived_at"
PREFILL = "num_prefill_tokens"
DECODE = "num_decode_tokens"
COLUMNS = (ARRIVED, PREFILL, DECODE)


def parse_trace(text: str, *, source: str = "<text>") -> Trace:
    """A trace from CSV text: a header naming at least ``arrived_at,num_prefill_tokens,
    num_decode_tokens`` (in any order; other columns, such as a Splitwise trace's, are
    ignored), then one row per request. Each problem raises a PipeschedError naming the
    line, the column and the fix."""
    rows = _rows(text, source)
    require(bool(rows), "trace", source, f"empty file; write the header {','.join(COLUMNS)} and one row per request")
    header_line, header = rows[0]
    where = _header(header, source, header_line)
    require(len(rows) > 1, "trace", source, "no requests after the header; give one row per request")
    lines = np.array([number for number, _ in rows[1:]], np.int64)
    cells = {name: _column(rows[1:], where[name], name, source) for name in COLUMNS}
    arrived = _numbers(cells[ARRIVED], lines, ARRIVED, source)
    _check_arrivals(arrived, lines, source)
    prefill = _whole(_numbers(cells[PREFILL], lines, PREFILL, source), lines, PREFILL, source)
    decode = _whole(_numbers(cells[DECODE], lines, DECODE, source), lines, DECODE, source)
    _check_served(decode, f"trace={source}")
    return Trace(arrived, prefill, decode)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file (``parse_trace``), at most MAX_INPUT_BYTES."""
    return parse_trace(read_text(path, "trace"), source=str(path))


def dumps_trace(trace: Trace) -> str:
    """The CSV text of ``trace``; arrivals written exactly (``repr``), so it reads back equal."""
    out = io.StringIO()
    out.write(",".join(COLUMNS) + "\n")
    for arrived, prefill, decode in zip(trace.arrived_at.tolist(), trace.prefill_tokens.tolist(),
                                        trace.decode_tokens.tolist(), strict=True):
        out.write(f"{arrived!r},{prefill},{decode}\n")
    return out.getvalue()


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` as CSV, whole or not at all."""
    write_atomic(path, dumps_trace(trace), "trace")


def example_trace_path() -> Traversable:
    """The shipped example trace (``data/traces/example.csv``, made by
    ``benchmarks/make_example_trace.py``)."""
    return resources.files("pipesched") / "data" / "traces" / "example.csv"


def _rows(text: str, source: str) -> list[tuple[int, list[str]]]:
    """The non-blank rows with their line numbers: a header and at most MAX_REQUESTS rows."""
    rows: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text), strict=True)
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                if len(rows) > MAX_REQUESTS:
                    raise PipeschedError(f"{source}:{reader.line_num}: more than {MAX_REQUESTS:,} requests, over the limit of "
                                         "one trace; give a shorter trace")
                rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise PipeschedError(f"{source}:{reader.line_num}: not a CSV row ({shorten(str(exc))}); "
                             "write one comma-separated row per request") from None
    return rows


def _header(header: list[str], source: str, line: int) -> dict[str, int]:
    """Where each needed column is in the header."""
    names = [cell.strip() for cell in header]
    for name in COLUMNS:
        require(name in names, f"{source}:{line}: column", name,
                f"missing from the header; the header names {','.join(COLUMNS)} (other columns are ignored)")
        require(names.count(name) == 1, f"{source}:{line}: column", name, "appears twice in the header; keep one")
    return {name: names.index(name) for name in COLUMNS}


def _column(rows: list[tuple[int, list[str]]], index: int, name: str, source: str) -> list[str]:
    """One column's cells, stripped; a row too short to have it is an error."""
    cells = []
    for number, row in rows:
        if index >= len(row):
            raise PipeschedError(f"{source}:{number}: {name}: missing; the row has {len(row)} fields, the header "
                                 f"more; give one value per column")
        cells.append(row[index].strip())
    return cells


def _numbers(cells: list[str], lines: np.ndarray, name: str, source: str) -> np.ndarray:
    """A column of numbers as float64; the first cell that is none names its line."""
    if max(map(len, cells)) <= MAX_NUMBER_CHARS:
        try:
            return np.array(cells, dtype=np.float64)
        except ValueError:
            pass
    for k, cell in enumerate(cells):
        where = f"{source}:{lines[k]}: {name}"
        parse_float(where, cell)
    raise PipeschedError(f"{source}: {name}: not a column of numbers; give one number per row")


def _whole(values: np.ndarray, lines: np.ndarray, name: str, source: str) -> np.ndarray:
    """Token counts: whole numbers from 1 to MAX_SEQ_LEN (12.0 reads as 12)."""
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.floor(values)) | (values < 1) | (values > MAX_SEQ_LEN))
    if bad.size:
        raise PipeschedError(f"{source}:{lines[bad[0]]}: {name}={values[bad[0]]:g}: token counts are whole numbers "
                             f"from 1 to {MAX_SEQ_LEN:,}")
    return values.astype(np.int64)


def _check_arrivals(arrived: np.ndarray, lines: np.ndarray, source: str) -> None:
    """Arrivals are seconds from the start, 0 to MAX_SECONDS, in order."""
    bad = np.flatnonzero(~np.isfinite(arrived) | (arrived < 0) | (arrived > MAX_SECONDS))
    if bad.size:
        raise PipeschedError(f"{source}:{lines[bad[0]]}: {ARRIVED}={arrived[bad[0]]:g}: arrivals are seconds from "
                             f"the start, 0 to {MAX_SECONDS:g}")
    early = np.flatnonzero(np.diff(arrived) < 0)
    if early.size:
        k = early[0] + 1
        raise PipeschedError(f"{source}:{lines[k]}: {ARRIVED}={arrived[k]:g}: before the arrival above it "
                             f"({arrived[k - 1]:g}); sort the rows by arrival")


def _check_served(decode: np.ndarray, field: str) -> None:
    """All requests' output tokens together within MAX_SERVED_TOKENS (a run keeps a time for each)."""
    total = int(decode.sum())
    if total > MAX_SERVED_TOKENS:
        raise PipeschedError(f"{field}: {total:,} output tokens in all, over the limit of {MAX_SERVED_TOKENS:,} of one "
                             "trace; give fewer requests or shorter outputs")


def check_context(trace: Trace, max_context: int) -> None:
    """Every request's prompt plus output within the model's context (``max_context``
    tokens; 0: no limit known)."""
    if max_context <= 0:
        return
    over = np.flatnonzero(trace.total_tokens > max_context)
    if over.size:
        k = int(over[0])
        raise PipeschedError(
            f"{PREFILL}={trace.prefill_tokens[k]}: request {k} needs {trace.prefill_tokens[k]:,} prompt + "
            f"{trace.decode_tokens[k]:,} output tokens, over the model's context of {max_context:,} "
            f"({over.size:,} of {len(trace):,} requests are over it); shorten them, or serve a model with a longer "
            "context")


# --- rates: common random numbers -------------------------------------------------------------
def mean_rate(trace: Trace) -> float:
    """Requests per second of ``trace``: its arrivals over their span (1 for one request, or
    for requests all arriving at once)."""
    span = float(trace.arrived_at[-1] - trace.arrived_at[0])
    return (len(trace) - 1) / span if len(trace) > 1 and span > 0 else 1.0


def rate_scaled(trace: Trace, qps: float) -> Trace:
    """``trace`` with its arrivals divided by ``qps``: a unit-rate trace at ``qps`` requests
    per second, the same requests in the same order (common random numbers)."""
    rate = check_amount("qps", qps, limit=MAX_QPS, above_minimum=True, unit="requests/s")
    return Trace(trace.arrived_at / rate, trace.prefill_tokens, trace.decode_tokens)


def at_unit_rate(trace: Trace) -> Trace:
    """``trace`` at one request per second (``mean_rate``), for ``rate_scaled``."""
    return Trace(trace.arrived_at * mean_rate(trace), trace.prefill_tokens, trace.decode_tokens)


# --- synthetic traces -------------------------------------------------------------------------
MAX_CV = 100.0  # coefficient of variation of a gamma arrival process (Poisson's is 1)
MAX_SIGMA = 10.0  # log-space spread of a lognormal length
MAX_ZIPF_S = 100.0  # exponent of a Zipf length
MAX_SEED = 2**63 - 1  # seeds of the random streams, as the Monte Carlo takes them
_LENGTH_FORMS = "fixed:N, uniform:LO-HI, lognormal:MEDIAN,SIGMA, zipf:S,MAX or trace:FILE"
_COLUMN_OF = {"prompt_tokens": PREFILL, "output_tokens": DECODE}  # a length spec's option -> trace column


@dataclass(frozen=True)
class Arrival:
    """Gaps between arrivals, one request per second on average: Poisson (exponential gaps,
    ``cv`` 1) or gamma of coefficient of variation ``cv`` (0: evenly spaced; above 1:
    bursts)."""

    cv: float = 1.0
    poisson: bool = True

    def __str__(self) -> str:
        return "poisson" if self.poisson else f"gamma:{self.cv:g}"

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` gaps of mean 1 second."""
        if self.poisson:
            return rng.exponential(1.0, n)
        if self.cv == 0:
            return np.ones(n)
        shape = 1.0 / self.cv**2  # a gamma of shape k and scale 1/k: mean 1, CV 1/sqrt(k)
        return rng.gamma(shape, 1.0 / shape, n)


def parse_arrival(text: str) -> Arrival:
    """``poisson`` or ``gamma:CV``.

    >>> str(parse_arrival("gamma:2"))
    'gamma:2'
    """
    kind, _, value = text.strip().partition(":")
    if kind == "poisson" and not value:
        return Arrival()
    require(kind == "gamma" and bool(value), "arrival", text, "give poisson or gamma:CV (CV the gaps' coefficient "
            "of variation, e.g. gamma:2)")
    cv = check_amount("arrival", parse_float("arrival", value), limit=MAX_CV, unit="(the CV)")
    return Arrival(cv, poisson=False)


@dataclass(frozen=True)
class FixedLengths:
    """Every request ``tokens`` long."""

    tokens: int

    def __str__(self) -> str:
        return f"fixed:{self.tokens}"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, np.int64)


@dataclass(frozen=True)
class UniformLengths:
    """Whole numbers from ``low`` to ``high``, both included, equally likely."""

    low: int
    high: int

    def __str__(self) -> str:
        return f"uniform:{self.low}-{self.high}"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, n, dtype=np.int64)


@dataclass(frozen=True)
class LognormalLengths:
    """exp(N(ln median, sigma^2)) rounded, at least 1 (the heavy tail of real prompts)."""

    median: float
    sigma: float

    def __str__(self) -> str:
        return f"lognormal:{self.median:g},{self.sigma:g}"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = np.rint(rng.lognormal(math.log(self.median), self.sigma, n))
        return np.clip(values, 1, MAX_SEQ_LEN).astype(np.int64)


@dataclass(frozen=True)
class ZipfLengths:
    """k in 1..``maximum`` with probability proportional to k^-s (a bounded Zipf law)."""

    s: float
    maximum: int

    def __str__(self) -> str:
        return f"zipf:{self.s:g},{self.maximum}"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        cdf = np.cumsum(np.arange(1, self.maximum + 1, dtype=np.float64) ** -self.s)
        picks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right") + 1
        return np.minimum(picks, self.maximum).astype(np.int64)


@dataclass(frozen=True, eq=False)
class ResampledLengths:
    """Lengths drawn with replacement from one column of a trace file."""

    path: str
    column: str  # num_prefill_tokens or num_decode_tokens
    values: np.ndarray  # int64: the column's lengths

    def __str__(self) -> str:
        return f"trace:{self.path}"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.shape[0], n)]


LengthSpec = FixedLengths | UniformLengths | LognormalLengths | ZipfLengths | ResampledLengths


def parse_lengths(text: str, field: str = "prompt_tokens") -> LengthSpec:
    """A length distribution from its text form (``field`` is the option it comes from,
    ``prompt_tokens`` or ``output_tokens``: ``trace:FILE`` resamples that column).

    >>> str(parse_lengths("lognormal:1024,0.8"))
    'lognormal:1024,0.8'
    >>> parse_lengths("uniform:16-64").high
    64
    """
    require(field in _COLUMN_OF, "field", field, f"give one of {', '.join(_COLUMN_OF)}")
    kind, _, value = text.strip().partition(":")
    require(bool(value), field, text, f"give {_LENGTH_FORMS}")
    if kind == "fixed":
        return FixedLengths(parse_int(field, value, MAX_SEQ_LEN, minimum=1, what="tokens"))
    if kind == "uniform":
        low, high = _two(field, text, value, "-")
        low_n = parse_int(field, low, MAX_SEQ_LEN, minimum=1, what="tokens")
        high_n = parse_int(field, high, MAX_SEQ_LEN, minimum=1, what="tokens")
        require(low_n <= high_n, field, text, "give uniform:LO-HI with LO <= HI")
        return UniformLengths(low_n, high_n)
    if kind == "lognormal":
        median, sigma = _two(field, text, value, ",")
        return LognormalLengths(check_amount(field, parse_float(field, median), limit=MAX_SEQ_LEN, above_minimum=True,
                                             unit="tokens (the median)"),
                                check_amount(field, parse_float(field, sigma), limit=MAX_SIGMA, unit="(sigma)"))
    if kind == "zipf":
        s, maximum = _two(field, text, value, ",")
        return ZipfLengths(check_amount(field, parse_float(field, s), limit=MAX_ZIPF_S, above_minimum=True,
                                        unit="(the exponent)"),
                           parse_int(field, maximum, MAX_SEQ_LEN, minimum=1, what="tokens"))
    require(kind == "trace", field, text, f"give {_LENGTH_FORMS}")
    column = _COLUMN_OF[field]
    source = read_trace(value)
    return ResampledLengths(value, column, source.prefill_tokens if column == PREFILL else source.decode_tokens)


def _two(field: str, text: str, value: str, separator: str) -> tuple[str, str]:
    first, found, second = value.partition(separator)
    require(bool(found and first.strip() and second.strip()), field, text, f"give {_LENGTH_FORMS}")
    return first, second


@dataclass(frozen=True, eq=False)
class TraceSpec:
    """A synthetic trace: ``requests`` arrivals at ``qps`` requests per second, prompt and
    output lengths drawn from their distributions, all from ``seed``. ``arrival``,
    ``prompt`` and ``output`` take the records or their text forms (``parse_arrival``,
    ``parse_lengths``: ``TraceSpec(prompt="uniform:16-64")``).

    Common random numbers: the gaps are drawn at one request per second and divided by
    ``qps``, and the lengths come from streams of their own, so two specs that differ only in
    ``qps`` give the same requests, sooner or later (``unit_trace``). With ``max_context``
    (tokens; 0: none) each request is cut to fit it: its output to at most ``max_context -
    1``, then its prompt to the rest.
    """

    requests: int = DEFAULTS.requests
    qps: float = DEFAULTS.qps  # requests per second
    arrival: Arrival = dataclasses.field(default_factory=lambda: parse_arrival(DEFAULTS.arrival))
    prompt: LengthSpec = dataclasses.field(default_factory=lambda: parse_lengths(DEFAULTS.prompt_tokens, "prompt_tokens"))
    output: LengthSpec = dataclasses.field(default_factory=lambda: parse_lengths(DEFAULTS.output_tokens, "output_tokens"))
    seed: int = DEFAULTS.seed
    max_context: int = 0  # tokens of prompt + output a request may have; 0: no limit

    def __post_init__(self) -> None:
        check_count("requests", self.requests, MAX_REQUESTS, what="requests")
        check_amount("qps", self.qps, limit=MAX_QPS, above_minimum=True, unit="requests/s")
        check_count("seed", self.seed, MAX_SEED, minimum=0)
        check_count("max_context", self.max_context, MAX_SEQ_LEN, minimum=0, what="tokens")
        require(self.max_context != 1, "max_context", 1, "give at least 2 tokens (a prompt token and an output "
                "token), or 0 for no limit")
        if isinstance(self.arrival, str):
            object.__setattr__(self, "arrival", parse_arrival(self.arrival))
        for name, option in (("prompt", "prompt_tokens"), ("output", "output_tokens")):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, parse_lengths(getattr(self, name), option))


def unit_trace(spec: TraceSpec) -> Trace:
    """``spec``'s requests at one request per second, the first at 0 (``rate_scaled`` moves
    them to any rate). Prompt and output lengths resampled from the same file are drawn as
    pairs (one row each), keeping the file's correlation of the two."""
    arrival_seed, prompt_seed, output_seed = np.random.SeedSequence(spec.seed).spawn(3)
    prompt, output = spec.prompt, spec.output
    if isinstance(prompt, ResampledLengths) and isinstance(output, ResampledLengths) and prompt.path == output.path:
        output_seed = prompt_seed  # the same row indices for both columns
    n = spec.requests
    gaps = spec.arrival.gaps(np.random.default_rng(arrival_seed), n - 1)
    arrived = np.concatenate([[0.0], np.cumsum(gaps)])
    prefill = prompt.draw(np.random.default_rng(prompt_seed), n)
    decode = output.draw(np.random.default_rng(output_seed), n)
    if spec.max_context:
        decode = np.minimum(decode, spec.max_context - 1)
        prefill = np.minimum(prefill, spec.max_context - decode)
    _check_served(decode, f"output_tokens={spec.output}")
    return Trace(arrived, prefill, decode)


def synthetic_trace(spec: TraceSpec) -> Trace:
    """``spec``'s trace at its rate."""
    return rate_scaled(unit_trace(spec), spec.qps)
