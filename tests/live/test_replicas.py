"""The live daemon with a service that may run on several devices: one backend per
replica (fake ones, and external servers as real child processes, each seeing its own
GPU), requests routed to the second replica when the first is busy, the group as the
only name clients see, and admin commands for the group or for one replica."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from tests.live.support import UPSTREAM, fake, live, run, settle

from accelmux.backends.external import ExternalBackend
from accelmux.backends.fake import FakeBackend
from accelmux.core.types import ServiceStatus

MSG = [{"role": "user", "content": "hello there"}]


def two_gpus(kind: str = "virtual") -> dict[str, Any]:
    """Two devices; NVIDIA ones with a configured capacity need no NVML (no sampling)."""
    return {
        "gpu0": {"kind": kind, "index": 0, "capacity": "4GiB", "headroom": "256MiB"},
        "gpu1": {"kind": kind, "index": 1, "capacity": "8GiB", "headroom": "256MiB"},
    }


def replicated_chat(backend: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "devices": two_gpus(extra.pop("device_kind", "virtual")),
        "services": {
            "chat": {
                "kind": "chat",
                "devices": ["gpu0", "gpu1"],
                "concurrency": 1,
                "init_s": 0.0,
                "aliases": ["gpt-test"],
                "memory": {"weights": "256MiB", "kv_per_token": "16KiB", "kv_ceiling": "64MiB"},
                "backend": backend,
                **extra,
            },
            "embed": {
                "kind": "embeddings",
                "device": "gpu0",
                "memory": {"weights": "64MiB", "per_unit": "1MiB"},
                "backend": fake(),
            },
        },
        "policy": {"crash_backoff_s": 0.2},
        "server": {"drain_s": 2.0},
    }


def _replicas(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in status["services"] if s["group"] == "chat"}


def test_each_replica_has_its_own_backend_on_its_device(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(replicated_chat(fake()), tmp=tmp_path) as lv:
            backends = lv.runtime.backends
            assert set(backends) == {"chat@gpu0", "chat@gpu1", "embed"}
            assert backends["chat@gpu0"] is not backends["chat@gpu1"]
            assert all(isinstance(backends[n], FakeBackend) for n in ("chat@gpu0", "chat@gpu1"))
            world = lv.runtime.manager.world
            assert [r.spec.device for r in world.groups["chat"]] == ["gpu0", "gpu1"]
            assert lv.runtime.service_state("embed").name == "embed"
            # a warm service preloads one replica, where placement puts it; a second one
            # loads only for a request that would otherwise wait
            await settle(lambda: any(r.is_up for r in world.groups["chat"]))
            up = [r.name for r in world.groups["chat"] if r.holds_memory]
            assert len(up) == 1
            assert lv.runtime.service_state("chat").name == up[0]
            with pytest.raises(KeyError):
                lv.runtime.service_state("chat@gpu9")

    run(body())


def test_a_busy_replica_sends_the_next_request_to_the_other_device(tmp_path: Path) -> None:
    # on demand: nothing is loaded before the first request. Once a request has shown
    # how long one takes, a second one that would wait for the busy replica loads the
    # other replica and runs there.
    config = replicated_chat(fake(latency_s=1.0), residency="on-demand")

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            async with lv.openai(timeout=30) as client:
                await client.chat.completions.create(model="chat", messages=MSG, max_tokens=6)
                first, second = await asyncio.gather(
                    client.chat.completions.create(model="chat", messages=MSG, max_tokens=6),
                    client.chat.completions.create(model="gpt-test", messages=MSG, max_tokens=6),
                )
            # the same input, the same answer, whichever replica served it
            assert first.choices[0].message.content
            assert first.choices[0].message.content == second.choices[0].message.content
            assert first.model == "chat" and second.model == "gpt-test"
            backends = lv.runtime.backends
            served = sorted(backends[n].describe()["requests"] for n in ("chat@gpu0", "chat@gpu1"))
            assert served == [1, 2]
            status, snap = await lv.get("/admin/status")
            assert status == 200
            replicas = _replicas(snap)
            assert {n: (s["device"], s["state"]) for n, s in replicas.items()} == {
                "chat@gpu0": ("gpu0", "loaded"),
                "chat@gpu1": ("gpu1", "loaded"),
            }
            assert sorted(s["served"] for s in replicas.values()) == [1, 2]
            assert snap["groups"] == {"chat": ["chat@gpu0", "chat@gpu1"]}
            embed = next(s for s in snap["services"] if s["name"] == "embed")
            assert embed["group"] == "embed"  # an ordinary service is its own group
            _, metrics = await lv.get("/metrics")
            assert 'accelmux_service_loaded{service="chat"} 1.0' in metrics
            weights = 'accelmux_service_memory_bytes{category="weights",device="gpu1",'
            assert weights + 'service="chat"}' in metrics
            assert 'accelmux_queue_wait_seconds_count{service="chat"} 3.0' in metrics
            assert "chat@" not in metrics

    run(body())


def test_clients_see_the_service_never_its_replicas(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(replicated_chat(fake()), tmp=tmp_path) as lv:
            async with lv.openai() as client:
                listed = [m.id for m in (await client.models.list()).data]
                assert sorted(listed) == ["chat", "embed", "gpt-test"]
                assert (await client.models.retrieve("chat")).id == "chat"
                for name in ("chat@gpu9", "chat@gpu0"):
                    with pytest.raises(openai.NotFoundError) as info:
                        await client.chat.completions.create(model=name, messages=MSG)
                    err = info.value.body
                    assert isinstance(err, dict) and err["code"] == "model_not_found"
                with pytest.raises(openai.NotFoundError):
                    await client.models.retrieve("chat@gpu1")
            status, tags = await lv.get("/api/tags")
            assert status == 200
            assert sorted(m["name"] for m in tags["models"]) == ["chat", "embed", "gpt-test"]

    run(body())


def test_admin_load_and_unload_of_the_group_and_of_one_replica(tmp_path: Path) -> None:
    config = replicated_chat(fake(), residency="on-demand")

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            world = lv.runtime.manager.world
            r0, r1 = world.groups["chat"]
            status, out, _ = await lv.post("/admin/services/chat/load")
            assert status == 200 and out["service"] == "chat"
            assert [r["name"] for r in out["replicas"]] == ["chat@gpu0", "chat@gpu1"]
            await settle(lambda: r0.status is ServiceStatus.LOADED)
            assert r1.status is ServiceStatus.UNLOADED  # load: one replica, the first
            status, out, _ = await lv.post("/admin/services/chat@gpu1/load")
            assert status == 200 and "replicas" not in out
            await settle(lambda: r1.status is ServiceStatus.LOADED)
            _, ps = await lv.get("/api/ps")
            chat = [m for m in ps["models"] if m["name"] in ("chat", "gpt-test")]
            assert [m["name"] for m in chat] == ["chat"]  # once, with both replicas' size
            assert chat[0]["size"] == r0.resident_bytes + r1.resident_bytes
            status, out, _ = await lv.post("/admin/services/chat/unload")
            assert status == 200
            await settle(lambda: r0.status is r1.status is ServiceStatus.UNLOADED)
            assert (await lv.post("/admin/services/chat@gpu9/load"))[0] == 404

    run(body())


def test_a_replica_load_is_timed_and_counted_by_its_service_config(tmp_path: Path) -> None:
    config = replicated_chat(fake(), residency="on-demand", load_timeout_s=0.5)
    config["services"]["chat"]["backend"] = fake(hang_load=True)

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            assert (await lv.post("/admin/services/chat@gpu1/load"))[0] == 200
            await settle(lambda: "chat@gpu1" in lv.runtime.last_errors)
            error = lv.runtime.last_errors["chat@gpu1"]
            assert "load timed out after 0.5s (load_timeout_s)" in error
            assert lv.runtime.last_error("chat") == error
            _, metrics = await lv.get("/metrics")
            assert 'accelmux_load_seconds_count{outcome="failed",service="chat"} 1.0' in metrics

    run(body())


def test_a_replica_load_is_measured_as_its_own_activity(tmp_path: Path) -> None:
    config = replicated_chat(fake(load_s=0.05), residency="on-demand")

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            assert (await lv.post("/admin/services/chat@gpu1/load"))[0] == 200
            replica = lv.runtime.manager.world.services["chat@gpu1"]
            await settle(lambda: replica.status is ServiceStatus.LOADED)
            assert lv.runtime.service_state("chat") is replica  # the one that is up
            replicas = _replicas(lv.runtime.status())
            assert replicas["chat@gpu1"]["activity"]["measured_loads"] == 1
            assert replicas["chat@gpu0"]["activity"]["measured_loads"] == 0

    run(body())


def test_a_pinned_replicated_service_is_one_service_on_one_device(tmp_path: Path) -> None:
    config = replicated_chat(fake(), residency="pinned")

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            assert "chat" in lv.runtime.backends and "chat@gpu0" not in lv.runtime.backends
            await settle(lambda: lv.runtime.service_state("chat").is_up)
            # pinned services are packed: the device with the least room that holds it
            assert lv.runtime.service_state("chat").spec.device == "gpu0"

    run(body())


async def _upstream_facts(backend: ExternalBackend) -> dict[str, Any]:
    """What the upstream test server echoes of how it was started (argv, env)."""
    url = f"http://127.0.0.1:{backend.port}/v1/models"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        facts: dict[str, Any] = await resp.json()
        return facts


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.slow
def test_external_replicas_each_see_their_own_gpu(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        str(UPSTREAM),
        "--port",
        "{port}",
        "--gpu-memory-utilization",
        "{gpu_memory_utilization}",
    ]
    config = replicated_chat(
        {"type": "external", "argv": argv, "memory_limit": False},
        device_kind="nvidia",
        residency="on-demand",
    )

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            world = lv.runtime.manager.world
            for name in ("chat@gpu0", "chat@gpu1"):
                assert (await lv.post(f"/admin/services/{name}/load"))[0] == 200
            await settle(
                lambda: all(r.status is ServiceStatus.LOADED for r in world.groups["chat"]),
                timeout=30,
            )
            backends = lv.runtime.backends
            first, second = backends["chat@gpu0"], backends["chat@gpu1"]
            assert isinstance(first, ExternalBackend) and isinstance(second, ExternalBackend)
            assert first.port != second.port  # a free port each
            facts = [await _upstream_facts(b) for b in (first, second)]
            assert [f["cuda_visible_devices"] for f in facts] == ["0", "1"]
            shares = [float(_flag(f["argv"], "--gpu-memory-utilization")) for f in facts]
            # the same limit, as a share of each replica's own device (4 GiB and 8 GiB)
            assert shares[0] == pytest.approx(2 * shares[1], rel=0.05)
            async with lv.openai(timeout=30) as client:
                answer = await client.chat.completions.create(model="chat", messages=MSG)
            assert answer.choices[0].message.content == "upstream echo: hello there"

    run(body())
