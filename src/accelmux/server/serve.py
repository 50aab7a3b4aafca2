"""The daemon's main coroutine: start, listen, wait for SIGTERM/SIGINT, stop cleanly."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from accelmux.cluster.listener import NodeListener
from accelmux.config.hosts import is_loopback
from accelmux.config.machine import host_memory_problems, prepare_data_dir, tighten_data_dir
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.server import ServerConfig
from accelmux.config.wyoming import open_network_problem
from accelmux.gateway.app import build_app, priority_paths
from accelmux.gateway.connections import (
    ConnectionGuard,
    ConnectionLimits,
    GuardedTCPSite,
    raise_open_files_limit,
)
from accelmux.gateway.door import DOOR
from accelmux.gateway.hot import HotPath, front_protocol
from accelmux.gateway.middleware import ProtocolLogger
from accelmux.gateway.wyoming_api import WyomingServer
from accelmux.monitors.host import host_total
from accelmux.runtime.daemon import Runtime
from accelmux.server.upgrade import DataDirError, upgrade_data_dir
from accelmux.server.wiring import mount_cameras, mount_dashboard, mount_history, mount_jobs
from accelmux.service.notify import Notifier, keep_alive

log = logging.getLogger("accelmux")


def refuse_open_host(server: ServerConfig) -> None:
    """Exit unless /v1 is guarded: API keys, a loopback host, or an explicit opt-out."""
    if is_loopback(server.host) or server.api_keys or server.allow_unauthenticated:
        return
    raise SystemExit(
        f"accelmux: refusing to listen on {server.host or 'every address'} without API keys: "
        "/v1 would be open to the network. Set server.api_keys, listen on 127.0.0.1, or "
        "accept it with server.allow_unauthenticated: true (serve --allow-open)"
    )


def log_tightened(data_dir: Path) -> None:
    """Make what is under ``data_dir`` owner-only, and say what was not."""
    changed, problems = tighten_data_dir(data_dir)
    if changed:
        shown = ", ".join(changed[:20]) + (f" and {len(changed) - 20} more" if changed[20:] else "")
        log.warning(
            "data_dir %s: tightened %d path(s) that group or others could read to owner-only "
            "(files 0600, directories 0700): %s",
            data_dir.absolute(),
            len(changed),
            shown,
        )
    for problem in problems:
        log.warning("data_dir: cannot make owner-only: %s", problem)


def check_open_files(server: ServerConfig) -> None:
    """Raise the open-files limit for every HTTP connection (the reserve is part of
    ``server.max_connections``), every Wyoming connection, and 256 more for backends,
    logs and SQLite, so that a full HTTP door never takes the Wyoming server's sockets."""
    wyoming = server.wyoming.max_connections if server.wyoming is not None else 0
    wanted = server.max_connections + wyoming + 256
    if raise_open_files_limit(wanted) < wanted:
        log.warning(
            "the open-files limit (ulimit -n) is below server.max_connections + "
            "server.wyoming.max_connections + 256; connections beyond it wait in the "
            "listen queue"
        )


def refuse_open_wyoming(server: ServerConfig) -> None:
    """Exit when the Wyoming server (no authentication) would listen off loopback
    without ``server.wyoming.allow_network`` (or ``allow_unauthenticated``)."""
    wy = server.wyoming
    if wy is None:
        return
    why = open_network_problem(wy, allow_unauthenticated=server.allow_unauthenticated)
    if why is not None:
        raise SystemExit(f"accelmux: refusing to start: {why}")


