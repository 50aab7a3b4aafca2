"""Security: loopback by default, API and admin keys (constant-time checks), the admin API
and dashboard refused off loopback, no secret in logs or /metrics, argv never through a
shell, and per-key rate limits."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake, live, run
from tests.reliability.conftest import Record
from tests.reliability.support import http, running, service, wait_for, write_config

from accelmux.config.server import ServerConfig
from accelmux.gateway import middleware

MSG = [{"role": "user", "content": "hi"}]
API_KEY = "sk-inference-7f3a9c1e5b2d48a6"
API_KEY_2 = "sk-inference-second-0c9d8e7f"
ADMIN_KEY = "adm-secret-4b8e2f6a1d9c3e7b"


def _small() -> dict[str, Any]:
    return base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_loopback_by_default(record: Record) -> None:
    assert ServerConfig().host == "127.0.0.1"
    assert middleware.is_loopback("127.0.0.1") and middleware.is_loopback("::1")
    assert not middleware.is_loopback("0.0.0.0") and not middleware.is_loopback("")
    record(
        area="security",
        case="default listen address",
        expected="loopback unless configured",
        happened="server.host defaults to 127.0.0.1; 0.0.0.0 and '' count as off loopback",
    )


def test_keys_are_separate_and_compared_in_constant_time(
    tmp_path: Path, record: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _small()
    cfg["server"].update({"api_keys": [API_KEY, API_KEY_2, "third-key"], "admin_key": ADMIN_KEY})
    calls: list[int] = []
    real = middleware.hmac.compare_digest

    def counting(a: Any, b: Any) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(middleware.hmac, "compare_digest", counting)

    async def body() -> None:
        async with live(cfg, tmp=tmp_path, host="0.0.0.0") as lv:
            chat = {"model": "chat", "messages": MSG}
            cases = {
                "no key": (await lv.post("/v1/chat/completions", json=chat))[0],
                "wrong key": (
                    await lv.post("/v1/chat/completions", json=chat, headers=_bearer("nope"))
                )[0],
                "admin key on /v1": (
                    await lv.post("/v1/chat/completions", json=chat, headers=_bearer(ADMIN_KEY))
                )[0],
                "api key on /admin": (await lv.get("/admin/status", headers=_bearer(API_KEY)))[0],
                "no key on /admin": (await lv.get("/admin/status"))[0],
                "no key on /metrics": (await lv.get("/metrics"))[0],
            }
            calls.clear()
            ok = await lv.post("/v1/chat/completions", json=chat, headers=_bearer(API_KEY))
            first_key_calls = len(calls)
            admin_ok = (await lv.get("/admin/status", headers=_bearer(ADMIN_KEY)))[0]
            models = (await lv.get("/v1/models", headers=_bearer(API_KEY_2)))[0]
            assert all(code == 401 for code in cases.values()), cases
            assert ok[0] == 200 and admin_ok == 200 and models == 200
            # the first key matched, yet every key was compared: no early exit
            assert first_key_calls == 3, first_key_calls
            record(
                area="security",
                case="bearer API keys and a separate admin key",
                expected="401 without the right key; admin and inference keys not "
                "interchangeable; constant-time comparison",
                happened=f"{cases} -> 401; right keys -> 200; hmac.compare_digest called for "
                "all 3 keys even when the first matched",
            )

    run(body())


def test_admin_and_dashboard_refused_off_loopback(tmp_path: Path, record: Record) -> None:
    async def body() -> None:
        async with live(_small(), tmp=tmp_path / "a", host="0.0.0.0", extras=True) as lv:
            open_ = {p: (await lv.get(p))[0] for p in ("/", "/admin/status", "/metrics")}
            assert all(code == 403 for code in open_.values()), open_
            assert (await lv.get("/dashboard/dashboard.js"))[0] == 403
            assert (await lv.get("/health"))[0] == 200
        cfg = _small()
        cfg["server"]["admin_key"] = ADMIN_KEY
        async with live(cfg, tmp=tmp_path / "b", host="0.0.0.0", extras=True) as lv:
            async with lv.session.get(lv.url + "/") as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"].startswith("Basic")
            basic = base64.b64encode(f"admin:{ADMIN_KEY}".encode()).decode()
            page = await lv.get("/", headers={"Authorization": f"Basic {basic}"})
            assert page[0] == 200
            assert (await lv.get("/", headers=_bearer(ADMIN_KEY)))[0] == 200
            wrong = base64.b64encode(b"admin:wrong").decode()
            assert (await lv.get("/", headers={"Authorization": f"Basic {wrong}"}))[0] == 401
        async with live(_small(), tmp=tmp_path / "c", extras=True) as lv:  # loopback
            assert (await lv.get("/"))[0] == 200 and (await lv.get("/admin/status"))[0] == 200
        record(
            area="security",
            case="admin API and dashboard off loopback",
            expected="refused without the admin key whenever not on loopback",
            happened=f"without admin_key: {open_} (403); with admin_key: / answers 401 + "
            "WWW-Authenticate: Basic, 200 with the key (Bearer or Basic password); on "
            "loopback without a key: open",
        )

    run(body())


@pytest.mark.slow
def test_no_secret_in_logs_metrics_or_status(tmp_path: Path, record: Record) -> None:
    cfg = _small()
    cfg["server"].update(
        {"api_keys": [API_KEY], "admin_key": ADMIN_KEY, "access_log": True, "jobs": True}
    )
    path = write_config(cfg, tmp_path)
    texts: dict[str, str] = {}
    with running(path, log_name="secrets") as d:
        for key in (API_KEY, "sk-wrong-guess-123456", ADMIN_KEY):
            http(
                "POST",
                d.url + "/v1/chat/completions",
                {"model": "chat", "messages": MSG},
                headers=_bearer(key),
            )
            http(
                "POST",
                d.url + "/v1/embeddings",
                {"model": "embed", "input": "x"},
                headers=_bearer(key),
            )
            http("GET", d.url + "/admin/status", headers=_bearer(key))
        http(
            "POST",
            d.url + "/v1/jobs",
            {"model": "embed", "inputs": ["a"]},
            headers=_bearer(API_KEY),
        )
        # a key sent in a bad body, and to an unknown route
        http("POST", d.url + "/v1/chat/completions", {"model": API_KEY}, headers=_bearer(API_KEY))
        http("GET", d.url + "/nowhere", headers=_bearer(ADMIN_KEY))
        for p in ("/metrics", "/admin/status", "/admin/history"):
            status, body, _ = http("GET", d.url + p, headers=_bearer(ADMIN_KEY))
            assert status == 200, (p, body)
            texts[p] = body if isinstance(body, str) else json.dumps(body)
    log = d.log.read_text()
    texts["log"] = log
    assert "/v1/chat/completions" in log  # the access log was on
    leaks = {where: [k for k in (API_KEY, ADMIN_KEY) if k in text] for where, text in texts.items()}
    assert not any(leaks.values()), leaks
    record(
        area="security",
        case="secrets in logs, /metrics, /admin/status, /admin/history",
        expected="no key string appears",
        happened="keys configured, requests with right, wrong and admin keys (access log on): "
        "no key in the daemon log, /metrics, /admin/status or /admin/history",
        lost="nothing",
    )


@pytest.mark.slow
def test_argv_with_shell_metacharacters_is_passed_literally(tmp_path: Path, record: Record) -> None:
    marker = tmp_path / "pwned"
    hostile = [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"; touch {marker}",
        f"| touch {marker} &&",
        "${{HOME}} ~ * ?",
        "'quoted' \"double\" \\ \n newline",
    ]
    expected = [*hostile[:4], "${HOME} ~ * ?", hostile[5]]
    out = tmp_path / "argv.json"
    probe = Path(__file__).with_name("argv_probe.py")
    cfg = base_config(
        probe={
            "kind": "chat",
            "residency": "pinned",
            "memory": {"weights": "64MiB"},
            "backend": {
                "type": "external",
                "argv": [sys.executable, str(probe), str(out), "{port}", *hostile],
                "startup_timeout_s": 20,
                "stop_grace_s": 2,
            },
        }
    )
    path = write_config(cfg, tmp_path)
    with running(path, log_name="argv") as d:
        wait_for(
            lambda: service(http("GET", d.url + "/admin/status")[1], "probe")["state"] == "loaded"
        )
    got = json.loads(out.read_text())
    assert got == expected, got
    assert not marker.exists()
    record(
        area="security",
        case="backend argv with shell metacharacters",
        expected="passed literally, never through a shell",
        happened="$(...), backticks, ';', '|', '&&', globs, quotes and newlines reached the "
        "child unchanged; nothing was executed",
    )


def test_rate_limit_per_key(tmp_path: Path, record: Record) -> None:
    cfg = _small()
    cfg["server"].update(
        {"api_keys": [API_KEY, API_KEY_2], "rate_limit": {"requests_per_s": 2, "burst": 3}}
    )

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            one = [
                await lv.post(
                    "/v1/embeddings",
                    json={"model": "embed", "input": "x"},
                    headers=_bearer(API_KEY),
                )
                for _ in range(5)
            ]
            codes = [a[0] for a in one]
            assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429], codes
            err, headers = one[3][1], one[3][2]
            assert err["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1
            other = await lv.post(
                "/v1/embeddings", json={"model": "embed", "input": "x"}, headers=_bearer(API_KEY_2)
            )
            assert other[0] == 200  # another key has its own bucket
            started = time.monotonic()
            while True:
                again = await lv.post(
                    "/v1/embeddings",
                    json={"model": "embed", "input": "x"},
                    headers=_bearer(API_KEY),
                )
                if again[0] == 200 or time.monotonic() - started > 5:
                    break
                await _sleep(0.1)
            assert again[0] == 200
            record(
                area="security",
                case="per-key rate limit (2/s, burst 3)",
                expected="429 with Retry-After beyond the rate; other keys unaffected",
                happened=f"key A: {codes} (Retry-After {headers['Retry-After']}s); key B: 200; "
                f"key A served again after {time.monotonic() - started:.1f}s",
            )

    run(body())


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
