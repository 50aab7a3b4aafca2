"""OpenAI's response shapes, built once for every backend that answers in them (the
embedded models of ``worker/components.py``, the fake of ``backends/fake.py``): chat and
text completions, their stream chunks (SSE ``data:`` lines), the final usage chunk, and
embedding lists.

This module knows the shapes only; what goes in them (the text, the vectors, the token
counts) is the caller's.
"""

from __future__ import annotations

import json
import time
from typing import Any

#: The last line of every OpenAI stream.
DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def embedding_usage(prompt: int) -> dict[str, int]:
    """The usage of an embeddings answer (no completion tokens)."""
    return {"prompt_tokens": prompt, "total_tokens": prompt}


def chat_choice(content: str | None, *, index: int = 0, finish: str = "stop") -> dict[str, Any]:
    """One choice of a chat completion: the assistant's message."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": content},
        "finish_reason": finish,
    }


def text_choice(text: str, *, index: int = 0, finish: str = "stop") -> dict[str, Any]:
    """One choice of a text completion."""
    return {"index": index, "text": text, "finish_reason": finish}


def _completion(
    kind: str, id_prefix: str, model: str, rid: str, choices: list[dict[str, Any]],
    usage: dict[str, int],
) -> dict[str, Any]:  # fmt: skip
    return {
        "id": f"{id_prefix}-{rid}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def chat_completion(
    model: str, rid: str, choices: list[dict[str, Any]], usage: dict[str, int]
) -> dict[str, Any]:
    return _completion("chat.completion", "chatcmpl", model, rid, choices, usage)


def text_completion(
    model: str, rid: str, choices: list[dict[str, Any]], usage: dict[str, int]
) -> dict[str, Any]:
    return _completion("text_completion", "cmpl", model, rid, choices, usage)


def embeddings_list(model: str, vectors: list[Any], usage: dict[str, int]) -> dict[str, Any]:
    """An embeddings answer: one item per vector (a list of floats, or base64), in order."""
    data = [
        {"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)
    ]
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(model: str, rid: str, delta: dict[str, Any], finish: str | None) -> bytes:
    return _sse(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def text_chunk(model: str, rid: str, text: str, finish: str | None) -> bytes:
    return _sse(
        {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        }
    )


def usage_chunk(model: str, rid: str, usage: dict[str, int], *, chat: bool = True) -> bytes:
    """The last chunk of a stream asked with ``stream_options.include_usage``."""
    return _sse(
        {
            "id": f"chatcmpl-{rid}" if chat else f"cmpl-{rid}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "usage": usage,
        }
    )


def wants_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asked for a final usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
