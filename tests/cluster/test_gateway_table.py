"""The cluster gateway and its node table against stand-in node daemons (no Ray, no
namespaces: small aiohttp servers on loopback, test doubles of a node's daemon that
answer what each test sets): guards, forwarding with the cluster's key, the bounds that
keep a request from waiting on a dead node, the next node after a refusal, jobs found on
the node that holds them, and ``/health``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from tests.cluster.test_parts import _snapshot
from tests.waiting import async_wait_until

from accelmux.cluster.gateway import build_cluster_app
from accelmux.cluster.nodes import NodeTable
from accelmux.cluster.secret import KEY_HEADER
from accelmux.config.cluster import ClusterConfig
from accelmux.config.server import ServerConfig

KEY = "the-cluster-key"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _ok(request: web.Request) -> web.StreamResponse:
    return web.json_response({"ok": True}, headers={"X-Request-Id": "req-1"})


class StandIn:
    """A stand-in node daemon: its snapshot, and what it answers each path with."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.snapshot = _snapshot(node)
        self.hang_snapshot = False
        self.answer: Handler = _ok
        self.seen: list[web.Request] = []
        self.bodies: list[bytes] = []
        self.routes: dict[str, Handler] = {}
        self.server: TestServer | None = None

    async def _snap(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get(KEY_HEADER) != KEY:
            return web.json_response({"error": {"code": "cluster_key_required"}}, status=401)
        if self.hang_snapshot:
            await asyncio.sleep(3600)
        return web.json_response(self.snapshot)

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request)
        self.bodies.append(await request.read())
        handler = self.routes.get(request.path, self.answer)
        return await handler(request)

    async def start(self) -> dict[str, Any]:
        app = web.Application()
        app.router.add_get("/cluster/snapshot", self._snap)
        app.router.add_route("*", "/{tail:.*}", self._any)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return {"address": "127.0.0.1", "port": self.server.port}

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()


def serve(
    nodes: list[StandIn],
    body: Callable[[TestClient, NodeTable], Awaitable[None]],
    deadlines: dict[str, float] | None = None,
    **server: Any,
) -> None:
    cluster = ClusterConfig(snapshot_timeout_s=0.3, request_timeout_s=2.0, retry_after_s=2)

    async def main() -> None:
        entries = {n.node: await n.start() for n in nodes}
        table = NodeTable(cluster, KEY)
        table.set_entries(entries)
        await table.refresh()
        app = build_cluster_app(table, ServerConfig(**server), deadlines=deadlines)
        try:
            async with TestClient(TestServer(app)) as client:
                await body(client, table)
        finally:
            await table.close()
            for n in nodes:
                await n.close()

    asyncio.run(main())


def test_a_request_goes_to_its_node_with_the_clusters_key_and_keys_are_checked() -> None:
    b = StandIn("b")

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 401
        headers = {"Authorization": "Bearer k", KEY_HEADER: "forged"}
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert resp.status == 200 and await resp.json() == {"ok": True}
        assert resp.headers["X-Accelmux-Node"] == "b"
        sent = b.seen[-1].headers
        assert sent[KEY_HEADER] == KEY  # the gateway's, never the client's
        assert sent["Authorization"] == "Bearer k"  # the node checks the same keys
        health = await client.get("/health")
        assert health.status == 200
        assert await health.json() == {"status": "ok", "nodes": 1, "alive": ["b"], "down": []}

    serve([b], body, api_keys=["k"])


