"""One client cannot lock everyone out (``accelmux serve``, a real process, raw sockets).

Each limit of the fair door is driven past: one address's share of connections, one
key's share, the reserve kept for ``/health`` and realtime services, requests without a
valid key (refused at their headers, holding nothing while their body would trickle),
the minimum body rate, a chunked body over its route's limit; and each refusal is
checked to be named, to close the connection, and to arrive while the client still
holds back the rest of its request (so it never waited for the client). Counts and
orders are asserted, never durations.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake
from tests.reliability.support import http, running, wait_for, write_config

pytestmark = pytest.mark.slow

KEY_A, KEY_B = "sk-alpha", "sk-bravo"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
TTS = {"model": "tts", "input": "the kitchen light is on"}
OTHER_ADDRESS = "127.0.0.2"  # another client on the loopback network
ANSWER_S = 10.0  # how long a test waits for an answer it expects at once
#: Shorter than the 10 s a refused body's rest is read for (DRAIN_TIME_S).
REFUSED_BEFORE_DRAIN_S = 5.0


def _config(**server: Any) -> dict[str, Any]:
    cfg = base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
        tts={"kind": "tts", "class": "realtime", "memory": {"weights": "32MiB"}, "backend": fake()},
    )
    cfg["server"].update(server)
    return cfg


def _connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=ANSWER_S, source_address=(source, 0))
    return sock


def _head(url: str, method: str, path: str, *, key: str | None = None, **headers: str) -> bytes:
    host = url.removeprefix("http://")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _post(url: str, path: str, body: bytes, *, key: str | None = None) -> bytes:
    head = _head(
        url,
        "POST",
        path,
        key=key,
        Content_Type="application/json",
        Content_Length=str(len(body)),
        Connection="close",
    )
    return head + body


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer (head and Content-Length body), or what came before the close."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = _content_length(head)
            if length is not None and len(body) >= length:
                return data
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not chunk:
            return data
        data += chunk


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None


def _error(answer: bytes) -> tuple[int, str, bytes]:
    """(status, error.code, head) of an answer in OpenAI's error shape."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]["code"], head


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(ANSWER_S)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _ask(url: str, request: bytes, source: str = "127.0.0.1") -> bytes:
    with _connect(url, source) as sock:
        sock.sendall(request)
        return _read_answer(sock)


@contextmanager
def _busy(
    url: str, count: int, *, key: str | None = None, path: str = "/v1/chat/completions"
) -> Iterator[list[socket.socket]]:
    """``count`` connections, each with a request whose body is still on its way."""
    body = json.dumps(CHAT).encode()
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(_connect(url))
            sock.sendall(_post(url, path, body, key=key)[: -len(body) + 5])
            socks.append(sock)
        yield socks


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_one_address_holds_its_share_and_another_is_served(tmp_path: Path) -> None:
    path = write_config(_config(connections_per_address=5, header_timeout_s=60), tmp_path)
    with running(path) as d, _busy(d.url, 5):
        # its sixth connection is refused before it sends a byte, and closed
        with _connect(d.url) as sixth:
            answer = _read_answer(sixth)
            status, code, head = _error(answer)
            assert (status, code) == (429, "per_client_limit"), answer
            assert b"Connection: close" in head and b"Retry-After: 1" in head
            assert b"server.connections_per_address" in answer
            assert _closed_by_server(sixth)
        # another address is served, health and inference alike
        health = _ask(d.url, _head(d.url, "GET", "/health", Connection="close"), OTHER_ADDRESS)
        assert _status(health) == 200, health
        chat = _ask(
            d.url, _post(d.url, "/v1/chat/completions", json.dumps(CHAT).encode()), OTHER_ADDRESS
        )
        assert _status(chat) == 200, chat


def test_a_client_at_its_share_closes_its_own_idle_connection(tmp_path: Path) -> None:
    path = write_config(_config(connections_per_address=5, header_timeout_s=60), tmp_path)
    with running(path) as d, ExitStack() as stack:
        idle = [stack.enter_context(_connect(d.url)) for _ in range(5)]
        # once they are over a second old, a new request from the same address closes
        # the oldest of them rather than being refused
        wait_for(
            lambda: _status(_ask(d.url, _head(d.url, "GET", "/health", Connection="close"))) == 200
        )
        assert _closed_by_server(idle[0])


