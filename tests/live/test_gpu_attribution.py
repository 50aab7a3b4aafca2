"""GPU memory attribution in the inference worker, whatever the load order, against a
fake NVML and a fake CUDA (there is no GPU here): the CUDA context is the worker's
overhead, opened before the first model; each model's bytes are its own; what a model's
requests make its allocator keep (an ONNX Runtime arena that never shrinks) is that
model's service's; and services on two devices never share one loaded copy."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.live.test_gpu_offload import FakeNvml, _ort

from accelmux.cli import main
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.models import offload
from accelmux.models.llama_buffers import on_gpu, parse_buffers, with_new_context
from accelmux.monitors import nvidia
from accelmux.worker import main as worker_main
from accelmux.worker import protocol
from accelmux.worker.component_base import Component, Slot
from accelmux.worker.components import COMPONENTS
from accelmux.worker.gpu_account import GpuAccount, settle

MIB = 2**20
CONTEXT = 300 * MIB  # what a CUDA context and the runtimes' libraries take


class FakeCuda:
    """The process's CUDA context: created by the first GPU call, whoever makes it."""

    def __init__(self, nvml: FakeNvml) -> None:
        self.nvml = nvml
        self.opened = False

    def touch(self, extra: int = 0) -> None:
        pid = os.getpid()
        if not self.opened:
            self.opened = True
            self.nvml.processes[pid] = self.nvml.processes.get(pid, 0) + CONTEXT
        self.nvml.processes[pid] = self.nvml.processes.get(pid, 0) + extra

    def open_gpu(self, gpu: int) -> list[str]:
        self.touch()
        return ["fake cuda context"]


