"""The fake backend: a deterministic TEST DOUBLE that runs no model.

It exists for tests and for trying accelmux's policy and API without any model. When
``allocate`` is on it allocates REAL memory (filled bytearrays, so every page is touched
and the process RSS shows it): the granted weights + runtime + KV pool at load, and each
request's lease (times ``peak_factor``) while the request runs. ``scale`` shrinks what is
really allocated; reports are scaled back so the ledger sees the configured sizes.
Outputs are deterministic per input (see :mod:`.fake_outputs`).

Fault injection (test-double options of :class:`FakeBackendConfig`): ``fail_load``,
``hang_load`` (a load that never ends, for the runtime's load timeout),
``crash_after_requests`` (crash once, as the Nth non-streamed request ends, failing those
in flight), ``request_bytes`` (every request really uses that much, whatever its lease:
calibration) and ``peak_factor``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from accelmux import openai_shapes as shapes
from accelmux.backends import fake_outputs as out
from accelmux.backends.base import BackendRequest, BackendResponse, CrashCallback, LoadReport
from accelmux.config.backends import FakeBackendConfig
from accelmux.core.specs import Capabilities
from accelmux.core.types import ResizeSupport, ServiceKind, Tier
from accelmux.errors import BackendCrashedError, BackendError


def _allocate(nbytes: int) -> bytearray:
    """A bytearray whose pages are all written (so RSS/PSS really grow)."""
    if nbytes <= 0:
        return bytearray()
    return bytearray(b"\x01") * nbytes


class FakeBackend:
    """Fake (test double) backend for one service; see the module docstring."""

    def __init__(
        self,
        service: str,
        kind: ServiceKind,
        model: str,
        cfg: FakeBackendConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        profile: tuple[int, int] | None = None,
        answers_as: str | None = None,
    ) -> None:
        self.service = service
        #: The name its outputs are seeded with: the service clients address, so every
        #: replica of a service gives the same answer to the same input.
        self.answers_as = answers_as or service
        #: How the fake waits (load_s, latency_s): asyncio.sleep, or a manual clock's.
        self.sleep = sleep or asyncio.sleep
        #: The configured (weights, runtime) the fake "measures" after a load, like a real
        #: backend whose size does not depend on what was granted (None: the grant).
        self.profile = profile
        self.kind = kind
        self.model = model
        self.cfg = cfg
        self.loaded = False
        self.loads = 0
        self.requests = 0
        self._resident: bytearray = bytearray()
        self._kv: bytearray = bytearray()
        self._request_bytes = 0
        #: What the fake reports as its memory, in ledger units (before ``scale``).
        self._resident_reported = 0
        self._kv_reported = 0
        self._requests_reported = 0
        self._on_crash: CrashCallback | None = None
        #: Bumped by every load and crash: a request started under an older one failed.
        self._generation = 0

    # ---- lifecycle ---------------------------------------------------------------
    def _real(self, nbytes: int) -> int:
        return int(nbytes * self.cfg.scale) if self.cfg.allocate else 0

    async def load(
        self, *, weights_bytes: int, runtime_bytes: int, kv_pool_bytes: int
    ) -> LoadReport:
        if self.cfg.load_s:
            await self.sleep(self.cfg.load_s)
        if self.cfg.fail_load:
            raise BackendError(f"{self.service}: fake backend configured to fail its load")
        if self.cfg.hang_load:
            await asyncio.Event().wait()  # never set: only a timeout or a cancel ends it
        weights, runtime = self.profile or (weights_bytes, runtime_bytes)
        self._resident = _allocate(self._real(weights + runtime))
        self._kv = _allocate(self._real(kv_pool_bytes))
        self._resident_reported = weights + runtime
        self._kv_reported = kv_pool_bytes
        self.loaded = True
        self.loads += 1
        self._generation += 1
        return LoadReport(weights_bytes=weights, runtime_bytes=runtime)

    async def unload(self, *, tier: Tier = Tier.COLD) -> None:
        self._resident = bytearray()
        self._kv = bytearray()
        self._resident_reported = self._kv_reported = 0
        self.loaded = False

    @property
    def capabilities(self) -> Capabilities:
        return self.cfg.capabilities(self.kind)

    async def pause(self, request_id: str, *, park: bool) -> None:
        raise BackendError(f"{self.service}: this backend does not declare pause")

    async def resume(self, request_id: str) -> None:
        raise BackendError(f"{self.service}: this backend does not declare pause")

    async def resize(self, kv_pool_bytes: int) -> None:
        if self.cfg.resize is not ResizeSupport.LIVE or self.cfg.fail_resize:
            raise BackendError(f"{self.service}: the fake refuses a live resize (test double)")
        if not self.loaded:
            raise BackendError(f"{self.service}: resize while not loaded")
        if self.cfg.resize_s:
            await self.sleep(self.cfg.resize_s)
        self._kv = _allocate(self._real(kv_pool_bytes))
        self._kv_reported = kv_pool_bytes

    def crash(self, error: str = "fake crash") -> None:
        """Simulate the backend dying (tests): drop memory and tell the runtime."""
        self._resident = bytearray()
        self._kv = bytearray()
        self._resident_reported = self._kv_reported = 0
        self.loaded = False
        self._generation += 1
        if self._on_crash is not None:
            self._on_crash(error)

    def set_crash_callback(self, callback: CrashCallback) -> None:
        self._on_crash = callback

    def memory_bytes(self) -> int | None:
        """What the fake holds, in ledger units (the configured sizes, not scaled down;
        reported even with ``allocate: false``, as if it had allocated)."""
        return self._resident_reported + self._kv_reported + self._requests_reported

    def pids(self) -> list[int]:
        return []

    def describe(self) -> dict[str, Any]:
        return {
            "type": "fake",
            "note": "test double, no model",
            "loaded": self.loaded,
            "loads": self.loads,
            "requests": self.requests,
            "allocated_bytes": len(self._resident) + len(self._kv) + self._request_bytes,
        }

    async def close(self) -> None:
        await self.unload()

    # ---- requests ------------------------------------------------------------------
    async def handle(self, request: BackendRequest) -> BackendResponse:
        if not self.loaded:
            raise BackendError(f"{self.service}: fake backend is not loaded")
        self.requests += 1
        crasher = self.requests == self.cfg.crash_after_requests
        generation = self._generation
        peak = self._peak(request)
        if refused := _cannot(request.endpoint, request.body, request.stream, self.cfg):
            return refused
        if request.stream and self.kind.is_llm:
            return BackendResponse(
                content_type="text/event-stream", stream=self._stream(request, peak)
            )
        scratch = _allocate(self._real(peak))
        self._request_bytes += len(scratch)
        self._requests_reported += peak
        try:
            if self.cfg.latency_s:
                await self.sleep(self.cfg.latency_s)
            if crasher and generation == self._generation:
                self.crash(f"test double: crash_after_requests={self.requests}")
                for _ in range(2):  # the runtime hears of it first, as from a dead process
                    await asyncio.sleep(0)
            if generation != self._generation:
                raise BackendCrashedError(f"{self.service}: fake backend crashed mid-request")
            response = self._respond(request)
        finally:
            self._request_bytes -= len(scratch)
            self._requests_reported -= peak
            del scratch
        response.peak_bytes = peak
        return response

    def _peak(self, request: BackendRequest) -> int:
        """What a request really uses: ``request_bytes`` when set, else its lease x
        ``peak_factor``."""
        if self.cfg.request_bytes is not None:
            return int(self.cfg.request_bytes)
        return int(request.lease_bytes * self.cfg.peak_factor)

    def _respond(self, request: BackendRequest) -> BackendResponse:
        body = request.body
        seed = _seed(self.answers_as, body, request.files)
        rid = request.request_id
        model = str(body.get("model", self.model))
        endpoint = request.endpoint
        if endpoint == "/v1/chat/completions":
            words = out.reply_words(seed, _max_tokens(body))
            usage = shapes.usage(_prompt_tokens(body), len(words))
            obj = shapes.chat_completion(model, rid, [shapes.chat_choice(" ".join(words))], usage)
            call = _tool_call(body)
            message = obj["choices"][0]["message"]
            if call is not None:
                message["content"] = None
                message["tool_calls"] = [call]
                obj["choices"][0]["finish_reason"] = "tool_calls"
                obj["usage"] = shapes.usage(_prompt_tokens(body), _tokens(call["function"]))
            elif _format(body) == "json_object":
                message["content"] = json.dumps({"reply": message["content"]})
            obj["choices"] = [dict(obj["choices"][0], index=i) for i in range(_n(body))]
            return _json(obj)
        if endpoint == "/v1/completions":
            words = out.reply_words(seed, _max_tokens(body))
            usage = shapes.usage(_prompt_tokens(body), len(words) * _n(body))
            choices = [shapes.text_choice(" ".join(words), index=i) for i in range(_n(body))]
            return _json(shapes.text_completion(model, rid, choices, usage))
        if endpoint == "/v1/embeddings":
            texts = body.get("input")
            items = texts if isinstance(texts, list) else [texts]
            vectors: list[Any] = [
                out.embedding(json.dumps(t), self.cfg.embedding_dim) for t in items
            ]
            if body.get("encoding_format") == "base64":  # little-endian float32, as OpenAI
                vectors = [
                    base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors
                ]
            n = sum(len(json.dumps(t)) // 4 + 1 for t in items)
            return _json(shapes.embeddings_list(model, vectors, shapes.usage(n, 0)))
        if endpoint == "/v1/audio/speech":
            text = str(body.get("input", ""))
            seconds = min(10.0, 0.2 + len(text) * 0.01)
            audio = out.wav(seed, seconds)
            if body.get("response_format") == "pcm":  # the samples without the WAV header
                return BackendResponse(content_type="audio/pcm", body=audio[44:])
            return BackendResponse(content_type="audio/wav", body=audio)
        if endpoint == "/v1/audio/transcriptions":
            size = sum(len(v) for v in request.files.values())
            text = f"fake transcript of {size} bytes: " + " ".join(out.reply_words(seed, 8))
            fmt = body.get("response_format", "json")
            if fmt == "text":
                return BackendResponse(content_type="text/plain", body=text.encode())
            return _json({"text": text})
        if endpoint == "/v1/images/generations":
            w, h = _size(str(body.get("size", "256x256")))
            n = int(body.get("n", 1))
            images: list[dict[str, Any]] = []
            for i in range(n):
                b64 = out.png_b64(out.digest(seed, i), w, h)
                if body.get("response_format") == "url":
                    images.append({"url": "data:image/png;base64," + b64})
                else:
                    images.append({"b64_json": b64})
            return _json({"created": 0, "data": images})
        if endpoint == "/v1/detections":
            w = int(body.get("_width", 640))
            h = int(body.get("_height", 480))
            return _json(
                {
                    "object": "detection",
                    "model": model,
                    "width": w,
                    "height": h,
                    "detections": out.boxes(seed, w, h),
                }
            )
        raise BackendError(f"{self.service}: fake backend has no endpoint {endpoint}")

    async def _stream(self, request: BackendRequest, peak: int) -> AsyncIterator[bytes]:
        scratch = _allocate(self._real(peak))
        self._request_bytes += len(scratch)
        self._requests_reported += peak
        try:
            body = request.body
            seed = _seed(self.answers_as, body, {})
            words = out.reply_words(seed, _max_tokens(body))
            model = str(body.get("model", self.model))
            rid = request.request_id
            chat = request.endpoint == "/v1/chat/completions"
            call = _tool_call(body) if chat else None
            sent = len(words)
            if call is not None or (chat and _format(body) == "json_object"):
                words = []  # a whole JSON answer, sent below in one delta
                sent = _tokens(call["function"] if call is not None else JSON_REPLY)
            if self.cfg.latency_s:
                await self.sleep(self.cfg.latency_s)
            if chat:
                yield shapes.chat_chunk(model, rid, {"role": "assistant", "content": ""}, None)
            if call is not None:
                yield shapes.chat_chunk(model, rid, {"tool_calls": [dict(call, index=0)]}, None)
            elif chat and _format(body) == "json_object":
                yield shapes.chat_chunk(model, rid, {"content": JSON_REPLY}, None)
            for i, word in enumerate(words):
                text = word if i == 0 else " " + word
                if chat:
                    yield shapes.chat_chunk(model, rid, {"content": text}, None)
                else:
                    yield shapes.text_chunk(model, rid, text, None)
                if self.cfg.stream_chunk_s:
                    await self.sleep(self.cfg.stream_chunk_s)
            if chat:
                yield shapes.chat_chunk(model, rid, {}, "stop" if call is None else "tool_calls")
            else:
                yield shapes.text_chunk(model, rid, "", "stop")
            if shapes.wants_usage(body):
                usage = shapes.usage(_prompt_tokens(body), sent)
                yield shapes.usage_chunk(model, rid, usage, chat=chat)
            yield shapes.DONE
        finally:
            self._request_bytes -= len(scratch)
            self._requests_reported -= peak
            del scratch


def _seed(service: str, body: dict[str, Any], files: dict[str, bytes]) -> bytes:
    """The same input gives the same output, whichever model name or alias was used."""
    fields = {k: v for k, v in body.items() if k not in ("model", "stream", "stream_options")}
    return out.digest(service, fields, *(v for _, v in sorted(files.items())))


def _format(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format")
    return str(fmt.get("type")) if isinstance(fmt, dict) else None


def _n(body: dict[str, Any]) -> int:
    return int(body.get("n") or 1)


def _cannot(
    endpoint: str, body: dict[str, Any], stream: bool, cfg: FakeBackendConfig
) -> BackendResponse | None:
    """A 400 for what this double cannot do (never a silent ignore)."""
    llm = endpoint in ("/v1/chat/completions", "/v1/completions")
    if endpoint == "/v1/chat/completions" and _format(body) == "json_schema":
        return _unsupported("the fake backend cannot follow a JSON schema", "response_format")
    if llm and stream and _n(body) > 1:
        return _unsupported("a streamed answer holds one choice here: n must be 1", "n")
    dims = body.get("dimensions")
    if endpoint == "/v1/embeddings" and dims is not None and dims != cfg.embedding_dim:
        return _unsupported(
            f"this model's embeddings have {cfg.embedding_dim} dimensions (asked {dims})",
            "dimensions",
        )
    fmt = body.get("response_format")
    if endpoint == "/v1/audio/speech" and fmt not in (None, "wav", "pcm"):
        return _unsupported(
            f"response_format {fmt!r} is not produced here (wav or pcm)", "response_format"
        )
    return None


def _unsupported(message: str, param: str) -> BackendResponse:
    error = {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": "unsupported",
    }
    return BackendResponse(status=400, body=json.dumps({"error": error}).encode())


def _tokens(value: Any) -> int:
    """Tokens of a JSON value sent whole (a tool call, a JSON answer), as the prompt's."""
    return len(json.dumps(value)) // 4 + 1


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    """With tools (and tool_choice not none): a call of the chosen or first tool, no
    arguments."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    name = tools[0]["function"]["name"]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
    return {"id": "call_fake_0", "type": "function", "function": {"name": name, "arguments": "{}"}}


#: The whole answer of a json_object chat stream.
JSON_REPLY = '{"reply": "fake"}'


def _json(obj: dict[str, Any]) -> BackendResponse:
    return BackendResponse(body=json.dumps(obj).encode())


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or 64
    return int(value)


def _prompt_tokens(body: dict[str, Any]) -> int:
    return len(json.dumps(body.get("messages") or body.get("prompt") or "")) // 4 + 1


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        return int(w), int(h)
    except ValueError:
        return 256, 256
