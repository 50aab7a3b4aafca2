from __future__ import annotations

import argparse
import asyncio
import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from accelmux.jobs import JobStore
from accelmux.jobs.command import register
from accelmux.jobs.http import job_routes


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path / "data")
    yield s
    s.close()


@pytest.fixture
def url(store: JobStore) -> Iterator[str]:
    """A jobs API served from a thread (the CLI under test blocks on urllib)."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        app = web.Application()
        app.add_routes(job_routes(store, None))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        stop = asyncio.Event()
        state["port"] = runner.addresses[0][1]
        state["stop"] = (asyncio.get_running_loop(), stop)
        started.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{state['port']}"
    loop, stop = state["stop"]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="accelmux")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_submit_list_show_results_cancel(
    url: str, store: JobStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "inputs.txt"
    source.write_text("first line\n\nsecond line\r\nthird line\n", encoding="utf-8")
    assert cli("jobs", "submit", "--url", url, "--model", "embed", str(source)) == 0
    out = capsys.readouterr().out
    job_id = out.split(":")[0]
    assert out == f"{job_id}: 3 input(s) for embed, status queued\n"

    lease = store.claim(job_id, 2)
    assert lease is not None
    store.complete(lease, {0: [0.5], 1: [1.5]})

    assert cli("jobs", "list", "--url", url) == 0
    assert capsys.readouterr().out == f"{job_id}  running    embed  2/3 done\n"

    assert cli("jobs", "show", "--url", url, job_id) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == job_id and shown["request_counts"]["completed"] == 2

    assert cli("jobs", "results", "--url", url, "--all", "--limit", "2", job_id) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(item["index"], item["status"], item["result"]) for item in lines] == [
        (0, "completed", [0.5]),
        (1, "completed", [1.5]),
        (2, "pending", None),
    ]

    assert cli("jobs", "cancel", "--url", url, job_id) == 0
    assert "cancelled" in capsys.readouterr().out
    assert store.get_job(job_id).status == "cancelled"


def test_submit_reads_stdin(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("a\nb\n"))
    assert cli("jobs", "submit", "--url", url, "--model", "embed", "-") == 0
    assert "2 input(s)" in capsys.readouterr().out


def test_api_errors_are_one_line(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("jobs", "show", "--url", url, "job_missing") == 1
    err = capsys.readouterr().err
    assert err == "accelmux jobs: HTTP 404: no job with id 'job_missing' [id]\n"

    assert cli("jobs", "submit", "--url", url, "--model", "e", str(tmp_path / "nope.txt")) == 1
    assert "cannot read" in capsys.readouterr().err

    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert cli("jobs", "submit", "--url", url, "--model", "e", str(blank)) == 1
    assert "no inputs" in capsys.readouterr().err


def test_daemon_not_running_is_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert cli("jobs", "list", "--url", f"http://127.0.0.1:{port}") == 1
    err = capsys.readouterr().err
    assert "cannot reach the daemon" in err and "connection refused" in err
    assert "Traceback" not in err


def test_jobs_without_action_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("jobs") == 2
    assert "submit" in capsys.readouterr().out
