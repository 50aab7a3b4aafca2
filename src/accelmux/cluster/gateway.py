"""The cluster gateway: one HTTP front for every node, routing each request by its model.

It keeps the single machine's guards (the same middlewares: API keys on ``/v1`` and
``/api``, the admin key on ``/admin``, the browser guard, request size limits, rate
limits; the browser's ``Origin`` is checked here and not sent on) and forwards each
inference request, body untouched, straight to the daemon of the node
:func:`accelmux.core.routing.route` chooses (through its per-poll index), over HTTP with
the cluster's key; that node's own daemon validates, admits and serves it, so every API
(OpenAI, Ollama) answers as on one machine. Every answer is relayed as it comes: a
streamed one (SSE, NDJSON, a long ``GET``) chunk by chunk, whatever the route.

**Trying the next node.** When the chosen node refuses a request for want of memory or
room in its queue (its Manager's 429/503/413: ``queue_full``, ``deadline_exceeded``,
``too_large``, ``load_failed``, ``shutting_down``), or cannot be reached at all, the
request goes to the next best node, while the request's deadline (its service's
``queue.deadline_s``) lasts; a node lost after the request reached it is tried again
elsewhere too, except a job submission (``POST /v1/jobs``), which is durable there.

Errors, in OpenAI's shape: a model no node knows, 404 ``model_not_found``; a service
whose every host is down, 503 ``node_unavailable`` naming the lost nodes, with
Retry-After; a node lost mid-answer, 502 ``node_lost`` naming it (a stream already
started ends with an error event in its own format); a node slower than
``cluster.request_timeout_s``, 504 ``node_timeout``.

``/admin/cluster`` shows every node; ``/admin/explain/{id}`` why a request went where it
did; ``/admin/nodes/NODE/PATH`` reaches ``/PATH`` of one node's daemon (its status, its
decision stream, its jobs), behind the admin key. ``/health`` is 503 when no node serves.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from accelmux import __version__
from accelmux.cluster.explain import Attempt, Record, RouteLog
from accelmux.cluster.nodes import NodeLost, NodeTable, NodeTimeout
from accelmux.cluster.requests import job_model, model_of
from accelmux.cluster.secret import KEY_HEADER
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
#: model -> its service's queue deadline (seconds): how long the next node may be tried.
DEADLINES = web.AppKey("cluster_deadlines", dict[str, float])
ROUTES = web.AppKey("cluster_routes", RouteLog)
#: Not forwarded either way: they describe one hop, not the request.
HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)
NODE_HEADER = "X-Accelmux-Node"
#: Checked here by the browser guard, so not sent on: a node's own guard would compare
#: the browser's Origin with the node's address. The cluster's key is the gateway's own.
NOT_SENT = HOP_HEADERS | frozenset({"origin", "sec-fetch-site", KEY_HEADER.lower()})
#: A node's refusals that leave the request untouched and another node may accept.
RETRY_STATUSES = frozenset({413, 429, 503})
RETRY_CODES = frozenset(
    {"queue_full", "deadline_exceeded", "too_large", "load_failed", "shutting_down"}
)
#: Answers up to this size with a Content-Length are read whole and sent in one piece.
WHOLE_MAX = 1024**2
#: The deadline assumed for a model the config does not name.
DEFAULT_DEADLINE_S = 30.0


def request_headers(request: web.Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in NOT_SENT]


def answer_headers(response: web.StreamResponse, upstream: Any, node: str) -> None:
    for key, value in upstream.items():
        if key.lower() not in HOP_HEADERS:
            response.headers.add(key, value)
    response.headers[NODE_HEADER] = node


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
            f"hosts it (it may run on {where}; start accelmux node there)",
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
    if choice.reason is NoRouteReason.NODES_TRIED:
        return ApiError(
            503,
            f"service {choice.service!r} (model {choice.model!r}) is unavailable: every "
            f"live node hosting it ({lost}) was tried and could not take the request",
            type="service_unavailable",
            code="node_unavailable",
            retry_after_s=retry_after_s,
        )
    others = [n for n in (known[1] if known else ()) if n not in choice.lost_nodes]
    also = f"; no live node on {', '.join(repr(n) for n in others)} either" if others else ""
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


@dataclass
class Refused(Exception):
    """A node's refusal another node may not give: kept to relay if none does better."""

    node: str
    status: int
    headers: Any
    body: bytes
    code: str | None

    def response(self) -> web.Response:
        out = web.Response(status=self.status, body=self.body)
        answer_headers(out, self.headers, self.node)
        return out


