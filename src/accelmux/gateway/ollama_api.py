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
always wins over ``keep_alive``: a client's value is ignored while the service is pinned
or loaded through ``/admin``, and not remembered for after the unpin (its ``ttl_s``
applies then). An on-demand service never stays longer than its short TTL. A request
without ``keep_alive`` restores ``ttl_s``. An empty prompt (or no messages) only loads
the model (``done_reason: load``), or with ``keep_alive: 0`` unloads it (``unload``), as
``ollama run`` and ``ollama stop`` do; on a service the operator keeps loaded that
unload is refused (409 ``service_pinned``, as ``/admin/.../unload`` of a pinned
service), so no answer claims an unload that does not happen.

Errors come as ``{"error": "..."}`` with the status accelmux would give the OpenAI
request (400 bad field, 404 unknown model, 413, 429/503 with Retry-After, 502).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from accelmux import __version__
from accelmux.config.limits import LimitsConfig
from accelmux.core.types import Residency, ServiceKind, ServiceStatus
from accelmux.core.world import ServiceState
from accelmux.gateway import parse
from accelmux.gateway.errors import ApiError, bad_field, refusal
from accelmux.gateway.keys import RUNTIME
from accelmux.gateway.ollama_relay import EmbedRelay, OllamaRelay, error_response, now_iso
from accelmux.gateway.ollama_requests import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaMessage,
    OllamaOptions,
    OllamaShowRequest,
    OllamaToolCall,
)
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
def _resolve(rt: Runtime, name: str) -> tuple[str, str]:
    """(model name accelmux knows, service) of an Ollama model name (``:latest`` optional)."""
    for candidate in (name, name.removesuffix(":latest")):
        service = rt.models.get(candidate)
        if service is not None:
            return candidate, service
    raise ApiError(404, f"model '{name}' not found", param="model", code="model_not_found")


def _options(options: OllamaOptions | None, out: dict[str, Any]) -> None:
    if options is None:
        return
    given = options.model_dump(exclude_none=True)
    for key, target in OPTION_FIELDS.items():
        if key in given:
            out[target] = given[key]
    predict = options.num_predict
    if predict is not None and predict > 0:
        out["max_tokens"] = predict


#: The OpenAI field a translated request holds -> the Ollama field it came from.
OLLAMA_NAMES = {
    "max_tokens": "options.num_predict",
    "response_format": "format",
    **{key: f"options.{key}" for key in OPTION_FIELDS},
}


def _ollama_named(err: ApiError, names: dict[str, str]) -> ApiError:
    """``err`` about a translated request, naming the fields as the client wrote them."""
    param = err.param
    if param is None:
        return err
    head = param.split("[", 1)[0].split(".", 1)[0]
    if head not in names:
        return err
    ollama = names[head] + param[len(head) :]
    err.message = err.message.replace(f"'{param}'", f"'{ollama}'")
    err.param = ollama
    return err


def _translated(build: Callable[[], parse.Parsed], names: dict[str, str]) -> parse.Parsed:
    """``build()`` (the OpenAI parse of a translated body), its errors and the field its
    413 names in Ollama's words."""
    try:
        parsed = build()
    except ApiError as exc:
        raise _ollama_named(exc, names) from None
    if parsed.size_param is not None:
        head = parsed.size_param
        parsed.size_param = names.get(head, head)
    return parsed


def _format(fmt: str | dict[str, Any] | None, out: dict[str, Any]) -> None:
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": fmt},
        }


def _messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        item: dict[str, Any] = {"role": msg.role, "content": msg.content or ""}
        if msg.role == "tool" and msg.tool_name:
            item["name"] = msg.tool_name
        if msg.tool_calls:
            item["tool_calls"] = _openai_calls(msg.tool_calls)
        out.append(item)
    return out


