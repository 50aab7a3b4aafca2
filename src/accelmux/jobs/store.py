"""Durable job storage in SQLite: every input is recorded done exactly once.

Schema (``PRAGMA user_version`` = 2)::

    jobs     one row per job: id, model, status, timestamps, max_attempts, metadata,
             owner (SHA-256 hex of the API key that submitted it, NULL without keys), and
             the count of its inputs in each state (n_pending .. n_cancelled), kept in the
             same transaction as every state change so progress reads are O(1)
    inputs   (job_id, idx) PRIMARY KEY: text, state, attempts, lease_token, not_before
             (backoff), last_error
    results  (job_id, idx) PRIMARY KEY, a foreign key to inputs: the JSON result

An input moves ``pending -> leased -> done`` (or back to ``pending`` on a retry, or to
``failed`` after ``max_attempts`` attempts, or ``pending -> cancelled``). Exactly once:

1. Recording a result and the ``leased -> done`` change are one transaction, and the
   UPDATE only matches the row while it is still leased under the caller's token, so a
   stale, duplicated or late completion changes nothing.
2. ``results`` is keyed by (job_id, idx): a second row for one input cannot exist; an
   attempt to write one raises and rolls the whole transaction back.
3. A crash (``kill -9``, power loss) loses at most uncommitted transactions, whose result
   and state change vanish together; on start-up, :meth:`JobStore.recover` turns every
   leased row back to pending, and the work is repeated (it is idempotent).

Version 1 (before jobs had owners) is migrated on open: ``owner`` is added, NULL for
the jobs already there (with API keys configured only the admin key sees them).

Reads take a :class:`~accelmux.jobs.model.Viewer`: a job of another owner is
:class:`JobNotFoundError`, as one that does not exist.

So execution is at least once (at most ``max_attempts`` times per input) and recording
is exactly once.

Durability: the database runs in WAL mode with ``synchronous=FULL``. ``NORMAL`` already
survives a killed process (the WAL lives in the OS page cache), and even a power loss
would keep the store consistent, but it may forget the last committed transactions: a job
the API had acknowledged, or a result a client had already read. ``FULL`` syncs the WAL
at every commit, so what was acknowledged stays; the cost (one fsync per transaction,
a few ms) is paid per batch, not per input.

One process owns a data directory: :meth:`JobStore.open` takes an exclusive ``flock`` on
``jobs.lock`` (the kernel drops it when the process dies, even by ``kill -9``), so
recovery never steals the leases of a live runner. The store is thread-safe (one
connection behind a lock), so asyncio code may call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from accelmux.jobs.errors import JobError, JobNotFoundError, JobStateError, JobStoreLockedError
from accelmux.jobs.model import (
    ACTIVE_STATUSES,
    INPUT_STATES,
    InputState,
    Job,
    JobCounts,
    JobStatus,
    Lease,
    LeasedInput,
    ResultItem,
    Viewer,
)

DB_NAME = "jobs.sqlite3"
LOCK_NAME = "jobs.lock"
SCHEMA_VERSION = 2
#: Files hold input texts: owner read/write only.
FILE_MODE = 0o600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    model        TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN
                     ('queued','running','paused','completed','cancelled','failed')),
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    metadata     TEXT NOT NULL DEFAULT '{}',
    error        TEXT,
    total        INTEGER NOT NULL CHECK (total >= 1),
    n_pending    INTEGER NOT NULL,
    n_leased     INTEGER NOT NULL DEFAULT 0,
    n_done       INTEGER NOT NULL DEFAULT 0,
    n_failed     INTEGER NOT NULL DEFAULT 0,
    n_cancelled  INTEGER NOT NULL DEFAULT 0,
    owner        TEXT,
    CHECK (n_pending + n_leased + n_done + n_failed + n_cancelled = total)
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq);
CREATE TABLE IF NOT EXISTS inputs (
    job_id      TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    text        TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending','leased','done','failed','cancelled')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    lease_token TEXT,
    not_before  REAL NOT NULL DEFAULT 0,
    last_error  TEXT,
    PRIMARY KEY (job_id, idx),
    CHECK ((state = 'leased') = (lease_token IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inputs_by_state ON inputs (job_id, state, idx);
CREATE TABLE IF NOT EXISTS results (
    job_id       TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    result       TEXT NOT NULL,
    completed_at REAL NOT NULL,
    PRIMARY KEY (job_id, idx),
    FOREIGN KEY (job_id, idx) REFERENCES inputs (job_id, idx) ON DELETE CASCADE
) WITHOUT ROWID;
"""

