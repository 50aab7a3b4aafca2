"""Limits of a separate server: the cgroup v2 check on mountinfo/cgroup files laid out as
the kernel writes them, the limit arithmetic, the MPS variable, and the launcher as a
real process (death signal armed, parent checked, exec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from accelmux.backends import child_launch
from accelmux.backends.external import ExternalBackend
from accelmux.backends.limits import (
    CgroupSupport,
    detect_cgroup,
    gpu_memory_fraction,
    limit_bytes,
    make_service_cgroup,
    mps_limit_value,
)
from accelmux.config.backends import ARGV_PLACEHOLDERS, ExternalBackendConfig

HYBRID = (
    "25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755\n"
    "31 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


def _layout(tmp: Path, controllers: str, *, own: str = "/svc") -> tuple[Path, Path]:
    root = tmp / "cg"
    (root / own.lstrip("/")).mkdir(parents=True)
    (root / own.lstrip("/") / "cgroup.controllers").write_text(controllers + "\n")
    (root / own.lstrip("/") / "cgroup.subtree_control").write_text("\n")
    mountinfo = tmp / "mountinfo"
    mountinfo.write_text(HYBRID + f"40 25 0:30 / {root} rw - cgroup2 cgroup2 rw\n")
    self_cgroup = tmp / "cgroup"
    self_cgroup.write_text(f"4:memory:/x\n0::{own}\n")
    return mountinfo, self_cgroup


def test_no_cgroup2_mount_is_said(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(HYBRID)
    support = detect_cgroup(mountinfo=mountinfo, self_cgroup=tmp_path / "none")
    assert support == CgroupSupport(parent=None, problem="no cgroup v2 mounted")


def test_cgroup2_without_memory_controller_is_said(tmp_path: Path) -> None:
    mountinfo, self_cgroup = _layout(tmp_path, "hugetlb pids")
    support = detect_cgroup(mountinfo=mountinfo, self_cgroup=self_cgroup)
    assert support.parent is None
    assert support.problem is not None and "no memory controller" in support.problem
    assert "hugetlb, pids" in support.problem


def test_delegated_cgroup_gets_memory_enabled_and_a_service_limit(tmp_path: Path) -> None:
    mountinfo, self_cgroup = _layout(tmp_path, "cpu memory pids")
    support = detect_cgroup(mountinfo=mountinfo, self_cgroup=self_cgroup)
    assert support.problem is None and support.parent == tmp_path / "cg" / "svc"
    assert (support.parent / "cgroup.subtree_control").read_text() == "+memory\n"
    path = make_service_cgroup(support.parent, "chat", 123 << 20)
    assert path.name == "accelmux-chat"
    assert (path / "memory.max").read_text() == f"{123 << 20}\n"


def test_this_machine_is_checked_without_error() -> None:
    support = detect_cgroup()
    assert (support.parent is None) != (support.problem is None)


@given(
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 34),
    st.integers(0, 1 << 36),
    st.integers(0, 1 << 32),
    st.integers(1, 64),
    st.floats(0, 10),
)
def test_limit_covers_the_ledger_entry(
    weights: int, runtime: int, kv: int, workspace: int, concurrency: int, margin: float
) -> None:
    entry = weights + runtime + kv + concurrency * workspace
    limit = limit_bytes(
        weights=weights,
        runtime=runtime,
        kv_pool=kv,
        workspace=workspace,
        concurrency=concurrency,
        margin=margin,
    )
    assert entry <= limit + 1  # int() of the product rounds down by less than a byte
    assert limit <= entry * (1 + margin) + 1


@given(st.integers(0, 1 << 42), st.one_of(st.none(), st.integers(1, 1 << 42)))
def test_gpu_fraction_is_a_valid_utilization(limit: int, capacity: int | None) -> None:
    fraction = gpu_memory_fraction(limit, capacity)
    assert 0 < fraction <= 1.0


def test_mps_limit_is_in_mib_for_the_visible_device() -> None:
    assert mps_limit_value(3 << 30) == "0=3072M"


def test_every_placeholder_is_templated_and_mps_limit_set_when_mps_is_on(tmp_path: Path) -> None:
    cfg = ExternalBackendConfig(
        type="external",
        argv=["x", "--gpu-memory-utilization", "{gpu_memory_utilization}"],
        env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)},
    )
    backend = ExternalBackend(
        "llm", "llm", cfg, gpu_index=0, device_capacity=16 << 30, workspace_bytes=1 << 30
    )
    backend._apply_limits(weights_bytes=6 << 30, runtime_bytes=1 << 30)
    values = backend._values(1)
    assert set(values) == set(ARGV_PLACEHOLDERS)
    assert values["memory_limit_bytes"] == 10 << 30  # (6 + 1 + 1 x 1) GiB x 1.25
    assert values["gpu_memory_utilization"] == 0.625
    assert backend._env()["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    limit = backend.describe()["limit"]
    assert limit["summary"] == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT 0=10240M (CUDA MPS)"
    assert limit["cgroup_problem"] == "cgroup memory.max does not cover GPU memory"
    assert "flags: {gpu_memory_utilization}" in limit["applied"]
    assert "env: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in limit["applied"]


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", child_launch.__file__, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_launcher_arms_the_death_signal_and_execs_in_the_same_process() -> None:
    # PR_GET_PDEATHSIG (2) in the program the launcher became: the signal survived exec.
    probe = (
        "import ctypes, os; sig = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0); "
        "print(os.getppid(), sig.value)"
    )
    out = _launch("--parent", str(os.getpid()), "--", sys.executable, "-c", probe)
    assert out.returncode == 0, out.stderr
    parent, signal_number = map(int, out.stdout.split())
    assert parent == os.getpid()  # exec'd in place: still our direct child
    assert signal_number == signal.SIGKILL


def test_launcher_refuses_to_start_when_its_parent_is_not_the_one_named() -> None:
    out = _launch("--parent", "1", "--", sys.executable, "-c", "print('ran')")
    assert out.returncode == 1 and "ran" not in out.stdout


def test_launcher_reports_a_missing_program() -> None:
    out = _launch("--parent", str(os.getpid()), "--", "/nonexistent/server")
    assert out.returncode == 127 and "cannot start" in out.stderr
