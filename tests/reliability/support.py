"""Helpers of the reliability suite: a real ``accelmux serve`` process that a test may
kill with SIGKILL and start again on the same data directory, and small HTTP calls."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tests.live.support import UPSTREAM, free_port

Json = Any


def external_chat(**backend: Any) -> dict[str, Any]:
    """A pinned chat service run by the fake OpenAI server (``tests/live``'s upstream) as
    an external backend; ``backend`` adds keys to its backend section."""
    return {
        "kind": "chat",
        "residency": "pinned",
        "memory": {"weights": "128MiB"},
        "backend": {
            "type": "external",
            "argv": [sys.executable, str(UPSTREAM), "--port", "{port}"],
            "startup_timeout_s": 30,
            "stop_grace_s": 3,
            **backend,
        },
    }


@dataclass
class Proc:
    """One run of the daemon (a subprocess); its output goes to ``log``."""

    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return int(self.popen.returncode)


def write_config(config: dict[str, Any], tmp: Path, name: str = "accelmux.yaml") -> Path:
    data = dict(config)
    data.setdefault("server", {})
    data["server"] = {"data_dir": str(tmp / "data"), **data["server"]}
    path = tmp / name
    path.write_text(yaml.safe_dump(data))
    return path


def start(
    config_path: Path, *, port: int | None = None, timeout: float = 30.0, log_name: str = "log"
) -> Proc:
    """``accelmux serve -c CONFIG --port PORT`` until /health answers."""
    port = port or free_port()
    log = config_path.parent / f"daemon-{log_name}-{port}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [
                *(sys.executable, "-m", "accelmux.cli", "serve", "-c", str(config_path)),
                *("--port", str(port), "--log-level", "INFO"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while True:
        if popen.poll() is not None:
            raise AssertionError(f"daemon exited with {popen.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError):
            status, _, _ = http("GET", proc.url + "/health", timeout=1)
            if status == 200:
                return proc
        if time.monotonic() > deadline:
            proc.stop()
            raise AssertionError(f"daemon not healthy in {timeout}s: {log.read_text()}")
        time.sleep(0.05)


@contextlib.contextmanager
def running(config_path: Path, **kw: Any) -> Iterator[Proc]:
    proc = start(config_path, **kw)
    try:
        yield proc
    finally:
        proc.stop()


def http(
    method: str,
    url: str,
    body: Json = None,
    *,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 30.0,
) -> tuple[int, Json, dict[str, str]]:
    """One request; answers (status, parsed JSON or text, headers); never raises on 4xx/5xx."""
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, out_headers = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, status, out_headers = exc.read(), exc.code, dict(exc.headers)
    try:
        parsed: Json = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return status, parsed, out_headers


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.05) -> Any:
    """Poll until ``predicate()`` answers something true; answers it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(every)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def service(status: Json, name: str) -> Json:
    return next(s for s in status["services"] if s["name"] == name)
