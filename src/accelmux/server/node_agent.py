"""The node agent: one per machine of a cluster, a Ray actor running that machine's daemon.

:class:`NodeAgent` is the body of a Ray async actor named ``accelmux-node-NODE`` in the
``accelmux`` namespace, detached (it outlives the command that started it) and pinned to
its Ray node (``NodeAffinitySchedulingStrategy``, not soft: it never moves to another
machine). Inside it runs the machine's ordinary daemon (:func:`accelmux.server.serve.serve`)
with only the services its node may host, its own Manager over its own devices and
backends, listening on 127.0.0.1 at a free port. Its methods:

* ``snapshot()``: the node's services, queues and free memory per device
  (:func:`accelmux.cluster.snapshots.node_snapshot`, from the daemon's ``/admin/status``);
* ``forward(method, path, headers, body, timeout_s)``: one HTTP call to its daemon,
  returned as ``(status, headers, body)``;
* ``stream(...)``: the same for a streamed answer (SSE, NDJSON), a Ray streaming
  generator yielding ``(status, headers)`` and then each chunk as it comes;
* ``stop()``: the daemon's clean shutdown (in-flight requests drain, backends unload).

Forwarding to the node's whole gateway means every API works unchanged on each node,
and the node's ledger stays the one authority on its memory. Ray is imported only by
:func:`start_agent` and :func:`stop_agent` (the optional extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from accelmux.cluster.hosting import check_node_name, config_for_node
from accelmux.cluster.ray_link import DEVICE_RESOURCE, NAMESPACE, agent_name
from accelmux.cluster.snapshots import node_snapshot
from accelmux.config.load import load_config_text, read_text
from accelmux.errors import ClusterError
from accelmux.server.serve import serve

#: Headers of the daemon's answer the agent does not hand back (they describe the hop).
HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
READY_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeAgent:
    """The Ray actor's body; see the module docstring."""

    def __init__(
        self, node: str, config_text: str, source: str, base_dir: str, data_dir: str, cwd: str
    ) -> None:
        with contextlib.suppress(OSError):  # relative paths of the config, as on one machine
            os.chdir(cwd)
        cfg = load_config_text(config_text, source, Path(base_dir))
        self.node = node
        self.port = free_port()
        self.cfg = config_for_node(cfg, node, port=self.port, data_dir=Path(data_dir))
        self.base = f"http://127.0.0.1:{self.port}"
        admin = self.cfg.server.admin_key
        self._admin_headers = {"Authorization": f"Bearer {admin}"} if admin else {}
        self._stop: asyncio.Event | None = None
        self._daemon: asyncio.Task[None] | None = None
        self._failure: str | None = None
        self._session: aiohttp.ClientSession | None = None
        import ray  # noqa: PLC0415  # optional extra: this runs only inside a Ray actor

        self.ray_node_id = str(ray.get_runtime_context().get_node_id())

    async def _run(self, stop: asyncio.Event) -> None:
        try:
            await serve(self.cfg, stop=stop, signals=False)
        except SystemExit as exc:  # serve's one-line refusals (a port taken...)
            self._failure = str(exc.code)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Start the daemon; its first snapshot once it answers."""
        self._stop = asyncio.Event()
        self._daemon = asyncio.create_task(self._run(self._stop))
        deadline = asyncio.get_running_loop().time() + ready_timeout_s
        while True:
            if self._daemon.done():
                raise ClusterError(
                    f"node {self.node}: the daemon stopped: {self._failure or 'see its log'}"
                )
            with contextlib.suppress(aiohttp.ClientError):
                async with self._client().get(self.base + "/health") as resp:
                    if resp.status == 200:
                        return await self.snapshot()
            if asyncio.get_running_loop().time() > deadline:
                raise ClusterError(f"node {self.node}: the daemon did not start in time")
            await asyncio.sleep(0.05)

    async def snapshot(self) -> dict[str, Any]:
        async with self._client().get(
            self.base + "/admin/status", headers=self._admin_headers
        ) as resp:
            status = await resp.json()
        snap = node_snapshot(self.node, self.port, status, self.cfg)
        snap["ray_node_id"] = self.ray_node_id
        return snap

    async def forward(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        timeout_s: float,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._client().request(
            method, self.base + path, headers=headers, data=body, timeout=timeout
        ) as resp:
            data = await resp.read()
            return resp.status, _kept(resp), data

    async def stream(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        timeout_s: float,
    ) -> AsyncIterator[Any]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._client().request(
            method, self.base + path, headers=headers, data=body, timeout=timeout
        ) as resp:
            yield resp.status, _kept(resp)
            async for chunk in resp.content.iter_any():
                yield chunk

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._daemon is not None:
            await self._daemon
        if self._session is not None:
            await self._session.close()


def _kept(resp: aiohttp.ClientResponse) -> list[tuple[str, str]]:
    return [(k, v) for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS]


def _ray_node(ray: Any, node_id: str) -> dict[str, Any]:
    for info in ray.nodes():
        if info.get("NodeID") == node_id and info.get("Alive"):
            return dict(info)
    raise ClusterError(f"no live Ray node has the id {node_id}")


def start_agent(
    ray: Any,
    *,
    node: str,
    config_path: Path,
    ray_node_id: str | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> dict[str, Any]:
    """Start node ``node``'s agent on this machine's Ray node (or ``ray_node_id``) and
    wait until its daemon answers; its first snapshot. The agent is detached: it keeps
    running after this returns, until :func:`stop_agent` or its Ray node ends."""
    text = read_text(config_path)
    cfg = load_config_text(text, str(config_path), config_path.parent)
    check_node_name(cfg, node)
    name = agent_name(node)
    with contextlib.suppress(ValueError):  # ValueError: no such actor, the usual case
        ray.get_actor(name)
        raise ClusterError(
            f"node {node!r} already has an agent; stop it first: accelmux node --stop --node {node}"
        )
    node_id = ray_node_id or ray.get_runtime_context().get_node_id()
    declared = float(_ray_node(ray, node_id).get("Resources", {}).get(DEVICE_RESOURCE, 0))
    # What the node declares of accelerator memory is taken by its agent: other Ray work
    # placed by that resource goes elsewhere. The ledger, not Ray, accounts for it.
    resources = {DEVICE_RESOURCE: declared} if declared > 0 else {}
    from ray.util.scheduling_strategies import (  # noqa: PLC0415  # optional extra (Ray)
        NodeAffinitySchedulingStrategy,
    )

    data_dir = Path(cfg.server.data_dir).absolute() / f"node-{node}"
    actor = (
        ray.remote(NodeAgent)
        .options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=0,
            resources=resources,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        )
        .remote(
            node,
            text,
            str(config_path),
            str(config_path.parent.absolute()),
            str(data_dir),
            os.getcwd(),
        )
    )
    try:
        return dict(ray.get(actor.start.remote(timeout_s), timeout=timeout_s + 10))
    except Exception as exc:  # the actor failed to build its daemon, or timed out
        ray.kill(actor)
        cause = getattr(exc, "cause", None) or exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1]
        raise ClusterError(f"node {node!r}: the agent did not start: {first}") from None


def stop_agent(ray: Any, node: str, timeout_s: float = 60.0) -> bool:
    """Stop node ``node``'s agent cleanly (its daemon drains and unloads), then end it;
    False when it had none."""
    try:
        actor = ray.get_actor(agent_name(node))
    except ValueError:
        return False
    with contextlib.suppress(Exception):  # a stuck or dead agent is ended all the same
        ray.get(actor.stop.remote(), timeout=timeout_s)
    ray.kill(actor)
    return True
