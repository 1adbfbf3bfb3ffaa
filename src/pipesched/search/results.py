"""What a design-space search found: its rows ranked by throughput among the configurations
that fit in memory, the Pareto front of iteration time against peak memory, the counts of
points evaluated, out of memory, pruned and invalid with their reasons, and the JSON and
CSV forms.

The global batch is the same for every point, so ranking by throughput (tokens/s of all d
pipelines) is ranking by iteration time. Ties break by peak memory, then by the point's label
(``StoredRow.label``).
"""

from __future__ import annotations

import csv
import io
import math
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from pipesched.defaults import DEFAULTS
from pipesched.search.store import BOUNDED, EVALUATED, INVALID, OUT_OF_MEMORY, PRUNED, StoredRow
from pipesched.timeline import Timeline

# the StoredRow fields of ``--json`` rows, in order (CSV adds the rest of StoredRow)
JSON_COLUMNS = ("family", "dp", "tp", "p", "v", "micro_batch_size", "m", "recompute", "partition", "zero", "ep",
                "iteration_time_s", "throughput_tokens_per_s", "mfu", "hfu", "peak_memory_bytes", "fits")
# the names a search's rows give a point's fields in its JSON, CSV and tables (README
# "Design-space search"): the family as the schedule, the pipeline size beside dp and tp
ROW_NAMES = {"family": "schedule", "p": "pp"}
# ... and the JSON keys of fields whose own name means something else in the other
# commands' JSON (README "JSON output"): the worst device's peak
JSON_KEYS = {**ROW_NAMES, "peak_memory_bytes": "max_peak_memory_bytes"}


def ranked(rows: Sequence[StoredRow]) -> list[StoredRow]:
    """The evaluated rows fastest first (ties: less memory, then label), then the ones out of
    memory, least memory first."""
    fast = sorted((r for r in rows if r.status == EVALUATED),
                  key=lambda r: (r.iteration_time_s, r.peak_memory_bytes, r.label))
    over = sorted((r for r in rows if r.status == OUT_OF_MEMORY),
                  key=lambda r: (math.inf if r.peak_memory_bytes is None else r.peak_memory_bytes, r.label))
    return fast + over


def pareto_front(rows: Sequence[StoredRow]) -> list[StoredRow]:
    """The evaluated rows that no other beats in both iteration time and peak memory, by
    increasing memory (and so decreasing time).

    >>> a = StoredRow("a", "1f1b", None, 1, 1, 2, 1, 4, "none", "balanced", 0, 1, EVALUATED,
    ...               peak_memory_bytes=1.0, iteration_time_s=3.0)
    >>> b = StoredRow("b", "zb-v", None, 1, 1, 2, 1, 4, "none", "balanced", 0, 1, EVALUATED,
    ...               peak_memory_bytes=2.0, iteration_time_s=2.0)
    >>> c = StoredRow("c", "gpipe", None, 1, 1, 2, 1, 4, "none", "balanced", 0, 1, EVALUATED,
    ...               peak_memory_bytes=2.0, iteration_time_s=3.0)
    >>> [r.key for r in pareto_front([a, b, c])]
    ['a', 'b']
    """
    front: list[StoredRow] = []
    best = math.inf
    for row in sorted((r for r in rows if r.status == EVALUATED),
                      key=lambda r: (r.peak_memory_bytes, r.iteration_time_s, r.label)):
        if row.iteration_time_s < best:
            front.append(row)
            best = row.iteration_time_s
    return front


def json_row(row: StoredRow) -> dict:
    """A row as ``--json`` prints it."""
    values = asdict(row)
    values["fits"] = row.status == EVALUATED
    return {JSON_KEYS.get(name, name): values[name] for name in JSON_COLUMNS}