def _openai_calls(calls: list[OllamaToolCall]) -> list[dict[str, Any]]:
    """Ollama's tool calls of an assistant message (arguments as an object) in OpenAI's shape."""
    return [
        {
            "id": f"call_{j}",
            "type": "function",
            "function": {
                "name": call.function.name,
                "arguments": json.dumps(call.function.arguments or {}),
            },
        }
        for j, call in enumerate(calls)
    ]


def _llm_body(req: OllamaChatRequest | OllamaGenerateRequest, model: str) -> dict[str, Any]:
    stream = req.stream is not False  # Ollama streams unless told otherwise
    out: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        out["stream_options"] = {"include_usage": True}
    _options(req.options, out)
    _format(req.format, out)
    return out


# ---- load and unload ---------------------------------------------------------------------
async def _warm(
    request: web.Request, model: str, service: str, keep_alive_s: float | None, chat_api: bool
) -> web.Response:
    """An empty request: load the model (through the Manager), or unload it (keep_alive 0)."""
    rt = request.app[RUNTIME]
    unload = keep_alive_s == 0
    state = rt.service_state(service)
    if unload and (state.pinned or state.admin_wants_loaded):
        why = "pinned" if state.pinned else "loaded by the operator"
        raise ApiError(
            409,
            f"model '{model}' is {why} and stays loaded: keep_alive 0 does not unload it "
            f"(unpin it first: POST /admin/services/{service}/unpin)",
            param="keep_alive",
            code="service_pinned",
        )
    if not (unload and state.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)):
        try:
            await rt.load(service, keep_alive_s=keep_alive_s)
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
    return rt.service_state(service).spec.kind


def _need_llm(rt: Runtime, name: str, service: str) -> None:
    if _kind(rt, service) not in LLM_KINDS:
        raise ApiError(
            400, f"model '{name}' does not generate text", param="model", code="wrong_model_kind"
        )


# ---- handlers ----------------------------------------------------------------------------
def _chat_request(
    body: dict[str, Any], limits: LimitsConfig, rt: Runtime
) -> tuple[OllamaChatRequest, str, parse.Parsed | None]:
    """Checked (counts first), resolved and translated; no Parsed for a load/unload."""
    parse.check_items(body, limits)
    req = parse.validated(OllamaChatRequest, body)
    model, service = _resolve(rt, req.model)
    _need_llm(rt, req.model, service)
    messages = _messages(req.messages or [])
    if not messages:
        return req, service, None
    out = _llm_body(req, model)
    out["messages"] = messages
    if req.tools is not None:
        out["tools"] = body["tools"]
    default_max = rt.cfg.server.default_max_tokens
    parsed = _translated(lambda: parse.chat(out, b"", default_max, limits), OLLAMA_NAMES)
    parsed.keep_alive_s = req.keep_alive
    return req, service, parsed