_MIGRATE_1_TO_2 = (
    "ALTER TABLE jobs ADD COLUMN owner TEXT",
    "CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq)",
)

_JOB_COLUMNS = (
    "id, model, status, created_at, started_at, finished_at, max_attempts, metadata, error,"
    " total, n_pending, n_leased, n_done, n_failed, n_cancelled, owner"
)
_COUNT_COLUMN: dict[InputState, str] = {
    "pending": "n_pending",
    "leased": "n_leased",
    "done": "n_done",
    "failed": "n_failed",
    "cancelled": "n_cancelled",
}


#: What a job id looks like (the document's pattern).
JOB_ID_PATTERN = r"^job_[0-9a-f]{24}$"


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def _visible(viewer: Viewer | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause (``AND ...``) limiting rows of ``jobs`` to what ``viewer`` sees."""
    if viewer is None or viewer.sees_all:
        return "", ()
    if viewer.owner is None:
        return " AND 0", ()
    return " AND owner = ?", (viewer.owner,)


class JobStore:
    """Jobs, their inputs and results in one SQLite file.

    Use :meth:`open` for a data directory (lock file + recovery); the constructor opens a
    database file as it is, which tests use to inspect a store another process owns.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_attempts: int = 5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.path = Path(path)
        self.max_attempts = max_attempts
        self._clock = clock
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        # SQLite gives the -wal and -shm files the mode of the database file
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE))
        self._db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, SCHEMA_VERSION):
                raise JobError(
                    f"{self.path}: schema version {version}, expected {SCHEMA_VERSION} or older"
                )
            if version == 0:
                with self._tx():
                    self._create_schema()
            elif version == 1:
                with self._tx() as db:
                    for statement in _MIGRATE_1_TO_2:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            self._db.close()
            raise

    def _create_schema(self) -> None:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self._db.execute(statement)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        max_attempts: int = 5,
        clock: Callable[[], float] = time.time,
        recover: bool = True,
    ) -> JobStore:
        """Open (or create) the store of ``data_dir``, own it, and recover its leases."""
        directory = Path(data_dir)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JobStoreLockedError(
                f"{directory}: the jobs store is in use by another accelmux process"
            ) from None
        try:
            store = cls(directory / DB_NAME, max_attempts=max_attempts, clock=clock)
        except BaseException:
            os.close(fd)
            raise
        store._lock_fd = fd
        if recover:
            try:
                store.recover()
            except BaseException:
                store.close()
                raise
        return store

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # also releases the flock
                self._lock_fd = None

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), committed or rolled back whole."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---------------------------------------------------------------- jobs

    def create_job(
        self,
        model: str,
        inputs: Sequence[str],
        *,
        metadata: Mapping[str, str] | None = None,
        job_id: str | None = None,
        owner: str | None = None,
    ) -> Job:
        if not model:
            raise ValueError("model must not be empty")
        if not inputs:
            raise ValueError("a job needs at least one input")
        if not all(isinstance(text, str) for text in inputs):
            raise TypeError("every input must be a str")
        job_id = job_id or new_job_id()
        meta = json.dumps(dict(metadata or {}), sort_keys=True)
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, model, status, created_at, max_attempts, metadata,"
                " total, n_pending, owner) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                (job_id, model, now, self.max_attempts, meta, len(inputs), len(inputs), owner),
            )
            db.executemany(
                "INSERT INTO inputs (job_id, idx, text) VALUES (?, ?, ?)",
                ((job_id, i, text) for i, text in enumerate(inputs)),
            )
        return self.get_job(job_id)

    def get_job(self, job_id: str, *, viewer: Viewer | None = None) -> Job:
        """The job; :class:`JobNotFoundError` also when ``viewer`` may not see it."""
        where, args = _visible(viewer)
        with self._lock:
            row = self._db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?{where}", (job_id, *args)
            ).fetchone()
        if row is None:
            raise JobNotFoundError(job_id)
        return _job_from_row(row)

    def list_jobs(
        self, *, limit: int = 20, after: str | None = None, viewer: Viewer | None = None
    ) -> tuple[list[Job], bool]:
        """Jobs ``viewer`` may see, newest first; ``after`` is the id of the last job of the
        previous page.

        Returns the page and whether more jobs follow it.
        """
        where, args = _visible(viewer)
        with self._lock:
            bound = 2**62
            if after is not None:
                row = self._db.execute(
                    f"SELECT seq FROM jobs WHERE id = ?{where}", (after, *args)
                ).fetchone()
                if row is None:
                    raise JobNotFoundError(after)
                bound = row[0]
            rows = self._db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE seq < ?{where} ORDER BY seq DESC LIMIT ?",
                (bound, *args, limit + 1),
            ).fetchall()
        jobs = [_job_from_row(row) for row in rows[:limit]]
        return jobs, len(rows) > limit

    def cancel_job(self, job_id: str, *, viewer: Viewer | None = None) -> Job:
        """Cancel a job: pending inputs are cancelled, leased ones may still finish.

        Cancelling a cancelled job is a no-op; a completed or failed job raises
        :class:`JobStateError`, one ``viewer`` may not see :class:`JobNotFoundError`.
        """
        now = self._clock()
        with self._tx() as db:
            status = self._status(job_id, viewer)
            if status == "cancelled":
                pass
            elif status not in ACTIVE_STATUSES:
                raise JobStateError(f"job {job_id} is already {status}")
            else:
                n = db.execute(
                    "UPDATE inputs SET state = 'cancelled', not_before = 0"
                    " WHERE job_id = ? AND state = 'pending'",
                    (job_id,),
                ).rowcount
                db.execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ?,"
                    " n_pending = n_pending - ?, n_cancelled = n_cancelled + ? WHERE id = ?",
                    (now, n, n, job_id),
                )
        return self.get_job(job_id)

    def set_paused(self, job_id: str, paused: bool) -> bool:
        """Pause an active job (outside its window) or resume it; True when it changed."""
        with self._tx() as db:
            status = self._status(job_id)
            if paused and status in ("queued", "running"):
                new: JobStatus = "paused"
            elif not paused and status == "paused":
                row = db.execute("SELECT started_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
                new = "queued" if row[0] is None else "running"
            else:
                return False
            db.execute("UPDATE jobs SET status = ? WHERE id = ?", (new, job_id))
            return True

    def _status(self, job_id: str, viewer: Viewer | None = None) -> JobStatus:
        where, args = _visible(viewer)
        row = self._db.execute(
            f"SELECT status FROM jobs WHERE id = ?{where}", (job_id, *args)
        ).fetchone()
        if row is None:
            raise JobNotFoundError(job_id)
        return cast(JobStatus, row[0])

    # ---------------------------------------------------------------- leasing

    def runnable_jobs(self) -> list[tuple[str, str, JobStatus]]:
        """(id, model, status) of active jobs with an input that may start now, oldest first."""
        now = self._clock()
        with self._lock:
            rows = self._db.execute(
                "SELECT j.id, j.model, j.status FROM jobs j"
                " WHERE j.status IN ('queued','running','paused')"
                " AND j.n_pending > 0 AND EXISTS (SELECT 1 FROM inputs i WHERE i.job_id = j.id"
                " AND i.state = 'pending' AND i.not_before <= ?) ORDER BY j.seq",
                (now,),
            ).fetchall()
        return [(row[0], row[1], row[2]) for row in rows]

    def next_wakeup(self) -> float | None:
        """When the earliest pending input of a queued or running job may start.

        None when there is none. Paused jobs are left out: they wait for their window,
        not for a time. The answer may lie in the past (work is ready now).
        """
        with self._lock:
            row = self._db.execute(
                "SELECT MIN(i.not_before) FROM inputs i JOIN jobs j ON j.id = i.job_id"
                " WHERE i.state = 'pending' AND j.status IN ('queued','running')"
            ).fetchone()
        return None if row[0] is None else float(row[0])

    def pending_count(self) -> int:
        """Pending inputs of every active job, backed off or not."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(n_pending), 0) FROM jobs"
                " WHERE status IN ('queued','running','paused')"
            ).fetchone()
        return int(row[0])

    def claim(self, job_id: str, limit: int) -> Lease | None:
        """Lease up to ``limit`` pending inputs of an active job (lowest index first)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        now = self._clock()
        token = secrets.token_hex(8)
        with self._tx() as db:
            row = db.execute("SELECT model, status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFoundError(job_id)
            model, status = row
            if status not in ACTIVE_STATUSES:
                return None
            rows = db.execute(
                "SELECT idx, text, attempts FROM inputs WHERE job_id = ? AND state = 'pending'"
                " AND not_before <= ? ORDER BY idx LIMIT ?",
                (job_id, now, limit),
            ).fetchall()
            if not rows:
                return None
            db.executemany(
                "UPDATE inputs SET state = 'leased', attempts = attempts + 1, lease_token = ?"
                " WHERE job_id = ? AND idx = ?",
                ((token, job_id, idx) for idx, _, _ in rows),
            )
            db.execute(
                "UPDATE jobs SET n_pending = n_pending - ?, n_leased = n_leased + ?,"
                " status = 'running', started_at = COALESCE(started_at, ?) WHERE id = ?",
                (len(rows), len(rows), now, job_id),
            )
        items = tuple(
            LeasedInput(index=idx, text=text, attempt=attempts + 1) for idx, text, attempts in rows
        )
        return Lease(job_id=job_id, model=model, token=token, inputs=items)

    def complete(self, lease: Lease, results: Mapping[int, Any]) -> int:
        """Record results of leased inputs (index -> JSON-able value); returns how many.

        An input no longer leased under ``lease.token`` (recovered, already recorded) is
        skipped, so calling this twice records nothing the second time.
        """
        encoded = {idx: json.dumps(value, separators=(",", ":")) for idx, value in results.items()}
        now = self._clock()
        with self._tx() as db:
            n = 0
            for idx, text in encoded.items():
                changed = db.execute(
                    "UPDATE inputs SET state = 'done', lease_token = NULL, last_error = NULL"
                    " WHERE job_id = ? AND idx = ? AND state = 'leased' AND lease_token = ?",
                    (lease.job_id, idx, lease.token),
                ).rowcount
                if changed:
                    db.execute(
                        "INSERT INTO results (job_id, idx, result, completed_at)"
                        " VALUES (?, ?, ?, ?)",
                        (lease.job_id, idx, text, now),
                    )
                    n += 1
            self._move_counts(lease.job_id, {"leased": -n, "done": n})
            self._finish_if_done(lease.job_id, now)
        return n

    def retry(self, lease: Lease, indexes: Sequence[int], error: str, delay: float) -> int:
        """Give leased inputs back for another try after ``delay`` seconds.

        An input that has used the job's ``max_attempts`` is marked failed instead, and one
        of a cancelled job is cancelled. Returns how many will be retried.
        """
        return self._release(lease, indexes, error=error, delay=delay, count_attempt=True)

    def release(self, lease: Lease, indexes: Sequence[int] | None = None) -> int:
        """Give leased inputs back untried (the runner stops): the attempt is not counted."""
        chosen = lease.indexes if indexes is None else indexes
        return self._release(lease, chosen, error=None, delay=0.0, count_attempt=False)

    def fail(self, lease: Lease, indexes: Sequence[int], error: str) -> int:
        """Mark leased inputs failed for good with ``error``; returns how many."""
        now = self._clock()
        with self._tx() as db:
            n = 0
            for idx in indexes:
                n += db.execute(
                    "UPDATE inputs SET state = 'failed', lease_token = NULL, last_error = ?"
                    " WHERE job_id = ? AND idx = ? AND state = 'leased' AND lease_token = ?",
                    (error, lease.job_id, idx, lease.token),
                ).rowcount
            self._move_counts(lease.job_id, {"leased": -n, "failed": n})
            self._finish_if_done(lease.job_id, now)
        return n

    def _release(
        self,
        lease: Lease,
        indexes: Sequence[int],
        *,
        error: str | None,
        delay: float,
        count_attempt: bool,
    ) -> int:
        now = self._clock()
        with self._tx() as db:
            row = db.execute(
                "SELECT status, max_attempts FROM jobs WHERE id = ?", (lease.job_id,)
            ).fetchone()
            if row is None:
                raise JobNotFoundError(lease.job_id)
            status, max_attempts = row
            moved: dict[InputState, int] = {}
            for idx in indexes:
                found = db.execute(
                    "SELECT attempts FROM inputs WHERE job_id = ? AND idx = ?"
                    " AND state = 'leased' AND lease_token = ?",
                    (lease.job_id, idx, lease.token),
                ).fetchone()
                if found is None:
                    continue
                attempts = found[0] if count_attempt else found[0] - 1
                new = _after_lease(status, attempts, max_attempts)
                db.execute(
                    "UPDATE inputs SET state = ?, lease_token = NULL, attempts = ?,"
                    " not_before = ?, last_error = COALESCE(?, last_error)"
                    " WHERE job_id = ? AND idx = ?",
                    (new, attempts, now + delay, error, lease.job_id, idx),
                )
                moved[new] = moved.get(new, 0) + 1
            moved["leased"] = -sum(moved.values())
            self._move_counts(lease.job_id, moved)
            self._finish_if_done(lease.job_id, now)
        return moved.get("pending", 0)

    def recover(self) -> int:
        """Start-up: return every leased input to pending; returns how many.

        Inputs of cancelled jobs become cancelled, and an input whose attempts are used up
        (it was in flight each time the process died) becomes failed.
        """
        now = self._clock()
        with self._tx() as db:
            rows = db.execute(
                "SELECT i.job_id, i.idx, i.attempts, j.status, j.max_attempts FROM inputs i"
                " JOIN jobs j ON j.id = i.job_id WHERE i.state = 'leased'"
            ).fetchall()
            moved: dict[str, dict[InputState, int]] = {}
            for job_id, idx, attempts, status, max_attempts in rows:
                new = _after_lease(status, attempts, max_attempts)
                db.execute(
                    "UPDATE inputs SET state = ?, lease_token = NULL, not_before = 0,"
                    " last_error = CASE WHEN ? = 'failed' THEN"
                    " 'interrupted by a restart on every attempt' ELSE last_error END"
                    " WHERE job_id = ? AND idx = ?",
                    (new, new, job_id, idx),
                )
                per_job = moved.setdefault(job_id, {})
                per_job[new] = per_job.get(new, 0) + 1
                per_job["leased"] = per_job.get("leased", 0) - 1
            for job_id, delta in moved.items():
                self._move_counts(job_id, delta)
                self._finish_if_done(job_id, now)
        return sum(d.get("pending", 0) for d in moved.values())

    def _move_counts(self, job_id: str, delta: Mapping[InputState, int]) -> None:
        sets = [f"{_COUNT_COLUMN[state]} = {_COUNT_COLUMN[state]} + ?" for state in delta]
        if not sets:
            return
        self._db.execute(
            f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*delta.values(), job_id)
        )

    def _finish_if_done(self, job_id: str, now: float) -> None:
        """Close an active job whose inputs have all ended (inside the caller's tx)."""
        self._db.execute(
            "UPDATE jobs SET finished_at = ?,"
            " status = CASE WHEN n_done > 0 THEN 'completed' ELSE 'failed' END,"
            " error = CASE WHEN n_done > 0 THEN NULL ELSE 'every input failed' END"
            " WHERE id = ? AND status IN ('queued','running','paused')"
            " AND n_pending = 0 AND n_leased = 0",
            (now, job_id),
        )

    # ---------------------------------------------------------------- results

    def results(
        self, job_id: str, *, offset: int = 0, limit: int = 100, viewer: Viewer | None = None
    ) -> list[ResultItem]:
        """The outcome of inputs ``offset .. offset+limit-1`` of a job, by input index."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        with self._lock:
            self._status(job_id, viewer)
            rows = self._db.execute(
                "SELECT i.idx, i.state, i.attempts, i.last_error, r.result FROM inputs i"
                " LEFT JOIN results r ON r.job_id = i.job_id AND r.idx = i.idx"
                " WHERE i.job_id = ? AND i.idx >= ? ORDER BY i.idx LIMIT ?",
                (job_id, offset, limit),
            ).fetchall()
        return [
            ResultItem(
                index=idx,
                state=state,
                attempts=attempts,
                result=None if result is None else json.loads(result),
                error=error if state in ("failed", "cancelled") else None,
            )
            for idx, state, attempts, error, result in rows
        ]

    # ---------------------------------------------------------------- checking

    def check(self) -> list[str]:
        """Every broken invariant of the stored data, in words; empty when sound."""
        problems: list[str] = []
        with self._lock:
            counted: dict[str, dict[str, int]] = {}
            for job_id, state, n in self._db.execute(
                "SELECT job_id, state, COUNT(*) FROM inputs GROUP BY job_id, state"
            ):
                counted.setdefault(job_id, {})[state] = n
            jobs = self._db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs").fetchall()
            for row in jobs:
                job = _job_from_row(row)
                real = counted.get(job.id, {})
                for state in INPUT_STATES:
                    stored = getattr(job.counts, state)
                    if stored != real.get(state, 0):
                        problems.append(
                            f"{job.id}: {state} count {stored} but {real.get(state, 0)} rows"
                        )
                if sum(real.values()) != job.counts.total:
                    problems.append(
                        f"{job.id}: total {job.counts.total}, {sum(real.values())} rows"
                    )
                unfinished = job.counts.pending + job.counts.leased
                if job.status in ACTIVE_STATUSES and unfinished == 0:
                    problems.append(f"{job.id}: {job.status} with every input ended")
                if job.status in ("completed", "failed") and unfinished:
                    problems.append(f"{job.id}: {job.status} with {unfinished} unfinished")
                if job.status == "cancelled" and job.counts.pending:
                    problems.append(f"{job.id}: cancelled with pending inputs")
            for (n,) in self._db.execute(
                "SELECT COUNT(*) FROM results r JOIN inputs i USING (job_id, idx)"
                " WHERE i.state != 'done'"
            ):
                if n:
                    problems.append(f"{n} result(s) stored for inputs not done")
            for (n,) in self._db.execute(
                "SELECT COUNT(*) FROM inputs i LEFT JOIN results r USING (job_id, idx)"
                " WHERE i.state = 'done' AND r.idx IS NULL"
            ):
                if n:
                    problems.append(f"{n} done input(s) without a result")
        return problems


def _after_lease(status: str, attempts: int, max_attempts: int) -> InputState:
    """Where a leased input goes when its attempt ends without a result."""
    if status == "cancelled":
        return "cancelled"
    if attempts >= max_attempts:
        return "failed"
    return "pending"


def _job_from_row(row: Sequence[Any]) -> Job:
    (
        job_id,
        model,
        status,
        created_at,
        started_at,
        finished_at,
        max_attempts,
        metadata,
        error,
        total,
        n_pending,
        n_leased,
        n_done,
        n_failed,
        n_cancelled,
        owner,
    ) = row
    return Job(
        id=job_id,
        model=model,
        status=status,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        max_attempts=max_attempts,
        counts=JobCounts(
            total=total,
            pending=n_pending,
            leased=n_leased,
            done=n_done,
            failed=n_failed,
            cancelled=n_cancelled,
        ),
        metadata=json.loads(metadata),
        error=error,
        owner=owner,
    )
