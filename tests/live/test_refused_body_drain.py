"""The rest of a refused body is read at a shared pace, then the client gets its answer."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol
from tests.live.support import base_config, daemon

from accelmux.gateway.drain import ReadPace, drain

MIB = 1024**2


def test_the_pace_is_shared_by_every_reader() -> None:
    pace = ReadPace(rate=100.0)
    assert pace.delay_for(100, now=0.0) == 0.0
    assert pace.delay_for(100, now=0.0) == 1.0  # the second waits for the first
    assert pace.delay_for(50, now=0.5) == 1.5
    assert pace.delay_for(10, now=10.0) == 0.0  # idle since: no wait


def _reader(loop: asyncio.AbstractEventLoop) -> StreamReader:
    protocol = BaseProtocol(loop)
    protocol.transport = asyncio.Transport()  # connected; the test feeds it by hand
    return StreamReader(protocol, 2**16, loop=loop)


def test_drain_reads_to_the_end_or_gives_up_at_its_limit() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        done = _reader(loop)
        for _ in range(3):
            done.feed_data(b"x" * 1000)
        done.feed_eof()
        assert await drain(done, ReadPace(rate=1e9), limit_s=5.0)
        assert done.is_eof()

        stalled = _reader(loop)  # the client stops sending
        stalled.feed_data(b"x" * 1000)
        assert not await drain(stalled, ReadPace(rate=1e9), limit_s=0.2)

        pace = ReadPace(rate=1000.0)
        first = _reader(loop)  # read at once, and 10 s of the shared pace spent
        first.feed_data(b"x" * 10_000)
        first.feed_eof()
        assert await drain(first, pace, limit_s=0.5)
        second = _reader(loop)  # its turn comes after its limit: given up
        second.feed_data(b"x" * 10)
        second.feed_data(b"x" * 10)
        assert not await drain(second, pace, limit_s=0.5)

    asyncio.run(body())


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest[:length]


def test_a_client_that_sends_its_whole_refused_body_reads_the_413(tmp_path: Path) -> None:
    # The daemon runs with aiohttp's own lingering off: without the paced drain the
    # connection would close with the body unread and the client would see a reset.
    with daemon(base_config(), tmp_path) as d:
        url = urlsplit(d.url)
        size = 12 * MIB  # over the 8 MiB chat_body
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
            )
            sock.sendall(head.encode())
            sock.sendall(b" " * size)  # as a client without Expect: 100-continue does
            answer = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert b"body_too_large" in answer
            # the body was read to its end: the connection serves the next request
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n\r\n".encode())
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
