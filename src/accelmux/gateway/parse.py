"""Validate an OpenAI-style request by its request model (:mod:`.openai_requests`, on the
already parsed body) and compute its Demand.

Demand per kind (what the Manager's memory profile multiplies):

* chat / completion: ``prompt_tokens`` = characters / 3.5 (+4 per chat message, a
  conservative estimate for common tokenizers); ``output_tokens`` = ``max_tokens`` (or
  ``max_completion_tokens``, else ``server.default_max_tokens``) x ``n``;
  ``kv_tokens`` = prompt + output.
* embeddings: ``units`` = number of input texts; ``prompt_tokens`` as above.
* image: ``units`` = megapixels x n. asr: seconds of audio. tts: characters of input.
  detect: megapixels of the image.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError

from accelmux.config.limits import LimitsConfig
from accelmux.core.events import Demand
from accelmux.core.types import ServiceKind
from accelmux.gateway import body_checks
from accelmux.gateway.body_checks import BodyProblem
from accelmux.gateway.drain import ReadPace
from accelmux.gateway.errors import ApiError, bad_field
from accelmux.gateway.keys import RUNTIME
from accelmux.gateway.media import audio_seconds, looks_like_audio, looks_like_image, megapixels
from accelmux.gateway.ollama_relay import error_response as ollama_error
from accelmux.gateway.openai_requests import (
    ChatRequest,
    CompletionRequest,
    DetectionForm,
    DetectionRequest,
    EmbeddingsRequest,
    ImageRequest,
    SpeechRequest,
    TranscriptionForm,
)
from accelmux.request_validation import RequestModel, first_problem

log = logging.getLogger("accelmux.gateway")

CHARS_PER_TOKEN = 3.5
TOKENS_PER_MESSAGE = 4

#: Which service kinds can serve each endpoint.
ENDPOINT_KINDS: dict[str, tuple[ServiceKind, ...]] = {
    "/v1/chat/completions": (ServiceKind.CHAT, ServiceKind.COMPLETION),
    "/v1/completions": (ServiceKind.COMPLETION, ServiceKind.CHAT),
    "/v1/embeddings": (ServiceKind.EMBEDDINGS,),
    "/v1/audio/transcriptions": (ServiceKind.ASR,),
    "/v1/audio/speech": (ServiceKind.TTS,),
    "/v1/images/generations": (ServiceKind.IMAGE,),
    "/v1/detections": (ServiceKind.DETECT, ServiceKind.CAMERA),
}

#: The request field that sizes each endpoint's demand (named by a 413 ``too_large``).
DEMAND_PARAM: dict[str, str] = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/audio/transcriptions": "file",
    "/v1/audio/speech": "input",
    "/v1/images/generations": "size",
    "/v1/detections": "image",
}


@dataclass(slots=True, kw_only=True)
class Parsed:
    endpoint: str
    model: str
    body: dict[str, Any]
    demand: Demand
    stream: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    file_info: dict[str, tuple[str, str]] = field(default_factory=dict)
    raw: bytes = b""
    content_type: str = "application/json"
    #: Ollama's keep_alive in seconds (None: the service's configured TTL).
    keep_alive_s: float | None = None
    #: The field a 413 ``too_large`` names: the one that made the demand large.
    size_param: str | None = None


def tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


#: The ``server.limits`` key that bounds each JSON route's body (others: server.max_body).
ROUTE_BODY: dict[str, str] = {
    "/v1/chat/completions": "chat_body",
    "/v1/completions": "chat_body",
    "/api/chat": "chat_body",
    "/api/generate": "chat_body",
    "/v1/embeddings": "embeddings_body",
    "/api/embed": "embeddings_body",
    "/api/embeddings": "embeddings_body",
    "/v1/audio/speech": "small_body",
    "/v1/images/generations": "small_body",
    "/api/show": "small_body",
}
#: Bodies over ``server.limits.offload_body`` are read at this pace, all together: reading
#: a socket is the event loop's work, and a client sending 25 MiB bodies in a loop would
#: otherwise keep it busy (a 25 MiB body then takes 0.4 s more to arrive).
BIG_BODY_RATE = 64 * 1024**2
BIG_BODIES = ReadPace(BIG_BODY_RATE)
#: At most this many bodies are parsed off the event loop at once (the others wait).
PARSE_THREADS = 2
#: Processes that check big bodies before the daemon parses them.
CHECK_PROCESSES = 1
#: The field that holds the embedding inputs, by route.
EMBEDDING_INPUTS = {"/v1/embeddings": "input", "/api/embed": "input", "/api/embeddings": "prompt"}

T = TypeVar("T")


def limits_of(request: web.Request) -> LimitsConfig:
    return request.app[RUNTIME].cfg.server.limits


def _body_limit(request: web.Request) -> tuple[int, str]:
    """The largest body ``request``'s route takes, and the config key that sets it."""
    server = request.app[RUNTIME].cfg.server
    key = ROUTE_BODY.get(request.path)
    if key is None:
        return int(server.max_body), "server.max_body"
    return min(int(getattr(server.limits, key)), int(server.max_body)), f"server.limits.{key}"


