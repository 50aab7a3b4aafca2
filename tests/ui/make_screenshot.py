"""Render ``docs/dashboard.png``: the dashboard of a live daemon (fake backends) under load.

    .venv/bin/python -m tests.ui.make_screenshot [--out docs/dashboard.png] [--seconds 45]

It starts the daemon with the UI test stack, drives chat, speech, image and embedding
traffic through the OpenAI endpoints for ``--seconds`` (bursts that queue and get 429,
an image model that loads and unloads, a foreign process whose memory comes and goes,
allocator cache above the estimates), leaves a half-done batch job, opens the page in
headless Chromium, clicks a refused request so its explanation shows, and saves a
full-page screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import math
import random
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from tests.ui.support import LiveDaemon, chromium, live_daemon, stack_config, wait_until

from accelmux.core.events import MemorySampled

MIB = 1024**2
GIB = 1024**3
ROOT = Path(__file__).resolve().parents[2]
MSG = [{"role": "user", "content": "summarise the camera events of today"}]


def screenshot_config() -> dict[str, Any]:
    cfg = stack_config()
    svc = cfg["services"]
    svc["chat"]["backend"].update(latency_s=2.0)
    svc["chat"]["queue"] = {"limit": 2, "deadline_s": 10}
    svc["image"]["backend"].update(latency_s=1.2, load_s=0.8)
    svc["image"]["ttl_s"] = 8
    svc["tts"]["backend"].update(latency_s=0.15)
    svc["detect"]["backend"].update(latency_s=0.05)
    return cfg


async def _chat(d: LiveDaemon, stop: float, rng: random.Random, burst: bool) -> None:
    while time.monotonic() < stop:
        n = rng.randint(3, 6) if burst else 1
        body = {"model": "chat", "messages": MSG, "max_tokens": rng.choice([64, 256, 1024])}
        await asyncio.gather(
            *(d.post("/v1/chat/completions", json=body) for _ in range(n)),
            return_exceptions=True,
        )
        await asyncio.sleep(rng.uniform(0.5, 2.5) if burst else rng.uniform(0.1, 0.6))


async def _speech(d: LiveDaemon, stop: float, rng: random.Random) -> None:
    while time.monotonic() < stop:
        body = {"model": "tts", "input": "The front door is open.", "voice": "default"}
        with contextlib.suppress(Exception):
            await d.post("/v1/audio/speech", json=body)
        await asyncio.sleep(rng.uniform(0.3, 1.5))


async def _images(d: LiveDaemon, stop: float, rng: random.Random) -> None:
    await asyncio.sleep(4)
    while time.monotonic() < stop:
        body = {"model": "image", "prompt": "a cat on a sofa", "size": "512x512"}
        for _ in range(rng.randint(1, 3)):
            with contextlib.suppress(Exception):
                await d.post("/v1/images/generations", json=body)
        await asyncio.sleep(rng.uniform(6, 12))


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\x40\x80\xc0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


async def _detect(d: LiveDaemon, stop: float) -> None:
    frame = base64.b64encode(_png(640, 480)).decode()
    body = {"model": "detect", "image": frame}
    while time.monotonic() < stop:
        with contextlib.suppress(Exception):
            await d.post("/v1/detections", json=body)
        await asyncio.sleep(1.0)


async def _measure(d: LiveDaemon, stop: float, start: float) -> None:
    """What a monitor would report: allocator cache above the estimates, and a foreign
    process (a game, say) whose memory rises and falls."""
    rt = d.runtime
    assert rt is not None
    while time.monotonic() < stop:
        status = rt.status()
        elapsed = time.monotonic() - start
        per_service: dict[str, int] = {}
        for svc in status["services"]:
            if svc["state"] != "loaded":
                continue
            led = svc["ledger"]
            estimate = led["weights"] + led["runtime"] + led["kv"] + led["active"]
            extra = {"chat": 320 * MIB, "image": 180 * MIB, "asr": 24 * MIB}.get(svc["name"], 0)
            per_service[svc["name"]] = estimate + extra
        foreign = int((0.4 + 0.35 * (1 + math.sin(elapsed / 7))) * GIB)
        used = sum(per_service.values()) + foreign
        rt.submit(MemorySampled(device="gpu", used_bytes=used, per_service=per_service))
        await asyncio.sleep(0.5)


async def _load(d: LiveDaemon, seconds: float) -> None:
    rng = random.Random(7)
    start = time.monotonic()
    stop = start + seconds
    tasks = [
        _chat(d, stop, random.Random(rng.random()), burst=False),
        _chat(d, stop, random.Random(rng.random()), burst=True),
        _speech(d, stop, random.Random(rng.random())),
        _images(d, stop, random.Random(rng.random())),
        _detect(d, stop),
        _measure(d, stop + 1, start),
    ]
    await asyncio.gather(*tasks)


def _job_in_progress(d: LiveDaemon) -> None:
    store = d.store
    if store is None:
        return
    job = store.create_job("embeddings", [f"photo {i}" for i in range(240)])
    lease = store.claim(job.id, 150)
    if lease is not None:
        store.complete(lease, {i: [0.0] for i in lease.indexes[:138]})
    store.create_job("embeddings", [f"note {i}" for i in range(60)])


def _count(browser: Any, selector: str) -> int:
    js = "return document.querySelectorAll(arguments[0]).length"
    return int(browser.execute_script(js, selector))


def make(out: Path, seconds: float) -> Path:
    with live_daemon(screenshot_config()) as d:
        _job_in_progress(d)
        with chromium(width=1500, height=1300) as browser:
            browser.get(d.url + "/")
            load = d.spawn(_load(d, seconds))
            time.sleep(seconds * 0.85)
            rejected = '#decisions tr[data-action="reject"]'
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _count(browser, rejected), timeout=5)
                browser.execute_script("document.querySelector(arguments[0]).click()", rejected)
            # capture while chat is busy: both slots running and something queued
            busy = '#services tr[data-service="chat"] td.queue.hot'
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _count(browser, busy), timeout=seconds * 0.15)
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": 1500, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
            )
            time.sleep(0.3)
            out.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(out))
            load.result(seconds + 60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    print(make(args.out, args.seconds))


if __name__ == "__main__":
    main()
