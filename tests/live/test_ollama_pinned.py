"""Ollama's ``keep_alive: 0`` on a service the operator keeps loaded (pinned, or loaded
through ``/admin``), spoken by the official ``ollama`` client.

The operator wins: the service stays loaded. An empty request that only asks for the
unload is refused (409 ``service_pinned``, as ``/admin/.../unload`` of a pinned service
is), never answered ``done_reason: unload`` for an unload that did not happen. A request
with a prompt is answered as usual, and its ``keep_alive`` is not remembered: once the
operator unpins, the service's own ``ttl_s`` applies, not the client's 0.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import ollama
import pytest
from tests.live.support import base_config, live, run, settle

from accelmux.core.types import ServiceStatus

TTL_S = 600


def _expiry(client_ps: ollama.ProcessResponse, model: str) -> timedelta:
    (entry,) = [m for m in client_ps.models if m.model == model]
    assert entry.expires_at is not None
    return entry.expires_at.astimezone(UTC) - datetime.now(UTC)


def test_keep_alive_zero_never_unloads_a_pinned_service_nor_outlives_the_pin(
    tmp_path: Path,
) -> None:
    config = base_config()
    config["services"]["chat"].update(residency="pinned", ttl_s=TTL_S)

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv, ollama.AsyncClient(host=lv.url) as client:
            svc = lv.runtime.manager.world.services["chat"]
            await settle(lambda: svc.status is ServiceStatus.LOADED)

            with pytest.raises(ollama.ResponseError) as refused:
                await client.generate(model="chat", prompt="", keep_alive=0)
            assert refused.value.status_code == 409
            assert "pinned" in refused.value.error
            with pytest.raises(ollama.ResponseError) as refused:
                await client.chat(model="chat", messages=[], keep_alive=0)
            assert refused.value.status_code == 409

            answered = await client.chat(
                model="chat", messages=[{"role": "user", "content": "hi"}], keep_alive=0
            )
            assert answered.done_reason == "stop"
            generated = await client.generate(model="chat", prompt="hi", keep_alive=0)
            assert generated.done_reason == "stop"
            assert svc.status is ServiceStatus.LOADED

            status, out, _ = await lv.post("/admin/services/chat/unpin")
            assert status == 200, out
            left = _expiry(await client.ps(), "chat")
            assert timedelta(seconds=TTL_S - 60) < left <= timedelta(seconds=TTL_S), left
            assert svc.status is ServiceStatus.LOADED
            # unpinned, the client decides again
            stopped = await client.generate(model="chat", prompt="", keep_alive=0)
            assert stopped.done_reason == "unload"
            await settle(lambda: svc.status is ServiceStatus.UNLOADED)

    run(body())


def test_keep_alive_zero_never_unloads_a_service_the_operator_loaded(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, ollama.AsyncClient(host=lv.url) as client:
            svc = lv.runtime.manager.world.services["chat"]
            status, out, _ = await lv.post("/admin/services/chat/load")
            assert status == 200, out
            await settle(lambda: svc.status is ServiceStatus.LOADED)
            with pytest.raises(ollama.ResponseError) as refused:
                await client.generate(model="chat", prompt="", keep_alive=0)
            assert refused.value.status_code == 409
            assert svc.status is ServiceStatus.LOADED

    run(body())
