"""Build the aiohttp application around a :class:`~accelmux.runtime.daemon.Runtime`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from accelmux.core.types import ServiceClass, ServiceKind
from accelmux.gateway import admin, ollama_api, openai_api, parse
from accelmux.gateway.connections import activity_middleware, claim_middleware
from accelmux.gateway.door import DOOR, Door
from accelmux.gateway.drain import drain_middleware
from accelmux.gateway.fairness import OLLAMA_ROUTE_KINDS, realtime_paths
from accelmux.gateway.guard import add_cors, guard_middleware
from accelmux.gateway.keys import RUNTIME, add_request_id
from accelmux.gateway.middleware import auth_middleware, error_middleware, rate_limit_middleware
from accelmux.gateway.openapi import ServedModels, document
from accelmux.runtime.daemon import Runtime


async def health(request: web.Request) -> web.Response:
    """200 ``{"status": "ok"}``; 503 ``{"status": "stopping"}`` while the daemon drains, so
    a load balancer stops sending it work."""
    rt = request.app[RUNTIME]
    if rt.stopping:
        return web.json_response(
            {"status": "stopping", "message": "the daemon is shutting down"}, status=503
        )
    return web.json_response({"status": "ok"})


#: The service kinds whose models each request body's route takes (OpenAI's, Ollama's,
#: the jobs API's); ``/api/show`` describes any model.
ROUTE_KINDS: dict[str, tuple[ServiceKind, ...]] = {
    **parse.ENDPOINT_KINDS,
    **OLLAMA_ROUTE_KINDS,
    "/v1/jobs": (ServiceKind.EMBEDDINGS,),
    "/api/show": tuple(ServiceKind),
}


def served_models(runtime: Runtime) -> ServedModels:
    """The models this daemon serves, route by route (what its document names)."""
    kinds = {name: runtime.service_state(svc).spec.kind for name, svc in runtime.models.items()}
    by_path = {
        path: [name for name, kind in kinds.items() if kind in allowed]
        for path, allowed in ROUTE_KINDS.items()
    }
    chat = [name for name, kind in kinds.items() if kind is ServiceKind.CHAT]
    return ServedModels(
        by_path=by_path,
        everyone=list(kinds),
        services=list(runtime.cfg.services),
        rules={"/api/generate": [format_needs_a_chat_model(chat)]},
    )


def format_needs_a_chat_model(chat: list[str]) -> dict[str, Any]:
    """``/api/generate``'s ``format`` is followed by chat models only (a completion model
    answers 400 naming the field)."""
    no_format: dict[str, Any] = {"properties": {"format": {"enum": [None, ""]}}}
    if not chat:
        return no_format
    return {"anyOf": [no_format, {"properties": {"model": {"enum": chat}}}]}


async def openapi(request: web.Request) -> web.Response:
    """The document, its ``model`` fields naming this daemon's models."""
    return web.json_response(document(served_models(request.app[RUNTIME])))


def priority_paths(runtime: Runtime) -> frozenset[str]:
    """The paths a reserved connection may ask for: /health, and the routes that can
    reach one of the realtime services (the request's model then decides)."""
    kinds = {s.kind for s in runtime.manager.spec.services if s.cls is ServiceClass.REALTIME}
    return realtime_paths({**parse.ENDPOINT_KINDS, **OLLAMA_ROUTE_KINDS}, kinds)


def build_app(runtime: Runtime, *, host: str | None = None) -> web.Application:
    server = runtime.cfg.server
    max_body = int(server.max_body)
    listen = host if host is not None else server.host
    door = Door.of(server, listen)
    middlewares = [
        activity_middleware,
        drain_middleware(),
        error_middleware(max_body),
        guard_middleware(server, listen, door.browser),
        auth_middleware(server, listen),
        claim_middleware,
    ]
    if door.buckets is not None:
        middlewares.append(rate_limit_middleware(door.buckets))
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    app[RUNTIME] = runtime
    app[DOOR] = door
    app.on_response_prepare.append(add_request_id)
    add_cors(app, server)
    app.router.add_get("/health", health)
    app.router.add_get("/openapi.json", openapi)
    openai_api.add_routes(app)
    ollama_api.add_routes(app)
    admin.add_routes(app)
    return app
