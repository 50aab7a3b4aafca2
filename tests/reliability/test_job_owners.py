"""Batch jobs belong to the API key that submitted them (``accelmux serve`` subprocesses).

With two API keys, each key lists, reads, pages and cancels only its own jobs; another
key's job answers 404 exactly as a job that does not exist. The admin key (Bearer on
``/v1/jobs``) sees every job. Without API keys jobs have no owner and every caller sees
them. A store written before owners existed is migrated: its jobs have no owner, so with
keys configured only the admin key sees them. The ``accelmux jobs`` CLI sends its key.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.live.support import base_config, fake
from tests.reliability.support import http, running, write_config

from accelmux.jobs.store import DB_NAME

KEY_A = "key-a-0123456789"
KEY_B = "key-b-0123456789"
ADMIN = "admin-0123456789"

#: The jobs store as written before jobs had owners (``PRAGMA user_version`` 1).
SCHEMA_V1 = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, model TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN
        ('queued','running','paused','completed','cancelled','failed')),
    created_at REAL NOT NULL, started_at REAL, finished_at REAL,
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    metadata TEXT NOT NULL DEFAULT '{}', error TEXT, total INTEGER NOT NULL CHECK (total >= 1),
    n_pending INTEGER NOT NULL, n_leased INTEGER NOT NULL DEFAULT 0,
    n_done INTEGER NOT NULL DEFAULT 0, n_failed INTEGER NOT NULL DEFAULT 0,
    n_cancelled INTEGER NOT NULL DEFAULT 0,
    CHECK (n_pending + n_leased + n_done + n_failed + n_cancelled = total)
);
CREATE TABLE inputs (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, idx INTEGER NOT NULL,
    text TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
        ('pending','leased','done','failed','cancelled')),
    attempts INTEGER NOT NULL DEFAULT 0, lease_token TEXT, not_before REAL NOT NULL DEFAULT 0,
    last_error TEXT, PRIMARY KEY (job_id, idx),
    CHECK ((state = 'leased') = (lease_token IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX inputs_by_state ON inputs (job_id, state, idx);
CREATE TABLE results (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, result TEXT NOT NULL,
    completed_at REAL NOT NULL, PRIMARY KEY (job_id, idx),
    FOREIGN KEY (job_id, idx) REFERENCES inputs (job_id, idx) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO jobs (id, model, status, created_at, max_attempts, total, n_pending)
    VALUES ('job_old', 'embed', 'queued', 1764500000, 5, 1, 1);
INSERT INTO inputs (job_id, idx, text) VALUES ('job_old', 0, 'written before owners');
PRAGMA user_version = 1;
"""


def _config(tmp: Path, **server: Any) -> Path:
    cfg = base_config(
        embed={
            "kind": "embeddings",
            "class": "batch",
            "memory": {"weights": "64MiB", "per_unit": "256KiB"},
            # slow: a job is still running when it is cancelled
            "backend": fake(embedding_dim=4, latency_s=5.0),
        }
    )
    cfg["server"].update(server)
    return write_config(cfg, tmp)