def error_code(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    err = data.get("error") if isinstance(data, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


async def send(
    request: web.Request,
    node: str,
    service: str | None,
    path: str,
    body: bytes,
    *,
    refusable: bool = False,
    attempt: Attempt | None = None,
) -> web.StreamResponse:
    """Forward ``request`` (with ``body``) to ``path`` on ``node``; relay its answer as
    it comes. ``refusable``: a refusal another node may not give raises :class:`Refused`
    instead of being relayed."""
    table = request.app[TABLE]
    started = time.monotonic()
    took: float | None = None
    table.sent(node, service)
    try:
        upstream = await table.open(node, request.method, path, request_headers(request), body)
        try:
            if attempt is not None:
                attempt.status = upstream.status
                attempt.request_id = upstream.headers.get("X-Request-Id")
            if refusable and upstream.status in RETRY_STATUSES:
                data = await table.read(node, upstream)
                code = error_code(data)
                if attempt is not None:
                    attempt.code = code
                if code in RETRY_CODES:
                    raise Refused(node, upstream.status, upstream.headers, data, code)
                return whole(upstream, node, data)
            length = upstream.headers.get("Content-Length")
            answer: web.StreamResponse
            if length is not None and length.isdigit() and int(length) <= WHOLE_MAX:
                answer = whole(upstream, node, await table.read(node, upstream))
            else:
                answer = await relay_stream(request, node, upstream)
            if upstream.status < 300:
                took = time.monotonic() - started
            return answer
        finally:
            table.done(node, upstream)
    finally:
        table.answered(node, service, took)


def whole(upstream: Any, node: str, data: bytes) -> web.Response:
    response = web.Response(status=upstream.status, body=data)
    answer_headers(response, upstream.headers, node)
    return response


async def relay_stream(request: web.Request, node: str, upstream: Any) -> web.StreamResponse:
    """``upstream``'s answer, relayed piece by piece as the node sends it."""
    table = request.app[TABLE]
    response = web.StreamResponse(status=upstream.status)
    answer_headers(response, upstream.headers, node)
    await response.prepare(request)
    try:
        while True:
            piece = await table.chunk(node, upstream)
            if not piece:
                break
            await response.write(piece)
    except (NodeLost, NodeTimeout) as exc:
        # The status line is gone: end the stream with the error, in the stream's shape.
        event = json.dumps(lost_error(exc).body()).encode()
        sse = response.headers.get("Content-Type", "").startswith("text/event-stream")
        await response.write(b"data: " + event + b"\n\n" if sse else event + b"\n")
    await response.write_eof()
    return response


async def routed(request: web.Request) -> web.StreamResponse:
    """An inference request: to the node that can serve its model soonest."""
    body = await request.read()
    model = model_of(request.headers.get("Content-Type", ""), body)
    if model is None:
        raise ApiError(400, "the request names no model", param="model", code="missing_model")
    return await to_model(request, model, request.path_qs, body)


async def to_model(
    request: web.Request, model: str, path: str, body: bytes, *, durable: bool = False
) -> web.StreamResponse:
    """Send the request to the best node for ``model``; on a refusal another node may not
    give (or a node that could not be reached), the next best, within the deadline.
    ``durable``: a node lost after it got the request may still run it (a job): not
    sent elsewhere then."""
    table = request.app[TABLE]
    log = request.app[ROUTES]
    record = log.start(model, table.index(), table.pending())
    deadline = time.monotonic() + request.app[DEADLINES].get(model, DEFAULT_DEADLINE_S)
    tried: list[str] = []
    refusal: Refused | NodeLost | None = None
    while True:
        choice = route_indexed(table.index(), model, table.pending(), exclude=tried)
        if isinstance(choice, NoRoute):
            return gave_up(request, record, choice, refusal)
        attempt = Attempt(node=choice.node)
        record.attempts.append(attempt)
        started = time.monotonic()
        try:
            answer = await send(
                request, choice.node, choice.service, path, body, refusable=True, attempt=attempt
            )
        except Refused as refused:
            attempt.outcome = "refused"
            refusal = refused
        except NodeLost as exc:
            attempt.outcome = "lost"
            attempt.code = "node_lost"
            if exc.sent and durable:
                raise lost_error(exc) from None
            refusal = refusal if isinstance(refusal, Refused) else exc
        except NodeTimeout as exc:
            attempt.outcome = "timed out"
            raise lost_error(exc) from None
        else:
            attempt.outcome = "answered"
            attempt.took_s = round(time.monotonic() - started, 6)
            log.keep(attempt.request_id or log.own_id(), record)
            return answer
        finally:
            for a in record.attempts:
                if a.request_id:
                    log.keep(a.request_id, record)
        attempt.took_s = round(time.monotonic() - started, 6)
        tried.append(choice.node)
        if time.monotonic() >= deadline:
            return gave_up(request, record, choice, refusal)


def gave_up(
    request: web.Request, record: Record, choice: Any, refusal: Refused | NodeLost | None
) -> web.StreamResponse:
    """The answer when no node took the request: the last node's refusal (as it gave
    it), else the node lost on the way, else why no node could be asked."""
    log = request.app[ROUTES]
    if isinstance(refusal, Refused):
        return refusal.response()
    if isinstance(refusal, NodeLost):
        err = lost_error(refusal)
    elif isinstance(choice, NoRoute):
        err = no_route_error(choice, request.app[TABLE].cfg.retry_after_s, request.app[CONFIGURED])
    else:
        err = ApiError(
            503,
            f"no node could take the request for model {record.model!r} in time",
            type="service_unavailable",
            code="node_unavailable",
            retry_after_s=request.app[TABLE].cfg.retry_after_s,
        )
    rid = log.own_id()
    log.keep(rid, record)
    response = err.response()
    response.headers["X-Request-Id"] = rid
    return response


async def model_entry(request: web.Request) -> web.StreamResponse:
    return await to_model(request, request.match_info["model"], request.path_qs, b"")


# ---- jobs: submitted by model, read back from the node that has them ------------------


async def submit_job(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    model = job_model(request.headers.get("Content-Type", ""), request.query.get("model"), body)
    if model is None:
        raise ApiError(400, "the job names no model", param="model", code="missing_model")
    return await to_model(request, model, request.path_qs, body, durable=True)


async def job_route(request: web.Request) -> web.StreamResponse:
    """``/v1/jobs/ID...``: relayed to the node that holds job ID (asked of every live node,
    with the caller's own key: a node shows a job only to the key that submitted it)."""
    table = request.app[TABLE]
    job = request.match_info["job_id"]
    probe = f"/v1/jobs/{job}"
    headers = request_headers(request)

    async def holds(node: str) -> tuple[str, int]:
        try:
            upstream = await table.open(node, "GET", probe, headers, b"")
        except (NodeLost, NodeTimeout):
            return node, 0
        status = upstream.status
        table.done(node, upstream)
        return node, status

    found = await asyncio.gather(*(holds(n.name) for n in table.alive()))
    owners = [node for node, status in found if status == 200]
    if not owners:
        statuses = {status for _, status in found}
        if 401 in statuses:
            raise ApiError(401, "missing or invalid API key", code="invalid_api_key")
        raise ApiError(404, f"no live node has job {job!r}", param="job_id", code="job_not_found")
    body = await request.read()
    try:
        return await send(request, owners[0], None, request.path_qs, body)
    except (NodeLost, NodeTimeout) as exc:
        raise lost_error(exc) from None


async def list_jobs(request: web.Request) -> web.Response:
    """The first page of every live node's jobs, newest first (pages go on per node:
    ``/admin/nodes/NODE/v1/jobs?after=...``)."""
    items = await _gather(request, request.path_qs)
    jobs = [job for _, answer in items for job in answer.get("data", [])]
    jobs.sort(key=lambda j: (j.get("created_at") or 0, j.get("id") or ""), reverse=True)
    limit = (
        int(request.query.get("limit", "20")) if request.query.get("limit", "").isdigit() else 20
    )
    shown = jobs[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": shown,
            "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None,
            "has_more": len(jobs) > limit or any(a.get("has_more") for _, a in items),
        }
    )


# ---- lists and admin ---------------------------------------------------------------------


async def _gather(request: web.Request, path: str) -> list[tuple[str, dict[str, Any]]]:
    """``GET path`` on every live node: (node, its JSON answer) of those that gave 200."""
    table = request.app[TABLE]
    headers = request_headers(request)

    async def one(node: str) -> tuple[str, dict[str, Any]] | None:
        try:
            upstream = await table.open(node, "GET", path, headers, b"")
            try:
                data = await table.read(node, upstream)
            finally:
                table.done(node, upstream)
        except (NodeLost, NodeTimeout):
            return None
        if upstream.status != 200:
            return None
        try:
            answer = json.loads(data)
        except ValueError:
            return None
        return (node, answer) if isinstance(answer, dict) else None

    answers = await asyncio.gather(*(one(n.name) for n in table.alive()))
    return [a for a in answers if a is not None]


async def _union(request: web.Request, path: str, key: str, ident: str) -> list[Any]:
    """The ``key`` lists of ``GET path`` on every live node, merged by ``ident``."""
    merged: dict[str, Any] = {}
    for _, answer in await _gather(request, path):
        for item in answer.get(key, []):
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
    """200 while every node serves; 200 ``degraded`` naming the nodes down while some
    serve; 503 ``no_nodes`` when none does (a health check sees red)."""
    table = request.app[TABLE]
    alive = sorted(n.name for n in table.alive())
    down = sorted(n for n in table.nodes if n not in alive)
    body: dict[str, Any] = {"nodes": len(table.nodes), "alive": alive, "down": down}
    if not alive:
        message = "no node serves: " + (
            "every node is down" if table.nodes else "no node has registered yet"
        )
        return web.json_response({"status": "no_nodes", "message": message, **body}, status=503)
    return web.json_response({"status": "degraded" if down else "ok", **body})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


async def cluster_status(request: web.Request) -> web.Response:
    table = request.app[TABLE]
    now = table.clock()
    nodes = [table.nodes[n].as_dict(now) for n in sorted(table.nodes)]
    served = [{"model": m, "service": s} for m, s in live_models(table.views())]
    gateway = {"cluster": table.cfg.model_dump()}
    return web.json_response(
        {"time": time.time(), "gateway": gateway, "nodes": nodes, "models": served}
    )


async def explain(request: web.Request) -> web.Response:
    """Why a request went where it did, and (when that node still answers) its own
    Manager's account of it."""
    rid = request.match_info["request_id"]
    record = request.app[ROUTES].get(rid)
    if record is None:
        raise ApiError(
            404, f"no record of request {rid!r}", param="request_id", code="request_not_found"
        )
    out = record.as_dict(rid)
    chosen = next((a for a in record.attempts if a.outcome == "answered"), None)
    if chosen is not None and chosen.request_id:
        out["node_explain"] = await _node_explain(request, chosen.node, chosen.request_id)
    return web.json_response(out)


async def _node_explain(request: web.Request, node: str, rid: str) -> Any:
    table = request.app[TABLE]
    try:
        upstream = await table.open(
            node, "GET", f"/admin/explain/{rid}", request_headers(request), b""
        )
        try:
            data = await table.read(node, upstream)
        finally:
            table.done(node, upstream)
    except (NodeLost, NodeTimeout) as exc:
        return {"unavailable": str(exc)}
    try:
        return json.loads(data) if upstream.status == 200 else {"status": upstream.status}
    except ValueError:
        return None


async def node_passthrough(request: web.Request) -> web.StreamResponse:
    """``/admin/nodes/NODE/PATH``: ``/PATH`` of one node's daemon (admin key guarded),
    relayed as it comes (a decision stream stays open)."""
    node = request.match_info["node"]
    path = "/" + request.match_info["tail"]
    if request.query_string:
        path += "?" + request.query_string
    body = await request.read()
    try:
        return await send(request, node, None, path, body)
    except (NodeLost, NodeTimeout) as exc:
        raise lost_error(exc) from None


def build_cluster_app(
    table: NodeTable,
    server: ServerConfig,
    configured: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
    deadlines: Mapping[str, float] | None = None,
) -> web.Application:
    """The gateway in front of ``table``'s nodes, guarded as ``server`` says;
    ``configured``: the cluster config's models and the nodes that may host them;
    ``deadlines``: each model's queue deadline."""
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
    app[DEADLINES] = dict(deadlines or {})
    app[ROUTES] = RouteLog()
    app.router.add_get("/health", health)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model_entry)
    app.router.add_get("/api/tags", ollama_tags)
    app.router.add_get("/api/ps", ollama_ps)
    app.router.add_get("/api/version", ollama_version)
    app.router.add_post("/v1/jobs", submit_job)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_route("*", "/v1/jobs/{job_id}{tail:(/.*)?}", job_route)
    app.router.add_post("/v1/{tail:.+}", routed)
    app.router.add_post("/api/{tail:.+}", routed)
    app.router.add_get("/admin/cluster", cluster_status)
    app.router.add_get("/admin/explain/{request_id}", explain)
    app.router.add_route("*", "/admin/nodes/{node}/{tail:.*}", node_passthrough)
    return app
