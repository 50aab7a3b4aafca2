"""Build the aiohttp application around a :class:`~accelmux.runtime.daemon.Runtime`."""

from __future__ import annotations

from aiohttp import web

from accelmux.gateway import admin, ollama_api, openai_api
from accelmux.gateway.keys import RUNTIME, add_request_id
from accelmux.gateway.middleware import auth_middleware, error_middleware, rate_limit_middleware
from accelmux.gateway.openapi import document
from accelmux.runtime.daemon import Runtime


async def health(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return web.json_response({"status": "stopping" if rt.stopping else "ok"})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


def build_app(runtime: Runtime, *, host: str | None = None) -> web.Application:
    server = runtime.cfg.server
    max_body = int(server.max_body)
    middlewares = [
        error_middleware(max_body),
        auth_middleware(server, host if host is not None else server.host),
    ]
    if server.rate_limit is not None:
        middlewares.append(rate_limit_middleware(server.rate_limit))
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    app[RUNTIME] = runtime
    app.on_response_prepare.append(add_request_id)
    app.router.add_get("/health", health)
    app.router.add_get("/openapi.json", openapi)
    openai_api.add_routes(app)
    ollama_api.add_routes(app)
    admin.add_routes(app)
    return app
