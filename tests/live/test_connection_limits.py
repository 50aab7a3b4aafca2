"""Connection limits of ``accelmux serve`` (a real process, raw sockets): silent, slow-header
and stalled-body connections are closed after their (small, configured) timeouts, idle
keep-alive connections too, while a slow but steady upload and a long silent stream are
not cut; at ``server.max_connections`` a real request still gets an answer (an idle
connection makes room) or a clear 503 when every connection is busy; and ``/health``
answers 503 while the daemon drains. Counts are asserted, never durations."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake
from tests.reliability.support import http, running, wait_for, write_config

pytestmark = pytest.mark.slow

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def _config(chat: dict[str, Any] | None = None, **server: Any) -> dict[str, Any]:
    cfg = base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": chat or fake()}
    )
    cfg["server"].update(server)
    return cfg


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setblocking(False)
    return sock


@contextmanager
def _sockets(url: str, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    socks = [_connect(url) for _ in range(count)]
    try:
        for sock in socks:
            if first:
                sock.sendall(first)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _drain(sock: socket.socket, got: dict[socket.socket, bytes]) -> bool:
    """Read what is there; True once the server closed the connection."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
            got[sock] = got.get(sock, b"") + data
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _closed(socks: list[socket.socket], got: dict[socket.socket, bytes]) -> set[socket.socket]:
    closed: set[socket.socket] = set()
    readable, _, _ = select.select(socks, [], [], 0.05)
    for sock in readable:
        if _drain(sock, got):
            closed.add(sock)
    return closed


def _wait_closed(
    socks: list[socket.socket], timeout: float = 30.0
) -> tuple[set[socket.socket], dict[socket.socket, bytes]]:
    """Wait until the server closed every socket (or ``timeout``); answers the closed
    ones and what each received."""
    got: dict[socket.socket, bytes] = {}
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + timeout
    while len(closed) < len(socks) and time.monotonic() < deadline:
        closed |= _closed([s for s in socks if s not in closed], got)
    return closed, got


def _get_health(url: str) -> bytes:
    host = url.removeprefix("http://")
    return f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def _post_head(url: str, length: int) -> bytes:
    host = url.removeprefix("http://")
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_silent_and_slow_header_connections_are_closed(tmp_path: Path) -> None:
    # 120 connections from one address: more than its share (tested on its own below)
    path = write_config(_config(header_timeout_s=0.5, connections_per_address=1000), tmp_path)
    with running(path) as d:
        with (
            _sockets(d.url, 100) as silent,
            _sockets(d.url, 20, b"GET /health HTTP/1.1\r\n") as slow,
        ):
            closed, got = _wait_closed(silent + slow)
            assert len(closed) == 120, f"{len(closed)} of 120 closed"
            assert all(got.get(s, b"").startswith(b"HTTP/1.1 408 ") for s in slow), got
            assert not any(got.get(s) for s in silent)  # closed without a word
        assert http("GET", d.url + "/health")[0] == 200
    assert "Traceback" not in d.log.read_text()


def test_idle_keepalive_connections_are_closed(tmp_path: Path) -> None:
    path = write_config(_config(keepalive_timeout_s=0.5), tmp_path)
    with running(path) as d, _sockets(d.url, 30, _get_health(d.url)) as socks:
        closed, got = _wait_closed(socks)
        assert len(closed) == 30, f"{len(closed)} of 30 closed"
        assert all(got[s].startswith(b"HTTP/1.1 200 ") for s in socks)


def test_stalled_body_is_cut_but_steady_upload_and_long_stream_are_not(tmp_path: Path) -> None:
    chat = fake(latency_s=3.0, stream_chunk_s=0.2)
    cfg = _config(chat, header_timeout_s=0.5, body_timeout_s=1.0, keepalive_timeout_s=0.5)
    path = write_config(cfg, tmp_path)
    with running(path) as d:
        body = json.dumps({**CHAT, "max_tokens": 4}).encode()
        with _sockets(d.url, 10, _post_head(d.url, len(body)) + body[:10]) as stalled:
            closed, _ = _wait_closed(stalled)
            assert len(closed) == 10, f"{len(closed)} of 10 closed"
        # a body sent in small pieces over longer than body_timeout_s is read whole
        steady = _connect(d.url)
        steady.setblocking(True)
        steady.sendall(_post_head(d.url, len(body)))
        for i in range(0, len(body), 4):
            steady.sendall(body[i : i + 4])
            time.sleep(0.1)
        steady.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += steady.recv(65536)
        steady.close()
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        # a stream silent for longer than every timeout, then chunk by chunk, ends whole
        stream = {**CHAT, "stream": True, "max_tokens": 8}
        status, text, _ = http("POST", d.url + "/v1/chat/completions", stream)
        assert status == 200, text
        assert str(text).rstrip().endswith("data: [DONE]"), text
    log = d.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log


def test_connection_cap_makes_room_or_refuses_clearly(tmp_path: Path) -> None:
    # no reserve and no share per client here: the cap alone (the others are tested below)
    cfg = _config(
        max_connections=10, header_timeout_s=60, body_timeout_s=60, reserved_connections=0
    )
    path = write_config(cfg, tmp_path)
    with running(path) as d:
        # the cap full of silent connections: a real request closes the oldest and is served
        with _sockets(d.url, 10) as idle:
            # (once they are over a second old: a younger one may still send its request)
            wait_for(lambda: http("GET", d.url + "/admin/status")[0] == 200, timeout=20)
            closed, _ = _wait_closed(idle[:1], timeout=10)
            assert len(closed) == 1
        # the cap full of requests in progress: a newcomer gets a clear 503 and the close
        body = json.dumps(CHAT).encode()
        with _sockets(d.url, 10, _post_head(d.url, len(body)) + body[:5]) as busy:
            wait_for(lambda: _refused(d.url) is not None, timeout=20)
            answer = _refused(d.url)
            assert answer is not None
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), answer
            assert b"Connection: close" in head
            error = json.loads(payload)["error"]
            assert error["code"] == "too_many_connections"
            assert "server.max_connections" in error["message"]
            open_busy = [s for s in busy if s not in _closed(busy, {})]
            assert len(open_busy) == 10  # no busy connection was cut for the newcomer
        assert wait_for(lambda: http("GET", d.url + "/health")[0] == 200, timeout=20)


def _refused(url: str) -> bytes | None:
    """The answer to GET /health on a new connection when it is a 503, else None."""
    sock = _connect(url)
    sock.setblocking(True)
    sock.settimeout(10)
    data = b""
    try:
        sock.sendall(_get_health(url))
        while not _complete(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        pass
    finally:
        sock.close()
    return data if data.startswith(b"HTTP/1.1 503 ") and _complete(data) else None


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            return len(body) >= int(value)
    return False


def test_health_is_503_while_draining(tmp_path: Path) -> None:
    cfg = _config(fake(latency_s=8.0), drain_s=20.0)
    path = write_config(cfg, tmp_path)
    with running(path) as d:
        slow = threading.Thread(
            target=lambda: http("POST", d.url + "/v1/chat/completions", CHAT), daemon=True
        )
        slow.start()
        wait_for(lambda: http("GET", d.url + "/admin/status")[1]["server"]["open_requests"] >= 1)
        d.popen.terminate()
        status, body, _ = wait_for(lambda: _health_not_ok(d.url), timeout=20)
        assert status == 503, body
        assert body["status"] == "stopping", body
        slow.join(30)


def _health_not_ok(url: str) -> tuple[int, Any, dict[str, str]] | None:
    answer = http("GET", url + "/health", timeout=5)
    return None if answer[0] == 200 else answer
