"""``park: llama-server`` with the real llama-server and the packaged SmolLM2 GGUF: a
streamed completion paused (and parked with the server's slot save) midway and resumed
gives, with greedy sampling, what an unpaused one gives and what llama-server's own
endpoints answer; the slot file is written while parked and restored (then removed) at
the resume; a parked request resumes across a restart of the server; pausing what is
unknown or finished is no error, resuming what is unknown is; and the daemon's gateway
serves such a server to the openai client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.external.llama_server import llama_config, llama_server_path, smollm2
from tests.live.support import live, run

from accelmux.backends.base import BackendRequest
from accelmux.backends.external import ExternalBackend
from accelmux.config.backends import ExternalBackendConfig
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendCrashedError, BackendError

pytestmark = [pytest.mark.real, pytest.mark.slow]
MIB = 1 << 20
PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
SIZES = {"weights_bytes": 90 * MIB, "runtime_bytes": 0, "kv_pool_bytes": 0}


def _backend(tmp: Path) -> ExternalBackend:
    argv = [
        str(llama_server_path()), "-m", str(smollm2()), "--host", "{host}", "--port", "{port}",
        "-c", "{ctx_size}", "-np", "{parallel}", "-t", "2", "--no-warmup",
        "--slot-save-path", "{slot_save_path}",
    ]  # fmt: skip
    section = ExternalBackendConfig(
        type="external", argv=argv, park="llama-server", ctx_size=1024, startup_timeout_s=120,
        stop_grace_s=5,
    )  # fmt: skip
    return ExternalBackend("chat", "chat", section, data_dir=tmp)


def _request(rid: str, *, chat: bool = False, max_tokens: int = 20, **body: Any) -> BackendRequest:
    fields: dict[str, Any] = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    return BackendRequest(
        request_id=rid, service="chat", kind=ServiceKind.CHAT,
        endpoint="/v1/chat/completions" if chat else "/v1/completions",
        body={"model": "chat", **fields, "max_tokens": max_tokens, "temperature": 0,
              "stream": True, **body},
        stream=True,
    )  # fmt: skip


def _events(chunks: list[bytes]) -> list[dict[str, Any]]:
    raw = b"".join(chunks)
    assert raw.endswith(b"data: [DONE]\n\n")
    return [json.loads(part[6:]) for part in raw.split(b"\n\n") if part.startswith(b"data: {")]


def _text(chunks: list[bytes]) -> str:
    out = []
    for event in _events(chunks):
        for choice in event["choices"]:
            out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


async def _whole(backend: ExternalBackend, request: BackendRequest) -> list[bytes]:
    answer = await backend.handle(request)
    assert answer.status == 200 and answer.stream is not None
    return [chunk async for chunk in answer.stream]


async def _paused(
    backend: ExternalBackend, request: BackendRequest, parks: list[bool], *, every: int = 5
) -> list[bytes]:
    """Read the stream; after every ``every`` chunks pause it (parked or not), check that
    it stays silent (and that a parked slot's file is there), then resume it."""
    answer = await backend.handle(request)
    assert answer.stream is not None
    chunks: list[bytes] = []

    async def read() -> None:
        assert answer.stream is not None
        async for chunk in answer.stream:
            chunks.append(chunk)

    reader = asyncio.create_task(read())
    for park in parks:
        target = len(chunks) + every
        while len(chunks) < target:
            await asyncio.sleep(0.002)
        await backend.pause(request.request_id, park=park)
        held = len(chunks)
        await asyncio.sleep(0.3)
        assert len(chunks) == held, "a paused stream sent something"
        files = list(backend.slot_dir.glob("*.bin"))
        if park:
            assert len(files) == 1 and files[0].stat().st_size > 0
        else:
            assert files == []
        await backend.resume(request.request_id)
        assert list(backend.slot_dir.glob("*.bin")) == []  # restored, then removed
    await reader
    return chunks


async def _paused_at_every_token(backend: ExternalBackend, request: BackendRequest) -> list[bytes]:
    answer = await backend.handle(request)
    assert answer.stream is not None
    chunks: list[bytes] = []

    async def read() -> None:
        assert answer.stream is not None
        async for chunk in answer.stream:
            chunks.append(chunk)

    reader = asyncio.create_task(read())
    before = backend.describe()["park"]["pauses"]
    while not reader.done():
        await backend.pause(request.request_id, park=False)
        await backend.resume(request.request_id)
    await reader
    assert backend.describe()["park"]["pauses"] - before >= 5
    return chunks


async def _upstream(backend: ExternalBackend, path: str, body: dict[str, Any]) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{backend.port}{path}", json=body) as resp,
    ):
        answer = await resp.json()
    choice = answer["choices"][0]
    return str(choice.get("text") or choice["message"]["content"])