def _too_big(size: str, limit: int, key: str) -> ApiError:
    return ApiError(
        413,
        f"request body is {size} bytes; the limit of this route is {limit} ({key})",
        code="body_too_large",
    )


async def read_body(request: web.Request) -> bytes:
    """The body, refused (413 ``body_too_large``) beyond its route's limit: by its
    Content-Length before a byte is read, else as soon as the read passes the limit."""
    limit, key = _body_limit(request)
    length = request.content_length
    if length is not None and length > limit:
        raise _too_big(str(length), limit, key)
    chunks: list[bytes] = []
    size = 0
    paced_from = int(limits_of(request).offload_body)
    loop = asyncio.get_running_loop()
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _too_big(f"over {limit}", limit, key)
        chunks.append(chunk)
        if size > paced_from:  # a big body: its share of the loop is bounded
            wait = BIG_BODIES.delay_for(len(chunk), loop.time())
            if wait > 0:
                await asyncio.sleep(wait)
    return b"".join(chunks)


async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` (curl sends it before a large body): a body over the
    route's limit is refused before the client sends it; any other gets its 100 Continue
    (aiohttp's own behaviour)."""
    limit, key = _body_limit(request)
    length = request.content_length
    if length is not None and length > limit:
        err = _too_big(str(length), limit, key)
        # answered before the middlewares: in the route's own error shape here
        return ollama_error(err) if request.path.startswith("/api/") else err.response()
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version == HttpVersion11:
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
    return None


def _api_error(exc: BodyProblem) -> ApiError:
    return ApiError(exc.status, exc.message, param=exc.param, code=exc.code)


def loads(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, strictly, nested at most MAX_JSON_DEPTH levels."""
    try:
        body = body_checks.loads(raw)
        if body_checks.depth_over(body):
            raise body_checks.too_deep()
    except BodyProblem as exc:
        raise _api_error(exc) from None
    return body


def check_items(body: dict[str, Any], limits: LimitsConfig, *, inputs: str | None = None) -> None:
    """:func:`body_checks.check_items`, its refusal as a 400 ``limit_exceeded``."""
    try:
        body_checks.check_items(body, limits, inputs=inputs)
    except BodyProblem as exc:
        raise _api_error(exc) from None


async def read_json(request: web.Request) -> tuple[dict[str, Any], bytes]:
    """The body as a JSON object (small bodies: the parse is short, done in place)."""
    raw = await read_body(request)
    return loads(raw), raw


@functools.cache
def _parse_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(
        PARSE_THREADS, thread_name_prefix="accelmux-parse", initializer=body_checks.lower_priority
    )


@functools.cache
def _check_executor() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        CHECK_PROCESSES,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=body_checks.ignore_interrupts,
    )


def decode_small(
    raw: bytes, limits: LimitsConfig, build: Callable[[dict[str, Any], bytes, LimitsConfig], T]
) -> T:
    """A body of at most ``server.limits.offload_body`` parsed, checked and built in
    place (what :func:`decode` does with one; any HTTP stack)."""
    return build(loads(raw), raw, limits)


_decode = decode_small


async def _preflight(raw: bytes, limits: LimitsConfig, path: str) -> None:
    """A big body parsed and counted in a process of its own first: a body over the
    limits is refused without ever being parsed in the daemon."""
    loop = asyncio.get_running_loop()
    inputs = EMBEDDING_INPUTS.get(path)
    try:
        problem = await loop.run_in_executor(
            _check_executor(), body_checks.preflight, raw, limits, inputs
        )
    except (BrokenProcessPool, OSError) as exc:  # checked in the daemon instead
        log.warning("body check process unavailable (%s); checking in a thread", exc)
        _check_executor.cache_clear()
        return
    if problem is not None:
        status, message, param, code = problem
        raise ApiError(status, message, param=param, code=code)


async def decode(
    request: web.Request, build: Callable[[dict[str, Any], bytes, LimitsConfig], T]
) -> T:
    """Read the body, parse it, check its item counts and ``build`` the request from it
    (validation, token counts): in place for a small body, in a worker thread for one
    over ``server.limits.offload_body``, so that the event loop serves other requests
    meanwhile, after a check in a process of its own for one over ``preflight_body``."""
    raw = await read_body(request)
    limits = limits_of(request)
    if len(raw) <= int(limits.offload_body):
        return _decode(raw, limits, build)
    if len(raw) > int(limits.preflight_body):
        await _preflight(raw, limits, request.path)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_parse_executor(), _decode, raw, limits, build)


async def read_form(
    request: web.Request,
) -> tuple[dict[str, Any], dict[str, bytes], dict[str, tuple[str, str]]]:
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "expected multipart/form-data", param="file", code="invalid_multipart")
    try:
        form = await request.post()
    except (ValueError, HttpProcessingError) as exc:  # a bad part header, a bad boundary
        raise ApiError(400, f"malformed multipart body: {exc}", code="invalid_multipart") from None
    fields: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    info: dict[str, tuple[str, str]] = {}
    for key, value in form.items():
        if isinstance(value, web.FileField):
            files[key] = value.file.read()
            info[key] = (value.filename or key, value.content_type or "application/octet-stream")
        else:
            fields[key] = str(value)
    return fields, files, info


M = TypeVar("M", bound=RequestModel)


def validated(model: type[M], body: dict[str, Any]) -> M:
    """``body`` checked by its request model (already parsed: no second JSON pass); a 400
    ``invalid_value`` whose ``param`` names the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problem = first_problem(exc)
        raise ApiError(400, problem.message, param=problem.param, code="invalid_value") from None


def _max_output(
    n: int | None, max_completion: int | None, max_tokens: int | None, default: int
) -> int:
    return (max_completion or max_tokens or default) * (n or 1)


def _content_chars(content: str | list[dict[str, Any]] | None) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    total = 0
    for part in content:
        text = part.get("text")
        total += len(text) if isinstance(text, str) else len(json.dumps(part))
    return total


def _size_param(prompt: int, output: int, req: ChatRequest | CompletionRequest, text: str) -> str:
    """The field that made a demand large: the output's (``max_completion_tokens``,
    ``max_tokens``, ``n``) when the output outweighs the prompt, else the prompt's."""
    if output <= prompt:
        return text
    if req.max_completion_tokens is not None:
        return "max_completion_tokens"
    if req.max_tokens is not None:
        return "max_tokens"
    return "n" if (req.n or 1) > 1 else text


def chat(
    body: dict[str, Any], raw: bytes, default_max: int, limits: LimitsConfig | None = None
) -> Parsed:
    check_items(body, limits or LimitsConfig())
    req = validated(ChatRequest, body)
    chars = sum(_content_chars(msg.content) for msg in req.messages)
    if req.tools:  # a backend describes them to the model
        chars += len(json.dumps(body["tools"]))
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        chars += len(json.dumps(fmt.json_schema.schema_))
    prompt = tokens_of(chars) + TOKENS_PER_MESSAGE * len(req.messages)
    output = _max_output(req.n, req.max_completion_tokens, req.max_tokens, default_max)
    return Parsed(
        endpoint="/v1/chat/completions",
        model=req.model,
        body=body,
        stream=req.stream is True,
        raw=raw,
        demand=Demand(kv_tokens=prompt + output, prompt_tokens=prompt, output_tokens=output),
        size_param=_size_param(prompt, output, req, "messages"),
    )


def completion(
    body: dict[str, Any], raw: bytes, default_max: int, limits: LimitsConfig | None = None
) -> Parsed:
    del limits  # a prompt is one text or one token array: nothing to count before
    req = validated(CompletionRequest, body)
    prompt = req.prompt
    if isinstance(prompt, str):
        tokens = tokens_of(len(prompt))
    elif isinstance(prompt[0], str):
        if len(prompt) > 1:  # one choice per prompt would be answered as one: refused
            raise ApiError(
                400,
                f"'prompt' holds {len(prompt)} prompts; one request takes one prompt "
                "(send one request per prompt)",
                param="prompt",
                code="unsupported",
            )
        tokens = tokens_of(len(prompt[0]))
    else:
        tokens = len(prompt)
    output = _max_output(req.n, req.max_completion_tokens, req.max_tokens, default_max)
    return Parsed(
        endpoint="/v1/completions",
        model=req.model,
        body=body,
        stream=req.stream is True,
        raw=raw,
        demand=Demand(kv_tokens=tokens + output, prompt_tokens=tokens, output_tokens=output),
        size_param=_size_param(tokens, output, req, "prompt"),
    )


def embeddings(body: dict[str, Any], raw: bytes, limits: LimitsConfig | None = None) -> Parsed:
    check_items(body, limits or LimitsConfig(), inputs="input")
    req = validated(EmbeddingsRequest, body)
    texts: list[Any] = req.input
    tokens = 0
    for item in texts:
        if isinstance(item, str):
            tokens += tokens_of(len(item))
        elif isinstance(item, int):
            tokens += 1
        else:
            tokens += len(item)
    if all(isinstance(item, int) for item in texts):  # one token array
        texts = [texts]
    return Parsed(
        endpoint="/v1/embeddings",
        model=req.model,
        body=body,
        raw=raw,
        demand=Demand(units=float(len(texts)), prompt_tokens=tokens),
    )


def speech(body: dict[str, Any], raw: bytes) -> Parsed:
    req = validated(SpeechRequest, body)
    return Parsed(
        endpoint="/v1/audio/speech",
        model=req.model,
        body=body,
        raw=raw,
        demand=Demand(units=float(len(req.input))),
    )


def images(body: dict[str, Any], raw: bytes) -> Parsed:
    req = validated(ImageRequest, body)
    width, height = req.sides()
    return Parsed(
        endpoint="/v1/images/generations",
        model=req.model,
        body=body,
        raw=raw,
        demand=Demand(units=width * height / 1e6 * req.n),
    )


def transcription(
    fields: dict[str, Any], files: dict[str, bytes], info: dict[str, tuple[str, str]]
) -> Parsed:
    form = validated(TranscriptionForm, {**fields, **files})
    if not looks_like_audio(form.file):
        raise bad_field(
            "file", "'file' is not audio (WAV, MP3, FLAC, Ogg, WebM, M4A, AMR or AIFF expected)"
        )
    return Parsed(
        endpoint="/v1/audio/transcriptions",
        model=form.model,
        body=fields,
        files={"file": form.file},
        file_info={k: v for k, v in info.items() if k == "file"},
        demand=Demand(units=audio_seconds(form.file)),
    )


def _decoded(encoded: str) -> bytes:
    if encoded.startswith("data:"):
        encoded = encoded.partition(",")[2]
    try:
        image = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise bad_field("image", "'image' is not valid base64") from None
    if not image:
        raise bad_field("image", "'image' is empty")
    return image


def detection(body: dict[str, Any], files: dict[str, bytes], raw: bytes) -> Parsed:
    """A JSON body with a base64 ``image``, or multipart form fields and files (the image
    as the file ``image`` or ``file``, else a base64 ``image`` field)."""
    upload = files.get("image") or files.get("file")
    if upload is not None:
        form = validated(DetectionForm, {**body, "image": upload})
        model, image = form.model, form.image
    else:
        req = validated(DetectionRequest, body)
        model, image = req.model, _decoded(req.image)
    if not looks_like_image(image):
        raise bad_field("image", "'image' is not a PNG, JPEG, GIF, WebP or BMP image")
    mp, w, h = megapixels(image)
    out = dict(body)
    out.pop("image", None)
    if w and h:
        out["_width"], out["_height"] = w, h
    return Parsed(
        endpoint="/v1/detections",
        model=model,
        body=out,
        files={"image": image},
        demand=Demand(units=mp),
    )
