"""A pooled keep-alive HTTP/1.1 client for one upstream server, on asyncio protocols and
httptools' C parser: the hop from the gateway to an external backend's server.

Made for the requests the gateway forwards: a POST of bytes it already holds, an answer
read whole or relayed as it arrives (its body bytes as they come, de-chunked, never
decoded or re-encoded). Connections are kept open and reused, at most ``size`` idle ones
kept; a connection the server closed, or one that broke, is never reused. What it does
not do (redirects, cookies, proxies, TLS, compression) an upstream on the same machine
does not need.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httptools

#: Idle connections kept per upstream.
POOL_SIZE = 64
#: Bytes of an answer's body buffered before the socket stops being read.
HIGH_WATER = 1 << 20


class UpstreamError(ConnectionError):
    """The upstream closed or broke the connection before the answer was complete."""


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    #: The whole body (a read answer); empty for a relayed one.
    body: bytes = b""
    _conn: _Connection | None = field(default=None, repr=False)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a relayed answer); the connection goes back to its
        pool at the end, or is closed when the relay stops early."""
        conn = self._conn
        if conn is None:
            return
        completed = False
        try:
            while True:
                chunk = await conn.next_chunk()
                if chunk is None:
                    completed = True
                    return
                yield chunk
        finally:
            self._conn = None
            conn.finish(reusable=completed)

    def release(self) -> None:
        """Stop relaying: the connection is closed (its answer is not read)."""
        if self._conn is not None:
            self._conn.finish(reusable=False)
            self._conn = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._headers: dict[str, str] = {}
        self._head: asyncio.Future[None] | None = None
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._wake: asyncio.Future[None] | None = None
        self._paused = False
        self._keep_alive = False
        self._error: Exception | None = None

    # ---- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # small requests go out at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed answer from the upstream: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if not self._done:
            self._fail(UpstreamError(f"the upstream closed the connection ({exc or 'EOF'})"))

    # ---- httptools callbacks ----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools gives each header whole
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._keep_alive = self.parser.should_keep_alive()  # (read here: not after the end)
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        self._done = True
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        self._notify()

    # ---- the request ------------------------------------------------------------------
    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        if self._wake is not None and not self._wake.done():
            self._wake.set_exception(exc)

    async def send(self, head: bytes, body: bytes) -> tuple[int, dict[str, str]]:
        """Write the request; answers once the answer's head is in."""
        assert self.transport is not None
        self._headers, self._body, self._buffered = {}, collections.deque(), 0
        self._done, self._error, self._paused = False, None, False
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        await self._head
        return self.parser.get_status_code(), self._headers

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        while True:
            if self._body:
                chunk = self._body.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < HIGH_WATER // 2 and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self._done:
                return None
            if self._error is not None:
                raise self._error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    async def read_all(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def finish(self, *, reusable: bool) -> None:
        keep = reusable and self._done and self._keep_alive and not self.closed
        if keep:
            self.parser = httptools.HttpResponseParser(self)
            self.pool.give_back(self)
        elif self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections to ``host:port``."""

    def __init__(self, host: str, port: int, *, size: int = POOL_SIZE) -> None:
        self.host, self.port, self.size = host, port, size
        self._idle: collections.deque[_Connection] = collections.deque()
        self._authority = f"{host}:{port}".encode()

    async def _connection(self) -> tuple[_Connection, bool]:
        """A connection, and whether it was kept from an earlier request."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        return proto, False

    def give_back(self, conn: _Connection) -> None:
        if len(self._idle) < self.size:
            self._idle.append(conn)
        elif conn.transport is not None:
            conn.closed = True
            conn.transport.close()

    def forget(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is not None:
                conn.closed = True
                conn.transport.close()

    def _head(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", self._authority]
        lines.append(b"\r\nContent-Length: %d\r\n" % len(body))
        for name, value in headers.items():
            lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
        lines.append(b"\r\n")
        return b"".join(lines)

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], *, stream: bool = False
    ) -> UpstreamResponse:
        """POST ``body``; the answer read whole, or (``stream``) relayed through
        :meth:`UpstreamResponse.chunks`. A connection taken from the pool that turns out
        closed is retried once on a new one (nothing was answered on it)."""
        head = self._head(path, body, headers)
        for attempt in (0, 1):
            conn, reused = await self._connection()
            try:
                status, answer_headers = await conn.send(head, body)
            except UpstreamError:
                conn.finish(reusable=False)
                if attempt == 0 and reused:
                    continue  # a kept connection the server had closed meanwhile
                raise
            response = UpstreamResponse(status=status, headers=answer_headers)
            if stream:
                response._conn = conn
                return response
            try:
                response.body = await conn.read_all()
            except BaseException:
                conn.finish(reusable=False)
                raise
            conn.finish(reusable=True)
            return response
        raise AssertionError("unreachable")
