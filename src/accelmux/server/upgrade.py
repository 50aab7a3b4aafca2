"""The data in ``server.data_dir`` brought up to this version's schemas, in place, with
a backup first.

Each store under ``data_dir`` keeps its schema version in SQLite's ``user_version``
(:data:`STORES`): the batch jobs (``jobs/jobs.sqlite3``, version 2 since jobs have
owners) and the camera events (``cameras/events.sqlite``, version 1 since versions are
kept; 0 before, the same table). At start, before anything opens them, ``serve`` calls
:func:`upgrade_data_dir`: a store of an older version is copied whole (SQLite's online
backup, so a store in WAL mode is copied consistently) to
``data_dir/backups/<UTC time>-before-<version>/<its path>``, then opened once by its own
class, which migrates it, and its new version is checked. A store of a newer version
than this accelmux knows refuses the start, naming the store and the backups: running
an older accelmux on newer data is not supported (restore a backup made before the
upgrade, or upgrade accelmux again).

Downgrading is never done in place; the backups are kept until the user deletes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from accelmux import __version__
from accelmux.cameras.store import SCHEMA_VERSION as CAMERA_SCHEMA
from accelmux.cameras.store import EventStore
from accelmux.errors import AccelmuxError
from accelmux.jobs.store import DB_NAME, LOCK_NAME, JobStore
from accelmux.jobs.store import SCHEMA_VERSION as JOB_SCHEMA

BACKUPS = "backups"


class DataDirError(AccelmuxError):
    """``data_dir`` holds data this accelmux cannot use or migrate."""


def _migrate_jobs(path: Path) -> None:
    JobStore(path).close()  # the constructor migrates


def _migrate_cameras(path: Path) -> None:
    EventStore.open(path).close()  # opening migrates


@dataclass(frozen=True, slots=True)
class Store:
    """One SQLite store under ``data_dir``: its path there, what it holds, the schema
    version this accelmux writes, and how to migrate an older one (open it once)."""

    relative: str
    holds: str
    version: int
    migrate: Callable[[Path], None]


STORES = (
    Store(f"jobs/{DB_NAME}", "batch jobs", JOB_SCHEMA, _migrate_jobs),
    Store("cameras/events.sqlite", "camera events", CAMERA_SCHEMA, _migrate_cameras),
)


def schema_version(path: Path) -> int:
    """The ``user_version`` of the SQLite file at ``path``."""
    try:
        db = sqlite3.connect(path, timeout=10.0)  # read-only would fail on a left -wal
        try:
            return int(db.execute("PRAGMA user_version").fetchone()[0])
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise DataDirError(f"{path}: not a readable SQLite database ({exc})") from None


@contextlib.contextmanager
def _owning(data_dir: Path) -> Iterator[None]:
    """Hold the lock the jobs store takes, so no other accelmux uses the data meanwhile."""
    lock_dir = data_dir / "jobs"
    if not (lock_dir / DB_NAME).exists():
        yield
        return
    fd = os.open(lock_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirError(
                f"{data_dir}: in use by another accelmux process; stop it before upgrading"
            ) from None
        yield
    finally:
        os.close(fd)


def _backup(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    src = sqlite3.connect(source, timeout=10.0)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def pending(data_dir: Path) -> list[tuple[Store, int]]:
    """Each store under ``data_dir`` of an older version than this accelmux writes, with
    its version; a newer one raises :class:`DataDirError`."""
    found = []
    for store in STORES:
        path = data_dir / store.relative
        if not path.is_file():
            continue
        version = schema_version(path)
        if version > store.version:
            raise DataDirError(
                f"{path}: the {store.holds} were written by a newer accelmux (schema "
                f"{version}; accelmux {__version__} knows {store.version} and older). Run "
                f"that version again, or restore a copy from {data_dir / BACKUPS}"
            )
        if version < store.version:
            found.append((store, version))
    return found


def upgrade_data_dir(data_dir: Path, *, now: Callable[[], float] = time.time) -> list[str]:
    """Back up and migrate every store of ``data_dir`` that is older than this version;
    one notice per store migrated (empty: nothing to do)."""
    if not data_dir.is_dir():
        return []
    with _owning(data_dir):
        todo = pending(data_dir)
        if not todo:
            return []
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
        backup_dir = data_dir / BACKUPS / f"{stamp}-before-{__version__}"
        notices = []
        for store, version in todo:
            path = data_dir / store.relative
            copy = backup_dir / store.relative
            _backup(path, copy)
            store.migrate(path)
            after = schema_version(path)
            if after != store.version:
                raise DataDirError(
                    f"{path}: migrating the {store.holds} left schema {after}, not "
                    f"{store.version}; the data before it is in {copy}"
                )
            notices.append(
                f"data_dir: {store.relative} ({store.holds}) migrated from schema {version} "
                f"to {store.version}; the copy from before is {copy}"
            )
        return notices
