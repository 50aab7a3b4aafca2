"""``accelmux setup``'s parts: the wheel packing, the build settings, and a clear message
and exit status when a step cannot run."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from accelmux.models import llama_adapter
from accelmux.setup import steps
from accelmux.setup.llama import PORTABLE_FLAGS, SERVER_FLAGS, Build, SetupError, add_libraries
from accelmux.setup.packages import LLAMA_VERSION

from .support import ROOT, clean_env


def _wheel(path: Path) -> Path:
    record = "llama_cpp_python-0.3.36.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("llama_cpp/__init__.py", "")
        wheel.writestr(record, "llama_cpp/__init__.py,sha256=x,0\n" + record + ",,\n")
    return path


def test_the_libraries_go_into_the_wheel_and_its_record(tmp_path: Path) -> None:
    libs = tmp_path / "bin"
    libs.mkdir()
    (libs / "libllama.so").write_bytes(b"llama")
    (libs / "libggml-base.so.0.9.4").write_bytes(b"ggml-base")
    (libs / "libggml-base.so.0").symlink_to("libggml-base.so.0.9.4")
    (libs / "libother.so").write_bytes(b"not ours")
    (libs / "llama-server").write_bytes(b"not a library")
    wheel = _wheel(tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    assert add_libraries(wheel, "llama_cpp/lib", libs) == 3
    with zipfile.ZipFile(wheel) as packed:
        names = set(packed.namelist())
        record = packed.read("llama_cpp_python-0.3.36.dist-info/RECORD").decode().splitlines()
        link = packed.read("llama_cpp/lib/libggml-base.so.0")
        mode = packed.getinfo("llama_cpp/lib/libllama.so").external_attr >> 16
    assert {f"llama_cpp/lib/{n}" for n in ("libllama.so", "libggml-base.so.0")} <= names
    assert "llama_cpp/lib/libother.so" not in names and mode == 0o755
    assert link == b"ggml-base"  # a link is stored as a copy of its target
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"llama").digest()).rstrip(b"=").decode()
    assert f"llama_cpp/lib/libllama.so,sha256={digest},5" in record
    assert record[-1].endswith("RECORD,,")  # RECORD itself stays last, unhashed


def test_a_build_without_libllama_is_refused(tmp_path: Path) -> None:
    (tmp_path / "libggml.so").write_bytes(b"x")
    with pytest.raises(SetupError, match=r"no libllama\.so"):
        add_libraries(_wheel(tmp_path / "w.whl"), "llama_cpp/lib", tmp_path)


def test_build_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELMUX_LLAMA_CMAKE_ARGS", raising=False)
    monkeypatch.setenv("ACCELMUX_WHEEL_CACHE", "/tmp/cache")
    monkeypatch.setenv("ACCELMUX_BUILD_JOBS", "3")
    build = Build.from_environment()
    assert build.cmake_flags == PORTABLE_FLAGS and build.jobs == 3
    assert build.tree == Path(f"/tmp/cache/llama.cpp-{LLAMA_VERSION}")
    monkeypatch.setenv("ACCELMUX_LLAMA_CMAKE_ARGS", "-DGGML_NATIVE=OFF '-DX=a b'")
    assert Build.from_environment().cmake_flags == ("-DGGML_NATIVE=OFF", "-DX=a b")
    monkeypatch.setenv("ACCELMUX_LLAMA_CMAKE_ARGS", "-DGGML_NATIVE=ON")
    with pytest.raises(SetupError, match="Illegal instruction"):
        Build.from_environment()


def test_the_supported_llama_version_is_the_one_setup_installs() -> None:
    assert LLAMA_VERSION == llama_adapter.SUPPORTED_VERSION


def test_a_missing_build_tool_fails_setup_with_what_to_install(tmp_path: Path) -> None:
    """With an empty cache and no compiler, setup stops before changing anything, says
    which tools are missing and how to get them, and exits 1."""
    env = clean_env(
        PYTHONPATH=str(ROOT / "src"),
        ACCELMUX_WHEEL_CACHE=str(tmp_path / "cache"),
        PATH=str(tmp_path / "no-tools"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "accelmux.setup"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "accelmux setup: building llama.cpp needs cmake, cc, c++ "
        "(Debian/Ubuntu: apt-get install build-essential cmake)"
    )
    assert "Traceback" not in done.stderr


def test_setup_needs_the_standard_library_alone() -> None:
    """``python -m accelmux.setup`` runs where accelmux's dependencies are not installed
    yet (scripts/setup-models.sh from a bare checkout): no site-packages at all here."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); "
        "import accelmux.setup.command, accelmux.setup.__main__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] not in "
        "sys.stdlib_module_names and m.split('.')[0] not in ('accelmux', '__main__')))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_build_steps_for_scripts_are_the_same_build() -> None:
    """scripts/llama-build.sh (gpu-check, bench_llama_build) runs `accelmux setup`'s own
    steps: its server flags are SERVER_FLAGS, its tree is Build's, and a failing step
    stops the script with the step's message."""
    script = (
        'PY="$0" CACHE=/tmp/accelmux-steps-test LLAMA_VERSION=0.3.36; . scripts/llama-build.sh; '
        'printf "%s\\n" "$LLAMA_BUILD" "${LLAMA_SERVER_FLAGS[@]}"; '
        "PATH=/nonexistent llama_need_tools; echo not reached"
    )
    done = subprocess.run(
        ["bash", "-c", script, sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    lines = done.stdout.splitlines()
    build = Build.from_environment(Path("/tmp/accelmux-steps-test"))
    assert lines == [str(build.build_dir), *SERVER_FLAGS], done.stderr
    assert done.returncode == 1
    assert "accelmux setup (need-tools): building llama.cpp needs cmake" in done.stderr


def test_an_unknown_step_is_a_usage_error() -> None:
    assert steps.main(["frobnicate"]) == 2
    assert steps.main(["compile"]) == 2  # a target is needed
    assert steps.main([]) == 2
