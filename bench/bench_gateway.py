"""What the gateway adds: latency (p50, p99) and requests/s, accelmux vs the same upstream.

One run starts ``accelmux serve`` with one external chat service whose child is the test
upstream server (tests/live/upstream_server.py), then measures non-streaming chat
completions two ways against the SAME upstream process:

* direct: POST to the child's own port;
* gateway: POST to accelmux (route, admission through the Manager, proxy, accounting);
* bare proxy: POST to a minimal aiohttp pass-through proxy on the same event loop kind
  (no parsing, no Manager, no metrics): the floor any Python proxy hop costs here, so
  ``gateway - bare proxy`` is what accelmux's own logic adds.

Latency comes from sequential requests (concurrency 1); throughput from ``--concurrency``
parallel clients. The two targets alternate within each repeat; the table shows medians
over repeats. The load generator is one aiohttp client session with bounded concurrency.

    .venv/bin/python bench/bench_gateway.py            # writes bench/results/gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
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
UPSTREAM = ROOT / "tests" / "live" / "upstream_server.py"
RESULTS = ROOT / "bench" / "results" / "gateway.json"
BODY = json.dumps(
    {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
).encode()
HEADERS = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(data_dir: str, event_loop: str = "auto") -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
        "services": {
            "chat": {
                "kind": "chat",
                "residency": "pinned",
                "concurrency": 64,
                "queue": {"limit": 1024},
                "memory": {"weights": "128MiB", "kv_per_token": "1KiB", "kv_ceiling": "1GiB"},
                "backend": {
                    "type": "external",
                    "argv": [sys.executable, str(UPSTREAM), "--port", "{port}"],
                    "startup_timeout_s": 30,
                },
            }
        },
        "server": {"data_dir": data_dir, "sample_interval_s": 1.0, "event_loop": event_loop},
    }


def bare_proxy(port: int, upstream: str) -> None:
    """A minimal aiohttp reverse proxy (the reference floor for one extra hop)."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        async with session.post(upstream + request.path, data=body, headers=HEADERS) as r:
            data = await r.read()
            return web.Response(status=r.status, body=data, content_type="application/json")

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession()

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", handle)
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve_forever(app, port))


