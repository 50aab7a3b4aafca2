"""What the gateway adds: latency (p50, p99), requests/s and a stream's first byte, for
each way of building the hop, against the same kind of upstream called directly.

One run starts ``accelmux serve`` twice, each with an external chat service and an
external embeddings service whose children are the test upstream server
(tests/live/upstream_server.py): once with the hot path (``server.hot_path``, the
default) and once with every request through aiohttp. It starts two bare proxies that
forward to the chat service's child with no accelmux logic at all: one on aiohttp
(server and client), one on the hot path's stack (an asyncio protocol with httptools on
uvloop, the pooled keep-alive client of ``backends/upstream.py``): the floor of one hop
on each stack, so that what accelmux's own logic adds is shown apart from the hop.

Measured for every target, on non-streaming chat completions and on embeddings:

* latency: ``--requests`` sequential requests (concurrency 1), p50 and p99;
* throughput: the same number with ``--concurrency`` clients at once, requests/s;
* and for a streamed chat (the upstream, accelmux with and without the hot path): the
  time to the first byte of the answer's body, sequential.

The targets alternate within each repeat; the tables show medians over repeats, and the
"added" figures are medians of the per-repeat differences with the direct call. The load
generator is one aiohttp client session with bounded concurrency.

    .venv/bin/python bench/bench_gateway.py            # writes bench/results/gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httptools
import uvloop
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
ROUTES = {
    "chat": ("/v1/chat/completions", BODY),
    "embeddings": (
        "/v1/embeddings",
        json.dumps({"model": "embed", "input": "a short text to embed"}).encode(),
    ),
}
STREAM_BODY = json.dumps({**json.loads(BODY), "stream": True}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(data_dir: str, hot_path: bool, event_loop: str = "auto") -> dict[str, Any]:
    def external(kind: str, memory: dict[str, str]) -> dict[str, Any]:
        return {
            "kind": kind,
            "residency": "pinned",
            "concurrency": 64,
            "queue": {"limit": 1024},
            "memory": memory,
            "backend": {
                "type": "external",
                "argv": [sys.executable, str(UPSTREAM), "--port", "{port}"],
                "startup_timeout_s": 30,
            },
        }

    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
        "services": {
            "chat": external(
                "chat", {"weights": "128MiB", "kv_per_token": "1KiB", "kv_ceiling": "1GiB"}
            ),
            "embed": external("embeddings", {"weights": "64MiB", "per_unit": "1MiB"}),
        },
        "server": {
            "data_dir": data_dir,
            "sample_interval_s": 1.0,
            "event_loop": event_loop,
            "hot_path": hot_path,
        },
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
    app.router.add_post("/v1/embeddings", handle)
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


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> dict[str, int]:
    """Wait until every service is loaded; answers the port of each service's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"accelmux exited early ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + "/admin/status", timeout=1) as resp:
                snap = json.load(resp)
            ports = {s["name"]: s["backend"]["port"] for s in snap["services"]}
            if all(s["state"] == "loaded" for s in snap["services"]) and all(ports.values()):
                return ports
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


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - t0


async def first_byte(session: aiohttp.ClientSession, url: str) -> float:
    """Time to the first byte of a streamed answer's body (the rest is read after)."""
    t0 = time.perf_counter()
    async with session.post(url, data=STREAM_BODY, headers=HEADERS) as resp:
        await resp.content.readany()
        took = time.perf_counter() - t0
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return took


async def latency(session: aiohttp.ClientSession, url: str, body: bytes, n: int) -> list[float]:
    for _ in range(20):  # warm the connection pool and both servers
        await one(session, url, body)
    return [await one(session, url, body) for _ in range(n)]


async def throughput(
    session: aiohttp.ClientSession, url: str, body: bytes, n: int, conc: int
) -> float:
    count = 0

    async def worker() -> None:
        nonlocal count
        while count < n:
            count += 1
            await one(session, url, body)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return n / (time.perf_counter() - t0)


def _figures(lat: list[float], rps: float | None = None) -> dict[str, float]:
    out = {
        "n": len(lat),
        "p50_ms": percentile(lat, 0.50) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000,
    }
    if rps is not None:
        out["rps"] = rps
    return out


Runs = dict[str, dict[str, list[dict[str, float]]]]


