"""Who holds memory that accelmux does not control, by name: the process (its name and
command), and its container or cgroup where it has one (``/proc/PID/cgroup``).

A container is recognised from its cgroup path as Docker (``/docker/ID``,
``docker-ID.scope``), Podman (``libpod-ID.scope``), containerd/CRI (``cri-containerd-ID``,
``crio-ID``), Kubernetes (``kubepods...``) or LXC (``/lxc/NAME``, ``lxc.payload.NAME``);
otherwise the cgroup path itself is given (a systemd unit such as
``/system.slice/frigate.service`` names the program well enough).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psutil

#: (runtime, pattern whose group 1 is the container's id or name) for cgroup paths.
CONTAINERS = (
    ("docker", re.compile(r"docker[-/]([0-9a-f]{12,64})")),
    ("podman", re.compile(r"libpod-([0-9a-f]{12,64})")),
    ("containerd", re.compile(r"cri-containerd-([0-9a-f]{12,64})")),
    ("cri-o", re.compile(r"crio-([0-9a-f]{12,64})")),
    ("kubernetes", re.compile(r"kubepods[^/]*/(?:[^/]*/)?(pod[0-9a-f_-]+)")),
    ("lxc", re.compile(r"(?:/lxc/|lxc\.payload\.)([\w.-]+)")),
)


def cgroup_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The process's cgroup path (the unified hierarchy's, else the first named one)."""
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    paths = [line.split(":", 2)[2] for line in lines if line.count(":") >= 2]
    unified = [p for line, p in zip(lines, paths, strict=True) if line.startswith("0::")]
    found = (unified or paths)[:1]
    return found[0] or None if found else None


def container_of(cgroup: str | None) -> dict[str, str] | None:
    """``{"runtime", "id"}`` when the cgroup path is a container's, else None."""
    if not cgroup:
        return None
    for runtime, pattern in CONTAINERS:
        match = pattern.search(cgroup)
        if match:
            return {"runtime": runtime, "id": match.group(1)[:12]}
    return None


def describe(pid: int, nbytes: int | None = None) -> dict[str, Any]:
    """One process, for people: pid, name, command, cgroup, container; gone: no name."""
    entry: dict[str, Any] = {"pid": pid, "bytes": nbytes, "name": None, "command": None}
    try:
        proc = psutil.Process(pid)
        entry["name"] = proc.name()
        cmdline = proc.cmdline()
        entry["command"] = " ".join(cmdline)[:200] if cmdline else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
    cgroup = cgroup_of(pid)
    entry["cgroup"] = cgroup
    entry["container"] = container_of(cgroup)
    return entry


def foreign_processes(per_pid: dict[int, int], ours: set[int]) -> list[dict[str, Any]]:
    """The processes of ``per_pid`` (pid -> bytes) that are not ``ours``, largest first."""
    others = sorted(
        ((pid, n) for pid, n in per_pid.items() if pid not in ours and n > 0),
        key=lambda kv: (-kv[1], kv[0]),
    )
    return [describe(pid, n) for pid, n in others]


def largest_processes(ours: set[int], limit: int = 5) -> list[dict[str, Any]]:
    """The ``limit`` processes with the most resident memory that are not ``ours`` (on
    the host device, where every process's RAM counts)."""
    sizes: list[tuple[int, int]] = []
    for proc in psutil.process_iter(["pid", "memory_info"]):
        info = proc.info
        mem = info.get("memory_info")
        if info["pid"] in ours or mem is None:
            continue
        sizes.append((int(info["pid"]), int(mem.rss)))
    sizes.sort(key=lambda kv: (-kv[1], kv[0]))
    return [describe(pid, n) for pid, n in sizes[:limit]]
