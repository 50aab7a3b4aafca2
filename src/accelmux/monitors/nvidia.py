"""NVIDIA GPUs through NVML (nvidia-ml-py). Absent driver or GPU is never a crash.

``used`` is NVML's device used memory; a service's bytes are the NVML per-process used
memory of its process tree plus what its in-process backend reports.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from accelmux.core.events import MemorySampled
from accelmux.monitors.base import DeviceSample, ServiceProcesses
from accelmux.monitors.process import tree_pids

try:  # pragma: no cover - depends on the machine
    import pynvml
except ImportError:  # pragma: no cover
    pynvml = None


class NvmlUnavailable(Exception):
    """NVML or the GPU is not there."""


def _init() -> Any:
    if pynvml is None:
        raise NvmlUnavailable("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
    return pynvml


def nvml_open(index: int) -> tuple[Any, Any]:
    """(the NVML module, GPU ``index``'s handle); NVML stays initialised (NVML counts)."""
    nv = _init()
    try:
        return nv, nv.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        nv.nvmlShutdown()
        raise NvmlUnavailable(f"NVML has no GPU {index}: {exc}") from None


def nvml_process_memory(nv: Any, handle: Any) -> dict[int, int]:
    """Used GPU memory per pid (compute and graphics processes) on one GPU."""
    out: dict[int, int] = {}
    for getter in (
        nv.nvmlDeviceGetComputeRunningProcesses,
        nv.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        try:
            for p in getter(handle):
                used = p.usedGpuMemory
                if used is not None:
                    out[int(p.pid)] = out.get(int(p.pid), 0) + int(used)
        except Exception:
            continue
    return out


def gpu_total(index: int) -> int | None:
    """Total memory of GPU ``index``, or None when there is no NVML/GPU."""
    try:
        nv = _init()
    except NvmlUnavailable:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        return int(nv.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:
        return None
    finally:
        nv.nvmlShutdown()


class NvidiaSampler:
    def __init__(self, device: str, *, index: int, capacity: int, budget: int) -> None:
        self.device = device
        self.index = index
        self.slack = max(0, capacity - budget)
        self.error: str | None = None
        self._nv: Any = None
        self._handle: Any = None
        try:
            self._nv = _init()
            self._handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            self.error = str(exc)
            self._nv = None

    def _process_memory(self) -> dict[int, int]:
        return nvml_process_memory(self._nv, self._handle)

    def sample(self, services: list[ServiceProcesses]) -> DeviceSample | None:
        if self._nv is None:
            return None
        try:
            info = self._nv.nvmlDeviceGetMemoryInfo(self._handle)
            per_pid = self._process_memory()
        except Exception as exc:
            self.error = str(exc)
            return None
        per_service: dict[str, int] = {}
        inprocess = 0
        for svc in services:
            n = svc.inprocess_bytes or 0
            inprocess += n
            for root in svc.pids:
                n += sum(per_pid.get(pid, 0) for pid in tree_pids(root))
            per_service[svc.service] = n
        own = per_pid.get(os.getpid(), 0)
        baseline = max(0, own - inprocess) + self.slack
        used = int(info.used)
        managed = sum(per_service.values())
        return DeviceSample(
            event=MemorySampled(
                device=self.device,
                used_bytes=used,
                per_service=per_service,
                baseline_bytes=baseline,
            ),
            total_bytes=int(info.total),
            details={
                "source": "nvml",
                "index": self.index,
                "used_bytes": used,
                "processes": len(per_pid),
                "baseline_bytes": baseline,
                "foreign_bytes": max(0, used - managed - baseline),
            },
        )

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None
