"""llama.cpp, built once from the llama-cpp-python sources with portable CPU flags.

PyPI has no wheel of llama-cpp-python, and pip building it from source would compile
llama.cpp natively (``-DGGML_NATIVE=ON`` can die with "Illegal instruction" on another
CPU of the same kind) and everything in it. Here only what the Python bindings load is
compiled: ``libllama`` and ``libggml*`` from the sdist's own ``vendor/llama.cpp`` (so the
library matches its bindings exactly), in a build tree kept in the cache
(:class:`Build`); the bindings are then packed into a wheel around those libraries
(``CMAKE_ARGS=-DLLAMA_BUILD=OFF``: no second compile, :func:`add_libraries`), and the
wheel is kept in the cache too. llama-server (only for the tests of a real external
server, or for running one) builds later in the same tree: the libraries are reused.

Environment (the same as the scripts that came before this module read):
``ACCELMUX_WHEEL_CACHE`` (default ``~/.cache/accelmux-wheels``), ``ACCELMUX_LLAMA_CPP_VERSION``,
``ACCELMUX_LLAMA_CMAKE_ARGS`` (CPU flags, a word list; never ``-DGGML_NATIVE=ON``) and
``ACCELMUX_BUILD_JOBS`` (default: the number of CPUs).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from accelmux.setup.packages import llama_version

PORTABLE_FLAGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
)
LIBRARY = re.compile(r"^lib(llama|ggml[\w-]*)\.so(\.\d+)*$")
BUILD_TOOLS = ("cmake", "cc", "c++")
#: What llama-server adds to the tree: its common code and tools, no web UI (only the API
#: is used: no npm build, no download of prebuilt assets).
SERVER_FLAGS = (
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


class SetupError(Exception):
    """A step of the setup failed; the message says which and what to do."""


def log(message: str) -> None:
    print(f"== setup: {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], what: str, *, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` (its output goes to this process's stderr); a failure is a
    :class:`SetupError` naming ``what``."""
    try:
        done = subprocess.run(list(argv), stdout=sys.stderr, env=env, check=False)
    except OSError as exc:
        raise SetupError(f"{what}: cannot run {argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise SetupError(f"{what} failed (exit status {done.returncode}; its output is above)")


def default_cache() -> Path:
    env = os.environ.get("ACCELMUX_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "accelmux-wheels"


@dataclass(frozen=True, slots=True)
class Build:
    """One llama.cpp build tree in the cache, for one llama-cpp-python version."""

    cache: Path
    version: str
    cmake_flags: tuple[str, ...]
    jobs: int
    python: str = sys.executable

    @classmethod
    def from_environment(cls, cache: Path | None = None) -> Build:
        flags = os.environ.get("ACCELMUX_LLAMA_CMAKE_ARGS")
        jobs = os.environ.get("ACCELMUX_BUILD_JOBS", "")
        if flags and "-DGGML_NATIVE=ON" in flags.replace(" ", ""):
            raise SetupError(
                "ACCELMUX_LLAMA_CMAKE_ARGS holds -DGGML_NATIVE=ON: a native build can die "
                "with 'Illegal instruction' on another CPU; give portable flags"
            )
        return cls(
            cache=(cache or default_cache()).expanduser().absolute(),
            version=llama_version(),
            cmake_flags=tuple(shlex.split(flags)) if flags else PORTABLE_FLAGS,
            jobs=int(jobs) if jobs.isdigit() and int(jobs) > 0 else os.cpu_count() or 1,
        )

    @property
    def tree(self) -> Path:
        return self.cache / f"llama.cpp-{self.version}"

    @property
    def sources(self) -> Path:
        return self.tree / "llama-cpp-python"

    @property
    def build_dir(self) -> Path:
        return self.tree / "build"

    @property
    def server_dir(self) -> Path:
        return self.cache / f"llama-server-{self.version}"

    def cached_wheel(self) -> Path | None:
        found = sorted(self.cache.glob(f"llama_cpp_python-{self.version}-*.whl"))
        return found[0] if found else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache's lock: two setups building at once wait for each other."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with (self.cache / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def missing_tools(self) -> list[str]:
        return [tool for tool in BUILD_TOOLS if shutil.which(tool) is None]

    def need_tools(self) -> None:
        missing = self.missing_tools()
        if missing:
            raise SetupError(
                f"building llama.cpp needs {', '.join(missing)} "
                "(Debian/Ubuntu: apt-get install build-essential cmake)"
            )

    def fetch_sources(self) -> None:
        """The llama-cpp-python sdist, unpacked into :attr:`sources`."""
        if (self.sources / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            return
        with tempfile.TemporaryDirectory(prefix="accelmux-sdist-") as tmp:
            run(
                [self.python, "-m", "pip", "download", "-q", "--no-binary", "llama-cpp-python",
                 "--no-deps", "-d", tmp, f"llama-cpp-python=={self.version}"],
                f"downloading the llama-cpp-python {self.version} sources",
            )  # fmt: skip
            sdists = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            if not sdists:
                raise SetupError(f"pip left no llama-cpp-python sdist in {tmp}")
            unpacked = Path(tmp) / "unpacked"
            with tarfile.open(sdists[0]) as archive:
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                    archive.extractall(unpacked, filter="data")
                else:  # pragma: no cover - an sdist from PyPI, fetched by pip
                    archive.extractall(unpacked)
            (top,) = list(unpacked.iterdir())
            self.tree.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.sources, ignore_errors=True)
            shutil.move(str(top), self.sources)

    def configure(self, *extra: str) -> None:
        """Configure the tree; ``extra`` -D flags (the server's) add to what is there.

        Shared libraries with ``$ORIGIN`` run paths (libllama finds libggml beside it, in
        the Python package and beside llama-server alike); no tests, examples, curl or
        TLS. Ninja and ccache are used when installed."""
        first = not (self.build_dir / "CMakeCache.txt").is_file()
        argv = [
            "cmake",
            "-S",
            str(self.sources / "vendor" / "llama.cpp"),
            "-B",
            str(self.build_dir),
        ]
        if first and shutil.which("ninja"):
            argv += ["-G", "Ninja"]
        if shutil.which("ccache"):
            argv += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        argv += [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=ON",
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            "-DCMAKE_INSTALL_RPATH=$ORIGIN",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ]
        if first:
            argv += [
                "-DLLAMA_BUILD_COMMON=OFF",
                "-DLLAMA_BUILD_TOOLS=OFF",
                "-DLLAMA_BUILD_SERVER=OFF",
            ]
        run([*argv, *self.cmake_flags, *extra], "configuring llama.cpp (cmake)")

    def compile(self, *targets: str) -> None:
        run(
            ["cmake", "--build", str(self.build_dir), "--config", "Release",
             "-j", str(self.jobs), "--target", *targets],
            f"compiling {', '.join(targets)}",
        )  # fmt: skip

    def build_wheel(self) -> Path:
        """Compile the libraries, pack the bindings around them, keep the wheel."""
        self.need_tools()
        log(
            f"building llama.cpp's libraries from the llama-cpp-python {self.version} sources "
            f"with '{' '.join(self.cmake_flags)}' on {self.jobs} jobs (once; kept in the cache)"
        )
        self.fetch_sources()
        self.configure()
        self.compile("llama")
        log(f"packing the llama-cpp-python {self.version} wheel around them")
        return self.pack_wheel(self.cache)

    def pack_wheel(self, dest: Path) -> Path:
        """The bindings packed into a wheel around the libraries built in the tree (no
        second compile: ``-DLLAMA_BUILD=OFF``), moved into ``dest`` whole; its path."""
        with tempfile.TemporaryDirectory(prefix="accelmux-wheel-") as tmp:
            env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
            # --no-cache-dir: pip's wheel cache is keyed by the source, not by CMAKE_ARGS
            run(
                [self.python, "-m", "pip", "wheel", "-q", "--no-cache-dir", "--no-deps",
                 "-w", tmp, str(self.sources)],
                "packing the llama-cpp-python bindings (pip wheel)",
                env=env,
            )  # fmt: skip
            wheels = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
            if not wheels:
                raise SetupError(f"the llama-cpp-python build left no wheel in {tmp}")
            add_libraries(wheels[0], "llama_cpp/lib", self.build_dir / "bin")
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / wheels[0].name
            partial = target.with_name(target.name + ".partial")
            shutil.move(str(wheels[0]), partial)
            partial.replace(target)  # appears whole: a reader never sees half a wheel
        return target

    def build_server(self) -> Path:
        """llama-server, in the same tree (the libraries are reused), copied with its
        libraries to :attr:`server_dir`; the binary's path."""
        binary = self.server_dir / "llama-server"
        if _starts(binary):
            log(f"llama-server ({self.version} sources) already built at {binary}")
            return binary
        self.need_tools()
        self.fetch_sources()
        log(f"building llama-server in {self.build_dir} on {self.jobs} jobs")
        self.configure(*SERVER_FLAGS)
        self.compile("llama-server")
        binary = self.install_server(self.server_dir)
        log(f"llama-server at {binary}")
        return binary

    def install_server(self, dest: Path) -> Path:
        """Copy the built llama-server and the shared libraries it loads (found beside
        it: an ``$ORIGIN`` run path) to ``dest``, whole or not at all; the binary's path."""
        built = self.build_dir / "bin" / "llama-server"
        if not _starts(built):
            raise SetupError(f"the build left no llama-server that starts at {built}")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for path in [built, *sorted((self.build_dir / "bin").glob("lib*.so*"))]:
            shutil.copy2(path.resolve(), partial / path.name)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
        return dest / "llama-server"


def _starts(binary: Path) -> bool:
    if not os.access(binary, os.X_OK):
        return False
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def add_libraries(wheel: Path, dest: str, lib_dir: Path) -> int:
    """Put every ``libllama.so*`` / ``libggml*.so*`` of ``lib_dir`` into ``wheel`` under
    ``dest`` (a link stored as a copy of its target, as llama-cpp-python's own wheels
    hold them), listed in its RECORD with their hashes, so that pip installs and
    uninstalls them with the package. How many were added."""
    libraries = sorted(p for p in lib_dir.iterdir() if LIBRARY.match(p.name))
    if not any(p.name == "libllama.so" for p in libraries):
        raise SetupError(f"no libllama.so in {lib_dir}: the llama.cpp build is incomplete")
    packed = wheel.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as new:
        record_name = next(n for n in old.namelist() if n.endswith(".dist-info/RECORD"))
        records = [line for line in old.read(record_name).decode().splitlines() if line]
        for item in old.infolist():
            if item.filename != record_name:
                new.writestr(item, old.read(item.filename))
        for library in libraries:
            name = f"{dest}/{library.name}"
            data = library.read_bytes()
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            new.writestr(info, data)
            records.insert(-1, _record_line(name, data))
        new.writestr(record_name, "\n".join(records) + "\n")
    packed.replace(wheel)
    return len(libraries)
