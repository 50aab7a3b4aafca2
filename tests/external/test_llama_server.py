"""A real llama-server (built from the llama.cpp sources by scripts/setup-llama-server.sh)
supervised by accelmux with the packaged SmolLM2 GGUF: start, health, requests through the
openai client, crash and restart, resize at the next load, memory measured and calibrated,
and the server gone when accelmux is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.external.llama_server import llama_config, llama_server_path, smollm2
from tests.live.support import daemon, live, pid_alive, run, settle

from accelmux.backends.base import BackendRequest
from accelmux.backends.external import ExternalBackend
from accelmux.backends.limits import detect_cgroup
from accelmux.config.backends import ExternalBackendConfig
from accelmux.config.load import load_config_data
from accelmux.config.specs import gguf_memory_profile
from accelmux.core.types import ResizeSupport, ServiceKind
from accelmux.errors import BackendError

pytestmark = [pytest.mark.real, pytest.mark.slow]
MSG = [{"role": "user", "content": "Say hello."}]
MIB = 1 << 20


def _chat_service(lv: Any) -> dict[str, Any]:
    return next(s for s in lv.runtime.status()["services"] if s["name"] == "chat")


def _ctx_arg(pid: int) -> int:
    argv = psutil.Process(pid).cmdline()
    return int(argv[argv.index("-c") + 1])


def test_llama_server_is_supervised_measured_and_calibrated(tmp_path: Path) -> None:
    config = llama_config(llama_server_path(), smollm2())

    async def body() -> None:
        async with live(config, tmp=tmp_path, sample=True) as lv:
            async with lv.openai(timeout=120) as client:
                r = await client.chat.completions.create(
                    model="chat", messages=MSG, max_tokens=8, temperature=0
                )
                assert r.choices[0].message.content
                assert r.usage is not None and r.usage.total_tokens > 0
                stream = await client.chat.completions.create(
                    model="chat", messages=MSG, max_tokens=8, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
                assert "".join(pieces)
            await lv.runtime.sample_once()
            chat = _chat_service(lv)
            backend = chat["backend"]
            pid = backend["pid"]
            # What llama-server holds is measured: its size once up and each request's peak.
            calibration = lv.runtime.manager.world.services["chat"].calibration
            assert calibration.resident.observations == 1
            assert calibration.active.observations == 2
            assert backend["measured"]["resident_bytes"] > 40 * MIB  # the 94 MiB GGUF, mapped
            assert chat["measured_bytes"] > 40 * MIB
            # The server's own figures: its slots (context), its metrics, the batch flag.
            usage = chat["usage"]
            # -c is the KV pool over KV bytes per token, shared by 2 slots (llama.cpp pads
            # each slot's context up to a multiple of 256)
            assert usage["context_per_slot_tokens"] >= _ctx_arg(pid) // 2
            # what the server runs, from its /slots (not its -b flag, a batch of tokens)
            assert usage["batch_size"] == backend["server"]["slots_processing"] == 0
            assert backend["measured"]["batch_tokens_flag"] == 256
            assert backend["server"]["slots"] == 2
            assert "requests_processing" in backend["server"]
            assert usage["cold_start_s"] > 0 and usage["switches_per_hour"] > 0
            assert chat["limit"].startswith(("none — ", "memory.max "))
            # Crash and restart: the next request is served by a new llama-server.
            os.kill(pid, signal.SIGKILL)
            await settle(lambda: _chat_service(lv)["crashes"] == 1, timeout=30)
            assert "crashed" in (_chat_service(lv)["last_error"] or "")
            async with lv.openai(timeout=120) as client:
                r = await client.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
                assert r.choices[0].message.content is not None
            new_pid = _chat_service(lv)["backend"]["pid"]
            assert new_pid != pid and pid_alive(new_pid)

    run(body())


def test_resize_applies_at_the_next_load(tmp_path: Path) -> None:
    binary, model = llama_server_path(), smollm2()
    cfg = load_config_data(llama_config(binary, model), "test")
    section = cfg.services["chat"].backend
    assert isinstance(section, ExternalBackendConfig)
    per_token = gguf_memory_profile(cfg.services["chat"].memory).kv_bytes_per_token
    assert per_token > 0

    async def body() -> None:
        backend = ExternalBackend(
            "chat", "chat", section, kv_bytes_per_token=per_token, concurrency=2,
            data_dir=tmp_path, cgroup=detect_cgroup(),
        )  # fmt: skip
        try:
            small, large = 512 * per_token, 1024 * per_token
            report = await backend.load(
                weights_bytes=90 * MIB, runtime_bytes=0, kv_pool_bytes=small
            )
            assert report.weights_bytes is not None
            pid = backend.describe()["pid"]
            assert _ctx_arg(pid) == 512
            assert backend.capabilities.resize is ResizeSupport.NEXT_LOAD
            with pytest.raises(BackendError):  # a running server keeps its context
                await backend.resize(large)
            assert _ctx_arg(pid) == 512
            await backend.load(weights_bytes=90 * MIB, runtime_bytes=0, kv_pool_bytes=large)
            assert _ctx_arg(backend.describe()["pid"]) == 1024
            request = BackendRequest(
                request_id="r", service="chat", kind=ServiceKind.CHAT,
                endpoint="/v1/chat/completions",
                body={"model": "chat", "messages": MSG, "max_tokens": 4},
            )  # fmt: skip
            answer = await backend.handle(request)
            assert answer.status == 200 and answer.peak_bytes is not None
            total = json.loads(answer.body)["usage"]["total_tokens"]
            assert answer.peak_bytes >= total * per_token
        finally:
            await backend.close()

    run(body())


def test_a_request_too_long_for_the_running_context_restarts_the_server_larger(
    tmp_path: Path,
) -> None:
    # llama-server declares resize at next load: the Manager never resizes it live. Its
    # first start takes what is free beyond the spare fraction; a request whose KV does
    # not fit one slot of that context restarts the idle server with a larger one, and is served.
    config = llama_config(llama_server_path(), smollm2())
    config["devices"]["cpu"]["capacity"] = "768MiB"
    config["services"]["chat"]["memory"]["kv_ceiling"] = "512MiB"

    async def body() -> None:
        async with live(config, tmp=tmp_path) as lv:
            async with lv.openai(timeout=120) as client:
                r = await client.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
                assert r.choices[0].message.content is not None
                chat = _chat_service(lv)
                assert chat["capabilities"]["resize"] == "next_load"
                first_pid = chat["backend"]["pid"]
                first_ctx = _ctx_arg(first_pid)
                per_token = chat["kv_pool_bytes"] // first_ctx
                # llama-server gives each of its 2 slots half of -c: just more than one
                # running slot holds, within one slot's share of the ceiling
                long = first_ctx // 2 + 64
                assert long * per_token <= 512 * MIB // 2
                r = await client.chat.completions.create(
                    model="chat", messages=MSG, max_tokens=long, temperature=0
                )
                assert r.choices[0].message.content is not None
            chat = _chat_service(lv)
            assert chat["loads"] == 2 and chat["evictions"] == 0
            new_pid = chat["backend"]["pid"]
            assert new_pid != first_pid and _ctx_arg(new_pid) > first_ctx
            reasons = [
                d["reason"]
                for d in lv.runtime.manager.snapshot().decisions
                if d["action"] == "unload"
            ]
            assert "resize_at_next_load" in reasons
            assert not any(d["action"] == "resize" for d in lv.runtime.manager.snapshot().decisions)

    run(body())


def test_llama_server_dies_with_a_killed_daemon(tmp_path: Path) -> None:
    config = llama_config(llama_server_path(), smollm2())
    with daemon(config, tmp_path, timeout=60) as d:
        req = urllib.request.Request(d.url + "/admin/services/chat/load", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

        def loaded() -> dict[str, Any] | None:
            with urllib.request.urlopen(d.url + "/admin/status", timeout=10) as resp:
                chat = next(s for s in json.load(resp)["services"] if s["name"] == "chat")
            return chat if chat["state"] == "loaded" else None

        chat = _poll(loaded, 120)
        pid = chat["backend"]["pid"]
        assert pid_alive(pid)
        d.proc.kill()
        d.proc.wait(timeout=10)
        _poll(lambda: not pid_alive(pid), 10)


def _poll(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)
