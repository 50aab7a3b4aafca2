"""What ``serve`` needs beyond a valid config: what ``accelmux check`` adds to the
schema's checks, because ``serve`` would otherwise fail (or quietly adapt) at start.

* every service names its ``backend`` (without one a config is for the simulator only;
  the fake test double must be asked for, ``backend: {type: fake}``);

and on THIS machine:

* ``server.data_dir``: it (or the nearest existing parent, which serve would create it
  under) must be a directory this user can write, and serve's own preparation
  (:func:`prepare_data_dir`: create it, write a file in it) is tried for real, then what
  it created is removed again (so root is not told OK for a path under ``/proc``);
* an ``nvidia`` device without a ``capacity``: NVML initialises and has a GPU at its
  ``index`` (serve reads the capacity there, and refuses to start without it; a device
  with a configured capacity is a config that may be written for another machine, and
  serve runs it, unmeasured); left to each node in a cluster;
* ``server.host``: a non-loopback address needs ``server.api_keys`` (or
  ``server.allow_unauthenticated``), as serve refuses to start otherwise;
* an external backend's ``argv[0]``: on ``PATH`` (the backend's ``env.PATH`` when set) or
  an executable file;
* a ``host`` device's ``capacity``/``budget``: not above this machine's RAM (serve would
  clamp it to the RAM).

A simulator scenario is not checked against the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import psutil

try:  # pragma: no cover - depends on the machine
    import pynvml
except ImportError:  # pragma: no cover
    pynvml = None

from accelmux.config.backends import ExternalBackendConfig
from accelmux.config.hosts import is_loopback
from accelmux.config.schema import AccelmuxConfig

#: What accelmux creates under ``server.data_dir``: owner-only (it holds job inputs, logs).
PRIVATE_DIR = 0o700


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def data_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold the daemon's data (None: it can), without creating it."""
    target = path.expanduser().absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    if existing == target:
        return f"{target} is not writable by this user"
    return f"cannot create {target}: {existing} is not writable by this user"


def prepare_data_dir(path: Path) -> str | None:
    """Create ``path`` (owner-only, 0700) and write a file in it; why that failed (None:
    it works)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def try_data_dir(path: Path) -> str | None:
    """What :func:`prepare_data_dir` (serve) meets at ``path``, tried for real; every
    directory it had to create is removed again, so nothing is left behind."""
    target = path.expanduser().absolute()
    created: list[Path] = []
    probe = target
    try:
        while not probe.exists() and probe != probe.parent:
            created.append(probe)  # deepest first
            probe = probe.parent
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        return prepare_data_dir(target)
    finally:
        for directory in created:
            with contextlib.suppress(OSError):
                directory.rmdir()


def nvidia_gpu_problem(index: int) -> str | None:
    """Why NVML has no GPU ``index`` here (None: it has)."""
    if pynvml is None:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"NVML unavailable: {exc}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if index >= count:
            return f"NVML sees {count} GPU(s)"
        pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return f"NVML: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return None


def nvidia_problems(cfg: AccelmuxConfig) -> list[str]:
    """A problem per ``nvidia`` device left to detection whose GPU this machine lacks
    (none in a cluster, where each node builds its devices for itself)."""
    if cfg.cluster.address is not None or cfg.cluster.nodes:
        return []
    problems = []
    for name, dev in cfg.devices.items():
        if dev.kind != "nvidia" or dev.capacity is not None:
            continue
        why = nvidia_gpu_problem(dev.index)
        if why is not None:
            problems.append(
                f"devices.{name}.index: no NVIDIA GPU {dev.index} on this machine ({why}); "
                f"serve refuses to start (set devices.{name}.capacity to run it unmeasured)"
            )
    return problems


def open_host_problem(cfg: AccelmuxConfig) -> str | None:
    """serve's refusal of a non-loopback host without API keys, as a check problem."""
    server = cfg.server
    if server.api_keys or server.allow_unauthenticated or is_loopback(server.host):
        return None
    return (
        f"server.host: {server.host or 'every address'} is not loopback and server.api_keys "
        "is empty: serve refuses to start (/v1 would be open to the network); set "
        "server.api_keys, listen on 127.0.0.1, or server.allow_unauthenticated: true"
    )


def tighten_data_dir(path: Path) -> tuple[list[str], list[str]]:
    """Take group and other permissions off ``path`` and everything under it (what an
    earlier version, or a copy, left readable: files become 0600, directories 0700).

    Symbolic links are not followed. Returns the paths changed (relative to ``path``,
    ``.`` for itself) and the problems, one per path that could not be changed.
    """
    changed: list[str] = []
    problems: list[str] = []

    def tighten(entry: Path) -> None:
        try:
            mode = stat.S_IMODE(entry.lstat().st_mode)
            if stat.S_ISLNK(entry.lstat().st_mode) or not mode & 0o077:
                return
            os.chmod(entry, mode & 0o700)
        except OSError as exc:
            problems.append(f"{entry}: {exc.strerror or exc}")
            return
        changed.append(str(entry.relative_to(path)))

    tighten(path)
    for root, dirs, files in os.walk(path, onerror=lambda exc: problems.append(str(exc))):
        for name in (*dirs, *files):
            tighten(Path(root) / name)
    return changed, problems


def executable_problem(backend: ExternalBackendConfig) -> str | None:
    program = backend.argv[0]
    if "{" in program:
        return None  # templated at start: nothing to look up yet
    path = backend.env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=path) is not None:
        return None
    candidate = Path(program).expanduser()
    if os.sep in program and candidate.is_file():
        return f"{program!r} is not executable"
    where = "not a file" if os.sep in program else "not on PATH"
    return f"program {program!r} not found ({where})"


def host_memory_problems(cfg: AccelmuxConfig, total_ram: int) -> list[str]:
    problems = []
    for name, dev in cfg.devices.items():
        if dev.kind != "host":
            continue
        for key in ("capacity", "budget"):
            value = getattr(dev, key)
            if value is not None and int(value) > total_ram:
                problems.append(
                    f"devices.{name}.{key}: {_gib(int(value))} is more than this machine's "
                    f"RAM ({_gib(total_ram)}); serve would clamp it to the RAM"
                )
    return problems


def missing_backends(cfg: AccelmuxConfig) -> list[str]:
    """A problem per service without a ``backend`` section (serve cannot run it)."""
    return [
        f"services.{name}.backend: required to serve (external, worker, or fake for the "
        "test double; a config without backends is for `accelmux simulate` only)"
        for name, svc in cfg.services.items()
        if svc.backend is None
    ]


def machine_problems(cfg: AccelmuxConfig, *, total_ram: int | None = None) -> list[str]:
    """Every problem of ``cfg`` on this machine, each with its key path."""
    problems: list[str] = []
    data_dir = Path(cfg.server.data_dir)
    reason = data_dir_problem(data_dir)
    if reason is None:
        tried = try_data_dir(data_dir)
        if tried is not None:
            reason = f"cannot create {data_dir.expanduser().absolute()} and write in it: {tried}"
    if reason is not None:
        problems.append(f"server.data_dir: {reason} (got {cfg.server.data_dir!r})")
    host = open_host_problem(cfg)
    if host is not None:
        problems.append(host)
    problems.extend(nvidia_problems(cfg))
    for name, svc in cfg.services.items():
        if isinstance(svc.backend, ExternalBackendConfig):
            why = executable_problem(svc.backend)
            if why is not None:
                problems.append(f"services.{name}.backend.argv[0]: {why}")
    ram = total_ram if total_ram is not None else int(psutil.virtual_memory().total)
    problems.extend(host_memory_problems(cfg, ram))
    return problems