def bare_fast_proxy(port: int, upstream: str) -> None:
    """A minimal proxy on the gateway's fast stack: an asyncio protocol with httptools'
    parser on uvloop, the upstream reached through accelmux's pooled keep-alive client
    (``backends/upstream.py``), the answer's bytes relayed as they are: the floor of one
    hop on that stack."""
    import httptools
    import uvloop

    from accelmux.backends.upstream import UpstreamPool

    host, _, upstream_port = upstream.removeprefix("http://").partition(":")

    class Proxy(asyncio.Protocol):
        def __init__(self, pool: UpstreamPool) -> None:
            self.pool = pool
            self.parser = httptools.HttpRequestParser(self)
            self.transport: asyncio.Transport | None = None
            self.url = b""
            self.body: list[bytes] = []

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_body(self, body: bytes) -> None:
            self.body.append(bytes(body))

        def on_message_complete(self) -> None:
            path, body = self.url.decode(), b"".join(self.body)
            self.url, self.body = b"", []
            asyncio.get_running_loop().create_task(self.forward(path, body))

        async def forward(self, path: str, body: bytes) -> None:
            answer = await self.pool.post(path, body, {"Content-Type": "application/json"})
            head = (
                f"HTTP/1.1 {answer.status} OK\r\nContent-Type: {answer.content_type}\r\n"
                f"Content-Length: {len(answer.body)}\r\n\r\n"
            ).encode()
            assert self.transport is not None
            self.transport.write(head + answer.body)

    async def main() -> None:
        pool = UpstreamPool(host, int(upstream_port))
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Proxy(pool), "127.0.0.1", port)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()
        pool.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def _serve_forever(app: Any, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"accelmux exited early ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + "/admin/status", timeout=1) as resp:
                snap = json.load(resp)
            svc = snap["services"][0]
            if svc["state"] == "loaded" and svc["backend"]["port"]:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("accelmux did not get ready")


def upstream(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


async def one(session: aiohttp.ClientSession, url: str) -> float:
    t0 = time.perf_counter()
    async with session.post(url, data=BODY, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - t0


async def latency(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    for _ in range(20):  # warm the connection pool and both servers
        await one(session, url)
    return [await one(session, url) for _ in range(n)]


async def throughput(session: aiohttp.ClientSession, url: str, n: int, conc: int) -> float:
    count = 0

    async def worker() -> None:
        nonlocal count
        while count < n:
            count += 1
            await one(session, url)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return n / (time.perf_counter() - t0)


async def measure(targets: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in targets}
    connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(args.repeats):
            for name, url in targets.items():
                lat = await latency(session, url, args.requests)
                rps = await throughput(session, url, args.requests, args.concurrency)
                runs[name].append(
                    {
                        "n": len(lat),
                        "p50_ms": percentile(lat, 0.50) * 1000,
                        "p99_ms": percentile(lat, 0.99) * 1000,
                        "mean_ms": statistics.fmean(lat) * 1000,
                        "rps": rps,
                    }
                )
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        out[name] = {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]}
        out[name]["repeats"] = rs
    for name, base in (("added", "direct"), ("added_over_bare_proxy", "bare_proxy")):
        diffs = [
            {k: g[k] - d[k] for k in ("p50_ms", "p99_ms")}
            for g, d in zip(runs["gateway"], runs[base], strict=True)
        ]
        out[name] = {
            k: round(statistics.median(a[k] for a in diffs), 4) for k in ("p50_ms", "p99_ms")
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=2000, help="per measurement (p99 needs at least 100)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--bare-proxy", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--bare-fast-proxy", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="the daemon's event loop (auto: uvloop when installed)",
    )
    args = parser.parse_args()
    if args.requests < 100 and not (args.bare_proxy or args.bare_fast_proxy):
        parser.error("--requests must be at least 100: the p99 of fewer samples is their maximum")
    if args.bare_proxy:
        bare_proxy(int(args.bare_proxy[0]), args.bare_proxy[1])
        return
    if args.bare_fast_proxy:
        bare_fast_proxy(int(args.bare_fast_proxy[0]), args.bare_fast_proxy[1])
        return

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "bench.yaml"
        cfg_path.write_text(yaml.safe_dump(config(tmp, args.event_loop)))
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelmux.cli",
                "serve",
                "-c",
                str(cfg_path),
                "--port",
                str(port),
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.DEVNULL,
        )
        gateway = f"http://127.0.0.1:{port}"
        try:
            wait_ready(gateway, proc)
            with urllib.request.urlopen(gateway + "/admin/status", timeout=5) as resp:
                child_port = json.load(resp)["services"][0]["backend"]["port"]
            proxies = {}
            for flag in ("--bare-proxy", "--bare-fast-proxy"):
                proxy_port = free_port()
                proxies[flag] = (
                    proxy_port,
                    subprocess.Popen(
                        [sys.executable, __file__, flag, str(proxy_port), upstream(child_port)],
                        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
                    ),
                )
            try:
                for proxy_port, _ in proxies.values():
                    wait_port(proxy_port)
                targets = {
                    "direct": f"{upstream(child_port)}/v1/chat/completions",
                    "bare_proxy": f"http://127.0.0.1:{proxies['--bare-proxy'][0]}"
                    "/v1/chat/completions",
                    "bare_fast_proxy": f"http://127.0.0.1:{proxies['--bare-fast-proxy'][0]}"
                    "/v1/chat/completions",
                    "gateway": f"{gateway}/v1/chat/completions",
                }
                result = asyncio.run(measure(targets, args))
            finally:
                for _, proxy in proxies.values():
                    proxy.send_signal(signal.SIGTERM)
                    proxy.wait(timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

    settings = {
        "requests": args.requests,
        "repeats": args.repeats,
        "concurrency": args.concurrency,
        "http": f"aiohttp {aiohttp.__version__} (server and upstream client)",
        "event_loop": args.event_loop,
    }
    report = {
        "meta": run_meta(settings),
        "what": "non-streaming chat completions; one test upstream process behind all targets",
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "settings": settings,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    d, g, a = result["direct"], result["gateway"], result["added"]
    b, ab = result["bare_proxy"], result["added_over_bare_proxy"]
    print(f"| target | p50 ms | p99 ms | req/s (concurrency {args.concurrency}) |")
    print("|---|---:|---:|---:|")
    print(f"| direct upstream | {d['p50_ms']:.3f} | {d['p99_ms']:.3f} | {d['rps']:.0f} |")
    print(f"| bare aiohttp proxy | {b['p50_ms']:.3f} | {b['p99_ms']:.3f} | {b['rps']:.0f} |")
    print(f"| through accelmux | {g['p50_ms']:.3f} | {g['p99_ms']:.3f} | {g['rps']:.0f} |")
    print(
        f"| added by the gateway | {a['p50_ms']:.3f} | {a['p99_ms']:.3f} | "
        f"{g['rps'] / d['rps'] * 100:.0f}% of direct |"
    )
    print(
        f"| accelmux's own logic (vs bare proxy) | {ab['p50_ms']:.3f} | {ab['p99_ms']:.3f} | "
        f"{g['rps'] / b['rps'] * 100:.0f}% of bare proxy |"
    )
    print(f"\nmedians over {args.repeats} repeats of {args.requests} requests; wrote {args.out}")


if __name__ == "__main__":
    main()
