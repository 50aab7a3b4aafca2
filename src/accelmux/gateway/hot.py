"""The hot path: the common inference requests served without aiohttp's request machinery.

Every connection of ``accelmux serve`` starts in a :class:`FrontProtocol` (an asyncio
protocol on uvloop with httptools' C parser), seated by the same
:class:`~.connections.ConnectionGuard` as before. When a request's headers are in, it is
served here when it is one of the hot routes' plain requests; otherwise the connection is
handed, from that request on, to aiohttp (the request's bytes are given to aiohttp's own
protocol as they came, and it serves the connection from then on, as every connection
before). Hot: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``
over HTTP/1.1 with a ``Content-Length`` of at most ``server.limits.offload_body`` (and
within the route's limit), no ``Transfer-Encoding``, no ``Expect``, no ``Origin`` (a
browser's request: CORS is aiohttp's), while ``server.access_log`` is off. Everything
else (big or chunked bodies, uploads, the Ollama API, admin, the dashboard, browsers) is
aiohttp's, with every check it had.

The checks are the same objects as aiohttp's middlewares use, in the same order
(:mod:`.door`): the browser guard, the API key (a refusal closes the connection and the
body is not read), the reserve and the key's share (:meth:`.ConnectionGuard.claim`), the
rate limit. The body is read by the protocol; the guard's sweep cuts a stalled or slow
one as it cuts aiohttp's. Validation, admission, the backend and the answer are
:func:`.openai_api.serve_parsed`, as for aiohttp. A streamed answer is relayed chunk by
chunk as it arrives (``Transfer-Encoding: chunked``), the upstream's bytes unchanged.

Requests pipelined behind a hot one are served in order; a connection whose pipelined
request is not hot is closed once the requests before it are answered (the client sends
it again on a new connection), since its bytes can no longer be told apart for aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import http
import logging
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httptools

from accelmux.config.limits import LimitsConfig
from accelmux.gateway import parse
from accelmux.gateway.connections import (
    MAX_LINGERING_REFUSALS,
    REFUSAL_LINGER_S,
    ConnectionGuard,
    GuardedProtocol,
    refuse,
)
from accelmux.gateway.door import Door
from accelmux.gateway.errors import ApiError
from accelmux.gateway.middleware import caller_of, rate_limited
from accelmux.gateway.openai_api import STREAMED, Answer, serve_parsed
from accelmux.runtime.daemon import Runtime

log = logging.getLogger("accelmux.gateway")

Builder = Callable[[dict[str, Any], bytes, LimitsConfig], parse.Parsed]

#: The sizes aiohttp's parser takes (docs/security.md): a request line, a header's name or
#: value, and the number of headers. The front protocol reads every request's head before
#: it decides, so it holds a head to these bounds itself.
MAX_LINE = 8190
MAX_FIELD = 8190
MAX_HEADERS = 128
MAX_HEAD = MAX_LINE + MAX_HEADERS * (2 * MAX_FIELD + 4)


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Small writes go out at once (no Nagle delay behind an unacknowledged one)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


_REASONS = {status: _reason(status) for status in range(100, 600)}


class _Date:
    """The ``Date`` header, made once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.value = email.utils.formatdate(now, usegmt=True).encode()
        return self.value


_DATE = _Date()


def head(status: int, headers: dict[str, str], *, close: bool, chunked: bool = False) -> bytes:
    """The head of an answer: status line, headers, ``Date``, framing, connection."""
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    for name, value in headers.items():
        parts += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    parts += [b"Date: ", _DATE.header(), b"\r\n"]
    if chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    if close:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class HotPath:
    """What the front protocol serves itself, and with what."""

    runtime: Runtime
    door: Door
    keepalive_timeout_s: float
    routes: dict[str, Builder]

    @classmethod
    def of(cls, runtime: Runtime, door: Door) -> HotPath | None:
        """The hot path of a daemon; None when it is off (``server.hot_path`` false, or
        ``server.access_log`` on: every request is then aiohttp's, which logs it)."""
        server = runtime.cfg.server
        if server.access_log or not server.hot_path:
            return None
        default_max = server.default_max_tokens

        def chat(body: dict[str, Any], raw: bytes, limits: LimitsConfig) -> parse.Parsed:
            return parse.chat(body, raw, default_max, limits)

        def completion(body: dict[str, Any], raw: bytes, limits: LimitsConfig) -> parse.Parsed:
            return parse.completion(body, raw, default_max, limits)

        routes: dict[str, Builder] = {
            "/v1/chat/completions": chat,
            "/v1/completions": completion,
            "/v1/embeddings": parse.embeddings,
        }
        return cls(runtime, door, server.keepalive_timeout_s, routes)

    def largest_body(self, path: str) -> int:
        """The largest body served here on ``path`` (larger ones are aiohttp's)."""
        server = self.runtime.cfg.server
        route = getattr(server.limits, parse.ROUTE_BODY[path])
        return min(int(server.limits.offload_body), int(route), int(server.max_body))


