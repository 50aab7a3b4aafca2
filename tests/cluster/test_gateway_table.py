"""The cluster gateway and its node table against stand-in agents (no Ray): guards,
forwarding, and the bounds that keep a request from waiting on a dead node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from tests.cluster.test_parts import _snapshot
from tests.waiting import async_wait_until

from accelmux.cluster.gateway import build_cluster_app
from accelmux.cluster.nodes import NodeTable
from accelmux.config.cluster import ClusterConfig
from accelmux.config.server import ServerConfig

OK = (200, [("Content-Type", "application/json")], b'{"ok": true}')


class Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)

    def options(self, **_: Any) -> Method:
        return self


class Agent:
    """A stand-in node agent: its answers are whatever the test sets."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.hang_snapshot = False
        self.answer: Callable[[], Awaitable[Any]] = self._ok
        self.snapshot = Method(self._snapshot)
        self.forward = Method(lambda *a: self.answer())
        self.stream = Method(self._stream)

    async def _ok(self) -> Any:
        return OK

    async def _snapshot(self) -> dict[str, Any]:
        if self.hang_snapshot:
            await asyncio.sleep(3600)
        return _snapshot(self.node)

    def _stream(self, *args: Any) -> AsyncIterator[Any]:
        async def done(value: Any) -> Any:
            return value

        async def items() -> AsyncIterator[Any]:
            yield done((200, [("Content-Type", "text/event-stream")]))
            yield done(b"data: 1\n\n")
            await asyncio.sleep(3600)  # then nothing: a node that went quiet
            yield done(b"data: 2\n\n")

        return items()


class FakeRay:
    def __init__(self, *agents: Agent) -> None:
        self.agents = {f"accelmux-node-{a.node}": a for a in agents}
        self.util = self

    def list_named_actors(self, all_namespaces: bool = False) -> list[str]:
        return list(self.agents)

    def get_actor(self, name: str) -> Agent:
        return self.agents[name]

    def get_runtime_context(self) -> Any:
        return self

    def get_node_id(self) -> str:
        return "gateway-node"


def serve(
    agents: list[Agent], body: Callable[[TestClient, NodeTable], Awaitable[None]], **server: Any
) -> None:
    cluster = ClusterConfig(snapshot_timeout_s=0.3, request_timeout_s=2.0, retry_after_s=2)

    async def main() -> None:
        table = NodeTable(FakeRay(*agents), cluster)
        await table.refresh()
        app = build_cluster_app(table, ServerConfig(**server))
        async with TestClient(TestServer(app)) as client:
            await body(client, table)

    asyncio.run(main())


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def test_a_request_is_forwarded_with_its_node_named_and_keys_are_checked() -> None:
    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 401
        resp = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"}
        )
        assert resp.status == 200 and await resp.json() == {"ok": True}
        assert resp.headers["X-Accelmux-Node"] == "b"
        health = await client.get("/health")
        assert (await health.json())["alive"] == 1

    serve([Agent("b")], body, api_keys=["k"])


def test_a_request_in_flight_fails_at_once_when_its_node_goes_down() -> None:
    agent = Agent("b")

    async def forever() -> Any:
        await asyncio.sleep(3600)

    async def body(client: TestClient, table: NodeTable) -> None:
        agent.answer = forever
        started = time.monotonic()
        request = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await async_wait_until(
            lambda: table.pending() == {("b", "chat"): 1}, message="the request to reach b"
        )
        agent.hang_snapshot = True
        await table.refresh()  # the snapshot times out: b is down
        resp = await request
        assert time.monotonic() - started < 1.5
        assert resp.status == 502
        err = (await resp.json())["error"]
        assert err["code"] == "node_lost" and "'b'" in err["message"]
        # the next request for chat: a clear 503, b named, Retry-After
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"

    serve([agent], body)


def test_a_node_slower_than_the_request_timeout_is_a_504() -> None:
    agent = Agent("b")

    async def slow() -> Any:
        await asyncio.sleep(3600)

    async def body(client: TestClient, table: NodeTable) -> None:
        agent.answer = slow
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 504 and (await resp.json())["error"]["code"] == "node_timeout"
        assert time.monotonic() - started < 3

    serve([agent], body)


def test_a_stream_whose_node_goes_quiet_ends_with_an_error_event() -> None:
    async def body(client: TestClient, table: NodeTable) -> None:
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert resp.status == 200
        text = await resp.text()
        assert time.monotonic() - started < 3
        assert text.startswith("data: 1\n\n") and '"node_timeout"' in text

    serve([Agent("b")], body)


def test_requests_in_flight_spread_a_burst_before_the_next_snapshot() -> None:
    a, b = Agent("a"), Agent("b")

    async def body(client: TestClient, table: NodeTable) -> None:
        gate = asyncio.Event()

        async def held() -> Any:
            await gate.wait()
            return OK

        a.answer = held
        first = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await async_wait_until(
            lambda: table.pending() == {("a", "chat"): 1}, message="the first request on a"
        )
        second = await client.post("/v1/chat/completions", json=CHAT)
        assert second.headers["X-Accelmux-Node"] == "b"  # a's one slot is taken
        gate.set()
        assert (await first).headers["X-Accelmux-Node"] == "a"
        assert table.pending() == {}

    serve([a, b], body)


def test_the_browser_guard_stands_in_front_and_origin_is_not_sent_on() -> None:
    sent: list[list[tuple[str, str]]] = []
    agent = Agent("b")

    async def record(*args: Any) -> Any:
        sent.append(list(args[2]))  # method, path, headers, body, timeout
        return OK

    agent.forward = Method(record)

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.get("/v1/models", headers={"Host": "evil.example"})
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "host_not_allowed"
        resp = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example"}
        )
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "origin_not_allowed"
        assert not sent
        app_origin = "https://app.example"
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin})
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == app_origin
        assert len(sent) == 1
        assert not {k.lower() for k, _ in sent[0]} & {"origin", "sec-fetch-site", "host"}

    serve([agent], body, cors_origins=["https://app.example"])
