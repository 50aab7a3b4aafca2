"""Where a request's time goes in the daemon, layer by layer, for the hot routes.

The daemon runs in this process (``accelmux.server.serve``, the same code as
``accelmux serve``) under ``cProfile``, once with every request through aiohttp
(``server.hot_path: false``: the path before the hot path) and once with the hot path,
with one external chat/completion service and one external embeddings service whose
child is the test upstream server (tests/live/upstream_server.py). A client process
sends ``--requests`` requests per route
(non-streaming chat, completions, embeddings, and a streamed chat), ``--concurrency`` at
a time. Each function's own CPU time (``tottime``) is given to the layer its module
belongs to (:data:`LAYERS`), and divided by the requests: microseconds of the event
loop thread's CPU per request, per layer (the profiler's clock is that thread's CPU
time, so waiting on sockets counts nothing; worker threads and the upstream do not
count). A built-in function's time goes to the layer of its caller. cProfile slows Python
code about twofold, C code not at all:
read the shares and the order, not the absolute figures, which the timings of
``bench/bench_gateway.py`` give.

    .venv/bin/python bench/profile_gateway.py   # writes bench/results/gateway_profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing as mp
import os
import pstats
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_gateway import config  # noqa: E402
from meta import run_meta  # noqa: E402

OUT = ROOT / "bench" / "results" / "gateway_profile.json"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),
    "completions": ("/v1/completions", {"model": "chat", "prompt": "hello", "max_tokens": 16}),
    "embeddings": ("/v1/embeddings", {"model": "embed", "input": "hello"}),
    "chat, streamed": ("/v1/chat/completions", {**CHAT, "stream": True}),
}
#: (layer, what it is) by the first pattern found in a function's file or name.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "middlewares",
        "connection guard, drain, errors, browser guard, keys, shares, rate limits",
        (
            "accelmux/gateway/connections.py",
            "accelmux/gateway/drain.py",
            "accelmux/gateway/middleware.py",
            "accelmux/gateway/guard.py",
            "accelmux/gateway/keys.py",
            "accelmux/gateway/fairness.py",
            "aiohttp/web_middlewares.py",
        ),
    ),
    (
        "body, JSON",
        "reading the body, decoding and encoding JSON, the item counts",
        (
            "accelmux/gateway/body_checks.py",
            "json/",
            "_json",
            "{method 'decode'",
            "{built-in method _json",
        ),
    ),
    (
        "validation",
        "the pydantic request models, the demand",
        (
            "pydantic",
            "accelmux/request_validation.py",
            "accelmux/gateway/openai_requests.py",
            "accelmux/gateway/parse.py",
        ),
    ),
    (
        "routing, metrics",
        "the route to a service, the request id, Prometheus metrics, live latency",
        (
            "accelmux/gateway/openai_api.py",
            "prometheus_client",
            "accelmux/runtime/metrics.py",
            "accelmux/runtime/live_latency.py",
        ),
    ),
    (
        "Manager (core)",
        "the Manager's decisions: admission, the ledger, the policy (accelmux/core)",
        ("accelmux/core/",),
    ),
    (
        "runtime shell",
        "the request runner, the driver, the executor, the decision log (accelmux/runtime)",
        ("accelmux/runtime/",),
    ),
    (
        "upstream client",
        "the external backend and aiohttp's client: connection pool, request, response",
        ("accelmux/backends/", "aiohttp/client", "aiohttp/connector", "aiohttp/streams.py"),
    ),
    (
        "HTTP server",
        "the HTTP server: parsing the request, the request object, routing, writing the "
        "answer (aiohttp's, or the hot path's front protocol on httptools)",
        ("accelmux/gateway/hot.py", "httptools", "aiohttp/", "multidict", "yarl", "propcache"),
    ),
    (
        "event loop",
        "asyncio and uvloop: tasks, futures, callbacks, sockets",
        ("asyncio/", "uvloop", "{method 'run'", "_asyncio"),
    ),
]
OTHER = ("other", "everything else")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _layer(key: tuple[str, int, str]) -> str:
    where = f"{key[0]}:{key[2]}"
    for name, _, patterns in LAYERS:
        if any(p in where for p in patterns):
            return name
    return OTHER[0]


# ---- the client --------------------------------------------------------------------------
def _load(url: str, path: str, body: dict[str, Any], requests: int, conc: int, out: Any) -> None:
    import aiohttp

    async def main() -> float:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        count = 0

        async def worker(session: aiohttp.ClientSession) -> None:
            nonlocal count
            while count < requests:
                count += 1
                async with session.post(url + path, data=data, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{path}: HTTP {resp.status}")

        connector = aiohttp.TCPConnector(limit=conc + 2)
        async with aiohttp.ClientSession(connector=connector) as session:
            start = time.perf_counter()
            await asyncio.gather(*(worker(session) for _ in range(conc)))
            return time.perf_counter() - start

    out.put(asyncio.run(main()))


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/admin/status", timeout=1) as resp:
                snap = json.load(resp)
            if all(s["state"] == "loaded" for s in snap["services"]):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the daemon did not get ready")


def profile(args: Any, hot_path: bool) -> dict[str, Any]:
    from accelmux.config.load import load_config_data
    from accelmux.server.command import loop_factory
    from accelmux.server.serve import serve

    with tempfile.TemporaryDirectory(prefix="accelmux-profile-") as tmp:
        port = _free_port()
        data = config(tmp, hot_path)
        data["server"]["port"] = port
        cfg = load_config_data(data, "profile")
        url = f"http://127.0.0.1:{port}"
        ctx = mp.get_context("spawn")
        routes: dict[str, Any] = {}
        stop_box: list[Any] = []
        profiles: dict[str, cProfile.Profile] = {}
        current: list[str | None] = [None]
        ready = threading.Event()

        def drive() -> None:
            _wait_ready(url)
            for name, (path, body) in ROUTES.items():
                # warm up (connections, first-call costs), then the profiled run
                for requests, profiled in ((200, False), (args.requests, True)):
                    queue = ctx.Queue()
                    client = ctx.Process(
                        target=_load, args=(url, path, body, requests, args.concurrency, queue)
                    )
                    if profiled:
                        current[0] = name
                    client.start()
                    seconds = queue.get(timeout=600)
                    client.join()
                    current[0] = None
                    if profiled:
                        routes[name] = {"path": path, "requests": requests, "seconds": seconds}
            ready.set()
            loop, stop = stop_box
            loop.call_soon_threadsafe(stop.set)

        async def main() -> None:
            stop = asyncio.Event()
            stop_box.extend([asyncio.get_running_loop(), stop])
            switcher = asyncio.create_task(_switch(profiles, current))
            try:
                await serve(cfg, stop=stop, signals=False)
            finally:
                switcher.cancel()

        threading.Thread(target=drive, daemon=True).start()
        # the event loop accelmux serve runs on (uvloop when installed)
        with asyncio.Runner(loop_factory=loop_factory(cfg.server.event_loop)) as runner:
            runner.run(main())
    out: dict[str, Any] = {}
    for name, prof in profiles.items():
        stats = pstats.Stats(prof)
        per_layer: dict[str, float] = {}
        for key, (_, _, tottime, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
            if key[0] == "~" and callers:  # a built-in: its callers' layers, by their share
                for caller, (_, _, caller_tt, _) in callers.items():
                    layer = _layer(caller)
                    per_layer[layer] = per_layer.get(layer, 0.0) + caller_tt
                continue
            layer = _layer(key)
            per_layer[layer] = per_layer.get(layer, 0.0) + tottime
        requests = routes[name]["requests"]
        top = sorted(
            ((tt, k) for k, (_, _, tt, _, _) in stats.stats.items() if k[0] != "~"),  # type: ignore[attr-defined]
            reverse=True,
        )[:12]
        routes[name]["top_functions_us"] = [
            f"{Path(k[0]).name}:{k[2]} {tt / requests * 1e6:.1f}" for tt, k in top
        ]
        total = sum(per_layer.values())
        out[name] = {
            **routes[name],
            "cpu_us_per_request": round(total / requests * 1e6, 1),
            "layers_us": {k: round(v / requests * 1e6, 1) for k, v in per_layer.items()},
        }
    return out


async def _switch(profiles: dict[str, cProfile.Profile], current: list[str | None]) -> None:
    """Profile the event loop's thread while a route's profiled run is on."""
    active: str | None = None
    while True:
        want = current[0]
        if want != active:
            if active is not None:
                profiles[active].disable()
            if want is not None:
                # CPU time of the event loop's thread: waiting for sockets costs nothing
                profile = profiles.setdefault(want, cProfile.Profile(time.thread_time))
                profile.enable()
            active = want
        await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    stacks = {"aiohttp": profile(args, False), "hot path": profile(args, True)}
    settings = {"requests": args.requests, "concurrency": args.concurrency}
    report = {
        "meta": run_meta(settings),
        "loadavg_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "layers": [{"layer": n, "what": w} for n, w, _ in LAYERS]
        + [{"layer": OTHER[0], "what": OTHER[1]}],
        "stacks": stacks,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(stacks, indent=2))


if __name__ == "__main__":
    main()