def test_a_paused_and_parked_stream_equals_the_unpaused_one(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(**SIZES)
            caps = backend.capabilities
            assert caps.pause and caps.park and not caps.sleep
            # text completion: llama-server's own answer, ours unpaused, ours paused twice
            own = await _upstream(
                backend, "/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "temperature": 0}
            )
            whole = await _whole(backend, _request("a", stream_options={"include_usage": True}))
            paused = await _paused(
                backend, _request("b", stream_options={"include_usage": True}), [False, True]
            )
            assert _text(whole) == _text(paused) == own and own
            usage = _events(paused)[-1]["usage"]
            assert usage["completion_tokens"] == 20 and usage["prompt_tokens"] == 4
            assert _events(paused)[-2]["choices"][0]["finish_reason"] == "length"
            park = backend.describe()["park"]
            assert park["pauses"] == 2 and park["saves"] == 1 and park["restores"] == 1
            save, restore = park["last_save"], park["last_restore"]
            assert save["bytes"] == restore["bytes"] > 0 and save["tokens"] == restore["tokens"]
            # The restored KV was reused: only the last token was evaluated again.
            assert park["last_resumed"] == {
                "segments": 3, "prompt_cached": park["last_resumed"]["prompt_cached"],
                "prompt_evaluated": 1,
            }  # fmt: skip
            # chat: rendered by the server's template, the same as its own chat endpoint
            own_chat = await _upstream(
                backend,
                "/v1/chat/completions",
                {"messages": MESSAGES, "max_tokens": 20, "temperature": 0},
            )
            chat = await _paused(backend, _request("c", chat=True), [True])
            assert _text(chat) == own_chat and own_chat
            first = _events(chat)[0]["choices"][0]["delta"]
            assert first == {"role": "assistant", "content": ""}
            assert backend.describe()["park"]["running"] == 0
            # A stop string the text starts to match ("\n\nThe United" begins like it):
            # the server holds that text back, so no pause may stop there.
            stop = _request("d", max_tokens=10, stop="\n\nThe X")
            stop.body["prompt"] = "The capital of France is"
            whole = _text(await _whole(backend, stop))
            assert "\n\nThe" in whole
            assert _text(await _paused_at_every_token(backend, stop)) == whole
            assert backend.describe()["park"]["held_back_boundaries"] >= 2  # "\n", "\n\nThe"
        finally:
            await backend.close()

    run(body())


def test_pause_and_resume_of_what_is_not_paused(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(**SIZES)
            await backend.pause("nobody", park=True)  # unknown: nothing to pause
            with pytest.raises(BackendError, match="no paused request 'nobody'"):
                await backend.resume("nobody")
            chunks = await _whole(backend, _request("done", max_tokens=4))
            assert _text(chunks)
            await backend.pause("done", park=True)  # finished: no error
            await backend.resume("done")
            # A stream this path cannot reproduce (log probabilities) is served as it is,
            # and a pause of it says why it cannot be paused.
            answer = await backend.handle(_request("lp", max_tokens=24, logprobs=1))
            assert answer.stream is not None
            stream = aiter(answer.stream)
            await anext(stream)
            with pytest.raises(BackendError, match="cannot be paused: it names logprobs"):
                await backend.pause("lp", park=False)
            rest = [chunk async for chunk in stream]
            assert rest and rest[-1].endswith(b"[DONE]\n\n")
            await backend.pause("lp", park=False)  # ended: no error any more
            # Right after a stream: llama-server closed that connection (though it said
            # keep-alive), so it must not be reused for this request.
            plain = _request("plain", max_tokens=2)
            plain = replace(plain, stream=False, body={**plain.body, "stream": False})
            assert (await backend.handle(plain)).status == 200
            # A request paused when the backend closes (accelmux stops) ends its stream.
            answer = await backend.handle(_request("left", max_tokens=24))
            assert answer.stream is not None
            left = aiter(answer.stream)
            await anext(left)
            await backend.pause("left", park=True)
            await backend.close()
            with pytest.raises(BackendCrashedError, match="closed while left was paused"):
                async for _ in left:
                    pass
            assert list(backend.slot_dir.glob("*.bin")) == []
        finally:
            await backend.close()

    run(body())


def test_a_parked_request_resumes_across_a_restart_of_the_server(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(**SIZES)
            whole = _text(await _whole(backend, _request("a", max_tokens=24)))
            answer = await backend.handle(_request("b", max_tokens=24))
            assert answer.stream is not None
            stream = aiter(answer.stream)
            first = [await anext(stream) for _ in range(4)]
            # The upstream is read apart from the client: a pause waits for no reader.
            await backend.pause("b", park=True)
            old_pid = backend.pids()[0]
            await backend.unload()  # cold: the server stops; the slot file stays
            assert len(list(backend.slot_dir.glob("*.bin"))) == 1
            await backend.load(**SIZES)
            assert backend.pids()[0] != old_pid
            await backend.resume("b")
            rest = [chunk async for chunk in stream]
            assert _text(first + rest) == whole
            park = backend.describe()["park"]
            assert park["restores"] == 1 and park["last_resumed"]["prompt_evaluated"] == 1
        finally:
            await backend.close()

    run(body())


def test_the_gateway_serves_a_parkable_llama_server(tmp_path: Path) -> None:
    # Through the daemon, with the openai client: the shapes this path builds are
    # OpenAI's, the status shows what the server declares and what parking did.
    config = llama_config(llama_server_path(), smollm2())
    backend_section = config["services"]["chat"]["backend"]
    backend_section["argv"] += ["--slot-save-path", "{slot_save_path}"]
    backend_section["park"] = "llama-server"

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv, lv.openai(timeout=120) as client:
            stream = await client.completions.create(
                model="chat", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            pieces, usage = [], None
            async for chunk in stream:
                pieces += [c.text for c in chunk.choices]
                usage = chunk.usage or usage
            chat = await client.chat.completions.create(
                model="chat", messages=MESSAGES, max_tokens=8, temperature=0, stream=True
            )
            said = [c.choices[0].delta.content or "" async for c in chat if c.choices]
            status = next(s for s in lv.runtime.status()["services"] if s["name"] == "chat")
        assert "".join(pieces) and "".join(said)
        assert usage is not None and usage.completion_tokens == 8
        assert status["capabilities"]["pause"] and status["capabilities"]["park"]
        assert status["backend"]["park"]["slot_save_path"] == str(tmp_path / "slots" / "chat")

    run(body())
