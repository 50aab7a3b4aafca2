"""Connection limits of the HTTP listener: header, body and idle timeouts, a cap, a fair
share per client and per key, a reserve for /health and realtime services, and a minimum
body rate.

aiohttp closes an idle keep-alive connection (``keepalive_timeout``, given to the
``AppRunner``), and bounds header sizes, but it has no limit on how long a client may
take to send its headers or its body, nor on how many connections are open, nor on who
holds them. A thin layer adds them without touching aiohttp's request handling:

- :class:`ConnectionGuard` is the protocol factory given to ``loop.create_server``
  (:class:`GuardedTCPSite`). Each connection's aiohttp ``RequestHandler`` sits inside a
  :class:`GuardedProtocol`, which forwards every call and notes when bytes arrive. The
  guard keeps what every connection holds in a :class:`~.fairness.SlotBook` (the
  decisions of :mod:`.fairness`), whichever stack serves the connection: every listener
  calls the same :meth:`ConnectionGuard.open`, :meth:`~ConnectionGuard.request_started`,
  :meth:`~ConnectionGuard.claim` and :meth:`~ConnectionGuard.request_ended`.
- :func:`activity_middleware` (outermost in the application) marks a connection busy
  while a request is handled, and knows its body (``request.content``);
  :func:`claim_middleware` (after the key checks) tells the guard which key the request
  authenticated with and what it asks for, and refuses what the reserve or the key's
  share does not allow.
- A sweep every fraction of a second closes a connection that sent no complete request
  within ``server.header_timeout_s`` of opening, one whose request body stalled (no byte
  for ``server.body_timeout_s`` while the body is incomplete and aiohttp is reading), and
  one whose body arrives slower than ``server.min_body_rate`` over
  ``server.body_rate_window_s`` (408 ``body_too_slow``). A response being written is never
  cut: a streaming answer of minutes is normal. A slow header on a keep-alive connection
  is bounded by aiohttp's ``keepalive_timeout`` (counted from the previous answer, bytes
  or not).
- A newcomer from a client that holds ``server.connections_per_address`` connections
  closes that client's oldest idle one, or gets ``429 per_client_limit``. Once the
  connections outside the reserve are taken, a newcomer closes the oldest connection
  that has no request in progress (no byte of the next one either, and opened over a
  second ago); when there is none it takes a reserved connection, which answers only
  ``/health`` and realtime services, and when the reserve is full too it gets
  ``503 too_many_connections``. Refusals carry ``Connection: close`` and are written at
  once, before anything is read.

Under a plain ``web.TCPSite`` (tests) the middlewares find no guard and do nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

from aiohttp import web

from accelmux.config.server import ServerConfig
from accelmux.gateway.errors import ApiError
from accelmux.gateway.fairness import (
    ALWAYS_PRIORITY,
    FairnessLimits,
    KeylessStrikes,
    Place,
    RateWindow,
    Seat,
    SlotBook,
    client_of,
)

log = logging.getLogger("accelmux.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FrontFactory = Callable[
    ["ConnectionGuard", Callable[[], asyncio.Protocol], float], asyncio.Protocol
]

#: Refusals that linger (answer sent, waiting for the client to read it) at most.
MAX_LINGERING_REFUSALS = 64
REFUSAL_LINGER_S = 1.0
#: A connection younger than this is not closed to make room (its request may be on its way).
EVICT_GRACE_S = 1.0
#: Seconds a client refused for its share is told to wait.
RETRY_AFTER_S = 1


def _answer(status: str, message: str, code: str, *, retry_after: int | None = None) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    ).encode()
    retry = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    fairness: FairnessLimits | None = None

    @classmethod
    def of(cls, cfg: ServerConfig) -> ConnectionLimits:
        return cls(
            header_timeout_s=cfg.header_timeout_s,
            body_timeout_s=cfg.body_timeout_s,
            max_connections=cfg.max_connections,
            fairness=FairnessLimits.of(cfg),
        )

    @property
    def fair(self) -> FairnessLimits:
        """The fairness limits (given, or none beyond the cap)."""
        if self.fairness is not None:
            return self.fairness
        unlimited = self.max_connections
        return FairnessLimits(
            max_connections=unlimited,
            reserved=0,
            per_address=unlimited,
            per_key=unlimited,
            min_body_rate=0.0,
            body_rate_window_s=1.0,
        )

    @property
    def sweep_s(self) -> float:
        shortest = min(self.header_timeout_s, self.body_timeout_s, self.fair.body_rate_window_s)
        return min(1.0, max(0.05, shortest / 4))


@dataclass(slots=True)
class ConnectionCounts:
    """What the guard did since it started (for logs, tests and benchmarks)."""

    accepted: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    body_too_slow: int = 0
    evicted_idle: int = 0
    refused: int = 0
    per_client_refused: int = 0
    reserved: int = 0
    reserve_refused: int = 0
    keyless_barred: int = 0


class BodyState(Protocol):
    """What the guard reads of a request body being received."""

    def is_eof(self) -> bool: ...


@dataclass(slots=True, eq=False)
class Conn:
    """One connection as the door sees it, whichever stack serves it."""

    opened: float
    last_byte: float
    transport: asyncio.Transport | None = None
    requests: int = 0
    busy: int = 0
    body: BodyState | None = None
    bytes_seen: bool = False
    #: Bytes arrived since the last request ended (the next one is on its way).
    pending: bool = False
    closed: bool = field(default=False)
    #: Bytes received on the connection in all (the body rate counts them).
    received: int = 0
    seat: Seat | None = None
    rate: RateWindow = field(default_factory=RateWindow)

    def arrived(self, nbytes: int) -> None:
        """``nbytes`` just arrived (a listener calls it from ``data_received``)."""
        self.last_byte = time.monotonic()
        self.bytes_seen = True
        self.pending = True
        self.received += nbytes

    @property
    def idle(self) -> bool:
        """No request in progress, and no byte of the next one."""
        return self.busy == 0 and not self.pending and self.transport is not None

    @property
    def reserved(self) -> bool:
        """Whether it holds a reserved connection (only /health and realtime services)."""
        return self.seat is not None and self.seat.reserve


def refuse(transport: asyncio.Transport, answer: bytes, guard: ConnectionGuard) -> bool:
    """Write ``answer`` and close, after the client read it when that can be afforded:
    half-closed, its request read and dropped for at most :data:`REFUSAL_LINGER_S` (at
    most :data:`MAX_LINGERING_REFUSALS` at once), since closing with a request unread
    would reset the connection and could lose the answer. True when it lingers (the
    caller then calls :meth:`ConnectionGuard.lingered` once the connection is lost)."""
    transport.write(answer)
    if guard.lingering >= MAX_LINGERING_REFUSALS or not transport.can_write_eof():
        transport.close()
        return False
    transport.write_eof()
    guard.lingering += 1
    asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)
    return True


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's per-connection protocol, wrapped: every call is forwarded once the
    guard seated the connection; a refused one is answered and never reaches aiohttp."""

    __slots__ = ("_guard", "_inner", "_lingers", "_make_inner", "conn")

    def __init__(
        self, guard: ConnectionGuard, make_inner: Callable[[], asyncio.Protocol], now: float
    ) -> None:
        self._guard = guard
        self._make_inner = make_inner
        self._inner: asyncio.Protocol | None = None
        self._lingers = False
        self.conn = Conn(opened=now, last_byte=now)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.conn.transport = tr
        refusal = self._guard.open(self.conn, tr.get_extra_info("peername"))
        if refusal is not None:
            self._lingers = refuse(tr, refusal, self._guard)
            return
        self._inner = self._make_inner()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return  # refused: the request is not read
        self.conn.arrived(len(data))
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return False  # refused: the transport closes itself
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self.conn)
        if self._lingers:
            self._lingers = False
            self._guard.lingered()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


