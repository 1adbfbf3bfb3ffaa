"""Published GEMM rates by shape: a kernel library's own benchmark tables, as data
(``pipesched/data/kernels/NAME.csv``, each headed by its source), and the efficiency they
give a matmul of any shape.

A table row is one measured GEMM: its table (``normal``, ``contiguous`` and ``masked`` for
the forward and input-gradient kernels, dense and grouped; ``wgrad`` and ``grouped_wgrad``
for the weight-gradient kernels), its groups, ``m x n x k`` per group and its TFLOP/s. A
matmul reads the rows of its kind (forward or weight gradient, one group or several); the
curve whose other two sizes are nearest its own (log scale) gives its rate along its token
axis, linear in log tokens between the tabled points and held at the ends (of rows at the
same sizes, the one of the nearest group count)::

    efficiency = rate(m, n, k) / peak

The token axis is ``m`` (the rows) for a forward or input-gradient GEMM, ``k`` (the rows
reduced over) for a weight gradient. The rates include everything the library's kernel
pays at that shape (tile and wave quantization, the fine-grained scaling), so a tabled
shape costs exactly its table's time.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from pipesched.errors import PipeschedError, require, shorten

# the tables of each kind of GEMM: (weight gradient, grouped) -> table names
FORWARD_TABLES = ("normal",)
GROUPED_FORWARD_TABLES = ("contiguous", "masked")
WEIGHT_GRADIENT_TABLES = ("wgrad",)
GROUPED_WEIGHT_GRADIENT_TABLES = ("grouped_wgrad",)
TABLES = (*FORWARD_TABLES, *GROUPED_FORWARD_TABLES, *WEIGHT_GRADIENT_TABLES, *GROUPED_WEIGHT_GRADIENT_TABLES)
COLUMNS = ("table", "groups", "m", "n", "k", "tflops")


@dataclass(frozen=True)
class GemmRate:
    """One measured GEMM of a kernel table: ``groups`` GEMMs ``[m, k] x [k, n]``."""

    table: str  # one of TABLES
    groups: int
    m: int  # rows per group
    n: int
    k: int
    tflops: float  # achieved TFLOP/s


@functools.cache
def kernel_tables() -> tuple[str, ...]:
    """Names of the built-in kernel tables."""
    folder = resources.files("pipesched") / "data" / "kernels"
    return tuple(sorted(entry.name.removesuffix(".csv") for entry in folder.iterdir() if entry.name.endswith(".csv")))


@functools.cache
def load_gemm_table(name: str) -> tuple[GemmRate, ...]:
    """A built-in kernel table's rows by name.

    >>> rows = load_gemm_table("deepgemm_h800")
    >>> rows[0].table, rows[0].m, rows[0].tflops
    ('normal', 64, 206.0)
    """
    require(name in kernel_tables(), "fp8_gemm_table", shorten(name),
            f"give a built-in kernel table: {', '.join(kernel_tables())}")
    text = (resources.files("pipesched") / "data" / "kernels" / f"{name}.csv").read_text(encoding="utf-8")
    return parse_gemm_table(text, source=name)


def parse_gemm_table(text: str, *, source: str) -> tuple[GemmRate, ...]:
    """The rows of a kernel table's CSV text (``#`` lines are its header comment)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    require(tuple(reader.fieldnames or ()) == COLUMNS, f"{source}.columns", ",".join(reader.fieldnames or ()),
            f"give the columns {','.join(COLUMNS)}")
    rows = tuple(_row(entry, f"{source} row {number}") for number, entry in enumerate(reader, start=1))
    require(bool(rows), source, "no rows", "give at least one measured GEMM")
    return rows


