"""Every OpenAI-compatible endpoint through the real HTTP gateway (fake backends)."""

from __future__ import annotations

import base64
import io
import json
import wave
from pathlib import Path

import aiohttp
import openai
import pytest
from tests.live.support import live, run

from accelmux.backends.fake_outputs import png


def _wav(seconds: float = 0.5) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x00" * int(16000 * seconds))
    return buf.getvalue()


def test_models_lists_names_and_aliases(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                ids = [m.id async for m in client.models.list()]
            finally:
                await client.close()
            assert {"chat", "gpt-test", "embed", "image", "asr", "tts", "detect"} <= set(ids)

    run(body())


def test_chat_and_completion_plain_and_streaming(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                msgs = [{"role": "user", "content": "hello"}]
                r = await client.chat.completions.create(model="gpt-test", messages=msgs)
                assert r.choices[0].message.content
                again = await client.chat.completions.create(model="chat", messages=msgs)
                assert again.choices[0].message.content == r.choices[0].message.content
                stream = await client.chat.completions.create(
                    model="chat", messages=msgs, stream=True, max_tokens=5
                )
                parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
                assert 1 <= len([p for p in parts if p]) <= 5
                c = await client.completions.create(model="completion", prompt="once upon")
                assert c.choices[0].text
                s = await client.completions.create(
                    model="completion", prompt="once", stream=True, max_tokens=3
                )
                texts = [ch.choices[0].text async for ch in s]
                assert "".join(texts).strip()
            finally:
                await client.close()

    run(body())


def test_embeddings_speech_images(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                e = await client.embeddings.create(model="embed", input=["a", "b"])
                assert len(e.data) == 2 and len(e.data[0].embedding) == 64
                e2 = await client.embeddings.create(model="embed", input="a")
                assert e2.data[0].embedding == e.data[0].embedding
                audio = await client.audio.speech.create(model="tts", voice="x", input="hi there")
                assert audio.content[:4] == b"RIFF"
                img = await client.images.generate(model="image", prompt="a cat", size="64x32")
                raw = base64.b64decode(img.data[0].b64_json or "")
                assert raw[:8] == b"\x89PNG\r\n\x1a\n"
            finally:
                await client.close()

    run(body())


def test_transcription_multipart(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                t = await client.audio.transcriptions.create(
                    model="asr", file=("a.wav", _wav(), "audio/wav")
                )
                assert t.text.startswith("fake transcript")
            finally:
                await client.close()

    run(body())


def test_detections_json_and_multipart(tmp_path: Path) -> None:
    image = png(b"\x01\x02\x03\x04" * 8, 200, 100)

    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            b64 = base64.b64encode(image).decode()
            status, out, _ = await lv.post("/v1/detections", json={"model": "detect", "image": b64})
            assert status == 200, out
            assert out["width"] == 200 and out["height"] == 100
            assert out["detections"] and {"label", "score", "box"} <= set(out["detections"][0])
            form = aiohttp.FormData()
            form.add_field("model", "detect")
            form.add_field("image", image, filename="x.png", content_type="image/png")
            status2, out2, _ = await lv.post("/v1/detections", data=form)
            assert status2 == 200 and out2["detections"] == out["detections"]

    run(body())


def test_unknown_model_is_404_in_openai_shape(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            client = lv.openai()
            try:
                with pytest.raises(openai.NotFoundError) as info:
                    await client.chat.completions.create(
                        model="nope", messages=[{"role": "user", "content": "x"}]
                    )
            finally:
                await client.close()
            err = info.value.body
            assert isinstance(err, dict)
            assert err["param"] == "model" and err["code"] == "model_not_found"

    run(body())


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"model": "chat"}, "messages"),
        ({"model": "chat", "messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "chat", "messages": [{"content": "x"}]}, "messages[0].role"),
        (
            {"model": "chat", "messages": [{"role": "u", "content": "x"}], "max_tokens": 0},
            "max_tokens",
        ),
        ({"model": "chat", "messages": [{"role": "u", "content": "x"}], "stream": "yes"}, "stream"),
        ({"model": "embed", "messages": [{"role": "u", "content": "x"}]}, "model"),
    ],
)
def test_bad_field_is_400_naming_it(tmp_path: Path, payload: dict[str, object], param: str) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            status, out, _ = await lv.post("/v1/chat/completions", json=payload)
            assert status == 400, out
            assert out["error"]["param"] == param
            assert out["error"]["type"] == "invalid_request_error"

    run(body())


def test_invalid_json_and_wrong_types(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            status, out, _ = await lv.post(
                "/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"}
            )
            assert status == 400 and "JSON" in out["error"]["message"]
            status, out, _ = await lv.post("/v1/embeddings", json=[1, 2])
            assert status == 400
            status, out, _ = await lv.post(
                "/v1/images/generations", json={"model": "image", "prompt": "x", "size": "big"}
            )
            assert status == 400 and out["error"]["param"] == "size"
            status, out, _ = await lv.post("/v1/audio/transcriptions", json={"model": "asr"})
            assert status == 400 and out["error"]["param"] == "file"
            status, out, _ = await lv.post(
                "/v1/detections", json={"model": "detect", "image": "%%%"}
            )
            assert status == 400 and out["error"]["param"] == "image"

    run(body())


def test_body_over_limit_is_413(tmp_path: Path) -> None:
    from tests.live.support import base_config

    cfg = base_config()
    cfg["server"]["max_body"] = 2048

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            payload = {"model": "chat", "messages": [{"role": "user", "content": "x" * 5000}]}
            status, out, _ = await lv.post("/v1/chat/completions", json=payload)
            assert status == 413 and out["error"]["code"] == "body_too_large"

    run(body())


def test_context_too_large_is_413_with_policy_reason(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            # kv ceiling 256 MiB / 64 KiB per token = 4096 tokens
            payload = {
                "model": "chat",
                "messages": [{"role": "user", "content": "word " * 4000}],
                "max_tokens": 2000,
            }
            status, out, headers = await lv.post("/v1/chat/completions", json=payload)
            assert status == 413, out
            assert out["error"]["code"] == "too_large"
            rid = headers["X-Request-Id"]
            status, story = await lv.get(f"/admin/explain/{rid}")
            assert status == 200 and any("too_large" in line for line in story["lines"])

    run(body())


def test_openapi_documents_every_route(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(tmp=tmp_path, extras=True) as lv:
            status, doc = await lv.get("/openapi.json")
            assert status == 200 and doc["openapi"].startswith("3.")
            routes = {r.resource.canonical for r in lv.app.router.routes() if r.resource}
            documented = set(doc["paths"])
            for path in (
                "/v1/models",
                "/v1/models/{model}",
                "/api/chat",
                "/api/generate",
                "/api/embed",
                "/api/embeddings",
                "/api/tags",
                "/api/ps",
                "/api/show",
                "/api/version",
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/embeddings",
                "/v1/audio/transcriptions",
                "/v1/audio/speech",
                "/v1/images/generations",
                "/v1/detections",
                "/admin/status",
                "/admin/services/{name}/{op}",
                "/admin/explain/{request_id}",
                "/admin/events",
                "/metrics",
            ):
                assert path in documented
            assert routes <= documented | {"/openapi.json", "/dashboard", "/dashboard/"}, (
                routes - documented
            )
            json.dumps(doc)

    run(body())
