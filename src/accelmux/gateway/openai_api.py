"""OpenAI-compatible endpoints: route by ``model`` to a service, admit through the
Manager, call the backend, relay the answer (SSE streams chunk by chunk).

Every response carries ``X-Request-Id``; ``GET /admin/explain/{id}`` tells its story.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from aiohttp import web

from accelmux.backends.base import BackendRequest, BackendResponse
from accelmux.core.actions import Dispatch
from accelmux.errors import BackendError
from accelmux.gateway import parse
from accelmux.gateway.errors import ApiError, backend_failure, refusal
from accelmux.gateway.keys import RUNTIME, request_id
from accelmux.gateway.relay import Relay
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused, Ticket

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


async def serve(
    request: web.Request, parsed: parse.Parsed, relay: Relay | None = None
) -> web.StreamResponse:
    """Admit ``parsed`` through the Manager, run it, relay the answer (through ``relay``
    when the client speaks another API)."""
    rt = request.app[RUNTIME]
    service = _route(rt, parsed)
    kind = rt.service_state(service).spec.kind
    rid = request_id(request)
    started = time.perf_counter()
    arrived = rt.live.clock()
    metrics = rt.metrics

    def on_dispatch(ticket: Ticket) -> None:
        metrics.queue_wait.labels(service).observe(time.monotonic() - ticket.arrived)

    def backend_request(d: Dispatch | None) -> BackendRequest:
        return BackendRequest(
            request_id=rid,
            service=d.service if d is not None else service,
            kind=kind,
            endpoint=parsed.endpoint,
            body=parsed.body,
            stream=parsed.stream,
            files=parsed.files,
            file_info=parsed.file_info,
            raw=parsed.raw,
            content_type=parsed.content_type,
            lease_bytes=d.lease_bytes if d is not None else 0,
        )

    stream_resp: web.StreamResponse | None = None

    async def attempt(d: Dispatch) -> tuple[BackendResponse, int | None]:
        nonlocal stream_resp
        if stream_resp is not None:
            # preempted after part of a stream went out: a rerun would repeat it
            raise BackendError("stream preempted for higher-class work after partial output")
        # the replica the Manager dispatched it to (any of a replicated service's)
        answer = await rt.backends[d.service].handle(backend_request(d))
        if answer.stream is None:
            if kind.is_llm and answer.status < 400:
                rt.live.usage_json(service, answer.body, rid)
            return answer, answer.peak_bytes
        chunks = answer.stream
        timer = rt.live.stream(service, arrived, rid)
        try:
            if stream_resp is None:
                stream_resp = web.StreamResponse(
                    status=answer.status,
                    headers={
                        "Content-Type": relay.stream_content_type if relay else answer.content_type,
                        "Cache-Control": "no-cache",
                        "X-Request-Id": rid,
                    },
                )
                await stream_resp.prepare(request)
            async for chunk in chunks:
                if chunk:
                    timer.chunk(chunk)
                data = relay.chunk(chunk) if relay else chunk
                if data:
                    await stream_resp.write(data)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if answer.release is not None:
                answer.release()
        return answer, answer.peak_bytes

    outcome = "ok"
    try:
        answer = await rt.run_request(
            service,
            parsed.demand,
            attempt,
            request_id=rid,
            on_dispatch=on_dispatch,
            keep_alive_s=parsed.keep_alive_s,
            pausable=kind.is_llm and rt.can_pause(service, backend_request(None)),
        )
    except Refused as exc:
        outcome = exc.reason.value
        err = refusal(exc, parsed.size_param or parse.DEMAND_PARAM[parsed.endpoint])
        return await _fail(request, stream_resp, err, rid, relay)
    except BackendError as exc:
        err = backend_failure(exc)
        outcome = str(err.code)
        return await _fail(request, stream_resp, err, rid, relay)
    finally:
        metrics.latency.labels(service, parsed.endpoint, outcome).observe(
            time.perf_counter() - started
        )
    if stream_resp is not None:
        if relay is not None:
            await stream_resp.write(relay.end())
        await stream_resp.write_eof()
        return stream_resp
    if relay is not None:
        return _relayed(relay, answer, rid)
    return web.Response(
        status=answer.status,
        body=answer.body,
        headers={"Content-Type": answer.content_type, "X-Request-Id": rid, **answer.headers},
    )


def _relayed(relay: Relay, answer: BackendResponse, rid: str) -> web.Response:
    if answer.status >= 400:  # the backend's error, in OpenAI's shape
        try:
            message = str(json.loads(answer.body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = answer.body.decode("utf-8", "replace") or f"backend answered {answer.status}"
        code = "invalid_request" if answer.status < 500 else "backend_error"
        resp = relay.error(ApiError(answer.status, message, code=code))
    else:
        try:
            body = relay.body(answer.status, answer.body)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            err = ApiError(
                502,
                "the backend's answer is not an OpenAI answer",
                type="backend_error",
                code="backend_error",
            )
            resp = relay.error(err)
            resp.headers["X-Request-Id"] = rid
            return resp
        resp = web.Response(status=answer.status, body=body, content_type="application/json")
    resp.headers["X-Request-Id"] = rid
    return resp


async def _fail(
    request: web.Request,
    stream_resp: web.StreamResponse | None,
    err: ApiError,
    rid: str,
    relay: Relay | None = None,
) -> web.StreamResponse:
    if stream_resp is None:
        resp = err.response() if relay is None else relay.error(err)
        resp.headers["X-Request-Id"] = rid
        return resp
    with contextlib.suppress(ConnectionError):
        await stream_resp.write(_sse_error(err) if relay is None else relay.stream_error(err))
        await stream_resp.write_eof()
    return stream_resp


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
