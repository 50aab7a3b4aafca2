"""The cluster gateway's table of node agents: found by name, polled for snapshots.

Every ``snapshot_interval_s`` the table lists the agents registered in Ray's
``accelmux`` namespace and asks each for its snapshot, all at once, each bounded by
``snapshot_timeout_s``. A node whose agent died, left the namespace or did not answer
in time is marked down: the router stops choosing it, its last snapshot is kept (so a
request for a service only it hosted is told which node was lost) and every request in
flight there fails at once with :class:`NodeLost`, never waiting on a dead node. A node
that answers again is up again.

Each forwarded call is bounded twice: by the request timeout, and by its node staying up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from accelmux.cluster.ray_link import agent_name, agent_names
from accelmux.cluster.snapshots import view_of
from accelmux.config.cluster import ClusterConfig
from accelmux.core.routing import NodeView, RouteIndex, build_index

log = logging.getLogger("accelmux.cluster")
T = TypeVar("T")
#: (status, headers, body) of a forwarded call.
Answer = tuple[int, list[tuple[str, str]], bytes]


class NodeLost(Exception):
    """The node serving a call went down (its agent died or stopped answering)."""

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"node {node!r} was lost: {why}")
        self.node = node
        self.why = why


class NodeTimeout(Exception):
    """A forwarded call took longer than the request timeout."""

    def __init__(self, node: str, timeout_s: float) -> None:
        super().__init__(f"node {node!r} did not answer within {timeout_s:g} s")
        self.node = node
        self.timeout_s = timeout_s


@dataclass
class Node:
    """One node agent as the gateway knows it."""

    name: str
    handle: Any = None
    alive: bool = False
    snapshot: dict[str, Any] | None = None
    error: str | None = "not polled yet"
    updated_at: float = 0.0
    #: Resolved when the node is marked down; a new one while it is up.
    lost: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    #: The view of (snapshot, alive) last built: a poll that changed neither reuses it.
    _view: tuple[dict[str, Any], bool, NodeView] | None = None

    def view(self) -> NodeView | None:
        if self.snapshot is None:
            return None
        cached = self._view
        if cached is not None and cached[0] is self.snapshot and cached[1] == self.alive:
            return cached[2]
        view = view_of(self.snapshot, alive=self.alive)
        self._view = (self.snapshot, self.alive, view)
        return view

    def as_dict(self, now: float) -> dict[str, Any]:
        snap = self.snapshot or {}
        return {
            "node": self.name,
            "alive": self.alive,
            "error": self.error,
            "snapshot_age_s": round(now - self.updated_at, 3) if self.updated_at else None,
            "daemon_port": snap.get("port"),
            "ray_node_id": snap.get("ray_node_id"),
            "devices": snap.get("devices", {}),
            "services": snap.get("services", []),
        }


class NodeTable:
    def __init__(
        self, ray: Any, cfg: ClusterConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ray = ray
        self.cfg = cfg
        self.clock = clock
        self.nodes: dict[str, Node] = {}
        #: The gateway's own requests in flight, by (node, service): fresher than the
        #: snapshots, read by every routing decision.
        self._pending: Counter[tuple[str, str]] = Counter()
        self._views: list[NodeView] = []
        self._index = build_index(())
        #: The Ray node this gateway joined through (its own machine).
        self.ray_node_id = str(ray.get_runtime_context().get_node_id())

    # ---- what the router reads -------------------------------------------------------
    def views(self) -> list[NodeView]:
        return self._views

    def index(self) -> RouteIndex:
        return self._index

    def pending(self) -> Mapping[tuple[str, str], int]:
        return self._pending

    def _sent(self, node: str, service: str | None) -> None:
        if service is not None:
            self._pending[node, service] += 1

    def _answered(self, node: str, service: str | None) -> None:
        if service is not None:
            key = (node, service)
            self._pending[key] -= 1
            if self._pending[key] <= 0:
                del self._pending[key]

    def alive(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.alive]

    def _rebuild_views(self) -> None:
        """Views and index again, unless no node's view changed (then both are kept)."""
        views = (node.view() for node in sorted(self.nodes.values(), key=lambda n: n.name))
        fresh = [v for v in views if v is not None]
        same = len(fresh) == len(self._views) and all(
            a is b for a, b in zip(fresh, self._views, strict=True)
        )
        if not same:
            self._views = fresh
            self._index = build_index(fresh)

    # ---- polling -----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``snapshot_interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            started = self.clock()
            try:
                await self.refresh()
            except Exception:  # a poll that failed is retried at the next tick
                log.exception("refreshing the cluster's nodes failed")
            wait = max(0.0, self.cfg.snapshot_interval_s - (self.clock() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def refresh(self) -> None:
        """Find the agents, ask each for its snapshot, mark each node up or down."""
        names = await asyncio.to_thread(agent_names, self.ray)
        for name in names:
            if name not in self.nodes:
                self.nodes[name] = Node(name=name)
        listed = set(names)
        await asyncio.gather(
            *(self._poll(node, node.name in listed) for node in self.nodes.values())
        )
        self._rebuild_views()

    async def _poll(self, node: Node, listed: bool) -> None:
        if not listed:
            node.handle = None
            self.mark_down(node, "its agent is gone from the Ray cluster", rebuild=False)
            return
        try:
            if node.handle is None:
                node.handle = await asyncio.to_thread(self._actor, node.name)
            snap = await asyncio.wait_for(
                _awaited(node.handle.snapshot.remote()), self.cfg.snapshot_timeout_s
            )
        except TimeoutError:
            why = f"no snapshot within {self.cfg.snapshot_timeout_s:g} s"
            self.mark_down(node, why, rebuild=False)
            return
        except Exception as exc:  # the actor died, or Ray lost it
            node.handle = None
            self.mark_down(node, _one_line(exc), rebuild=False)
            return
        if snap != node.snapshot:  # an unchanged one keeps its cached view
            node.snapshot = snap
        node.updated_at = self.clock()
        if not node.alive:
            log.info("node %s is up", node.name)
            if node.lost.done():
                node.lost = asyncio.get_running_loop().create_future()
        node.alive = True
        node.error = None

    def _actor(self, name: str) -> Any:
        return self.ray.get_actor(agent_name(name))

    def mark_down(self, node: Node, why: str, *, rebuild: bool = True) -> None:
        """Stop routing to ``node`` and fail its requests in flight (:class:`NodeLost`);
        ``rebuild`` off: the caller rebuilds the views (a poll, once for all nodes)."""
        if node.alive or node.error != why:
            log.warning("node %s is down: %s", node.name, why)
        node.alive = False
        node.error = why
        if not node.lost.done():
            node.lost.set_result(why)
        if rebuild:
            self._rebuild_views()

    # ---- forwarding ------------------------------------------------------------------
    async def _bounded(self, node: Node, call: Awaitable[T], deadline: float) -> T:
        """``call``'s result, unless the node goes down or ``deadline`` passes first."""
        task = asyncio.ensure_future(call)
        lost = node.lost
        watched: set[asyncio.Future[Any]] = {task, lost}
        try:
            done, _ = await asyncio.wait(
                watched,
                timeout=max(0.0, deadline - self.clock()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:
            task.cancel()
            raise
        if task in done:
            try:
                return task.result()
            except Exception as exc:  # the actor died while serving it
                self.mark_down(node, _one_line(exc))
                raise NodeLost(node.name, _one_line(exc)) from None
        task.cancel()
        if lost in done:
            raise NodeLost(node.name, lost.result())
        raise NodeTimeout(node.name, self.cfg.request_timeout_s)

    def _node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None or not node.alive or node.handle is None:
            raise NodeLost(name, (node.error if node is not None else None) or "unknown node")
        return node

    async def forward(
        self,
        name: str,
        service: str | None,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> Answer:
        """One HTTP call made by node ``name``'s agent to its own daemon."""
        node = self._node(name)
        deadline = self.clock() + self.cfg.request_timeout_s
        timeout = self.cfg.request_timeout_s
        self._sent(name, service)
        try:
            ref = node.handle.forward.remote(method, path, headers, body, timeout)
            status, out_headers, out_body = await self._bounded(node, _awaited(ref), deadline)
        finally:
            self._answered(name, service)
        return int(status), list(out_headers), bytes(out_body)

    async def stream(
        self,
        name: str,
        service: str | None,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> AsyncGenerator[Any, None]:
        """The agent's streamed answer: first ``(status, headers)``, then body chunks."""
        node = self._node(name)
        deadline = self.clock() + self.cfg.request_timeout_s
        timeout = self.cfg.request_timeout_s
        self._sent(name, service)
        try:
            refs = node.handle.stream.options(num_returns="streaming").remote(
                method, path, headers, body, timeout
            )
            while True:
                more, ref = await self._bounded(node, _next(refs), deadline)
                if not more:
                    return
                yield await self._bounded(node, _awaited(ref), deadline)
        finally:
            self._answered(name, service)


async def _awaited(ref: Any) -> Any:
    return await ref


async def _next(refs: Any) -> tuple[bool, Any]:
    """(True, the next item) of a Ray streaming generator, or (False, None) at its end."""
    try:
        return True, await refs.__anext__()
    except StopAsyncIteration:
        return False, None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__