@ollama_errors
async def chat(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    req, service, parsed = await parse.decode(
        request, lambda body, _, limits: _chat_request(body, limits, rt)
    )
    if parsed is None:
        return await _warm(request, req.model, service, req.keep_alive, chat_api=True)
    relay = OllamaRelay(req.model, chat_api=True, chat_backend=True)
    return await serve(request, parsed, relay)


def _generate_request(
    body: dict[str, Any], limits: LimitsConfig, rt: Runtime
) -> tuple[OllamaGenerateRequest, str, bool, parse.Parsed | None]:
    req = parse.validated(OllamaGenerateRequest, body)
    name = req.model
    model, service = _resolve(rt, name)
    _need_llm(rt, name, service)
    prompt, system = req.prompt, req.system
    chat_backend = _kind(rt, service) is ServiceKind.CHAT and not req.raw
    if not prompt:
        return req, service, chat_backend, None
    out = _llm_body(req, model)
    default_max = rt.cfg.server.default_max_tokens
    if chat_backend:
        messages = [{"role": "system", "content": system}] if system else []
        out["messages"] = [*messages, {"role": "user", "content": prompt}]
        names = {**OLLAMA_NAMES, "messages": "prompt"}
        parsed = _translated(lambda: parse.chat(out, b"", default_max, limits), names)
    else:
        if "response_format" in out:
            raise bad_field("format", "'format' needs a chat model (this one completes text)")
        out["prompt"] = f"{system}\n\n{prompt}" if system else prompt
        parsed = _translated(lambda: parse.completion(out, b"", default_max, limits), OLLAMA_NAMES)
    parsed.keep_alive_s = req.keep_alive
    return req, service, chat_backend, parsed


@ollama_errors
async def generate(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    req, service, chat_backend, parsed = await parse.decode(
        request, lambda body, _, limits: _generate_request(body, limits, rt)
    )
    if parsed is None:
        return await _warm(request, req.model, service, req.keep_alive, chat_api=False)
    relay = OllamaRelay(req.model, chat_api=False, chat_backend=chat_backend)
    return await serve(request, parsed, relay)


def _embed_request(
    body: dict[str, Any], limits: LimitsConfig, rt: Runtime, *, legacy: bool
) -> tuple[str, parse.Parsed]:
    field = "prompt" if legacy else "input"
    parse.check_items(body, limits, inputs=field)
    req: OllamaEmbedRequest | OllamaEmbeddingsRequest
    if legacy:
        req = parse.validated(OllamaEmbeddingsRequest, body)
    else:
        req = parse.validated(OllamaEmbedRequest, body)
    model, service = _resolve(rt, req.model)
    if _kind(rt, service) is not ServiceKind.EMBEDDINGS:
        raise ApiError(
            400, f"model '{req.model}' does not embed", param="model", code="wrong_model_kind"
        )
    names = {"input": field}
    parsed = _translated(
        lambda: parse.embeddings({"model": model, "input": body[field]}, b"", limits), names
    )
    parsed.keep_alive_s = req.keep_alive
    return req.model, parsed


async def _embed(request: web.Request, *, legacy: bool) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    name, parsed = await parse.decode(
        request, lambda body, _, limits: _embed_request(body, limits, rt, legacy=legacy)
    )
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
    backend = rt.backend_of(service).describe()
    return {
        "parent_model": "",
        "format": "gguf" if _kind(rt, service) in LLM_KINDS else "onnx",
        "family": str(backend.get("component") or svc_cfg.kind),
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _size(rt: Runtime, service: str) -> int:
    profile = rt.service_state(service).spec.profile
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


def _expires_at(rt: Runtime, svc: ServiceState) -> datetime:
    if svc.pinned or svc.admin_wants_loaded:
        return NEVER
    ttl = svc.ttl_s
    if svc.spec.residency is Residency.ON_DEMAND:
        ttl = min(ttl, rt.knobs.on_demand_ttl_s)
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
        loaded = [r for r in rt.replicas(service) if r.status is ServiceStatus.LOADED]
        if not loaded or service in seen:
            continue
        seen.add(service)
        entry = _entry(rt, model, service)
        entry.pop("modified_at")
        # a service loaded on several devices: what its replicas hold together
        entry["size"] = sum(r.resident_bytes for r in loaded)
        entry["size_vram"] = sum(
            r.resident_bytes for r in loaded if rt.cfg.devices[r.spec.device].kind == "nvidia"
        )
        expires = max(_expires_at(rt, r) for r in loaded)
        entry["expires_at"] = expires.isoformat().replace("+00:00", "Z")
        models.append(entry)
    return web.json_response({"models": models})


@ollama_errors
async def show(request: web.Request) -> web.Response:
    body, _ = await parse.read_json(request)
    rt = request.app[RUNTIME]
    _, service = _resolve(rt, parse.validated(OllamaShowRequest, body).chosen())
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
    app.router.add_post("/api/chat", chat, expect_handler=parse.expect_within_limit)
    app.router.add_post("/api/generate", generate, expect_handler=parse.expect_within_limit)
    app.router.add_post("/api/embed", embed, expect_handler=parse.expect_within_limit)
    app.router.add_post("/api/embeddings", embeddings, expect_handler=parse.expect_within_limit)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show, expect_handler=parse.expect_within_limit)
    app.router.add_get("/api/version", version)
