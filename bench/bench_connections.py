"""Many idle connections: does the daemon stay responsive, and what does the cap do?

Starts ``accelmux serve`` (fake chat and TTS services) twice and measures the latency of
``GET /health`` and of a TTS request (``POST /v1/audio/speech``), each on a fresh
connection, one at a time:

* ``room``: ``server.max_connections`` 4096 and long timeouts; first with no other
  connection, then while 2,000 idle connections (opened, silent) are held. How many of
  the 2,000 were still open at the end is recorded.
* ``capped``: the defaults (``max_connections`` 1000, ``connections_per_address`` 64,
  ``header_timeout_s`` 15) while the client tries to hold 2,000 idle connections from
  one address: what each idle connection got (held, a 429 for the address's share, a
  503, or closed to make room) and what the measured requests got (answered or refused).

The client raises its own open-files limit (RLIMIT_NOFILE) for the 2,000 sockets; the
daemon raises its own to ``max_connections`` + 256.

    .venv/bin/python bench/bench_connections.py   # writes bench/results/connections.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from meta import run_meta
from stats import percentile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "connections.json"
TTS = {"model": "tts", "input": "hello there", "voice": "default"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(data_dir: str, server: dict[str, Any]) -> dict[str, Any]:
    fake = {"type": "fake", "latency_s": 0.0, "load_s": 0.0, "scale": 0.01}
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
        "services": {
            "chat": {"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake},
            "tts": {
                "kind": "tts",
                "class": "realtime",
                "residency": "pinned",
                "memory": {"weights": "64MiB"},
                "backend": fake,
            },
        },
        "server": {"data_dir": data_dir, **server},
    }


def start(tmp: Path, name: str, server: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(str(tmp / name), server)))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelmux.cli", "serve", "-c", str(path), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the daemon did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def measure(url: str, n: int) -> dict[str, Any]:
    """``n`` /health and ``n`` TTS requests, alternating, each on a new connection."""
    out: dict[str, Any] = {}
    times: dict[str, list[float]] = {"health": [], "tts": []}
    statuses: dict[str, dict[str, int]] = {"health": {}, "tts": {}}
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(n):
            for kind in ("health", "tts"):
                t0 = time.perf_counter()
                try:
                    if kind == "health":
                        async with session.get(url + "/health") as resp:
                            await resp.read()
                            status = str(resp.status)
                    else:
                        async with session.post(url + "/v1/audio/speech", json=TTS) as resp:
                            await resp.read()
                            status = str(resp.status)
                except aiohttp.ClientError as exc:
                    status = type(exc).__name__
                elapsed = time.perf_counter() - t0
                statuses[kind][status] = statuses[kind].get(status, 0) + 1
                if status == "200":
                    times[kind].append(elapsed)
    for kind, values in times.items():
        values.sort()
        row: dict[str, Any] = {"n": len(values), "statuses": statuses[kind]}
        if values:
            row["p50_ms"] = round(percentile(values, 0.5) * 1000, 3)
            if len(values) >= 20:
                row["p95_ms"] = round(percentile(values, 0.95) * 1000, 3)
        out[kind] = row
    return out


class IdleConnections:
    """``count`` connections that send nothing, opened in batches."""

    def __init__(self) -> None:
        self.streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.failed = 0

    async def open(self, url: str, count: int) -> None:
        host, port = url.removeprefix("http://").split(":")

        async def one() -> None:
            try:
                self.streams.append(await asyncio.open_connection(host, int(port)))
            except OSError:
                self.failed += 1

        for start in range(0, count, 100):
            await asyncio.gather(*(one() for _ in range(min(100, count - start))))

    def census(self) -> dict[str, int]:
        """What each connection got so far: nothing (held), a 503 (the cap), a 429 (the
        client's share of connections), or a silent close."""
        held = refused = over_share = closed = 0
        for reader, _ in self.streams:
            data = bytes(reader._buffer)  # what arrived, unread
            if data.startswith(b"HTTP/1.1 503 "):
                refused += 1
            elif data.startswith(b"HTTP/1.1 429 "):
                over_share += 1
            elif reader.at_eof() or data:
                closed += 1
            else:
                held += 1
        return {
            "held": held,
            "refused_503": refused,
            "refused_429": over_share,
            "closed": closed,
            "failed": self.failed,
        }

    def close(self) -> None:
        for _, writer in self.streams:
            writer.close()


async def scenario(url: str, idle: int, n: int, settle_s: float) -> dict[str, Any]:
    conns = IdleConnections()
    await conns.open(url, idle)
    await asyncio.sleep(settle_s)  # let the daemon accept (and refuse) them all
    during = await measure(url, n)
    census = conns.census()
    conns.close()
    return {"idle_connections": idle, "census": census, "latency": during}


def raise_nofile(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=int, default=2000, help="idle connections held")
    parser.add_argument("-n", type=int, default=200, help="requests per kind and phase")
    args = parser.parse_args()
    nofile = raise_nofile(args.idle + 512)
    if nofile < args.idle + 64:
        raise SystemExit(f"the open-files limit is {nofile}: too low for {args.idle} sockets")
    report: dict[str, Any] = {
        "meta": run_meta({"idle": args.idle, "requests_per_kind": args.n, "client_nofile": nofile})
    }
    with tempfile.TemporaryDirectory(prefix="accelmux-bench-conn-") as tmp_dir:
        tmp = Path(tmp_dir)
        roomy = {
            "max_connections": 4096,
            "connections_per_address": 4096,
            "header_timeout_s": 600,
            "keepalive_timeout_s": 600,
        }
        proc, url = start(tmp, "room", roomy)
        try:
            alone = asyncio.run(measure(url, args.n))
            held = asyncio.run(scenario(url, args.idle, args.n, settle_s=2.0))
        finally:
            stop(proc)
        report["room"] = {"settings": roomy, "alone": alone, "with_idle": held}
        proc, url = start(tmp, "capped", {})
        try:
            capped = asyncio.run(scenario(url, args.idle, args.n, settle_s=2.0))
        finally:
            stop(proc)
        report["capped"] = {"settings": "defaults", **capped}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "meta"}, indent=2))


if __name__ == "__main__":
    main()
