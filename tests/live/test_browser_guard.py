"""The browser guard, rule by rule, with aiohttp and raw sockets: a Host the daemon does
not answer to (DNS rebinding), a state-changing request from another origin, a JSON route
fed a content type a browser sends cross-site, and CORS only for configured origins."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.live.support import base_config, fake, live, run

from accelmux.gateway.guard import HostRule, host_name

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": "chat", "messages": MSG}


def _config(**server: Any) -> dict[str, Any]:
    cfg = base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
        asr={
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "memory": {"weights": "64MiB"},
            "backend": fake(),
        },
    )
    cfg["server"].update(server)
    return cfg


async def _raw(url: str, request: bytes) -> tuple[int, dict[str, Any], str]:
    """One request written as is; answers (status, JSON body, raw head)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        # closed and waited for: a transport left to the garbage collector after the
        # loop ends warns (ResourceWarning) in whichever test runs next
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else {}, head.decode()


def _get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


def _asr_loaded(lv: Any) -> bool:
    state = lv.runtime.status()
    return any(s["name"] == "asr" and s["state"] == "loaded" for s in state["services"])


def test_host_names_are_parsed_and_matched() -> None:
    assert host_name("LocalHost:8600") == "localhost"
    assert host_name("[::1]:8600") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("evil.example.:80") == "evil.example"
    assert host_name("a:b") is None and host_name("[::1]x") is None
    loopback = HostRule.of(None, "127.0.0.1")
    assert all(loopback.allows(h) for h in ("localhost:1", "127.0.0.1:8600", "[::1]:8600"))
    assert not loopback.allows("evil.example:8600") and not loopback.allows("10.0.0.5")
    lan = HostRule.of(None, "192.168.1.5")
    assert lan.allows("192.168.1.5:8600") and not lan.allows("192.168.1.6")
    everywhere = HostRule.of(None, "0.0.0.0")
    assert everywhere.allows("192.168.1.6:8600") and not everywhere.allows("evil.example")
    named = HostRule.of(["accel.example", "*.home.arpa"], "127.0.0.1")
    assert named.allows("accel.example:443") and named.allows("gpu.home.arpa")
    assert not named.allows("localhost") and not named.allows("home.arpa.evil.example")
    assert HostRule.of(["*"], "127.0.0.1").allows("anything.example")


@given(st.ip_addresses(), st.integers(min_value=1, max_value=65535))
def test_an_address_host_names_that_address(address: Any, port: int) -> None:
    text = f"[{address}]" if address.version == 6 else str(address)
    assert host_name(f"{text}:{port}") == str(address)
    assert host_name(text) == str(address)
    assert HostRule.of(None, "0.0.0.0").allows(f"{text}:{port}")
    loopback_only = HostRule.of(None, "127.0.0.1")
    assert loopback_only.allows(f"{text}:{port}") == (str(address) in ("127.0.0.1", "::1"))


def test_foreign_host_is_refused_but_health_answers(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_config(), tmp=tmp_path) as lv:
            status, answer, _ = await _raw(lv.url, _get("/admin/status", "evil.example:8600"))
            assert status == 403, answer
            assert answer["error"]["code"] == "host_not_allowed"
            assert "evil.example" in answer["error"]["message"]
            assert "server.allowed_hosts" in answer["error"]["message"]
            for path in ("/v1/models", "/", "/metrics"):
                assert (await _raw(lv.url, _get(path, "evil.example")))[0] == 403, path
            assert (await _raw(lv.url, _get("/health", "evil.example")))[0] == 200
            for host in ("localhost:1234", "127.0.0.1", "[::1]:8600"):
                assert (await _raw(lv.url, _get("/admin/status", host)))[0] == 200, host

    run(body())