async def measure(targets: dict[str, dict[str, str]], args: argparse.Namespace) -> Runs:
    """Per target and measurement (a route, or ``stream`` for the first byte), one
    figures dict per repeat; the targets alternate within each repeat."""
    runs: Runs = {t: {} for t in targets}
    connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(args.repeats):
            for name, urls in targets.items():
                for route, (_, body) in ROUTES.items():
                    url = urls[route]
                    lat = await latency(session, url, body, args.requests)
                    rps = await throughput(session, url, body, args.requests, args.concurrency)
                    runs[name].setdefault(route, []).append(_figures(lat, rps))
                if "stream" in urls:
                    for _ in range(20):
                        await first_byte(session, urls["stream"])
                    ttfb = [await first_byte(session, urls["stream"]) for _ in range(args.requests)]
                    runs[name].setdefault("stream", []).append(_figures(ttfb))
    return runs


def summarize(runs: Runs) -> dict[str, Any]:
    """Medians over repeats, and what each target adds to the direct call."""
    out: dict[str, Any] = {"targets": {}, "added": {}}
    for name, per in runs.items():
        out["targets"][name] = {
            what: {
                **{k: round(statistics.median(r[k] for r in reps), 4) for k in reps[0]},
                "repeats": reps,
            }
            for what, reps in per.items()
        }
    direct = runs["direct"]
    for name, per in runs.items():
        if name == "direct":
            continue
        added: dict[str, Any] = {}
        for what, reps in per.items():
            pairs = list(zip(reps, direct[what], strict=True))
            row = {
                k: round(statistics.median(r[k] - d[k] for r, d in pairs), 4)
                for k in ("p50_ms", "p99_ms")
            }
            if "rps" in reps[0]:
                ratios = (r["rps"] / d["rps"] for r, d in pairs)
                row["rps_of_direct"] = round(statistics.median(ratios), 4)
            added[what] = row
        out["added"][name] = added
    return out


#: Issue 37's targets, as ratios in one run: chat and embeddings (added p50, added p99,
#: requests/s as a share of direct), and a stream's first byte (added p50).
TARGETS = {
    "added_p50_ms": 0.35,
    "added_p99_ms": 1.0,
    "rps_of_direct": 0.80,
    "first_byte_added_ms": 0.35,
}


@contextlib.contextmanager
def daemon(
    tmp: str, name: str, hot_path: bool, event_loop: str
) -> Iterator[tuple[str, dict[str, int]]]:
    cfg_path = Path(tmp) / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(str(Path(tmp) / name), hot_path, event_loop)))
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "accelmux.cli", "serve", "-c", str(cfg_path)),
            *("--port", str(port), "--log-level", "WARNING"),
        ],
        stdout=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, wait_ready(url, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@contextlib.contextmanager
def proxy(flag: str, child: int) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, flag, str(port), upstream(child)],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


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
    with (
        tempfile.TemporaryDirectory() as tmp,
        daemon(tmp, "hot", True, args.event_loop) as (hot, children),
        daemon(tmp, "aiohttp", False, args.event_loop) as (slow, _),
        proxy("--bare-proxy", children["chat"]) as bare,
        proxy("--bare-fast-proxy", children["chat"]) as bare_fast,
    ):
        chat, embed = ROUTES["chat"][0], ROUTES["embeddings"][0]

        def urls(base: str, embed_base: str | None = None, stream: bool = True) -> dict[str, str]:
            out = {"chat": base + chat, "embeddings": (embed_base or base) + embed}
            if stream:
                out["stream"] = base + chat
            return out

        targets = {
            "direct": urls(upstream(children["chat"]), upstream(children["embed"])),
            "bare_proxy": urls(bare, stream=False),
            "bare_fast_proxy": urls(bare_fast, stream=False),
            "accelmux_aiohttp": urls(slow),
            "accelmux": urls(hot),
        }
        runs = asyncio.run(measure(targets, args))
    result = summarize(runs)
    settings = {
        "requests": args.requests,
        "repeats": args.repeats,
        "concurrency": args.concurrency,
        "event_loop": args.event_loop,
        "stacks": {
            "aiohttp": f"aiohttp {aiohttp.__version__}",
            "hot path": f"httptools {httptools.__version__} on uvloop {uvloop.__version__}",
        },
    }
    report = {
        "meta": run_meta(settings),
        "what": "non-streaming chat completions and embeddings, and a streamed chat's first "
        "byte; test upstream processes of the same code behind every target",
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "settings": settings,
        "targets_issue_37": TARGETS,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"added": result["added"]}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