class _ArenaModel(Component):
    """An ONNX-like model: its load takes ``size_mib`` on the GPU (creating the CUDA
    context when it is the process's first GPU user), each request grows its arena by
    ``grow_mib`` (kept: an arena that never shrinks), ``give_back_mib`` frees some."""

    ctype = "fakearena"
    cuda: FakeCuda

    def _load(self, slot: Slot) -> None:
        self.cuda.touch(int(self.options.get("size_mib", 0)) * MIB)

    def unload(self) -> None:
        pid = os.getpid()
        self.cuda.nvml.processes[pid] -= self.gpu_bytes + self.gpu_growth

    def infer(
        self, slot: Slot, endpoint: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> tuple[int, str, bytes, int]:
        grow = int(body.get("grow_mib", 0)) - int(body.get("give_back_mib", 0))
        self.cuda.touch(grow * MIB)
        return 200, "application/json", b"{}", 0


@pytest.fixture
def gpu_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    fake = FakeNvml(80 * 2**30, {})
    cuda = FakeCuda(fake)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _ort(monkeypatch, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setitem(offload.RUNTIMES, "fakearena", "onnxruntime")
    monkeypatch.setitem(COMPONENTS, "fakearena", _ArenaModel)
    monkeypatch.setattr(_ArenaModel, "cuda", cuda, raising=False)
    monkeypatch.setattr(worker_main, "open_gpu", cuda.open_gpu, raising=False)
    ours, theirs = socket.socketpair()
    worker = worker_main.Worker(ours, tmp_path)
    worker.fake = fake  # type: ignore[attr-defined]
    worker.peer = theirs  # type: ignore[attr-defined]
    try:
        yield worker
    finally:
        ours.close()
        theirs.close()


def _load(worker: Any, service: str, size_mib: int, *, device: str = "gpu", gpu: Any = 0) -> Any:
    return worker.op_load(
        {
            "service": service,
            "kind": "embeddings",
            "model_path": f"/models/{service}.onnx",
            "options": {"model_type": "fakearena", "size_mib": size_mib},
            "gpu_index": gpu,
            "device": device,
        }
    )


def _request(worker: Any, service: str, rid: int, **body: int) -> None:
    worker.op_infer(rid, {"service": service, "endpoint": "/v1/embeddings", "body": body}, b"")
    header, _ = protocol.recv_frame(worker.peer)
    assert header["id"] == rid and header["type"] == "ok", header


def _gpu(worker: Any) -> dict[str, int]:
    return {name: e["gpu"] for name, e in worker.memory()["services"].items()}


def _nvml(worker: Any) -> int:
    return int(worker.fake.processes[os.getpid()])


@pytest.mark.parametrize("order", [("voice", "embed"), ("embed", "voice")])
def test_the_cuda_context_is_the_workers_overhead_in_either_load_order(
    gpu_worker: Any, order: tuple[str, str]
) -> None:
    sizes = {"voice": 100, "embed": 40}
    for service in order:
        reply = _load(gpu_worker, service, sizes[service])
        assert reply["accelerator"] == "cuda:0"
    assert _gpu(gpu_worker) == {"voice": 100 * MIB, "embed": 40 * MIB}
    assert gpu_worker.memory()["gpu_overhead"] == {"0": CONTEXT}
    # the daemon's reconciliation with NVML: the same split, the context is overhead
    shares, overhead = nvidia.reconcile_worker(_nvml(gpu_worker), _gpu(gpu_worker))
    assert shares == {"voice": 100 * MIB, "embed": 40 * MIB} and overhead == CONTEXT


def test_arena_growth_after_load_is_claimed_by_its_service(gpu_worker: Any) -> None:
    _load(gpu_worker, "voice", 100)
    _load(gpu_worker, "embed", 40)
    _request(gpu_worker, "voice", 1, grow_mib=64)  # the arena grows and keeps it
    assert _gpu(gpu_worker) == {"voice": 164 * MIB, "embed": 40 * MIB}
    entry = gpu_worker.memory()["services"]["voice"]
    assert entry["gpu_growth"] == 64 * MIB
    _request(gpu_worker, "embed", 2)  # no growth: nothing moves
    assert _gpu(gpu_worker) == {"voice": 164 * MIB, "embed": 40 * MIB}
    _request(gpu_worker, "voice", 3, give_back_mib=24)  # an arena shrinks
    assert _gpu(gpu_worker)["voice"] == 140 * MIB
    shares, overhead = nvidia.reconcile_worker(_nvml(gpu_worker), _gpu(gpu_worker))
    assert overhead == CONTEXT and shares["voice"] == 140 * MIB
    # the growth never outlives the copy: a new load starts from its own figure
    gpu_worker.op_unload({"service": "voice"})
    _load(gpu_worker, "voice", 100)
    assert _gpu(gpu_worker)["voice"] == 100 * MIB


def test_a_model_file_on_two_devices_is_two_copies_each_where_its_device_is(
    gpu_worker: Any,
) -> None:
    options = {"model_type": "fakearena", "size_mib": 50}
    base = {"kind": "embeddings", "model_path": "/models/minilm.onnx", "options": options}
    on_gpu = gpu_worker.op_load({**base, "service": "embeddings", "gpu_index": 0, "device": "gpu"})
    on_host = gpu_worker.op_load({**base, "service": "indexer", "gpu_index": None, "device": "cpu"})
    assert not on_host["shared"] and on_host["key"] != on_gpu["key"]
    assert (on_gpu["accelerator"], on_host["accelerator"]) == ("cuda:0", "cpu")
    same_device = gpu_worker.op_load({**base, "service": "search", "gpu_index": 0, "device": "gpu"})
    assert same_device["shared"] and same_device["key"] == on_gpu["key"]


class _Holder:
    def __init__(self, gpu: int | None, own: int) -> None:
        self.gpu = gpu
        self.own = own
        self.gpu_growth = 0

    def gpu_index_now(self) -> int | None:
        return self.gpu

    def runtime_gpu_bytes(self) -> int:
        return self.own


def test_growth_while_two_ran_is_split_and_a_give_back_is_taken_from_them_first() -> None:
    a, b, c = _Holder(0, 10), _Holder(0, 20), _Holder(0, 30)
    c.gpu_growth = 5
    settle(7, [a, b], [a, b, c])
    assert (a.gpu_growth, b.gpu_growth, c.gpu_growth) == (4, 3, 5)
    settle(-9, [b], [a, b, c])
    assert (a.gpu_growth, b.gpu_growth, c.gpu_growth) == (0, 0, 3)  # b, then the others
    settle(-50, [a], [a, b, c])
    assert (a.gpu_growth, b.gpu_growth, c.gpu_growth) == (0, 0, 0)  # never below zero


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 64),  # MiB the request grows its allocator by
            st.integers(0, 64),  # MiB it gives back (at most what it grew)
        ),
        max_size=12,
    ),
    order=st.permutations(["a", "b", "c"]),
)
def test_figures_and_overhead_add_up_to_nvml_for_any_order_and_requests(
    steps: list[tuple[str, int, int]], order: list[str]
) -> None:
    """Property: after each request, when nothing runs, every holder's figure plus the
    fixed overhead is exactly what NVML shows for the process, and the overhead is the
    context alone, whichever model loaded first."""
    nvml = {"bytes": 0}
    sizes = {"a": 100 * MIB, "b": 40 * MIB, "c": 7 * MIB}
    holders = {name: _Holder(0, sizes[name]) for name in sizes}
    kept = dict.fromkeys(sizes, 0)

    def open_gpu(gpu: int) -> list[str]:
        nvml["bytes"] += CONTEXT
        return ["context"]

    account = GpuAccount(lambda gpu: nvml["bytes"], open_gpu)
    for name in order:
        account.open(0)
        nvml["bytes"] += sizes[name]
    for name, grow, give in steps:
        holder = holders[name]
        account.begin(holder)
        back = min(give * MIB, kept[name] + grow * MIB)
        nvml["bytes"] += grow * MIB - back
        kept[name] += grow * MIB - back
        account.end(holder, holders.values)
        total = sum(h.runtime_gpu_bytes() + h.gpu_growth for h in holders.values())
        assert total + account.overhead[0] == nvml["bytes"]
    assert account.overhead == {0: CONTEXT}


