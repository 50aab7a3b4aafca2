"""The live measurements of ``bench/bench_cluster.py``, on two machines made of Linux
namespaces (``tests/cluster/lan.py``: each its own address, ports and process table, a
real LAN between them) brought up by docs/cluster.md's steps. The clients run on the
host, a third machine of the LAN (a laptop).

* :func:`hop`: what the gateway adds to a request over calling the node's daemon
  directly (with the cluster's key, as the gateway does), sequential and interleaved
  request by request; requests/s of each, concurrent clients, rounds alternated; and a
  streamed answer's pieces, their arrival times through both.
* :func:`detection`: how long a node takes to be marked down when its daemon dies (its
  port refuses: the agent starts it again) and when its machine goes silent (its link
  down), and to be up again.
* :func:`recovery`: a machine killed under load (every process, as a power cut), then
  brought back by its units alone: the success rate of requests for a service that also
  lives elsewhere, the time to full service and to the Ray cluster re-formed; once for
  mini, once for gpu-box (the Ray head).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from stats import summary
from tests.cluster.household import (
    API_KEY,
    Household,
    call,
    chat,
    daemon_pid,
    draw,
    embed,
    registered,
    wait_until,
)

from accelmux.cluster.secret import KEY_HEADER, listener_key

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
CHAT = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
STREAM = (
    b'{"model": "%s", "messages": [{"role": "user", "content": "count"}], '
    b'"max_tokens": 12, "stream": true}'
)


def node_key(h: Household) -> str:
    return listener_key((h.lan["gpu-box"].home / ".ray" / "auth_token").read_text().strip())


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, headers: Any) -> float:
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - started


def targets(h: Household) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """name -> (url, body, headers): each node's daemon directly, and through the
    gateway on gpu-box (to gpu-box itself, and across the LAN to mini)."""
    direct = {**AUTH, KEY_HEADER: node_key(h)}
    gateway = h.gateway("gpu-box") + "/v1/chat/completions"
    return {
        "direct_mini": (
            f"http://{h.ip('mini')}:8601/v1/chat/completions",
            CHAT % b"on-mini",
            direct,
        ),
        "gateway_mini": (gateway, CHAT % b"on-mini", AUTH),
        "direct_gpu": (
            f"http://{h.ip('gpu-box')}:8601/v1/chat/completions",
            CHAT % b"on-gpu",
            direct,
        ),
        "gateway_gpu": (gateway, CHAT % b"on-gpu", AUTH),
    }


async def latency(h: Household, samples: int, repeat: int) -> dict[str, Any]:
    goals = targets(h)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in goals}
    async with aiohttp.ClientSession() as session:
        for url, body, headers in goals.values():  # warm: connections, loads
            for _ in range(20):
                await _post(session, url, body, headers)
        for r in range(repeat):
            got: dict[str, list[float]] = {name: [] for name in goals}
            for _ in range(samples):
                for name, (url, body, headers) in goals.items():
                    got[name].append(await _post(session, url, body, headers))
            for name, values in got.items():
                rounds[name].append(summary(values, digits=6))
            print(
                f"latency round {r + 1}: "
                + ", ".join(f"{n} p50 {rounds[n][-1]['p50_s'] * 1e3:.2f} ms" for n in goals)
            )
    return {
        name: {
            "rounds": per_round,
            **{
                key: statistics.median(r[key] for r in per_round)
                for key in ("p50_s", "p95_s", "p99_s")
            },
            "n_per_round": samples,
        }
        for name, per_round in rounds.items()
    }


async def rate(url: str, body: bytes, headers: Any, clients: int, seconds: float) -> float:
    done = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(clients):
            await _post(session, url, body, headers)
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _post(session, url, body, headers)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - started)


async def throughput(h: Household, clients: int, seconds: float, repeat: int) -> dict[str, Any]:
    goals = targets(h)
    got: dict[str, list[float]] = {"direct_mini": [], "gateway_mini": []}
    for _ in range(repeat):
        for name, values in got.items():  # alternated, round by round
            values.append(round(await rate(*goals[name], clients, seconds), 1))
        print(f"requests/s: direct {got['direct_mini'][-1]}, gateway {got['gateway_mini'][-1]}")
    return {
        name: {"rounds": values, "requests_per_s": statistics.median(values)}
        for name, values in got.items()
    }


async def _stream(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Any
) -> list[float]:
    started = time.perf_counter()
    arrived = []
    async with session.post(url, data=body, headers=headers) as resp:
        async for _ in resp.content.iter_any():
            arrived.append(time.perf_counter() - started)
    return arrived


async def streams(h: Household, count: int) -> dict[str, Any]:
    goals = targets(h)
    direct = goals["direct_mini"]
    via = goals["gateway_mini"]
    out: dict[str, list[list[float]]] = {"direct_mini": [], "gateway_mini": []}
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            out["direct_mini"].append(
                await _stream(session, direct[0], STREAM % b"slow-mini", direct[2])
            )
            out["gateway_mini"].append(
                await _stream(session, via[0], STREAM % b"slow-mini", via[2])
            )
    result: dict[str, Any] = {}
    for name, runs in out.items():
        first = [r[0] for r in runs]
        gaps = [b - a for r in runs for a, b in itertools.pairwise(r)]
        result[name] = {
            "first_piece": summary(first, digits=6),
            "pieces_per_answer": statistics.median(len(r) for r in runs),
            "gap": summary(gaps, digits=6),
        }
    return result


# ---- detection ------------------------------------------------------------------------


def _down(h: Household, node: str, gateway: str = "gpu-box") -> bool:
    status, _, body = call(h.gateway(gateway) + "/health", key=None, timeout=2)
    return status in (200, 503) and node in body.get("down", [])


def _up(h: Household, node: str, gateway: str = "gpu-box") -> bool:
    status, _, body = call(h.gateway(gateway) + "/health", key=None, timeout=2)
    return status == 200 and node in body.get("alive", [])


def detection(h: Household, trials: int) -> dict[str, Any]:
    killed: list[float] = []
    restarted: list[float] = []
    silent: list[float] = []
    back: list[float] = []
    for _ in range(trials):
        os.kill(daemon_pid(h, "mini"), signal.SIGKILL)
        started = time.monotonic()
        killed.append(started + wait_until("mini down", lambda: _down(h, "mini"), 10) - started)
        restarted.append(wait_until("mini up", lambda: _up(h, "mini"), 60) + killed[-1])
        time.sleep(1.0)
        h.lan["mini"].unplug()
        silent.append(wait_until("mini down", lambda: _down(h, "mini"), 10))
        h.lan["mini"].plug()
        back.append(wait_until("mini up", lambda: _up(h, "mini"), 30))
        time.sleep(1.0)
        print(
            f"detection: killed daemon down after {killed[-1]:.2f} s (serving again after "
            f"{restarted[-1]:.2f} s), silent machine down after {silent[-1]:.2f} s"
        )
    return {
        "daemon_killed_down_s": summary(killed),
        "daemon_killed_serving_again_s": summary(restarted),
        "machine_silent_down_s": summary(silent),
        "machine_back_up_s": summary(back),
        "trials": trials,
    }


# ---- recovery -------------------------------------------------------------------------


class Load:
    """Clients calling ``model`` through one gateway in threads; every answer recorded
    with the time it was asked."""

    def __init__(self, base: str, model: str, clients: int, send: Callable[..., Any]) -> None:
        self.base = base
        self.model = model
        self.send = send
        self.stop = threading.Event()
        self.answers: list[tuple[float, int]] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self.stop.is_set():
            asked = time.monotonic()
            status = self.send(self.base, self.model, timeout=10)[0]
            self.answers.append((asked, status))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)

    def since(self, at: float) -> list[int]:
        return [status for asked, status in self.answers if asked >= at]


def _everything(h: Household, gateway: str) -> bool:
    base = h.gateway(gateway)
    return all(f(base, timeout=5)[0] == 200 for f in (chat, embed, draw))


def lose_and_return(
    h: Household, machine: str, via: str, window_s: float, clients: int
) -> dict[str, Any]:
    """Kill ``machine`` under load through the gateway on ``via``; its units bring it
    back. Requests for chat (on both machines) are the ones that must keep succeeding."""
    base = h.gateway(via)
    with Load(base, "chat", clients, chat) as load:
        time.sleep(3.0)
        killed = time.monotonic()
        h.lan[machine].kill()
        down = wait_until(f"{machine} down", lambda: _down(h, machine, via), 10)
        time.sleep(max(0.0, window_s - (time.monotonic() - killed)))
        during = load.since(killed)
        h.lan[machine].boot()
        booted = time.monotonic()
        h.start_units(machine)
        full = wait_until("full service", lambda: _everything(h, via), 120)
        after = load.since(booted)
    formed = wait_until(
        "the Ray cluster re-formed", lambda: registered(h, via) == {"gpu-box", "mini"}, 180
    )
    ok = during.count(200)
    row = {
        "machine": machine,
        "gateway_on": via,
        "clients": clients,
        "window_s": window_s,
        "detected_down_s": round(down, 3),
        "requests_while_lost": len(during),
        "succeeded_while_lost": ok,
        "success_rate_while_lost": round(ok / len(during), 5) if during else None,
        "failures_while_lost": sorted({s for s in during if s != 200}),
        "full_service_after_return_s": round(full, 2),
        "success_rate_during_return": round(after.count(200) / len(after), 5) if after else None,
        "ray_re_formed_after_return_s": round(formed + full, 2),
    }
    print(
        f"{machine} killed: {ok}/{len(during)} chat requests succeeded in {window_s:g} s; "
        f"full service {full:.1f} s after its return, Ray re-formed after {formed + full:.1f} s"
    )
    return row


def recovery(h: Household, window_s: float, clients: int) -> list[dict[str, Any]]:
    """Each machine switched to its units (docs/cluster.md, "Starting at boot"), then
    lost and brought back by them."""
    h.switch_to_units("mini")  # with a gateway on mini
    wait_until("mini's units", lambda: _up(h, "gpu-box", "mini") and _up(h, "mini", "mini"), 90)
    rows = [lose_and_return(h, "mini", "gpu-box", window_s, clients)]
    h.switch_to_units("gpu-box")
    wait_until("the cluster on units", lambda: registered(h, "mini") == {"gpu-box", "mini"}, 180)
    rows.append(lose_and_return(h, "gpu-box", "mini", window_s, clients))
    return rows
