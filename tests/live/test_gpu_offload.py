"""Worker offload decisions and GPU memory attribution, against fake runtimes and a fake
NVML (there is no GPU here): where each model runs, what llama.cpp is given, and how a
shared worker's NVML figure is split between its services and its overhead."""

from __future__ import annotations

import os
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.live.support import base_config, live, run

from accelmux.backends.worker import WorkerBackend, WorkerPool
from accelmux.cli import main
from accelmux.config.backends import WorkerBackendConfig
from accelmux.config.offload import KIND_COMPONENTS
from accelmux.core.events import MemorySampled
from accelmux.core.ledger import Ledger
from accelmux.core.specs import DeviceSpec
from accelmux.core.types import ServiceKind
from accelmux.errors import BackendError
from accelmux.models import offload
from accelmux.models.chat import LlamaTextModel
from accelmux.monitors import nvidia
from accelmux.monitors.base import ServiceProcesses
from accelmux.runtime.status_cli import render
from accelmux.worker.component_base import Component, Slot
from accelmux.worker.components import COMPONENTS, component_type
from accelmux.worker.main import Worker

GIB = 2**30
MIB = 2**20


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


@pytest.fixture
def llama_with_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(
        sys.modules, "llama_cpp", _module("llama_cpp", llama_supports_gpu_offload=lambda: True)
    )
    yield


@pytest.fixture
def llama_cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(
        sys.modules, "llama_cpp", _module("llama_cpp", llama_supports_gpu_offload=lambda: False)
    )
    yield


def _ort(monkeypatch: pytest.MonkeyPatch, providers: list[str]) -> None:
    fake = _module("onnxruntime", get_available_providers=lambda: providers)
    monkeypatch.setitem(sys.modules, "onnxruntime", fake)


def test_host_device_runs_on_the_cpu_with_no_layers_offloaded(llama_with_gpu: None) -> None:
    where = offload.placement("llama", {}, None)
    assert where.accelerator == "cpu" and where.n_gpu_layers == 0 and not where.fallback
    assert offload.placement("minilm", {}, None).providers == ("CPUExecutionProvider",)


def test_nvidia_device_offloads_every_layer_by_default(llama_with_gpu: None) -> None:
    where = offload.placement("llama", {}, 1)
    assert where.accelerator == "cuda:1" and where.n_gpu_layers == -1 and where.gpu_index == 1
    assert offload.placement("llama", {"n_gpu_layers": 12}, 0).n_gpu_layers == 12
    assert offload.placement("llama", {"n_gpu_layers": 0}, 0).accelerator == (
        "cpu (n_gpu_layers: 0)"
    )


def test_llama_without_cuda_falls_back_to_the_cpu_and_says_why(llama_cpu_only: None) -> None:
    where = offload.placement("llama", {}, 0)
    assert where.fallback and where.n_gpu_layers == 0
    assert where.accelerator == "cpu (fallback: llama-cpp-python built without CUDA)"
    assert "GGML_CUDA" in where.fix


def test_bad_n_gpu_layers_is_named(llama_with_gpu: None) -> None:
    for bad in ("many", -2, True, 1.5):
        with pytest.raises(ValueError, match="n_gpu_layers"):
            offload.placement("llama", {"n_gpu_layers": bad}, 0)


def test_onnx_uses_cuda_where_installed_else_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _ort(monkeypatch, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    where = offload.placement("piper", {}, 0)
    assert where.accelerator == "cuda:0"
    assert where.providers == (
        ("CUDAExecutionProvider", {"device_id": 0}),
        "CPUExecutionProvider",
    )
    _ort(monkeypatch, ["CPUExecutionProvider"])
    where = offload.placement("minilm", {}, 0)
    assert where.accelerator == "cpu (fallback: onnxruntime without the CUDA provider)"
    assert where.providers == ("CPUExecutionProvider",) and "onnxruntime-gpu" in where.fix


def test_runtimes_without_a_gpu_path_say_so() -> None:
    where = offload.placement("pocketsphinx", {}, 0)
    assert where.fallback and "pocketsphinx" in where.accelerator


def test_llama_is_given_its_layers_and_one_gpu() -> None:
    cpu = LlamaTextModel("x.gguf")
    assert cpu._gpu_kwargs() == {"n_gpu_layers": 0}  # unchanged on the CPU
    gpu = LlamaTextModel("x.gguf", n_gpu_layers=-1, main_gpu=2)
    assert gpu._gpu_kwargs() == {"n_gpu_layers": -1, "main_gpu": 2, "split_mode": 0}


# -- reconciliation with NVML --------------------------------------------------------


@given(
    nvml=st.integers(0, 64 * GIB),
    claims=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 64 * GIB), max_size=6),
)
def test_reconciled_bytes_add_up_to_nvml(nvml: int, claims: dict[str, int]) -> None:
    shares, overhead = nvidia.reconcile_worker(nvml, claims)
    assert sum(shares.values()) + overhead == nvml
    assert set(shares) == set(claims)
    assert all(0 <= shares[k] <= claims[k] for k in claims)
    assert overhead >= 0
    if sum(claims.values()) <= nvml:
        assert shares == claims


