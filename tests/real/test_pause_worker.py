"""Pause, park and resume through the real inference worker, and parked weights.

The backend is a :class:`WorkerBackend` on its own worker process (SmolLM2, 512-token
context, one thread); requests are named by the Manager's request id, as the executor
names them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from accelmux.backends.base import BackendRequest
from accelmux.backends.worker import WorkerBackend, WorkerPool
from accelmux.config.backends import WorkerBackendConfig
from accelmux.core.types import ServiceKind, Tier
from accelmux.errors import BackendError

from .support import LLAMA, SMOLLM2, need

pytestmark = pytest.mark.real

STORY = "Tell me a short story about a cat."
SAMPLED = {"max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 7}
QUIET_S = 0.3  # a paused stream sends nothing for this long


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 120))


@asynccontextmanager
async def chat_backend(data_dir: Path, *, isolated: bool = False) -> AsyncIterator[WorkerBackend]:
    need(LLAMA, SMOLLM2)
    pool = WorkerPool(data_dir)
    options = {"n_ctx": 512, "n_threads": 1}
    cfg = WorkerBackendConfig(type="worker", options=options, isolated=isolated)
    backend = pool.backend("chat", ServiceKind.CHAT, cfg)
    try:
        await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
        yield backend
    finally:
        await backend.unload()
        await backend.close()


def request(rid: str, content: str = STORY, *, stream: bool = True, **extra: Any) -> BackendRequest:
    body = {
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **SAMPLED,
        **extra,
    }
    return BackendRequest(
        request_id=rid,
        service="chat",
        kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions",
        body=body,
        stream=stream,
    )


def deltas(chunks: list[bytes]) -> list[str]:
    out = []
    for line in b"".join(chunks).decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    out.append(text)
    return out


async def streamed(backend: WorkerBackend, rid: str, content: str = STORY) -> list[str]:
    response = await backend.handle(request(rid, content))
    assert response.stream is not None
    return deltas([c async for c in response.stream])


async def streamed_json(backend: WorkerBackend, rid: str, fmt: dict[str, Any]) -> list[str]:
    response = await backend.handle(request(rid, response_format=fmt))
    assert response.stream is not None
    return deltas([c async for c in response.stream])


async def memory(backend: WorkerBackend) -> dict[str, Any]:
    header, _ = await backend.client.call({"op": "memory"}, timeout=10)
    backend.client.memory = header
    return header


def test_pause_park_and_resume_by_request_id(tmp_path: Path) -> None:
    async def body() -> None:
        async with chat_backend(tmp_path) as backend:
            caps = backend.capabilities
            assert caps.pause and caps.park and caps.host_cache
            await streamed(backend, "warm")
            ref = await streamed(backend, "ref")
            rivers = await streamed(backend, "rivers-ref", "Name three rivers.")

            response = await backend.handle(request("r1"))
            assert response.stream is not None
            chunks = response.stream.__aiter__()
            got = [await chunks.__anext__() for _ in range(4)]
            await backend.pause("r1", park=False)
            assert backend.last_pause["state"] == "paused"
            assert backend.last_pause["parked_bytes"] == 0  # its cells stay in the context
            await backend.pause("r1", park=True)  # parked now, on the model's thread
            assert backend.last_pause["state"] == "paused"
            assert backend.last_pause["parked_bytes"] > 20 * 2**10 * 20
            mine = (await memory(backend))["services"]["chat"]
            assert mine["paused"] == 1 and mine["parked_kv"] == backend.last_pause["parked_bytes"]
            received: list[bytes] = []

            async def consume() -> None:
                async for chunk in chunks:
                    received.append(chunk)

            consumer = asyncio.ensure_future(consume())
            await asyncio.sleep(0.05)  # chunks sent before the pause took come at once
            before = len(received)
            # the model serves others meanwhile; r1's stream stays open and sends nothing
            assert await streamed(backend, "r2", "Name three rivers.") == rivers
            plain = await backend.handle(request("r3", "Say hi.", stream=False))
            assert plain.status == 200
            await asyncio.sleep(QUIET_S)
            assert len(received) == before and not consumer.done()
            await backend.resume("r1")
            await consumer
            assert deltas(got + received) == ref  # token for token, sampled with its seed

            await backend.pause("r1", park=False)  # it ended: no error
            await backend.resume("r1")
            with pytest.raises(BackendError, match="no request 'never-sent' to resume"):
                await backend.resume("never-sent")
            plain_call = asyncio.ensure_future(backend.handle(request("r4", stream=False)))
            await asyncio.sleep(0)  # sent, not answered yet
            with pytest.raises(BackendError, match="not streamed"):
                await backend.pause("r4", park=False)
            assert (await plain_call).status == 200
            mine = (await memory(backend))["services"]["chat"]
            assert mine["paused"] == 0 and mine["parked_kv"] == 0

    run(body())


def test_a_request_paused_before_it_is_sent_starts_paused(tmp_path: Path) -> None:
    async def body() -> None:
        async with chat_backend(tmp_path) as backend:
            await streamed(backend, "warm")
            ref = await streamed(backend, "ref")
            await backend.pause("early", park=False)  # dispatched, not sent yet
            handled = asyncio.ensure_future(streamed(backend, "early"))
            await asyncio.sleep(QUIET_S)
            assert not handled.done()  # the worker holds it before its first token
            await backend.resume("early")
            assert await handled == ref

    run(body())


def test_parked_weights_reload_from_host_ram(tmp_path: Path) -> None:
    async def body() -> None:
        async with chat_backend(tmp_path) as backend:
            assert not backend.last_load["from_parked"]
            key = str(backend.last_load["key"]).removeprefix("llama:")
            size = Path(key.rsplit("@", 1)[0]).stat().st_size  # the model file, not the device
            await backend.unload(tier=Tier.PARKED)
            assert backend.parked and not backend.loaded
            mem = await memory(backend)
            assert mem["services"] == {}
            # the whole file is resident (page granularity)
            assert size <= mem["parked_bytes"] < size + 4096
            assert mem["parked"] == {"chat": mem["parked_bytes"]}
            assert backend.hosted_bytes() == mem["parked_bytes"]
            assert backend.describe()["parked"] is True
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            assert backend.last_load["from_parked"] and not backend.parked
            assert (await memory(backend))["parked_bytes"] == 0
            assert await streamed(backend, "after")

            await backend.unload(tier=Tier.PARKED)
            await backend.unload(tier=Tier.COLD)  # drops the parked file too
            assert not backend.parked
            assert (await memory(backend))["parked_files"] == []
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            assert not backend.last_load["from_parked"]

    run(body())


@pytest.mark.parametrize(
    ("tier", "park", "isolated"),
    [(Tier.PARKED, True, False), (Tier.COLD, False, False), (Tier.COLD, True, True)],
    ids=["parked", "cold-unparked", "cold-isolated"],
)
def test_a_paused_request_survives_an_unload_and_the_next_load(
    tmp_path: Path, tier: Tier, park: bool, isolated: bool
) -> None:
    """pause -> unload -> (a resume is refused) -> load -> another request -> resume: the
    stream stays open meanwhile, sends nothing, and goes on token for token. Unparked, the
    unload parks it; an isolated worker stays up for it."""

    async def body() -> None:
        async with chat_backend(tmp_path, isolated=isolated) as backend:
            await streamed(backend, "warm")
            ref = await streamed(backend, "ref")
            response = await backend.handle(request("r1"))
            assert response.stream is not None
            chunks = response.stream.__aiter__()
            got = [await chunks.__anext__() for _ in range(4)]
            await backend.pause("r1", park=park)
            await backend.unload(tier=tier)
            assert not backend.loaded and backend.parked is (tier is Tier.PARKED)
            mem = await memory(backend)
            kept = mem["parked_streams"]["chat"]
            assert mem["services"] == {} and kept["paused"] == 1
            assert kept["parked_kv"] > 20 * 2**10 * 20  # its sequence, in host RAM
            if park:
                assert kept["parked_kv"] == backend.last_pause["parked_bytes"]
            assert mem["parked_streams_bytes"] == kept["parked_kv"]
            weights = (mem["parked"] or {}).get("chat", 0)
            if isolated:  # measured as its own process
                assert backend.hosted_bytes() is None and backend.pids()
            else:
                assert backend.hosted_bytes() == weights + kept["parked_kv"]
            assert backend.describe()["paused_requests"] == 1
            with pytest.raises(BackendError, match="not loaded: request r1 stays paused"):
                await backend.resume("r1")
            received: list[bytes] = []

            async def consume() -> None:
                async for chunk in chunks:
                    received.append(chunk)

            consumer = asyncio.ensure_future(consume())
            await asyncio.sleep(0.05)  # chunks sent before the pause took come at once
            before = len(received)
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            assert backend.last_load["paused_kept"] == 1
            assert backend.last_load["from_parked"] is (tier is Tier.PARKED)
            assert await streamed(backend, "r2", "Name three rivers.")  # the model serves others
            await asyncio.sleep(QUIET_S)
            assert len(received) == before and not consumer.done()
            await backend.resume("r1")
            await consumer
            assert deltas(got + received) == ref
            mem = await memory(backend)
            assert mem["parked_streams"] == {} and mem["services"]["chat"]["paused"] == 0

    run(body())


def test_a_json_schema_stream_survives_and_a_stopping_service_ends_what_it_kept(
    tmp_path: Path,
) -> None:
    """A JSON-schema stream (its grammar is grown again on the reloaded model) resumes
    token for token; a request kept over an unload ends when the service stops
    (``close``: the daemon stops)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}

    async def body() -> None:
        async with chat_backend(tmp_path) as backend:
            await streamed_json(backend, "warm", fmt)
            ref = await streamed_json(backend, "ref", fmt)
            held = await backend.handle(request("held", response_format=fmt))
            assert held.stream is not None
            held_chunks = held.stream.__aiter__()
            got = [await held_chunks.__anext__() for _ in range(3)]
            await backend.pause("held", park=True)
            assert backend.last_pause["parked_bytes"] > 0  # paused mid-generation
            plain = await backend.handle(request("plain"))  # it runs once "held" paused
            assert plain.stream is not None
            plain_chunks = plain.stream.__aiter__()
            await backend.pause("plain", park=False)
            await backend.unload(tier=Tier.PARKED)
            assert (await memory(backend))["parked_streams"]["chat"]["paused"] == 2
            await backend.load(weights_bytes=0, runtime_bytes=0, kv_pool_bytes=0)
            await backend.resume("held")
            got += [chunk async for chunk in held_chunks]
            assert deltas(got) == ref
            await backend.unload(tier=Tier.COLD)
            await backend.close()
            with pytest.raises(BackendError, match="stopped while this request was paused"):
                async for _ in plain_chunks:
                    pass

    run(body())