def _peer_host(peer: object) -> str | None:
    if isinstance(peer, (tuple, list)) and peer:
        return str(peer[0])
    return None


class ConnectionGuard:
    """The door's connections: who holds what, what is refused, what overstayed (see the
    module). ``priority``: the paths a reserved connection may ask for."""

    def __init__(
        self, limits: ConnectionLimits, *, priority: frozenset[str] = ALWAYS_PRIORITY
    ) -> None:
        self.limits = limits
        self.fair = limits.fair
        self.priority = priority
        self.counts = ConnectionCounts()
        self.lingering = 0
        self.book = SlotBook(self.fair)
        self.refusal = _answer(
            "503 Service Unavailable",
            f"too many connections (server.max_connections is {limits.max_connections}); "
            "retry shortly",
            "too_many_connections",
            retry_after=RETRY_AFTER_S,
        )
        self.per_client_refusal = _answer(
            "429 Too Many Requests",
            "this client holds its share of connections already "
            f"(server.connections_per_address is {self.fair.per_address}); "
            "reuse a connection or retry shortly",
            "per_client_limit",
            retry_after=RETRY_AFTER_S,
        )
        self.strikes = KeylessStrikes()
        self.keyless_refusal = _answer(
            "429 Too Many Requests",
            f"this address sent more than {self.strikes.strikes} requests without a valid "
            f"API key within {self.strikes.window_s:g} s; its new connections are refused "
            f"for {self.strikes.bar_s:g} s",
            "per_client_limit",
            retry_after=int(self.strikes.bar_s),
        )
        self._server: Callable[[], asyncio.Protocol] | None = None
        #: The protocol each connection starts in, when not aiohttp's own (the hot path's:
        #: gateway/hot.py); it is given the guard, aiohttp's protocol factory and the time.
        self.front: FrontFactory | None = None
        self._open: dict[Conn, None] = {}  # in the order they opened
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def start(self, server: Callable[[], asyncio.Protocol]) -> None:
        self._server = server
        self._schedule()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def __call__(self) -> asyncio.Protocol:
        assert self._server is not None
        if self.front is not None:
            return self.front(self, self._server, time.monotonic())
        return GuardedProtocol(self, self._server, time.monotonic())

    # ---- what every listener calls -------------------------------------------------
    def open(self, conn: Conn, peer: object) -> bytes | None:
        """Seat a new connection from ``peer`` (its ``peername``); the answer to write
        when it is refused instead (it is then not tracked)."""
        client = client_of(_peer_host(peer))
        if self.strikes.barred(client, time.monotonic()) > 0:
            self.counts.keyless_barred += 1
            return self.keyless_refusal
        place = self.book.place(client)
        if place is Place.PER_CLIENT and self._evict_idle(lambda seat: seat.client == client):
            place = self.book.place(client)
        if place in (Place.RESERVE, Place.FULL) and self._evict_idle(lambda seat: not seat.reserve):
            place = self.book.place(client)
        if place is Place.PER_CLIENT:
            self.counts.per_client_refused += 1
            return self.per_client_refusal
        if place is Place.FULL:
            self.counts.refused += 1
            return self.refusal
        conn.seat = self.book.take(client, place)
        self._open[conn] = None
        self.counts.accepted += 1
        self.counts.reserved += place is Place.RESERVE
        return None

    def forget(self, conn: Conn) -> None:
        conn.closed = True
        self.release(conn)
        self._open.pop(conn, None)

    def release(self, conn: Conn) -> None:
        """``conn`` no longer counts against any share (it was refused and only lingers
        until the client read its answer)."""
        if conn.seat is not None:
            self.book.give_back(conn.seat)

    def key_refused(self, conn: Conn) -> None:
        """A request on ``conn`` was refused for its key (a strike for its address)."""
        if conn.seat is not None:
            self.strikes.strike(conn.seat.client, time.monotonic())

    def lingered(self) -> None:
        """A refused connection that lingered is closed."""
        self.lingering -= 1

    def request_started(self, conn: Conn, body: BodyState) -> None:
        conn.requests += 1
        conn.busy += 1
        conn.body = body
        conn.rate.restart(time.monotonic(), conn.received)

    def request_ended(self, conn: Conn) -> None:
        conn.busy -= 1
        conn.body = None
        conn.pending = False

    def claim(self, conn: Conn, path: str, key: str | None) -> ApiError | None:
        """The request on ``conn`` asks for ``path``, authenticated with ``key`` (a
        digest; None: no key): the refusal (close the connection after it) when the
        reserve or the key's share does not allow it."""
        seat = conn.seat
        if seat is None or not seat.held:
            return None
        if seat.reserve and path not in self.priority:
            self.counts.reserve_refused += 1
            return reserve_refusal(self.limits.max_connections)
        if (
            key is not None
            and self.book.key_full(seat, key)
            and not self._evict_idle(lambda other: other.key == key)
        ):
            self.counts.per_client_refused += 1
            return ApiError(
                429,
                "this API key holds its share of connections already "
                f"(server.connections_per_key is {self.fair.per_key}); "
                "reuse a connection or retry shortly",
                type="rate_limit_error",
                code="per_client_limit",
                retry_after_s=RETRY_AFTER_S,
                close=True,
            )
        self.book.claim_key(seat, key)
        return None

    # ---- making room -----------------------------------------------------------------
    def _evict_idle(self, which: Callable[[Seat], bool]) -> bool:
        """Close the oldest idle connection (none handled, no byte of one received) that
        ``which`` picks; False if none. One opened within the last moment is left alone:
        its request may not have been read yet."""
        settled = time.monotonic() - min(EVICT_GRACE_S, self.limits.header_timeout_s / 2)
        for conn in self._open:
            if conn.opened > settled:
                break  # the rest are younger still
            if conn.idle and conn.seat is not None and which(conn.seat):
                self.counts.evicted_idle += 1
                self._close(conn, None)
                return True
        return False

    def _close(self, conn: Conn, answer: bytes | None) -> None:
        self.forget(conn)
        transport = conn.transport
        if transport is not None and not transport.is_closing():
            if answer is not None:
                transport.write(answer)
            transport.close()

    # ---- the sweep -------------------------------------------------------------------
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
        fair = self.fair
        for conn in list(self._open):
            if conn.busy == 0:
                if conn.requests == 0 and now - conn.opened > limits.header_timeout_s:
                    self.counts.header_timeouts += 1
                    self._close(conn, HEADER_TIMEOUT if conn.bytes_seen else None)
                continue
            body, transport = conn.body, conn.transport
            if body is None or body.is_eof() or transport is None:
                continue
            if not transport.is_reading():  # paused: the handler is behind, not the client
                conn.last_byte = now
                conn.rate.restart(now, conn.received)
            elif now - conn.last_byte > limits.body_timeout_s:
                self.counts.body_timeouts += 1
                log.info(
                    "closing a connection whose request body stalled for %.0f s",
                    now - conn.last_byte,
                )
                self._close(conn, None)
            elif conn.rate.too_slow(
                now, conn.received, fair.min_body_rate, fair.body_rate_window_s
            ):
                self.counts.body_too_slow += 1
                log.info("cutting a request body slower than server.min_body_rate")
                self._close(conn, self.body_too_slow)

    @property
    def body_too_slow(self) -> bytes:
        fair = self.fair
        return _answer(
            "408 Request Timeout",
            f"request body arrived slower than {fair.min_body_rate:g} bytes/s over "
            f"{fair.body_rate_window_s:g} s (server.min_body_rate)",
            "body_too_slow",
        )


