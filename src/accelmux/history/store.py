"""The request history on disk: one SQLite file per UTC day under ``data_dir/history``.

Why SQLite: a row is committed whole or not at all, so a daemon killed mid-write (or a
power loss) leaves every file readable up to its last commit, with no half-written line
to skip, which a JSON-lines file would leave; rows are read back by run and time
range with an index; and it is in the standard library, as the job store and the
camera events already use it. WAL mode with ``synchronous=NORMAL``: a killed process
loses nothing committed, a power loss may lose the last second or two of history (no
client ever saw those rows acknowledged, unlike a job), and a commit costs no fsync.

Bounded on disk: a file per UTC day (``history-YYYY-MM-DD.sqlite3``), the files older
than ``days`` are deleted, and when all of them together pass ``max_bytes`` the oldest go
first (never today's). Files are created 0600 in a 0700 directory (SQLite gives its WAL
and shared-memory files the database file's mode).

Writing never blocks the daemon: :class:`HistoryWriter` takes batches of rows and one
thread of its own commits them (one transaction per batch). Each day file starts with
the run that writes to it, so a file read alone says what it holds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from accelmux.errors import AccelmuxError
from accelmux.history.records import (
    HISTORY_FORMAT,
    ROW_TYPES,
    DaemonRun,
    DecisionRecord,
    LoadRecord,
    RequestRecord,
    SampleRecord,
    as_tuple,
    columns,
)

log = logging.getLogger("accelmux.history")

FILE_PREFIX = "history-"
FILE_SUFFIX = ".sqlite3"
FILE_MODE = 0o600
DIR_MODE = 0o700
#: Columns typed by their Python annotation (SQLite keeps any value; the type documents).
_SQL_TYPES = {"float": "REAL", "int": "INTEGER", "str": "TEXT"}
_INDEXES = {
    "requests": "run, t_arrived",
    "samples": "run, t",
    "decisions": "run, t",
    "loads": "run, t_start",
}

R = TypeVar("R")


class HistoryError(AccelmuxError):
    """The history cannot be read: missing, empty, damaged, or of another format."""


def day_file(directory: Path, day: dt.date) -> Path:
    return directory / f"{FILE_PREFIX}{day.isoformat()}{FILE_SUFFIX}"


def history_files(directory: Path) -> list[Path]:
    """The day files under ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.iterdir()
        if p.name.startswith(FILE_PREFIX) and p.name.endswith(FILE_SUFFIX) and p.is_file()
    )


def _sql_type(annotation: object) -> str:
    text = str(annotation).split("|")[0].strip()
    return _SQL_TYPES.get(text, "")


def _create_schema(conn: sqlite3.Connection) -> None:
    for row_type in ROW_TYPES:
        hints = {f: row_type.__annotations__.get(f, "") for f in columns(row_type)}
        cols = ", ".join(f"{name} {_sql_type(hints[name])}".strip() for name in hints)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {row_type.TABLE} ({cols})")
    for table, cols in _INDEXES.items():
        conn.execute(f"CREATE INDEX IF NOT EXISTS {table}_by_time ON {table} ({cols})")
    conn.execute(f"PRAGMA user_version = {HISTORY_FORMAT}")


def _insert_sql(row_type: type[Any]) -> str:
    cols = columns(row_type)
    return (
        f"INSERT INTO {row_type.TABLE} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
    )


