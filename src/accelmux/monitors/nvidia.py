"""NVIDIA GPUs through NVML (nvidia-ml-py). Absent driver or GPU is never a crash.

``used`` is NVML's device used memory; a service's bytes are the NVML per-process used
memory of its process tree plus what its in-process backend reports.

Services hosted by the shared inference worker are one process to NVML. The worker says
what each of its services holds on the GPU (llama.cpp's buffers, an ONNX Runtime
session's load delta); :func:`reconcile_worker` turns those claims and NVML's figure for
the worker process into per-service bytes that add up to NVML's figure: each service
its claim, and the rest (the CUDA context, allocator slack) the worker's ``overhead``;
when the claims add up to more than NVML sees, they are scaled down to it (no overhead).
The overhead goes to the Manager as ``MemorySampled.overhead_bytes`` (in use, never
foreign) and each worker's figures to the status page (``workers``).
"""

from __future__ import annotations

import contextlib
import os
import time
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


def nvml_utilization(nv: Any, handle: Any, since_us: int) -> dict[str, Any]:
    """Compute use: the GPU's busy percentages over NVML's last sample period
    (``gpu_percent``: kernels running, ``memory_percent``: memory being read or written)
    and each process's SM percentage since ``since_us`` (NVML's timestamp, microseconds;
    ``per_process_sm_percent``: pid -> %, its highest sample). A GPU or driver without
    these readings leaves them out (None)."""
    out: dict[str, Any] = {"gpu_percent": None, "memory_percent": None}
    try:
        rates = nv.nvmlDeviceGetUtilizationRates(handle)
        out["gpu_percent"], out["memory_percent"] = int(rates.gpu), int(rates.memory)
    except Exception:
        pass
    per_process: dict[str, int] = {}
    try:
        for sample in nv.nvmlDeviceGetProcessUtilization(handle, since_us):
            key = str(int(sample.pid))
            per_process[key] = max(per_process.get(key, 0), int(sample.smUtil))
    except Exception:  # NVML_ERROR_NOT_FOUND (no sample yet), NOT_SUPPORTED
        pass
    out["per_process_sm_percent"] = per_process
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


def reconcile_worker(nvml_bytes: int, claims: dict[str, int]) -> tuple[dict[str, int], int]:
    """(bytes per service, overhead) of one worker process that NVML measures as
    ``nvml_bytes`` and whose services claim ``claims``: they add up to ``nvml_bytes``,
    and no service gets more than its claim."""
    total = max(0, nvml_bytes)
    wanted = {name: max(0, n) for name, n in claims.items()}
    claimed = sum(wanted.values())
    if claimed <= total:
        return wanted, total - claimed
    shares = {name: n * total // claimed for name, n in wanted.items()}
    left = total - sum(shares.values())  # the floor's remainder, a byte each in turn
    for name in sorted(wanted, key=lambda k: -wanted[k]):
        if left <= 0:
            break
        if shares[name] < wanted[name]:
            shares[name] += 1
            left -= 1
    return shares, 0


class NvidiaSampler:
    def __init__(self, device: str, *, index: int, capacity: int, budget: int) -> None:
        self.device = device
        self.index = index
        self.slack = max(0, capacity - budget)
        self.error: str | None = None
        self._nv: Any = None
        self._handle: Any = None
        self._utilization_since_us = 0
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
        claims: dict[int, dict[str, int]] = {}  # worker pid -> service -> claimed bytes
        for svc in services:
            n = svc.inprocess_bytes or 0
            inprocess += n
            for root in svc.pids:
                n += sum(per_pid.get(pid, 0) for pid in tree_pids(root))
            per_service[svc.service] = n
            if svc.gpu_claim is not None:
                pid, nbytes = svc.gpu_claim
                claims.setdefault(pid, {})[svc.service] = nbytes
        workers = []
        overhead = 0
        for pid, claimed in claims.items():
            nvml_bytes = per_pid.get(pid, 0)
            shares, extra = reconcile_worker(nvml_bytes, claimed)
            for name, n in shares.items():
                per_service[name] += n
            overhead += extra
            workers.append(
                {
                    "pid": pid,
                    "nvml_bytes": nvml_bytes,
                    "claimed_bytes": claimed,
                    "attributed_bytes": shares,
                    "overhead_bytes": extra,
                }
            )
        utilization = nvml_utilization(self._nv, self._handle, self._utilization_since_us)
        self._utilization_since_us = int(time.time() * 1_000_000)
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
                overhead_bytes=overhead,
            ),
            total_bytes=int(info.total),
            details={
                "source": "nvml",
                "index": self.index,
                "used_bytes": used,
                "processes": len(per_pid),
                "baseline_bytes": baseline,
                "overhead_bytes": overhead,
                "workers": workers,
                "per_process_bytes": {str(pid): n for pid, n in sorted(per_pid.items())},
                "foreign_bytes": max(0, used - managed - baseline - overhead),
                "utilization": utilization,
            },
        )

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None
