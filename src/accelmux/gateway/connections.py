"""Connection limits of the HTTP listener: header, body and idle timeouts, and a cap.

aiohttp closes an idle keep-alive connection (``keepalive_timeout``, given to the
``AppRunner``), and bounds header sizes, but it has no limit on how long a client may
take to send its headers or its body, nor on how many connections are open. A thin
layer adds them without touching aiohttp's request handling:

- :class:`ConnectionGuard` is the protocol factory given to ``loop.create_server``
  (:class:`GuardedTCPSite`). Each connection's aiohttp ``RequestHandler`` sits inside a
  :class:`GuardedProtocol`, which forwards every call and notes when bytes arrive.
- :func:`activity_middleware` (outermost in the application) marks a connection busy
  while a request is handled, and knows its body (``request.content``).
- A sweep every fraction of a second closes a connection that sent no complete request
  within ``server.header_timeout_s`` of opening, and one whose request body stalled
  (no byte for ``server.body_timeout_s`` while the body is incomplete and aiohttp is
  reading). A response being written is never cut: a streaming answer of minutes is
  normal. A slow header on a keep-alive connection is bounded by aiohttp's
  ``keepalive_timeout`` (counted from the previous answer, bytes or not).
- At ``server.max_connections`` a newcomer closes the oldest connection that has no
  request in progress (no byte of the next one either, and opened over a second ago);
  when there is none it gets ``503 too_many_connections`` with ``Connection: close``.

Under a plain ``web.TCPSite`` (tests) the middleware finds no guard and does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from aiohttp import web
from aiohttp.streams import StreamReader

from accelmux.config.server import ServerConfig

log = logging.getLogger("accelmux.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Refusals that linger (answer sent, waiting for the client to read it) at most.
MAX_LINGERING_REFUSALS = 64
REFUSAL_LINGER_S = 1.0
#: A connection younger than this is not closed to make room (its request may be on its way).
EVICT_GRACE_S = 1.0


def _answer(status: str, message: str, code: str) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    ).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, cfg: ServerConfig) -> ConnectionLimits:
        return cls(
            header_timeout_s=cfg.header_timeout_s,
            body_timeout_s=cfg.body_timeout_s,
            max_connections=cfg.max_connections,
        )

    @property
    def sweep_s(self) -> float:
        return min(1.0, max(0.05, min(self.header_timeout_s, self.body_timeout_s) / 4))


@dataclass(slots=True)
class ConnectionCounts:
    """What the guard did since it started (for logs, tests and benchmarks)."""

    accepted: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    evicted_idle: int = 0
    refused: int = 0


@dataclass(slots=True, eq=False)
class _Connection:
    opened: float
    last_byte: float
    transport: asyncio.Transport | None = None
    requests: int = 0
    busy: int = 0
    body: StreamReader | None = None
    bytes_seen: bool = False
    #: Bytes arrived since the last request ended (the next one is on its way).
    pending: bool = False
    closed: bool = field(default=False)


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's per-connection protocol, wrapped: every call is forwarded."""

    __slots__ = ("_guard", "_inner", "conn")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol, now: float) -> None:
        self._guard = guard
        self._inner = inner
        self.conn = _Connection(opened=now, last_byte=now)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.conn.last_byte = time.monotonic()
        self.conn.bytes_seen = True
        self.conn.pending = True
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # ---- called by activity_middleware ---------------------------------------------
    def request_started(self, body: StreamReader) -> None:
        self.conn.requests += 1
        self.conn.busy += 1
        self.conn.body = body

    def request_ended(self) -> None:
        self.conn.busy -= 1
        self.conn.body = None
        self.conn.pending = False


