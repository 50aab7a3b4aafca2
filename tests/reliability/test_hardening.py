"""Attacks from outside a running daemon, each over real HTTP on loopback: hostile bodies,
malformed HTTP, answers without a request id, credentials shown back, an open listener,
an operator unloading a pinned service, and configs that `check` passed but `serve` could
not run."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import yaml
from tests.live.support import base_config, fake, free_port, live, run, settle
from tests.reliability.conftest import Record
from tests.reliability.support import http, running, service, wait_for, write_config

from accelmux.backends.external import ExternalBackend
from accelmux.config.backends import ARGV_PLACEHOLDERS, ExternalBackendConfig
from accelmux.core.types import Reason, ServiceStatus
from accelmux.gateway import parse
from accelmux.gateway.middleware import HTTP_ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "accelmux"
MSG = [{"role": "user", "content": "hi"}]
DEEP = 100_000


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def _small() -> dict[str, Any]:
    return base_config(
        chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": fake()},
        embed={"kind": "embeddings", "memory": {"weights": "64MiB"}, "backend": fake()},
    )


# ---- hostile bodies --------------------------------------------------------------------
def test_deeply_nested_json_is_a_400_naming_the_problem(
    tmp_path: Path, record: Record, caplog: pytest.LogCaptureFixture
) -> None:
    deep = '{"model": "chat", "messages": ' + "[" * DEEP + "]" * DEEP + "}"
    moderate = {
        "model": "chat",
        "messages": [{"role": "user", "content": "x", "n": [[[[[[[1]]]]]]]}],
    }
    seen: dict[str, tuple[int, str]] = {}

    async def body() -> None:
        async with live(_small(), tmp=tmp_path, extras=True) as lv:
            for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/jobs"):
                status, out, headers = await lv.post(
                    path, data=deep.encode(), headers={"Content-Type": "application/json"}
                )
                assert status == 400, (path, status, out)
                assert out["error"]["code"] == "json_too_deep", out
                assert "deep" in out["error"]["message"], out
                assert headers.get("X-Request-Id"), headers
                seen[path] = (status, out["error"]["code"])
            # a body nested a little is still served
            status, out, _ = await lv.post("/v1/chat/completions", json=moderate)
            assert status == 200, out

    with caplog.at_level(logging.INFO):
        run(body())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert "RecursionError" not in caplog.text
    record(
        area="bad input",
        case=f"JSON body nested {DEEP:,} levels deep (chat, embeddings, jobs)",
        expected="400 naming the problem, no traceback",
        happened=f"{seen}; a body nested 8 levels is served (200); no ERROR log record",
    )


def test_too_large_names_the_field_that_sized_the_demand(tmp_path: Path, record: Record) -> None:
    cfg = base_config()
    cfg["services"]["asr"]["memory"]["per_unit"] = "64MiB"  # per second of audio
    wav_header = _wav(60)

    async def body() -> dict[str, str]:
        async with live(cfg, tmp=tmp_path) as lv:
            form = aiohttp.FormData()
            form.add_field("model", "asr")
            form.add_field("file", wav_header, filename="a.wav", content_type="audio/wav")
            status, out, _ = await lv.post("/v1/audio/transcriptions", data=form)
            assert status == 413 and out["error"]["code"] == "too_large", out
            params = {"transcription": out["error"]["param"]}
            status, out, _ = await lv.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "w " * 200_000}]},
            )
            assert status == 413, out
            params["chat"] = out["error"]["param"]
            return params

    params = run(body())
    assert params == {"transcription": "file", "chat": "messages"}, params
    assert set(parse.DEMAND_PARAM) == set(parse.ENDPOINT_KINDS)
    record(
        area="bad input",
        case="413 too_large on a transcription and on a chat",
        expected="error.param names the field that sized the demand",
        happened=f"param per endpoint: {params}",
    )


def _wav(seconds: float, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return buf.getvalue()


# ---- X-Request-Id on every answer --------------------------------------------------------
def test_every_answer_carries_a_request_id(tmp_path: Path, record: Record) -> None:
    cfg = _small()
    cfg["server"]["max_body"] = "1KiB"
    statuses: dict[str, int] = {}

    async def body() -> None:
        async with live(cfg, tmp=tmp_path, extras=True) as lv:
            session = lv.session
            chat = "/v1/chat/completions"
            as_json = {"Content-Type": "application/json"}
            cases: list[tuple[str, str, str, dict[str, Any]]] = [
                ("200 chat", "POST", chat, {"json": {"model": "chat", "messages": MSG}}),
                ("400 bad JSON", "POST", chat, {"data": b"{", "headers": as_json}),
                ("400 bad field", "POST", chat, {"json": {"model": "chat"}}),
                ("404 unknown path", "GET", "/nowhere", {}),
                ("404 unknown model", "POST", chat, {"json": {"model": "x", "messages": MSG}}),
                ("405 wrong method", "GET", chat, {}),
                ("413 body_too_large", "POST", chat, {"data": b"x" * 4096, "headers": as_json}),
                ("404 job", "GET", "/v1/jobs/nope", {}),
                ("200 health", "GET", "/health", {}),
                ("200 status", "GET", "/admin/status", {}),
            ]
            ids = set()
            for name, method, path, kw in cases:
                async with session.request(method, lv.url + path, **kw) as resp:
                    await resp.read()
                    statuses[name] = resp.status
                    rid = resp.headers.get("X-Request-Id")
                    assert rid, (name, resp.status, dict(resp.headers))
                    ids.add(rid)
            assert len(ids) == len(cases)  # one id per answer
            # the id of a refused request is the one /admin/explain knows
            _, _, headers = await lv.post(
                "/v1/chat/completions", json={"model": "chat", "messages": MSG}
            )
            assert (await lv.get(f"/admin/explain/{headers['X-Request-Id']}"))[0] == 200

    run(body())
    for name, status in statuses.items():
        assert name.startswith(str(status)), (name, status)
    record(
        area="bad input",
        case="X-Request-Id on 200, 400, 404, 405 and 413 body_too_large answers",
        expected="every answer carries X-Request-Id",
        happened=f"{len(statuses)} kinds of answer ({', '.join(statuses)}), each with its own id",
    )


# ---- malformed HTTP ----------------------------------------------------------------------
def _raw(url: str, payload: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


@pytest.mark.slow
def test_malformed_http_is_a_400_and_one_log_line(tmp_path: Path, record: Record) -> None:
    path = write_config(_small(), tmp_path)
    cases = {
        "bare CR in a header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
        "duplicate Content-Length": (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Content-Length: 3\r\nContent-Type: application/json\r\n\r\n{}"
        ),
        "NUL in the request line": b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    answers: dict[str, str] = {}
    with running(path, log_name="malformed") as d:
        for name, payload in cases.items():
            answer = _raw(d.url, payload)
            answers[name] = answer.split(b"\r\n", 1)[0].decode()
            assert re.match(rb"HTTP/1\.[01] 400 ", answer), (name, answer[:200])
        assert http("GET", d.url + "/health")[0] == 200  # still serving
    log = d.log.read_text()
    assert "Traceback" not in log, log
    assert " ERROR " not in log, log
    lines = [line for line in log.splitlines() if "malformed HTTP request" in line]
    assert len(lines) == len(cases), log
    assert all(" INFO " in line for line in lines), lines
    record(
        area="bad input",
        case=f"malformed HTTP ({', '.join(cases)})",
        expected="400, one log line below ERROR, no traceback",
        happened=f"answers {sorted(set(answers.values()))}; {len(lines)} INFO lines; "
        "no traceback; the daemon kept serving",
    )


# ---- credentials shown back --------------------------------------------------------------
CAMERA_USER, CAMERA_PASSWORD, CAMERA_TOKEN = "camuser", "hunter2-cam-pw", "tok-5e6f7a8b"


@pytest.mark.slow
def test_camera_credentials_are_masked_and_its_last_error_is_reported(
    tmp_path: Path, record: Record
) -> None:
    port = free_port()  # nothing listens there: every frame read or load fails
    source = (
        f"rtsp://{CAMERA_USER}:{CAMERA_PASSWORD}@127.0.0.1:{port}/stream"
        f"?password={CAMERA_PASSWORD}&token={CAMERA_TOKEN}&channel=1"
    )
    junk_model = tmp_path / "broken-cascade.xml"
    junk_model.write_text("not a model")
    camera = {"kind": "camera", "class": "background", "memory": {"weights": "64MiB"}}
    cfg = base_config(
        cam={
            **camera,
            "backend": {"type": "worker", "options": {"source": source, "fps": 2.0}},
        },
        # a second camera whose model never loads: every frame is refused load_failed
        broken={
            **camera,
            "backend": {
                "type": "worker",
                "model_path": str(junk_model),
                "isolated": True,
                "options": {"source": source, "fps": 2.0},
            },
        },
    )
    path = write_config(cfg, tmp_path)
    with running(path, log_name="camera", timeout=60) as d:

        def cameras() -> Any:
            status, out, _ = http("GET", d.url + "/v1/cameras")
            assert status == 200, out
            return out if all(c["last_error"] for c in out["data"]) else None

        listed = wait_for(cameras, timeout=90, every=0.5)
        status_body = http("GET", d.url + "/admin/status")[1]
        page = http("GET", d.url + "/")[1]
    cam, broken = sorted(listed["data"], key=lambda c: c["name"] != "cam")
    assert broken["last_error"].startswith("load failed: "), broken
    texts = {
        "/v1/cameras": json.dumps(listed),
        "/admin/status": json.dumps(status_body),
        "dashboard": str(page),
        "log": d.log.read_text(),
    }
    leaks = {
        where: [s for s in (CAMERA_PASSWORD, CAMERA_TOKEN, f"{CAMERA_USER}:") if s in text]
        for where, text in texts.items()
    }
    assert not any(leaks.values()), leaks
    assert cam["source"].startswith("rtsp://***@127.0.0.1"), cam
    assert "password=***" in cam["source"] and "channel=1" in cam["source"], cam
    assert cam["errors"] >= 1 and cam["last_error"], cam
    record(
        area="security",
        case="a camera source with credentials (user:password@, ?password=, token=) that "
        "never answers",
        expected="credentials masked in /v1/cameras, /admin/status, the log and the "
        "dashboard; last_error tells why frames fail",
        happened=f"source shown as {cam['source']!r}; last_error {cam['last_error'][:80]!r}; "
        f"a camera whose model cannot load: last_error {broken['last_error'][:60]!r}; "
        f"no secret in {', '.join(texts)}",
    )


def test_child_output_in_status_is_masked(tmp_path: Path, record: Record) -> None:
    secret = "hf_Zx8Qw2Lm4Np6Rt0"
    bearer = "sk-upstream-9a8b7c6d"
    script = (
        "import os, sys; "
        "print('HF_TOKEN=' + os.environ['HF_TOKEN']); "
        "print('OPENAI_API_KEY=' + os.environ['HF_TOKEN'] + ' PATH=/usr/bin'); "
        f"print('calling with Authorization: Bearer {bearer}'); "
        f"print('mirror https://bob:{secret}@example.org/x?token={secret}'); "
        "sys.stdout.flush(); sys.exit(3)"
    )
    backend = {
        "type": "external",
        "argv": [sys.executable, "-c", script],
        "env": {"HF_TOKEN": secret},
        "startup_timeout_s": 10,
    }
    cfg = base_config(chat={"kind": "chat", "memory": {"weights": "64MiB"}, "backend": backend})

    async def body() -> tuple[Any, str]:
        async with live(cfg, tmp=tmp_path) as lv:
            status, out, _ = await lv.post(
                "/v1/chat/completions", json={"model": "chat", "messages": MSG}
            )
            assert status >= 500, out
            await settle(lambda: "chat" in lv.runtime.last_errors)
            st = (await lv.get("/admin/status"))[1]
            return st, json.dumps(out)

    status_body, answer = run(body())
    chat = service(status_body, "chat")
    tail = chat["backend"]["log_tail"]
    text = json.dumps(status_body) + answer
    assert secret not in text and bearer not in text, tail
    assert any("HF_TOKEN=***" in line for line in tail), tail
    assert any("PATH=/usr/bin" in line for line in tail), tail  # not a secret: kept
    raw_log = (tmp_path / "logs" / "chat.log").read_text()
    assert secret in raw_log  # the operator's file keeps the raw output
    assert (tmp_path / "logs" / "chat.log").stat().st_mode & 0o077 == 0
    record(
        area="security",
        case="a child server prints its environment, a bearer token and URL credentials",
        expected="masked in /admin/status log_tail, last_error and the client's answer",
        happened=f"log_tail shows {[line for line in tail if '***' in line][:2]}; the raw "
        "output is only in data_dir/logs/chat.log (mode 0600)",
    )


def test_argv_placeholders_match_what_the_backend_fills() -> None:
    cfg = ExternalBackendConfig(type="external", argv=["x"])
    backend = ExternalBackend("s", "m", cfg)
    assert set(backend._values(1)) == set(ARGV_PLACEHOLDERS)


# ---- an open listener --------------------------------------------------------------------
@pytest.mark.slow
def test_non_loopback_host_without_keys_refuses_to_start(tmp_path: Path, record: Record) -> None:
    path = write_config(_small(), tmp_path)
    port = str(free_port())
    refused = {}
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        out = _cli("serve", "-c", str(path), "--host", host, "--port", port)
        assert out.returncode != 0, (host, out.stdout, out.stderr)
        assert "api_keys" in out.stderr and "allow" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "listening" not in out.stdout, out
        refused[host] = out.stderr.strip().splitlines()[-1]
    # an explicit flag, or keys, lets it start on every address
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = {}
    for extra, server in (("--allow-open", {}), ("", {"api_keys": ["sk-a1b2c3d4"]})):
        cfg = _small()
        cfg["server"].update(server)
        cfg_path = write_config(cfg, tmp_path, name=f"open-{bool(extra)}.yaml")
        port = str(free_port())
        argv = [sys.executable, "-m", "accelmux.cli", "serve", "-c", str(cfg_path)]
        argv += ["--host", "0.0.0.0", "--port", port, *([extra] if extra else [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(lambda p=port: _healthy(p), timeout=30)  # type: ignore[misc]
            started[extra or "api_keys"] = True
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            assert proc.stdout is not None
            proc.stdout.close()
    record(
        area="security",
        case="serve on a non-loopback host (0.0.0.0, ::, a LAN address) without API keys",
        expected="refused with the reason, unless keys are set or --allow-open says so",
        happened=f"exit status 1 with {next(iter(refused.values()))!r}; started with "
        f"{', '.join(started)}",
    )


def _healthy(port: str) -> bool:
    try:
        return http("GET", f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200
    except OSError:
        return False


# ---- the operator unloads a pinned service -------------------------------------------------
def test_unload_of_a_pinned_service_is_refused_until_unpinned(
    tmp_path: Path, record: Record
) -> None:
    async def body() -> list[tuple[str, int, Any]]:
        async with live(tmp=tmp_path) as lv:
            w = lv.runtime.manager.world
            steps: list[tuple[str, int, Any]] = []
            await settle(lambda: w.services["asr"].is_up)  # pinned by config
            status, out, headers = await lv.post("/admin/services/asr/unload")
            steps.append(("unload pinned asr", status, out["error"]["code"]))
            assert status == 409 and out["error"]["code"] == "service_pinned", out
            assert "unpin" in out["error"]["message"], out
            assert headers.get("X-Request-Id")
            await lv.post("/admin/services/image/load")
            await settle(lambda: w.services["image"].is_up)
            status, out, _ = await lv.post("/admin/services/image/pin")
            assert out["pinned"] is True
            status, out, _ = await lv.post("/admin/services/image/unload")
            steps.append(("unload image pinned by the API", status, out["error"]["code"]))
            assert status == 409
            await asyncio.sleep(0.2)
            assert w.services["asr"].pinned and w.services["asr"].is_up
            assert w.services["image"].pinned and w.services["image"].is_up
            status, out, _ = await lv.post("/admin/services/image/unpin")
            status, out, _ = await lv.post("/admin/services/image/unload")
            steps.append(("unpin, then unload image", status, out["pinned"]))
            assert status == 200 and out["pinned"] is False
            await settle(lambda: w.services["image"].status is ServiceStatus.UNLOADED)
            return steps

    steps = run(body())
    record(
        area="security",
        case="POST /admin/services/NAME/unload on a pinned service",
        expected="refused with 409 naming the pin; unpin first, then unload",
        happened="; ".join(f"{name}: {status} {what}" for name, status, what in steps),
    )


# ---- every error code is documented ----------------------------------------------------------
def _string_constants(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _emitted_codes() -> set[str]:
    codes: set[str] = set()
    files = [
        *sorted((SRC / "gateway").glob("*.py")),
        SRC / "jobs" / "http.py",
        SRC / "cameras" / "http.py",
        SRC / "backends" / "worker.py",
    ]
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "code":
                codes |= _string_constants(node.value)
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (  # "code": a string (not openapi.py's schema of the field)
                        isinstance(key, ast.Constant)
                        and key.value == "code"
                        and not isinstance(value, ast.Dict)
                    ):
                        codes |= _string_constants(value)
    codes |= set(HTTP_ERROR_CODES.values())
    # the Manager's refusals: every reason a Reject or Fail can carry becomes error.code
    ending = {"reject", "fail", "Reject", "Fail"}
    for path in sorted((SRC / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name not in ending:
                continue
            for kw in node.keywords:
                value = kw.value
                if (
                    kw.arg == "reason"
                    and isinstance(value, ast.Attribute)
                    and isinstance(value.value, ast.Name)
                    and value.value.id == "Reason"
                ):
                    codes.add(Reason[value.attr].value)
    codes.add(Reason.BACKEND_CRASHED.value)  # BackendCrashed's default reason
    codes.discard("code")
    return codes


def test_every_error_code_is_documented(record: Record) -> None:
    docs = "\n".join(
        p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    )
    documented = set(re.findall(r"`([a-z_]+)`", docs))
    codes = _emitted_codes()
    assert {"backend_error", "backend_crashed", "too_large", "json_too_deep"} <= codes
    missing = sorted(codes - documented)
    assert not missing, f"error codes the gateway emits but no doc names: {missing}"
    # and every ApiError the gateway raises names its code
    for path in sorted((SRC / "gateway").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "ApiError"
                and not any(kw.arg == "code" for kw in node.keywords)
            ):
                raise AssertionError(f"{path.name}:{node.lineno}: ApiError without a code")
    record(
        area="bad input",
        case="error codes against the docs",
        expected="every error.code the gateway, jobs, cameras and hosted models can emit is "
        "documented",
        happened=f"{len(codes)} codes found in the source, all named in README.md/docs",
    )


# ---- configs that check passed and serve could not run ------------------------------------
def _valid() -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB"}},
        "services": {
            "chat": {"kind": "chat", "memory": {"weights": "1GiB"}, "backend": {"type": "fake"}}
        },
    }


def _external(argv: list[str]) -> dict[str, Any]:
    return {
        "kind": "chat",
        "memory": {"weights": "1GiB"},
        "backend": {"type": "external", "argv": argv},
    }


def test_check_reports_what_serve_could_not_run(tmp_path: Path, record: Record) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ram = int(psutil.virtual_memory().total)
    cases: dict[str, tuple[dict[str, Any], list[str]]] = {
        "argv placeholder typo": (
            {**_valid(), "services": {"chat": _external([sys.executable, "--port", "{prot}"])}},
            ["services.chat.backend.argv[2]", "{prot}", "{port}"],
        ),
        "malformed placeholder": (
            {**_valid(), "services": {"chat": _external([sys.executable, "--x", "{port"])}},
            ["services.chat.backend.argv[2]", "malformed"],
        ),
        "missing executable": (
            {**_valid(), "services": {"chat": _external(["llama-server-not-installed", "{port}"])}},
            ["services.chat.backend.argv[0]", "llama-server-not-installed", "PATH"],
        ),
        "missing executable path": (
            {**_valid(), "services": {"chat": _external(["/opt/none/llama-server", "{port}"])}},
            ["services.chat.backend.argv[0]", "/opt/none/llama-server"],
        ),
        "host budget above the RAM": (
            {
                **_valid(),
                "devices": {"mem": {"kind": "host", "budget": ram * 2, "headroom": "1GiB"}},
            },
            ["devices.mem.budget", "RAM"],
        ),
        "data_dir under a file": (
            {**_valid(), "server": {"data_dir": str(blocker / "data")}},
            ["server.data_dir", "not a directory", str(blocker)],
        ),
        "service without a backend": (
            {**_valid(), "services": {"chat": {"kind": "chat", "memory": {"weights": "1GiB"}}}},
            ["services.chat.backend", "fake"],
        ),
    }
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases["data_dir not writable"] = (
            {**_valid(), "server": {"data_dir": str(locked / "data")}},
            ["server.data_dir", "not writable", str(locked)],
        )
    shown = {}
    for i, (name, (case, wants)) in enumerate(cases.items()):
        data = json.loads(json.dumps(case))
        data.setdefault("server", {}).setdefault("data_dir", str(tmp_path / f"d{i}"))
        path = tmp_path / f"c{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        out = _cli("check", str(path))
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        for want in wants:
            assert want in out.stderr, (name, want, out.stderr)
        shown[name] = next(line for line in out.stderr.splitlines() if wants[0] in line).strip()
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({**_valid(), "server": {"data_dir": str(tmp_path / "ok")}}))
    assert _cli("check", str(ok)).returncode == 0
    record(
        area="bad input",
        case=f"configs serve could not run, that check used to pass ({', '.join(cases)})",
        expected="accelmux check names each problem with its key path",
        happened="exit 2; " + "; ".join(shown.values()),
    )


def test_serve_refuses_an_unusable_data_dir_and_a_missing_backend(
    tmp_path: Path, record: Record
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    runs = {}
    data_dir = {**_valid(), "server": {"data_dir": str(blocker / "data")}}
    no_backend = {
        **_valid(),
        "services": {"chat": {"kind": "chat", "memory": {"weights": "1GiB"}}},
        "server": {"data_dir": str(tmp_path / "d")},
    }
    for name, data, want in (
        ("data_dir under a file", data_dir, str(blocker / "data")),
        ("service without a backend", no_backend, "services.chat.backend"),
    ):
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(data))
        started = time.monotonic()
        out = _cli("serve", "-c", str(path), "--port", str(free_port()))
        assert out.returncode != 0, (name, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert want in out.stderr, (name, out.stderr)
        assert "listening" not in out.stdout
        runs[name] = (out.returncode, out.stderr.strip().splitlines(), time.monotonic() - started)
    assert len(runs["data_dir under a file"][1]) == 1, runs  # one line
    # the simulator needs no backend: a scenario still runs
    sim = _cli("check", str(ROOT / "scenarios" / "burst.yaml"))
    assert sim.returncode == 0, sim.stderr
    record(
        area="bad input",
        case="serve with an unusable data_dir, or a service without a backend",
        expected="serve exits non-zero with a clear error naming it, no traceback",
        happened="; ".join(f"{n}: exit {c}, {lines[-1]!r}" for n, (c, lines, _) in runs.items()),
    )