def test_allowed_hosts_configured_and_star(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = _config(allowed_hosts=["accel.example"])
        async with live(cfg, tmp=tmp_path) as lv:
            assert (await _raw(lv.url, _get("/admin/status", "accel.example")))[0] == 200
            assert (await _raw(lv.url, _get("/admin/status", "localhost")))[0] == 403
        async with live(_config(allowed_hosts=["*"]), tmp=tmp_path) as lv:
            assert (await _raw(lv.url, _get("/admin/status", "evil.example")))[0] == 200

    run(body())


def test_cross_origin_form_post_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_config(), tmp=tmp_path) as lv:
            form = {
                "Origin": "http://evil.example",
                "Content-Type": "application/x-www-form-urlencoded",
            }
            for op in ("unpin", "unload"):
                status, answer, _ = await lv.post(
                    f"/admin/services/asr/{op}", headers=form, data="x=1"
                )
                assert status == 403, answer
                assert answer["error"]["code"] == "origin_not_allowed"
                assert "http://evil.example" in answer["error"]["message"]
                assert "server.cors_origins" in answer["error"]["message"]
            # without a body, as fetch(..., {method: "POST"}) from the other page sends it
            status, answer, _ = await lv.post(
                "/admin/services/asr/unpin", headers={"Origin": "http://evil.example"}
            )
            assert status == 403, answer
            status, answer, _ = await lv.post(
                "/admin/services/asr/unpin", headers={"Sec-Fetch-Site": "cross-site"}
            )
            assert status == 403 and answer["error"]["code"] == "origin_not_allowed", answer
            status, answer, _ = await lv.post(
                "/admin/services/asr/unpin", headers={"Origin": "null"}
            )
            assert status == 403, answer
            assert _asr_loaded(lv)
            # the daemon's own page (same origin) and clients that send no Origin pass
            own = {"Origin": lv.url, "Sec-Fetch-Site": "same-origin"}
            status, answer, _ = await lv.post("/admin/services/asr/unpin", headers=own)
            assert status == 200, answer
            status, answer, _ = await lv.post("/admin/services/asr/unload")
            assert status == 200, answer

    run(body())


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_json_route_refuses_simple_content_types(tmp_path: Path, content_type: str) -> None:
    async def body() -> None:
        async with live(_config(), tmp=tmp_path) as lv:
            status, answer, _ = await lv.post(
                "/v1/chat/completions",
                data=json.dumps(CHAT),
                headers={"Content-Type": content_type},
            )
            assert status == 415, answer
            assert answer["error"]["code"] == "unsupported_media_type"
            assert "application/json" in answer["error"]["message"]
            assert content_type.split(";", maxsplit=1)[0] in answer["error"]["message"]
            status, answer, _ = await lv.post("/v1/chat/completions", json=CHAT)
            assert status == 200, answer

    run(body())


def test_uploads_take_multipart_but_not_text_plain(tmp_path: Path) -> None:
    async def body() -> None:
        async with live(_config(), tmp=tmp_path) as lv:
            status, answer, _ = await lv.post(
                "/v1/audio/transcriptions", data="x", headers={"Content-Type": "text/plain"}
            )
            assert status == 415 and "multipart/form-data" in answer["error"]["message"], answer
            import aiohttp

            form = aiohttp.FormData()
            form.add_field("model", "asr")
            form.add_field("file", b"RIFF....WAVE", filename="a.wav", content_type="audio/wav")
            status, answer, _ = await lv.post("/v1/audio/transcriptions", data=form)
            assert status != 415, answer
            # a multipart upload from another site is refused by its Origin
            form = aiohttp.FormData()
            form.add_field("model", "asr")
            form.add_field("file", b"RIFF....WAVE", filename="a.wav", content_type="audio/wav")
            status, answer, _ = await lv.post(
                "/v1/audio/transcriptions", data=form, headers={"Origin": "http://evil.example"}
            )
            assert status == 403 and answer["error"]["code"] == "origin_not_allowed", answer

    run(body())


def test_cors_only_for_configured_origins(tmp_path: Path) -> None:
    app_origin = "https://app.example:8443"

    async def body() -> None:
        async with (
            live(_config(), tmp=tmp_path) as lv,
            lv.session.options(
                lv.url + "/v1/chat/completions",
                headers={"Origin": app_origin, "Access-Control-Request-Method": "POST"},
            ) as resp,
        ):
            assert resp.status == 403
            assert "Access-Control-Allow-Origin" not in resp.headers
        async with live(_config(cors_origins=[app_origin]), tmp=tmp_path) as lv:
            preflight = {
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            }
            async with lv.session.options(
                lv.url + "/v1/chat/completions", headers=preflight
            ) as resp:
                assert resp.status == 204
                assert resp.headers["Access-Control-Allow-Origin"] == app_origin
                assert "POST" in resp.headers["Access-Control-Allow-Methods"]
                assert resp.headers["Access-Control-Allow-Headers"] == "authorization,content-type"
            status, answer, headers = await lv.post(
                "/v1/chat/completions", json=CHAT, headers={"Origin": app_origin}
            )
            assert status == 200, answer
            assert headers["Access-Control-Allow-Origin"] == app_origin
            status, answer, headers = await lv.post(
                "/v1/chat/completions", json=CHAT, headers={"Origin": "https://other.example"}
            )
            assert status == 403 and "Access-Control-Allow-Origin" not in headers, answer

    run(body())
