"""The daemon as a real process (``accelmux serve``) fronting a real external child
server (tests/live/upstream_server.py), driven by the official openai client."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.live.support import UPSTREAM, base_config, daemon, fake, pid_alive

MSG = [{"role": "user", "content": "hello there"}]


def _config() -> dict[str, Any]:
    return base_config(
        chat={
            "kind": "chat",
            "concurrency": 2,
            "memory": {
                "weights": "128MiB",
                "kv_per_token": "1KiB",
                "kv_floor": "16MiB",
                "kv_ceiling": "64MiB",
            },
            "backend": {
                "type": "external",
                "argv": [
                    sys.executable,
                    str(UPSTREAM),
                    "--port",
                    "{port}",
                    "--ctx-size",
                    "{ctx_size}",
                    "--parallel",
                    "{parallel}",
                ],
                "startup_timeout_s": 20,
                "stop_grace_s": 3,
            },
        },
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/admin/status", timeout=5) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def _service(url: str, name: str) -> dict[str, Any]:
    return next(s for s in _status(url)["services"] if s["name"] == name)


def _wait(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=20)


@pytest.mark.slow
def test_external_backend_proxy_stream_templating_and_sigterm(tmp_path: Path) -> None:
    with daemon(_config(), tmp_path) as d:
        with _client(d.url) as client:
            r = client.chat.completions.create(model="chat", messages=MSG)
            assert r.choices[0].message.content == "upstream echo: hello there"
            stream = client.chat.completions.create(model="chat", messages=MSG, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert text == "upstream echo: hello there"
            c = client.completions.create(model="chat", prompt="abc")
            assert c.choices[0].text == "upstream echo: abc"
            e = client.embeddings.create(model="embed", input="x")
            assert len(e.data[0].embedding) == 64
        backend = _service(d.url, "chat")["backend"]
        pid, port = backend["pid"], backend["port"]
        assert pid and pid_alive(pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
            upstream = json.load(resp)
        argv = upstream["argv"]
        # A server's context changes only at its next start (declared next_load), so
        # the load takes the ceiling while memory is plenty: 64 MiB / 1 KiB per token.
        assert argv[argv.index("--ctx-size") + 1] == "65536"
        caps = _service(d.url, "chat")["capabilities"]
        assert caps["resize"] == "next_load"
        assert argv[argv.index("--parallel") + 1] == "2"
        assert upstream["cuda_visible_devices"] is None  # virtual device: no GPU pinning
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=20) == 0
        assert not pid_alive(pid), "the child server must be stopped with the daemon"
        log = (d.data_dir / "logs" / "chat.log").read_text()
        assert "upstream listening" in log


@pytest.mark.slow
def test_external_crash_fails_inflight_then_restarts(tmp_path: Path) -> None:
    with daemon(_config(), tmp_path) as d, _client(d.url) as client:
        client.chat.completions.create(model="chat", messages=MSG)
        backend = _service(d.url, "chat")["backend"]
        old_pid, port = backend["pid"], backend["port"]
        outcome: dict[str, Any] = {}

        def slow() -> None:
            try:
                client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "sleep:5"}]
                )
                outcome["status"] = 200
            except openai.APIStatusError as exc:
                outcome["status"] = exc.status_code
                outcome["body"] = exc.body

        thread = threading.Thread(target=slow)
        thread.start()
        _wait(lambda: _service(d.url, "chat")["inflight"] == 1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/crash", method="POST")
        with pytest.raises(OSError):
            urllib.request.urlopen(req, timeout=5)
        thread.join(timeout=20)
        assert outcome["status"] in (502, 503), outcome
        assert outcome["body"]["code"] in ("backend_crashed", "backend_error")
        _wait(lambda: _service(d.url, "chat")["crashes"] == 1)
        # the next request reloads it (after the Manager's backoff)
        r = client.chat.completions.create(model="chat", messages=MSG)
        assert r.choices[0].message.content == "upstream echo: hello there"
        svc = _service(d.url, "chat")
        assert svc["state"] == "loaded" and svc["backend"]["pid"] != old_pid
        reasons = {(x["action"], x["reason"]) for x in _status(d.url)["decisions"]}
        assert ("load", "reload_after_crash") in reasons


def _models(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def _upstream_url(status: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{status['backend']['port']}"


@pytest.mark.slow
def test_external_server_dies_with_a_killed_daemon(tmp_path: Path) -> None:
    with daemon(_config(), tmp_path) as first:
        _wait(lambda: _service(first.url, "chat")["state"] == "loaded")
        old_pid = _service(first.url, "chat")["backend"]["pid"]
        assert pid_alive(old_pid)
        first.proc.kill()  # SIGKILL: accelmux gets no chance to stop its child
        first.proc.wait(timeout=10)
        # The kernel's death signal (PR_SET_PDEATHSIG) ends it, not a later accelmux.
        _wait(lambda: not pid_alive(old_pid), timeout=10)


@pytest.mark.slow
def test_leftover_helper_of_a_killed_daemon_is_stopped_at_next_start(tmp_path: Path) -> None:
    """The server dies with accelmux; a helper process it started does not (no death
    signal of its own): the next start finds it by process group and stops it."""
    config = _config()
    config["services"]["chat"]["backend"]["argv"].append("--helper")
    with daemon(config, tmp_path) as first:
        _wait(lambda: _service(first.url, "chat")["state"] == "loaded")
        chat = _service(first.url, "chat")
        old_pid = chat["backend"]["pid"]
        helper = _models(_upstream_url(chat))["helper_pid"]
        first.proc.kill()
        first.proc.wait(timeout=10)
        _wait(lambda: not pid_alive(old_pid), timeout=10)
        assert pid_alive(helper), "the helper outlives its server"
        with daemon(config, tmp_path) as second, _client(second.url) as client:
            r = client.chat.completions.create(model="chat", messages=MSG)
            assert r.choices[0].message.content == "upstream echo: hello there"
            _wait(lambda: not pid_alive(helper), timeout=10)
            log = (second.data_dir / "logs" / "chat.log").read_text()
            assert f"stopping leftover server pid {old_pid}" in log