class FakeNvml:
    """One GPU; per-process memory as given (NVML's shape of things)."""

    def __init__(self, total: int, processes: dict[int, int]) -> None:
        self.total = total
        self.processes = processes

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index != 0:
            raise RuntimeError("no such GPU")
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        used = sum(self.processes.values())
        return types.SimpleNamespace(total=self.total, used=used, free=self.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in self.processes.items()
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        return []


def test_shared_worker_is_split_by_its_claims_and_the_rest_is_overhead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, server = 4242, 4343
    fake = FakeNvml(80 * GIB, {worker: 3 * GIB, server: 2 * GIB})
    monkeypatch.setattr(nvidia, "pynvml", fake)
    sampler = nvidia.NvidiaSampler("gpu", index=0, capacity=80 * GIB, budget=80 * GIB)
    monkeypatch.setattr(nvidia, "tree_pids", lambda root: [root])
    sample = sampler.sample(
        [
            ServiceProcesses(service="chat", gpu_claim=(worker, 2 * GIB)),
            ServiceProcesses(service="tts", gpu_claim=(worker, 512 * MIB)),
            ServiceProcesses(service="big", pids=[server]),
        ]
    )
    assert sample is not None
    event = sample.event
    assert event.per_service == {"chat": 2 * GIB, "tts": 512 * MIB, "big": 2 * GIB}
    assert event.overhead_bytes == 512 * MIB  # CUDA context and slack: the worker's
    assert sample.details["foreign_bytes"] == 0
    (entry,) = sample.details["workers"]
    assert entry["pid"] == worker and entry["nvml_bytes"] == 3 * GIB
    assert entry["overhead_bytes"] == 512 * MIB

    fake.processes[worker] = 2 * GIB  # claims above NVML's figure: scaled down to it
    event = sampler.sample(
        [
            ServiceProcesses(service="chat", gpu_claim=(worker, 3 * GIB)),
            ServiceProcesses(service="tts", gpu_claim=(worker, 1 * GIB)),
        ]
    )
    assert event is not None
    assert event.event.per_service == {"chat": 3 * GIB // 2, "tts": GIB // 2}
    assert event.event.overhead_bytes == 0
    sampler.close()


def test_overhead_is_in_use_not_foreign() -> None:
    device = DeviceSpec(
        name="gpu", kind="nvidia", capacity_bytes=8 * GIB, budget_bytes=8 * GIB, headroom_bytes=0
    )
    ledger = Ledger([device])
    before = ledger.available("gpu")
    ledger.set_overhead("gpu", 300 * MIB)
    assert ledger.overhead("gpu") == 300 * MIB
    assert ledger.available("gpu") == before - 300 * MIB
    assert ledger.foreign("gpu") == 0
    event = MemorySampled(device="gpu", used_bytes=GIB, overhead_bytes=300 * MIB)
    assert event.overhead_bytes == 300 * MIB


# -- accelmux check --------------------------------------------------------------------


def _gpu_config(tmp_path: Path, **options: Any) -> Path:
    data = {
        "server": {"data_dir": str(tmp_path)},
        "devices": {
            "gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"},
            "cpu": {"kind": "host", "capacity": "1GiB"},
        },
        "services": {
            "chat": {
                "kind": "chat",
                "device": "gpu",
                "memory": {"weights": "256MiB"},
                "backend": {"type": "worker", "options": options},
            },
            "embed": {
                "kind": "embeddings",
                "device": "cpu",
                "memory": {"weights": "64MiB"},
                "backend": {"type": "worker"},
            },
        },
    }
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_check_warns_when_a_gpu_service_will_run_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], llama_cpu_only: None
) -> None:
    path = _gpu_config(tmp_path)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr()
    (warning,) = [line for line in out.err.splitlines() if "warning" in line]
    assert "'chat'" in warning and "nvidia device 'gpu'" in warning
    assert "cpu (fallback: llama-cpp-python built without CUDA)" in warning
    assert "GGML_CUDA" in warning  # how to fix it
    assert "OK" in out.out


def test_check_is_quiet_when_the_gpu_is_used_and_names_a_bad_n_gpu_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], llama_with_gpu: None
) -> None:
    assert main(["check", str(_gpu_config(tmp_path))]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["check", str(_gpu_config(tmp_path, n_gpu_layers="all"))]) == 2
    err = capsys.readouterr().err
    assert "services.chat.backend.options: n_gpu_layers must be an integer" in err


