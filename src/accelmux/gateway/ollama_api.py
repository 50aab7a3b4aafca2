"""The Ollama API (``/api/*``) over the same services, Manager and backends.

Every Ollama request is translated into its OpenAI twin (``/api/chat`` ->
``/v1/chat/completions``, ``/api/generate`` -> ``/v1/completions`` for a completion
service or a one-message chat for a chat service, ``/api/embed`` and
``/api/embeddings`` -> ``/v1/embeddings``), checked by the same parser, admitted by the
Manager like any other request (same classes, queues and refusals) and answered in
Ollama's shape: one JSON object, or NDJSON lines when streamed (the default).

``keep_alive`` (seconds, or a duration such as ``"10m"``, ``"1h"``; negative: forever)
sets how long the service stays loaded once idle, replacing its ``ttl_s`` until a
request says otherwise (see :class:`~accelmux.core.events.RequestArrived`). ``0`` unloads
it as soon as it is idle. Memory still wins: a service kept alive can be evicted for a
request of an equal or higher class, as any warm service. An operator's pin (or load)
always wins over ``keep_alive``, and an on-demand service never stays longer than its
short TTL. A request without ``keep_alive`` restores ``ttl_s``. An empty prompt (or no
messages) only loads the model (``done_reason: load``), or with ``keep_alive: 0``
unloads it (``unload``), as ``ollama run`` and ``ollama stop`` do.

Errors come as ``{"error": "..."}`` with the status accelmux would give the OpenAI
request (400 bad field, 404 unknown model, 413, 429/503 with Retry-After, 502).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from accelmux import __version__
from accelmux.core.actions import Dispatch
from accelmux.core.events import Demand
from accelmux.core.types import Residency, ServiceKind, ServiceStatus
from accelmux.gateway import parse
from accelmux.gateway.errors import ApiError, bad_field, refusal
from accelmux.gateway.keys import RUNTIME
from accelmux.gateway.ollama_relay import EmbedRelay, OllamaRelay, error_response, now_iso
from accelmux.gateway.openai_api import serve
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused

#: The Ollama API release whose request and response shapes this module follows.
OLLAMA_API_VERSION = "0.12.0"
LLM_KINDS = (ServiceKind.CHAT, ServiceKind.COMPLETION)
LISTED_KINDS = (*LLM_KINDS, ServiceKind.EMBEDDINGS)
#: ``expires_at`` of a model that stays loaded until memory is needed.
NEVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
#: Longer keep_alive values are shown as NEVER (a date that far is all the same).
LONGEST_S = 100 * 365 * 86400.0
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
#: Ollama ``options`` that map onto OpenAI fields; the others are accepted and unused,
#: as Ollama itself does with options a model does not know.
OPTION_FIELDS = {
    key: key
    for key in (
        "temperature",
        "top_p",
        "seed",
        "stop",
        "frequency_penalty",
        "presence_penalty",
        "repeat_penalty",
    )
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def ollama_errors(handler: Handler) -> Handler:
    """Answer an ApiError raised by ``handler`` in Ollama's ``{"error": ...}`` shape."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc)

    return wrapped


# ---- request fields ----------------------------------------------------------------------
def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive`` in seconds: None when absent, ``inf`` when negative."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise bad_field("keep_alive", "'keep_alive' must be a number of seconds or a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
                raise bad_field(
                    "keep_alive", f"'keep_alive' {value!r} is not a duration like '5m' or '1h'"
                ) from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise bad_field("keep_alive", "'keep_alive' must be a number of seconds or a duration")
    if math.isnan(seconds):
        raise bad_field("keep_alive", "'keep_alive' must be a number")
    return math.inf if seconds < 0 else seconds


