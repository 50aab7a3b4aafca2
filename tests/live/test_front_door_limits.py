"""The front door under heavy and hostile bodies: per-route size limits checked before and
while a body is read, item counts checked before validation, parsing off the event loop,
strict field types and ranges, and errors that name the field (in Ollama's shape and
words on ``/api``)."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, daemon, live, run

M = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f"}}


def _config(**limits: Any) -> dict[str, Any]:
    cfg = base_config()
    if limits:
        cfg["server"]["limits"] = limits
    return cfg


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": M, **kw}


# ---- sizes and counts ----------------------------------------------------------------------
def test_a_body_over_its_route_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = {"model": "chat", "messages": [{"role": "user", "content": "x" * 300_000}]}

    async def chunked(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 16_384):
            yield data[i : i + 16_384]

    async def body() -> None:
        async with live(_config(chat_body="64KiB", small_body="64KiB"), tmp=tmp_path) as lv:
            status, out, _ = await lv.post("/v1/chat/completions", json=big)
            assert status == 413, out
            assert out["error"]["code"] == "body_too_large"
            assert "server.limits.chat_body" in out["error"]["message"]
            # without a Content-Length the read stops at the limit
            raw = json.dumps(big).encode()
            headers = {"Content-Type": "application/json"}
            status, out, _ = await lv.post(
                "/v1/chat/completions", data=chunked(raw), headers=headers
            )
            assert (status, out["error"]["code"]) == (413, "body_too_large"), out
            # the same size is fine on a route with a larger limit
            status, out, _ = await lv.post(
                "/v1/embeddings", json={"model": "embed", "input": "x" * 300_000}
            )
            assert status == 200, out
            # Ollama's route answers in Ollama's shape
            status, out, _ = await lv.post("/api/chat", json=big)
            assert status == 413 and isinstance(out["error"], str), out
            assert "server.limits.chat_body" in out["error"]

    run(body())


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_client_that_expects_100_continue_is_refused_before_it_sends(
    tmp_path: Path, path: str
) -> None:
    """``Expect: 100-continue`` with a Content-Length over the route's limit: the answer
    is the 413 (not 100 Continue), and the client never has to send the body."""
    with daemon(base_config(), tmp_path) as d:
        port = int(d.url.rsplit(":", 1)[1])
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {20 * 1024**2}\r\nExpect: 100-continue\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


COUNTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/chat/completions", {"model": "chat", "messages": M * 11}, "messages", "messages"),
    ("/v1/chat/completions", _chat(tools=[TOOL] * 4), "tools", "tools"),
    (
        "/v1/chat/completions",
        {"model": "chat", "messages": [{"role": "user", "content": [{"type": "text"}] * 6}]},
        "messages[0].content",
        "content_parts",
    ),
    ("/v1/embeddings", {"model": "embed", "input": ["a"] * 9}, "input", "embedding_inputs"),
]


@pytest.mark.parametrize(
    "where",
    [{}, {"offload_body": 0}, {"offload_body": 0, "preflight_body": 0}],
    ids=["in-place", "thread", "process"],
)
def test_item_counts_over_a_limit_are_400s_naming_field_and_limit(
    tmp_path: Path, where: dict[str, Any]
) -> None:
    cfg = _config(messages=10, tools=3, content_parts=5, embedding_inputs=8, **where)

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            wrong = []
            for path, payload, param, key in COUNTS:
                status, out, _ = await lv.post(path, json=payload)
                err = out.get("error", {})
                got = (status, err.get("code"), err.get("param"))
                if got != (400, "limit_exceeded", param) or key not in err.get("message", ""):
                    wrong.append((path, param, status, out))
            ollama = [
                ("/api/chat", {"model": "chat", "messages": M * 11}, "messages"),
                ("/api/embed", {"model": "embed", "input": ["a"] * 9}, "input"),
            ]
            for path, payload, word in ollama:
                status, out, _ = await lv.post(path, json=payload)
                if status != 400 or not isinstance(out["error"], str) or word not in out["error"]:
                    wrong.append((path, status, out))
            assert not wrong, wrong

    run(body())


def test_a_huge_valid_chat_body_is_refused_at_the_door_by_default(tmp_path: Path) -> None:
    """23 MiB of 700,000 short messages: under server.max_body, over the chat route's."""
    raw = json.dumps({"model": "chat", "messages": [{"role": "u", "content": "hi"}] * 700_000})

    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            headers = {"Content-Type": "application/json"}
            data = io.BytesIO(raw.encode())
            status, out, _ = await lv.post("/v1/chat/completions", data=data, headers=headers)
            assert (status, out["error"]["code"]) == (413, "body_too_large"), out

    run(body())


