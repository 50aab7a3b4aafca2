"""OpenAI-compatible endpoints: route by ``model`` to a service, admit through the
Manager, call the backend, relay the answer (SSE streams chunk by chunk).

Every response carries ``X-Request-Id``; ``GET /admin/explain/{id}`` tells its story.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from accelmux.backends.base import BackendResponse
from accelmux.core.types import ServiceClass
from accelmux.errors import BackendError
from accelmux.gateway import parse
from accelmux.gateway.connections import reserve_refusal, reserved
from accelmux.gateway.errors import ApiError, backend_failure, refusal
from accelmux.gateway.keys import RUNTIME, request_id
from accelmux.gateway.relay import Relay
from accelmux.runtime.call import Call
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused

log = logging.getLogger("accelmux.gateway")


def _route(rt: Runtime, parsed: parse.Parsed) -> str:
    service = rt.models.get(parsed.model)
    if service is None:
        raise ApiError(
            404,
            f"The model '{parsed.model}' does not exist (GET /v1/models lists the models)",
            param="model",
            code="model_not_found",
        )
    kind = rt.service_state(service).spec.kind
    allowed = parse.ENDPOINT_KINDS[parsed.endpoint]
    if kind not in allowed:
        raise ApiError(
            400,
            f"model '{parsed.model}' is a {kind.value} service; {parsed.endpoint} needs "
            f"{' or '.join(k.value for k in allowed)}",
            param="model",
            code="wrong_model_kind",
        )
    return service


def _sse_error(err: ApiError) -> bytes:
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


class Exchange(Protocol):
    """One request's way back to its client, whichever HTTP stack carries it."""

    #: The request's id (``X-Request-Id``).
    request_id: str
    #: Whether it came on a reserved connection (only realtime services are served).
    reserved: bool

    async def begin_stream(self, status: int, headers: dict[str, str]) -> None:
        """Send the head of a streamed answer."""
        ...

    async def write(self, data: bytes) -> None:
        """Send part of a streamed answer."""
        ...

    async def end_stream(self) -> None:
        """End a streamed answer."""
        ...


