"""Camera events in SQLite: one row per detection in an analysed frame.

Schema version (``PRAGMA user_version``) 1: the ``events`` table below. A store written
before versions were kept (0, the same table) is marked 1 when opened; a store of a
newer version is refused (:class:`CameraStoreError`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from accelmux.errors import AccelmuxError

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    camera TEXT NOT NULL,
    at REAL NOT NULL,
    frame INTEGER NOT NULL,
    video_s REAL NOT NULL,
    label TEXT NOT NULL,
    score REAL NOT NULL,
    box TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_camera ON events (camera, id);
"""
SCHEMA_VERSION = 1


class CameraStoreError(AccelmuxError):
    """The event store cannot be used (written by a newer accelmux)."""


class EventStore:
    """Thread-safe (one connection under a lock); small writes, at most a few per second."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> EventStore:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # owner-only; SQLite gives the -wal and -shm files the database file's mode
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            conn.close()
            raise CameraStoreError(
                f"{path}: schema version {version}, expected {SCHEMA_VERSION} or older "
                "(written by a newer accelmux)"
            )
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return cls(conn)

    def record(self, camera: str, at: float, frame: dict[str, Any]) -> int:
        """Store the detections of one analysed frame; returns how many were stored."""
        rows = [
            (
                camera,
                at,
                int(frame.get("frame", 0)),
                float(frame.get("timestamp_s", 0.0)),
                str(d["label"]),
                float(d["score"]),
                json.dumps(d["box"]),
            )
            for d in frame.get("detections") or []
        ]
        if rows:
            with self._lock:
                self._conn.executemany(
                    "INSERT INTO events (camera, at, frame, video_s, label, score, box) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
        return len(rows)

    def events(
        self,
        camera: str,
        *,
        after_id: int = 0,
        since: float | None = None,
        label: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Events of ``camera`` with id > ``after_id`` (oldest first)."""
        sql = "SELECT id, at, frame, video_s, label, score, box FROM events WHERE camera = ?"
        args: list[Any] = [camera]
        if after_id:
            sql += " AND id > ?"
            args.append(after_id)
        if since is not None:
            sql += " AND at >= ?"
            args.append(since)
        if label:
            sql += " AND label = ?"
            args.append(label)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [
            {
                "id": r[0],
                "object": "camera.event",
                "camera": camera,
                "created_at": r[1],
                "frame": r[2],
                "timestamp_s": r[3],
                "label": r[4],
                "score": r[5],
                "box": json.loads(r[6]),
            }
            for r in rows
        ]

    def count(self, camera: str) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT COUNT(*) FROM events WHERE camera = ?", (camera,)
            ).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