def _http(port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_other_requests_are_served_while_a_big_body_is_parsed(tmp_path: Path) -> None:
    """Limits raised so that a 300,000-message body is parsed: speech requests sent after
    it was sent complete, several of them, before its answer comes."""
    cfg = _config(chat_body="24MiB", messages=1_000_000, offload_body=0)
    raw = json.dumps({"model": "chat", "messages": [{"role": "u", "content": "hi"}] * 300_000})
    with daemon(cfg, tmp_path, timeout=60) as d:
        port = int(d.url.rsplit(":", 1)[1])
        done = threading.Event()
        answer: list[bytes] = []

        def attacker() -> None:
            answer.append(_http(port, "/v1/chat/completions", raw.encode()))
            done.set()

        thread = threading.Thread(target=attacker)
        thread.start()
        served = 0
        speech = json.dumps({"model": "tts", "input": "hi"}).encode()
        while not done.is_set() and served < 5:
            reply = _http(port, "/v1/audio/speech", speech)
            served += reply.startswith(b"HTTP/1.1 200")
        thread.join(timeout=120)
        assert answer, "no answer to the big request"
        assert served >= 5, f"only {served} speech requests finished before the big one"


# ---- strict types and ranges ---------------------------------------------------------------
CHAT = "/v1/chat/completions"
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (CHAT, _chat(temperature="hot"), "temperature"),
    (CHAT, _chat(temperature=3), "temperature"),
    (CHAT, _chat(top_p=1.5), "top_p"),
    (CHAT, _chat(max_tokens="5"), "max_tokens"),
    (CHAT, _chat(n="2"), "n"),
    (CHAT, _chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    (CHAT, _chat(frequency_penalty=5), "frequency_penalty"),
    (CHAT, _chat(seed="1"), "seed"),
    ("/v1/completions", {"model": "completion", "prompt": "x", "temperature": "1"}, "temperature"),
    (
        "/v1/embeddings",
        {"model": "embed", "input": "a", "encoding_format": "bogus"},
        "encoding_format",
    ),
    ("/v1/embeddings", {"model": "embed", "input": "a", "dimensions": "8"}, "dimensions"),
    (
        "/v1/audio/speech",
        {"model": "tts", "input": "hi", "response_format": "ogg"},
        "response_format",
    ),
    ("/v1/images/generations", {"model": "image", "prompt": "x", "n": "2"}, "n"),
]


def test_wrong_types_and_out_of_range_values_are_400s(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            wrong = []
            for path, payload, param in REFUSED:
                status, out = await lv.post_any(path, json=payload)
                err = out.get("error", {}) if isinstance(out, dict) else {}
                if (status, err.get("param")) != (400, param):
                    wrong.append((path, payload, status, out))
            assert not wrong, wrong

    run(body())


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "chat", "messages": [{"role": "u", "content": "hi"}], "temperature": NaN}',
        b'{"model": "chat", "messages": [{"role": "u", "content": "hi"}], "top_p": Infinity}',
        b'{"model": "chat", "messages": [{"role": "u", "content": "hi"}], "top_p": -Infinity}',
        b'{"model": "chat", "messages": [{"role": "u", "content": "hi"}], "temperature": 1e999}',
    ],
)
def test_nan_and_infinity_are_not_json(tmp_path: Path, raw: bytes) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            headers = {"Content-Type": "application/json"}
            status, out, _ = await lv.post("/v1/chat/completions", data=raw, headers=headers)
            assert (status, out["error"]["code"]) == (400, "invalid_json"), out
            status, out, _ = await lv.post("/api/chat", data=raw, headers=headers)
            assert status == 400 and isinstance(out["error"], str), out

    run(body())


