"""``sleep: vllm``: an unload to tier sleeping puts the server to sleep (the process stays,
its memory drops) and the next load wakes it; refusals, silence, a death while asleep and
a load timeout fall back to what a cold unload or start does. The server is
tests/external/vllm_sleep_double.py (a test double of vLLM's sleep endpoints, started as a
real child process by the real ExternalBackend), so no timing here says anything about
vLLM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import pid_alive, run, settle

from accelmux.backends.base import BackendRequest
from accelmux.backends.external import ExternalBackend
from accelmux.config.backends import ExternalBackendConfig
from accelmux.config.load import load_config_data
from accelmux.core.types import ServiceKind, Tier
from accelmux.errors import ConfigError

DOUBLE = Path(__file__).with_name("vllm_sleep_double.py")
MIB = 1 << 20
HOLD_MIB = 128
SIZES = {"weights_bytes": HOLD_MIB * MIB, "runtime_bytes": 0, "kv_pool_bytes": 0}


def _argv(*extra: str) -> list[str]:
    return [
        sys.executable, str(DOUBLE), "--port", "{port}", "--max-model-len", "{ctx_size}",
        "--hold-mib", str(HOLD_MIB), "--enable-sleep-mode", *extra,
    ]  # fmt: skip


def _backend(tmp: Path, *extra: str, **cfg: Any) -> ExternalBackend:
    section = ExternalBackendConfig(
        type="external", argv=_argv(*extra), sleep="vllm", startup_timeout_s=20,
        stop_grace_s=3, **cfg,
    )  # fmt: skip
    return ExternalBackend("chat", "chat", section, kv_bytes_per_token=1024, data_dir=tmp)


def _chat() -> BackendRequest:
    return BackendRequest(
        request_id="r1", service="chat", kind=ServiceKind.CHAT, endpoint="/v1/chat/completions",
        body={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
    )  # fmt: skip


def _log(backend: ExternalBackend) -> str:
    return "\n".join(backend.output.lines)


def test_a_sleeping_server_keeps_its_process_drops_its_memory_and_wakes(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            assert backend.capabilities.sleep and not backend.capabilities.pause
            await backend.load(**SIZES)
            pid, awake = backend.pids()[0], backend.resident_bytes
            assert awake is not None and awake >= HOLD_MIB * MIB
            await backend.unload(tier=Tier.SLEEPING)
            asleep = backend.describe()
            assert asleep["sleep"]["sleeping"] and asleep["sleep"]["sleeps"] == 1
            assert backend.pids() == [pid] and pid_alive(pid)  # the process stays
            assert backend.resident_bytes is not None
            assert awake - backend.resident_bytes >= (HOLD_MIB - 16) * MIB
            await backend.unload(tier=Tier.SLEEPING)  # idempotent
            assert backend.describe()["sleep"]["sleeps"] == 1
            report = await backend.load(**SIZES)  # wakes it: no new process
            assert backend.pids() == [pid] and backend.starts == 1
            assert backend.describe()["sleep"]["wakes"] == 1
            assert report.weights_bytes is not None and report.weights_bytes >= 100 * MIB
            answer = await backend.handle(_chat())
            assert answer.status == 200 and b"awake" in answer.body
            await backend.unload(tier=Tier.COLD)
            assert backend.pids() == [] and not backend.describe()["sleep"]["sleeping"]
            await settle(lambda: not pid_alive(pid), timeout=5)
        finally:
            await backend.close()

    run(body())


def test_sleep_needs_its_flag_and_sets_the_dev_mode_env(tmp_path: Path) -> None:
    config = {
        "devices": {"cpu": {"kind": "virtual", "capacity": "1GiB"}},
        "services": {
            "chat": {
                "kind": "chat",
                "memory": {"weights": "64MiB"},
                "backend": {"type": "external", "argv": ["vllm", "serve", "m"], "sleep": "vllm"},
            }
        },
    }
    with pytest.raises(ConfigError, match="needs --enable-sleep-mode in argv"):
        load_config_data(config, "test")
    config["services"]["chat"]["backend"]["argv"].append("--enable-sleep-mode")
    cfg = load_config_data(config, "test")
    section = cfg.services["chat"].backend
    assert isinstance(section, ExternalBackendConfig)
    assert section.capabilities().as_dict()["sleep"] is True
    backend = ExternalBackend("chat", "chat", section)
    assert backend._env()["VLLM_SERVER_DEV_MODE"] == "1"


def test_a_refused_sleep_stops_the_server_instead(tmp_path: Path) -> None:
    async def body() -> None:
        # Without development mode vLLM has no /sleep route: HTTP 404.
        backend = _backend(tmp_path, env={"VLLM_SERVER_DEV_MODE": "0"})
        try:
            await backend.load(**SIZES)
            pid = backend.pids()[0]
            await backend.unload(tier=Tier.SLEEPING)
            assert backend.pids() == [] and not backend.sleeping
            assert "sleep refused (POST /sleep?level=1: HTTP 404" in _log(backend)
            assert "stopping the server instead" in _log(backend)
            assert backend.describe()["sleep"]["refused"] == 1
            await settle(lambda: not pid_alive(pid), timeout=5)
            await backend.load(**SIZES)  # a cold start
            assert backend.starts == 2 and backend.pids()[0] != pid
        finally:
            await backend.close()

    run(body())


def test_a_sleep_without_an_answer_stops_the_server(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path, "--hang-sleep", sleep_timeout_s=0.5)
        try:
            await backend.load(**SIZES)
            await backend.unload(tier=Tier.SLEEPING)
            assert backend.pids() == []
            assert "sleep refused (POST /sleep?level=1: no answer in 0.5s)" in _log(backend)
        finally:
            await backend.close()

    run(body())


def test_a_server_that_dies_asleep_is_a_crash_and_starts_cold(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        crashes: list[str] = []
        backend.set_crash_callback(crashes.append)
        try:
            await backend.load(**SIZES)
            await backend.unload(tier=Tier.SLEEPING)
            pid = backend.pids()[0]
            os.kill(pid, signal.SIGKILL)
            await settle(lambda: bool(crashes), timeout=5)
            assert "while asleep" in crashes[0] and not backend.sleeping
            await backend.load(**SIZES)
            assert backend.starts == 2 and backend.pids()[0] != pid
        finally:
            await backend.close()

    run(body())


def test_a_refused_wake_starts_the_server_again(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path, "--refuse-wake")
        try:
            await backend.load(**SIZES)
            pid = backend.pids()[0]
            await backend.unload(tier=Tier.SLEEPING)
            await backend.load(**SIZES)
            assert backend.starts == 2 and backend.pids()[0] != pid
            assert "wake refused (POST /wake_up: HTTP 500" in _log(backend)
            assert (await backend.handle(_chat())).status == 200
        finally:
            await backend.close()

    run(body())


def test_a_load_with_other_sizes_starts_the_server_again(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path)
        try:
            await backend.load(**{**SIZES, "kv_pool_bytes": 512 * 1024})
            pid = backend.pids()[0]
            await backend.unload(tier=Tier.SLEEPING)
            await backend.load(**{**SIZES, "kv_pool_bytes": 1024 * 1024})  # -c 1024, not 512
            assert backend.starts == 2 and backend.pids()[0] != pid
            assert "sizes differ from the sleeping server's" in _log(backend)
        finally:
            await backend.close()

    run(body())


def test_a_wake_past_the_load_timeout_leaves_no_server(tmp_path: Path) -> None:
    async def body() -> None:
        backend = _backend(tmp_path, "--hang-wake")
        try:
            await backend.load(**SIZES)
            pid = backend.pids()[0]
            await backend.unload(tier=Tier.SLEEPING)
            # The executor cancels a load that runs past the service's load_timeout_s.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(backend.load(**SIZES), 0.5)
            assert backend.pids() == [] and not backend.sleeping
            await settle(lambda: not pid_alive(pid), timeout=5)
        finally:
            await backend.close()

    run(body())
