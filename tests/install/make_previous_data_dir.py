"""Make the data_dir the previous schema wrote, with that release's own code.

    python tests/install/make_previous_data_dir.py tests/install/data/data_dir-jobs1

It takes the job and camera stores from the commit before jobs had owners
(:data:`COMMIT`: jobs schema 1, camera events without a version) out of git, runs them
against a new directory and writes: one completed job with its results, one job half
done (two inputs done, one leased when the daemon "stopped", one pending), one cancelled
job, and three camera events. Each database is kept as its SQL text (``<path>.sql``:
its ``user_version``, then SQLite's dump of every table and row), which the test of the
upgrade (tests/install/test_upgrade.py) turns back into the files and starts today's
daemon on. The text is committed; this script is how it was made.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The last commit whose jobs store wrote schema 1 (35f8d5a added owners, schema 2).
COMMIT = "35f8d5a^"

MAKE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from accelmux.jobs.store import JobStore
    from accelmux.cameras.store import EventStore

    out = Path(sys.argv[1])
    clock = iter(float(1_780_000_000 + i) for i in range(1000))
    store = JobStore.open(out / "jobs", clock=lambda: next(clock))
    done = store.create_job("embeddings", ["a cat", "a kitten"], job_id="job_done",
                            metadata={"source": "notes"})
    lease = store.claim(done.id, 10)
    store.complete(lease, {0: {"embedding": [0.5, 0.25]}, 1: {"embedding": [0.5, 0.5]}})
    half = store.create_job("embeddings", ["one", "two", "three", "four"], job_id="job_half")
    lease = store.claim(half.id, 2)
    store.complete(lease, {i: {"embedding": [float(i)]} for i in lease.indexes})
    store.claim(half.id, 1)  # leased when the daemon stopped
    gone = store.create_job("embeddings", ["never"], job_id="job_cancelled")
    store.cancel_job(gone.id)
    store.close()
    events = EventStore.open(out / "cameras" / "events.sqlite")
    for i in range(3):
        frame = {"frame": i, "timestamp_s": i / 2,
                 "detections": [{"label": "person", "score": 0.9, "box": [1, 2, 3, 4]}]}
        events.record("porch", 1_780_000_100.0 + i, frame)
    events.close()
    """
)


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", COMMIT, "src"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        env = {"PYTHONPATH": str(Path(tmp) / "src"), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", MAKE, str(out)], env=env, check=True)
    for path in sorted(out.rglob("*")):
        if path.name.endswith(("-wal", "-shm")) or path.name == "jobs.lock":
            path.unlink()
    for path in sorted(out.rglob("*.sqlite*")):
        db = sqlite3.connect(path)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        lines = [f"PRAGMA user_version={version};", *db.iterdump()]
        db.close()
        path.with_name(path.name + ".sql").write_text("\n".join(lines) + "\n")
        path.unlink()
        print(path.relative_to(out), f"schema {version}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
