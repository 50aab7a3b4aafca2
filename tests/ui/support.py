"""Support code of the UI tests: a live daemon in a background thread, with the dashboard
mounted, and a headless Chromium driven by Selenium."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from tests.real.support import missing

from accelmux.config.load import load_config_data
from accelmux.dashboard import routes
from accelmux.gateway.app import build_app
from accelmux.jobs.http import job_routes
from accelmux.jobs.store import JobStore
from accelmux.runtime.daemon import Runtime
from accelmux.server.plan_api import plan_routes

T = TypeVar("T")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def need_browser() -> None:
    """Fail the calling test unless Chromium, chromedriver and selenium are installed
    (skip it instead under ``ACCELMUX_SKIP_MODELS=1``); scripts/test installs them."""
    if CHROMIUM is None:
        missing("chromium", "apt-get install -y chromium chromium-driver")
    if CHROMEDRIVER is None:
        missing("chromedriver", "apt-get install -y chromium-driver")
    if importlib.util.find_spec("selenium") is None:
        missing("selenium", "pip install -e '.[dev]'")


def need_tmux() -> str:
    """The path of tmux; fails the calling test when it is not installed (skips it
    under ``ACCELMUX_SKIP_MODELS=1``)."""
    tmux = shutil.which("tmux")
    if tmux is None:
        missing("tmux", "apt-get install -y tmux")
    return tmux


def closed_window() -> str:
    """A maintenance window that opens two hours from now, local time: closed during a
    test whenever it runs."""
    now = time.localtime()
    start = (now.tm_hour + 2) % 24
    end = (now.tm_hour + 3) % 24
    return f"{start:02d}:00-{end:02d}:00"


def stack_config() -> dict[str, Any]:
    """A small stack on a virtual 8 GiB device: chat, embeddings, image, asr, tts, detect."""

    def fake(**kw: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "fake", "latency_s": 0.0, "load_s": 0.0, "scale": 0.01}
        out.update(kw)
        return out

    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "8GiB", "headroom": "512MiB"}},
        "services": {
            "chat": {
                "kind": "chat",
                "aliases": ["gpt-test"],
                "concurrency": 2,
                "queue": {"limit": 1, "deadline_s": 10},
                "memory": {
                    "weights": "2GiB",
                    "runtime": "256MiB",
                    "kv_per_token": "64KiB",
                    "kv_floor": "256MiB",
                    "kv_ceiling": "1GiB",
                },
                "backend": fake(latency_s=0.05),
            },
            "embeddings": {
                "kind": "embeddings",
                "class": "batch",
                "residency": "on-demand",
                "windows": [closed_window()],
                "memory": {"weights": "512MiB", "runtime": "64MiB", "per_unit": "1MiB"},
                "backend": fake(),
            },
            "image": {
                "kind": "image",
                "residency": "on-demand",
                "memory": {"weights": "2GiB", "runtime": "256MiB", "per_unit": "512MiB"},
                "backend": fake(latency_s=0.05),
            },
            "asr": {
                "kind": "asr",
                "class": "realtime",
                "residency": "pinned",
                "memory": {"weights": "300MiB", "runtime": "64MiB", "per_unit": "2MiB"},
                "backend": fake(),
            },
            "tts": {
                "kind": "tts",
                "class": "realtime",
                "residency": "pinned",
                "memory": {"weights": "100MiB", "runtime": "32MiB", "per_unit": "16KiB"},
                "backend": fake(),
            },
            "detect": {
                "kind": "detect",
                "class": "background",
                "memory": {"weights": "200MiB", "runtime": "64MiB", "per_unit": "64MiB"},
                "backend": fake(),
            },
        },
        "policy": {"crash_backoff_s": 0.2, "crash_backoff_max_s": 1.0},
        "server": {"drain_s": 1.0},
    }


class LiveDaemon:
    """The daemon (Runtime + gateway + dashboard + jobs API) on its own event loop thread."""

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        self.config = copy.deepcopy(config)
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ui-daemon", daemon=True)
        self.url = ""
        self.runtime: Runtime | None = None
        self.store: JobStore | None = None
        self.session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        self.config.setdefault("server", {})["data_dir"] = str(self.data_dir)
        cfg = load_config_data(self.config, "ui-test")
        self.runtime = Runtime(cfg, sample=False, data_dir=self.data_dir)
        await self.runtime.start()
        app = build_app(self.runtime, host="127.0.0.1")
        paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
        if "/" not in paths:
            routes(app, self.runtime.status, period_s=0.5)
        if "/admin/plan" not in paths:  # the plan page's API, mounted with the dashboard
            app.add_routes(plan_routes(self.data_dir))
        if "/v1/jobs" not in paths:
            self.store = JobStore.open(self.data_dir / "jobs")
            app.add_routes(job_routes(self.store, None, models=lambda: list(cfg.services)))
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self.session = aiohttp.ClientSession()

    async def _stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.runtime is not None:
            await self.runtime.shutdown()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.store is not None:
            self.store.close()

    def stop(self) -> None:
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    # ---- HTTP from inside the daemon's loop --------------------------------------------
    async def post(self, path: str, **kw: Any) -> tuple[int, Any, CIMultiDict[str]]:
        assert self.session is not None
        async with self.session.post(self.url + path, **kw) as resp:
            return resp.status, await resp.json(content_type=None), CIMultiDict(resp.headers)

    async def get(self, path: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.url + path) as resp:
            return await resp.json(content_type=None)

    def status(self) -> dict[str, Any]:
        assert self.runtime is not None
        rt = self.runtime
        return asyncio.run_coroutine_threadsafe(_now(rt.status), self.loop).result(10)

    def service_state(self, name: str) -> str:
        for svc in self.status()["services"]:
            if svc["name"] == name:
                return str(svc["state"])
        raise KeyError(name)


async def _now(fn: Callable[[], T]) -> T:
    return fn()


@contextlib.contextmanager
def live_daemon(config: dict[str, Any] | None = None) -> Iterator[LiveDaemon]:
    with tempfile.TemporaryDirectory(prefix="accelmux-ui-") as tmp:
        d = LiveDaemon(config or stack_config(), Path(tmp))
        d.start()
        try:
            yield d
        finally:
            d.stop()


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout}s: {what or predicate}")


def script_errors(driver: Any) -> list[str]:
    """JavaScript errors the page logged since the last call (network noise left out)."""
    return [
        str(entry["message"])
        for entry in driver.get_log("browser")
        if entry.get("level") == "SEVERE" and entry.get("source") == "javascript"
    ]


@contextlib.contextmanager
def chromium(width: int = 1500, height: int = 1400, flags: tuple[str, ...] = ()) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM is not None and CHROMEDRIVER is not None
    with tempfile.TemporaryDirectory(prefix="accelmux-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in (*BROWSER_FLAGS, *flags):
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={profile}")
        opts.add_argument(f"--window-size={width},{height}")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path=CHROMEDRIVER)
        driver = webdriver.Chrome(options=opts, service=service)
        try:
            driver.set_page_load_timeout(20)
            yield driver
        finally:
            driver.quit()
