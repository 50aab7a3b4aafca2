"""Old spellings still load as the new ones, and each is reported with its key path."""

from __future__ import annotations

import asyncio
import copy
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelmux.cli import main
from accelmux.config.backends import WorkerBackendConfig
from accelmux.config.deprecated import modernize
from accelmux.config.load import load_config_data
from accelmux.server.serve import serve

NOTICE = (
    "services.chat.backend.type: 'inprocess' is deprecated (inprocess-backend, since accelmux "
    "0.1.0), write 'worker' "
    "(the model runs in accelmux's inference worker process, not in the daemon's)"
)


def _config(backend_type: str, tmp_path: Path, port: int = 8600) -> dict[str, Any]:
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB"}},
        "services": {
            "chat": {
                "kind": "chat",
                "residency": "on-demand",
                "memory": {"weights": "64MiB"},
                "backend": {"type": backend_type, "options": {"model": "smollm2"}},
            },
            "fake": {"kind": "embeddings", "backend": {"type": "fake"}},
        },
        "policy": {"prewarm": False},
        "server": {"data_dir": str(tmp_path / "data"), "port": port},
    }


def test_the_old_backend_type_reads_as_worker_with_a_notice(tmp_path: Path) -> None:
    data = _config("inprocess", tmp_path)
    before = copy.deepcopy(data)
    cfg = load_config_data(data, "cfg.yaml")
    assert data == before  # the caller's data is not changed
    assert isinstance(cfg.services["chat"].backend, WorkerBackendConfig)
    assert cfg.services["chat"].backend.type == "worker"
    assert cfg.deprecations == (NOTICE,)
    assert load_config_data(_config("worker", tmp_path), "cfg.yaml").deprecations == ()


def test_only_the_renamed_key_path_is_rewritten() -> None:
    data = {"services": {"a": {"backend": {"type": "inprocess"}, "model": "inprocess"}}}
    data["other"] = {"backend": {"type": "inprocess"}}
    new, notices = modernize(data)
    assert new["services"]["a"] == {"backend": {"type": "worker"}, "model": "inprocess"}
    assert new["other"] is data["other"]
    assert notices == [
        "services.a.backend.type: 'inprocess' is deprecated (inprocess-backend, since accelmux "
        "0.1.0), write 'worker' (the model runs "
        "in accelmux's inference worker process, not in the daemon's)"
    ]
    assert modernize({"services": ["not", "a", "mapping"]}) == (
        {"services": ["not", "a", "mapping"]},
        [],
    )


def test_check_names_the_old_spelling_and_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_config("inprocess", tmp_path)), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr()
    assert f"{path}: {NOTICE}" in out.err.splitlines()
    assert "OK" in out.out
    path.write_text(yaml.safe_dump(_config("worker", tmp_path)), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    assert "deprecated" not in capsys.readouterr().err


def test_check_of_a_scenario_names_it_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _config("inprocess", tmp_path)
    data["workloads"] = [{"type": "poisson", "service": "chat", "rate_per_h": 60.0}]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr()
    assert f"{path}: {NOTICE}" in out.err.splitlines(), out
    assert "scenario" in out.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_logs_each_old_spelling_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config_data(_config("inprocess", tmp_path, _free_port()), "cfg.yaml")

    async def start_and_stop() -> None:
        stop = asyncio.Event()
        stop.set()
        await serve(cfg, stop=stop)

    with caplog.at_level(logging.WARNING, logger="accelmux"):
        asyncio.run(start_and_stop())
    logged = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert logged == [f"config: {NOTICE}"]
    assert "accelmux stopped" in capsys.readouterr().out