def test_one_key_holds_its_share_and_another_key_is_served(tmp_path: Path) -> None:
    cfg = _config(api_keys=[KEY_A, KEY_B], connections_per_key=3, header_timeout_s=60)
    path = write_config(cfg, tmp_path)
    body = json.dumps(CHAT).encode()
    with running(path) as d, _busy(d.url, 3, key=KEY_A):

        def refused() -> bytes | None:
            answer = _ask(d.url, _post(d.url, "/v1/chat/completions", body, key=KEY_A))
            return answer if _status(answer) == 429 else None

        answer = wait_for(refused, timeout=20)
        status, code, head = _error(answer)
        assert (status, code) == (429, "per_client_limit"), answer
        assert b"server.connections_per_key" in answer and b"Connection: close" in head
        other = _ask(d.url, _post(d.url, "/v1/chat/completions", body, key=KEY_B))
        assert _status(other) == 200, other


def test_the_reserve_answers_health_and_realtime_only(tmp_path: Path) -> None:
    cfg = _config(max_connections=8, reserved_connections=2, header_timeout_s=60)
    path = write_config(cfg, tmp_path)
    with running(path) as d, _busy(d.url, 6):
        chat = _post(d.url, "/v1/chat/completions", json.dumps(CHAT).encode())

        def refused() -> bytes | None:
            answer = _ask(d.url, chat)
            return answer if _status(answer) == 503 else None

        status, code, head = _error(wait_for(refused, timeout=20))
        assert (status, code) == (503, "too_many_connections") and b"Connection: close" in head
        health = _ask(d.url, _head(d.url, "GET", "/health", Connection="close"))
        assert _status(health) == 200, health
        speech = _ask(d.url, _post(d.url, "/v1/audio/speech", json.dumps(TTS).encode()))
        assert _status(speech) == 200, speech[:300]
        # a route no realtime service serves is refused at its headers, its body unsent
        with _connect(d.url) as sock:
            sock.sendall(_head(d.url, "GET", "/admin/status"))
            status, code, _ = _error(_read_answer(sock))
            assert (status, code) == (503, "too_many_connections")


def test_a_request_without_a_valid_key_is_refused_at_its_headers(tmp_path: Path) -> None:
    """Twice as many keyless requests as the cap, each with its body held back: each gets
    its 401 before sending the rest, and none keeps /health from being answered."""
    cfg = _config(api_keys=[KEY_A], max_connections=10, header_timeout_s=60, body_timeout_s=60)
    path = write_config(cfg, tmp_path)
    body = json.dumps(CHAT).encode()
    with running(path) as d:
        for key in (None, "sk-wrong"):
            with ExitStack() as stack:
                for _ in range(20):
                    sock = stack.enter_context(_connect(d.url))
                    sock.sendall(_post(d.url, "/v1/chat/completions", body, key=key)[:-10])
                    sock.settimeout(REFUSED_BEFORE_DRAIN_S)
                    answer = _read_answer(sock)
                    status, code, head = _error(answer)
                    assert (status, code) == (401, "invalid_api_key"), answer
                    assert b"Connection: close" in head
                health = _ask(d.url, _head(d.url, "GET", "/health", Connection="close"))
                assert _status(health) == 200, health


def test_a_body_slower_than_the_minimum_rate_is_cut_with_408(tmp_path: Path) -> None:
    cfg = _config(min_body_rate=200, body_rate_window_s=1.0, body_timeout_s=60)
    path = write_config(cfg, tmp_path)
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    with running(path) as d:
        # one byte every 0.1 s: 10 bytes/s, never a pause of body_timeout_s
        with _connect(d.url) as slow:
            request = _post(d.url, "/v1/chat/completions", body)
            slow.sendall(request[: -len(body)])
            slow.settimeout(0.1)
            answer = b""
            for byte in body:
                try:
                    slow.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    break
                try:
                    answer += slow.recv(65536)
                except TimeoutError:
                    continue
                if b"\r\n\r\n" in answer:
                    break
            slow.settimeout(ANSWER_S)
            answer += _read_answer(slow)
            status, code, _ = _error(answer)
            assert (status, code) == (408, "body_too_slow"), answer
            assert b"server.min_body_rate" in answer
        # the same body at 1,000 bytes/s, for longer than the window, is read whole
        with _connect(d.url) as steady:
            steady.sendall(request[: -len(body)])
            for i in range(0, len(body), 100):
                steady.sendall(body[i : i + 100])
                time.sleep(0.1)
            answer = _read_answer(steady)
            assert _status(answer) == 200, answer[:300]