def test_check_knows_the_worker_component_of_every_kind() -> None:
    for kind in ServiceKind:
        if kind.value in KIND_COMPONENTS:
            assert KIND_COMPONENTS[kind.value] == component_type(kind, {})


# -- the worker: where it loads a model, and what it reports ------------------------------


class _GpuModel(Component):
    """A model whose load takes 100 MiB on the GPU (as the fake NVML sees this process)."""

    ctype = "fakegpu"
    nvml: FakeNvml

    def _load(self, slot: Slot) -> None:
        pid = os.getpid()
        self.nvml.processes[pid] = self.nvml.processes.get(pid, 0) + 100 * MIB

    def unload(self) -> None:
        pass


def test_worker_loads_on_the_services_gpu_and_reports_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeNvml(80 * GIB, {os.getpid(): 300 * MIB})  # its CUDA context
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _ort(monkeypatch, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setitem(offload.RUNTIMES, "fakegpu", "onnxruntime")
    monkeypatch.setitem(COMPONENTS, "fakegpu", _GpuModel)
    monkeypatch.setattr(_GpuModel, "nvml", fake, raising=False)
    ours, theirs = socket.socketpair()
    try:
        worker = Worker(ours, tmp_path)
        load = {"service": "voice", "kind": "tts", "options": {"model_type": "fakegpu"}}
        reply = worker.op_load({**load, "gpu_index": 0})
        assert reply["accelerator"] == "cuda:0" and reply["gpu_bytes"] == 100 * MIB
        entry = worker.memory()["services"]["voice"]
        assert entry["gpu"] == 100 * MIB and entry["accelerator"] == "cuda:0"
        assert entry["batch_size"] == 0
        worker.op_unload({"service": "voice"})
        host = worker.op_load({**load, "service": "cpu-voice"})  # a host device: no GPU index
        assert host["accelerator"] == "cpu" and host["gpu_bytes"] == 0
        worker.op_unload({"service": "cpu-voice"})
        bad = {**load, "options": {"model_type": "fakegpu", "n_gpu_layers": "x"}}
        with pytest.raises(BackendError, match="n_gpu_layers must be an integer"):
            worker.op_load({**bad, "service": "bad", "gpu_index": 0})
    finally:
        ours.close()
        theirs.close()


class _Client:
    def __init__(self, memory: dict[str, Any]) -> None:
        self.memory = memory
        self.pid = 777
        self.alive = True
        self.name = "shared"
        self.starts = 1
        self.last_exit = None

    def add_death_listener(self, listener: Any) -> None:
        pass


def test_worker_backend_claims_its_gpu_bytes_for_the_monitor(tmp_path: Path) -> None:
    pool = WorkerPool(tmp_path)
    client = _Client({"services": {"chat": {"gpu": 5 * MIB, "accelerator": "cuda:0"}}})
    pool.shared = client  # type: ignore[assignment]
    cfg = WorkerBackendConfig(type="worker")
    backend = WorkerBackend("chat", ServiceKind.CHAT, cfg, client, pool)  # type: ignore[arg-type]
    assert backend.gpu_claim() is None  # no GPU index: the CPU
    backend.gpu_index = 0
    assert backend.gpu_claim() == (777, 0)  # not loaded
    backend.loaded = True
    assert backend.gpu_claim() == (777, 5 * MIB)
    described = backend.describe()
    assert described["accelerator"] == "cuda:0" and described["gpu_bytes"] == 5 * MIB


def test_status_shows_the_workers_overhead_as_in_use_not_foreign(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    worker = 4242
    fake = FakeNvml(8 * GIB, {worker: GIB})
    monkeypatch.setattr(nvidia, "pynvml", fake)
    monkeypatch.setattr(nvidia, "tree_pids", lambda root: [root])
    cfg = base_config()
    cfg["devices"] = {"gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"}}

    async def body() -> dict[str, Any]:
        async with live(cfg, tmp=tmp_path, sample=True) as lv:
            backend = lv.runtime.backends["chat"]
            backend.gpu_claim = lambda: (worker, 600 * MIB)  # type: ignore[attr-defined]
            await lv.runtime.sample_once()
            return (await lv.get("/admin/status"))[1]

    snap = run(body())
    (device,) = snap["devices"]
    assert device["overhead_bytes"] == GIB - 600 * MIB
    assert device["foreign_bytes"] == 0
    (entry,) = device["measured"]["workers"]
    assert entry["attributed_bytes"] == {"chat": 600 * MIB}
    chat = next(s for s in snap["services"] if s["name"] == "chat")
    assert chat["measured_bytes"] >= 600 * MIB
    chat["accelerator"] = "cuda:0"  # as a worker service's entry has it
    text = render(snap)  # `accelmux status`
    assert "where worker models run:" in text and "  chat: cuda:0" in text
    assert "gpu: 424.0M of inference-worker overhead" in text
