"""The cluster gateway's table of nodes: found through Ray, watched and called directly.

Ray tells the gateway which nodes exist and where their daemons listen (the registry
link, :mod:`.registry`, reports every change: :meth:`NodeTable.set_entries`). From then
on the gateway talks to each node's daemon itself, over HTTP on the LAN with the
cluster's key (:mod:`.listener`): every ``snapshot_interval_s`` it asks each node for its
snapshot, all at once, each bounded by ``snapshot_timeout_s``, and every request goes
straight to the chosen node's daemon. Neither depends on Ray staying up: with the Ray
head lost, the gateway keeps polling and serving the nodes it knows (and it keeps them
in a file, so a gateway started while Ray is down knows them too).

A node that refuses the connection, errs or does not answer in time is marked down: the
router stops choosing it, its last snapshot is kept (so a request for a service only it
hosted is told which node was lost), and every request in flight there fails at once
(:class:`NodeLost`), never waiting on a dead node. A node that answers again is up again.
A node is down within ``snapshot_interval_s + snapshot_timeout_s`` of its end (at once
when its machine refuses connections: a killed process's port).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from accelmux.cluster.listener import SNAPSHOT_PATH
from accelmux.cluster.secret import KEY_HEADER
from accelmux.cluster.snapshots import view_of
from accelmux.config.cluster import ClusterConfig
from accelmux.core.routing import NodeView, RouteIndex, build_index

log = logging.getLogger("accelmux.cluster")
#: Weight of the newest sample in a service's time per request (exponential average).
SERVICE_S_WEIGHT = 0.2
#: How long a node must be down and unregistered (Ray answering) to be forgotten.
FORGET_S = 600.0
#: The cancel message of a request whose node was marked down.
_LOST = "accelmux: node lost"


class NodeLost(Exception):
    """The node serving a call went down (it refused, broke the connection or stopped
    answering); ``sent``: whether the request may have reached it."""

    def __init__(self, node: str, why: str, *, sent: bool = True) -> None:
        super().__init__(f"node {node!r} was lost: {why}")
        self.node = node
        self.why = why
        self.sent = sent


class NodeTimeout(Exception):
    """A forwarded call took longer than the request timeout."""

    def __init__(self, node: str, timeout_s: float) -> None:
        super().__init__(f"node {node!r} did not answer within {timeout_s:g} s")
        self.node = node
        self.timeout_s = timeout_s


@dataclass
class Node:
    """One node as the gateway knows it."""

    name: str
    address: str | None = None
    port: int | None = None
    ray_node_id: str | None = None
    #: Listed by Ray's registry now (False: its entry is gone; the node may still serve).
    registered: bool = False
    alive: bool = False
    snapshot: dict[str, Any] | None = None
    error: str | None = "not polled yet"
    updated_at: float = 0.0
    down_since: float | None = None
    #: Resolved when the node is marked down; a new one while it is up.
    lost: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    #: The view last built, with what it was built from.
    _view: tuple[dict[str, Any], bool, tuple[tuple[str, float], ...], NodeView] | None = None

    @property
    def base(self) -> str:
        host = f"[{self.address}]" if self.address and ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def view(self, service_s: Mapping[str, float]) -> NodeView | None:
        if self.snapshot is None:
            return None
        times = tuple(sorted((k, round(v, 3)) for k, v in service_s.items()))
        cached = self._view
        if (
            cached is not None
            and cached[0] is self.snapshot
            and cached[1] == self.alive
            and cached[2] == times
        ):
            return cached[3]
        view = view_of(self.snapshot, alive=self.alive, service_s=dict(times))
        self._view = (self.snapshot, self.alive, times, view)
        return view

    def as_dict(self, now: float) -> dict[str, Any]:
        snap = self.snapshot or {}
        return {
            "node": self.name,
            "alive": self.alive,
            "error": self.error,
            "address": self.address,
            "port": self.port,
            "registered": self.registered,
            "ray_node_id": self.ray_node_id,
            "snapshot_age_s": round(now - self.updated_at, 3) if self.updated_at else None,
            "down_for_s": round(now - self.down_since, 3) if self.down_since else None,
            "devices": snap.get("devices", {}),
            "services": snap.get("services", []),
        }


class NodeTable:
    def __init__(
        self,
        cfg: ClusterConfig,
        key: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        state_file: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.key = key
        self.clock = clock
        self.state_file = state_file
        self.nodes: dict[str, Node] = {}
        #: The gateway's own requests in flight, by (node, service): fresher than the
        #: snapshots, read by every routing decision.
        self._pending: Counter[tuple[str, str]] = Counter()
        #: Each (node, service)'s measured time per request (exponential average).
        self.service_s: dict[tuple[str, str], float] = {}
        self._views: list[NodeView] = []
        self._index = build_index(())
        self._session: aiohttp.ClientSession | None = None
        #: Answers being read, per node: closed when their node is marked down.
        self._open: dict[str, set[aiohttp.ClientResponse]] = {}
        #: Requests waiting for a node's answer: cancelled when it is marked down.
        self._waiting: dict[str, set[asyncio.Task[Any]]] = {}
        self._timeout = aiohttp.ClientTimeout(
            total=cfg.request_timeout_s, sock_connect=cfg.snapshot_timeout_s
        )
        self.changed = asyncio.Event()
        #: Whether Ray's registry answers now (set by the gateway's link to Ray): only
        #: then does a node missing from it mean anything.
        self.registry_up = False

    # ---- the HTTP client ---------------------------------------------------------------
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,
                # Below the nodes' own keep-alive (server.keepalive_timeout_s, 60 s by
                # default): the gateway never reuses a connection a node is closing.
                keepalive_timeout=30,
                ttl_dns_cache=None,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                headers={KEY_HEADER: self.key},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- what the router reads -------------------------------------------------------
    def views(self) -> list[NodeView]:
        return self._views

    def index(self) -> RouteIndex:
        return self._index

    def pending(self) -> Mapping[tuple[str, str], int]:
        return self._pending

    def sent(self, node: str, service: str | None) -> None:
        if service is not None:
            self._pending[node, service] += 1

    def answered(self, node: str, service: str | None, took_s: float | None = None) -> None:
        if service is None:
            return
        key = (node, service)
        self._pending[key] -= 1
        if self._pending[key] <= 0:
            del self._pending[key]
        if took_s is not None:
            old = self.service_s.get(key)
            self.service_s[key] = took_s if old is None else old + SERVICE_S_WEIGHT * (took_s - old)

    def alive(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.alive]

    def _rebuild_views(self) -> None:
        """Views and index again, unless no node's view changed (then both are kept)."""
        fresh = []
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            times = {s: v for (n, s), v in self.service_s.items() if n == node.name}
            view = node.view(times)
            if view is not None:
                fresh.append(view)
        same = len(fresh) == len(self._views) and all(
            a is b for a, b in zip(fresh, self._views, strict=True)
        )
        if not same:
            self._views = fresh
            self._index = build_index(fresh)

    # ---- where the nodes are -----------------------------------------------------------
    def set_entries(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        """The nodes Ray's registry lists now (node -> its entry: address, port...). A
        node no longer listed keeps its address: it may still serve (Ray may be down)."""
        for name, node in self.nodes.items():
            node.registered = name in entries
        for name, entry in entries.items():
            node = self.nodes.get(name) or self.nodes.setdefault(name, Node(name=name))
            where = (str(entry["address"]), int(entry["port"]))
            if (node.address, node.port) != where:
                log.info("node %s registered at %s:%s", name, *where)
            node.address = str(entry["address"])
            node.port = int(entry["port"])
            node.ray_node_id = entry.get("ray_node_id")
            node.registered = True
        self.save()
        self.changed.set()

    def save(self) -> None:
        if self.state_file is None:
            return
        known = {
            n.name: {"address": n.address, "port": n.port, "ray_node_id": n.ray_node_id}
            for n in self.nodes.values()
            if n.address is not None
        }
        tmp = self.state_file.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
            os.replace(tmp, self.state_file)

    def load(self) -> None:
        """The nodes a previous run knew (they are polled before Ray answers)."""
        if self.state_file is None:
            return
        try:
            known = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(known, dict):
            return
        for name, entry in known.items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                node = self.nodes.get(name) or self.nodes.setdefault(name, Node(name=name))
                node.address, node.port = str(entry["address"]), int(entry["port"])
                node.ray_node_id = entry.get("ray_node_id")

    # ---- polling -----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``snapshot_interval_s`` until ``stop`` is set (at once when the
        registry reports a change)."""
        while not stop.is_set():
            started = self.clock()
            try:
                await self.refresh()
            except Exception:  # a poll that failed is retried at the next tick
                log.exception("refreshing the cluster's nodes failed")
            wait = max(0.0, self.cfg.snapshot_interval_s - (self.clock() - started))
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(stop.wait(), self.changed.wait()), wait)

    async def refresh(self) -> None:
        """Ask every node with an address for its snapshot; mark each up or down; forget
        the nodes that are gone for good."""
        polled = [node for node in self.nodes.values() if node.address is not None]
        await asyncio.gather(*(self._poll(node) for node in polled))
        self._forget_retired()
        self._rebuild_views()

    def _forget_retired(self) -> None:
        """A node down for ``FORGET_S`` and missing from Ray's registry while the
        registry answers is forgotten (a machine retired, or renamed): it no longer
        counts in ``/health``. Should it come back, it registers again."""
        if not self.registry_up:
            return
        now = self.clock()
        gone = [
            n.name
            for n in self.nodes.values()
            if not n.registered and n.down_since is not None and now - n.down_since > FORGET_S
        ]
        for name in gone:
            log.info("node %s forgotten: down and unregistered for %g s", name, FORGET_S)
            del self.nodes[name]
        if gone:
            self.save()

    async def _poll(self, node: Node) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.snapshot_timeout_s)
        try:
            async with self.session().get(node.base + SNAPSHOT_PATH, timeout=timeout) as resp:
                if resp.status != 200:
                    why = f"its snapshot answered HTTP {resp.status}"
                    self.mark_down(node, why, rebuild=False)
                    return
                snap = await resp.json()
        except TimeoutError:
            why = f"no snapshot within {self.cfg.snapshot_timeout_s:g} s"
            self.mark_down(node, why, rebuild=False)
            return
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            self.mark_down(node, connection_problem(exc), rebuild=False)
            return
        if snap != node.snapshot:  # an unchanged one keeps its cached view
            node.snapshot = snap
        node.updated_at = self.clock()
        if not node.alive:
            log.info("node %s is up (%s:%s)", node.name, node.address, node.port)
            if node.lost.done():
                node.lost = asyncio.get_running_loop().create_future()
        node.alive = True
        node.error = None
        node.down_since = None

    def mark_down(self, node: Node, why: str, *, rebuild: bool = True) -> None:
        """Stop routing to ``node`` and fail its requests in flight (:class:`NodeLost`);
        ``rebuild`` off: the caller rebuilds the views (a poll, once for all nodes)."""
        if node.alive or node.error != why:
            log.warning("node %s is down: %s", node.name, why)
        if node.down_since is None:
            node.down_since = self.clock()
        node.alive = False
        node.error = why
        if not node.lost.done():
            node.lost.set_result(why)
        for resp in self._open.pop(node.name, set()):
            resp.close()
        for task in self._waiting.pop(node.name, set()):
            task.cancel(_LOST)
        if rebuild:
            self._rebuild_views()

    # ---- forwarding ------------------------------------------------------------------
    def node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None or not node.alive or node.address is None:
            why = (node.error if node is not None else None) or "unknown node"
            raise NodeLost(name, why, sent=False)
        return node

    async def open(
        self,
        name: str,
        method: str,
        path: str,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes,
    ) -> aiohttp.ClientResponse:
        """Send a request to node ``name``'s daemon; its answer, headers read, body not
        yet (read it, then :meth:`done`). Bounded by the request timeout and by the
        node staying up (:meth:`mark_down` cancels the wait); a node that refused the
        connection raises :class:`NodeLost` with ``sent`` false (the request never
        reached it: safe to send elsewhere)."""
        node = self.node(name)
        task = asyncio.current_task()
        waiting = self._waiting.setdefault(name, set())
        if task is not None:
            waiting.add(task)
        try:
            resp = await self.session().request(
                method, node.base + path, headers=headers, data=body, timeout=self._timeout
            )
        except asyncio.CancelledError as exc:
            if task is None or not exc.args or exc.args[0] != _LOST:
                raise
            task.uncancel()
            raise NodeLost(name, node.lost.result() if node.lost.done() else "down") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            waiting.discard(task)  # before _failed marks the node down (it cancels these)
            raise self._failed(node, exc) from None
        finally:
            if task is not None:
                waiting.discard(task)
        self._open.setdefault(name, set()).add(resp)
        return resp

    def _failed(self, node: Node, exc: BaseException) -> NodeLost | NodeTimeout:
        """What a request that could not get its answer from ``node`` raises."""
        if isinstance(exc, TimeoutError):
            return NodeTimeout(node.name, self.cfg.request_timeout_s)
        why = connection_problem(exc)
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            # A kept-alive connection the node had closed, or the node died reading it.
            return NodeLost(node.name, why, sent=True)
        self.mark_down(node, why)
        # never connected: nothing was sent, safe to send elsewhere
        return NodeLost(node.name, why, sent=not isinstance(exc, aiohttp.ClientConnectorError))

    def done(self, name: str, resp: aiohttp.ClientResponse) -> None:
        resp.release()
        opened = self._open.get(name)
        if opened is not None:
            opened.discard(resp)

    async def read(self, name: str, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body of ``resp`` (closed by :meth:`mark_down` if its node is lost)."""
        try:
            return await resp.read()
        except TimeoutError:
            raise NodeTimeout(name, self.cfg.request_timeout_s) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise NodeLost(name, self._why(name, exc)) from None

    async def chunk(self, name: str, resp: aiohttp.ClientResponse) -> bytes:
        """The next piece of ``resp``'s body as it comes (b"" at its end)."""
        try:
            return await resp.content.readany()
        except TimeoutError:
            raise NodeTimeout(name, self.cfg.request_timeout_s) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise NodeLost(name, self._why(name, exc)) from None

    def _why(self, name: str, exc: BaseException) -> str:
        node = self.nodes.get(name)
        if node is not None and node.lost.done():
            return node.lost.result()
        return connection_problem(exc)


async def _first(*waits: Awaitable[Any]) -> None:
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def connection_problem(exc: BaseException) -> str:
    """What went wrong with a connection to a node, in a few plain words."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return f"connection failed ({reason})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "it closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "its answer was cut off"
    if isinstance(exc, ValueError):
        return "its snapshot was not JSON"
    if isinstance(exc, OSError) and exc.strerror:
        return f"connection failed ({exc.strerror})"
    return f"connection failed ({type(exc).__name__})"