OLLAMA_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"options": {"num_predict": "lots"}}, "options.num_predict"),
    ({"options": {"num_ctx": 1e12}}, "options.num_ctx"),
    ({"options": {"num_ctx": 10**12}}, "options.num_ctx"),
    ({"options": {"num_ctx": "big"}}, "options.num_ctx"),
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"top_p": 7}}, "options.top_p"),
    ({"options": {"seed": 1.5}}, "options.seed"),
    ({"keep_alive": "Infinity"}, "keep_alive"),
    ({"keep_alive": "nan"}, "keep_alive"),
]


def test_ollama_options_are_checked_by_their_own_names(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            wrong = []
            for extra, word in OLLAMA_REFUSED:
                payload = {"model": "chat", "messages": M, "stream": False, **extra}
                status, out, _ = await lv.post("/api/chat", json=payload)
                if status != 400 or not isinstance(out["error"], str) or word not in out["error"]:
                    wrong.append((extra, status, out))
            headers = {"Content-Type": "application/json"}
            raw = b'{"model": "chat", "messages": [], "keep_alive": Infinity}'
            status, out, _ = await lv.post("/api/chat", data=raw, headers=headers)
            if status != 400:
                wrong.append(("Infinity", status, out))
            ok = {"model": "chat", "messages": M, "stream": False}
            ok["options"] = {"num_predict": 8, "num_ctx": 4096, "temperature": 0, "seed": 3}
            status, out, _ = await lv.post("/api/chat", json=ok)
            if status != 200:
                wrong.append(("ok", status, out))
            assert not wrong, wrong

    run(body())


def test_n_and_prompt_lists_are_served_or_refused_by_name(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            # n choices are generated (chat and completion)
            for path, payload in (
                (CHAT, _chat(n=3, max_tokens=4)),
                ("/v1/completions", {"model": "completion", "prompt": "x", "n": 3}),
            ):
                status, out, _ = await lv.post(path, json=payload)
                assert status == 200, out
                assert [c["index"] for c in out["choices"]] == [0, 1, 2], out
            # a stream holds one choice: n > 1 is refused there, by name
            status, out, _ = await lv.post(CHAT, json=_chat(n=2, stream=True))
            assert (status, out["error"]["param"]) == (400, "n"), out
            # several prompts in one request are refused, by name
            payload = {"model": "completion", "prompt": ["a", "b"]}
            status, out, _ = await lv.post("/v1/completions", json=payload)
            assert status == 400, out
            assert (out["error"]["param"], out["error"]["code"]) == ("prompt", "unsupported")
            # one prompt in a list is one prompt
            payload = {"model": "completion", "prompt": ["a"]}
            status, out, _ = await lv.post("/v1/completions", json=payload)
            assert status == 200 and len(out["choices"]) == 1, out

    run(body())


def test_embeddings_encoding_and_dimensions_are_honest(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            payload = {"model": "embed", "input": ["a", "b"]}
            status, plain, _ = await lv.post("/v1/embeddings", json=payload)
            assert status == 200, plain
            vector = plain["data"][0]["embedding"]
            status, out, _ = await lv.post(
                "/v1/embeddings", json={**payload, "encoding_format": "base64"}
            )
            assert status == 200, out
            packed = base64.b64decode(out["data"][0]["embedding"])
            decoded = struct.unpack(f"<{len(packed) // 4}f", packed)
            assert decoded == pytest.approx(vector, abs=1e-6)
            # the native size is accepted; any other is refused by name
            status, out, _ = await lv.post(
                "/v1/embeddings", json={**payload, "dimensions": len(vector)}
            )
            assert status == 200, out
            status, out, _ = await lv.post(
                "/v1/embeddings", json={**payload, "dimensions": len(vector) // 2}
            )
            assert (status, out["error"]["param"]) == (400, "dimensions"), out
            # the official client asks for base64 and gets floats
            client = lv.openai()
            try:
                answer = await client.embeddings.create(model="embed", input="a")
                assert answer.data[0].embedding == pytest.approx(vector, abs=1e-6)
            finally:
                await client.close()

    run(body())


def test_speech_serves_only_the_formats_it_produces(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            url = lv.url + "/v1/audio/speech"
            for fmt, ctype in (("wav", "audio/wav"), ("pcm", "audio/pcm")):
                payload = {"model": "tts", "input": "hi", "response_format": fmt}
                async with lv.session.post(url, json=payload) as resp:
                    data = await resp.read()
                    assert (resp.status, resp.content_type) == (200, ctype), data[:200]
                    assert data.startswith(b"RIFF") == (fmt == "wav")
            status, out, _ = await lv.post(
                "/v1/audio/speech", json={"model": "tts", "input": "hi", "response_format": "mp3"}
            )
            assert (status, out["error"]["param"]) == (400, "response_format"), out
            assert "wav" in out["error"]["message"] and "pcm" in out["error"]["message"]

    run(body())


# ---- what an error names -------------------------------------------------------------------
def test_a_413_from_max_tokens_names_max_tokens(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            for field in ("max_tokens", "max_completion_tokens"):
                status, out, _ = await lv.post(CHAT, json=_chat(**{field: 10_000_000}))
                assert (status, out["error"]["param"]) == (413, field), out
            payload = {"model": "completion", "prompt": "x", "max_tokens": 10_000_000}
            status, out, _ = await lv.post("/v1/completions", json=payload)
            assert (status, out["error"]["param"]) == (413, "max_tokens"), out
            payload = {"model": "chat", "messages": [{"role": "u", "content": "x" * 100_000}]}
            status, out, _ = await lv.post(CHAT, json=payload)
            assert (status, out["error"]["param"]) == (413, "messages"), out
            ollama = {"model": "chat", "messages": M, "stream": False}
            ollama["options"] = {"num_predict": 10_000_000}
            status, out, _ = await lv.post("/api/chat", json=ollama)
            assert status == 413 and "options.num_predict" in out["error"], out

    run(body())


def test_a_streamed_tool_call_counts_its_tokens(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            payload = _chat(tools=[TOOL], stream=True, stream_options={"include_usage": True})
            async with lv.session.post(lv.url + CHAT, json=payload) as resp:
                text = await resp.text()
            events = [
                json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")
            ]
            usage = events[-1]["usage"]
            assert usage["completion_tokens"] > 0, usage
            _, out, _ = await lv.post(CHAT, json=_chat(tools=[TOOL]))
            assert out["usage"]["completion_tokens"] == usage["completion_tokens"], out

    run(body())


def test_ollama_errors_keep_ollama_shape_and_words(tmp_path: Path) -> None:
    cfg = _config()
    cfg["server"]["api_keys"] = ["k"]
    auth = {"Authorization": "Bearer k"}

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            # refused by a middleware (no key): still Ollama's shape
            status, out, _ = await lv.post("/api/chat", json=_chat())
            assert status == 401 and isinstance(out["error"], str), out
            # a model of the wrong kind: the message speaks of /api, never of /v1
            status, out, _ = await lv.post(
                "/api/embed", json={"model": "chat", "input": "a"}, headers=auth
            )
            assert status == 400 and isinstance(out["error"], str), out
            assert "/v1" not in out["error"], out
            for path, payload in (
                ("/api/chat", {"model": "embed", "messages": M}),
                ("/api/generate", {"model": "embed", "prompt": "x"}),
                ("/api/chat", {"model": "nope", "messages": M}),
            ):
                status, out, _ = await lv.post(path, json=payload, headers=auth)
                assert status in (400, 404) and isinstance(out["error"], str), out
                assert "/v1" not in out["error"], out
            # a translated field is named as the client wrote it
            payload = {"model": "chat", "messages": M, "format": {"type": 5}, "stream": False}
            payload["options"] = {"stop": [""]}
            status, out, _ = await lv.post("/api/chat", json=payload, headers=auth)
            assert status == 400 and "options.stop" in out["error"], out

    run(body())
