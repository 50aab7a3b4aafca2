"""A worker killed with SIGKILL at random moments still records every result exactly once."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from accelmux.jobs import JobStore
from accelmux.jobs.store import DB_NAME

WORKER = Path(__file__).with_name("kill_worker.py")
N_INPUTS = 10_000


def start_worker(data_dir: Path, seed: int) -> subprocess.Popen[str]:
    log = data_dir / "worker.log"
    with log.open("a") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(data_dir), str(seed)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", log.read_text()
    return proc


def snapshot(db_path: Path) -> tuple[int, int]:
    """(done, leased) as another process sees them."""
    db = sqlite3.connect(db_path, timeout=10.0)
    try:
        done = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        leased = db.execute("SELECT COUNT(*) FROM inputs WHERE state = 'leased'").fetchone()[0]
    finally:
        db.close()
    return done, leased


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("ACCELMUX_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    texts = [f"document {i}: {rng.random():.12f}" for i in range(N_INPUTS)]
    with JobStore.open(tmp_path, max_attempts=50) as store:
        job_id = store.create_job("embed", texts).id
    db_path = tmp_path / DB_NAME

    kills = rng.choice([2, 3])
    progress: list[tuple[int, int]] = []
    for round_ in range(kills):
        proc = start_worker(tmp_path, seed + round_)
        time.sleep(rng.uniform(0.1, 0.8))
        assert proc.poll() is None, f"seed {seed}: the worker ended before the kill"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        progress.append(snapshot(db_path))

    proc = start_worker(tmp_path, seed + kills)
    proc.communicate(timeout=60)
    assert proc.returncode == 0, f"seed {seed}: {(tmp_path / 'worker.log').read_text()}"

    done_counts = [done for done, _ in progress]
    assert done_counts == sorted(done_counts), f"seed {seed}: {progress}"
    assert all(done < N_INPUTS for done in done_counts), f"seed {seed}: {progress}"
    assert any(leased for _, leased in progress), f"seed {seed}: never killed mid-batch"

    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = db.execute(
            "SELECT idx, result FROM results WHERE job_id = ? ORDER BY idx", (job_id,)
        ).fetchall()
    finally:
        db.close()
    assert len(rows) == N_INPUTS, f"seed {seed}"
    assert [idx for idx, _ in rows] == list(range(N_INPUTS)), f"seed {seed}"
    for idx, result in rows:
        expected = hashlib.sha256(texts[idx].encode()).hexdigest()
        assert result == f'"{expected}"', f"seed {seed}: input {idx}"

    with JobStore.open(tmp_path) as store:
        job = store.get_job(job_id)
        assert job.status == "completed", f"seed {seed}"
        assert job.counts.done == N_INPUTS
        assert store.check() == []
