"""One hostile address against the front door: do /health, TTS and another client stay served?

``accelmux serve`` runs with two API keys and the front door's defaults (a cap of 1000
connections, 256 per address and per key, 32 kept for /health and realtime services, a
body rate of at least 1 KiB/s over 10 s), fake chat and TTS services (TTS realtime). An
attacker process on 127.0.0.1 keeps 2,000 connections going: each sends the headers of a
``POST /v1/chat/completions`` with a large ``Content-Length`` and one byte of body, then
one more byte every ``--drip-s`` seconds (the pattern that once held every connection of
the door for minutes); a connection the daemon closes or refuses is opened again
``--reconnect-s`` later. Three cases, one after the other on the same daemon:

* ``idle``: no attacker;
* ``no key``: the attacker sends no key;
* ``stolen key``: the attacker sends a valid key (not the measuring client's).

In each case another client, on 127.0.0.2 with the other key, sends one after the other
a ``GET /health``, a TTS request and a chat request, each on a new connection,
``--samples`` times, and records each answer's latency and status. The attacker
records what each of its connections got, and how long after its headers a refusal came.

Targets (issue 39): /health and TTS p95 under attack within 1.5x of idle, and every
request of the other client served. Figures on a shared machine: run it where nothing
else runs for figures worth comparing::

    flock /work/heavy.lock .venv/bin/python bench/bench_hostile.py   # bench/results/hostile.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_connections import config as connections_config  # noqa: E402
from bench_connections import free_port, raise_nofile  # noqa: E402
from bench_frontdoor import _daemon  # noqa: E402
from meta import run_meta  # noqa: E402
from stats import percentile  # noqa: E402

OUT = ROOT / "bench" / "results" / "hostile.json"
HOSTILE_KEY, OTHER_KEY = "sk-hostile-but-valid", "sk-the-other-client"
ATTACKER, OTHER = "127.0.0.1", "127.0.0.2"
TARGET = 1.5
TTS = {"model": "tts", "input": "The front door is locked.", "voice": "default"}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _config(tmp: Path, port: int) -> Path:
    """bench_connections' fake stack (chat, a pinned realtime TTS), with the two keys."""
    data = connections_config(
        str(tmp / "data"), {"port": port, "api_keys": [HOSTILE_KEY, OTHER_KEY]}
    )
    path = tmp / "accelmux.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ---- the attacker ------------------------------------------------------------------------
def _head(port: int, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
        "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
    ).encode()


async def _hold(port: int, key: str | None, args: Any, stop: Any, tally: dict[str, Any]) -> None:
    head = _head(port, key)
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
            )
        except OSError:
            tally["connect_failed"] += 1
            await asyncio.sleep(args.reconnect_s)
            continue
        tally["connections"] += 1
        sent = time.perf_counter()
        writer.write(head)
        got = b""
        try:
            while not stop.is_set():
                try:
                    chunk = await asyncio.wait_for(reader.read(4096), args.drip_s)
                except TimeoutError:
                    writer.write(b" ")  # one more byte of the body
                    continue
                if not chunk:
                    break
                if not got:
                    tally["answer_s"].append(time.perf_counter() - sent)
                got += chunk
        except OSError:
            pass
        finally:
            writer.close()
        status = got[9:12].decode() if got.startswith(b"HTTP/1.1 ") else "closed"
        code = ""
        if b'"code": "' in got:
            code = got.split(b'"code": "', 1)[1].split(b'"', 1)[0].decode()
        tally["answers"][f"{status} {code}".strip()] += 1
        await asyncio.sleep(args.reconnect_s)


def _attack(port: int, key: str | None, args: Any, stop: Any, ready: Any, out: Any) -> None:
    raise_nofile(args.hostile + 512)
    tally: dict[str, Any] = {
        "connections": 0,
        "connect_failed": 0,
        "answers": Counter(),
        "answer_s": [],
    }

    async def main() -> None:
        tasks = []
        for start in range(0, args.hostile, 100):  # opened in batches, as a client would
            for _ in range(min(100, args.hostile - start)):
                tasks.append(asyncio.create_task(_hold(port, key, args, stop, tally)))
            await asyncio.sleep(0.05)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    waits = sorted(tally["answer_s"])
    out.put(
        {
            "connections_opened": tally["connections"],
            "connect_failed": tally["connect_failed"],
            "answers": dict(tally["answers"]),
            "first_answer_ms": {
                "n": len(waits),
                "p50": round(percentile(waits, 0.5) * 1000, 1) if waits else None,
                "p95": round(percentile(waits, 0.95) * 1000, 1) if waits else None,
            },
        }
    )