def test_a_chunked_body_is_refused_when_it_crosses_its_limit(tmp_path: Path) -> None:
    """64 KiB limit, 80 KiB sent chunked and the rest held back: the 413 comes without
    the client sending more (it used to come only once the body's rest was given up on)."""
    path = write_config(_config(limits={"chat_body": "64KiB"}), tmp_path)
    with running(path) as d, _connect(d.url) as sock:
        sock.sendall(
            _head(
                d.url,
                "POST",
                "/v1/chat/completions",
                Content_Type="application/json",
                Transfer_Encoding="chunked",
            )
        )
        chunk = b"x" * 8192
        for _ in range(10):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        # a refused body's rest is read for up to 10 s (gateway/drain.py): an answer
        # that waited for it would come after that
        sock.settimeout(REFUSED_BEFORE_DRAIN_S)
        answer = _read_answer(sock)
        status, code, _ = _error(answer)
        assert (status, code) == (413, "body_too_large"), answer
        assert b"server.limits.chat_body" in answer


def test_origin_is_compared_by_scheme_host_and_port(tmp_path: Path) -> None:
    path = write_config(_config(), tmp_path)
    with running(path) as d:
        authority = d.url.removeprefix("http://")
        port = authority.rsplit(":", 1)[1]
        url = d.url + "/admin/services/chat/pin"
        for origin in (
            f"https://{authority}",
            "http://127.0.0.1",
            f"http://127.0.0.1:{int(port) + 1}",
        ):
            status, answer, _ = http("POST", url, headers={"Origin": origin})
            assert status == 403, (origin, answer)
            assert answer["error"]["code"] == "origin_not_allowed", answer
        for origin in (f"http://{authority}", f"HTTP://{authority}/"):
            status, answer, _ = http("POST", url, headers={"Origin": origin})
            assert status == 200, (origin, answer)


def test_an_undeclared_method_is_a_405_naming_the_allowed_ones(tmp_path: Path) -> None:
    path = write_config(_config(), tmp_path)
    with running(path) as d:
        for method, route, allowed in (
            ("TRACE", "/v1/models", "GET, HEAD"),
            ("DELETE", "/health", "GET, HEAD"),
            ("GET", "/v1/chat/completions", "POST"),
            ("PUT", "/admin/services/chat/pin", "POST"),
        ):
            status, answer, headers = http(method, d.url + route)
            assert status == 405, (method, route, answer)
            assert headers.get("Allow") == allowed, (method, route, headers)
            assert answer["error"]["code"] == "method_not_allowed"


def test_wyoming_answers_while_the_http_door_is_full(tmp_path: Path) -> None:
    from tests.live.support import free_port
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    port = free_port()
    cfg = _config(max_connections=8, reserved_connections=0, header_timeout_s=60)
    cfg["server"]["wyoming"] = {"host": "127.0.0.1", "port": port}

    async def describe() -> bool:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), ANSWER_S)
            return event is not None and Info.is_type(event.type)

    path = write_config(cfg, tmp_path)
    with running(path) as d, _busy(d.url, 8):

        def full() -> bool:
            answer = _ask(d.url, _head(d.url, "GET", "/health", Connection="close"))
            return _status(answer) == 503

        wait_for(full, timeout=20)
        assert asyncio.run(describe())


def test_an_address_that_keeps_failing_its_key_is_refused_at_accept(tmp_path: Path) -> None:
    """Past 100 key refusals in 10 s an address's new connections get the cheap refusal
    at accept; another address is served as before."""
    cfg = _config(api_keys=[KEY_A], connections_per_address=1000)
    path = write_config(cfg, tmp_path)
    body = json.dumps(CHAT).encode()
    with running(path) as d:
        request = _post(d.url, "/v1/chat/completions", body, key="sk-wrong")
        statuses = [_status(_ask(d.url, request)) for _ in range(101)]
        assert statuses == [401] * 101
        with _connect(d.url) as sock:  # refused before it sends anything
            status, code, head = _error(_read_answer(sock))
        assert (status, code) == (429, "per_client_limit") and b"Retry-After: 10" in head
        other = _ask(d.url, _post(d.url, "/v1/chat/completions", body, key=KEY_A), OTHER_ADDRESS)
        assert _status(other) == 200, other
