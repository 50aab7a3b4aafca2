"""Routing by what a node can free now, on two machines for real (:mod:`.household`,
brought up by docs/cluster.md's steps with this module's config).

Both machines' 8 GiB devices are full. On gpu-box the only other service is streaming
(busy: its memory cannot be freed now); on mini an idle on-demand service holds the
memory. gpu-box has more free memory than mini, yet only mini can serve a 5 GiB request
at once (by evicting its idle service): the request must go there, not wait on gpu-box
until its deadline; ``/admin/explain/ID`` says so, node by node.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.cluster.household import ADMIN_KEY, Household, call, chat, household, wait_until
from tests.cluster.lan import namespaces_refused
from tests.live.support import fake

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        namespaces_refused() is not None, reason=namespaces_refused() or "namespaces"
    ),
]
GIB = 1024**3


def llm(weights: str, nodes: list[str], **backend: Any) -> dict[str, Any]:
    return {
        "kind": "chat",
        "nodes": nodes,
        "residency": "on-demand",
        "concurrency": 1,
        "queue": {"deadline_s": 3},
        "memory": {"weights": weights, "kv_per_token": "1KiB", "kv_ceiling": "16MiB"},
        "backend": fake(**backend),
    }


def config() -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "8GiB", "headroom": "512MiB"}},
        "cluster": {"address": "192.168.1.10:6379", "nodes": ["gpu-box", "mini"]},
        "services": {
            "big": llm("5GiB", ["gpu-box", "mini"]),
            "streamer": llm("4GiB", ["gpu-box"], stream_chunk_s=0.5),
            "idle": llm("5GiB", ["mini"]),
        },
        "policy": {"prewarm": False},
        "server": {
            "host": "0.0.0.0",
            "api_keys": ["change-this-household-key"],
            "admin_key": ADMIN_KEY,
            "jobs": False,
            "dashboard": False,
        },
    }


@pytest.fixture(scope="module")
def house() -> Iterator[Household]:
    with household() as h:
        h.write_config(config())
        h.follow_the_steps()
        yield h


def node_view(h: Household, node: str) -> dict[str, Any]:
    _, _, body = call(h.gateway("gpu-box") + "/admin/cluster", key=ADMIN_KEY)
    return next(n for n in body["nodes"] if n["node"] == node)


def service(h: Household, node: str, name: str) -> dict[str, Any]:
    return next(s for s in node_view(h, node)["services"] if s["service"] == name)


def test_a_request_goes_to_the_node_that_can_free_memory_now(house: Household) -> None:
    base = house.gateway("gpu-box")
    wait_until("both nodes", lambda: call(base + "/health", key=None)[2].get("status") == "ok", 60)
    assert chat(base, "idle")[0] == 200  # loads on mini, then stays there idle
    streaming = threading.Event()

    def stream() -> None:
        body = {
            "model": "streamer",
            "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 60,
            "stream": True,
        }
        with contextlib.suppress(Exception):
            call(base + "/v1/chat/completions", body=body, timeout=60)
        streaming.set()

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    wait_until(
        "streamer busy on gpu-box", lambda: service(house, "gpu-box", "streamer")["inflight"] == 1
    )
    wait_until("idle loaded on mini", lambda: service(house, "mini", "idle")["state"] == "loaded")
    free = {
        n: node_view(house, n)["devices"]["gpu"]["available_bytes"] for n in ("gpu-box", "mini")
    }
    assert free["gpu-box"] > free["mini"]  # raw free memory would pick gpu-box
    assert free["gpu-box"] < 5 * GIB  # where big fits only by evicting the streamer
    started = time.monotonic()
    status, headers, _ = chat(base, "big", timeout=30)
    took = time.monotonic() - started
    assert status == 200 and headers["X-Accelmux-Node"] == "mini"
    assert took < 3.0  # not after waiting on gpu-box until its deadline
    assert not streaming.is_set()  # gpu-box's stream was never stopped for it
    _, _, why = call(base + f"/admin/explain/{headers['X-Request-Id']}", key=ADMIN_KEY)
    by_node = {c["node"]: c for c in why["considered"]}
    assert by_node["mini"]["readiness"] == "frees" and by_node["mini"]["rank"] == 1
    assert by_node["gpu-box"]["readiness"] == "blocked"
    assert by_node["mini"]["freeable_bytes"] >= 5 * GIB - by_node["mini"]["free_bytes"]
    assert by_node["gpu-box"]["freeable_bytes"] == 0
    assert by_node["gpu-box"]["free_bytes"] > by_node["mini"]["free_bytes"]
    assert why["chosen"] == "mini" and "fits once idle services there are evicted" in why["why"]
    assert "held by busy services" in why["why"]