@dataclass(slots=True)
class Answer:
    """A whole answer to send (``error``: an error, sent in the client's API's shape)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: ApiError | None = None


#: What :func:`serve_parsed` answers when the answer was streamed (and is over).
STREAMED = Answer(status=0)


class _ExchangeSink:
    """Where a streamed answer goes: the exchange's stream, opened with the first answer
    (its content type, or the relay's), each chunk relayed as the client's API frames it."""

    def __init__(self, ex: Exchange, relay: Relay | None) -> None:
        self.ex = ex
        self.relay = relay
        self.started = False

    async def open(self, answer: BackendResponse) -> None:
        if self.started:
            return
        self.started = True
        relay = self.relay
        await self.ex.begin_stream(
            answer.status,
            {
                "Content-Type": relay.stream_content_type if relay else answer.content_type,
                "Cache-Control": "no-cache",
                "X-Request-Id": self.ex.request_id,
            },
        )

    async def write(self, chunk: bytes) -> None:
        data = self.relay.chunk(chunk) if self.relay else chunk
        if data and self.started:
            await self.ex.write(data)


async def serve_parsed(
    rt: Runtime, parsed: parse.Parsed, ex: Exchange, relay: Relay | None = None
) -> Answer:
    """Admit ``parsed`` through the Manager, run it, relay the answer (through ``relay``
    when the client speaks another API): the whole answer, or :data:`STREAMED` once a
    streamed one went out through ``ex`` (any HTTP stack)."""
    service = _route(rt, parsed)
    spec = rt.service_state(service).spec
    if spec.cls is not ServiceClass.REALTIME and ex.reserved:
        raise reserve_refusal(rt.cfg.server.max_connections)
    kind = spec.kind
    rid = ex.request_id
    call = Call(
        kind=kind,
        endpoint=parsed.endpoint,
        body=parsed.body,
        stream=parsed.stream,
        files=parsed.files,
        file_info=parsed.file_info,
        raw=parsed.raw,
        content_type=parsed.content_type,
    )
    sink = _ExchangeSink(ex, relay)
    try:
        answer = await rt.call(
            service,
            parsed.demand,
            call,
            request_id=rid,
            sink=sink,
            keep_alive_s=parsed.keep_alive_s,
            pausable=kind.is_llm and rt.can_pause(service, call.request(rid, service, 0)),
        )
    except Refused as exc:
        err = refusal(exc, parsed.size_param or parse.DEMAND_PARAM[parsed.endpoint])
        return await _fail(ex, sink.started, err, relay)
    except BackendError as exc:
        return await _fail(ex, sink.started, backend_failure(exc), relay)
    except ConnectionError:
        if not sink.started:
            raise
        # the client went away mid-stream (its request is accounted as cancelled):
        # nobody is left to answer, and it is no error of the daemon's
        return STREAMED
    if sink.started:
        if relay is not None:
            await ex.write(relay.end())
        await ex.end_stream()
        return STREAMED
    if relay is not None:
        return _relayed(relay, answer, rid)
    return Answer(
        status=answer.status,
        body=answer.body,
        headers={"Content-Type": answer.content_type, "X-Request-Id": rid, **answer.headers},
    )


def _relayed(relay: Relay, answer: BackendResponse, rid: str) -> Answer:
    if answer.status >= 400:  # the backend's error, in OpenAI's shape
        try:
            message = str(json.loads(answer.body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = answer.body.decode("utf-8", "replace") or f"backend answered {answer.status}"
        code = "invalid_request" if answer.status < 500 else "backend_error"
        return Answer(error=ApiError(answer.status, message, code=code))
    try:
        body = relay.body(answer.status, answer.body)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        err = ApiError(
            502,
            "the backend's answer is not an OpenAI answer",
            type="backend_error",
            code="backend_error",
        )
        return Answer(error=err)
    return Answer(
        status=answer.status,
        body=body,
        headers={"Content-Type": "application/json", "X-Request-Id": rid},
    )


async def _fail(ex: Exchange, streaming: bool, err: ApiError, relay: Relay | None) -> Answer:
    if not streaming:
        return Answer(error=err)
    with contextlib.suppress(ConnectionError):
        await ex.write(_sse_error(err) if relay is None else relay.stream_error(err))
        await ex.end_stream()
    return STREAMED


class AiohttpExchange:
    """:class:`Exchange` over an aiohttp request."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.request_id = request_id(request)
        self.reserved = reserved(request)
        self.response: web.StreamResponse | None = None

    async def begin_stream(self, status: int, headers: dict[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def end_stream(self) -> None:
        assert self.response is not None
        await self.response.write_eof()


async def serve(
    request: web.Request, parsed: parse.Parsed, relay: Relay | None = None
) -> web.StreamResponse:
    """:func:`serve_parsed` for an aiohttp request: the aiohttp answer."""
    ex = AiohttpExchange(request)
    answer = await serve_parsed(request.app[RUNTIME], parsed, ex, relay)
    if answer is STREAMED:
        assert ex.response is not None
        return ex.response
    if answer.error is not None:
        resp = answer.error.response() if relay is None else relay.error(answer.error)
        resp.headers["X-Request-Id"] = ex.request_id
        return resp
    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


# ---- handlers ---------------------------------------------------------------------------
async def chat_completions(request: web.Request) -> web.StreamResponse:
    default_max = request.app[RUNTIME].cfg.server.default_max_tokens
    parsed = await parse.decode(
        request, lambda body, raw, limits: parse.chat(body, raw, default_max, limits)
    )
    return await serve(request, parsed)


async def completions(request: web.Request) -> web.StreamResponse:
    default_max = request.app[RUNTIME].cfg.server.default_max_tokens
    parsed = await parse.decode(
        request, lambda body, raw, limits: parse.completion(body, raw, default_max, limits)
    )
    return await serve(request, parsed)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await serve(request, await parse.decode(request, parse.embeddings))


async def speech(request: web.Request) -> web.StreamResponse:
    return await serve(request, await parse.decode(request, lambda b, r, _: parse.speech(b, r)))


async def images(request: web.Request) -> web.StreamResponse:
    return await serve(request, await parse.decode(request, lambda b, r, _: parse.images(b, r)))


async def transcriptions(request: web.Request) -> web.StreamResponse:
    fields, files, info = await parse.read_form(request)
    return await serve(request, parse.transcription(fields, files, info))


async def detections(request: web.Request) -> web.StreamResponse:
    if request.content_type.startswith("multipart/"):
        fields, files, _ = await parse.read_form(request)
        return await serve(request, parse.detection(fields, files, b""))
    parsed = await parse.decode(request, lambda b, r, _: parse.detection(b, {}, r))
    return await serve(request, parsed)


def _model_entry(rt: Runtime, model: str, service: str) -> dict[str, Any]:
    state = rt.service_state(service)
    return {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "accelmux",
        "service": service,
        "kind": state.spec.kind.value,
        "state": state.status.value,
    }


async def models(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    data = [_model_entry(rt, model, service) for model, service in rt.models.items()]
    return web.json_response({"object": "list", "data": data})


async def model(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    name = request.match_info["model"]
    service = rt.models.get(name)
    if service is None:
        raise ApiError(
            404,
            f"The model '{name}' does not exist (GET /v1/models lists the models)",
            param="model",
            code="model_not_found",
        )
    return web.json_response(_model_entry(rt, name, service))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
    app.router.add_post(
        "/v1/chat/completions", chat_completions, expect_handler=parse.expect_within_limit
    )
    app.router.add_post("/v1/completions", completions, expect_handler=parse.expect_within_limit)
    app.router.add_post("/v1/embeddings", embeddings, expect_handler=parse.expect_within_limit)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/speech", speech, expect_handler=parse.expect_within_limit)
    app.router.add_post("/v1/images/generations", images, expect_handler=parse.expect_within_limit)
    app.router.add_post("/v1/detections", detections)
