"""A data_dir the previous schema wrote is migrated in place, after a backup, by the
daemon that starts on it; newer data refuses the start instead of being damaged."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.live.support import base_config, daemon, fake
from tests.waiting import wait_until

from accelmux.server.upgrade import BACKUPS, DataDirError, pending, upgrade_data_dir

from .support import ROOT, clean_env

PREVIOUS = Path(__file__).parent / "data" / "data_dir-jobs1"
JOBS = Path("jobs") / "jobs.sqlite3"
EVENTS = Path("cameras") / "events.sqlite"


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def _dump(path: Path) -> list[str]:
    """Every row and table definition, without the version (what a backup must keep)."""
    db = sqlite3.connect(path)
    try:
        return list(db.iterdump())
    finally:
        db.close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def _previous_data_dir(tmp_path: Path) -> Path:
    """The previous schema's data_dir, made from its committed SQL text
    (make_previous_data_dir.py) as the old stores left it: WAL mode, owner-only."""
    data = tmp_path / "data"
    for sql in PREVIOUS.rglob("*.sql"):
        path = data / sql.relative_to(PREVIOUS).with_suffix("")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(path)
        db.executescript(sql.read_text())
        db.execute("PRAGMA journal_mode=WAL")
        db.close()
    return data


def _config() -> dict[str, Any]:
    return base_config(embeddings={"kind": "embeddings", "backend": fake()})


def test_the_daemon_migrates_the_previous_schema_in_place_after_a_backup(tmp_path: Path) -> None:
    data = _previous_data_dir(tmp_path)
    original = {name: _dump(data / name) for name in (JOBS, EVENTS)}
    assert (_version(data / JOBS), _version(data / EVENTS)) == (1, 0)
    with daemon(_config(), tmp_path, timeout=60) as d:
        jobs = {j["id"]: j for j in _get(d.url + "/v1/jobs")["data"]}
        assert set(jobs) == {"job_done", "job_half", "job_cancelled"}
        assert jobs["job_done"]["status"] == "completed"
        assert jobs["job_done"]["metadata"] == {"source": "notes"}
        done = _get(d.url + "/v1/jobs/job_done/results")["data"]
        assert [item["result"] for item in done] == [
            {"embedding": [0.5, 0.25]},
            {"embedding": [0.5, 0.5]},
        ]
        # the job left half done (one input leased when the old daemon stopped) finishes
        half = wait_until(
            lambda: (j := _get(d.url + "/v1/jobs/job_half"))["status"] == "completed" and j,
            timeout=30,
            message="the half-done job to finish",
        )
        assert half["request_counts"]["completed"] == 4
        kept = _get(d.url + "/v1/jobs/job_half/results")["data"]
        assert [item["result"] for item in kept[:2]] == [{"embedding": [0.0]}, {"embedding": [1.0]}]
        assert jobs["job_cancelled"]["status"] == "cancelled"
    (backup,) = (data / BACKUPS).iterdir()
    assert backup.name.endswith("-before-0.1.0")
    # the copies are the data as it was: same rows and tables, the old versions
    assert _version(backup / JOBS) == 1 and _version(backup / EVENTS) == 0
    assert _dump(backup / JOBS) == original[JOBS]
    assert _dump(backup / EVENTS) == original[EVENTS]
    assert (backup / JOBS).stat().st_mode & 0o777 == 0o600
    assert (_version(data / JOBS), _version(data / EVENTS)) == (2, 1)
    # a second start finds nothing to migrate and makes no second backup
    with daemon(_config(), tmp_path, timeout=60) as d:
        assert len(_get(d.url + "/v1/jobs")["data"]) == 3
    assert len(list((data / BACKUPS).iterdir())) == 1


def test_the_upgrade_is_logged_with_where_the_backup_is(tmp_path: Path) -> None:
    data = _previous_data_dir(tmp_path)
    notices = upgrade_data_dir(data, now=lambda: 1_790_000_000.0)
    backup = data / BACKUPS / "20260921T141320Z-before-0.1.0"
    assert notices == [
        f"data_dir: jobs/jobs.sqlite3 (batch jobs) migrated from schema 1 to 2; the copy "
        f"from before is {backup / JOBS}",
        f"data_dir: cameras/events.sqlite (camera events) migrated from schema 0 to 1; the "
        f"copy from before is {backup / EVENTS}",
    ]
    assert pending(data) == [] and upgrade_data_dir(data) == []


def test_data_of_a_newer_accelmux_refuses_the_start_and_is_left_alone(tmp_path: Path) -> None:
    data = _previous_data_dir(tmp_path)
    with sqlite3.connect(data / JOBS) as db:
        db.execute("PRAGMA user_version=7")
    before = _dump(data / JOBS)
    config = _config()
    config["server"]["data_dir"] = str(data)
    path = tmp_path / "accelmux.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "accelmux", "serve", "-c", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PYTHONPATH=str(ROOT / "src")),
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "written by a newer accelmux (schema 7" in done.stderr
    assert str(data / JOBS) in done.stderr and "Traceback" not in done.stderr
    assert _version(data / JOBS) == 7 and _dump(data / JOBS) == before
    assert not (data / BACKUPS).exists()


def test_a_data_dir_in_use_is_not_migrated_under_its_owner(tmp_path: Path) -> None:
    data = _previous_data_dir(tmp_path)
    fd = os.open(data / "jobs" / "jobs.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(DataDirError, match="in use by another accelmux process"):
            upgrade_data_dir(data)
    finally:
        os.close(fd)
    assert _version(data / JOBS) == 1 and not (data / BACKUPS).exists()


def test_a_new_or_current_data_dir_needs_nothing(tmp_path: Path) -> None:
    assert upgrade_data_dir(tmp_path / "missing") == []
    assert upgrade_data_dir(tmp_path) == []
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "jobs.sqlite3").write_bytes(b"not a database at all, clearly")
    with pytest.raises(DataDirError, match="not a readable SQLite database"):
        upgrade_data_dir(tmp_path)