def open_day_file(path: Path) -> sqlite3.Connection:
    """Open (creating, 0600) one day file for writing, with its schema."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE))
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version not in (0, HISTORY_FORMAT):
        conn.close()
        raise HistoryError(
            f"{path}: history format {version}, this accelmux writes format {HISTORY_FORMAT}; "
            "move the file away to start a new one"
        )
    with conn:
        conn.execute("BEGIN")
        _create_schema(conn)
    return conn


@dataclass
class _Batch:
    rows: list[Any]
    done: threading.Event | None = None


class HistoryWriter:
    """Commits rows to today's file from a thread of its own, and keeps the files bounded.

    ``write(rows)`` returns at once; ``flush()`` waits until what was written before it is
    committed; ``close()`` flushes and stops the thread. A failed commit is logged and the
    batch dropped: the history must never take the daemon down.
    """

    def __init__(
        self,
        directory: Path,
        *,
        days: int,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if days < 1 or max_bytes < 1:
            raise ValueError("days and max_bytes must be positive")
        self.directory = directory
        self.days = days
        self.max_bytes = max_bytes
        self.clock = clock
        self.run: DaemonRun | None = None
        self._day: dt.date | None = None
        self._conn: sqlite3.Connection | None = None
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
        self._thread.start()
        self.written = 0
        self.dropped = 0

    # ---- the caller's side ----------------------------------------------------------------
    def start_run(self, run: DaemonRun) -> None:
        """The run every row that follows belongs to (written into each day file)."""
        self.run = run
        self._queue.put(_Batch([run]))

    def write(self, rows: Sequence[Any]) -> None:
        if rows:
            self._queue.put(_Batch(list(rows)))

    def flush(self, timeout: float = 10.0) -> bool:
        done = threading.Event()
        self._queue.put(_Batch([], done))
        return done.wait(timeout)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self.flush()
        self._queue.put(None)
        self._thread.join(10.0)

    # ---- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            try:
                if batch.rows:
                    self._commit(batch.rows)
            except (sqlite3.Error, OSError, HistoryError) as exc:
                self.dropped += len(batch.rows)
                log.warning("history: %d row(s) not recorded: %s", len(batch.rows), exc)
                self._close_conn()
            finally:
                if batch.done is not None:
                    batch.done.set()
        self._close_conn()

    def _close_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
            self._day = None

    def _connection(self) -> sqlite3.Connection:
        today = dt.datetime.fromtimestamp(self.clock(), dt.UTC).date()
        if self._conn is not None and self._day == today:
            return self._conn
        self._close_conn()
        conn = open_day_file(day_file(self.directory, today))
        self._conn, self._day = conn, today
        if self.run is not None:
            self._insert(conn, [self.run])
        self._prune(today)
        return conn

    def _insert(self, conn: sqlite3.Connection, rows: Iterable[Any]) -> None:
        by_type: dict[type[Any], list[tuple[Any, ...]]] = {}
        for row in rows:
            by_type.setdefault(type(row), []).append(as_tuple(row))
        with conn:
            conn.execute("BEGIN")
            for row_type, values in by_type.items():
                if row_type is DaemonRun:
                    conn.execute("DELETE FROM runs WHERE run = ?", (values[0][0],))
                conn.executemany(_insert_sql(row_type), values)

    def _commit(self, rows: list[Any]) -> None:
        conn = self._connection()
        self._insert(conn, rows)
        self.written += len(rows)

    def _prune(self, today: dt.date) -> None:
        """Delete the files older than ``days``, then the oldest while over ``max_bytes``."""
        oldest_kept = today - dt.timedelta(days=self.days - 1)
        keep: list[Path] = []
        for path in history_files(self.directory):
            day = _day_of(path)
            if day is not None and day < oldest_kept:
                _remove(path)
            else:
                keep.append(path)
        current = day_file(self.directory, today)
        while sum(_size(p) for p in keep) > self.max_bytes and keep and keep[0] != current:
            _remove(keep.pop(0))


def _day_of(path: Path) -> dt.date | None:
    text = path.name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _size(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += (path.parent / (path.name + suffix)).stat().st_size
    return total


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (path.parent / (path.name + suffix)).unlink()
    log.info("history: removed %s (older than the days kept, or over the size kept)", path.name)


# ---- reading -----------------------------------------------------------------------------
@dataclass
class History:
    """What the day files hold for one run (the rows of every file, in time order)."""

    run: DaemonRun
    requests: list[RequestRecord] = field(default_factory=list)
    loads: list[LoadRecord] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    samples: list[SampleRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    #: Day files that could not be read, one line each (skipped).
    problems: list[str] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        times = [r.t_arrived for r in self.requests] + [s.t for s in self.samples]
        return max(times) - min(times) if times else 0.0


def _check_format(path: Path, conn: sqlite3.Connection) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version < HISTORY_FORMAT:
        raise HistoryError(
            f"{path.name}: written by an older accelmux (history format {version}; this "
            f"version reads format {HISTORY_FORMAT}); it cannot be replayed: record a new "
            "history with this version"
        )
    if version > HISTORY_FORMAT:
        raise HistoryError(
            f"{path.name}: written by a newer accelmux (history format {version}; this "
            f"version reads format {HISTORY_FORMAT}); read it with that version"
        )


def _rows(
    conn: sqlite3.Connection, row_type: type[R], where: str, args: tuple[Any, ...]
) -> list[R]:
    """The rows of ``row_type``'s table; a column the file lacks (one added to the format
    since, always with a default) takes its default."""
    table = row_type.TABLE  # type: ignore[attr-defined]
    present = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    cols = [c for c in columns(row_type) if c in present]
    sql = f"SELECT {', '.join(cols)} FROM {table} WHERE {where}"
    return [row_type(**dict(zip(cols, values, strict=True))) for values in conn.execute(sql, args)]


def _open_read(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        _check_format(path, conn)
        conn.execute("SELECT count(*) FROM runs").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def list_runs(directory: Path) -> tuple[list[DaemonRun], list[str]]:
    """Every run the readable day files name (oldest first), and one problem line
    per file that could not be read."""
    runs: dict[str, DaemonRun] = {}
    problems: list[str] = []
    files = history_files(directory)
    if not files:
        raise HistoryError(
            f"no history in {directory}: the daemon records one there while it runs "
            "(server.history.enabled, on by default); run it for a while first"
        )
    for path in files:
        try:
            conn = _open_read(path)
        except HistoryError as exc:
            problems.append(str(exc))
            continue
        except sqlite3.DatabaseError as exc:
            problems.append(f"{path.name}: damaged, skipped ({exc})")
            continue
        with contextlib.closing(conn):
            try:
                for s in _rows(conn, DaemonRun, "1 = 1", ()):
                    runs.setdefault(s.run, s)
            except sqlite3.DatabaseError as exc:
                problems.append(f"{path.name}: damaged, skipped ({exc})")
    if not runs:
        detail = "; ".join(problems) or "the files hold no run"
        raise HistoryError(f"no readable history in {directory}: {detail}")
    return sorted(runs.values(), key=lambda s: s.started_wall), problems


def read_history(directory: Path, run: str | None = None) -> History:
    """The rows of one run (the latest when ``run`` is None), from every
    readable day file. Raises :class:`HistoryError` when there is nothing to read."""
    runs, problems = list_runs(directory)
    if run is None:
        chosen = runs[-1]
    else:
        found = [s for s in runs if s.run == run or s.run.startswith(run)]
        if len(found) != 1:
            names = ", ".join(s.run for s in runs)
            raise HistoryError(
                f"run {run!r} {'is ambiguous' if found else 'not found'} "
                f"in {directory} (runs: {names})"
            )
        chosen = found[0]
    out = History(run=chosen, problems=problems)
    key = (chosen.run,)
    for path in history_files(directory):
        try:
            conn = _open_read(path)
        except (HistoryError, sqlite3.DatabaseError):
            continue  # already reported by list_runs
        with contextlib.closing(conn):
            try:
                requests = _rows(conn, RequestRecord, "run = ?", key)
                loads = _rows(conn, LoadRecord, "run = ?", key)
                decisions = _rows(conn, DecisionRecord, "run = ?", key)
                samples = _rows(conn, SampleRecord, "run = ?", key)
            except sqlite3.DatabaseError as exc:
                out.problems.append(f"{path.name}: damaged, skipped ({exc})")
                continue
        if requests or loads or decisions or samples:
            out.files.append(path)
        out.requests += requests
        out.loads += loads
        out.decisions += decisions
        out.samples += samples
    out.requests.sort(key=lambda r: (r.t_arrived, r.request_id))
    out.loads.sort(key=lambda r: r.t_start)
    out.decisions.sort(key=lambda r: r.t)
    out.samples.sort(key=lambda r: (r.t, r.device))
    return out
