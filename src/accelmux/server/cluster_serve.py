"""The cluster gateway's main coroutine (``accelmux serve --cluster ADDRESS``).

It joins the Ray cluster as a client, finds the node agents, polls their snapshots and
serves one HTTP front (:mod:`accelmux.cluster.gateway`) with the single machine's guards:
it refuses a non-loopback host without API keys unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from accelmux.cluster.gateway import build_cluster_app
from accelmux.cluster.nodes import NodeTable
from accelmux.config.cluster import ClusterConfig
from accelmux.config.server import ServerConfig
from accelmux.gateway.connections import ConnectionGuard, ConnectionLimits, GuardedTCPSite
from accelmux.gateway.middleware import ProtocolLogger
from accelmux.server.serve import refuse_open_host


async def serve_cluster(
    ray: Any,
    server: ServerConfig,
    cluster: ClusterConfig,
    *,
    configured: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
    stop: asyncio.Event | None = None,
    signals: bool = True,
) -> None:
    """Run the gateway until ``stop`` is set or (with ``signals``) SIGTERM/SIGINT;
    ``configured``: the cluster config's models and where they may run (named in the
    503 of a model no live node hosts)."""
    refuse_open_host(server)
    table = NodeTable(ray, cluster)
    await table.refresh()
    app = build_cluster_app(table, server, configured)
    access = logging.getLogger("aiohttp.access") if server.access_log else None
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=access,
        logger=ProtocolLogger(),
        keepalive_timeout=server.keepalive_timeout_s,
        lingering_time=0,  # refused bodies are read by drain_middleware, at its pace
    )
    await runner.setup()
    guard = ConnectionGuard(ConnectionLimits.of(server))
    site = GuardedTCPSite(runner, server.host, server.port, guard=guard, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"accelmux: cannot listen on {server.host}:{server.port}: {exc}") from None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
    for sig in handled:
        loop.add_signal_handler(sig, stop.set)
    poller = asyncio.create_task(table.run(stop))
    nodes = ", ".join(sorted(table.nodes)) or "none yet"
    print(
        f"accelmux cluster gateway listening on http://{server.host}:{server.port} "
        f"(nodes: {nodes})",
        file=sys.stdout,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await runner.cleanup()
        for sig in handled:
            loop.remove_signal_handler(sig)
        print("accelmux cluster gateway stopped", file=sys.stdout, flush=True)
