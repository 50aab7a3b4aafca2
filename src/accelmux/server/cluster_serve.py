"""The cluster gateway's main coroutine (``accelmux serve --cluster ADDRESS``).

It serves one HTTP front (:mod:`accelmux.cluster.gateway`) with the single machine's
guards (it refuses a non-loopback host without API keys unless told otherwise), polls
the nodes' daemons directly, and keeps a link to Ray in a process of its own
(:mod:`accelmux.cluster.registry`, ``watch``) that reports where the nodes are. Ray never
runs in the gateway's process: when the Ray cluster goes away (its head lost), the link
ends and is started again until Ray answers, while the gateway goes on serving the nodes
it knows. Ray's own output goes to the link's log file in ``server.data_dir/gateway``;
the gateway logs one line per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from accelmux.cluster.gateway import build_cluster_app
from accelmux.cluster.nodes import NodeTable
from accelmux.cluster.secret import listener_key, require_token
from accelmux.config.cluster import ClusterConfig
from accelmux.config.machine import prepare_data_dir
from accelmux.config.server import ServerConfig
from accelmux.gateway.connections import ConnectionGuard, ConnectionLimits, GuardedTCPSite
from accelmux.gateway.middleware import ProtocolLogger
from accelmux.server.kept import Kept
from accelmux.server.serve import refuse_open_host

log = logging.getLogger("accelmux.cluster")
#: How long the gateway's first line waits for Ray's list of nodes (it serves meanwhile).
FIRST_LIST_S = 30.0


class RayWatch:
    """The gateway's link to Ray, kept running; what it reports goes to the table."""

    def __init__(self, table: NodeTable, address: str, logs: Path) -> None:
        self.table = table
        self.address = address
        self.joined = False
        self.trouble: str | None = None
        #: Set at the first list of nodes (or the first failure to get one).
        self.first = asyncio.Event()
        argv = [
            sys.executable,
            "-m",
            "accelmux.cluster.registry",
            "watch",
            "--cluster",
            address,
            "--interval",
            str(table.cfg.snapshot_interval_s),
        ]
        self.kept = Kept(
            "ray link",
            argv,
            log_path=logs / "ray-link.log",
            on_report=self.report,
            on_exit=self.exited,
            max_backoff_s=5.0,
        )

    def report(self, report: dict[str, Any]) -> None:
        event = report.get("event")
        if event == "joined":
            again = " again" if self.trouble is not None else ""
            self.trouble = None
            self.joined = True
            log.info("joined the Ray cluster at %s%s", self.address, again)
        elif event == "nodes":
            self.table.registry_up = True
            self.table.set_entries(report.get("nodes", {}))
            self.first.set()
        elif event == "error":
            self.first.set()
            self.table.registry_up = False
            message = str(report.get("message", "the Ray link failed"))
            if message != self.trouble:
                self.trouble = message
                log.warning("%s; serving the nodes already known; joining again", message)
            self.joined = False

    def exited(self, code: int, ran: float) -> None:
        self.first.set()
        self.table.registry_up = False
        if self.joined:
            self.joined = False
            self.trouble = "lost the Ray cluster"
            log.warning(
                "lost the Ray cluster at %s; serving the nodes already known; joining again",
                self.address,
            )


async def serve_cluster(
    server: ServerConfig,
    cluster: ClusterConfig,
    *,
    address: str,
    configured: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
    deadlines: Mapping[str, float] | None = None,
    stop: asyncio.Event | None = None,
    signals: bool = True,
) -> None:
    """Run the gateway until ``stop`` is set or (with ``signals``) SIGTERM/SIGINT;
    ``configured``: the cluster config's models and where they may run (named in the
    503 of a model no live node hosts); ``deadlines``: each model's queue deadline."""
    refuse_open_host(server)
    key = listener_key(require_token())
    state = Path(server.data_dir) / "gateway"
    why = prepare_data_dir(state)
    if why is not None:
        raise SystemExit(f"accelmux: cannot use server.data_dir {state.absolute()}: {why}")
    table = NodeTable(cluster, key, state_file=state / "nodes.json")
    table.load()
    await table.refresh()
    app = build_cluster_app(table, server, configured, deadlines)
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
        await table.close()
        raise SystemExit(f"accelmux: cannot listen on {server.host}:{server.port}: {exc}") from None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
    for sig in handled:
        loop.add_signal_handler(sig, stop.set)
    watch = RayWatch(table, address, state)
    tasks = [asyncio.create_task(table.run(stop)), asyncio.create_task(watch.kept.run())]
    with contextlib.suppress(TimeoutError):  # serving meanwhile; the line waits for Ray
        await asyncio.wait_for(watch.first.wait(), FIRST_LIST_S)
        await table.refresh()
    nodes = ", ".join(sorted(n.name for n in table.alive())) or "none yet"
    print(
        f"accelmux cluster gateway listening on http://{server.host}:{server.port} "
        f"(nodes: {nodes})",
        file=sys.stdout,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await watch.kept.stop()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runner.cleanup()
        await table.close()
        for sig in handled:
            loop.remove_signal_handler(sig)
        print("accelmux cluster gateway stopped", file=sys.stdout, flush=True)
