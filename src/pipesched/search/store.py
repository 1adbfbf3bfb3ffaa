"""The results store of ``pipesched search``: one SQLite file (embedded, no server), written as
results come, so that a search killed at any moment resumes where it stopped.

A file holds searches (one per space, keyed by the space as JSON) and their points, one row
per point (keyed by the point: ``experiments.point.point_key``, a digest of all its fields)
once it is settled: ``bounded`` (its memory and time bound known, not yet
simulated), then ``evaluated``, ``out of memory``, ``pruned`` or ``invalid``. Every batch of
results is one transaction: a killed process loses at most the batch it was writing, whose
points are simply computed again; a settled row is never written twice (``run`` says which
start of the search wrote it).

A file that is not such a store (another program's database, a damaged file, any other
file) is refused and never written: the first bytes, the application id, the format table,
the tables' columns and an integrity check are read before anything is, and every space and
row read back is checked. Searches started together on one new file take turns: the tables
are checked and created in one transaction. A store opened ``read_only`` (``--show``) is
read as it is and nothing is created beside it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import typing
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote

from pipesched.enums import SearchStatus
from pipesched.errors import PipeschedError, shorten
from pipesched.experiments.point import Point, point_key
from pipesched.limits import check_name
from pipesched.search.space import SearchSpace

# "PSch": PRAGMA application_id of a pipesched search store
APPLICATION_ID = 0x50536368
FORMAT = "pipesched-search"
# 2: mfu counts model FLOPs (no recompute), hfu beside it; 3: a point keyed by all its fields,
# its columns named as the point names them; 4: the expert-parallel degree ep
VERSION = 4
SQLITE_HEADER = b"SQLite format 3\x00"

BOUNDED, EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID = (SearchStatus.BOUNDED, SearchStatus.EVALUATED,
                                                      SearchStatus.OUT_OF_MEMORY, SearchStatus.PRUNED,
                                                      SearchStatus.INVALID)
SETTLED = (EVALUATED, OUT_OF_MEMORY, PRUNED, INVALID)
_STATUSES = frozenset((BOUNDED, *SETTLED))
BUSY_TIMEOUT_S = 30.0  # how long a search waits for another one writing the same store


@dataclass(frozen=True)
class StoredRow:
    """One point of a search and what became of it: the point's key and the fields the
    point varies over its space, named as the point names them (``point_row`` and
    ``row_point`` map one to the other). Times in seconds, memory in bytes."""

    key: str  # ``experiments.point.point_key`` of the point
    family: str  # schedule family
    v: int | None  # chunks per device, for the families that take it
    dp: int
    tp: int
    p: int  # pipeline devices
    micro_batch_size: int
    m: int
    recompute: str
    partition: str
    zero: int
    ep: int  # expert-parallel degree
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
        return replace(self, status=status, **values)

    @property
    def label(self) -> str:
        """The point as a reader names it (messages, and ties in every order of rows).

        >>> point_row(Point("zb-v", p=8, m=32, tp=4)).label
        'zb-v v- p8 m32 t4 d1 b1 selective balanced zero0'
        """
        experts = f" ep{self.ep}" if self.ep > 1 else ""
        return (f"{self.family} v{self.v if self.v is not None else '-'} p{self.p} m{self.m} t{self.tp} d{self.dp} "
                f"b{self.micro_batch_size} {self.recompute} {self.partition} zero{self.zero}{experts}")


# the fields of a point a row holds (its space fixes the others: ``SearchSpace.template``)
POINT_COLUMNS = ("family", "v", "dp", "tp", "p", "micro_batch_size", "m", "recompute", "partition", "zero", "ep")


def point_row(point: Point, *, run: int = 0) -> StoredRow:
    """The row of ``point`` before it is bounded."""
    return StoredRow(point_key(point), *(getattr(point, name) for name in POINT_COLUMNS), BOUNDED, run=run)


def row_point(space: dict, row: StoredRow) -> Point:
    """The point of a stored row of a search of ``space`` (a SearchSpace as plain data)."""
    return SearchSpace(**space).template().replace(**{name: getattr(row, name) for name in POINT_COLUMNS})


_POINTS_TABLE = """CREATE TABLE points (
    search INTEGER NOT NULL REFERENCES searches(id),
    key TEXT NOT NULL, family TEXT NOT NULL, v INTEGER, dp INTEGER NOT NULL, tp INTEGER NOT NULL,
    p INTEGER NOT NULL, micro_batch_size INTEGER NOT NULL, m INTEGER NOT NULL, recompute TEXT NOT NULL,
    partition TEXT NOT NULL, zero INTEGER NOT NULL, ep INTEGER NOT NULL, status TEXT NOT NULL, bound_s REAL,
    peak_memory_bytes REAL, capacity_bytes REAL, iteration_time_s REAL, throughput_tokens_per_s REAL,
    mfu REAL, hfu REAL, reason TEXT NOT NULL, run INTEGER NOT NULL,
    PRIMARY KEY (search, key)
)"""


def store_schema(format_name: str, version: int, points_table: str) -> tuple[str, ...]:
    """The statements that create a store of ``format_name`` at ``version``: its format row,
    its searches (one per space) and ``points_table`` (a ``points`` table keyed by search and
    point key, one column per field of the store's row record)."""
    return (
        "CREATE TABLE format (name TEXT NOT NULL, version INTEGER NOT NULL)",
        "CREATE TABLE searches (id INTEGER PRIMARY KEY, space TEXT NOT NULL UNIQUE, runs INTEGER NOT NULL DEFAULT 0)",
        points_table,
        f"PRAGMA application_id = {APPLICATION_ID}",
        f"INSERT INTO format VALUES ('{format_name}', {version})",
    )


class SearchStore:
    """An open results store (see the module docstring). Use ``SearchStore.open``.

    A store of another kind of search (``search.serving``) is a subclass with its own
    ``FORMAT``, ``VERSION``, ``SCHEMA``, row record ``ROW`` (a frozen dataclass with ``key``,
    ``status`` and ``label``), the values ``NEEDED`` in each status, and ``check_space``.
    """

    FORMAT = FORMAT
    VERSION = VERSION
    SCHEMA = store_schema(FORMAT, VERSION, _POINTS_TABLE)
    ROW: type = StoredRow
    # the values a row must have in each status (the others may be NULL)
    NEEDED: ClassVar[dict[str, tuple[str, ...]]] = {
        BOUNDED: ("bound_s", "peak_memory_bytes"),
        EVALUATED: ("bound_s", "peak_memory_bytes", "iteration_time_s", "throughput_tokens_per_s")}

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True, read_only: bool = False) -> SearchStore:
        """Open the store at ``path``, creating it when the file does not exist (or is empty)
        and ``create``; any other file is refused with a PipeschedError. ``read_only``: read
        the store as it is (it must exist), writing nothing in its folder."""
        target = Path(path)
        _check_file(target, create=create and not read_only, write=not read_only)
        with _sqlite_errors(target, "cannot open it", "give a readable file path"):
            connection = _connect(target, read_only=read_only)
        store = cls(target, connection)
        try:
            with _sqlite_errors(target, "not a readable pipesched search store", "it was left as it is; give "
                                "another --db"):
                store._prepare(read_only=read_only)
        except BaseException:
            connection.close()
            raise
        return store

    def _prepare(self, *, read_only: bool) -> None:
        db = self._db
        if read_only:
            self._check_format()
            return
        # one process at a time checks the file and creates the tables
        db.execute("BEGIN IMMEDIATE")
        try:
            created = self._is_empty()
            if created:
                for statement in self.SCHEMA:
                    db.execute(statement)
            else:
                self._check_format()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if created:
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")

    def _is_empty(self) -> bool:
        tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return tables == 0 and self._db.execute("PRAGMA application_id").fetchone()[0] == 0

    def _check_format(self) -> None:
        """Refuse what is not a store of this format: another program's database, another
        version, missing tables or columns, a damaged file."""
        db = self._db
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        application = db.execute("PRAGMA application_id").fetchone()[0]
        if application != APPLICATION_ID or "format" not in tables:
            raise PipeschedError(f"db={self.path}: another program's SQLite database (application id {application}, "
                                 f"tables {', '.join(sorted(tables)) or 'none'}); it was left as it is; give a new "
                                 "file or a pipesched search store to --db")
        found = db.execute("SELECT * FROM format").fetchmany(2)  # one row, or not this format
        name, version = self.FORMAT, self.VERSION
        if len(found) == 1 and found[0][0] == name and isinstance(found[0][1], int) and found[0][1] < version:
            raise PipeschedError(f"db={self.path}: a search store made by an older pipesched (format version "
                                 f"{found[0][1]}, this one reads {version}); it was left as it is; search again "
                                 "into a new --db")
        if found != [(name, version)]:
            raise PipeschedError(f"db={self.path}: a search store of format {shorten(found)}, this pipesched reads "
                                 f"({name!r}, {version}); it was left as it is; give another --db")
        for table, columns in _table_columns(self.SCHEMA).items():
            have = tuple(tuple(row[1:3]) for row in db.execute(f"PRAGMA table_info({table})"))
            if have != columns:
                what = f"the {table} table is missing" if not have else f"the {table} table has other columns"
                raise _damaged(self.path, what)
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _damaged(self.path, f"the store is damaged ({check})")
        self.searches()  # every stored space readable

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SearchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- searches ----------------------------------------------------------------------
    def begin(self, space: dict) -> tuple[int, int, list[StoredRow]]:
        """(search id, run number, stored rows) of ``space``: a new search, or the next run of
        the one stored for the same space (counted once its rows read back)."""
        text = json.dumps(space, sort_keys=True)
        with self._errors(), self._transaction():
            self._db.execute("INSERT OR IGNORE INTO searches (space) VALUES (?)", (text,))
            search = int(self._db.execute("SELECT id FROM searches WHERE space = ?", (text,)).fetchone()[0])
            rows = self.rows(search)
            self._db.execute("UPDATE searches SET runs = runs + 1 WHERE id = ?", (search,))
            runs = int(self._db.execute("SELECT runs FROM searches WHERE id = ?", (search,)).fetchone()[0])
        return search, runs, rows

    def searches(self) -> list[tuple[int, dict]]:
        """(id, space) of every stored search, oldest first."""
        with self._errors():
            stored = self._db.execute("SELECT id, space FROM searches ORDER BY id").fetchall()
        return [(search, self._space(search, text)) for search, text in stored]

    def check_space(self, space: dict) -> None:
        """Raise a PipeschedError (or TypeError) unless ``space`` is a space this store's
        search reads."""
        names = {f.name for f in fields(SearchSpace)}
        if set(space) != names:
            raise PipeschedError(f"space: fields {sorted(set(space) ^ names)} differ")
        check_name("model", space["model"])
        check_name("cluster", space["cluster"])
        SearchSpace(**space)

    def _space(self, search: int, text: object) -> dict:
        """A stored search's space, checked as the search reads it."""
        try:
            space = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            space = None
        if not isinstance(space, dict):
            raise _damaged(self.path, f"search {search} has no readable space ({shorten(text)})")
        try:
            self.check_space(space)
        except (PipeschedError, TypeError) as exc:
            raise _damaged(self.path, f"search {search} has a space this pipesched cannot read ({exc})") from None
        return space

    # --- points ------------------------------------------------------------------------
    def write(self, search: int, rows: Iterable[StoredRow]) -> None:
        """Store ``rows`` in one transaction (a bounded row is replaced when it settles)."""
        rows = list(rows)
        if not rows:
            return
        columns = _columns(self.ROW)
        marks = ", ".join("?" * (len(columns) + 1))
        with self._errors(), self._transaction():
            self._db.executemany(f"INSERT OR REPLACE INTO points (search, {', '.join(columns)}) VALUES ({marks})",
                                 [(search, *(getattr(row, name) for name in columns)) for row in rows])

    def rows(self, search: int) -> list[StoredRow]:
        """Every stored row of ``search``."""
        with self._errors():
            stored = self._db.execute(f"SELECT {', '.join(_columns(self.ROW))} FROM points WHERE search = ? "
                                      "ORDER BY key", (search,)).fetchall()
        return [self._row(search, values) for values in stored]

    def _row(self, search: int, values: tuple) -> object:
        """A stored row, each value of its field's type and the values of its status present."""
        columns, types = _columns(self.ROW), _column_types(self.ROW)
        if not all(map(isinstance, values, types)):
            name, value = next((n, v) for n, v, t in zip(columns, values, types, strict=True) if not isinstance(v, t))
            raise _damaged(self.path, f"search {search} point {shorten(values[0])}: {name}={shorten(value)} is not of "
                                      "its type")
        row = self.ROW(*values)
        if row.status not in _STATUSES:
            raise _damaged(self.path, f"search {search} point {row.label}: status={shorten(row.status)} is unknown")
        missing = [name for name in self.NEEDED.get(row.status, ()) if getattr(row, name) is None]
        if missing:
            raise _damaged(self.path, f"search {search} point {row.label}: {row.status} but no {', '.join(missing)}")
        return row

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def _errors(self):
        return _sqlite_errors(self.path, "cannot use the store", "give a writable store")


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:
            self.db.execute("ROLLBACK")


