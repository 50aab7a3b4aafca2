"""Everything accelmux writes under ``server.data_dir`` is the owner's alone: files 0600,
directories 0700 (the jobs database holds input texts, logs hold a server's output). A
looser file or directory an earlier version left there is tightened at start, with a log
line naming it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.live.support import base_config
from tests.reliability.support import external_chat, http, running, wait_for, write_config

from accelmux.cameras.store import EventStore
from accelmux.jobs.store import JobStore


def _loose(root: Path) -> dict[str, str]:
    """Every path under ``root`` (and ``root``) that group or others may use, with its mode."""
    found: dict[str, str] = {}
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_IMODE(mode) & 0o077:
            found[str(path.relative_to(root.parent))] = oct(stat.S_IMODE(mode))
    return found


def test_every_file_under_data_dir_is_private_after_a_daemon_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # what an earlier version left: a world-readable directory, log and database
    (data / "logs").mkdir(parents=True)
    (data / "jobs").mkdir()
    os.chmod(data, 0o755)
    os.chmod(data / "logs", 0o755)
    old_log = data / "logs" / "ext.log"
    old_log.write_text("old output\n")
    os.chmod(old_log, 0o644)

    cfg = base_config()
    cfg["services"]["ext"] = external_chat()
    path = write_config(cfg, tmp_path)
    with running(path, timeout=60) as d:
        status, job, _ = http(
            "POST", d.url + "/v1/jobs", {"model": "embed", "inputs": ["private text"] * 3}
        )
        assert status == 200, job

        def finished() -> bool:
            _, now, _ = http("GET", f"{d.url}/v1/jobs/{job['id']}")
            return bool(now["status"] == "completed")

        wait_for(finished, timeout=60)
        status, out, _ = http(
            "POST",
            d.url + "/v1/chat/completions",
            {"model": "ext", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert status == 200, out
        written = sorted(str(p.relative_to(data)) for p in data.rglob("*"))
        assert "jobs/jobs.sqlite3-wal" in written and "run/ext.pid" in written, written
        assert _loose(data) == {}, written
    assert _loose(data) == {}
    log = d.log.read_text()
    assert "tightened" in log and "logs/ext.log" in log, log


def test_stores_create_private_files(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "jobs")
    store.create_job("embed", ["text"])
    events = EventStore.open(tmp_path / "cameras" / "events.sqlite")
    try:
        assert _loose(tmp_path / "jobs") == {}
        assert _loose(tmp_path / "cameras") == {}
    finally:
        store.close()
        events.close()