@dataclass(frozen=True)
class SearchResult:
    """A finished search (or what a store holds of one)."""

    space: dict  # the SearchSpace as plain data
    rows: tuple[StoredRow, ...]  # every point of the space
    seconds: float = 0.0  # wall time of this run
    db: str = ""  # the store's path
    runs: int = 1  # starts of this search, this one included
    # the timelines of the front's points simulated in this run when asked for, by key (none
    # read from a store)
    timelines: Mapping[str, Timeline] = field(default_factory=dict, compare=False, repr=False)
    ranked: tuple[StoredRow, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranked", tuple(ranked(self.rows)))

    @property
    def best(self) -> StoredRow | None:
        """The fastest configuration that fits in memory."""
        return self.ranked[0] if self.ranked and self.ranked[0].status == EVALUATED else None

    @property
    def front(self) -> list[StoredRow]:
        return pareto_front(self.rows)

    def count(self, status: str) -> int:
        return sum(1 for r in self.rows if r.status == status)

    @property
    def complete(self) -> bool:
        return self.count(BOUNDED) == 0

    def why(self, status: str) -> tuple[Counter[str], StoredRow | None]:
        """How many rows of ``status`` each schedule family has (for invalid rows: family
        and the field the error names), and one row of the most common kind."""
        kinds: Counter[str] = Counter()
        first: dict[str, StoredRow] = {}
        for row in sorted((r for r in self.rows if r.status == status), key=lambda r: r.label):
            kind = row.family
            if status == INVALID and "=" in row.reason.split(":", 1)[0]:
                kind += f" ({row.reason.split('=', 1)[0]})"
            kinds[kind] += 1
            first.setdefault(kind, row)
        return kinds, (first[kinds.most_common(1)[0][0]] if kinds else None)

    def to_dict(self, *, top: int | None = None) -> dict:
        """``--json``: ``best``, ``rows`` (the ``top`` first of the ranking; None: all),
        the counts, ``seconds`` and the Pareto front."""
        shown = self.ranked if top is None else self.ranked[:top]
        return {
            "best": json_row(self.best) if self.best is not None else None,
            "rows": [json_row(r) for r in shown],
            "points": len(self.rows),
            "evaluated_points": self.count(EVALUATED),
            "out_of_memory_points": self.count(OUT_OF_MEMORY),
            "pruned_points": self.count(PRUNED),
            "invalid_points": self.count(INVALID),
            "unfinished_points": self.count(BOUNDED),
            "seconds": self.seconds,
            "pareto_front": [json_row(r) for r in self.front],
            "space": self.space,
            "db": self.db,
        }

    def to_csv(self) -> str:
        """Every row, ranked ones first, all columns."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        columns = [name for name in asdict(self.rows[0])] if self.rows else list(JSON_COLUMNS)
        writer.writerow([*(ROW_NAMES.get(name, name) for name in columns), "fits"])
        order = list(self.ranked) + sorted((r for r in self.rows if r.status not in (EVALUATED, OUT_OF_MEMORY)),
                                           key=lambda r: (r.status, r.label))
        for row in order:
            values = asdict(row)
            writer.writerow([("" if values[c] is None else values[c]) for c in columns] + [row.status == EVALUATED])
        return out.getvalue()


def simulate_command(space: dict, row: StoredRow) -> str:
    """The ``pipesched simulate`` command line that runs ``row``'s configuration."""
    chunks = f" -v {row.v}" if row.v is not None else ""
    return (f"pipesched simulate {row.family} -p {row.p} -m {row.m}{chunks} --model {shlex.quote(space['model'])} "
            f"--cluster {shlex.quote(space['cluster'])} -t {row.tp} --dp {row.dp} --zero {row.zero} -b {row.micro_batch_size} "
            f"-s {space['seq_len']} --recompute {row.recompute} --partition {row.partition}{_training(space)}"
            f"{f' --ep {row.ep}' if row.ep > 1 else ''}")


def _training(space: dict) -> str:
    """The dtype and sequence-parallel flags of a search that did not take the defaults."""
    dtype = space.get("dtype", DEFAULTS.dtype)
    sequence_parallel = space.get("sequence_parallel", DEFAULTS.sequence_parallel)
    return ((f" --dtype {dtype}" if dtype != DEFAULTS.dtype else "")
            + ("" if sequence_parallel == DEFAULTS.sequence_parallel else
               " --sequence-parallel" if sequence_parallel else " --no-sequence-parallel"))
