"""Bad input: hostile configs get a named error (``accelmux check`` and ``accelmux serve
-c``), oversized bodies, contexts and audio get 413 or 400, malformed audio and images
get 400."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from tests.live.support import base_config, live, run
from tests.reliability.conftest import Record

from accelmux.backends.fake_outputs import png

MSG = [{"role": "user", "content": "hi"}]


def _valid() -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB"}},
        "services": {
            "chat": {"kind": "chat", "memory": {"weights": "1GiB"}, "backend": {"type": "fake"}}
        },
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    data = _valid()
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


def _external(port: int) -> dict[str, Any]:
    return {"type": "external", "argv": ["server", "--port", "{port}"], "port": port}


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown key": (_with("services.chat.memroy", {"weights": "1GiB"}), "services.chat.memroy"),
    "unknown top-level key": (_with("sevrer", {}), "sevrer"),
    "negative size": (
        _with("services.chat.memory.weights", "-5GiB"),
        "services.chat.memory.weights",
    ),
    "negative headroom": (_with("devices.gpu.headroom", -1), "devices.gpu.headroom"),
    "budget above capacity": (_with("devices.gpu.budget", "8GiB"), "devices.gpu.budget"),
    "headroom eats the budget": (_with("devices.gpu.headroom", "4GiB"), "devices.gpu.headroom"),
    "pinned services exceed the budget": (
        _with(
            "services.big", {"kind": "chat", "residency": "pinned", "memory": {"weights": "3GiB"}}
        )
        | {
            "services": {
                "a": {"kind": "chat", "residency": "pinned", "memory": {"weights": "3GiB"}},
                "b": {"kind": "tts", "residency": "pinned", "memory": {"weights": "3GiB"}},
            }
        },
        "devices.gpu",
    ),
    "service can never fit": (_with("services.chat.memory.weights", "6GiB"), "services.chat"),
    "missing GGUF model": (
        _with("services.chat.memory.gguf", "/nonexistent/model.gguf"),
        "services.chat.memory.gguf",
    ),
    "missing model path": (
        _with("services.chat.backend", {"type": "worker", "model_path": "/nonexistent/m"}),
        "services.chat.backend.model_path",
    ),
    "duplicate ports": (
        {
            **_valid(),
            "services": {
                "a": {"kind": "chat", "backend": _external(9001)},
                "b": {"kind": "embeddings", "backend": _external(9001)},
            },
        },
        "services.b.backend.port",
    ),
    "port out of range": (_with("server.port", 70000), "server.port"),
    "unknown device": (_with("services.chat.device", "tpu"), "services.chat.device"),
    "bad window": (_with("services.chat.windows", ["25:00-26:00"]), "services.chat.windows"),
    "negative rate limit": (
        _with("server.rate_limit", {"requests_per_s": -1, "burst": 1}),
        "server.rate_limit.requests_per_s",
    ),
    "negative load timeout": (_with("services.chat.load_timeout_s", -3), "load_timeout_s"),
    "argv as a shell string": (
        _with("services.chat.backend", {"type": "external", "argv": "llama-server --port 1"}),
        "services.chat.backend",
    ),
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accelmux.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_hostile_configs_get_named_errors(tmp_path: Path, record: Record) -> None:
    results: dict[str, str] = {}
    files = {}
    for i, (name, (data, key)) in enumerate(BAD_CONFIGS.items()):
        path = tmp_path / f"bad{i}.yaml"
        data.setdefault("server", {})["data_dir"] = str(tmp_path / f"data{i}")
        path.write_text(yaml.safe_dump(data))
        files[name] = (path, key)
    (tmp_path / "dupkeys.yaml").write_text(
        "devices:\n  gpu: {kind: virtual, capacity: 1GiB}\n  gpu: {kind: virtual, capacity: 2GiB}\n"
    )
    files["duplicate YAML key"] = (tmp_path / "dupkeys.yaml", "gpu")
    (tmp_path / "syntax.yaml").write_text("devices: [unclosed\n")
    files["YAML syntax error"] = (tmp_path / "syntax.yaml", "line")
    for name, (path, key) in files.items():
        check = _cli("check", str(path))
        assert check.returncode != 0, (name, check.stdout)
        assert key in check.stderr, (name, key, check.stderr)
        results[name] = key
    # `serve -c` refuses the same files with the same messages, before listening
    for name in ("unknown key", "negative size", "budget above capacity", "duplicate ports"):
        path, key = files[name]
        serve = _cli("serve", "-c", str(path), "--port", "1")
        assert serve.returncode != 0 and key in serve.stderr, (name, serve.stderr)
        assert "Traceback" not in serve.stderr, serve.stderr
    record(
        area="bad input",
        case=f"{len(files)} hostile configs ({', '.join(files)})",
        expected="a named error: the message names the key; serve -c refuses too",
        happened="accelmux check exits 2 naming the key path of each problem; "
        "serve -c prints the same problems without a traceback",
    )


def _wav(seconds: float, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return buf.getvalue()


def _form(model: str, field: str, data: bytes, filename: str, ctype: str) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("model", model)
    form.add_field(field, io.BytesIO(data), filename=filename, content_type=ctype)
    return form


def test_oversized_and_malformed_requests(tmp_path: Path, record: Record) -> None:
    cfg = base_config()
    cfg["server"]["max_body"] = "1MiB"
    cfg["services"]["asr"]["memory"]["per_unit"] = "64MiB"  # per second of audio

    async def body() -> None:
        async with live(cfg, tmp=tmp_path) as lv:
            seen: dict[str, tuple[int, str | None]] = {}

            async def check(name: str, want: set[int], path: str, **kw: Any) -> None:
                status, out, _ = await lv.post(path, **kw)
                code = out["error"]["code"] if isinstance(out, dict) and "error" in out else None
                seen[name] = (status, code)
                assert status in want, (name, status, out)

            big = "x" * (2 * 1024**2)
            huge = json.dumps({"model": "chat", "messages": [{"role": "user", "content": big}]})
            await check(
                "2 MiB JSON body (limit 1 MiB)",
                {413},
                "/v1/chat/completions",
                data=io.BytesIO(huge.encode()),
                headers={"Content-Type": "application/json"},
            )
            await check(
                "2 MiB audio upload",
                {413},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", b"RIFF" + b"\0" * 2 * 1024**2, "a.wav", "audio/wav"),
            )
            ctx = "word " * 150_000  # ~190k tokens, far above the KV ceiling (4096 tokens)
            await check(
                "context above the KV ceiling",
                {413, 400},
                "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": ctx}]},
            )
            await check(
                "max_tokens absurd",
                {400, 413},
                "/v1/chat/completions",
                json={"model": "chat", "messages": MSG, "max_tokens": 10**9},
            )
            await check(
                "audio of 60 s at 64 MiB/s (needs 3.75 GiB)",
                {413},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", _wav(60), "a.wav", "audio/wav"),
            )
            await check(
                "audio of random bytes",
                {400},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", bytes(range(256)) * 4, "a.wav", "audio/wav"),
            )
            await check(
                "empty audio",
                {400},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", b"", "a.wav", "audio/wav"),
            )
            await check(
                "RIFF that is not WAVE",
                {400},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", b"RIFF\0\0\0\0AVI " + b"\0" * 64, "a.wav", "audio/wav"),
            )
            junk = base64.b64encode(bytes(range(200))).decode()
            await check(
                "image of random bytes",
                {400},
                "/v1/detections",
                json={"model": "detect", "image": junk},
            )
            await check(
                "truncated PNG",
                {400},
                "/v1/detections",
                json={"model": "detect", "image": base64.b64encode(png(b"s", 8, 8)[:12]).decode()},
            )
            await check(
                "image not base64",
                {400},
                "/v1/detections",
                json={"model": "detect", "image": "%%%not base64%%%"},
            )
            await check(
                "multipart image of text",
                {400},
                "/v1/detections",
                data=_form("detect", "image", b"hello world" * 10, "a.png", "image/png"),
            )
            await check(
                "image size 100000x100000",
                {400},
                "/v1/images/generations",
                json={"model": "image", "prompt": "x", "size": "100000x100000"},
            )
            await check(
                "body not JSON",
                {400},
                "/v1/embeddings",
                data=b"{not json",
                headers={"Content-Type": "application/json"},
            )
            await check("JSON array body", {400}, "/v1/embeddings", json=[1, 2])
            await check(
                "multipart that is not",
                {400},
                "/v1/audio/transcriptions",
                data=b"--x\r\n",
                headers={"Content-Type": "multipart/form-data"},
            )
            # and good media still pass
            ok_png = base64.b64encode(png(b"s", 8, 8)).decode()
            await check(
                "valid PNG", {200}, "/v1/detections", json={"model": "detect", "image": ok_png}
            )
            await check(
                "valid WAV",
                {200},
                "/v1/audio/transcriptions",
                data=_form("asr", "file", _wav(0.5), "a.wav", "audio/wav"),
            )
            status, _ = await lv.get("/health")
            assert status == 200
            record(
                area="bad input",
                case=f"{len(seen)} oversized or malformed requests",
                expected="413 for oversized bodies, contexts and audio; 400 for malformed "
                "audio, images and bodies; the daemon keeps serving",
                happened="; ".join(f"{k}: {s}{' ' + c if c else ''}" for k, (s, c) in seen.items()),
            )

    run(body())