def _check_file(path: Path, *, create: bool, write: bool) -> None:
    """Refuse what is not a SQLite file, or one this command cannot write, before SQLite
    touches it (SQLite would leave its journal files beside a store it then fails to write)."""
    if path.is_dir():
        raise PipeschedError(f"db={path}: a folder; give a file path")
    folder = path.parent
    if not path.exists():
        if not create:
            raise PipeschedError(f"db={path}: no such file; give the store of a previous search")
        if not folder.is_dir():
            raise PipeschedError(f"db={path}: folder {folder} does not exist; create it or give another path")
    else:
        try:
            with path.open("rb") as handle:
                head = handle.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise PipeschedError(f"db={path}: cannot read it ({exc.strerror}); give a readable file") from None
        if head and head != SQLITE_HEADER:
            raise PipeschedError(f"db={path}: not a SQLite database (it starts with {head[:8]!r}); it was left as it "
                                 "is; give a new file or a pipesched search store to --db")
        if write and not os.access(path, os.W_OK):
            raise PipeschedError(f"db={path}: read-only; give a store this user can write (--show reads it as it is)")
    if write and not os.access(folder, os.W_OK | os.X_OK):
        raise PipeschedError(f"db={path}: folder {folder} is read-only (a search writes its journal beside the "
                             "store); give a path in a writable folder (--show reads a store as it is)")


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if not read_only:
        return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    # without a write-ahead log beside it, every committed row is in the file itself: read it
    # as immutable, which creates no journal files (a read-only folder could not hold them)
    immutable = "" if Path(f"{path}-wal").exists() else "&immutable=1"
    return sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro{immutable}", uri=True,
                           timeout=BUSY_TIMEOUT_S, isolation_level=None)