def _name(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_field("model", "'model' is required and must be a non-empty string")
    return model


def _resolve(rt: Runtime, name: str) -> tuple[str, str]:
    """(model name accelmux knows, service) of an Ollama model name (``:latest`` optional)."""
    for candidate in (name, name.removesuffix(":latest")):
        service = rt.models.get(candidate)
        if service is not None:
            return candidate, service
    raise ApiError(404, f"model '{name}' not found", param="model", code="model_not_found")


def _options(body: dict[str, Any], out: dict[str, Any]) -> None:
    options = body.get("options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise bad_field("options", "'options' must be an object")
    for key, target in OPTION_FIELDS.items():
        if options.get(key) is not None:
            out[target] = options[key]
    predict = options.get("num_predict")
    if isinstance(predict, int) and not isinstance(predict, bool) and predict > 0:
        out["max_tokens"] = predict


def _format(body: dict[str, Any], out: dict[str, Any]) -> None:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": fmt},
        }
    else:
        raise bad_field("format", "'format' must be \"json\" or a JSON schema object")


def _stream(body: dict[str, Any]) -> bool:
    value = body.get("stream", True)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise bad_field("stream", "'stream' must be a boolean")
    return value


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad_field("messages", "'messages' must be an array")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise bad_field(f"messages[{i}]", f"'messages[{i}]' must be an object")
        if msg.get("images"):
            raise bad_field(f"messages[{i}].images", "images are not supported by these models")
        role = msg.get("role")
        item: dict[str, Any] = {"role": role, "content": msg.get("content") or ""}
        if role == "tool" and msg.get("tool_name"):
            item["name"] = msg["tool_name"]
        calls = msg.get("tool_calls")
        if calls:
            item["tool_calls"] = _openai_calls(calls, f"messages[{i}].tool_calls")
        out.append(item)
    return out


def _openai_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """Ollama's tool calls of an assistant message (arguments as an object) in OpenAI's shape."""
    if not isinstance(calls, list):
        raise bad_field(where, f"'{where}' must be an array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_field(f"{where}[{j}]", f"'{where}[{j}]' must be a function with a name")
        out.append(
            {
                "id": f"call_{j}",
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "arguments": json.dumps(fn.get("arguments") or {}),
                },
            }
        )
    return out


def _llm_body(body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        out["stream_options"] = {"include_usage": True}
    _options(body, out)
    _format(body, out)
    return out


# ---- load and unload ---------------------------------------------------------------------
async def _warm(
    request: web.Request, model: str, service: str, keep_alive_s: float | None, chat_api: bool
) -> web.Response:
    """An empty request: load the model (through the Manager), or unload it (keep_alive 0)."""
    rt = request.app[RUNTIME]
    unload = keep_alive_s == 0
    state = rt.manager.world.services[service]
    if not (unload and state.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)):

        async def attempt(d: Dispatch) -> tuple[bool, int | None]:
            return True, None  # nothing ran: no peak to calibrate with

        try:
            await rt.run_request(service, Demand(), attempt, keep_alive_s=keep_alive_s)
        except Refused as exc:
            raise refusal(exc) from None
    obj: dict[str, Any] = {"model": model, "created_at": now_iso(), "done": True}
    obj["done_reason"] = "unload" if unload else "load"
    if chat_api:
        obj["message"] = {"role": "assistant", "content": ""}
    else:
        obj["response"] = ""
    return web.json_response(obj)


def _kind(rt: Runtime, service: str) -> ServiceKind:
    return rt.manager.world.services[service].spec.kind


def _need_llm(rt: Runtime, name: str, service: str) -> None:
    if _kind(rt, service) not in LLM_KINDS:
        raise ApiError(
            400, f"model '{name}' does not generate text", param="model", code="wrong_model_kind"
        )


# ---- handlers ----------------------------------------------------------------------------
@ollama_errors
async def chat(request: web.Request) -> web.StreamResponse:
    body, _ = await parse.read_json(request)
    rt = request.app[RUNTIME]
    name = _name(body)
    model, service = _resolve(rt, name)
    _need_llm(rt, name, service)
    keep = keep_alive_seconds(body.get("keep_alive"))
    messages = _messages(body.get("messages") or [])
    if not messages:
        return await _warm(request, name, service, keep, chat_api=True)
    stream = _stream(body)
    out = _llm_body(body, model, stream)
    out["messages"] = messages
    if body.get("tools") is not None:
        out["tools"] = body["tools"]
    parsed = parse.chat(out, b"", rt.cfg.server.default_max_tokens)
    parsed.keep_alive_s = keep
    relay = OllamaRelay(name, chat_api=True, chat_backend=True)
    return await serve(request, parsed, relay)


@ollama_errors
async def generate(request: web.Request) -> web.StreamResponse:
    body, _ = await parse.read_json(request)
    rt = request.app[RUNTIME]
    name = _name(body)
    model, service = _resolve(rt, name)
    _need_llm(rt, name, service)
    keep = keep_alive_seconds(body.get("keep_alive"))
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise bad_field("prompt", "'prompt' must be a string")
    if body.get("images"):
        raise bad_field("images", "images are not supported by these models")
    for unsupported in ("suffix", "template", "context"):
        if body.get(unsupported):
            raise bad_field(unsupported, f"'{unsupported}' is not supported here")
    if not prompt:
        return await _warm(request, name, service, keep, chat_api=False)
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise bad_field("system", "'system' must be a string")
    stream = _stream(body)
    out = _llm_body(body, model, stream)
    default_max = rt.cfg.server.default_max_tokens
    chat_backend = _kind(rt, service) is ServiceKind.CHAT and not body.get("raw")
    if chat_backend:
        messages = [{"role": "system", "content": system}] if system else []
        out["messages"] = [*messages, {"role": "user", "content": prompt}]
        parsed = parse.chat(out, b"", default_max)
    else:
        if "response_format" in out:
            raise bad_field("format", "'format' needs a chat model (this one completes text)")
        out["prompt"] = f"{system}\n\n{prompt}" if system else prompt
        parsed = parse.completion(out, b"", default_max)
    parsed.keep_alive_s = keep
    relay = OllamaRelay(name, chat_api=False, chat_backend=chat_backend)
    return await serve(request, parsed, relay)


async def _embed(request: web.Request, *, legacy: bool) -> web.StreamResponse:
    body, _ = await parse.read_json(request)
    rt = request.app[RUNTIME]
    name = _name(body)
    model, _ = _resolve(rt, name)
    key = "prompt" if legacy else "input"
    value = body.get(key)
    out: dict[str, Any] = {"model": model, "input": value}
    parsed = parse.embeddings(out, b"")
    parsed.keep_alive_s = keep_alive_seconds(body.get("keep_alive"))
    return await serve(request, parsed, EmbedRelay(name, legacy=legacy))


@ollama_errors
async def embed(request: web.Request) -> web.StreamResponse:
    return await _embed(request, legacy=False)


@ollama_errors
async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _embed(request, legacy=True)


# ---- model listings ----------------------------------------------------------------------
def _details(rt: Runtime, service: str) -> dict[str, Any]:
    svc_cfg = rt.cfg.services[service]
    backend = rt.backends[service].describe()
    return {
        "parent_model": "",
        "format": "gguf" if _kind(rt, service) in LLM_KINDS else "onnx",
        "family": str(backend.get("component") or svc_cfg.kind),
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _size(rt: Runtime, service: str) -> int:
    profile = rt.manager.world.services[service].spec.profile
    return int(profile.weights)


def _entry(rt: Runtime, model: str, service: str) -> dict[str, Any]:
    return {
        "name": model,
        "model": model,
        "modified_at": datetime.fromtimestamp(rt.started_at, UTC).isoformat(),
        "size": _size(rt, service),
        "digest": "",
        "details": _details(rt, service),
    }


def _listed(rt: Runtime) -> list[tuple[str, str]]:
    return [(m, s) for m, s in rt.models.items() if _kind(rt, s) in LISTED_KINDS]


async def tags(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return web.json_response({"models": [_entry(rt, m, s) for m, s in _listed(rt)]})


def _expires_at(rt: Runtime, service: str) -> datetime:
    svc = rt.manager.world.services[service]
    if svc.pinned or svc.admin_wants_loaded:
        return NEVER
    ttl = svc.ttl_s
    if svc.spec.residency is Residency.ON_DEMAND:
        ttl = min(ttl, rt.manager.world.knobs.on_demand_ttl_s)
    if not ttl < LONGEST_S:
        return NEVER
    if svc.inflight:  # busy: its idle time starts when the last request ends
        return datetime.now(UTC) + timedelta(seconds=ttl)
    left = svc.last_used + ttl - rt.clock.now()
    return datetime.now(UTC) + timedelta(seconds=max(0.0, left))


async def ps(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    models = []
    seen: set[str] = set()
    for model, service in _listed(rt):  # one entry per service, by its model name
        svc = rt.manager.world.services[service]
        if svc.status is not ServiceStatus.LOADED or service in seen:
            continue
        seen.add(service)
        entry = _entry(rt, model, service)
        entry.pop("modified_at")
        size = svc.resident_bytes
        entry["size"] = size
        on_gpu = rt.cfg.devices[svc.spec.device].kind == "nvidia"
        entry["size_vram"] = size if on_gpu else 0
        entry["expires_at"] = _expires_at(rt, service).isoformat().replace("+00:00", "Z")
        models.append(entry)
    return web.json_response({"models": models})


@ollama_errors
async def show(request: web.Request) -> web.Response:
    body, _ = await parse.read_json(request)
    rt = request.app[RUNTIME]
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_field("model", "'model' is required and must be a non-empty string")
    _, service = _resolve(rt, name)
    kind = _kind(rt, service)
    capabilities = ["embedding"] if kind is ServiceKind.EMBEDDINGS else ["completion"]
    if kind is ServiceKind.CHAT:
        capabilities.append("tools")
    return web.json_response(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": _details(rt, service),
            "model_info": {"accelmux.service": service, "accelmux.kind": kind.value},
            "capabilities": capabilities,
            "modified_at": datetime.fromtimestamp(rt.started_at, UTC).isoformat(),
        }
    )


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_API_VERSION, "accelmux": __version__})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
