"""The results store of ``pipesched search``: one SQLite file (embedded, no server), written as
results come, so that a search killed at any moment resumes where it stopped.

A file holds searches (one per space, keyed by the space as JSON) and their points, one row
per point once it is settled: ``bounded`` (its memory and time bound known, not yet
simulated), then ``evaluated``, ``out of memory``, ``pruned`` or ``invalid``. Every batch of
results is one transaction: a killed process loses at most the batch it was writing, whose
points are simply computed again; a settled row is never written twice (``run`` says which
start of the search wrote it).

A file that is not such a store (another program's database, a damaged file, any other
file) is refused and never written: the first bytes, the application id, the format table
and an integrity check are read before anything is.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from pipesched.errors import PipeschedError

# "PSch": PRAGMA application_id of a pipesched search store
APPLICATION_ID = 0x50536368
FORMAT = "pipesched-search"
VERSION = 2  # 2: mfu counts model FLOPs (no recompute), hfu beside it
SQLITE_HEADER = b"SQLite format 3\x00"

BOUNDED, EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID = "bounded", "evaluated", "out of memory", "pruned", "invalid"
SETTLED = (EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID)


@dataclass(frozen=True)
class StoredRow:
    """One point of a search and what became of it. Times in seconds, memory in bytes."""

    key: str  # ``space.point_key``
    schedule: str
    v: int | None  # chunks per device, for the families that take it
    dp: int
    tp: int
    pp: int
    micro_batch_size: int
    m: int
    recompute: str
    partition: str
    zero: int
    status: str  # bounded, evaluated, out of memory, pruned or invalid
    bound_s: float | None = None  # lower bound on the iteration time
    peak_memory_bytes: float | None = None  # worst device's peak (exact, before simulating)
    capacity_bytes: float | None = None  # that device's memory
    iteration_time_s: float | None = None  # evaluated: the simulated iteration
    throughput_tokens_per_s: float | None = None  # evaluated: all d pipelines
    mfu: float | None = None  # evaluated: model FLOPs utilization (no recompute)
    hfu: float | None = None  # evaluated: hardware FLOPs utilization (recompute included)
    reason: str = ""  # out of memory, pruned, invalid: why
    run: int = 0  # which start of the search wrote the row

    def settled(self, status: str, **values: object) -> StoredRow:
        from dataclasses import replace

        return replace(self, status=status, **values)


_COLUMNS = tuple(f.name for f in fields(StoredRow))
_SCHEMA = f"""
CREATE TABLE format (name TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE searches (id INTEGER PRIMARY KEY, space TEXT NOT NULL UNIQUE, runs INTEGER NOT NULL DEFAULT 0);
CREATE TABLE points (
    search INTEGER NOT NULL REFERENCES searches(id),
    key TEXT NOT NULL, schedule TEXT NOT NULL, v INTEGER, dp INTEGER NOT NULL, tp INTEGER NOT NULL,
    pp INTEGER NOT NULL, micro_batch_size INTEGER NOT NULL, m INTEGER NOT NULL, recompute TEXT NOT NULL,
    partition TEXT NOT NULL, zero INTEGER NOT NULL, status TEXT NOT NULL, bound_s REAL,
    peak_memory_bytes REAL, capacity_bytes REAL, iteration_time_s REAL, throughput_tokens_per_s REAL,
    mfu REAL, hfu REAL, reason TEXT NOT NULL, run INTEGER NOT NULL,
    PRIMARY KEY (search, key)
);
PRAGMA application_id = {APPLICATION_ID};
"""


class SearchStore:
    """An open results store (see the module docstring). Use ``SearchStore.open``."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True) -> SearchStore:
        """Open the store at ``path``, creating it when the file does not exist (or is empty)
        and ``create``; any other file is refused with a PipeschedError."""
        target = Path(path)
        _check_file(target, create=create)
        try:
            connection = sqlite3.connect(target, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise PipeschedError(f"db={target}: cannot open it ({exc}); give a writable file path") from None
        store = cls(target, connection)
        try:
            store._prepare()
        except sqlite3.Error as exc:
            connection.close()
            raise PipeschedError(f"db={target}: not a readable pipesched search store ({exc}); it was left as it "
                                 "is; give another --db") from None
        except PipeschedError:
            connection.close()
            raise
        return store

    def _prepare(self) -> None:
        db = self._db
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        application = db.execute("PRAGMA application_id").fetchone()[0]
        if not tables and application == 0:
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(f"BEGIN; {_SCHEMA} INSERT INTO format VALUES ('{FORMAT}', {VERSION}); COMMIT;")
        elif application != APPLICATION_ID or "format" not in tables:
            raise PipeschedError(f"db={self.path}: another program's SQLite database (application id {application}, "
                                 f"tables {', '.join(sorted(tables)) or 'none'}); it was left as it is; give a new "
                                 "file or a pipesched search store to --db")
        else:
            found = db.execute("SELECT name, version FROM format").fetchone()
            if found != (FORMAT, VERSION):
                raise PipeschedError(f"db={self.path}: a search store of format {found}, this pipesched reads "
                                     f"({FORMAT!r}, {VERSION}); it was left as it is; give another --db")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise PipeschedError(f"db={self.path}: the store is damaged ({check}); it was left as it is; give "
                                     "another --db")
        db.execute("PRAGMA synchronous = NORMAL")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SearchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- searches ----------------------------------------------------------------------
    def begin(self, space: dict) -> tuple[int, int]:
        """(search id, run number) of ``space``: a new search, or the next run of the one
        stored for the same space."""
        text = json.dumps(space, sort_keys=True)
        with self._transaction():
            self._db.execute("INSERT OR IGNORE INTO searches (space) VALUES (?)", (text,))
            self._db.execute("UPDATE searches SET runs = runs + 1 WHERE space = ?", (text,))
            search, runs = self._db.execute("SELECT id, runs FROM searches WHERE space = ?", (text,)).fetchone()
        return int(search), int(runs)

    def searches(self) -> list[tuple[int, dict]]:
        """(id, space) of every stored search, oldest first."""
        return [(int(i), json.loads(text)) for i, text in self._db.execute("SELECT id, space FROM searches ORDER BY id")]

    # --- points ------------------------------------------------------------------------
    def write(self, search: int, rows: Iterable[StoredRow]) -> None:
        """Store ``rows`` in one transaction (a bounded row is replaced when it settles)."""
        rows = list(rows)
        if not rows:
            return
        marks = ", ".join("?" * (len(_COLUMNS) + 1))
        with self._transaction():
            self._db.executemany(f"INSERT OR REPLACE INTO points (search, {', '.join(_COLUMNS)}) VALUES ({marks})",
                                 [(search, *(getattr(row, name) for name in _COLUMNS)) for row in rows])

    def rows(self, search: int) -> list[StoredRow]:
        """Every stored row of ``search``."""
        cursor = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM points WHERE search = ? ORDER BY key",
                                  (search,))
        return [StoredRow(*row) for row in cursor]

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _check_file(path: Path, *, create: bool) -> None:
    """Refuse what is not a SQLite file before SQLite touches it."""
    if path.is_dir():
        raise PipeschedError(f"db={path}: a folder; give a file path")
    if not path.exists():
        if not create:
            raise PipeschedError(f"db={path}: no such file; give the store of a previous search")
        if not path.parent.is_dir():
            raise PipeschedError(f"db={path}: folder {path.parent} does not exist; create it or give another path")
        return
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise PipeschedError(f"db={path}: cannot read it ({exc.strerror}); give a readable file") from None
    if head and head != SQLITE_HEADER:
        raise PipeschedError(f"db={path}: not a SQLite database (it starts with {head[:8]!r}); it was left as it is; "
                             "give a new file or a pipesched search store to --db")


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[dict, list[StoredRow]]]:
    """(space, rows) of every search stored at ``path`` (which must exist)."""
    with SearchStore.open(path, create=False) as store:
        for search, space in store.searches():
            yield space, store.rows(search)
