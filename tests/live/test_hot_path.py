"""The hot path's own HTTP (``gateway/hot.py``) on a real ``accelmux serve``, raw sockets:
keep-alive, a hot request then an aiohttp one on the same connection, pipelining, a
streamed answer, the idle timeout, a client leaving mid-stream, the head's bounds, and
``server.hot_path: false``. Counts and contents are asserted, never durations."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake
from tests.reliability.support import http, running, wait_for, write_config

pytestmark = pytest.mark.slow

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _config(**server: Any) -> dict[str, Any]:
    cfg = base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake(stream_chunk_s=0.05)}
    )
    cfg["server"].update(server)
    return cfg


def _post(host: str, body: dict[str, Any], *, close: bool = False) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(raw)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode() + raw


def _one(data: bytes) -> tuple[bytes, bytes] | None:
    """The first whole answer in ``data`` (Content-Length or chunked) and what follows it;
    None while it is incomplete."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        if b"\r\n0\r\n\r\n" not in rest:
            return None
        end = rest.index(b"\r\n0\r\n\r\n") + 7
        return head + sep + rest[:end], rest[end:]
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
            if len(rest) < length:
                return None
            return head + sep + rest[:length], rest[length:]
    raise AssertionError(head)


def _answers(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` whole answers from ``sock`` (fewer if it closes first)."""
    data, out = b"", []
    while len(out) < count:
        found = _one(data)
        if found is not None:
            answer, data = found
            out.append(answer)
            continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return out


def _connect(url: str) -> tuple[socket.socket, str]:
    host = url.removeprefix("http://")
    name, port = host.split(":")
    return socket.create_connection((name, int(port)), timeout=30), host


def test_keep_alive_handoff_pipelining_and_a_stream(tmp_path: Path) -> None:
    with running(write_config(_config(), tmp_path)) as d:
        sock, host = _connect(d.url)
        with sock:
            # two hot requests on one connection, then one for aiohttp on the same one
            sock.sendall(_post(host, CHAT))
            first = _answers(sock, 1)[0]
            assert first.startswith(b"HTTP/1.1 200") and b"X-Request-Id" in first
            sock.sendall(_post(host, {**CHAT, "stream": True}))
            stream = _answers(sock, 1)[0]
            assert b"Transfer-Encoding: chunked" in stream and b"data: [DONE]" in stream
            sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            models = _answers(sock, 1)[0]
            assert models.startswith(b"HTTP/1.1 200") and b'"object": "list"' in models
        # three hot requests in one write are answered in order
        sock, host = _connect(d.url)
        with sock:
            bodies = [
                {**CHAT, "messages": [{"role": "user", "content": f"n{i}"}]} for i in range(3)
            ]
            sock.sendall(b"".join(_post(host, b) for b in bodies))
            answers = _answers(sock, 3)
            assert [a.split(b" ", 2)[1] for a in answers] == [b"200"] * 3
            ids = [a.split(b"X-Request-Id: ")[1].split(b"\r\n")[0] for a in answers]
            assert len(set(ids)) == 3


def test_an_idle_hot_connection_is_closed_after_the_keepalive_timeout(tmp_path: Path) -> None:
    with running(write_config(_config(keepalive_timeout_s=0.5), tmp_path)) as d:
        sock, host = _connect(d.url)
        with sock:
            sock.sendall(_post(host, CHAT))
            assert _answers(sock, 1)[0].startswith(b"HTTP/1.1 200")
            sock.settimeout(30)
            assert sock.recv(65536) == b""  # closed by the daemon, nothing more sent


def test_a_client_leaving_mid_stream_cancels_its_request(tmp_path: Path) -> None:
    slow = {**CHAT, "stream": True, "max_tokens": 200}
    with running(write_config(_config(), tmp_path)) as d:
        sock, host = _connect(d.url)
        sock.sendall(_post(host, slow))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.close()

        def settled() -> bool:
            return http("GET", d.url + "/admin/status")[1]["server"]["open_requests"] == 0

        assert wait_for(settled, timeout=30)
        assert "Traceback" not in d.log.read_text()


def test_the_head_is_held_to_aiohttps_bounds(tmp_path: Path) -> None:
    with running(write_config(_config(), tmp_path)) as d:
        for extra in (
            "".join(f"X-H{i}: v\r\n" for i in range(200)),  # too many headers
            "X-Big: " + "a" * 9000 + "\r\n",  # a header too long
        ):
            sock, host = _connect(d.url)
            with sock:
                raw = _post(host, CHAT).replace(b"\r\n\r\n", ("\r\n" + extra).encode() + b"\r\n", 1)
                sock.sendall(raw)
                answer = _answers(sock, 1)[0]
                assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
                assert b"headers_too_large" in answer and b"Connection: close" in answer


def test_hot_path_off_serves_everything_through_aiohttp(tmp_path: Path) -> None:
    with running(write_config(_config(hot_path=False), tmp_path)) as d:
        status, body, headers = http("POST", d.url + "/v1/chat/completions", CHAT)
        assert status == 200, body
        assert "aiohttp" in headers.get("Server", "")  # only aiohttp names itself
    with running(write_config(_config(), tmp_path)) as d:
        status, body, headers = http("POST", d.url + "/v1/chat/completions", CHAT)
        assert status == 200 and "Server" not in headers, headers