# ---- the other client --------------------------------------------------------------------
def _ask(port: int, method: str, path: str, body: dict[str, Any] | None) -> tuple[str, float]:
    import http.client

    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(OTHER, 0))
    try:
        headers = {"Authorization": f"Bearer {OTHER_KEY}", "Content-Type": "application/json"}
        conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        resp = conn.getresponse()
        resp.read()
        status = str(resp.status)
    except OSError as exc:
        status = type(exc).__name__
    finally:
        conn.close()
    return status, time.perf_counter() - start


def _measure(port: int, samples: int, pause_s: float, out: Any) -> None:
    kinds = {
        "health": ("GET", "/health", None),
        "tts": ("POST", "/v1/audio/speech", TTS),
        "chat": ("POST", "/v1/chat/completions", CHAT),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    statuses: dict[str, Counter[str]] = {k: Counter() for k in kinds}
    for _ in range(samples):
        for kind, (method, path, body) in kinds.items():
            status, took = _ask(port, method, path, body)
            statuses[kind][status] += 1
            if status == "200":
                times[kind].append(took)
        time.sleep(pause_s)
    result = {}
    for kind, values in times.items():
        values.sort()
        row: dict[str, Any] = {"n": len(values), "statuses": dict(statuses[kind])}
        if len(values) >= 20:
            row["p50_ms"] = round(percentile(values, 0.5) * 1000, 2)
            row["p95_ms"] = round(percentile(values, 0.95) * 1000, 2)
        result[kind] = row
    out.put(result)


def _cpu_s(pid: int) -> float:
    proc = psutil.Process(pid)
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def _case(pid: int, port: int, key: str | None, hostile: bool, args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop, ready, attack_out = ctx.Event(), ctx.Event(), ctx.Queue()
    attacker = None
    if hostile:
        attacker = ctx.Process(target=_attack, args=(port, key, args, stop, ready, attack_out))
        attacker.start()
        ready.wait(timeout=120)
        time.sleep(args.settle_s)  # the door full before the first sample
    held = len(psutil.Process(pid).net_connections(kind="tcp"))
    cpu_before = _cpu_s(pid)
    started = time.perf_counter()
    queue = ctx.Queue()
    meter = ctx.Process(target=_measure, args=(port, args.samples, args.pause_s, queue))
    meter.start()
    latency = queue.get(timeout=1800)
    meter.join()
    seconds = time.perf_counter() - started
    row: dict[str, Any] = {
        "seconds": round(seconds, 1),
        "daemon_cpu": round((_cpu_s(pid) - cpu_before) / seconds, 2),
        "daemon_sockets_at_start": held,
        "latency": latency,
    }
    stop.set()
    if attacker is not None:
        row["attacker"] = attack_out.get(timeout=120)
        attacker.join(timeout=60)
        if attacker.is_alive():
            attacker.kill()
    return row


def run(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="accelmux-hostile-") as tmp:
        port = free_port()
        config = _config(Path(tmp), port)
        with _daemon(config, f"http://127.0.0.1:{port}") as proc:
            cases = {
                "idle": _case(proc.pid, port, None, False, args),
                "no key": _case(proc.pid, port, None, True, args),
                "stolen key": _case(proc.pid, port, HOSTILE_KEY, True, args),
            }
    idle = cases["idle"]["latency"]
    worst = 0.0
    for row in cases.values():
        for kind in ("health", "tts"):
            figures = row["latency"][kind]
            if "p95_ms" in figures and "p95_ms" in idle[kind]:
                figures["ratio_p95"] = round(figures["p95_ms"] / idle[kind]["p95_ms"], 2)
                worst = max(worst, figures["ratio_p95"])
    served = all(
        row["latency"][k]["statuses"] == {"200": args.samples}
        for row in cases.values()
        for k in ("health", "tts", "chat")
    )
    settings = {
        "hostile_connections": args.hostile,
        "samples": args.samples,
        "drip_s": args.drip_s,
        "reconnect_s": args.reconnect_s,
        "pause_s": args.pause_s,
        "settle_s": args.settle_s,
    }
    return {
        "meta": run_meta(settings),
        "target_ratio": TARGET,
        "worst_ratio_p95": worst,
        "other_client_all_served": served,
        "cases": cases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hostile", type=int, default=2000, help="attacker connections")
    parser.add_argument("--samples", type=int, default=200, help="requests of each kind")
    parser.add_argument("--drip-s", type=float, default=20.0, help="seconds between bytes")
    parser.add_argument("--reconnect-s", type=float, default=1.0)
    parser.add_argument("--pause-s", type=float, default=0.1, help="between the samples")
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    raise_nofile(args.hostile + 512)
    report = run(args)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "meta"}, indent=2))


if __name__ == "__main__":
    main()
