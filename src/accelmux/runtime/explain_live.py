"""What only the running daemon adds to ``/admin/explain``, beside the ledger's picture
(:mod:`accelmux.runtime.explain`):

* per device, the last measurement (``measured``: total and used bytes, when);
* **compute** in use: on an NVIDIA GPU, NVML's utilisation of the device and each of our
  processes' SM share; on every device, the CPU time of accelmux's own processes (the
  daemon, its inference workers, external servers) with their CPU percent since the
  previous explain, and the host's CPU percent;
* a **fragmentation** estimate where a runtime or NVML exposes one: on a GPU, what the
  inference workers' allocators keep beyond the runtimes' own buffer figures (growth
  claimed after requests, :mod:`accelmux.worker.gpu_account`) plus what NVML shows for a
  worker beyond its fixed overhead and every claim; elsewhere none (``why`` says so);
* **foreign holders** by name: the processes NVML (or a virtual device's pid files) shows
  that are not ours, and on the host device the largest processes not ours, each with
  its name, command, cgroup and container (:mod:`accelmux.monitors.holders`);
* per service, its **last unload** (reason, when, for whom: ``DecisionRecorder``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import psutil

from accelmux.backends.base import Backend
from accelmux.monitors.base import DeviceSample
from accelmux.monitors.holders import foreign_processes, largest_processes
from accelmux.monitors.process import tree_pids


class ProcessCpu:
    """CPU seconds of processes, and their CPU percent between two readings."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(None)  # the host's first reading starts its interval

    def read(self, pid: int) -> dict[str, Any] | None:
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
                first = True
            else:
                first = False
            times = proc.cpu_times()
            percent = proc.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return None
        return {
            "cpu_s": round(times.user + times.system, 3),
            "cpu_percent": None if first else round(percent, 1),
        }

    def host_percent(self) -> float:
        return round(psutil.cpu_percent(None), 1)


def our_processes(backends: Mapping[str, Backend]) -> dict[int, list[str]]:
    """pid -> the services it serves: the daemon itself (in-process services), the
    inference workers and external servers, with their children."""
    out: dict[int, list[str]] = {os.getpid(): []}
    for name, backend in backends.items():
        roots = list(backend.pids())
        client = getattr(backend, "client", None)
        pid = getattr(client, "pid", None)
        if isinstance(pid, int):
            roots.append(pid)
        for root in roots:
            for each in tree_pids(root) or [root]:
                out.setdefault(each, [])
                if name not in out[each]:
                    out[each].append(name)
    return out


def _fragmentation(
    device: str, sample: DeviceSample | None, backends: Mapping[str, Backend]
) -> dict[str, Any]:
    details = sample.details if sample is not None else {}
    if details.get("source") != "nvml":
        why = "no runtime or monitor of this device exposes allocator slack"
        return {"bytes": None, "why": why}
    growth = 0
    fixed: dict[int, int] = {}
    index = str(details.get("index", 0))
    for backend in backends.values():
        report = getattr(backend, "report", None)
        client = getattr(backend, "client", None)
        if not callable(report) or getattr(backend, "device", None) != device:
            continue
        if getattr(backend, "gpu_index", None) is None:
            continue
        growth += int(report().get("gpu_growth", 0) or 0)
        memory = getattr(client, "memory", None) or {}
        pid = getattr(client, "pid", None)
        if isinstance(pid, int):
            fixed[pid] = int((memory.get("gpu_overhead") or {}).get(index, 0))
    slack = sum(
        max(0, int(w["overhead_bytes"]) - fixed.get(int(w["pid"]), 0))
        for w in details.get("workers", [])
        if int(w["pid"]) in fixed
    )
    return {
        "bytes": growth + slack,
        "allocator_growth_bytes": growth,
        "unclaimed_bytes": slack,
        "source": "inference workers' allocator growth beyond their runtimes' buffers, "
        "and NVML's figure for each worker beyond its fixed overhead and every claim",
    }


def _compute(
    sample: DeviceSample | None, ours: dict[int, list[str]], cpu: ProcessCpu
) -> dict[str, Any]:
    details = sample.details if sample is not None else {}
    out: dict[str, Any] = {}
    utilization = details.get("utilization")
    if utilization is not None:
        sm = utilization.get("per_process_sm_percent") or {}
        out["gpu_percent"] = utilization.get("gpu_percent")
        out["memory_percent"] = utilization.get("memory_percent")
        out["gpu_processes"] = [
            {"pid": int(pid), "sm_percent": n, "services": ours.get(int(pid))}
            for pid, n in sorted(sm.items())
        ]
    out["host_cpu_percent"] = cpu.host_percent()
    processes = []
    for pid, services in sorted(ours.items()):
        reading = cpu.read(pid)
        if reading is not None:
            processes.append({"pid": pid, "services": services, **reading})
    out["processes"] = processes
    return out


def _foreign_holders(
    device_kind: str, sample: DeviceSample | None, ours: dict[int, list[str]]
) -> list[dict[str, Any]]:
    details = sample.details if sample is not None else {}
    per_pid = {int(pid): int(n) for pid, n in (details.get("per_process_bytes") or {}).items()}
    owned = set(ours)
    for worker in details.get("workers", []):
        owned.add(int(worker["pid"]))
    if device_kind == "host":
        return largest_processes(owned)
    return foreign_processes(per_pid, owned)


def enrich(
    answer: dict[str, Any],
    *,
    kinds: Mapping[str, str],
    last_samples: Mapping[str, tuple[float, DeviceSample]],
    backends: Mapping[str, Backend],
    last_unloads: Mapping[str, dict[str, Any]],
    cpu: ProcessCpu,
    batches: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``answer`` (:func:`accelmux.runtime.explain.why_full`) with the daemon's figures."""
    ours = our_processes(backends)
    for name, device in answer["devices"].items():
        at, sample = last_samples.get(name, (None, None))
        device["measured"] = (
            None
            if sample is None
            else {
                "sampled_at": at,
                "age_s": round(time.time() - at, 3) if at is not None else None,
                "total_bytes": sample.total_bytes,
                "used_bytes": sample.event.used_bytes,
            }
        )
        device["compute"] = _compute(sample, ours, cpu)
        device["fragmentation"] = _fragmentation(name, sample, backends)
        device["foreign_holders"] = _foreign_holders(kinds.get(name, ""), sample, ours)
        for service, entry in device["services"].items():
            entry["last_unload"] = last_unloads.get(service)
            if batches and service in batches:
                # a service that may shrink: the batch it runs with, and why (Rebatch)
                entry["batch"] = batches[service]
    return answer
