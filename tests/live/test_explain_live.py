"""``/admin/explain`` on the live daemon: every ledger category adding up to the device's
capacity, the compute in use, a fragmentation estimate where one is exposed, the foreign
holders by name (a real foreign process here), and each service's last unload: its
reason, when, and for whom."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from tests.live.support import base_config, fake, live, run

from accelmux.monitors import holders, nvidia

GIB = 2**30
MIB = 2**20


def _sum(device: dict[str, Any]) -> int:
    return sum(entry["bytes"] for entry in device["breakdown"])


@pytest.fixture
def foreign_process() -> Any:
    proc = subprocess.Popen(  # a program accelmux does not control
        [sys.executable, "-c", "import time; x = bytearray(8 << 20); time.sleep(60)"]
    )
    yield proc
    proc.kill()
    proc.wait()


def test_explain_adds_up_names_foreign_holders_and_the_last_unload(
    tmp_path: Path, foreign_process: Any
) -> None:
    pids = tmp_path / "foreign"
    pids.mkdir()
    (pids / "hog.pid").write_text(str(foreign_process.pid))
    mem = {"weights": "2GiB"}
    cfg = base_config(
        a={"kind": "image", "memory": mem, "backend": fake()},
        b={"kind": "image", "memory": mem, "backend": fake()},
    )
    cfg["devices"]["gpu"]["foreign_pid_dir"] = str(pids)

    async def body() -> dict[str, Any]:
        async with live(cfg, tmp=tmp_path, sample=True) as lv:
            req = {"prompt": "x", "size": "64x64"}
            assert (await lv.post("/v1/images/generations", json={"model": "a", **req}))[0] == 200
            status, _, headers = await lv.post("/v1/images/generations", json={"model": "b", **req})
            assert status == 200
            await lv.runtime.sample_once()
            _, story = await lv.get(f"/admin/explain/{headers['X-Request-Id']}")
            _, full = await lv.get("/admin/explain")
            return {"story": story, "full": full}

    got = run(body())
    device = got["full"]["devices"]["gpu"]
    assert _sum(device) == device["capacity"] == 4 * GIB
    assert {e["category"] for e in device["breakdown"]} >= {"overhead", "foreign", "available"}
    unload = device["services"]["a"]["last_unload"]
    assert unload["reason"] == "evicted_for_memory" and unload["for_services"][0] == "b"
    assert unload["at"] <= time.time() and unload["tier"]
    (hog,) = device["foreign_holders"]
    assert hog["pid"] == foreign_process.pid and hog["name"].startswith("python")
    assert hog["bytes"] > 0 and "cgroup" in hog
    assert device["fragmentation"]["bytes"] is None and device["fragmentation"]["why"]
    compute = device["compute"]
    assert any(p["services"] == [] for p in compute["processes"])  # the daemon itself
    assert all(p["cpu_s"] >= 0 for p in compute["processes"])
    assert device["measured"]["total_bytes"] == 4 * GIB
    # the request's own story: the ledger when it waited, adding up the same way
    ledger = got["story"]["ledger"]
    if ledger is not None:
        for picture in ledger["devices"].values():
            assert _sum(picture) == picture["capacity"]


def test_explain_on_a_gpu_shows_nvml_utilisation_and_names_foreign_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, foreign_process: Any
) -> None:
    fake_nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: 0,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            total=8 * GIB, used=GIB, free=7 * GIB
        ),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=foreign_process.pid, usedGpuMemory=GIB)
        ],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=37, memory=12),
        nvmlDeviceGetProcessUtilization=lambda h, since: [
            types.SimpleNamespace(pid=foreign_process.pid, smUtil=35, memUtil=10)
        ],
    )
    monkeypatch.setattr(nvidia, "pynvml", fake_nvml)
    cfg = base_config()
    cfg["devices"] = {"gpu": {"kind": "nvidia", "index": 0, "capacity": "8GiB"}}

    async def body() -> dict[str, Any]:
        async with live(cfg, tmp=tmp_path, sample=True) as lv:
            await lv.runtime.sample_once()
            return (await lv.get("/admin/explain"))[1]

    device = run(body())["devices"]["gpu"]
    assert _sum(device) == 8 * GIB
    breakdown = {e["category"]: e["bytes"] for e in device["breakdown"]}
    assert 0 < breakdown["foreign"] == device["foreign"] <= GIB
    (holder,) = device["foreign_holders"]
    assert holder["pid"] == foreign_process.pid and holder["bytes"] == GIB
    assert holder["name"].startswith("python")
    compute = device["compute"]
    assert (compute["gpu_percent"], compute["memory_percent"]) == (37, 12)
    assert compute["gpu_processes"] == [
        {"pid": foreign_process.pid, "sm_percent": 35, "services": None}
    ]
    assert device["fragmentation"]["bytes"] == 0  # no inference worker on it


def test_containers_are_recognised_from_cgroup_paths() -> None:
    docker = "/system.slice/docker-0123456789abcdef0123456789abcdef.scope"
    assert holders.container_of(docker) == {"runtime": "docker", "id": "0123456789ab"}
    podman = "/machine.slice/libpod-fedcba9876543210fedcba9876543210.scope/container"
    assert holders.container_of(podman) == {"runtime": "podman", "id": "fedcba987654"}
    k8s = "/kubepods.slice/kubepods-besteffort.slice/pod1234-abcd/cri-containerd-aa"
    assert holders.container_of(k8s)["runtime"] == "kubernetes"  # type: ignore[index]
    assert holders.container_of("/lxc/frigate") == {"runtime": "lxc", "id": "frigate"}
    assert holders.container_of("/system.slice/frigate.service") is None
    assert holders.container_of(None) is None


def test_cgroup_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/system.slice/docker-" + "ab" * 32 + ".scope\n")
    path = holders.cgroup_of(42, proc_root=tmp_path)
    assert path is not None and holders.container_of(path) == {
        "runtime": "docker",
        "id": "abababababab",
    }
    assert holders.cgroup_of(43, proc_root=tmp_path) is None
