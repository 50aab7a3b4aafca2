"""What OpenAI clients rely on beyond plain chat (fake backends): model retrieval, usage
chunks, tools, response formats, and a 400 naming each bad field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.live.support import UPSTREAM, base_config, fake, live, run

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    }
]
MSGS: list[Any] = [{"role": "user", "content": "what time is it?"}]


def test_models_retrieve_and_unknown_model(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                m = await client.models.retrieve("gpt-test")
                assert (m.id, m.owned_by) == ("gpt-test", "accelmux")
                with pytest.raises(openai.NotFoundError):
                    await client.models.retrieve("nope")
            finally:
                await client.close()

    run(body())


def test_usage_plain_and_as_the_last_stream_chunk(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                r = await client.chat.completions.create(model="chat", messages=MSGS, max_tokens=4)
                assert r.usage is not None and 1 <= r.usage.completion_tokens <= 4
                stream = await client.chat.completions.create(
                    model="chat",
                    messages=MSGS,
                    max_tokens=4,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
                assert chunks[-1].choices == [] and chunks[-1].usage is not None
                assert all(c.usage is None for c in chunks[:-1])
                n = await client.chat.completions.create(model="chat", messages=MSGS, n=2)
                assert [c.index for c in n.choices] == [0, 1]
            finally:
                await client.close()

    run(body())


def test_tool_calls_plain_and_streamed(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                r = await client.chat.completions.create(model="chat", messages=MSGS, tools=TOOLS)
                assert r.choices[0].finish_reason == "tool_calls"
                (call,) = r.choices[0].message.tool_calls or []
                assert call.function.name == "get_time"
                stream = await client.chat.completions.create(
                    model="chat", messages=MSGS, tools=TOOLS, stream=True
                )
                deltas = [c.choices[0].delta async for c in stream if c.choices]
                names = [t.function.name for d in deltas for t in d.tool_calls or []]
                assert names == ["get_time"]
                none = await client.chat.completions.create(
                    model="chat", messages=MSGS, tools=TOOLS, tool_choice="none"
                )
                assert none.choices[0].message.tool_calls is None
            finally:
                await client.close()

    run(body())


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"tools": "get_time"}, "tools"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"n": 0}, "n"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)
def test_bad_fields_are_a_400_naming_the_field(
    tmp_path: Path, extra: dict[str, Any], param: str
) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            payload = {"model": "chat", "messages": MSGS, **extra}
            status, err, _ = await lv.post("/v1/chat/completions", json=payload)
            assert status == 400 and err["error"]["param"] == param

    run(body())


def test_a_format_the_backend_cannot_follow_is_a_400_not_ignored(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            }
            payload = {"model": "chat", "messages": MSGS, "response_format": fmt}
            status, err, _ = await lv.post("/v1/chat/completions", json=payload)
            assert status == 400 and err["error"]["param"] == "response_format"

    run(body())


def test_external_servers_get_tools_and_formats_unchanged(tmp_path: Path) -> None:
    config = base_config(
        chat={
            "kind": "chat",
            "memory": {"weights": "128MiB", "kv_per_token": "1KiB", "kv_ceiling": "64MiB"},
            "backend": {
                "type": "external",
                "argv": [sys.executable, str(UPSTREAM), "--port", "{port}"],
                "startup_timeout_s": 20,
            },
        },
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    payload = {
        "model": "chat",
        "messages": MSGS,
        "tools": TOOLS,
        "tool_choice": "required",
        "response_format": fmt,
        "n": 2,
        "stop": ["\n"],
    }

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            status, answer, _ = await lv.post("/v1/chat/completions", json=payload)
            assert status == 200, answer
            assert answer["received"] == payload
            ollama_chat = {
                "model": "chat",
                "messages": MSGS,
                "tools": TOOLS,
                "format": {"type": "object"},
                "stream": False,
            }
            status, reply, _ = await lv.post("/api/chat", json=ollama_chat)
            assert status == 200 and reply["message"]["content"].startswith("upstream echo")

    run(body())