class _HandOff(Exception):
    """Raised in a parser callback: the request is aiohttp's (the parser stops)."""


class _TooLarge(Exception):
    """Raised in a parser callback: a part of the head is over its bound."""


class _Body:
    """The body being read, as the guard sees it."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def is_eof(self) -> bool:
        return self.done


@dataclass(slots=True, eq=False)
class _Request:
    path: str
    headers: dict[str, str]
    keep_alive: bool
    request_id: str
    builder: Builder
    body: bytearray = field(default_factory=bytearray)
    #: A refusal at the door, answered once the body is in (None: serve it).
    refusal: ApiError | None = None


class FrontProtocol(GuardedProtocol):
    """A connection read by httptools: hot requests served here, the rest handed to
    aiohttp's protocol (see the module)."""

    def __init__(
        self,
        guard: ConnectionGuard,
        make_inner: Callable[[], asyncio.Protocol],
        now: float,
        hot: HotPath,
    ) -> None:
        super().__init__(guard, make_inner, now)
        self.hot = hot
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._raw = bytearray()  # the current request's bytes, until it is decided
        self._between = True  # no request being read
        self._in_feed_completed = False
        self._raw_exact = True
        self._current: _Request | None = None
        self._body: _Body | None = None
        self._discard = False  # the current body is read and dropped
        self._queue: collections.deque[_Request] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._handoff = False
        self._too_big: str | None = None
        self._closing = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None

    # ---- the connection -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr: asyncio.Transport = transport  # type: ignore[assignment]
        self.conn.transport = tr
        self.transport = tr
        refusal = self._guard.open(self.conn, tr.get_extra_info("peername"))
        if refusal is not None:
            self._lingers = refuse(tr, refusal, self._guard)
            self._closing = True
            return
        self.parser = httptools.HttpRequestParser(self)
        no_delay(tr)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            super().data_received(data)
            return
        if self.parser is None or (self._closing and not self._discard):
            return  # refused, or closing: nothing more is read
        self.conn.arrived(len(data))
        if self._between:
            self._raw = bytearray(data)
            self._raw_exact = True
        elif self._current is None and not self._discard:
            self._raw += data
        if len(self._raw) > MAX_HEAD and self._current is None and not self._discard:
            self._too_large("request headers")
            return
        self._in_feed_completed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if self._too_big is not None:
                self._too_large(self._too_big)
            elif self._handoff:
                self._hand_off()
            else:
                self._malformed(exc)
        except httptools.HttpParserError as exc:
            self._malformed(exc)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._task is not None:
            self._task.cancel()  # the client went away: its request is cancelled
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client went away"))
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
        self._write_paused = True

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ---- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._in_feed_completed:
            self._raw_exact = False  # pipelined behind a request in the same read
        self._between = False
        self._url = b""
        self._headers = {}

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            self._too_big = "the request line"
            raise _TooLarge(self._too_big)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) > MAX_FIELD or len(value) > MAX_FIELD:
            self._too_big = "a header"
            raise _TooLarge(self._too_big)
        # a repeated header: its first value, the one aiohttp's ``headers.get`` gives
        self._headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        if len(self._headers) > MAX_HEADERS:
            self._too_big = "the headers"
            raise _TooLarge(self._too_big)

    def on_headers_complete(self) -> None:
        if self._keepalive is not None:  # the headers came within keepalive_timeout_s
            self._keepalive.cancel()
            self._keepalive = None
        request = self._hot_request()
        if request is None:
            self._handoff = True
            raise _HandOff
        self._raw = bytearray()
        self._current = request
        self._body = _Body()
        guard, conn = self._guard, self.conn
        guard.request_started(conn, self._body)
        request.refusal = self._door(request)
        if request.refusal is not None and request.refusal.close:
            self._refuse_now(request)

    def on_body(self, body: bytes) -> None:
        if self._current is not None and not self._discard:
            self._current.body += body

    def on_message_complete(self) -> None:
        self._between = True
        self._in_feed_completed = True
        if self._body is not None:
            self._body.done = True
        request, self._current = self._current, None
        if self._discard or request is None:
            return
        self._queue.append(request)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_queue())

    # ---- deciding ---------------------------------------------------------------------------
    def _hot_request(self) -> _Request | None:
        """The request whose headers just came, when it is served here; None: aiohttp's."""
        parser, headers = self.parser, self._headers
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return None
        path = self._url.partition(b"?")[0].decode("latin-1")
        builder = self.hot.routes.get(path)
        length = headers.get("content-length")
        if (
            builder is None
            or length is None
            or not length.isdigit()
            or "transfer-encoding" in headers
            or "expect" in headers
            or "origin" in headers
            or parser.should_upgrade()
            or int(length) > self.hot.largest_body(path)
        ):
            return None
        return _Request(
            path=path,
            headers=headers,
            keep_alive=parser.should_keep_alive(),
            request_id=self.hot.runtime.new_request_id(),
            builder=builder,
        )

    def _door(self, request: _Request) -> ApiError | None:
        """The door's checks, in aiohttp's middlewares' order."""
        door, headers, path = self.hot.door, request.headers, request.path
        err = door.browser.check("POST", path, headers, has_body=True)
        if err is not None:
            return err
        key, err = door.keys.check(path, headers.get("authorization"))
        if err is not None:
            self._guard.key_refused(self.conn)
            return err
        err = self._guard.claim(self.conn, path, key)
        if err is not None:
            return err
        if door.buckets is not None:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
            return rate_limited(door.buckets, caller_of(headers.get("authorization"), remote))
        return None

    def _hand_off(self) -> None:
        """From this request on, the connection is aiohttp's."""
        self._handoff = False
        if self._task is not None or self._queue or not self._raw_exact:
            self._close_after_queue()
            return
        inner = self._make_inner()
        self._inner = inner
        self.parser = None
        assert self.transport is not None
        inner.connection_made(self.transport)
        if self._write_paused:
            inner.pause_writing()
        raw, self._raw = bytes(self._raw), bytearray()
        inner.data_received(raw)

    def _too_large(self, what: str) -> None:
        """A head over aiohttp's bounds: 431, closed (as aiohttp answers it)."""
        self._too_big = None
        err = ApiError(
            431,
            f"{what} too large (at most {MAX_FIELD} bytes a field, {MAX_HEADERS} headers)",
            code="headers_too_large",
            close=True,
        )
        self._closing = True
        self._write(err.status, {"Content-Type": "application/json"}, err.body_bytes(), True)
        self._close_after_queue()

    def _malformed(self, exc: Exception) -> None:
        peer = self.transport.get_extra_info("peername") if self.transport else "?"
        log.info("malformed HTTP request from %s: %s", peer[0] if peer else "?", exc)
        err = ApiError(400, f"malformed request: {exc}", code="bad_request", close=True)
        self._closing = True
        self._write(err.status, {"Content-Type": "application/json"}, err.body_bytes(), True)
        self._close_after_queue()

    # ---- refusals at the door ----------------------------------------------------------------
    def _refuse_now(self, request: _Request) -> None:
        """A refusal that closes the connection: answered at once, the body not kept, the
        connection out of every share while the client reads the answer."""
        err = request.refusal
        assert err is not None and self.transport is not None
        self._current = None
        self._discard = True
        self._closing = True
        guard = self._guard
        guard.release(self.conn)
        self._send_error(err, request.request_id, close=True)
        guard.request_ended(self.conn)
        if guard.lingering >= MAX_LINGERING_REFUSALS or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        guard.lingering += 1
        self._lingers = True
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self.transport.close)

    # ---- serving -------------------------------------------------------------------------
    async def _serve_queue(self) -> None:
        try:
            while self._queue:
                await self._serve(self._queue.popleft())
        finally:
            self._task = None
            if self._closing and self.transport is not None and not self._lingers:
                self.transport.close()

    async def _serve(self, request: _Request) -> None:
        close = not request.keep_alive or self._closing
        try:
            if request.refusal is not None:
                self._send_error(request.refusal, request.request_id, close=close)
                return
            rt = self.hot.runtime
            limits = rt.cfg.server.limits
            try:
                raw = bytes(request.body)
                parsed = parse.decode_small(raw, limits, request.builder)
                exchange = _Exchange(self, request.request_id, close)
                answer = await serve_parsed(rt, parsed, exchange)
            except ApiError as err:
                close = close or err.close
                self._send_error(err, request.request_id, close=close)
                return
            except Exception:
                log.exception("unhandled error on POST %s", request.path)
                internal = ApiError(
                    500, "internal error", type="server_error", code="internal_error"
                )
                self._send_error(internal, request.request_id, close=close)
                return
            if answer is STREAMED:
                return
            if answer.error is not None:
                self._send_error(answer.error, request.request_id, close=close)
                return
            self._send(answer, close)
        finally:
            self._guard.request_ended(self.conn)
            if close:
                self._closing = True
            elif not self._queue:
                self._start_keepalive()

    def _start_keepalive(self) -> None:
        if self._closing or self.transport is None:
            return
        loop = asyncio.get_running_loop()
        self._keepalive = loop.call_later(self.hot.keepalive_timeout_s, self._idle_timeout)

    def _idle_timeout(self) -> None:
        self._keepalive = None
        if self._current is None and not self._queue and self._task is None and self.transport:
            self.transport.close()

    def _close_after_queue(self) -> None:
        self._closing = True
        self.parser = None
        if self._task is None and not self._queue and self.transport is not None:
            self.transport.close()

    # ---- writing ---------------------------------------------------------------------------
    def _write(self, status: int, headers: dict[str, str], body: bytes, close: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        headers = {**headers, "Content-Length": str(len(body))}
        self.transport.write(head(status, headers, close=close) + body)

    def _send(self, answer: Answer, close: bool) -> None:
        self._write(answer.status, answer.headers, answer.body, close)

    def _send_error(self, err: ApiError, request_id: str, *, close: bool) -> None:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if err.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
        self._write(err.status, headers, err.body_bytes(), close or err.close)

    async def drain(self) -> None:
        """Wait while the client is slower than the answer (the transport's buffer is full)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client went away")
        if self._write_paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained


class _Exchange:
    """:class:`~.openai_api.Exchange` over a :class:`FrontProtocol`."""

    __slots__ = ("_close", "_head", "_proto", "request_id", "reserved")

    def __init__(self, proto: FrontProtocol, request_id: str, close: bool) -> None:
        self._proto = proto
        self._close = close
        self._head = b""  # sent with the first chunk: one segment, not two
        self.request_id = request_id
        self.reserved = proto.conn.reserved

    def _transport(self) -> asyncio.Transport:
        transport = self._proto.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        return transport

    async def begin_stream(self, status: int, headers: dict[str, str]) -> None:
        self._transport()
        self._head = head(status, headers, close=self._close, chunked=True)

    async def write(self, data: bytes) -> None:
        first, self._head = self._head, b""
        self._transport().write(first + b"%x\r\n%s\r\n" % (len(data), data))
        await self._proto.drain()

    async def end_stream(self) -> None:
        first, self._head = self._head, b""
        self._transport().write(first + b"0\r\n\r\n")


def front_protocol(
    guard: ConnectionGuard, make_inner: Callable[[], asyncio.Protocol], now: float, *, hot: HotPath
) -> FrontProtocol:
    """The guard's ``front`` factory for ``hot``."""
    return FrontProtocol(guard, make_inner, now, hot)
