"""What ``serve`` needs beyond a valid config: what ``accelmux check`` adds to the
schema's checks, because ``serve`` would otherwise fail (or quietly adapt) at start.

* every service names its ``backend`` (without one a config is for the simulator only;
  the fake test double must be asked for, ``backend: {type: fake}``);

and on THIS machine:

* ``server.data_dir``: it (or the nearest existing parent, which serve would create it
  under) must be a directory this user can write;
* an external backend's ``argv[0]``: on ``PATH`` (the backend's ``env.PATH`` when set) or
  an executable file;
* a ``host`` device's ``capacity``/``budget``: not above this machine's RAM (serve would
  clamp it to the RAM).

A simulator scenario is not checked against the machine.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import psutil

from accelmux.config.backends import ExternalBackendConfig
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
    reason = data_dir_problem(Path(cfg.server.data_dir))
    if reason is not None:
        problems.append(f"server.data_dir: {reason} (got {cfg.server.data_dir!r})")
    for name, svc in cfg.services.items():
        if isinstance(svc.backend, ExternalBackendConfig):
            why = executable_problem(svc.backend)
            if why is not None:
                problems.append(f"services.{name}.backend.argv[0]: {why}")
    ram = total_ram if total_ram is not None else int(psutil.virtual_memory().total)
    problems.extend(host_memory_problems(cfg, ram))
    return problems
