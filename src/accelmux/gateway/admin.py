"""The admin API (``/admin``) and ``/metrics``: separate from inference, own bearer key.

``POST /admin/services/{name}/unload`` on a pinned service (by config or by ``pin``) is
refused with 409 ``service_pinned``: unpin it first. The other operations always apply.
A service that runs on several devices is addressed by its name (``chat``): unload and
unpin reach every replica, load and pin the one that is up (else the first); one replica
can be named too (``chat@gpu1``). The answer lists the replicas and their states.

``GET /admin/explain/{id}`` gives the Manager's lines for a request and, when it was
delayed or refused, the ledger at that moment (each service's bytes by category, foreign,
headroom, and what would have had to be evicted). ``GET /admin/explain`` answers "why is
memory full" for the daemon as it stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from accelmux.core.world import ServiceState
from accelmux.gateway.errors import ApiError
from accelmux.gateway.keys import RUNTIME

ADMIN_OPS = ("load", "unload", "pin", "unpin")
HEARTBEAT_S = 15.0


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[RUNTIME].status())


async def service_op(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    name = request.match_info["name"]
    op = request.match_info["op"]
    if op not in ADMIN_OPS:
        raise ApiError(
            404, f"unknown operation {op!r} (known: {', '.join(ADMIN_OPS)})", code="not_found"
        )
    replicas = rt.replicas(name)
    if not replicas:
        raise ApiError(404, f"unknown service {name!r}", param="name", code="service_not_found")
    if rt.stopping:
        raise ApiError(503, "accelmux is shutting down", code="shutting_down", retry_after_s=30)
    if op == "unload" and any(r.pinned for r in replicas):
        # An unload never lifts a pin behind the operator's back: unpin is its own step.
        raise ApiError(
            409,
            f"service {name!r} is pinned (never evicted); POST /admin/services/{name}/unpin "
            "first, then unload",
            param="name",
            code="service_pinned",
        )
    rt.admin(name, op)
    svc = rt.service_state(name)
    answer: dict[str, Any] = {
        "service": name,
        "op": op,
        "accepted": True,
        "state": svc.status.value,
        "pinned": svc.pinned,
    }
    if svc.spec.group == name:
        answer["replicas"] = [_replica(r) for r in rt.replicas(name)]
    return web.json_response(answer)


def _replica(state: ServiceState) -> dict[str, Any]:
    return {
        "name": state.name,
        "device": state.spec.device,
        "state": state.status.value,
        "pinned": state.pinned,
    }


async def explain(request: web.Request) -> web.Response:
    rid = request.match_info["request_id"]
    rt = request.app[RUNTIME]
    lines = rt.explain(rid)
    ledger = rt.decision_ledger(rid)
    if lines is None and ledger is None:
        raise ApiError(
            404, f"no record of request {rid!r}", param="request_id", code="request_not_found"
        )
    return web.json_response({"request_id": rid, "lines": lines or [], "ledger": ledger})


async def explain_memory(request: web.Request) -> web.Response:
    return web.json_response(request.app[RUNTIME].why_full())


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one ``decision`` event per Manager action, as it happens."""
    rt = request.app[RUNTIME]
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    queue = rt.bus.subscribe()
    try:
        await resp.prepare(request)
        await resp.write(b": accelmux decisions\n\n")
        while True:
            try:
                record = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
            except TimeoutError:
                await resp.write(b": keepalive\n\n")
                continue
            if record is None:
                break
            await resp.write(b"event: decision\ndata: " + json.dumps(record).encode() + b"\n\n")
    except ConnectionError:
        pass
    finally:
        rt.bus.unsubscribe(queue)
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()
    return resp


async def metrics(request: web.Request) -> web.Response:
    body = request.app[RUNTIME].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/status", status)
    app.router.add_post("/admin/services/{name}/{op}", service_op)
    app.router.add_get("/admin/explain", explain_memory)
    app.router.add_get("/admin/explain/{request_id}", explain)
    app.router.add_get("/admin/events", events)
    app.router.add_get("/metrics", metrics)
