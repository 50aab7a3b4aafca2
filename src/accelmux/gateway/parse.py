"""Validate an OpenAI-style request and compute its Demand.

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

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from accelmux.core.events import Demand
from accelmux.core.types import ServiceKind
from accelmux.gateway.chat_fields import check_chat, check_completion
from accelmux.gateway.errors import ApiError, bad_field
from accelmux.gateway.media import audio_seconds, looks_like_audio, looks_like_image, megapixels

CHARS_PER_TOKEN = 3.5
TOKENS_PER_MESSAGE = 4
MAX_N = 16

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
#: How deeply a JSON body may nest (arrays and objects) before it is refused.
MAX_JSON_DEPTH = 64


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


def tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


async def read_json(request: web.Request) -> tuple[dict[str, Any], bytes]:
    raw = await request.read()
    if not raw:
        raise ApiError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # deeper than the parser's own stack allows
        raise _too_deep() from None
    if _depth_over(body, MAX_JSON_DEPTH):
        raise _too_deep()
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body, raw


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


def _too_deep() -> ApiError:
    return ApiError(
        400,
        f"request body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels",
        code="json_too_deep",
    )


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` levels (iteratively: a
    hostile body must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_field("model", "'model' is required and must be a non-empty string")
    return model


def _int(body: dict[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(key, f"'{key}' must be an integer")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise bad_field(key, f"'{key}' must be {bound} (got {value})")
    return value


def _stream(body: dict[str, Any]) -> bool:
    value = body.get("stream", False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_field("stream", "'stream' must be a boolean")
    return value


def _max_output(body: dict[str, Any], default: int) -> int:
    n = _int(body, "n", 1, MAX_N) or 1
    mt = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1) or default
    return mt * n


def _content_chars(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise bad_field(where, f"'{where}' parts must be objects")
            text = part.get("text")
            total += len(text) if isinstance(text, str) else len(json.dumps(part))
        return total
    raise bad_field(where, f"'{where}' must be a string or a list of parts")


def chat(body: dict[str, Any], raw: bytes, default_max: int) -> Parsed:
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "'messages' must be a non-empty array")
    chars = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad_field(f"messages[{i}]", f"'messages[{i}]' must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise bad_field(f"messages[{i}].role", f"'messages[{i}].role' is required")
        chars += _content_chars(msg.get("content"), f"messages[{i}].content")
    chars += check_chat(body)
    prompt = tokens_of(chars) + TOKENS_PER_MESSAGE * len(messages)
    output = _max_output(body, default_max)
    return Parsed(
        endpoint="/v1/chat/completions",
        model=model,
        body=body,
        stream=_stream(body),
        raw=raw,
        demand=Demand(kv_tokens=prompt + output, prompt_tokens=prompt, output_tokens=output),
    )


def completion(body: dict[str, Any], raw: bytes, default_max: int) -> Parsed:
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        tokens = tokens_of(len(prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        tokens = sum(tokens_of(len(p)) for p in prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        tokens = len(prompt)
    else:
        raise bad_field("prompt", "'prompt' must be a string, an array of strings or of tokens")
    check_completion(body)
    output = _max_output(body, default_max)
    return Parsed(
        endpoint="/v1/completions",
        model=model,
        body=body,
        stream=_stream(body),
        raw=raw,
        demand=Demand(kv_tokens=tokens + output, prompt_tokens=tokens, output_tokens=output),
    )


def embeddings(body: dict[str, Any], raw: bytes) -> Parsed:
    model = _model(body)
    value = body.get("input")
    if isinstance(value, str):
        texts: list[Any] = [value]
    elif isinstance(value, list) and value:
        texts = value
    else:
        raise bad_field("input", "'input' must be a string or a non-empty array")
    if len(texts) > 2048:
        raise bad_field("input", "'input' may hold at most 2048 items")
    tokens = 0
    for i, t in enumerate(texts):
        if isinstance(t, str):
            tokens += tokens_of(len(t))
        elif isinstance(t, int) and not isinstance(t, bool):
            tokens += 1
        elif isinstance(t, list) and all(isinstance(x, int) for x in t):
            tokens += len(t)
        else:
            raise bad_field(f"input[{i}]", f"'input[{i}]' must be a string or token array")
    if all(isinstance(t, int) for t in texts):
        texts = [texts]
    return Parsed(
        endpoint="/v1/embeddings",
        model=model,
        body=body,
        raw=raw,
        demand=Demand(units=float(len(texts)), prompt_tokens=tokens),
    )


def speech(body: dict[str, Any], raw: bytes) -> Parsed:
    model = _model(body)
    text = body.get("input")
    if not isinstance(text, str) or not text:
        raise bad_field("input", "'input' is required and must be a non-empty string")
    if len(text) > 4096:
        raise bad_field("input", "'input' must be at most 4096 characters")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise bad_field("voice", "'voice' must be a string")
    return Parsed(
        endpoint="/v1/audio/speech",
        model=model,
        body=body,
        raw=raw,
        demand=Demand(units=float(len(text))),
    )


def images(body: dict[str, Any], raw: bytes) -> Parsed:
    model = _model(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad_field("prompt", "'prompt' is required and must be a non-empty string")
    n = _int(body, "n", 1, 10) or 1
    size = body.get("size", "1024x1024")
    try:
        w_text, h_text = str(size).lower().split("x")
        w, h = int(w_text), int(h_text)
        if not (16 <= w <= 8192 and 16 <= h <= 8192):
            raise ValueError
    except ValueError:
        raise bad_field("size", "'size' must be WIDTHxHEIGHT, 16..8192 each") from None
    fmt = body.get("response_format")
    if fmt is not None and fmt not in ("b64_json", "url"):
        raise bad_field("response_format", "'response_format' must be b64_json or url")
    return Parsed(
        endpoint="/v1/images/generations",
        model=model,
        body=body,
        raw=raw,
        demand=Demand(units=w * h / 1e6 * n),
    )


def transcription(
    fields: dict[str, Any], files: dict[str, bytes], info: dict[str, tuple[str, str]]
) -> Parsed:
    model = _model(fields)
    audio = files.get("file")
    if not audio:
        raise bad_field("file", "'file' (the audio) is required")
    if not looks_like_audio(audio):
        raise bad_field(
            "file", "'file' is not audio (WAV, MP3, FLAC, Ogg, WebM, M4A, AMR or AIFF expected)"
        )
    fmt = fields.get("response_format")
    if fmt is not None and fmt not in ("json", "text", "verbose_json", "srt", "vtt"):
        raise bad_field("response_format", "'response_format' is not supported")
    return Parsed(
        endpoint="/v1/audio/transcriptions",
        model=model,
        body=fields,
        files={"file": audio},
        file_info={k: v for k, v in info.items() if k == "file"},
        demand=Demand(units=audio_seconds(audio)),
    )


def detection(body: dict[str, Any], files: dict[str, bytes], raw: bytes) -> Parsed:
    model = _model(body)
    image = files.get("image") or files.get("file")
    if image is None:
        encoded = body.get("image")
        if not isinstance(encoded, str) or not encoded:
            raise bad_field("image", "'image' is required (base64 string or multipart file)")
        if encoded.startswith("data:"):
            encoded = encoded.partition(",")[2]
        try:
            image = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise bad_field("image", "'image' is not valid base64") from None
        if not image:
            raise bad_field("image", "'image' is empty")
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
