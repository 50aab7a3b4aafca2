"""Helpers for the live tests: configs, an in-process daemon, a subprocess daemon."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from accelmux.config.load import load_config_data
from accelmux.gateway.app import build_app
from accelmux.runtime.daemon import Runtime

HERE = Path(__file__).parent
UPSTREAM = HERE / "upstream_server.py"
MIB = 1024**2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "fake", "latency_s": 0.0, "load_s": 0.0, "scale": 0.01}
    out.update(kw)
    return out


def base_config(**services: dict[str, Any]) -> dict[str, Any]:
    """A virtual 4 GiB device and the given services (or a small default stack)."""
    if not services:
        services = default_services()
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
        "services": services,
        "policy": {"crash_backoff_s": 0.2, "crash_backoff_max_s": 1.0},
        "server": {"drain_s": 2.0},
    }


def default_services() -> dict[str, dict[str, Any]]:
    return {
        "chat": {
            "kind": "chat",
            "aliases": ["gpt-test"],
            "concurrency": 2,
            "memory": {
                "weights": "512MiB",
                "kv_per_token": "64KiB",
                "kv_floor": "64MiB",
                "kv_ceiling": "256MiB",
            },
            "backend": fake(),
        },
        "completion": {
            "kind": "completion",
            "memory": {"weights": "128MiB", "kv_per_token": "16KiB", "kv_ceiling": "64MiB"},
            "backend": fake(),
        },
        "embed": {
            "kind": "embeddings",
            "class": "batch",
            "memory": {"weights": "64MiB", "per_unit": "1MiB"},
            "backend": fake(),
        },
        "image": {
            "kind": "image",
            "residency": "on-demand",
            "memory": {"weights": "256MiB", "per_unit": "64MiB"},
            "backend": fake(),
        },
        "asr": {
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "memory": {"weights": "64MiB", "per_unit": "1MiB"},
            "backend": fake(),
        },
        "tts": {
            "kind": "tts",
            "class": "realtime",
            "memory": {"weights": "32MiB", "per_unit": "1KiB"},
            "backend": fake(),
        },
        "detect": {
            "kind": "detect",
            "class": "background",
            "memory": {"weights": "32MiB", "per_unit": "8MiB"},
            "backend": fake(),
        },
    }


@dataclass
class Live:
    runtime: Runtime
    url: str
    session: aiohttp.ClientSession
    app: web.Application

    async def post(self, path: str, **kw: Any) -> tuple[int, Any, Any]:
        async with self.session.post(self.url + path, **kw) as resp:
            body = await resp.json(content_type=None)
            return resp.status, body, resp.headers.copy()

    async def post_any(self, path: str, **kw: Any) -> tuple[int, Any]:
        """The status and the JSON answer, or None for an answer of bytes (audio)."""
        async with self.session.post(self.url + path, **kw) as resp:
            if resp.content_type != "application/json":
                await resp.read()
                return resp.status, None
            return resp.status, await resp.json()

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.get(self.url + path, **kw) as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, await resp.text()

    def openai(self, **kw: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw
        )


@contextlib.asynccontextmanager
async def live(
    config: dict[str, Any] | None = None,
    *,
    tmp: Path,
    host: str | None = None,
    sample: bool = False,
    extras: bool = False,
) -> AsyncIterator[Live]:
    """The daemon in this process, on a random loopback port, torn down cleanly."""
    data = copy.deepcopy(config or base_config())
    data.setdefault("server", {})["data_dir"] = str(tmp)
    cfg = load_config_data(data, "test")
    runtime = Runtime(cfg, sample=sample, data_dir=tmp)
    app = build_app(runtime, host=host)
    jobs = None
    if extras:  # the batch-jobs API and the dashboard, as `accelmux serve` mounts them
        from accelmux.server.wiring import mount_dashboard, mount_jobs

        jobs = mount_jobs(app, runtime, tmp)
        mount_dashboard(app, runtime, tmp)
    await runtime.start()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    session = aiohttp.ClientSession()
    if jobs is not None:
        await jobs.start()
    try:
        yield Live(runtime, f"http://127.0.0.1:{port}", session, app)
    finally:
        await session.close()
        if jobs is not None:
            await jobs.stop()
        await runtime.shutdown()
        await runner.cleanup()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def settle(predicate: Any, timeout: float = 5.0) -> None:
    """Wait until ``predicate()`` is true (polling the event loop)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ---- the daemon as a real subprocess ---------------------------------------------------
@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    url: str
    config_path: Path
    data_dir: Path


@contextlib.contextmanager
def daemon(config: dict[str, Any], tmp: Path, *, timeout: float = 20.0) -> Iterator[Daemon]:
    port = free_port()
    data = copy.deepcopy(config)
    data.setdefault("server", {})["data_dir"] = str(tmp / "data")
    path = tmp / "accelmux.yaml"
    path.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelmux.cli", "serve", "-c", str(path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(proc, url, timeout)
        yield Daemon(proc, url, path, tmp / "data")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _wait_health(proc: subprocess.Popen[str], url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"daemon exited with {proc.returncode}: {out}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise AssertionError("daemon did not become healthy")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); check its state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False
