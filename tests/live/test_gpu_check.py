"""``bench/gpu_check.py`` (the report of ``scripts/gpu-check``) end to end without a GPU:
the fake stack on an nvidia device and the fake NVML of ``bench/fake_nvml``, nothing
built; the JSON's structure and its error figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402

MIB = 2**20


def test_fake_run_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    argv = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--fake-nvml", "--no-build"]
    done = subprocess.run(
        [*argv, "--chains", "2", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OOMs: 0" in done.stdout and "voice p95" in done.stdout
    result: dict[str, Any] = json.loads(out.read_text())
    assert set(result) >= {"meta", "gpu", "processes", "services", "ooms", "voice", "ttft"}
    assert result["meta"]["commit"] and result["meta"]["machine"]["cpus"]
    assert result["meta"]["settings"]["mode"] == "fake-nvml"
    assert result["gpu"]["name"] == "Fake NVIDIA GPU"
    assert result["ooms"] == 0
    services = {row["service"] for row in result["services"]}
    assert services == {"chat", "big", "completion", "embeddings", "tts", "asr"}
    assert len(result["processes"]) == len(services)  # one fake process each
    for row in result["processes"]:
        expected = (row["ledger_bytes"] + row["overhead_bytes"] - row["nvml_bytes"]) * 100
        assert row["error_pct"] == pytest.approx(round(expected / row["nvml_bytes"], 2))
        # the fake GPU holds each service's ledger bytes x FAKE_SKEW
        assert row["error_pct"] == pytest.approx((1 / gpu_check.FAKE_SKEW - 1) * 100, abs=0.01)
    voice = result["voice"]
    assert voice["chains_alone"] == voice["chains_loaded"] == 2
    assert voice["p95_alone_s"] > 0 and voice["p95_loaded_s"] > 0
    for name in ("chat", "big", "completion"):
        assert result["ttft"][name]["ttft_p50_s"] is not None, name


def test_error_and_process_rows() -> None:
    assert gpu_check.error_pct(110, 100) == 10.0
    assert gpu_check.error_pct(1, 3) == -66.67
    assert gpu_check.error_pct(5, 0) is None
    ledger = {"weights": 100 * MIB, "runtime": 10 * MIB, "kv": 20 * MIB, "active": 0}
    status = {
        "devices": [
            {
                "name": "gpu",
                "kind": "nvidia",
                "measured": {"workers": [{"pid": 7, "overhead_bytes": 20 * MIB}]},
            }
        ],
        "services": [
            {"name": "a", "device": "gpu", "state": "loaded", "ledger": ledger,
             "backend": {"pid": 7}, "measured_bytes": 130 * MIB, "kind": "chat"},
            {"name": "b", "device": "gpu", "state": "loaded",
             "ledger": {**ledger, "reserved": 999}, "backend": {"pid": 7},
             "measured_bytes": 0, "kind": "tts"},
        ],
    }  # fmt: skip
    owners = gpu_check.owners_from_status(status)
    assert owners == {7: ["a", "b"]}
    (row,) = gpu_check.process_rows(status, {7: 300 * MIB}, owners)
    assert row["ledger_bytes"] == 260 * MIB  # reserved is left out
    assert row["error_pct"] == -6.67  # 260 MiB + 20 MiB of overhead vs NVML's 300 MiB
    assert row["error_pct_without_overhead"] == -13.33
    rows = {r["service"]: r for r in gpu_check.service_rows(status)}
    assert rows["a"]["error_pct"] == 0.0 and rows["b"]["error_pct"] is None
    assert gpu_check.count_ooms(["CUDA error: out of memory"], status, "") == 1
