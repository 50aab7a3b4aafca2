"""The daemon tells systemd when it serves, pings its watchdog while healthy, and says
when it stops (``Type=notify``), over the real notification socket protocol."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.live.support import base_config, fake, free_port, live, run
from tests.waiting import async_wait_until, wait_until

from accelmux.runtime import daemon as daemon_module
from accelmux.service.notify import Notifier, keep_alive

from .support import ROOT, clean_env


class NotifySocket:
    """A Unix datagram socket standing in for systemd's: collects every message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, list[str]]] = []

    def read(self) -> list[tuple[float, list[str]]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return self.messages
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def fields(self) -> list[str]:
        return [field for _, fields in self.read() for field in fields]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_the_daemon_notifies_ready_pings_the_watchdog_and_says_it_stops(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    port = free_port()
    config = yaml.safe_load((ROOT / "examples" / "fake-stack.yaml").read_text())
    config["server"] = {"data_dir": str(tmp_path / "data"), "port": port}
    path = tmp_path / "accelmux.yaml"
    path.write_text(yaml.safe_dump(config))
    env = clean_env(
        PYTHONPATH=str(ROOT / "src"),
        NOTIFY_SOCKET=str(notify_socket.path),
        WATCHDOG_USEC="1000000",  # 1 s: a ping every 0.5 s
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelmux", "serve", "-c", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = wait_until(
            lambda: any("READY=1" in f for _, f in notify_socket.read()),
            timeout=60,
            message="READY=1",
        )
        assert ready
        # ready means serving: the gateway answers as soon as READY=1 arrived
        assert _answers(f"http://127.0.0.1:{port}/v1/models")
        fields = notify_socket.fields()
        assert f"MAINPID={proc.pid}" in fields
        assert any(f.startswith("STATUS=serving on http://127.0.0.1:") for f in fields)
        wait_until(
            lambda: notify_socket.fields().count("WATCHDOG=1") >= 3,
            timeout=20,
            message="three watchdog pings",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "STOPPING=1" in notify_socket.fields()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out = proc.stdout.read() if proc.stdout else ""
        if proc.stdout:
            proc.stdout.close()
    assert "accelmux stopped" in out


def test_notifying_is_off_outside_systemd_and_the_variables_leave_the_environment() -> None:
    assert Notifier.from_environment({}) is None
    env = {"NOTIFY_SOCKET": "@abstract", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environment(env)
    assert notifier is not None and env == {}  # children never see them
    assert notifier.address == "\0abstract"
    assert notifier.watchdog_interval_s is None  # PID 1's watchdog, not ours
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier.from_environment(env)
    assert notifier is not None and notifier.watchdog_interval_s == 15.0
    assert Notifier("/nonexistent/socket").ready("x") is False  # never raises


def test_an_unhealthy_daemon_withholds_its_pings_and_says_why(
    notify_socket: NotifySocket,
) -> None:
    notifier = Notifier(str(notify_socket.path), watchdog_usec=100_000)
    problem: list[str | None] = [None]

    async def body() -> None:
        task = asyncio.create_task(keep_alive(notifier, lambda: problem[0]))
        await async_wait_until(lambda: "WATCHDOG=1" in notifier_fields(), message="a ping")
        problem[0] = "the memory sampler has not finished a round for 40 s"
        await async_wait_until(
            lambda: any(f.startswith("STATUS=unhealthy") for f in notifier_fields()),
            message="the unhealthy status",
        )
        mark = len(notify_socket.messages)
        await async_wait_until(
            lambda: len(notify_socket.read()) >= mark + 3, message="three more rounds"
        )
        later = [f for _, fs in notify_socket.messages[mark:] for f in fs]
        assert "WATCHDOG=1" not in later
        task.cancel()

    def notifier_fields() -> list[str]:
        return notify_socket.fields()

    asyncio.run(body())


class _HangingSampler:
    """A device sampler whose measurement blocks until released (a hung monitor)."""

    device = "gpu"

    def __init__(self) -> None:
        self.release = threading.Event()

    def sample(self, services: list[Any]) -> Any:
        self.release.wait(30)
        return None

    def close(self) -> None:
        self.release.set()


def test_a_hung_memory_sampler_is_a_health_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon_module, "SAMPLER_STALL_MIN_S", 0.5)
    cfg = base_config(a={"kind": "embeddings", "backend": fake()})
    cfg["server"]["sample_interval_s"] = 0.05

    async def body() -> None:
        async with live(cfg, tmp=tmp_path, sample=True) as lv:
            rt = lv.runtime
            await async_wait_until(lambda: rt.sampling.last_round_at is not None)
            assert rt.health_problem() is None
            hanging = _HangingSampler()
            rt.samplers = {"gpu": hanging}
            why = await async_wait_until(rt.health_problem, timeout=10, message="a problem")
            assert "memory sampler has not finished a round" in why
            hanging.release.set()
            await async_wait_until(lambda: rt.health_problem() is None, message="health")

    run(body())