def test_a_request_in_flight_fails_at_once_when_its_node_goes_down() -> None:
    b = StandIn("b")

    async def forever(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError

    async def body(client: TestClient, table: NodeTable) -> None:
        b.answer = forever
        started = time.monotonic()
        request = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await async_wait_until(
            lambda: table.pending() == {("b", "chat"): 1}, message="the request to reach b"
        )
        b.hang_snapshot = True
        await table.refresh()  # the snapshot times out: b is down
        resp = await request
        assert time.monotonic() - started < 1.5
        assert resp.status == 502
        err = (await resp.json())["error"]
        assert err["code"] == "node_lost" and "'b'" in err["message"]
        assert "no snapshot within 0.3 s" in err["message"]
        # the next request for chat: a clear 503, b named, Retry-After; health says so
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"
        health = await client.get("/health")
        assert health.status == 503 and (await health.json())["down"] == ["b"]

    serve([b], body)


def test_a_node_slower_than_the_request_timeout_is_a_504() -> None:
    b = StandIn("b")

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError

    async def body(client: TestClient, table: NodeTable) -> None:
        b.answer = slow
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 504 and (await resp.json())["error"]["code"] == "node_timeout"
        assert time.monotonic() - started < 3

    serve([b], body)


def test_a_stream_is_relayed_as_it_comes_and_ends_with_an_error_when_its_node_goes_quiet() -> None:
    b = StandIn("b")
    arrived: list[float] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        await asyncio.sleep(0.5)
        await resp.write(b"data: 2\n\n")
        await asyncio.sleep(3600)  # then nothing: a node that went quiet
        return resp

    async def body(client: TestClient, table: NodeTable) -> None:
        b.answer = stream
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert resp.status == 200
        text = b""
        async for piece in resp.content.iter_any():
            arrived.append(time.monotonic() - started)
            text += piece
        assert arrived[0] < 0.4  # the first event before the second was written
        assert time.monotonic() - started < 3
        assert text.startswith(b"data: 1\n\ndata: 2\n\n") and b'"node_timeout"' in text

    serve([b], body)


def test_a_get_through_the_passthrough_streams_too() -> None:
    b = StandIn("b")
    release = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": accelmux decisions\n\n")
        await release.wait()
        await resp.write(b"event: decision\ndata: {}\n\n")
        return resp

    b.routes["/admin/events"] = events

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.get("/admin/nodes/b/admin/events")
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readline(), 2)
        assert first == b": accelmux decisions\n"
        release.set()
        rest = await asyncio.wait_for(resp.text(), 2)
        assert "event: decision" in rest

    serve([b], body)


def test_requests_in_flight_spread_a_burst_before_the_next_snapshot() -> None:
    a, b = StandIn("a"), StandIn("b")

    async def body(client: TestClient, table: NodeTable) -> None:
        gate = asyncio.Event()

        async def held(request: web.Request) -> web.StreamResponse:
            await gate.wait()
            return await _ok(request)

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


def _refusal(status: int, code: str) -> Handler:
    async def refuse(request: web.Request) -> web.StreamResponse:
        body = {"error": {"message": f"refused: {code}", "type": "x", "param": None, "code": code}}
        return web.json_response(body, status=status, headers={"X-Request-Id": f"req-{code}"})

    return refuse


def test_a_refusal_for_memory_or_queue_goes_to_the_next_node_and_is_explained() -> None:
    a, b = StandIn("a"), StandIn("b")
    a.answer = _refusal(503, "deadline_exceeded")

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 200 and resp.headers["X-Accelmux-Node"] == "b"
        assert len(a.seen) == 1 and len(b.seen) == 1
        assert a.bodies[0] == b.bodies[0] == json.dumps(CHAT).encode()  # body untouched
        why = await (await client.get("/admin/explain/req-1")).json()
        assert why["chosen"] == "b"
        assert [(t["node"], t["outcome"], t["code"]) for t in why["attempts"]] == [
            ("a", "refused", "deadline_exceeded"),
            ("b", "answered", None),
        ]
        assert {c["node"] for c in why["considered"]} == {"a", "b"}
        assert "a refused (deadline_exceeded), tried the next node" in why["why"]
        # every node refuses: the last refusal is the answer, as the node gave it
        b.answer = _refusal(429, "queue_full")
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 429 and (await resp.json())["error"]["code"] == "queue_full"
        # an answer another node would give the same is not tried elsewhere
        a.answer = _refusal(400, "invalid_value")
        seen = len(b.seen)
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 400 and len(b.seen) == seen

    serve([a, b], body)


