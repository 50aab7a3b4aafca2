"""An external server measured on loopback: its load size and each request's peak reach the
calibrator; the status page and /metrics show the per-service figures and the limit; the
explain endpoints give the ledger. The server is tests/live/upstream_server.py, a real
process that holds and allocates real memory when told to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.live.support import UPSTREAM, base_config, fake, live, run

from accelmux.backends.base import BackendRequest
from accelmux.backends.external import ExternalBackend
from accelmux.backends.limits import detect_cgroup
from accelmux.config.backends import ExternalBackendConfig
from accelmux.core.types import ServiceKind
from accelmux.runtime.status_cli import render

MIB = 1 << 20
KV_PER_TOKEN = 1024


def _argv(*extra: str) -> list[str]:
    return [sys.executable, str(UPSTREAM), "--port", "{port}", "--ctx-size", "{ctx_size}", *extra]


def _backend(tmp: Path, *extra: str) -> ExternalBackend:
    cfg = ExternalBackendConfig(type="external", argv=_argv(*extra), startup_timeout_s=20)
    return ExternalBackend(
        "chat",
        "chat",
        cfg,
        kv_bytes_per_token=KV_PER_TOKEN,
        data_dir=tmp,
        workspace_bytes=8 * MIB,
        cgroup=detect_cgroup(),
    )


def _chat(text: str) -> BackendRequest:
    return BackendRequest(
        request_id="r1",
        service="chat",
        kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions",
        body={"model": "chat", "messages": [{"role": "user", "content": text}]},
    )


def test_load_size_and_request_peak_are_measured(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path, "--hold-mib", "96")
        try:
            report = await backend.load(
                weights_bytes=64 * MIB, runtime_bytes=16 * MIB, kv_pool_bytes=4 * MIB
            )
            assert report.weights_bytes is not None and report.runtime_bytes is not None
            # The child holds 96 MiB of touched pages on top of Python and aiohttp.
            assert report.weights_bytes + report.runtime_bytes >= 96 * MIB - 4 * MIB
            answer = await backend.handle(_chat("alloc:64"))
            assert answer.status == 200
            # 64 MiB allocated while the request ran, plus the KV of its 9 tokens.
            assert answer.peak_bytes is not None
            assert answer.peak_bytes >= 48 * MIB + 9 * KV_PER_TOKEN
            small = await backend.handle(_chat("hello"))
            assert small.peak_bytes is not None and small.peak_bytes < 32 * MIB
            described = backend.describe()
            assert described["measured"]["resident_bytes"] >= 96 * MIB
            assert described["measured"]["load_seconds"] > 0
        finally:
            await backend.close()

    run(body())


def test_streamed_peak_is_set_when_the_stream_ends(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(weights_bytes=MIB, runtime_bytes=0, kv_pool_bytes=0)
            request = _chat("alloc:48")
            streamed = BackendRequest(
                request_id="r2",
                service="chat",
                kind=ServiceKind.CHAT,
                endpoint=request.endpoint,
                body={**request.body, "stream": True, "stream_options": {"include_usage": True}},
                stream=True,
            )
            answer = await backend.handle(streamed)
            assert answer.stream is not None and answer.peak_bytes is None
            chunks = [chunk async for chunk in answer.stream]
            assert b"[DONE]" in b"".join(chunks)
            assert answer.peak_bytes is not None and answer.peak_bytes >= 32 * MIB
        finally:
            await backend.close()

    run(body())


def test_limit_is_reported_per_service(tmp_path: Path) -> None:
    support = detect_cgroup()

    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(weights_bytes=64 * MIB, runtime_bytes=0, kv_pool_bytes=0)
            limit = backend.describe()["limit"]
            # ledger entry (64 MiB weights + 1 x 8 MiB workspace) x 1.25
            assert limit["memory_max_bytes"] == 90 * MIB
            if support.parent is None:
                # the stand-in's argv templates {ctx_size}: a flag, not an enforced limit
                assert limit["summary"] == (
                    f"none — {support.problem}; its own flags carry the ledger's sizes"
                )
                assert limit["cgroup"] is None
            else:
                cgroup = Path(limit["cgroup"])
                assert (cgroup / "memory.max").read_text().strip() == str(90 * MIB)
                pid = backend.describe()["pid"]
                assert str(pid) in (cgroup / "cgroup.procs").read_text().split()
        finally:
            await backend.close()

    run(body())


def _external_config(**extra: Any) -> dict[str, Any]:
    return base_config(
        chat={
            "kind": "chat",
            "concurrency": 2,
            "memory": {
                "weights": "64MiB",
                "kv_per_token": "1KiB",
                "kv_floor": "4MiB",
                "kv_ceiling": "16MiB",
                "workspace": "8MiB",
            },
            "backend": {
                "type": "external",
                "argv": _argv("--hold-mib", "64"),
                "startup_timeout_s": 20,
                "stop_grace_s": 3,
                **extra,
            },
        },
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )


def test_status_metrics_and_explain_show_the_external_service(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_external_config(), tmp=tmp_path, sample=True) as lv:
            async with lv.openai() as client:
                r = await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "alloc:32"}]
                )
                assert r.choices[0].message.content.startswith("upstream echo")
            await lv.runtime.sample_once()
            calibration = lv.runtime.manager.world.services["chat"].calibration
            assert calibration.resident.observations == 1  # the measured load size
            # the measured request peak; a periodic sample that caught the request running
            # above its lease may add one more (a busy machine makes that likely)
            assert calibration.active.observations >= 1
            status, snap = await lv.get("/admin/status")
            assert status == 200
            chat = next(s for s in snap["services"] if s["name"] == "chat")
            usage = chat["usage"]
            assert usage["weights_bytes"] > 0 and usage["concurrency"] == 2
            assert usage["kv_pool_bytes"] > 0
            assert usage["switches_per_hour"] > 0 and usage["cold_start_s"] > 0
            assert chat["limit"].startswith(("none — ", "memory.max "))
            assert f"  chat: {chat['limit']}" in render(snap).splitlines()
            assert chat["measured_bytes"] >= 64 * MIB
            status, text = await lv.get("/metrics")
            assert 'accelmux_service_usage{quantity="switches_per_hour",service="chat"}' in text
            assert 'accelmux_service_usage{quantity="kv_pool_bytes",service="chat"}' in text
            status, full = await lv.get("/admin/explain")
            assert status == 200
            assert any(line.startswith("gpu: budget") for line in full["lines"])
            assert full["devices"][chat["device"]]["services"]["chat"]["weights"] > 0

    run(body())


def test_explain_of_a_refused_request_has_the_ledger_and_the_evictions(tmp_path: Path) -> None:
    cfg = base_config(
        a={
            "kind": "image",
            "memory": {"weights": "2GiB"},
            "backend": fake(),
            "residency": "pinned",
        },
        b={"kind": "image", "memory": {"weights": "2GiB"}, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            status, _, _ = await lv.post(
                "/v1/images/generations", json={"model": "a", "prompt": "x", "size": "64x64"}
            )
            assert status == 200
            status, out, headers = await lv.post(
                "/v1/images/generations", json={"model": "b", "prompt": "x", "size": "64x64"}
            )
            # b fits the empty device but never beside the pinned a: refused for now
            assert status == 503 and out["error"]["code"] == "no_memory", out
            rid = headers["X-Request-Id"]
            status, story = await lv.get(f"/admin/explain/{rid}")
            assert status == 200
            ledger = story["ledger"]
            assert ledger is not None, story
            device = next(iter(ledger["devices"].values()))
            assert device["services"]["a"]["weights"] == 2 << 30
            assert {"foreign", "headroom", "available", "budget"} <= set(device)
            eviction = ledger["eviction"]
            assert eviction["needed_bytes"] >= 2 << 30
            # a is pinned: nothing may go, so nothing would have been enough
            assert eviction["would_evict"] == [] and not eviction["enough"]

    run(body())
