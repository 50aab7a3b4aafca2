"""The Ollama API through the real HTTP gateway, spoken by the official ``ollama`` client
(fake backends): chat, generate, embeddings, listings, keep_alive and errors."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import ollama
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.live.support import base_config, fake, live, run, settle

from accelmux import openai_shapes as shapes
from accelmux.core.types import ServiceStatus
from accelmux.gateway.ollama_relay import OllamaRelay

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "description": "Turns on a device",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
]


def _client(url: str, **kw: Any) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=url, **kw)


def test_chat_and_generate_plain_and_streamed(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, _client(lv.url) as client:
            msgs = [{"role": "user", "content": "hello"}]
            r = await client.chat(model="chat", messages=msgs, options={"num_predict": 6})
            assert r.done and r.done_reason == "stop"
            assert r.message.role == "assistant" and r.message.content
            assert r.eval_count and r.eval_count <= 6 and r.prompt_eval_count
            parts = [
                p async for p in await client.chat(model="chat:latest", messages=msgs, stream=True)
            ]
            assert parts[-1].done and not any(p.done for p in parts[:-1])
            assert "".join(p.message.content or "" for p in parts).strip()
            assert parts[-1].eval_count == len([p for p in parts[:-1] if p.message.content])
            g = await client.generate(model="completion", prompt="once upon", stream=False)
            assert g.done and g.response
            g2 = await client.generate(model="chat", prompt="hi", system="be brief", stream=False)
            assert g2.response
            chunks = [
                c async for c in await client.generate(model="completion", prompt="x", stream=True)
            ]
            assert chunks[-1].done and "".join(c.response for c in chunks).strip()

    run(body())


def test_embed_and_legacy_embeddings(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, _client(lv.url) as client:
            e = await client.embed(model="embed", input=["a cat", "a kitten"])
            assert len(e.embeddings) == 2 and len(e.embeddings[0]) > 8
            one = await client.embeddings(model="embed", prompt="a cat")
            assert list(one.embedding) == pytest.approx(list(e.embeddings[0]))

    run(body())


def test_listings_show_and_version(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, _client(lv.url) as client:
            names = {m.model for m in (await client.list()).models}
            assert {"chat", "gpt-test", "completion", "embed"} <= names
            assert not names & {"asr", "tts", "image", "detect"}
            shown = await client.show("chat")
            assert "tools" in (shown.capabilities or [])
            assert (await client.show("embed")).capabilities == ["embedding"]
            status, version = await lv.get("/api/version")
            assert status == 200 and version["version"]
            with pytest.raises(ollama.ResponseError) as err:
                await client.show("nope")
            assert err.value.status_code == 404 and "nope" in err.value.error

    run(body())


def _expiry(entry: Any) -> datetime:
    return entry.expires_at.astimezone(UTC)


def test_keep_alive_sets_the_idle_ttl_and_zero_unloads(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, _client(lv.url) as client:
            svc = lv.runtime.manager.world.services["chat"]
            loaded = await client.generate(model="chat", prompt="", keep_alive="1h")
            assert loaded.done_reason == "load" and svc.status is ServiceStatus.LOADED
            (entry,) = [m for m in (await client.ps()).models if m.model == "chat"]
            left = _expiry(entry) - datetime.now(UTC)
            assert timedelta(minutes=55) < left <= timedelta(hours=1)
            assert entry.size and entry.size >= svc.spec.profile.weights
            await client.chat(
                model="chat", messages=[{"role": "user", "content": "hi"}], keep_alive=-1
            )
            (entry,) = [m for m in (await client.ps()).models if m.model == "chat"]
            assert _expiry(entry).year == 9999
            stopped = await client.generate(model="chat", prompt="", keep_alive=0)
            assert stopped.done_reason == "unload"
            await settle(lambda: svc.status is ServiceStatus.UNLOADED)
            assert "chat" not in {m.model for m in (await client.ps()).models}

    run(body())


def test_keep_alive_zero_does_not_unload_a_pinned_service(tmp_path: Path) -> None:
    config = base_config()
    config["services"]["chat"]["residency"] = "pinned"

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv, _client(lv.url) as client:
            svc = lv.runtime.manager.world.services["chat"]
            await settle(lambda: svc.status is ServiceStatus.LOADED)
            await client.chat(
                model="chat", messages=[{"role": "user", "content": "x"}], keep_alive=0
            )
            assert svc.status is ServiceStatus.LOADED
            (entry,) = [m for m in (await client.ps()).models if m.model == "chat"]
            assert _expiry(entry).year == 9999

    run(body())


def test_tools_and_format_reach_the_backend(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv, _client(lv.url) as client:
            msgs = [{"role": "user", "content": "turn on the light"}]
            r = await client.chat(model="chat", messages=msgs, tools=TOOLS)
            (call,) = r.message.tool_calls or []
            assert call.function.name == "HassTurnOn" and call.function.arguments == {}
            parts = [
                p
                async for p in await client.chat(
                    model="chat", messages=msgs, tools=TOOLS, stream=True
                )
            ]
            streamed = [c for p in parts for c in p.message.tool_calls or []]
            assert [c.function.name for c in streamed] == ["HassTurnOn"]
            assert parts[-1].done and parts[-1].done_reason == "stop"
            follow = [
                *msgs,
                {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                {"role": "tool", "content": '{"ok": true}', "tool_name": "HassTurnOn"},
            ]
            again = await client.chat(model="chat", messages=follow)
            assert again.message.content
            j = await client.chat(model="chat", messages=msgs, format="json")
            assert j.message.content.startswith("{")
            with pytest.raises(ollama.ResponseError) as err:  # the fake cannot: a clear 400
                await client.chat(model="chat", messages=msgs, format={"type": "object"})
            assert err.value.status_code == 400 and "schema" in err.value.error

    run(body())


def test_errors_come_in_ollama_shape_with_the_policy_reason(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            huge = {"model": "chat", "messages": [{"role": "user", "content": "x"}]}
            huge["options"] = {"num_predict": 10_000_000}
            status, err, _ = await lv.post("/api/chat", json=huge)
            assert status == 413 and err["error"].startswith("too_large")
            status, err, _ = await lv.post("/api/chat", json={"model": "nope", "messages": []})
            assert (status, err) == (404, {"error": "model 'nope' not found"})
            bad = {"model": "chat", "messages": [], "keep_alive": "soon"}
            status, err, _ = await lv.post("/api/chat", json=bad)
            assert status == 400 and "keep_alive" in err["error"]
            status, err, _ = await lv.post("/api/embed", json={"model": "chat", "input": "x"})
            assert status == 400 and set(err) == {"error"}
            img = {"model": "chat", "messages": [{"role": "user", "content": "x", "images": ["a"]}]}
            status, err, _ = await lv.post("/api/chat", json=img)
            assert status == 400 and "images" in err["error"]
            fim = {"model": "completion", "prompt": "def f(", "suffix": "return 1"}
            status, err, _ = await lv.post("/api/generate", json=fim)
            assert status == 400 and "suffix" in err["error"]

    run(body())


def test_ollama_requests_queue_and_are_refused_like_any_other(tmp_path: Path) -> None:
    config = base_config()
    chat = config["services"]["chat"]
    chat.update(concurrency=1, queue={"limit": 1, "deadline_s": 10})
    chat["backend"] = fake(latency_s=0.3)
    one = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": False}

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            world = lv.runtime.manager.world
            first = asyncio.create_task(lv.post("/api/chat", json=one))
            await settle(lambda: world.inflight)
            second = asyncio.create_task(lv.post("/api/chat", json=one))
            await settle(lambda: world.waiting)
            status, err, headers = await lv.post("/api/chat", json=one)
            assert status == 429 and err["error"].startswith("queue_full")
            assert int(headers["Retry-After"]) >= 1
            for task in (first, second):  # the admitted two are served in turn
                status, answer, _ = await task
                assert status == 200 and answer["done"]

    run(body())


def test_api_keys_guard_the_ollama_api(tmp_path: Path) -> None:
    config = copy.deepcopy(base_config())
    config["server"]["api_keys"] = ["sekret"]

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            async with _client(lv.url) as anonymous:
                with pytest.raises(ollama.ResponseError) as err:
                    await anonymous.list()
            assert err.value.status_code == 401
            async with _client(lv.url, headers={"Authorization": "Bearer sekret"}) as ok:
                assert (await ok.list()).models

    run(body())


def _sse_stream() -> bytes:
    rid, model = "r1", "chat"
    parts = [
        shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None),
        shapes.chat_chunk(model, rid, {"content": "Hel"}, None),
        shapes.chat_chunk(model, rid, {"content": "lo"}, None),
        shapes.chat_chunk(
            model,
            rid,
            {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a"'}}]},
            None,
        ),
        shapes.chat_chunk(
            model, rid, {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, None
        ),
        shapes.chat_chunk(model, rid, {}, "tool_calls"),
        shapes.usage_chunk(model, rid, shapes.usage(7, 3)),
        shapes.DONE,
    ]
    return b"".join(parts)


def _relay_lines(cuts: list[int]) -> list[dict[str, Any]]:
    data = _sse_stream()
    relay = OllamaRelay("chat", chat_api=True, chat_backend=True)
    pieces, last = [], 0
    for cut in sorted(cuts):
        pieces.append(data[last:cut])
        last = cut
    pieces.append(data[last:])
    raw = b"".join(relay.chunk(p) for p in pieces) + relay.end()
    lines = [json.loads(line) for line in raw.splitlines()]
    for line in lines:
        line.pop("created_at")
        line.pop("total_duration", None)
    return lines


@given(st.lists(st.integers(min_value=0, max_value=len(_sse_stream())), max_size=12))
def test_ndjson_does_not_depend_on_how_the_sse_stream_was_split(cuts: list[int]) -> None:
    lines = _relay_lines(cuts)
    assert lines == _relay_lines([])
    assert [line["message"]["content"] for line in lines] == ["Hel", "lo", "", ""]
    call = lines[2]["message"]["tool_calls"]
    assert call == [{"function": {"name": "f", "arguments": {"a": 1}}}]
    final = lines[-1]
    assert final["done"] and final["done_reason"] == "stop"
    assert (final["prompt_eval_count"], final["eval_count"]) == (7, 3)