def test_a_node_that_cannot_be_reached_is_skipped_at_once() -> None:
    a, b = StandIn("a"), StandIn("b")

    async def body(client: TestClient, table: NodeTable) -> None:
        await a.close()  # its port now refuses connections
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 200 and resp.headers["X-Accelmux-Node"] == "b"
        assert time.monotonic() - started < 1.0
        assert not table.nodes["a"].alive
        assert "connection failed" in str(table.nodes["a"].error)

    serve([a, b], body)


def test_the_deadline_bounds_the_tries() -> None:
    a, b = StandIn("a"), StandIn("b")

    async def slow_refusal(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.3)
        return await _refusal(503, "deadline_exceeded")(request)

    a.answer = slow_refusal

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and len(b.seen) == 0  # the deadline (0.2 s) has passed

    serve([a, b], body, deadlines={"chat": 0.2})


def test_a_job_is_found_on_the_node_that_holds_it_with_the_callers_key() -> None:
    a, b = StandIn("a"), StandIn("b")

    async def owned(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer k1":
            return web.json_response({"error": {"code": "job_not_found"}}, status=404)
        return web.json_response({"id": "job-1", "status": "completed"})

    async def missing(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": "job_not_found"}}, status=404)

    a.routes["/v1/jobs/job-1"] = missing
    b.routes["/v1/jobs/job-1"] = owned
    b.routes["/v1/jobs/job-1/results"] = owned

    async def body(client: TestClient, table: NodeTable) -> None:
        k1 = {"Authorization": "Bearer k1"}
        resp = await client.get("/v1/jobs/job-1", headers=k1)
        assert resp.status == 200 and resp.headers["X-Accelmux-Node"] == "b"
        resp = await client.get("/v1/jobs/job-1/results", headers=k1)
        assert resp.status == 200 and b.seen[-1].path == "/v1/jobs/job-1/results"
        resp = await client.get("/v1/jobs/job-1", headers={"Authorization": "Bearer k2"})
        assert resp.status == 404  # another key does not see it

    serve([a, b], body, api_keys=["k1", "k2"])


def test_the_browser_guard_stands_in_front_and_origin_is_not_sent_on() -> None:
    b = StandIn("b")

    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.get("/v1/models", headers={"Host": "evil.example"})
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "host_not_allowed"
        resp = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example"}
        )
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "origin_not_allowed"
        assert not b.seen
        app_origin = "https://app.example"
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin})
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == app_origin
        assert len(b.seen) == 1
        assert not {k.lower() for k in b.seen[0].headers} & {"origin", "sec-fetch-site"}

    serve([b], body, cors_origins=["https://app.example"])


def test_health_is_503_when_no_node_has_registered() -> None:
    async def body(client: TestClient, table: NodeTable) -> None:
        resp = await client.get("/health")
        assert resp.status == 503
        got = await resp.json()
        assert got["status"] == "no_nodes" and "no node has registered yet" in got["message"]

    serve([], body)


def test_a_node_gone_for_good_is_forgotten_only_while_ray_answers(tmp_path: Any) -> None:
    a, b = StandIn("a"), StandIn("b")
    now = [0.0]

    async def main() -> None:
        entries = {n.node: await n.start() for n in (a, b)}
        table = NodeTable(ClusterConfig(snapshot_timeout_s=0.3), KEY, clock=lambda: now[0])
        table.state_file = tmp_path / "nodes.json"
        try:
            table.set_entries(entries)
            await table.refresh()
            await b.close()
            await table.refresh()
            assert not table.nodes["b"].alive
            table.set_entries({"a": entries["a"]})  # b's entry left Ray
            now[0] = 10_000.0
            await table.refresh()
            assert "b" in table.nodes  # Ray's registry has not answered: b may be fine
            table.registry_up = True
            await table.refresh()
            assert sorted(table.nodes) == ["a"]
            assert sorted(json.loads(table.state_file.read_text())) == ["a"]
        finally:
            await table.close()
            await a.close()

    asyncio.run(main())