@contextmanager
def _sqlite_errors(path: Path, what: str, fix: str) -> Iterator[None]:
    """SQLite's errors as one line naming the store."""
    try:
        yield
    except sqlite3.Error as exc:
        raise PipeschedError(f"db={path}: {what} ({exc}); {fix}") from None


def _damaged(path: Path, what: str) -> PipeschedError:
    return PipeschedError(f"db={path}: {what}; it was left as it is; give another --db")


@cache
def _table_columns(schema: tuple[str, ...]) -> dict[str, tuple[tuple[str, str], ...]]:
    """(name, declared type) of every column of each table, as ``schema`` creates them."""
    with sqlite3.connect(":memory:") as scratch:
        for statement in schema:
            scratch.execute(statement)
        tables = [row[0] for row in scratch.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {table: tuple(tuple(row[1:3]) for row in scratch.execute(f"PRAGMA table_info({table})"))
                   for table in tables}
    scratch.close()
    return columns


@cache
def _columns(row_type: type) -> tuple[str, ...]:
    """The columns of a store's points table: its row record's fields, in order."""
    return tuple(f.name for f in fields(row_type))


@cache
def _column_types(row_type: type) -> tuple[tuple[type, ...], ...]:
    """The types each field of ``row_type`` takes, in column order (a float field takes an
    int too; SQLite gives no other kinds of value)."""
    hints = typing.get_type_hints(row_type)
    types = []
    for name in _columns(row_type):
        allowed = typing.get_args(hints[name]) or (hints[name],)
        types.append(allowed + ((int,) if float in allowed else ()))
    return tuple(types)


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[dict, list[StoredRow]]]:
    """(space, rows) of every search stored at ``path`` (which must exist)."""
    with SearchStore.open(path, read_only=True) as store:
        for search, space in store.searches():
            yield space, store.rows(search)
