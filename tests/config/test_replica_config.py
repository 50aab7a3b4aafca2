"""Config checks for a service that may run on several devices, end to end through
``accelmux check``, and the factory's choice of device for each replica's backend."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmux.backends.external import ExternalBackend
from accelmux.backends.factory import build_backends, gpu_index
from accelmux.cli import main
from accelmux.config.load import load_config_data
from accelmux.config.specs import to_manager_spec
from accelmux.errors import ConfigError


def _config(backend: dict[str, Any], **service: Any) -> dict[str, Any]:
    return {
        "devices": {
            "gpu0": {"kind": "nvidia", "index": 3, "capacity": "8GiB"},
            "gpu1": {"kind": "nvidia", "index": 5, "capacity": "16GiB"},
        },
        "services": {
            "chat": {
                "kind": "chat",
                "memory": {"weights": "1GiB"},
                "backend": backend,
                **service,
            }
        },
    }


def _external(**kw: Any) -> dict[str, Any]:
    return {"type": "external", "argv": [sys.executable, "-c", "pass", "{port}"], **kw}


def _check(tmp_path: Path, data: dict[str, Any]) -> int:
    path = tmp_path / "accelmux.yaml"
    path.write_text(yaml.safe_dump(data))
    return main(["check", str(path)])


def test_device_and_devices_together_is_reported_by_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _config(_external(), device="gpu0", devices=["gpu0", "gpu1"])
    assert _check(tmp_path, data) == 2
    captured = capsys.readouterr()
    assert "services.chat.devices: give device or devices, not both (got both)" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_a_fixed_port_cannot_serve_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _check(tmp_path, _config(_external(port=8701))) == 2
    err = capsys.readouterr().err
    assert "services.chat.backend.port: a fixed port cannot serve one replica per device" in err
    assert "leave port unset" in err and "device: gpu0" in err
    # one device, or a pinned service (placed once): one process, the port is fine
    assert _check(tmp_path, _config(_external(port=8701), devices=["gpu1"])) == 0
    assert _check(tmp_path, _config(_external(port=8701), residency="pinned")) == 0


def test_a_visibility_of_its_own_cannot_serve_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _config(_external(env={"CUDA_VISIBLE_DEVICES": "0"}))
    assert _check(tmp_path, data) == 2
    assert "services.chat.backend.env.CUDA_VISIBLE_DEVICES: accelmux sets it per replica" in (
        capsys.readouterr().err
    )


def test_each_replica_backend_sees_its_own_device(tmp_path: Path) -> None:
    cfg = load_config_data(_config(_external(), devices=["gpu0", "gpu1"]), "test")
    spec = to_manager_spec(cfg)
    backends = build_backends(
        cfg, tmp_path, spec.services, capacities={d.name: d.capacity_bytes for d in spec.devices}
    )
    assert set(backends) == {"chat@gpu0", "chat@gpu1"}
    first, second = backends["chat@gpu0"], backends["chat@gpu1"]
    assert isinstance(first, ExternalBackend) and isinstance(second, ExternalBackend)
    assert (first.gpu_index, second.gpu_index) == (3, 5)  # each device's index, not the first's
    assert (first.device_capacity, second.device_capacity) == (8 << 30, 16 << 30)
    assert first.model == second.model == "chat"
    assert first._env()["CUDA_VISIBLE_DEVICES"] == "3"
    assert second._env()["CUDA_VISIBLE_DEVICES"] == "5"
    assert first.output is not second.output  # a log (and pid file) of its own


def test_the_factory_refuses_a_fixed_port_for_replicas(tmp_path: Path) -> None:
    """Its own guard, for a config that did not go through the check."""
    cfg = load_config_data(_config(_external()), "test")
    spec = to_manager_spec(cfg)
    chat = cfg.services["chat"]
    assert chat.backend is not None
    fixed = chat.backend.model_copy(update={"port": 8701})
    cfg = cfg.model_copy(update={"services": {"chat": chat.model_copy(update={"backend": fixed})}})
    with pytest.raises(ConfigError) as info:
        build_backends(cfg, tmp_path, spec.services)
    assert any("a fixed port cannot serve" in p for p in info.value.problems)


def test_gpu_index_is_for_nvidia_devices_only() -> None:
    cfg = load_config_data(
        {
            "devices": {
                "gpu": {"kind": "nvidia", "index": 2, "capacity": "8GiB"},
                "ram": {"kind": "host", "capacity": "8GiB"},
            },
            "services": {"chat": {"kind": "chat", "device": "gpu"}},
        },
        "test",
    )
    assert gpu_index(cfg.devices["gpu"]) == 2
    assert gpu_index(cfg.devices["ram"]) is None