async def serve(
    cfg: AccelmuxConfig,
    *,
    stop: asyncio.Event | None = None,
    signals: bool = True,
    listener: NodeListener | None = None,
) -> None:
    """Run until ``stop`` is set or (with ``signals``) a SIGTERM/SIGINT arrives.

    A cluster node's daemon (:mod:`.node_daemon`) gives ``listener``: it listens on its
    LAN address too, for the cluster's gateways, which must bring the cluster's key.

    It refuses to start (one line, exit status 1) on a non-loopback host without API keys
    unless ``server.allow_unauthenticated``, when ``server.data_dir`` cannot be created or
    written, and when it holds data of a newer accelmux. Data of an older schema is
    backed up and migrated first (:mod:`.upgrade`), and each migration is logged. A host
    device's budget above the RAM is logged (it is clamped), and so is each old spelling
    the config used (``cfg.deprecations``).

    Under a ``Type=notify`` systemd unit (``NOTIFY_SOCKET``; with ``signals`` only: a node
    agent is not a unit) it notifies ``READY=1`` once listening, pings the watchdog while
    :meth:`Runtime.health_problem` finds none, and notifies ``STOPPING=1`` when stopping
    (:mod:`accelmux.service.notify`).

    Shutdown: the Manager stops admitting (waiting requests get 503 shutting_down),
    in-flight requests get ``server.drain_s`` to finish, the rest fail with a clear
    error, every backend is unloaded (child processes stopped), then the listener closes.
    """
    notifier = Notifier.from_environment() if signals else None  # before any child starts
    server = cfg.server
    data_dir = Path(server.data_dir)
    refuse_open_host(server)
    refuse_open_wyoming(server)
    why = prepare_data_dir(data_dir)
    if why is not None:
        raise SystemExit(f"accelmux: cannot use server.data_dir {data_dir.absolute()}: {why}")
    log_tightened(data_dir)
    try:
        upgraded = upgrade_data_dir(data_dir)
    except DataDirError as exc:
        raise SystemExit(f"accelmux: cannot use server.data_dir: {exc}") from None
    for notice in upgraded:
        log.warning("%s", notice)
    for problem in host_memory_problems(cfg, host_total()):
        log.warning("%s", problem)
    for notice in cfg.deprecations:
        log.warning("config: %s", notice)
    runtime = Runtime(cfg, data_dir=data_dir)
    app = build_app(runtime)
    if listener is not None:
        listener.mount(app)
    jobs = mount_jobs(app, runtime, data_dir) if server.jobs else None
    if server.dashboard:
        mount_dashboard(app, runtime, data_dir)
    cameras = mount_cameras(app, runtime, data_dir)
    history = mount_history(runtime, data_dir)
    await runtime.start()
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
    check_open_files(server)
    guard = ConnectionGuard(ConnectionLimits.of(server), priority=priority_paths(runtime))
    hot = HotPath.of(runtime, app[DOOR])
    if hot is not None:
        guard.front = functools.partial(front_protocol, hot=hot)
    site = GuardedTCPSite(runner, server.host, server.port, guard=guard, reuse_address=True)

    async def give_up(message: str) -> NoReturn:
        """Stop what was started, then exit with ``message`` (a port already taken)."""
        if jobs is not None:
            await jobs.stop()
        if cameras is not None:
            cameras.store.close()
        await runtime.shutdown()
        if history is not None:
            history.close()
        await runner.cleanup()
        raise SystemExit(message) from None

    sites = [(site, server.host, server.port)]
    if listener is not None:
        # A guard of its own, without the hot path: every request on the LAN goes through
        # aiohttp's middlewares, the cluster's key check first.
        lan_guard = ConnectionGuard(ConnectionLimits.of(server), priority=priority_paths(runtime))
        lan = GuardedTCPSite(
            runner, listener.address, listener.port, guard=lan_guard, reuse_address=True
        )
        sites.append((lan, listener.address, listener.port))
    for each, host, port in sites:
        try:
            await each.start()
        except OSError as exc:
            await give_up(f"accelmux: cannot listen on {host}:{port}: {exc}")
    wy_cfg = server.wyoming
    wyoming = WyomingServer(runtime, wy_cfg) if wy_cfg is not None else None
    if wyoming is not None and wy_cfg is not None:
        try:
            await wyoming.start()
        except OSError as exc:
            await give_up(
                f"accelmux: cannot listen for Wyoming on {wy_cfg.host}:{wy_cfg.port}: {exc}"
            )
    if jobs is not None:
        await jobs.start()
    if cameras is not None:
        await cameras.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
    for sig in handled:
        loop.add_signal_handler(sig, stop.set)
    services = ", ".join(cfg.services) or "none"
    print(
        f"accelmux listening on http://{server.host}:{server.port} (services: {services})",
        file=sys.stdout,
        flush=True,
    )
    if wy_cfg is not None:
        print(
            f"accelmux Wyoming server on tcp://{wy_cfg.host}:{wy_cfg.port}",
            file=sys.stdout,
            flush=True,
        )
    watchdog = None
    if notifier is not None:
        notifier.ready(f"serving on http://{server.host}:{server.port} (services: {services})")
        watchdog = asyncio.create_task(keep_alive(notifier, runtime.health_problem))
    try:
        await stop.wait()
    finally:
        # A second signal while stopping must not kill the daemon before its children
        # are stopped: the handlers stay installed (setting an already set event).
        log.info("shutting down")
        if notifier is not None:
            notifier.stopping()
        if watchdog is not None:
            watchdog.cancel()
        try:
            if wyoming is not None:
                await wyoming.stop()
            if cameras is not None:
                await cameras.stop()
            if jobs is not None:
                await jobs.stop()  # batches in flight are given back, untried
            await runtime.shutdown()
            if history is not None:
                history.close()
            await runner.cleanup()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
        print("accelmux stopped", file=sys.stdout, flush=True)