def reserve_refusal(max_connections: int) -> ApiError:
    """What a reserved connection answers to a request that is not /health nor for a
    realtime service."""
    return ApiError(
        503,
        f"too many connections (server.max_connections is {max_connections}); the "
        "connections left are kept for /health and realtime services; retry shortly",
        type="server_error",
        code="too_many_connections",
        retry_after_s=RETRY_AFTER_S,
        close=True,
    )


HEADER_TIMEOUT = _answer(
    "408 Request Timeout",
    "request headers not received in time (server.header_timeout_s)",
    "request_timeout",
)


def guarded(request: web.Request) -> tuple[ConnectionGuard, Conn] | None:
    """The guard and connection of an aiohttp request (None under a plain TCPSite)."""
    transport = request.transport
    proto = transport.get_protocol() if transport is not None else None
    if not isinstance(proto, GuardedProtocol):
        return None
    return proto._guard, proto.conn


def reserved(request: web.Request) -> bool:
    """Whether ``request`` came on a reserved connection (only realtime services)."""
    found = guarded(request)
    return found is not None and found[1].reserved


#: The digest of the key a request authenticated with (set by the key checks).
CALLER_KEY = web.RequestKey("accelmux_caller_key", str)


@web.middleware
async def activity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks the connection busy while its request is handled (no-op without a guard)."""
    found = guarded(request)
    if found is None:
        return await handler(request)
    guard, conn = found
    guard.request_started(conn, request.content)
    try:
        return await handler(request)
    finally:
        guard.request_ended(conn)


@web.middleware
async def claim_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """After the key checks: the reserve and the key's share (no-op without a guard)."""
    found = guarded(request)
    if found is not None:
        guard, conn = found
        err = guard.claim(conn, request.path, request.get(CALLER_KEY))
        if err is not None:
            raise err
    return await handler(request)


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
