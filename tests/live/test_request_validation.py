"""What the gateway refuses, field by field: every wrong body is a 400 ``invalid_value``
whose ``param`` names the offending field (in Ollama's shape, the message names it), and
the bodies clients really send pass. The table is the gateway's contract: the request
models (``gateway/openai_requests.py``, ``gateway/ollama_requests.py``) must keep it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.live.support import live, run

from accelmux.backends.fake_outputs import png, wav
from accelmux.gateway.openai_requests import ChatRequest, EmbeddingsRequest
from accelmux.request_validation import first_problem, param_of

CHAT = "/v1/chat/completions"
COMPLETION = "/v1/completions"
EMBED = "/v1/embeddings"
SPEECH = "/v1/audio/speech"
IMAGES = "/v1/images/generations"
DETECT = "/v1/detections"
M = [{"role": "user", "content": "hi"}]
T = [{"type": "function", "function": {"name": "f"}}]


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": M, **kw}


#: (path, body, the param of the 400)
REFUSED: list[tuple[str, Any, str]] = [
    (CHAT, {"messages": M}, "model"),
    (CHAT, {"model": "", "messages": M}, "model"),
    (CHAT, {"model": 5, "messages": M}, "model"),
    (CHAT, {"model": "chat"}, "messages"),
    (CHAT, {"model": "chat", "messages": []}, "messages"),
    (CHAT, {"model": "chat", "messages": "hi"}, "messages"),
    (CHAT, {"model": "chat", "messages": ["hi"]}, "messages[0]"),
    (CHAT, {"model": "chat", "messages": [{"content": "x"}]}, "messages[0].role"),
    (CHAT, {"model": "chat", "messages": [{"role": "", "content": "x"}]}, "messages[0].role"),
    (CHAT, {"model": "chat", "messages": [*M, {"role": 3}]}, "messages[1].role"),
    (CHAT, {"model": "chat", "messages": [{"role": "u", "content": 5}]}, "messages[0].content"),
    (CHAT, {"model": "chat", "messages": [{"role": "u", "content": ["x"]}]}, "messages[0].content"),
    (CHAT, chat(max_tokens=0), "max_tokens"),
    (CHAT, chat(max_tokens="x"), "max_tokens"),
    (CHAT, chat(max_tokens=2.5), "max_tokens"),
    (CHAT, chat(max_tokens=True), "max_tokens"),
    (CHAT, chat(max_tokens="²"), "max_tokens"),
    (CHAT, chat(max_completion_tokens=0), "max_completion_tokens"),
    (CHAT, chat(n=0), "n"),
    (CHAT, chat(n=17), "n"),
    (CHAT, chat(stream="yes"), "stream"),
    (CHAT, chat(stream=1), "stream"),
    (CHAT, chat(stream_options={"include_usage": True}), "stream_options"),
    (CHAT, chat(stream=True, stream_options=[]), "stream_options"),
    (CHAT, chat(stream=True, stream_options={"include_usage": "y"}), "stream_options"),
    (CHAT, chat(stop=["a", ""]), "stop"),
    (CHAT, chat(stop=["a"] * 5), "stop"),
    (CHAT, chat(stop=5), "stop"),
    (CHAT, chat(tools="f"), "tools"),
    (CHAT, chat(tools=["f"]), "tools[0]"),
    (CHAT, chat(tools=[{"type": "code"}]), "tools[0]"),
    (CHAT, chat(tools=[{"type": None, "function": {"name": "f"}}]), "tools[0]"),
    (CHAT, chat(tools=[{"type": "function"}]), "tools[0].function"),
    (CHAT, chat(tools=[{"function": "f"}]), "tools[0].function"),
    (CHAT, chat(tools=[{"function": {"name": "a b"}}]), "tools[0].function.name"),
    (CHAT, chat(tools=[{"function": {"name": "x" * 65}}]), "tools[0].function.name"),
    (CHAT, chat(tools=[{"function": {}}]), "tools[0].function.name"),
    (
        CHAT,
        chat(tools=[*T, {"function": {"name": "f", "parameters": []}}]),
        "tools[1].function.parameters",
    ),
    (CHAT, chat(tools=[], tool_choice="none"), "tool_choice"),
    (CHAT, chat(tool_choice="auto"), "tool_choice"),
    (CHAT, chat(tools=T, tool_choice="sometimes"), "tool_choice"),
    (CHAT, chat(tools=T, tool_choice=5), "tool_choice"),
    (CHAT, chat(tools=T, tool_choice={"function": {"name": "g"}}), "tool_choice"),
    (CHAT, chat(response_format="json"), "response_format"),
    (CHAT, chat(response_format={"type": "xml"}), "response_format"),
    (CHAT, chat(response_format={"type": "json_schema"}), "response_format"),
    (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"schema": 5}}),
        "response_format",
    ),
    (COMPLETION, {"model": "completion"}, "prompt"),
    (COMPLETION, {"model": "completion", "prompt": []}, "prompt"),
    (COMPLETION, {"model": "completion", "prompt": ["a", 1]}, "prompt"),
    (COMPLETION, {"model": "completion", "prompt": 5}, "prompt"),
    (COMPLETION, {"model": "completion", "prompt": "x", "stop": [1]}, "stop"),
    (COMPLETION, {"model": "completion", "prompt": "x", "stream_options": {}}, "stream_options"),
    (COMPLETION, {"model": "completion", "prompt": "x", "n": 0}, "n"),
    (COMPLETION, {"model": "completion", "prompt": "x", "stream": "no"}, "stream"),
    (EMBED, {"model": "embed"}, "input"),
    (EMBED, {"model": "embed", "input": []}, "input"),
    (EMBED, {"model": "embed", "input": 5}, "input"),
    (EMBED, {"model": "embed", "input": {"text": "a"}}, "input"),
    (EMBED, {"model": "embed", "input": ["a", None]}, "input[1]"),
    (EMBED, {"model": "embed", "input": ["a", [1, "x"]]}, "input[1]"),
    (EMBED, {"model": "embed", "input": ["a", True]}, "input[1]"),
    (SPEECH, {"model": "tts"}, "input"),
    (SPEECH, {"model": "tts", "input": ""}, "input"),
    (SPEECH, {"model": "tts", "input": 5}, "input"),
    (SPEECH, {"model": "tts", "input": "x" * 4097}, "input"),
    (SPEECH, {"model": "tts", "input": "hi", "voice": 5}, "voice"),
    (IMAGES, {"model": "image"}, "prompt"),
    (IMAGES, {"model": "image", "prompt": ""}, "prompt"),
    (IMAGES, {"model": "image", "prompt": "x", "n": 11}, "n"),
    (IMAGES, {"model": "image", "prompt": "x", "n": 0}, "n"),
    (IMAGES, {"model": "image", "prompt": "x", "n": None}, "n"),
    (IMAGES, {"model": "image", "prompt": "x", "size": "big"}, "size"),
    (IMAGES, {"model": "image", "prompt": "x", "size": "8x8"}, "size"),
    (IMAGES, {"model": "image", "prompt": "x", "size": "64x9000"}, "size"),
    (IMAGES, {"model": "image", "prompt": "x", "size": None}, "size"),
    (IMAGES, {"model": "image", "prompt": "x", "response_format": "png"}, "response_format"),
    (DETECT, {"model": "detect"}, "image"),
    (DETECT, {"model": "detect", "image": ""}, "image"),
    (DETECT, {"model": "detect", "image": 5}, "image"),
    (DETECT, {"model": "detect", "image": "%%%"}, "image"),
    (DETECT, {"model": "detect", "image": "aGVsbG8="}, "image"),
    (DETECT, {"image": "aGVsbG8="}, "model"),
]

#: (path, body): what clients send, taken as it is
ACCEPTED: list[tuple[str, Any]] = [
    (
        CHAT,
        {"model": "chat", "messages": [{"role": "u", "content": [{"type": "text", "text": "x"}]}]},
    ),
    (CHAT, {"model": "chat", "messages": [{"role": "user", "content": None, "name": "ann"}]}),
    (CHAT, chat(max_tokens=7, n=2)),
    # 2.0 is an integer to JSON Schema (the document's "type": "integer"), so here too
    (CHAT, chat(max_tokens=2.0, n=1.0)),
    (CHAT, chat(stream=None, stop="x")),
    (CHAT, chat(stop=["a", "b"], temperature=0.2, user="u1", seed=3, logit_bias={})),
    (CHAT, chat(tools=T, tool_choice={"type": "function", "function": {"name": "f"}})),
    (CHAT, chat(tools=T, tool_choice="required")),
    (CHAT, chat(response_format={"type": "json_object"})),
    (COMPLETION, {"model": "completion", "prompt": ""}),
    (COMPLETION, {"model": "completion", "prompt": [1, 2]}),
    (COMPLETION, {"model": "completion", "prompt": ["a"], "echo": False}),
    (EMBED, {"model": "embed", "input": ""}),
    (EMBED, {"model": "embed", "input": [1, 2, 3]}),
    (EMBED, {"model": "embed", "input": [[1, 2], [3]], "encoding_format": "float"}),
    (SPEECH, {"model": "tts", "input": "hi", "voice": "a", "speed": 1.0}),
    (IMAGES, {"model": "image", "prompt": "x", "size": "64X64"}),
    (IMAGES, {"model": "image", "prompt": "x", "size": "64x64", "response_format": "url"}),
]

#: (path, body, a word the message of the 400 holds)
OLLAMA_REFUSED: list[tuple[str, Any, str]] = [
    ("/api/chat", {}, "'model'"),
    ("/api/chat", {"model": "chat", "messages": "x"}, "'messages'"),
    ("/api/chat", {"model": "chat", "messages": ["x"]}, "'messages[0]'"),
    ("/api/chat", {"model": "chat", "messages": [{"content": "x"}]}, "'messages[0].role'"),
    (
        "/api/chat",
        {"model": "chat", "messages": [{"role": "u", "content": 5}]},
        "'messages[0].content'",
    ),
    ("/api/chat", {"model": "chat", "messages": [{"role": "u", "images": ["a"]}]}, "images"),
    (
        "/api/chat",
        {"model": "chat", "messages": [{"role": "a", "tool_calls": "x"}]},
        "'messages[0].tool_calls'",
    ),
    (
        "/api/chat",
        {"model": "chat", "messages": [{"role": "a", "tool_calls": [{"function": {}}]}]},
        "'messages[0].tool_calls[0]'",
    ),
    ("/api/chat", {"model": "chat", "messages": M, "stream": "no"}, "'stream'"),
    ("/api/chat", {"model": "chat", "messages": M, "options": []}, "'options'"),
    ("/api/chat", {"model": "chat", "messages": M, "format": "xml"}, "'format'"),
    ("/api/chat", {"model": "chat", "messages": M, "keep_alive": "soon"}, "'keep_alive'"),
    ("/api/chat", {"model": "chat", "messages": M, "keep_alive": True}, "'keep_alive'"),
    ("/api/chat", {"model": "chat", "messages": M, "keep_alive": []}, "'keep_alive'"),
    ("/api/chat", {"model": "chat", "messages": M, "tools": "x"}, "'tools'"),
    (
        "/api/chat",
        {"model": "chat", "messages": M, "tools": [{"function": {}}]},
        "'tools[0].function.name'",
    ),
    ("/api/generate", {"model": "chat", "prompt": 5}, "'prompt'"),
    ("/api/generate", {"model": "chat", "prompt": "x", "images": ["a"]}, "images"),
    ("/api/generate", {"model": "chat", "prompt": "x", "suffix": "s"}, "'suffix'"),
    ("/api/generate", {"model": "chat", "prompt": "x", "template": "t"}, "'template'"),
    ("/api/generate", {"model": "chat", "prompt": "x", "context": [1]}, "'context'"),
    ("/api/generate", {"model": "chat", "prompt": "x", "system": 5}, "'system'"),
    ("/api/generate", {"model": "completion", "prompt": "x", "format": "json"}, "'format'"),
    ("/api/embed", {"model": "embed"}, "'input'"),
    ("/api/embed", {"model": "embed", "input": []}, "'input'"),
    ("/api/embed", {"model": "embed", "input": ["a", None]}, "'input[1]'"),
    ("/api/embeddings", {"model": "embed"}, "'prompt'"),
    ("/api/embeddings", {"model": "embed", "prompt": 5}, "'prompt'"),
    ("/api/show", {}, "'model'"),
    ("/api/show", {"model": 5}, "'model'"),
]

OLLAMA_ACCEPTED: list[tuple[str, Any]] = [
    ("/api/chat", {"model": "chat", "messages": M, "stream": False, "keep_alive": "5m"}),
    ("/api/chat", {"model": "chat", "messages": M, "stream": False, "keep_alive": -1}),
    ("/api/chat", {"model": "chat", "messages": M, "stream": False, "format": ""}),
    ("/api/generate", {"model": "chat", "prompt": "x", "stream": False, "images": []}),
    ("/api/embeddings", {"model": "embed", "prompt": "a cat"}),
    ("/api/show", {"name": "chat"}),
    ("/api/show", {"model": "", "name": "chat"}),
]


def test_every_wrong_field_is_a_400_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            wrong = []
            for path, payload, param in REFUSED:
                status, out = await lv.post_any(path, json=payload)
                error = out.get("error", {}) if isinstance(out, dict) else {}
                if (status, error.get("code"), error.get("param")) != (400, "invalid_value", param):
                    wrong.append((path, payload, param, status, out))
                elif f"'{param}'" not in error["message"]:
                    wrong.append((path, payload, "message", error["message"]))
            for path, payload in ACCEPTED:
                status, out = await lv.post_any(path, json=payload)
                if status != 200:
                    wrong.append((path, payload, status, out))
            assert not wrong, wrong

    run(body())


def test_every_wrong_ollama_field_is_a_400_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            wrong = []
            for path, payload, word in OLLAMA_REFUSED:
                status, out = await lv.post_any(path, json=payload)
                if status != 400 or set(out) != {"error"} or word not in out["error"]:
                    wrong.append((path, payload, word, status, out))
            for path, payload in OLLAMA_ACCEPTED:
                status, out = await lv.post_any(path, json=payload)
                if status != 200:
                    wrong.append((path, payload, status, out))
            assert not wrong, wrong

    run(body())


def test_multipart_fields_are_named_too(tmp_path: Path) -> None:
    import aiohttp

    def form(**fields: Any) -> aiohttp.FormData:
        data = aiohttp.FormData(default_to_multipart=True)
        for key, value in fields.items():
            if isinstance(value, bytes):
                data.add_field(key, value, filename=key)
            else:
                data.add_field(key, value)
        return data

    clip, image = wav(b"\x01", 0.2), png(b"\x01\x02\x03", 8, 8)
    cases = [
        ("/v1/audio/transcriptions", form(file=clip), "model"),
        ("/v1/audio/transcriptions", form(model="asr"), "file"),
        ("/v1/audio/transcriptions", form(model="asr", file="text"), "file"),
        ("/v1/audio/transcriptions", form(model="asr", file=b"not audio"), "file"),
        (
            "/v1/audio/transcriptions",
            form(model="asr", file=clip, response_format="x"),
            "response_format",
        ),
        (DETECT, form(image=image), "model"),
        (DETECT, form(model="detect", image=b"not an image"), "image"),
        (DETECT, form(model="detect", file=b"not an image"), "image"),
        (DETECT, form(model="detect"), "image"),
    ]

    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            for path, data, param in cases:
                status, out = await lv.post_any(path, data=data)
                assert (status, out["error"]["param"]) == (400, param), (path, param, out)
            status, out = await lv.post_any(
                "/v1/audio/transcriptions", data=form(model="asr", file=clip, language="en")
            )
            assert status == 200, out
            status, out = await lv.post_any(DETECT, data=form(model="detect", file=image))
            assert status == 200 and out["width"] == 8, out

    run(body())


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        ((), None),
        (("model",), "model"),
        (("messages", 0, "role"), "messages[0].role"),
        (("tools", 2, "function", "name"), "tools[2].function.name"),
        (("input", 3), "input[3]"),
    ],
)
def test_a_location_is_written_as_openai_writes_a_param(
    loc: tuple[int | str, ...], param: str | None
) -> None:
    assert param_of(loc) == param


def test_only_the_first_problem_is_answered() -> None:
    body = {"model": 5, "messages": [], "n": 0}
    with pytest.raises(ValidationError) as info:
        ChatRequest.model_validate(body)
    assert len(info.value.errors()) == 3
    problem = first_problem(info.value)
    assert (problem.param, problem.kind) == ("model", "string_type")
    assert problem.message == "'model' must be a string"
    with pytest.raises(ValidationError) as info:
        EmbeddingsRequest.model_validate({"model": "m", "input": ["a", "b", {"x": 1}]})
    assert first_problem(info.value).param == "input[2]"
