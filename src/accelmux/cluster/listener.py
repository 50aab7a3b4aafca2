"""A node daemon's side of the direct path: its LAN listener and its snapshot.

A node's daemon listens twice on ``cluster.node_port``: on 127.0.0.1, as any daemon
(``accelmux status``, ``top`` and the dashboard on that machine), and on the machine's
LAN address, for the cluster's gateways. Every request that arrives on any address but
loopback must carry the cluster's key (:func:`accelmux.cluster.secret.listener_key`, in
``X-Accelmux-Cluster-Key``): anyone else is refused with 401 before any other work.
Behind that, the daemon's own guards apply as on one machine (its API keys, request
limits), so a gateway forwards a request's ``Authorization`` untouched.

``GET /cluster/snapshot`` is the node's snapshot (:func:`.snapshots.node_snapshot`), what
the gateways poll.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from accelmux.cluster.secret import KEY_HEADER, key_matches
from accelmux.cluster.snapshots import node_snapshot
from accelmux.config.schema import AccelmuxConfig
from accelmux.gateway.errors import ApiError
from accelmux.gateway.keys import RUNTIME

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SNAPSHOT_PATH = "/cluster/snapshot"


@dataclass(frozen=True)
class NodeListener:
    """Where node ``node`` listens for the gateways, and the key it asks of them."""

    node: str
    address: str
    port: int
    key: str
    cluster_cfg: AccelmuxConfig

    def mount(self, app: web.Application) -> None:
        """The key check in front of everything, and the snapshot route."""
        app.middlewares.insert(0, key_middleware(self.key))
        cfg = self.cluster_cfg
        node = self.node

        async def snapshot(request: web.Request) -> web.Response:
            manager = request.app[RUNTIME].manager.snapshot().as_dict()
            return web.json_response(node_snapshot(node, manager, cfg))

        app.router.add_get(SNAPSHOT_PATH, snapshot)


def _on_loopback(request: web.Request) -> bool:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not sockname:
        return False
    try:
        return ipaddress.ip_address(sockname[0]).is_loopback
    except ValueError:
        return False


def key_middleware(key: str) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _on_loopback(request) and not key_matches(request.headers.get(KEY_HEADER), key):
            return ApiError(
                401,
                "this address of an accelmux node serves the cluster's gateways only: "
                "missing or invalid cluster key",
                type="authentication_error",
                code="cluster_key_required",
            ).response()
        return await handler(request)

    return middleware
