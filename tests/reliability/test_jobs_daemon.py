"""Durable batch jobs end to end through the daemon (``accelmux serve`` subprocesses):
a SIGKILL in the middle of a 10,000-input embedding job, maintenance windows, cancel,
a backend crash during a job, and the ``accelmux jobs`` CLI."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake
from tests.reliability.conftest import Record
from tests.reliability.support import (
    external_chat,
    http,
    pid_alive,
    running,
    service,
    start,
    wait_for,
    write_config,
)
from tests.waiting import async_wait_until

from accelmux.backends import fake_outputs
from accelmux.jobs.store import DB_NAME

N_INPUTS = 10_000
DIM = 8


def _embed(**backend: Any) -> dict[str, Any]:
    return {
        "kind": "embeddings",
        "class": "batch",
        "memory": {"weights": "64MiB", "per_unit": "256KiB"},
        "backend": fake(embedding_dim=DIM, **backend),
    }


def _job(url: str, job_id: str) -> dict[str, Any]:
    status, job, _ = http("GET", f"{url}/v1/jobs/{job_id}")
    assert status == 200, job
    return dict(job)


def _all_results(url: str, job_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        status, page, _ = http("GET", f"{url}/v1/jobs/{job_id}/results?offset={offset}&limit=1000")
        assert status == 200, page
        out.extend(page["data"])
        if not page["has_more"]:
            return out
        offset = page["next_offset"]


def _expected(text: str) -> list[float]:
    vector: list[float] = json.loads(json.dumps(fake_outputs.embedding(json.dumps(text), DIM)))
    return vector


@pytest.mark.slow
def test_sigkill_mid_job_then_restart_finishes_every_input_once(
    tmp_path: Path, record: Record
) -> None:
    cfg = base_config(embed=_embed(latency_s=0.003), chat=external_chat())
    path = write_config(cfg, tmp_path)
    texts = [f"document {i}: the quick brown fox {i * 7919 % 10007}" for i in range(N_INPUTS)]

    first = start(path, log_name="first")
    try:
        chat = wait_for(lambda: service(http("GET", first.url + "/admin/status")[1], "chat"))
        child = wait_for(
            lambda: service(http("GET", first.url + "/admin/status")[1], "chat")["backend"]["pid"]
        )
        assert chat
        status, job, _ = http("POST", first.url + "/v1/jobs", {"model": "embed", "inputs": texts})
        assert status == 200, job
        job_id = job["id"]
        at_kill = wait_for(
            lambda: (j := _job(first.url, job_id))["request_counts"]["completed"] >= 2500 and j,
            timeout=120,
            every=0.02,
        )
        first.kill9()
    finally:
        first.stop()
    done_at_kill = at_kill["request_counts"]["completed"]
    assert done_at_kill < N_INPUTS, "the job finished before the kill: make the fake slower"
    # The external child dies with the daemon (its parent-death signal), not at the next start.
    wait_for(lambda: not pid_alive(child), timeout=5)
    db_path = tmp_path / "data" / "jobs" / DB_NAME
    with sqlite3.connect(db_path) as db:
        leased_at_kill = db.execute(
            "SELECT COUNT(*) FROM inputs WHERE state = 'leased'"
        ).fetchone()[0]

    started = time.monotonic()
    with running(path, log_name="second") as second:
        job = wait_for(
            lambda: (j := _job(second.url, job_id))["status"] in ("completed", "failed") and j,
            timeout=180,
            every=0.1,
        )
        resumed_s = time.monotonic() - started
        assert job["status"] == "completed", job
        counts = job["request_counts"]
        assert counts["completed"] == N_INPUTS and counts["failed"] == 0, counts
        results = _all_results(second.url, job_id)
        cli = subprocess.run(
            [sys.executable, "-m", "accelmux.cli", "jobs", "show", job_id, "--url", second.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["status"] == "completed"
        new_child = service(http("GET", second.url + "/admin/status")[1], "chat")["backend"]["pid"]
        assert new_child and new_child != child

    indexes = [item["index"] for item in results]
    assert indexes == list(range(N_INPUTS)), "every input exactly once, in order"
    wrong = [i for i, item in enumerate(results) if item["result"] != _expected(texts[i])]
    assert not wrong, f"{len(wrong)} results do not belong to their input, e.g. {wrong[:5]}"
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n, distinct = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT idx) FROM results WHERE job_id = ?", (job_id,)
        ).fetchone()
        not_done = db.execute(
            "SELECT COUNT(*) FROM inputs WHERE job_id = ? AND state != 'done'", (job_id,)
        ).fetchone()[0]
        retried = db.execute(
            "SELECT COUNT(*) FROM inputs WHERE job_id = ? AND attempts > 1", (job_id,)
        ).fetchone()[0]
    assert n == distinct == N_INPUTS and not_done == 0
    record(
        area="jobs",
        case="daemon SIGKILLed mid-way through a 10,000-input embedding job, then restarted",
        expected="job resumes and completes; every input recorded exactly once; the external "
        "child dies with the daemon",
        happened=f"killed at {done_at_kill}/{N_INPUTS} done ({leased_at_kill} leased); the "
        f"external child died with the daemon; the restarted one finished in {resumed_s:.1f}s; "
        f"{N_INPUTS} results, {N_INPUTS} distinct, each the vector of its own input; "
        f"{retried} inputs ran a second time (recorded once)",
        lost="nothing",
        done_at_kill=done_at_kill,
        leased_at_kill=leased_at_kill,
        rerun_inputs=retried,
        resume_s=round(resumed_s, 2),
    )


def _window(start_offset_h: int, length_h: int = 1) -> str:
    """A window that starts ``start_offset_h`` hours from now (local time)."""
    now = datetime.now()
    begin = now + timedelta(hours=start_offset_h)
    end = begin + timedelta(hours=length_h)
    return f"{begin:%H}:00-{end:%H}:00"


@pytest.mark.slow
def test_windows_spare_memory_cancel_and_cli(tmp_path: Path, record: Record) -> None:
    closed = _window(3)  # opens in 3 hours: closed now (and not 1 minute from opening)
    cfg = base_config(
        spare=_embed(latency_s=0.002) | {"windows": [closed]},
        tight=_embed(latency_s=0.002) | {"windows": [closed]},
        open=_embed(latency_s=0.05) | {"windows": [_window(-1, 3)]},
    )
    # Outside its window with spare memory, a batch runs; when a pinned service holds most
    # of the budget, less than policy.spare_fraction stays free: the job is paused.
    path = write_config(cfg, tmp_path)
    cfg_tight = json.loads(json.dumps(cfg))
    cfg_tight["services"]["big"] = {
        "kind": "chat",
        "residency": "pinned",
        "memory": {"weights": "3GiB"},
        "backend": fake(),
    }
    path_tight = write_config(cfg_tight, tmp_path, "tight.yaml")
    inputs = [f"t{i}" for i in range(200)]
    with running(path, log_name="windows") as d:
        status, spare_job, _ = http(
            "POST", d.url + "/v1/jobs", {"model": "spare", "inputs": inputs}
        )
        assert status == 200
        done = wait_for(lambda: (j := _job(d.url, spare_job["id"]))["status"] == "completed" and j)
        assert done["request_counts"]["completed"] == 200
        # cancel: the in-window job is slow enough to cancel half-way
        status, slow, _ = http(
            "POST", d.url + "/v1/jobs", {"model": "open", "inputs": [f"s{i}" for i in range(2000)]}
        )
        assert status == 200
        wait_for(lambda: _job(d.url, slow["id"])["request_counts"]["completed"] >= 64)
        cli = subprocess.run(
            [sys.executable, "-m", "accelmux.cli", "jobs", "cancel", slow["id"], "--url", d.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        cancelled = wait_for(
            lambda: (j := _job(d.url, slow["id"]))["request_counts"]["in_progress"] == 0 and j
        )
        assert cancelled["status"] == "cancelled", cancelled
        c = cancelled["request_counts"]
        assert c["completed"] + c["cancelled"] == 2000 and c["cancelled"] > 0, c
        results = _all_results(d.url, slow["id"])
        assert sum(1 for r in results if r["status"] == "completed") == c["completed"]
    with running(path_tight, log_name="tight") as d:
        status, tight_job, _ = http(
            "POST", d.url + "/v1/jobs", {"model": "tight", "inputs": inputs}
        )
        assert status == 200
        paused = wait_for(lambda: (j := _job(d.url, tight_job["id"]))["status"] == "paused" and j)
        time.sleep(1.0)
        paused = _job(d.url, tight_job["id"])
        assert paused["status"] == "paused" and paused["request_counts"]["completed"] == 0
    record(
        area="jobs",
        case="maintenance windows, spare memory, cancel",
        expected="outside its window a job runs only with spare memory; a cancelled job "
        "stops and keeps the results it had",
        happened=f"outside its window with spare memory: 200/200 done; with a pinned 3 GiB "
        f"service on the 4 GiB device: paused, 0 done; cancel after {c['completed']} of 2000: "
        f"{c['cancelled']} cancelled, {c['completed']} results kept",
        lost="nothing (cancelled inputs were never run)",
    )


@pytest.mark.slow
def test_backend_crash_during_a_job_loses_nothing(tmp_path: Path, record: Record) -> None:
    cfg = base_config(embed=_embed(latency_s=0.01, crash_after_requests=5))
    path = write_config(cfg, tmp_path)
    texts = [f"c{i}" for i in range(600)]
    with running(path, log_name="crash") as d:
        status, job, _ = http("POST", d.url + "/v1/jobs", {"model": "embed", "inputs": texts})
        assert status == 200
        job = wait_for(
            lambda: (j := _job(d.url, job["id"]))["status"] == "completed" and j, timeout=60
        )
        results = _all_results(d.url, job["id"])
        _, st, _ = http("GET", d.url + "/admin/status")
        embed = service(st, "embed")
    assert [r["index"] for r in results] == list(range(600))
    assert all(r["result"] == _expected(texts[r["index"]]) for r in results)
    assert embed["crashes"] >= 1, embed
    retried = sum(1 for r in results if r["attempts"] > 1)
    record(
        area="jobs",
        case="embeddings backend crashes during a 600-input job",
        expected="the failed batch is retried after the restart; every input once",
        happened=f"{embed['crashes']} crash, service restarted; 600/600 done, "
        f"{retried} inputs retried",
        lost="nothing",
    )


@pytest.mark.slow
def test_outside_window_a_job_waits_while_a_higher_class_waits(
    tmp_path: Path, record: Record
) -> None:
    from tests.live.support import live, run

    cfg = base_config(
        embed=_embed() | {"windows": [_window(3)]},
        chat={
            "kind": "chat",
            "concurrency": 1,
            "memory": {"weights": "64MiB"},
            "backend": fake(latency_s=1.5),
        },
    )
    msg = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def body() -> None:
        import asyncio

        async with live(cfg, tmp=tmp_path, extras=True) as lv:
            chats = [asyncio.create_task(lv.post("/v1/chat/completions", json=msg))]
            await async_wait_until(
                lambda: len(lv.runtime.manager.world.services["chat"].inflight) == 1,
                message="the first chat request to run",
            )
            chats.append(asyncio.create_task(lv.post("/v1/chat/completions", json=msg)))
            await async_wait_until(  # the second chat request waits (interactive)
                lambda: lv.runtime.manager.world.waiting, message="the second chat to wait"
            )
            status, job, _ = await lv.post(
                "/v1/jobs", json={"model": "embed", "inputs": [f"w{i}" for i in range(50)]}
            )
            assert status == 200

            async def job_paused() -> Any:
                _, job_now = await lv.get(f"/v1/jobs/{job['id']}")
                return job_now["status"] == "paused" and job_now

            held = await async_wait_until(job_paused, message="the job to be held (paused)")
            assert held["status"] == "paused" and held["request_counts"]["completed"] == 0, held
            assert [a[0] for a in await asyncio.gather(*chats)] == [200, 200]
            for _ in range(200):  # the runner looks again within idle_poll_s (5 s)
                _, done = await lv.get(f"/v1/jobs/{job['id']}")
                if done["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
            assert done["status"] == "completed", done
            record(
                area="jobs",
                case="outside its window, a job meets a waiting interactive request",
                expected="no batch starts while a higher class waits; it runs once none does",
                happened="job paused (0 done) while a chat request waited; completed 50/50 "
                "after the chat queue emptied",
            )

    run(body())
