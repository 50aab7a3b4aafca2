"""A resize is an action the backend answers, seen through real HTTP.

Until the backend confirms a growth, the ledger already holds the larger pool and the
request that needs it waits; a backend that refuses a live resize leaves the old pool,
and the request is served after a reload with a pool that holds it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.live.support import base_config, fake, live, run, settle

MSG = [{"role": "user", "content": "hi"}]


def _chat_config(**backend: Any) -> dict[str, Any]:
    return base_config(
        chat={
            "kind": "chat",
            "concurrency": 2,
            "memory": {
                "weights": "256MiB",
                "kv_per_token": "1KiB",
                "kv_floor": "1MiB",
                "kv_ceiling": "64MiB",
            },
            "backend": fake(latency_s=0.05, **backend),
        }
    )


def _body(max_tokens: int) -> dict[str, Any]:
    return {"model": "chat", "messages": MSG, "max_tokens": max_tokens}


def _chat_status(status: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in status["services"] if s["name"] == "chat")


def test_a_growth_waits_for_the_backend_and_is_counted_meanwhile(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_chat_config(resize_s=0.5), tmp=tmp_path) as lv:
            status, _, _ = await lv.post("/v1/chat/completions", json=_body(8))
            assert status == 200
            svc = lv.runtime.manager.world.services["chat"]
            before = svc.kv_pool
            task = asyncio.create_task(lv.post("/v1/chat/completions", json=_body(20_000)))
            await settle(lambda: svc.resizing)
            _, snap = await lv.get("/admin/status")
            chat = _chat_status(snap)
            assert chat["resize_pending_bytes"] > before
            assert chat["kv_pool_bytes"] == chat["resize_pending_bytes"]  # the larger
            assert chat["kv_usable_bytes"] == before  # requests still get the old pool
            assert chat["capabilities"]["resize"] == "live"
            assert not task.done()
            status, out, _ = await task
            assert status == 200, out
            assert not svc.resizing and svc.kv_usable == svc.kv_pool > before
            assert svc.loads == 1  # resized in place

    run(body())


def test_a_refused_resize_keeps_the_old_pool_and_reloads_larger(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_chat_config(fail_resize=True), tmp=tmp_path) as lv:
            assert (await lv.post("/v1/chat/completions", json=_body(8)))[0] == 200
            svc = lv.runtime.manager.world.services["chat"]
            small = svc.kv_pool
            status, out, _ = await lv.post("/v1/chat/completions", json=_body(20_000))
            assert status == 200, out
            assert svc.resize_failures == 1
            assert svc.loads == 2 and svc.kv_pool >= 20_000 * 1024 > small
            _, snap = await lv.get("/admin/status")
            assert "resize refused" in (_chat_status(snap).get("last_error") or "")

    run(body())