def _row(entry: dict[str, str], where: str) -> GemmRate:
    require(entry["table"] in TABLES, f"{where}.table", shorten(entry["table"]), f"must be one of {', '.join(TABLES)}")
    sizes = {}
    for column in ("groups", "m", "n", "k"):
        try:
            sizes[column] = int(entry[column])
        except (TypeError, ValueError):
            raise PipeschedError(f"{where}.{column}={shorten(entry[column])}: give a whole number >= 1") from None
        require(sizes[column] >= 1, f"{where}.{column}", sizes[column], "give a whole number >= 1")
    try:
        tflops = float(entry["tflops"])
    except (TypeError, ValueError):
        raise PipeschedError(f"{where}.tflops={shorten(entry['tflops'])}: give a number of TFLOP/s > 0") from None
    require(math.isfinite(tflops) and tflops > 0, f"{where}.tflops", tflops, "give a number of TFLOP/s > 0")
    return GemmRate(entry["table"], tflops=tflops, **sizes)


def tables_of(*, grouped: bool, weight_gradient: bool) -> tuple[str, ...]:
    """The tables that measure one kind of GEMM."""
    if weight_gradient:
        return GROUPED_WEIGHT_GRADIENT_TABLES if grouped else WEIGHT_GRADIENT_TABLES
    return GROUPED_FORWARD_TABLES if grouped else FORWARD_TABLES


def _axes(row: GemmRate, weight_gradient: bool) -> tuple[int, tuple[int, int]]:
    """A row's token axis and its other two sizes (module docstring)."""
    return (row.k, (row.m, row.n)) if weight_gradient else (row.m, (row.n, row.k))


def gemm_rate(name: str, *, groups: float, m, n: float, k: float, weight_gradient: bool = False):
    """TFLOP/s of ``groups`` GEMMs ``[m, k] x [k, n]`` by the table ``name`` (module
    docstring); ``m`` may be an array (one rate per row count).

    >>> gemm_rate("deepgemm_h800", groups=1, m=4096, n=7168, k=2048)
    1025.0
    """
    others = (m, n) if weight_gradient else (n, k)
    tokens, rates = _curve(name, float(groups), tuple(float(x) for x in others), weight_gradient)
    axis = k if weight_gradient else m
    rate = np.interp(np.log2(np.maximum(axis, 1.0)), tokens, rates)
    return rate if isinstance(axis, np.ndarray) else float(rate)


@functools.lru_cache(maxsize=4096)
def _curve(name: str, groups: float, others: tuple[float, float],
           weight_gradient: bool) -> tuple[np.ndarray, tuple[float, ...]]:
    """The tabled curve a GEMM of ``groups`` and ``others`` reads (module docstring): log2 of
    its token counts and their TFLOP/s, found once per shape (every layer of a sweep asks)."""
    kinds = tables_of(grouped=groups > 1, weight_gradient=weight_gradient)
    rows = [row for row in load_gemm_table(name) if row.table in kinds]
    require(bool(rows), "fp8_gemm_table", name, f"give the table rows of {' or '.join(kinds)} GEMMs")

    def distance(row: GemmRate) -> float:
        _, row_others = _axes(row, weight_gradient)
        return sum(math.log2(a / b) ** 2 for a, b in zip(row_others, others, strict=True))

    nearest = min(distance(row) for row in rows)
    # one point per token count: of rows measured at the same sizes, the nearest group count's
    points: dict[int, GemmRate] = {}
    for row in rows:
        if distance(row) == nearest:
            tokens_of_row = _axes(row, weight_gradient)[0]
            held = points.get(tokens_of_row)
            if held is None or abs(math.log2(row.groups / groups)) < abs(math.log2(held.groups / groups)):
                points[tokens_of_row] = row
    curve = sorted(points.items())
    return np.log2([point for point, _ in curve]), tuple(row.tflops for _, row in curve)


def gemm_efficiency(name: str, peak_flops: float, *, groups: float, m, n: float, k: float,
                    weight_gradient: bool = False):
    """Fraction of ``peak_flops`` a GEMM reaches by the table ``name``: its ``gemm_rate``
    over the peak, at most 1."""
    rate = gemm_rate(name, groups=groups, m=m, n=n, k=k, weight_gradient=weight_gradient) * 1e12 / peak_flops
    return np.minimum(rate, 1.0) if isinstance(rate, np.ndarray) else min(rate, 1.0)
