"""The policy's decisions as clients see them: queueing, 429/503 with Retry-After and a
reason, eviction, cancellation, load failure and shutdown, through real HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.live.support import base_config, fake, live, run, settle

from accelmux.core.types import ServiceStatus

MSG = [{"role": "user", "content": "hi"}]


def _one(name: str, **svc: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "chat",
        "memory": {"weights": "256MiB", "kv_per_token": "1KiB", "kv_ceiling": "64MiB"},
        "backend": fake(latency_s=0.3),
    }
    spec.update(svc)
    return base_config(**{name: spec})


def _chat(model: str = "chat", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MSG, "max_tokens": 8, **extra}


def test_queue_full_is_429_with_retry_after_and_reason(tmp_path: Path) -> None:
    cfg = _one("chat", concurrency=1, queue={"limit": 1, "deadline_s": 10})

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            first = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: lv.runtime.manager.world.inflight)
            second = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: lv.runtime.manager.world.waiting)
            status, out, headers = await lv.post("/v1/chat/completions", json=_chat())
            assert status == 429, out
            assert out["error"]["code"] == "queue_full"
            assert int(headers["Retry-After"]) >= 1
            assert (await first)[0] == 200
            s2, _, h2 = await second
            assert s2 == 200
            _, story = await lv.get(f"/admin/explain/{h2['X-Request-Id']}")
            assert any("concurrency_limit" in line for line in story["lines"])

    run(body())


def test_deadline_in_queue_is_503_with_reason(tmp_path: Path) -> None:
    cfg = _one("chat", concurrency=1, queue={"limit": 8, "deadline_s": 0.1})

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            first = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: lv.runtime.manager.world.inflight)
            status, out, headers = await lv.post("/v1/chat/completions", json=_chat())
            assert status == 503, out
            assert out["error"]["code"] == "deadline_exceeded"
            assert "Retry-After" in headers
            assert (await first)[0] == 200

    run(body())


def test_eviction_makes_room_and_is_explained(tmp_path: Path) -> None:
    mem = {"weights": "2GiB"}
    cfg = base_config(
        a={"kind": "image", "memory": mem, "backend": fake()},
        b={"kind": "image", "memory": mem, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            req = {"prompt": "x", "size": "64x64"}
            assert (await lv.post("/v1/images/generations", json={"model": "a", **req}))[0] == 200
            status, _, headers = await lv.post("/v1/images/generations", json={"model": "b", **req})
            assert status == 200
            _, snap = await lv.get("/admin/status")
            unloads = [d for d in snap["decisions"] if d["action"] == "unload"]
            assert unloads[0]["service"] == "a"
            assert unloads[0]["reason"] == "evicted_for_memory"
            _, story = await lv.get(f"/admin/explain/{headers['X-Request-Id']}")
            assert any("no_memory" in line or "loading" in line for line in story["lines"])

    run(body())


def test_pinned_service_is_not_evicted_request_refused_for_now(tmp_path: Path) -> None:
    """``b`` fits the empty device but never beside pinned ``a``: refused 503 ``no_memory``
    with a Retry-After (the operator may unpin ``a``), not 413 ``too_large``; once ``a``
    is unpinned, ``b`` runs."""
    cfg = base_config(
        a={
            "kind": "image",
            "residency": "pinned",
            "memory": {"weights": "2GiB"},
            "backend": fake(),
        },
        b={"kind": "image", "memory": {"weights": "2GiB"}, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            await settle(lambda: lv.runtime.manager.world.services["a"].is_up)
            status, out, headers = await lv.post(
                "/v1/images/generations", json={"model": "b", "prompt": "x", "size": "64x64"}
            )
            assert status == 503 and out["error"]["code"] == "no_memory", out
            assert "Retry-After" in headers
            assert "beside the services kept loaded" in out["error"]["message"]
            admin = await lv.post("/admin/services/a/unpin")
            assert admin[0] == 200 and admin[1]["pinned"] is False
            status, out, _ = await lv.post(
                "/v1/images/generations", json={"model": "b", "prompt": "x", "size": "64x64"}
            )
            assert status == 200, out

    run(body())


def test_admin_load_unload_pin_unpin(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            w = lv.runtime.manager.world
            assert (await lv.post("/admin/services/image/load"))[0] == 200
            await settle(lambda: w.services["image"].is_up)
            assert (await lv.post("/admin/services/image/pin"))[1]["pinned"] is True
            assert (await lv.post("/admin/services/image/unpin"))[1]["pinned"] is False
            assert (await lv.post("/admin/services/image/unload"))[0] == 200
            await settle(lambda: w.services["image"].status is ServiceStatus.UNLOADED)
            reasons = [(d["action"], d["reason"]) for d in lv.runtime.status()["decisions"]]
            assert ("load", "admin") in reasons and ("unload", "admin") in reasons
            s404 = await lv.post("/admin/services/nope/load")
            assert s404[0] == 404
            s404 = await lv.post("/admin/services/image/explode")
            assert s404[0] == 404
            assert (await lv.get("/admin/explain/req-unknown"))[0] == 404

    run(body())


def test_events_stream_decisions_live(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            seen: list[str] = []

            async def listen() -> None:
                async with lv.session.get(lv.url + "/admin/events") as resp:
                    assert resp.headers["Content-Type"].startswith("text/event-stream")
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            seen.append(line.decode())
                            if "dispatch" in line.decode():
                                return

            task = asyncio.create_task(listen())
            await settle(lambda: lv.runtime.bus.active)
            img = {"model": "image", "prompt": "x", "size": "64x64"}
            assert (await lv.post("/v1/images/generations", json=img))[0] == 200
            await asyncio.wait_for(task, 5)
            assert any('"action": "load"' in s for s in seen), seen
            assert any('"reason": "fits"' in s for s in seen)

    run(body())


def test_metrics_exposes_ledger_queues_decisions_latency(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path, sample=True) as lv:
            assert (await lv.post("/v1/chat/completions", json=_chat()))[0] == 200
            await lv.runtime.sample_once()
            status, text = await lv.get("/metrics")
            assert status == 200
            for needle in (
                'accelmux_service_memory_bytes{category="weights",device="gpu",service="chat"}',
                'accelmux_service_measured_bytes{device="gpu",service="chat"}',
                'accelmux_queue_length{class="interactive"}',
                'accelmux_decisions_total{action="dispatch",reason="fits"}',
                'accelmux_cold_starts_total{service="chat"}',
                "accelmux_request_seconds_bucket",
                "accelmux_queue_wait_seconds_bucket",
                'accelmux_device_bytes{device="gpu",quantity="foreign"}',
            ):
                assert needle in text, needle

    run(body())


def test_api_and_admin_keys(tmp_path: Path) -> None:
    cfg = base_config()
    cfg["server"].update({"api_keys": ["k1", "k2"], "admin_key": "adm"})

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            assert (await lv.post("/v1/chat/completions", json=_chat()))[0] == 401
            ok = await lv.post(
                "/v1/chat/completions", json=_chat(), headers={"Authorization": "Bearer k2"}
            )
            assert ok[0] == 200
            assert (await lv.get("/admin/status"))[0] == 401
            assert (await lv.get("/metrics", headers={"Authorization": "Bearer k1"}))[0] == 401
            assert (await lv.get("/metrics", headers={"Authorization": "Bearer adm"}))[0] == 200
            assert (await lv.get("/health"))[0] == 200
            assert (await lv.get("/openapi.json"))[0] == 200

    run(body())


def test_admin_needs_key_off_loopback(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path, host="0.0.0.0") as lv:
            status, out = await lv.get("/admin/status")
            assert status == 403 and out["error"]["code"] == "admin_key_required"
            assert (await lv.get("/v1/models"))[0] == 200

    run(body())


def test_client_disconnect_cancels_the_request(tmp_path: Path) -> None:
    cfg = _one("chat", backend=fake(latency_s=5.0))

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            w = lv.runtime.manager.world
            task = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: w.inflight)
            task.cancel()
            await settle(lambda: not w.inflight and not lv.runtime.tickets)
            fails = [d for d in lv.runtime.status()["decisions"] if d["action"] == "fail"]
            assert fails and fails[-1]["reason"] == "cancelled"

    run(body())


def test_load_failure_is_503_load_failed(tmp_path: Path) -> None:
    cfg = _one("chat", backend=fake(fail_load=True))

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            status, out, headers = await lv.post("/v1/chat/completions", json=_chat())
            assert status == 503 and out["error"]["code"] == "load_failed"
            assert "configured to fail" in out["error"]["message"]
            assert int(headers["Retry-After"]) >= 1

    run(body())


def test_fake_crash_fails_inflight_with_502_then_recovers(tmp_path: Path) -> None:
    cfg = _one("chat", backend=fake(latency_s=2.0))

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            w = lv.runtime.manager.world
            task = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: w.inflight)
            backend = lv.runtime.backends["chat"]
            backend.crash("boom")  # type: ignore[attr-defined]
            status, out, _ = await task
            assert status == 502 and out["error"]["code"] == "backend_crashed"
            assert w.services["chat"].crashes == 1

    run(body())


def test_shutdown_fails_inflight_with_clear_error(tmp_path: Path) -> None:
    cfg = _one("chat", backend=fake(latency_s=5.0))
    cfg["server"]["drain_s"] = 0.1

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            task = asyncio.create_task(lv.post("/v1/chat/completions", json=_chat()))
            await settle(lambda: lv.runtime.manager.world.inflight)
            await lv.runtime.shutdown()
            status, out, _ = await task
            assert status == 503 and out["error"]["code"] == "shutting_down"
            status, out, _ = await lv.post("/v1/chat/completions", json=_chat())
            assert status == 503 and out["error"]["code"] == "shutting_down"

    run(body())


class _ScriptedSampler:
    """A monitor that reports what the test says (foreign usage, a service above its
    estimate), so the live reconcile path can be checked deterministically."""

    device = "gpu"

    def __init__(self) -> None:
        self.foreign = 0
        self.extra: dict[str, int] = {}

    def sample(self, services: list[Any]) -> Any:
        from accelmux.core.events import MemorySampled
        from accelmux.monitors.base import DeviceSample

        per = {s.service: (s.inprocess_bytes or 0) + self.extra.get(s.service, 0) for s in services}
        used = sum(per.values()) + self.foreign
        return DeviceSample(
            event=MemorySampled(device="gpu", used_bytes=used, per_service=per),
            total_bytes=4 * 1024**3,
            details={"source": "scripted", "used_bytes": used},
        )

    def close(self) -> None:
        return None


def test_measured_memory_reconciles_and_foreign_shrinks_the_budget(tmp_path: Path) -> None:
    cfg = base_config(
        a={"kind": "image", "memory": {"weights": "1GiB"}, "backend": fake(scale=0.01)},
        b={"kind": "image", "memory": {"weights": "1GiB"}, "backend": fake(scale=0.01)},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            rt = lv.runtime
            sampler = _ScriptedSampler()
            rt.samplers = {"gpu": sampler}
            w = rt.manager.world
            await settle(lambda: w.services["a"].is_up and w.services["b"].is_up)
            sampler.extra = {"a": 300 * 1024**2}  # a holds 300 MiB above its estimate
            await rt.sample_once()
            _, snap = await lv.get("/admin/status")
            a = next(s for s in snap["services"] if s["name"] == "a")
            assert a["ledger"]["reserved"] == 300 * 1024**2
            assert a["measured_bytes"] >= 1024**3 + 300 * 1024**2
            # what the policy learned: the idle cache is its highest activation, not a charge
            assert a["high_water_bytes"] == 300 * 1024**2
            assert a["charged_bytes"] is None and a["realtime_peak_bytes"] is None
            sampler.extra = {}
            sampler.foreign = 2 * 1024**3  # another program takes 2 GiB of the device
            await rt.sample_once()
            await settle(lambda: not (w.services["a"].is_up and w.services["b"].is_up))
            _, snap = await lv.get("/admin/status")
            assert snap["devices"][0]["foreign_bytes"] == 2 * 1024**3
            unloads = [d for d in snap["decisions"] if d["action"] == "unload"]
            assert unloads and "foreign_pressure" in unloads[-1]["detail"]

    run(body())


def test_batch_work_is_preempted_for_interactive_and_rerun(tmp_path: Path) -> None:
    cfg = base_config(
        embed={
            "kind": "embeddings",
            "class": "batch",
            "memory": {"weights": "256MiB", "per_unit": "1GiB"},
            "backend": fake(latency_s=0.5),
        },
        image={
            "kind": "image",
            "residency": "on-demand",
            "ttl_s": 0.2,  # unloaded soon after, so the batch work fits again
            "memory": {"weights": "1.5GiB"},
            "backend": fake(latency_s=0.05),
        },
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            w = lv.runtime.manager.world
            batch = asyncio.create_task(
                lv.post("/v1/embeddings", json={"model": "embed", "input": ["a", "b"]})
            )
            await settle(lambda: w.inflight)
            status, out, _ = await lv.post(
                "/v1/images/generations", json={"model": "image", "prompt": "x", "size": "64x64"}
            )
            assert status == 200, out
            s2, out2, h2 = await batch
            assert s2 == 200 and len(out2["data"]) == 2
            _, story = await lv.get(f"/admin/explain/{h2['X-Request-Id']}")
            assert any("preempted" in line for line in story["lines"]), story
            dispatches = [line for line in story["lines"] if "dispatch" in line]
            assert len(dispatches) == 2

    run(body())


def test_no_load_unload_loop_after_an_eviction(tmp_path: Path) -> None:
    mem = {"weights": "2GiB"}
    cfg = base_config(
        a={"kind": "image", "memory": mem, "backend": fake()},
        b={"kind": "image", "memory": mem, "backend": fake()},
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            req = {"prompt": "x", "size": "64x64"}
            assert (await lv.post("/v1/images/generations", json={"model": "a", **req}))[0] == 200
            assert (await lv.post("/v1/images/generations", json={"model": "b", **req}))[0] == 200
            await asyncio.sleep(0.3)
            loads = [d for d in lv.runtime.manager.log if type(d.action).__name__ == "Load"]
            assert len(loads) <= 4, f"{len(loads)} loads in 0.3 s"

    run(body())
