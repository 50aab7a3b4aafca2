"""The cluster gateway: one HTTP front for every node, routing each request by its model.

It keeps the single machine's guards (the same middlewares: API keys on ``/v1`` and
``/api``, the admin key on ``/admin``, the browser guard, request size limits, rate
limits; the browser's ``Origin`` is checked here and not sent on) and forwards
each inference request, body untouched, to the node :func:`accelmux.core.routing.route`
chooses (through its per-poll index); that node's own daemon validates, admits and
serves it, so every API (OpenAI, Ollama) answers as on one machine. Streamed answers
(SSE, NDJSON) are relayed chunk by chunk. Lists are the union over live nodes:
``/v1/models`` from the snapshots the gateway holds, ``/api/tags`` and ``/api/ps``
asked of every live node.

Errors, in OpenAI's shape: a model no node knows, 404 ``model_not_found``; a service
whose every host is down, 503 ``node_unavailable`` naming the lost nodes, with
Retry-After; a node lost mid-request, 502 ``node_lost`` naming it; a node slower than
``cluster.request_timeout_s``, 504 ``node_timeout``.

``/admin/cluster`` shows every node; ``/admin/nodes/NODE/PATH`` reaches ``/PATH`` of one
node's daemon (its status, its jobs), behind the admin key.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from accelmux import __version__
from accelmux.cluster.nodes import Answer, NodeLost, NodeTable, NodeTimeout
from accelmux.cluster.requests import model_of, streams
from accelmux.cluster.snapshots import model_entries
from accelmux.config.server import ServerConfig
from accelmux.core.routing import NoRoute, NoRouteReason, live_models, route_indexed
from accelmux.gateway.connections import activity_middleware, claim_middleware
from accelmux.gateway.drain import drain_middleware
from accelmux.gateway.errors import ApiError
from accelmux.gateway.guard import add_cors, guard_middleware
from accelmux.gateway.middleware import (
    TokenBuckets,
    auth_middleware,
    error_middleware,
    rate_limit_middleware,
)
from accelmux.gateway.openapi import document

TABLE = web.AppKey("cluster_nodes", NodeTable)
#: model -> (service, nodes that may host it), from the cluster's config when given.
CONFIGURED = web.AppKey("cluster_configured", dict[str, tuple[str, tuple[str, ...]]])
#: Not forwarded either way: they describe one hop, not the request.
HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)
NODE_HEADER = "X-Accelmux-Node"
#: Checked here by the browser guard, so not sent on: a node's own guard would compare
#: the browser's Origin with the node's address.
BROWSER_HEADERS = frozenset({"origin", "sec-fetch-site"})


def request_headers(request: web.Request) -> list[tuple[str, str]]:
    dropped = HOP_HEADERS | BROWSER_HEADERS
    return [(k, v) for k, v in request.headers.items() if k.lower() not in dropped]


def answer_headers(headers: list[tuple[str, str]], node: str) -> list[tuple[str, str]]:
    out = [(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]
    return [*out, (NODE_HEADER, node)]


def no_route_error(
    choice: NoRoute,
    retry_after_s: float,
    configured: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
) -> ApiError:
    """The answer when no live node can take a request: 503 for a model some node may
    host (naming the nodes), 404 for one nobody knows."""
    known = (configured or {}).get(choice.model)
    if choice.reason is NoRouteReason.UNKNOWN_MODEL and known is not None:
        service, nodes = known
        where = ", ".join(repr(n) for n in nodes) if nodes else "any node"
        return ApiError(
            503,
            f"service {service!r} (model {choice.model!r}) is unavailable: no live node "
            f"hosts it (it may run on {where}; start a node agent there)",
            type="service_unavailable",
            code="node_unavailable",
            retry_after_s=retry_after_s,
        )
    if choice.reason is NoRouteReason.UNKNOWN_MODEL:
        return ApiError(
            404,
            f"The model '{choice.model}' does not exist on any live node "
            "(GET /v1/models lists the models)",
            param="model",
            code="model_not_found",
        )
    lost = ", ".join(repr(n) for n in choice.lost_nodes)
    others = [n for n in (known[1] if known else ()) if n not in choice.lost_nodes]
    also = f"; no live agent on {', '.join(repr(n) for n in others)} either" if others else ""
    return ApiError(
        503,
        f"service {choice.service!r} (model {choice.model!r}) is unavailable: the node(s) "
        f"that hosted it ({lost}) are down{also}",
        type="service_unavailable",
        code="node_unavailable",
        retry_after_s=retry_after_s,
    )


def lost_error(exc: NodeLost | NodeTimeout) -> ApiError:
    if isinstance(exc, NodeTimeout):
        return ApiError(504, str(exc), type="server_error", code="node_timeout")
    return ApiError(
        502,
        f"node {exc.node!r} was lost while serving this request: {exc.why}",
        type="backend_error",
        code="node_lost",
        retry_after_s=1.0,
    )


async def relay(
    request: web.Request, node: str, service: str | None, path: str, body: bytes
) -> web.StreamResponse:
    """Forward ``request`` (with ``body``) to ``path`` on ``node``; relay its answer."""
    table = request.app[TABLE]
    headers = request_headers(request)
    content_type = request.headers.get("Content-Type", "")
    if request.method == "POST" and streams(path, content_type, body):
        return await relay_stream(request, node, service, path, headers, body)
    try:
        status, out_headers, out_body = await table.forward(
            node, service, request.method, path, headers, body
        )
    except (NodeLost, NodeTimeout) as exc:
        raise lost_error(exc) from None
    response = web.Response(status=status, body=out_body)
    for key, value in answer_headers(out_headers, node):
        response.headers.add(key, value)
    return response


async def relay_stream(
    request: web.Request,
    node: str,
    service: str | None,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> web.StreamResponse:
    table = request.app[TABLE]
    chunks = table.stream(node, service, request.method, path, headers, body)
    response: web.StreamResponse | None = None
    try:
        async for item in chunks:
            if response is None:
                status, out_headers = item
                response = web.StreamResponse(status=int(status))
                for key, value in answer_headers(list(out_headers), node):
                    response.headers.add(key, value)
                await response.prepare(request)
            else:
                await response.write(bytes(item))
    except (NodeLost, NodeTimeout) as exc:
        err = lost_error(exc)
        if response is None:
            raise err from None
        # The status line is gone: end the stream with the error, in the stream's shape.
        event = json.dumps(err.body()).encode()
        sse = response.headers.get("Content-Type", "").startswith("text/event-stream")
        await response.write(b"data: " + event + b"\n\n" if sse else event + b"\n")
    finally:
        await chunks.aclose()
    if response is None:
        raise ApiError(502, f"node {node!r} sent no answer", type="backend_error", code="node_lost")
    await response.write_eof()
    return response


async def routed(request: web.Request) -> web.StreamResponse:
    """An inference request: to the node that can serve its model soonest."""
    body = await request.read()
    model = model_of(request.headers.get("Content-Type", ""), body)
    if model is None:
        raise ApiError(400, "the request names no model", param="model", code="missing_model")
    return await to_model(request, model, request.path_qs, body)


async def to_model(request: web.Request, model: str, path: str, body: bytes) -> web.StreamResponse:
    table = request.app[TABLE]
    choice = route_indexed(table.index(), model, table.pending())
    if isinstance(choice, NoRoute):
        raise no_route_error(choice, table.cfg.retry_after_s, request.app[CONFIGURED])
    return await relay(request, choice.node, choice.service, path, body)


async def model_entry(request: web.Request) -> web.StreamResponse:
    return await to_model(request, request.match_info["model"], request.path_qs, b"")


async def _union(request: web.Request, path: str, key: str, ident: str) -> list[Any]:
    """The ``key`` lists of ``GET path`` on every live node, merged by ``ident``."""
    table = request.app[TABLE]
    headers = request_headers(request)

    async def one(node: str) -> Answer | None:
        try:
            return await table.forward(node, None, "GET", path, headers, b"")
        except (NodeLost, NodeTimeout):
            return None

    merged: dict[str, Any] = {}
    answers = await asyncio.gather(*(one(n.name) for n in table.alive()))
    for answer in answers:
        if answer is None or answer[0] != 200:
            continue
        for item in json.loads(answer[2]).get(key, []):
            merged.setdefault(str(item.get(ident)), item)
    return [merged[k] for k in sorted(merged)]


async def models(request: web.Request) -> web.Response:
    """From the snapshots the gateway holds: no call to any node."""
    table = request.app[TABLE]
    live = [n.snapshot for n in table.alive() if n.snapshot is not None]
    return web.json_response({"object": "list", "data": model_entries(live)})


async def ollama_tags(request: web.Request) -> web.Response:
    return web.json_response({"models": await _union(request, "/api/tags", "models", "name")})


async def ollama_ps(request: web.Request) -> web.Response:
    return web.json_response({"models": await _union(request, "/api/ps", "models", "name")})


async def ollama_version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def health(request: web.Request) -> web.Response:
    table = request.app[TABLE]
    alive = len(table.alive())
    return web.json_response(
        {"status": "ok" if alive else "no_nodes", "nodes": len(table.nodes), "alive": alive}
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


async def cluster_status(request: web.Request) -> web.Response:
    table = request.app[TABLE]
    now = table.clock()
    nodes = [table.nodes[n].as_dict(now) for n in sorted(table.nodes)]
    served = [{"model": m, "service": s} for m, s in live_models(table.views())]
    gateway = {"ray_node_id": table.ray_node_id, "cluster": table.cfg.model_dump()}
    return web.json_response(
        {"time": time.time(), "gateway": gateway, "nodes": nodes, "models": served}
    )


async def node_passthrough(request: web.Request) -> web.StreamResponse:
    """``/admin/nodes/NODE/PATH``: ``/PATH`` of one node's daemon (admin key guarded)."""
    node = request.match_info["node"]
    path = "/" + request.match_info["tail"]
    if request.query_string:
        path += "?" + request.query_string
    body = await request.read()
    return await relay(request, node, None, path, body)


def build_cluster_app(
    table: NodeTable,
    server: ServerConfig,
    configured: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
) -> web.Application:
    """The gateway in front of ``table``'s nodes, guarded as ``server`` says;
    ``configured``: the cluster config's models and the nodes that may host them."""
    max_body = int(server.max_body)
    middlewares = [
        activity_middleware,
        drain_middleware(),
        error_middleware(max_body),
        guard_middleware(server, server.host),
        auth_middleware(server, server.host),
        claim_middleware,
    ]
    if server.rate_limit is not None:
        middlewares.append(rate_limit_middleware(TokenBuckets(server.rate_limit)))
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    add_cors(app, server)
    app[TABLE] = table
    app[CONFIGURED] = dict(configured or {})
    app.router.add_get("/health", health)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model_entry)
    app.router.add_get("/api/tags", ollama_tags)
    app.router.add_get("/api/ps", ollama_ps)
    app.router.add_get("/api/version", ollama_version)
    app.router.add_post("/v1/{tail:.+}", routed)
    app.router.add_post("/api/{tail:.+}", routed)
    app.router.add_get("/admin/cluster", cluster_status)
    app.router.add_route("*", "/admin/nodes/{node}/{tail:.*}", node_passthrough)
    return app
