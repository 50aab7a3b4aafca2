"""A fake ``pynvml`` (nvidia-ml-py's module) for ``bench/gpu_check.py --fake-nvml``: one GPU
whose processes and their memory are read, on every call, from the JSON file named by
``ACCELMUX_FAKE_NVML`` (``{"name", "total", "processes": {pid: bytes}}``, optionally
``"utilization": {"gpu", "memory"}`` and ``"sm": {pid: percent}``). Used memory is the
processes' sum. Put this folder first on ``PYTHONPATH`` to use it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _state() -> dict[str, Any]:
    path = os.environ.get("ACCELMUX_FAKE_NVML")
    if not path:
        raise NVMLError("ACCELMUX_FAKE_NVML names no state file")
    return dict(json.loads(Path(path).read_text(encoding="utf-8")))


def nvmlInit() -> None:  # NVML's own names
    _state()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if index != 0:
        raise NVMLError(f"no GPU {index}")
    return 0


def nvmlDeviceGetName(handle: int) -> str:
    return str(_state().get("name", "Fake NVIDIA GPU"))


def _processes() -> dict[int, int]:
    return {int(pid): int(n) for pid, n in _state().get("processes", {}).items()}


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    total = int(_state()["total"])
    used = sum(_processes().values())
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in _processes().items()]


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return []


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    rates = _state().get("utilization") or {}
    return SimpleNamespace(gpu=int(rates.get("gpu", 0)), memory=int(rates.get("memory", 0)))


def nvmlDeviceGetProcessUtilization(handle: int, since: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=int(pid), smUtil=int(n), memUtil=0, timeStamp=since)
        for pid, n in (_state().get("sm") or {}).items()
    ]