def test_check_names_services_that_load_one_model_on_two_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def embeddings(device: str) -> dict[str, Any]:
        return {
            "kind": "embeddings",
            "device": device,
            "memory": {"weights": "64MiB"},
            "backend": {"type": "worker"},
        }

    data = {
        "server": {"data_dir": str(tmp_path)},
        "devices": {
            "gpu": {"kind": "virtual", "capacity": "8GiB"},
            "cpu": {"kind": "host", "capacity": "1GiB"},
        },
        "services": {"embeddings": embeddings("gpu"), "indexer": embeddings("cpu")},
    }
    spec = to_manager_spec(load_config_data(data, "test"))
    keys = {s.name: s.weights_key for s in spec.services}
    assert keys == {"embeddings": "minilm:packaged@gpu", "indexer": "minilm:packaged@cpu"}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["check", str(path)]) == 0  # a copy per device is allowed, and named
    (note,) = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert "'embeddings' on 'gpu'" in note and "'indexer' on 'cpu'" in note
    assert "minilm:packaged" in note and "copy of its own" in note


GPU_LOG = """load_tensors: offloaded 20/31 layers to GPU
load_tensors:   CPU_Mapped model buffer size =    30.25 MiB
load_tensors:        CUDA0 model buffer size =    61.85 MiB
llama_context:  CUDA_Host  output buffer size =     0.19 MiB
llama_kv_cache:        CUDA0 KV buffer size =    15.00 MiB
llama_kv_cache:          CPU KV buffer size =     7.50 MiB
sched_reserve:        CUDA0 compute buffer size =    98.25 MiB
sched_reserve:    CUDA_Host compute buffer size =     4.01 MiB
"""


def test_llama_cpp_buffers_on_the_gpu_are_read_from_its_log() -> None:
    buffers = parse_buffers(GPU_LOG)
    assert buffers[("CUDA0", "model")] == round(61.85 * MIB)
    assert on_gpu(buffers, 0) == round(61.85 * MIB) + 15 * MIB + round(98.25 * MIB)
    assert on_gpu(buffers, 1) == 0  # pinned host memory (CUDA_Host) is not on a GPU
    resized = with_new_context(buffers, parse_buffers(GPU_LOG.replace("15.00", "30.00")))
    assert on_gpu(resized, 0) == on_gpu(buffers, 0) + 15 * MIB
