"""Degrading on the live daemon (real HTTP on loopback, the fake NVML: there is no GPU
here, and fake runtimes): a game takes the GPU, chat runs with fewer layers there or on
the CPU instead of waiting, and moves back when the game leaves; each move is in the
decision log and /admin/status with its reason. The worker's side: an offload form's
backend is given its ``n_gpu_layers``, the CPU form runs on the host."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import fake, live, run, settle

from accelmux.backends.factory import build_backends
from accelmux.backends.worker import WorkerBackend
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.monitors import nvidia

GIB = 2**30

DEGRADE = {"fallback_device": "cpu", "min_gpu_layers": 6, "max_gpu_layers": 20, "layers": 25}


@pytest.fixture
def game() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _config(backend: dict[str, Any]) -> dict[str, Any]:
    return {
        "devices": {
            "gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB", "headroom": "256MiB"},
            "cpu": {"kind": "host", "capacity": "16GiB", "budget": "8GiB", "headroom": "512MiB"},
        },
        "services": {
            "chat": {
                "kind": "chat",
                "device": "gpu",
                "memory": {
                    "weights": "4GiB",
                    "runtime": "256MiB",
                    "kv_per_token": "64KiB",
                    "kv_floor": "128MiB",
                    "kv_ceiling": "256MiB",
                },
                "degrade": DEGRADE,
                "backend": backend,
            }
        },
        "policy": {"crash_backoff_s": 0.2, "crash_backoff_max_s": 1.0, "prewarm": False},
        "server": {"drain_s": 2.0},
    }


def _nvml(game_pid: int, held: dict[str, int]) -> types.SimpleNamespace:
    """One 8 GiB GPU on which the game holds ``held["bytes"]`` and the services what
    ``held["ours"]`` says (both changed by the test), as a real card's total shows them."""

    def processes(handle: int) -> list[types.SimpleNamespace]:
        if not held["bytes"]:
            return []
        return [types.SimpleNamespace(pid=game_pid, usedGpuMemory=held["bytes"])]

    def memory(handle: int) -> types.SimpleNamespace:
        used = held["bytes"] + held["ours"]
        return types.SimpleNamespace(total=8 * GIB, used=used, free=8 * GIB - used)

    return types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: 0,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=processes,
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50, memory=20),
        nvmlDeviceGetProcessUtilization=lambda h, since: [],
    )


def test_chat_degrades_beside_a_game_and_moves_back_on_the_live_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, game: subprocess.Popen[bytes]
) -> None:
    held = {"bytes": 0, "ours": 0}
    monkeypatch.setattr(nvidia, "pynvml", _nvml(game.pid, held))

    async def body() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with live(_config(fake()), tmp=tmp_path, sample=True) as lv:
            client = lv.openai()
            rt = lv.runtime

            async def ask() -> str:
                answer = await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}]
                )
                return str(answer.choices[0].message.content)

            def state(name: str) -> str:
                return str(rt.manager.view.services[name].status.value)

            async def sample() -> None:
                # what the loaded fake backends hold on the GPU shows in NVML's total, as
                # a real card's would
                view = rt.manager.view
                held["ours"] = sum(
                    s.resident_bytes
                    for s in view.services.values()
                    if s.spec.device == "gpu" and s.status.value == "loaded"
                )
                await rt.sample_once()

            await sample()
            assert await ask()
            assert state("chat@gpu") == "loaded"
            # a game takes 6 GiB: the full form is evicted, the next request degrades
            held["bytes"] = 6 * GIB
            await sample()
            await settle(lambda: state("chat@gpu") == "unloaded")
            assert await ask()
            lesser = [
                n for n, s in rt.manager.view.services.items() if n != "chat@gpu" and s.holds_memory
            ]
            assert lesser, "a lesser form serves beside the game"
            # the game ends: the full form comes back, the lesser one is retired
            held["bytes"] = 0
            for _ in range(5):
                await sample()
            await settle(
                lambda: (
                    state("chat@gpu") == "loaded" and all(state(n) == "unloaded" for n in lesser)
                )
            )
            assert await ask()
            status = (await lv.get("/admin/status"))[1]
            explain = (await lv.get("/admin/explain"))[1]
            await client.close()
            # /admin/explain lists every form on its device, and the lesser one's unload
            forms = {
                name: svc
                for device in explain["devices"].values()
                for name, svc in device["services"].items()
            }
            assert set(forms) == set(rt.manager.view.services)
            assert forms["chat@gpu"]["state"] == "loaded"
            assert {forms[n]["last_unload"]["reason"] for n in lesser} == {"superseded"}
            return list(rt.manager.snapshot().decisions), status

    decisions, status = run(body())
    reasons = [(d["action"], d.get("service"), d.get("reason")) for d in decisions]
    degraded = [r for r in reasons if r[2] == "degraded"]
    assert degraded and degraded[0][0] == "load"
    assert degraded[0][1] in ("chat@gpu:20", "chat@gpu:15", "chat@gpu:11", "chat@gpu:6", "chat@cpu")
    assert ("load", "chat@gpu", "room_returned") in reasons
    assert any(r[0] == "unload" and r[2] == "superseded" for r in reasons)
    detail = next(d["detail"] for d in decisions if d.get("reason") == "degraded")
    assert "the full model needs" in detail
    assert "chat" in str(status)


def test_an_offload_form_gives_llama_cpp_its_layers_and_the_cpu_form_the_host(
    tmp_path: Path,
) -> None:
    cfg = load_config_data(_config({"type": "worker"}), "test")
    spec = to_manager_spec(cfg)
    backends = build_backends(cfg, tmp_path, spec.services)
    layers = {}
    for name, backend in backends.items():
        assert isinstance(backend, WorkerBackend)
        layers[name] = (backend.cfg.options.get("n_gpu_layers"), backend.gpu_index)
    assert layers == {
        "chat@gpu": (None, 0),
        "chat@gpu:20": (20, 0),
        "chat@gpu:15": (15, 0),
        "chat@gpu:11": (11, 0),
        "chat@gpu:6": (6, 0),
        "chat@cpu": (None, None),
    }
