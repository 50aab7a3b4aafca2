"""Limits for a separate server process, derived from its ledger entry.

* A cgroup v2 ``memory.max`` on host-memory devices, where the host lets accelmux make
  child cgroups: a cgroup2 mount whose cgroup (the daemon's own) offers the ``memory``
  controller to its children and is writable (e.g. systemd ``Delegate=yes``). Where it
  does not, :func:`detect_cgroup` says why, and the service's status shows
  ``limit: none — <why>``.
* The server's own flags: ``{ctx_size}``, ``{parallel}``, ``{gpu_memory_utilization}``
  (the limit as a fraction of the GPU) and ``{memory_limit_bytes}`` in its argv, and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in its environment when CUDA MPS is in use (the
  environment names ``CUDA_MPS_PIPE_DIRECTORY``).
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MOUNTINFO = Path("/proc/self/mountinfo")
SELF_CGROUP = Path("/proc/self/cgroup")
MPS_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupSupport:
    """Where service cgroups can be made (``parent``), or why not (``problem``)."""

    parent: Path | None
    problem: str | None


def limit_bytes(
    *, weights: int, runtime: int, kv_pool: int, workspace: int, concurrency: int, margin: float
) -> int:
    """The most a server may hold: its ledger entry with ``concurrency`` requests at their
    workspace, plus ``margin`` (a fraction) for what estimates miss."""
    entry = weights + runtime + kv_pool + concurrency * workspace
    return int(entry * (1.0 + margin))


def cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        if sep and tail.split()[0] == "cgroup2":
            return Path(head.split()[4])
    return None


def own_cgroup(self_cgroup: Path = SELF_CGROUP) -> str | None:
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def detect_cgroup(*, mountinfo: Path = MOUNTINFO, self_cgroup: Path = SELF_CGROUP) -> CgroupSupport:
    """Can accelmux put a server into a child cgroup with a ``memory.max``?"""
    mount = cgroup2_mount(mountinfo)
    if mount is None:
        return CgroupSupport(parent=None, problem="no cgroup v2 mounted")
    path = own_cgroup(self_cgroup)
    if path is None:
        return CgroupSupport(parent=None, problem="this process is in no cgroup v2 hierarchy")
    parent = mount / path.lstrip("/")
    try:
        controllers = (parent / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return CgroupSupport(parent=None, problem=f"cgroup v2 at {parent} unreadable ({exc})")
    if "memory" not in controllers:
        shown = ", ".join(controllers) or "none"
        return CgroupSupport(
            parent=None,
            problem=f"cgroup v2 at {parent} offers no memory controller (has: {shown})",
        )
    if not os.access(parent, os.W_OK):
        return CgroupSupport(
            parent=None, problem=f"cgroup v2 not writable ({parent}; not delegated to accelmux)"
        )
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if "memory" not in enabled:
            (parent / "cgroup.subtree_control").write_text("+memory\n")
    except OSError as exc:
        why = "it holds processes itself" if exc.errno == errno.EBUSY else str(exc)
        return CgroupSupport(
            parent=None,
            problem=f"cannot enable the memory controller below {parent} ({why})",
        )
    return CgroupSupport(parent=parent, problem=None)


def make_service_cgroup(parent: Path, service: str, max_bytes: int) -> Path:
    """Create (or reuse) ``parent/accelmux-<service>`` with ``memory.max``; OSError when the
    kernel refuses."""
    path = parent / f"accelmux-{service}"
    path.mkdir(exist_ok=True)
    (path / "memory.max").write_text(f"{max_bytes}\n")
    with contextlib.suppress(OSError):
        (path / "memory.swap.max").write_text("0\n")  # over the limit is over, not swapped
    return path


def remove_service_cgroup(path: Path) -> None:
    """Kill what is left in it and remove it (best effort: it may still be draining)."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1\n")
    with contextlib.suppress(OSError):
        path.rmdir()


def gpu_memory_fraction(max_bytes: int, capacity: int | None) -> float:
    """``max_bytes`` as a fraction of the GPU (vLLM's ``--gpu-memory-utilization``), in
    (0, 1] with 3 decimals; 1.0 when the capacity is unknown."""
    if not capacity:
        return 1.0
    return max(0.001, min(1.0, round(max_bytes / capacity, 3)))


def mps_in_use(env: dict[str, str]) -> bool:
    return bool(env.get(MPS_ENV))


def mps_limit_value(max_bytes: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for the one visible device, in MiB."""
    return f"0={max(1, max_bytes // (1 << 20))}M"


def _uses(argv: list[str], placeholder: str) -> bool:
    return any("{" + placeholder + "}" in arg for arg in argv)


def apply_limits(
    service: str,
    limit: int,
    *,
    argv: list[str],
    env: dict[str, str],
    on_gpu: bool,
    enabled: bool,
    cgroup: CgroupSupport | None,
) -> tuple[Path | None, dict[str, Any]]:
    """How ``limit`` (bytes) is applied to a server started from ``argv`` with ``env``:
    the cgroup made for it where possible, and the facts ``/admin/status`` shows (what
    was applied, or why nothing could be)."""
    applied: list[str] = []
    flags = [p for p in ("ctx_size", "parallel", "gpu_memory_utilization") if _uses(argv, p)]
    if _uses(argv, "memory_limit_bytes"):
        flags.append("memory_limit_bytes")
    if flags:
        applied.append("flags: " + ", ".join("{" + f + "}" for f in flags))
    if mps_in_use(env):
        applied.append(f"env: {MPS_LIMIT_ENV}")
    problem: str | None = None
    cgroup_path: Path | None = None
    if on_gpu:
        problem = "cgroup memory.max does not cover GPU memory"
    elif not enabled:
        problem = "memory_limit is off"
    elif cgroup is None or cgroup.parent is None:
        problem = cgroup.problem if cgroup else "not checked"
    else:
        try:
            cgroup_path = make_service_cgroup(cgroup.parent, service, limit)
            applied.append(f"cgroup v2 memory.max at {cgroup_path}")
        except OSError as exc:
            problem = f"cannot make a cgroup under {cgroup.parent} ({exc})"
    if cgroup_path is not None:
        summary = f"memory.max {limit} bytes (cgroup v2)"
    elif mps_in_use(env):
        summary = f"{MPS_LIMIT_ENV} {mps_limit_value(limit)} (CUDA MPS)"
    else:
        summary = f"none — {problem}"
        if flags:
            summary += "; its own flags carry the ledger's sizes"
    return cgroup_path, {
        "memory_max_bytes": limit,
        "applied": applied,
        "cgroup": str(cgroup_path) if cgroup_path else None,
        "cgroup_problem": problem,
        "summary": summary,
    }