def _as(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _submit(url: str, key: str | None, text: str) -> dict[str, Any]:
    status, job, _ = http(
        "POST", url + "/v1/jobs", {"model": "embed", "inputs": [text]}, headers=_as(key)
    )
    assert status == 200, job
    return dict(job)


def _listed(url: str, key: str | None) -> list[str]:
    status, page, _ = http("GET", url + "/v1/jobs?limit=100", headers=_as(key))
    assert status == 200, page
    return [job["id"] for job in page["data"]]


def _cli(url: str, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ACCELMUX_API_KEY"}
    if key is not None:
        env["ACCELMUX_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", "jobs", *args, "--url", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_each_key_sees_only_its_own_jobs_and_the_admin_key_sees_all(tmp_path: Path) -> None:
    config = _config(tmp_path, api_keys=[KEY_A, KEY_B], admin_key=ADMIN)
    with running(config) as d:
        job_a = _submit(d.url, KEY_A, "secret of A")["id"]
        job_b = _submit(d.url, KEY_B, "secret of B")["id"]

        assert _listed(d.url, KEY_A) == [job_a]
        assert _listed(d.url, KEY_B) == [job_b]
        assert _listed(d.url, ADMIN) == [job_b, job_a]

        missing = http("GET", d.url + "/v1/jobs/job_000000000000000000000000", headers=_as(KEY_B))
        for method, path in [
            ("GET", f"/v1/jobs/{job_a}"),
            ("GET", f"/v1/jobs/{job_a}/results"),
            ("POST", f"/v1/jobs/{job_a}/cancel"),
        ]:
            status, body, _ = http(method, d.url + path, headers=_as(KEY_B))
            assert (status, body["error"]["code"]) == (404, "job_not_found"), (path, body)
            assert status == missing[0]
            assert "secret" not in str(body)
        # paging past another key's job is refused like paging past a job that never was
        status, body, _ = http("GET", f"{d.url}/v1/jobs?after={job_a}", headers=_as(KEY_B))
        never = http("GET", f"{d.url}/v1/jobs?after=job_{'0' * 24}", headers=_as(KEY_B))
        assert (status, body["error"]["code"]) == (404, "job_not_found"), body
        assert never[0] == status and never[1]["error"]["code"] == "job_not_found"

        status, page, _ = http("GET", f"{d.url}/v1/jobs/{job_a}/results", headers=_as(KEY_A))
        assert status == 200 and page["total"] == 1, page
        status, job, _ = http("GET", f"{d.url}/v1/jobs/{job_b}", headers=_as(ADMIN))
        assert status == 200 and job["id"] == job_b, job
        status, job, _ = http("POST", f"{d.url}/v1/jobs/{job_b}/cancel", headers=_as(ADMIN))
        assert status == 200 and job["status"] == "cancelled", job
        # the admin key is not an API key anywhere else
        status, body, _ = http("GET", d.url + "/v1/models", headers=_as(ADMIN))
        assert status == 401, body

        # the CLI: $ACCELMUX_API_KEY or --api-key
        listing = _cli(d.url, "list", key=KEY_B)
        assert listing.returncode == 0, listing.stderr
        assert job_b in listing.stdout and job_a not in listing.stdout
        shown = _cli(d.url, "show", job_a, "--api-key", KEY_B)
        assert shown.returncode == 1 and "HTTP 404" in shown.stderr, shown
        shown = _cli(d.url, "show", job_a, key=KEY_A)
        assert shown.returncode == 0 and job_a in shown.stdout, shown.stderr

    # what is stored is a digest of the key, never the key
    db = sqlite3.connect(tmp_path / "data" / "jobs" / DB_NAME)
    try:
        owners = dict(db.execute("SELECT id, owner FROM jobs").fetchall())
    finally:
        db.close()
    assert owners[job_a] == hashlib.sha256(KEY_A.encode()).hexdigest()
    raw = (tmp_path / "data" / "jobs" / DB_NAME).read_bytes()
    assert KEY_A.encode() not in raw and KEY_B.encode() not in raw


def test_without_api_keys_jobs_have_no_owner_and_every_caller_sees_them(tmp_path: Path) -> None:
    with running(_config(tmp_path)) as d:
        job = _submit(d.url, None, "anyone")["id"]
        assert _listed(d.url, None) == [job]
        assert _listed(d.url, "whatever-bearer") == [job]
        status, body, _ = http("GET", f"{d.url}/v1/jobs/{job}", headers=_as("other"))
        assert status == 200, body


def test_a_store_from_before_owners_is_migrated_and_its_jobs_are_the_admins(
    tmp_path: Path,
) -> None:
    jobs_dir = tmp_path / "data" / "jobs"
    jobs_dir.mkdir(parents=True)
    db = sqlite3.connect(jobs_dir / DB_NAME)
    db.executescript(SCHEMA_V1)
    db.close()
    config = _config(tmp_path, api_keys=[KEY_A], admin_key=ADMIN)
    with running(config) as d:
        assert _listed(d.url, KEY_A) == []
        status, body, _ = http("GET", d.url + "/v1/jobs/job_old", headers=_as(KEY_A))
        assert status == 404, body
        assert _listed(d.url, ADMIN) == ["job_old"]
        status, page, _ = http("GET", d.url + "/v1/jobs/job_old/results", headers=_as(ADMIN))
        assert status == 200 and page["total"] == 1, page
        new = _submit(d.url, KEY_A, "after the migration")["id"]
        assert _listed(d.url, KEY_A) == [new]
    db = sqlite3.connect(jobs_dir / DB_NAME)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
        assert db.execute("SELECT owner FROM jobs WHERE id = 'job_old'").fetchone() == (None,)
    finally:
        db.close()
    # the old jobs show again once the keys are gone
    with running(_config(tmp_path)) as d:
        assert "job_old" in _listed(d.url, None)
