"""The front door under heavy bodies: does one client's huge request slow everyone else?

``accelmux serve`` runs the fake stack (``examples/fake-stack.yaml``) with
``server.wyoming`` on, in a process of its own. A measuring process sends, one after
the other, a TTS request (``POST /v1/audio/speech``) and a Wyoming ``describe`` (the
``wyoming`` package's client), ``--samples`` of each per case, and records their
latencies. An attacker process sends a valid 25 MiB body (just under ``server.max_body``)
in a loop, one route per case: ``/v1/chat/completions`` and ``/api/chat`` (short
messages) and ``/v1/embeddings`` (short texts); the ``idle`` case has no attacker.

Two configurations:

* ``defaults``: ``server.limits`` as shipped; each 25 MiB body is over its route's body
  limit (8 MiB), refused with 413 by its Content-Length before it is read;
* ``raised``: the body limits raised to ``server.max_body``, the other limits as shipped,
  so each body is read, then parsed and counted in the body check process
  (``preflight_body``) and refused by its item count (``messages``,
  ``embedding_inputs``) without the daemon parsing it.

Target: every p95 under attack within 1.2x of the idle p95. Figures on a shared,
noisy machine: run it where nothing else runs for figures worth comparing::

    .venv/bin/python bench/bench_frontdoor.py                # bench/results/frontdoor.json
    .venv/bin/python bench/bench_frontdoor.py --samples 30   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from meta import run_meta  # noqa: E402
from stats import percentile  # noqa: E402

OUT = ROOT / "bench" / "results" / "frontdoor.json"
MIB = 1024**2
BODY_BYTES = 25 * MIB - 4096  # valid, and just under server.max_body
ROUTES = ("/v1/chat/completions", "/api/chat", "/v1/embeddings")
TARGET = 1.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp: Path, port: int, wyoming_port: int, raised: bool) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "fake-stack.yaml").read_text(encoding="utf-8"))
    server = data["server"]
    server.update(port=port, data_dir=str(tmp / "data"))
    server["wyoming"] = {"host": "127.0.0.1", "port": wyoming_port}
    if raised:
        server["limits"] = {"chat_body": "25MiB", "embeddings_body": "25MiB"}
    path = tmp / "accelmux.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@contextlib.contextmanager
def _daemon(config: Path, url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT / "src"))
    log = (config.parent / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelmux.cli", "serve", "-c", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"daemon exited: {(config.parent / 'daemon.log').read_text()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url + "/health", timeout=1) as resp,
            ):
                if resp.status == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("daemon not healthy in 60 s")
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# ---- the attacker ------------------------------------------------------------------------
def _body(route: str) -> bytes:
    """A valid JSON body of about BODY_BYTES: many short messages, or many short texts."""
    if route == "/v1/embeddings":
        head, item, tail = b'{"model": "embeddings", "input": [', b'"a short text"', b"]}"
    else:
        head = b'{"model": "chat", "stream": false, "messages": ['
        item, tail = b'{"role": "user", "content": "hi"}', b"]}"
    count = (BODY_BYTES - len(head) - len(tail)) // (len(item) + 1)
    body = head + b",".join([item] * count) + tail
    json.loads(body)  # valid
    return body


def _attack(port: int, route: str, stop: Any, ready: Any, sent: Any) -> None:
    body = _body(route)
    ready.set()
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            conn.getresponse().read()
        except OSError:  # refused before it was all sent: the server closed early
            pass
        finally:
            conn.close()
        with sent.get_lock():
            sent.value += 1


# ---- the measuring client ----------------------------------------------------------------
def _tts(port: int) -> float:
    body = json.dumps({"model": "tts", "input": "The kitchen light is on."}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/audio/speech",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"speech answered {resp.status}")
    return time.perf_counter() - start


async def _describe(port: int) -> float:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    start = time.perf_counter()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 120)
            if event is None:
                raise RuntimeError("wyoming server closed the connection")
            if Info.is_type(event.type):
                break
    return time.perf_counter() - start


def _measure(port: int, wyoming_port: int, samples: int, out: Any) -> None:
    tts: list[float] = []
    describe: list[float] = []
    for _ in range(samples):
        tts.append(_tts(port))
        describe.append(asyncio.run(_describe(wyoming_port)))
    out.put({"tts": tts, "describe": describe})


def _cpu_s(pid: int) -> float:
    """CPU seconds of the daemon and its children (the body check process) so far."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def _case(
    pid: int, port: int, wyoming_port: int, samples: int, route: str | None
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop, ready, sent = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
    attacker = None
    if route is not None:
        attacker = ctx.Process(target=_attack, args=(port, route, stop, ready, sent))
        attacker.start()
        ready.wait(timeout=120)
        time.sleep(1.0)  # the first body is on its way before the first sample
    cpu_before = _cpu_s(pid)
    queue = ctx.Queue()
    meter = ctx.Process(target=_measure, args=(port, wyoming_port, samples, queue))
    started = time.perf_counter()
    meter.start()
    result = queue.get(timeout=1800)
    meter.join()
    seconds = time.perf_counter() - started
    cpu = _cpu_s(pid) - cpu_before
    stop.set()
    if attacker is not None:
        attacker.join(timeout=180)
        if attacker.is_alive():
            attacker.kill()
    row: dict[str, Any] = {
        "route": route,
        "attack_bodies": sent.value,
        "seconds": round(seconds, 2),
        # the daemon's CPU share over the case (1.0 = one core busy)
        "daemon_cpu": round(cpu / seconds, 2),
    }
    for name in ("tts", "describe"):
        values = result[name]
        row[name] = {
            "n": len(values),
            "p50_s": round(percentile(values, 0.5), 4),
            "p95_s": round(percentile(values, 0.95), 4),
        }
    return row


def run(samples: int) -> dict[str, Any]:
    configs: dict[str, list[dict[str, Any]]] = {}
    for name, raised in (("defaults", False), ("raised", True)):
        with tempfile.TemporaryDirectory(prefix="accelmux-frontdoor-") as tmp:
            port, wyoming_port = _free_port(), _free_port()
            config = _config(Path(tmp), port, wyoming_port, raised)
            with _daemon(config, f"http://127.0.0.1:{port}") as proc:
                rows = [_case(proc.pid, port, wyoming_port, samples, None)]
                for route in ROUTES:
                    rows.append(_case(proc.pid, port, wyoming_port, samples, route))
                    print(name, json.dumps(rows[-1]), flush=True)
        idle = rows[0]
        for row in rows:
            for name_ in ("tts", "describe"):
                row[name_]["ratio_p95"] = round(row[name_]["p95_s"] / idle[name_]["p95_s"], 2)
        configs[name] = rows
    worst = max(
        row[kind]["ratio_p95"]
        for rows in configs.values()
        for row in rows[1:]
        for kind in ("tts", "describe")
    )
    settings = {"samples": samples, "body_bytes": BODY_BYTES, "routes": list(ROUTES)}
    return {
        "meta": run_meta(settings),
        "target_ratio": TARGET,
        "worst_ratio_p95": worst,
        "configs": configs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=200, help="requests of each kind per case")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    report = run(args.samples)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out} (worst p95 ratio {report['worst_ratio_p95']})")


if __name__ == "__main__":
    main()