class _Refusal(asyncio.Protocol):
    """Answers 503 too_many_connections, then closes (after the client read it)."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.write(self._guard.refusal)
        if self._guard.lingering >= MAX_LINGERING_REFUSALS or not transport.can_write_eof():
            transport.close()
            return
        # Half-close and wait a moment for the client's EOF: closing with its request
        # unread would reset the connection and could lose the answer.
        transport.write_eof()
        self._guard.lingering += 1
        self._timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request is not read

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._guard.lingering -= 1


class ConnectionGuard:
    """The protocol factory around aiohttp's ``web.Server`` (see the module)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.counts = ConnectionCounts()
        self.lingering = 0
        self.refusal = _answer(
            "503 Service Unavailable",
            f"too many connections (server.max_connections is {limits.max_connections}); "
            "retry shortly",
            "too_many_connections",
        )
        self._server: web.Server | None = None
        self._open: dict[GuardedProtocol, None] = {}  # in the order they opened
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def start(self, server: web.Server) -> None:
        self._server = server
        self._schedule()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def __call__(self) -> asyncio.Protocol:
        assert self._server is not None
        if len(self._open) >= self.limits.max_connections and not self._evict_idle():
            self.counts.refused += 1
            return _Refusal(self)
        proto = GuardedProtocol(self, self._server(), time.monotonic())
        self._open[proto] = None
        self.counts.accepted += 1
        return proto

    def forget(self, proto: GuardedProtocol) -> None:
        proto.conn.closed = True
        self._open.pop(proto, None)

    def _evict_idle(self) -> bool:
        """Close the oldest connection without a request in progress (none handled, no
        byte of one received); False if none. One opened within the last moment is left
        alone: its request may not have been read yet."""
        settled = time.monotonic() - min(EVICT_GRACE_S, self.limits.header_timeout_s / 2)
        for proto in self._open:
            conn = proto.conn
            if conn.opened > settled:
                break  # the rest are younger still
            if conn.busy == 0 and not conn.pending and conn.transport is not None:
                self.counts.evicted_idle += 1
                self._close(proto, None)
                return True
        return False

    def _close(self, proto: GuardedProtocol, answer: bytes | None) -> None:
        self.forget(proto)
        transport = proto.conn.transport
        if transport is not None and not transport.is_closing():
            if answer is not None:
                transport.write(answer)
            transport.close()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(self.limits.sweep_s, self._sweep)

    def _sweep(self) -> None:
        try:
            self._check(time.monotonic())
        finally:
            self._schedule()

    def _check(self, now: float) -> None:
        limits = self.limits
        for proto in list(self._open):
            conn = proto.conn
            if conn.busy == 0:
                if conn.requests == 0 and now - conn.opened > limits.header_timeout_s:
                    self.counts.header_timeouts += 1
                    self._close(proto, HEADER_TIMEOUT if conn.bytes_seen else None)
                continue
            body, transport = conn.body, conn.transport
            if body is None or body.is_eof() or transport is None:
                continue
            if not transport.is_reading():  # aiohttp paused it: the handler is behind
                conn.last_byte = now
            elif now - conn.last_byte > limits.body_timeout_s:
                self.counts.body_timeouts += 1
                log.info(
                    "closing a connection whose request body stalled for %.0f s",
                    now - conn.last_byte,
                )
                self._close(proto, None)


HEADER_TIMEOUT = _answer(
    "408 Request Timeout",
    "request headers not received in time (server.header_timeout_s)",
    "request_timeout",
)


@web.middleware
async def activity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks the connection busy while its request is handled (no-op without a guard)."""
    transport = request.transport
    proto = transport.get_protocol() if transport is not None else None
    if not isinstance(proto, GuardedProtocol):
        return await handler(request)
    proto.request_started(request.content)
    try:
        return await handler(request)
    finally:
        proto.request_ended()


class GuardedTCPSite(web.TCPSite):
    """A ``web.TCPSite`` whose connections go through a :class:`ConnectionGuard`."""

    __slots__ = ("guard",)

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        guard: ConnectionGuard,
        reuse_address: bool | None = None,
    ) -> None:
        super().__init__(runner, host, port, reuse_address=reuse_address)
        self.guard = guard

    async def start(self) -> None:
        await super(web.TCPSite, self).start()  # BaseSite: registers the site
        server = self._runner.server
        assert server is not None
        self.guard.start(server)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (up to the hard limit);
    answers the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted or soft == resource.RLIM_INFINITY:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft
