"""Ollama's answer shapes, made from OpenAI ones: the relays of the Ollama API.

:class:`OllamaRelay` turns a chat or text completion (one JSON object, or an SSE stream
split anywhere) into ``/api/chat`` or ``/api/generate`` answers: one JSON object, or
NDJSON lines ending with a ``done`` line that carries the token counts. Tool calls get
their arguments as objects and come, whole, in one line before the last.
:class:`EmbedRelay` does the same for ``/api/embed`` and ``/api/embeddings``.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from accelmux.gateway.errors import ApiError


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def error_response(err: ApiError) -> web.Response:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    resp = web.json_response({"error": err.message}, status=err.status, headers=headers)
    if err.close:
        resp.force_close()
    return resp


def _timings(usage: dict[str, Any] | None, started: float) -> dict[str, Any]:
    total = int((time.perf_counter() - started) * 1e9)
    out: dict[str, Any] = {"total_duration": total, "load_duration": 0}
    if usage:
        out["prompt_eval_count"] = int(usage.get("prompt_tokens") or 0)
        out["eval_count"] = int(usage.get("completion_tokens") or 0)
    return out


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for call in calls or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else (args or {})
        except ValueError:
            parsed = {"_raw": args}
        out.append({"function": {"name": fn.get("name"), "arguments": parsed}})
    return out


class OllamaRelay:
    """OpenAI chat/completion answers -> Ollama ``/api/chat`` or ``/api/generate`` ones."""

    stream_content_type = "application/x-ndjson"

    def __init__(self, model: str, *, chat_api: bool, chat_backend: bool) -> None:
        self.model = model
        self.chat_api = chat_api  # /api/chat (else /api/generate)
        self.chat_backend = chat_backend  # the OpenAI answer is a chat completion
        self.started = time.perf_counter()
        self._buffer = b""
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}

    def _line(self, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": now_iso(), "done": False}
        if self.chat_api:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            obj["message"] = message
        else:
            obj["response"] = text
        return obj

    def _final(self, text: str, finish: str | None, calls: Any = None) -> dict[str, Any]:
        obj = self._line(text, _tool_calls(calls) if calls else None)
        obj["done"] = True
        obj["done_reason"] = "length" if finish == "length" else "stop"
        obj.update(_timings(self._usage, self.started))
        return obj

    def body(self, status: int, body: bytes) -> bytes:
        answer = json.loads(body)
        self._usage = answer.get("usage")
        choice = (answer.get("choices") or [{}])[0]
        if self.chat_backend:
            message = choice.get("message") or {}
            text = str(message.get("content") or "")
            calls = message.get("tool_calls")
        else:
            text, calls = str(choice.get("text") or ""), None
        return json.dumps(self._final(text, choice.get("finish_reason"), calls)).encode()

    def chunk(self, data: bytes) -> bytes:
        self._buffer += data
        lines: list[bytes] = []
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for raw in event.split(b"\n"):
                if raw.startswith(b"data:"):
                    line = self._event(raw[5:].strip())
                    if line is not None:
                        lines.append(json.dumps(line).encode() + b"\n")
        return b"".join(lines)

    def _event(self, payload: bytes) -> dict[str, Any] | None:
        if payload == b"[DONE]" or not payload:
            return None
        try:
            obj = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        if obj.get("usage"):
            self._usage = obj["usage"]
        if "error" in obj:
            message = obj["error"].get("message") if isinstance(obj["error"], dict) else None
            return {"error": str(message or obj["error"])}
        choice = (obj.get("choices") or [None])[0]
        if not isinstance(choice, dict):
            return None
        if choice.get("finish_reason"):
            self._finish = str(choice["finish_reason"])
        if self._finish == "tool_calls":
            self._finish = "stop"  # Ollama says stop; the calls are in the message
        if not self.chat_backend:
            text = str(choice.get("text") or "")
            return self._line(text) if text else None
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        for call in delta.get("tool_calls") or []:  # arguments may come in pieces
            if not isinstance(call, dict):
                continue
            slot = self._calls.setdefault(
                int(call.get("index", 0)), {"function": {"name": None, "arguments": ""}}
            )
            fn = call.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] = fn["name"]
            slot["function"]["arguments"] += fn.get("arguments") or ""
        text = str(delta.get("content") or "")
        return self._line(text) if text else None

    def end(self) -> bytes:
        """The tool calls (whole, in one line, as Ollama sends them), then the final line."""
        lines = b""
        if self._calls:
            calls = _tool_calls([self._calls[i] for i in sorted(self._calls)])
            lines += json.dumps(self._line("", calls) | {"done": False}).encode() + b"\n"
        return lines + json.dumps(self._final("", self._finish)).encode() + b"\n"

    def error(self, err: ApiError) -> web.Response:
        return error_response(err)

    def stream_error(self, err: ApiError) -> bytes:
        return json.dumps({"error": err.message}).encode() + b"\n"


class EmbedRelay:
    """OpenAI embeddings -> ``/api/embed`` (``embeddings``) or ``/api/embeddings``."""

    stream_content_type = "application/json"

    def __init__(self, model: str, *, legacy: bool) -> None:
        self.model = model
        self.legacy = legacy
        self.started = time.perf_counter()

    def body(self, status: int, body: bytes) -> bytes:
        answer = json.loads(body)
        vectors = [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]
        if self.legacy:
            return json.dumps({"embedding": vectors[0] if vectors else []}).encode()
        out = {"model": self.model, "embeddings": vectors}
        out.update(_timings(answer.get("usage"), self.started))
        out.pop("eval_count", None)
        return json.dumps(out).encode()

    def chunk(self, data: bytes) -> bytes:
        return data

    def end(self) -> bytes:
        return b""

    def error(self, err: ApiError) -> web.Response:
        return error_response(err)

    def stream_error(self, err: ApiError) -> bytes:
        return json.dumps({"error": err.message}).encode()
