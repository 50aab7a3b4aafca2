"""A light, deterministic fuzz of the inference endpoints: whatever JSON comes in, the
answer is a documented status in OpenAI's error shape, never a 500."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.live.support import live, run

ENDPOINTS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/audio/speech",
    "/v1/images/generations",
    "/v1/detections",
    "/v1/audio/transcriptions",
]
MODELS = ["chat", "completion", "embed", "image", "asr", "tts", "detect", "nope", ""]
KEYS = [
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "n",
    "stream",
    "size",
    "image",
    "voice",
    "role",
    "content",
    "max_completion_tokens",
    "response_format",
]


def value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 7, 2**40, 3.5, -0.0])
    if kind == 3:
        return rng.choice(["", "x", "hello " * 50, "64x64", "0x0", "data:,", "\u0000"])
    if kind == 4:
        return rng.choice(MODELS)
    if kind == 5:
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(5))}


def payload(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return value(rng)
    body = {k: value(rng, 1) for k in rng.sample(KEYS, rng.randrange(len(KEYS)))}
    if rng.random() < 0.7:
        body["model"] = rng.choice(MODELS)
    if rng.random() < 0.3:
        body["messages"] = [{"role": "user", "content": value(rng, 2)}]
    return body


def test_random_json_never_breaks_the_gateway(tmp_path: Path) -> None:
    rng = random.Random(20261130)

    async def body() -> None:
        async with live(tmp=tmp_path) as lv:
            seen: dict[int, int] = {}
            for _ in range(400):
                path = rng.choice(ENDPOINTS)
                async with lv.session.post(lv.url + path, json=payload(rng)) as resp:
                    seen[resp.status] = seen.get(resp.status, 0) + 1
                    assert resp.status in (200, 400, 404, 413, 429, 503), resp.status
                    if resp.status != 200:
                        err = (await resp.json())["error"]
                        assert {"message", "type", "param", "code"} <= set(err)
                    else:
                        await resp.read()
            assert seen.get(400, 0) > 50

    run(body())
