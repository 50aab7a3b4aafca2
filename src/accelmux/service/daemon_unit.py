"""The daemon's own unit: ``accelmux serve`` as a hardened systemd service.

A system unit runs the daemon as the dedicated user ``accelmux`` (created from a
``sysusers.d`` entry, :func:`sysusers_entry`), in ``/var/lib/accelmux`` (its state
directory: the default stack's ``data_dir``, and the working directory a relative
``server.data_dir`` is resolved from) with its model cache in ``/var/cache/accelmux``,
everything else of the file system read-only, and of the device nodes only the
accelerators this machine has (:data:`~.unit.DEVICE_GROUPS`). A ``server.data_dir``
outside the state directory is added to ``ReadWritePaths``.

A user unit (``--user``) runs it as the user who installs it, in their home, with the
data where ``accelmux serve`` run by hand keeps it.

Everything here is pure: what the machine has (:class:`Machine`) is read by
:mod:`.install` and passed in.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Literal

from accelmux.service.unit import DEVICE_GROUPS, Sandbox, ServiceUnit

SERVICE_NAME = "accelmux"
SERVICE_USER = "accelmux"
STATE_DIR = "/var/lib/accelmux"
CACHE_DIR = "/var/cache/accelmux"
#: systemd restarts the daemon when no watchdog ping came for this long.
WATCHDOG_S = 30
#: After the drain, what stopping may take: unloading every backend, stopping children.
UNLOAD_S = 30
#: Group names that own GPU device nodes on common distributions (added when present).
DEVICE_OWNER_GROUPS = ("video", "render")
#: Directories whose contents ``ProtectHome`` hides.
HOME_ROOTS = ("/home", "/root", "/run/user")


@dataclass(frozen=True, slots=True)
class Machine:
    """What the unit depends on that install reads from this machine: the accelerator
    families with device nodes here (keys of :data:`DEVICE_GROUPS`), which of
    :data:`DEVICE_OWNER_GROUPS` exist, and the installing user's home."""

    device_families: tuple[str, ...]
    groups: tuple[str, ...]
    home: str


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    """``python``: the interpreter accelmux is installed in (absolute); ``config``: the
    config file (absolute; None: the default stack); ``data_dir``: its
    ``server.data_dir`` as written; ``drain_s``: its ``server.drain_s``."""

    python: str
    config: str | None = None
    data_dir: str | None = None
    drain_s: float = 10.0
    user_mode: bool = False
    name: str = SERVICE_NAME


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def resolved_data_dir(options: DaemonOptions, working_directory: str) -> str:
    """Where the daemon will keep its data: the config's ``server.data_dir`` resolved
    from the unit's working directory, or (default stack) the state directory."""
    if options.data_dir is None:
        return working_directory
    expanded = options.data_dir
    if expanded.startswith("~"):
        expanded = working_directory if options.user_mode else STATE_DIR
        expanded += options.data_dir[1:]
    return posixpath.normpath(posixpath.join(working_directory, expanded))


def exec_start(options: DaemonOptions) -> tuple[str, ...]:
    argv = (options.python, "-m", "accelmux", "serve")
    return (*argv, "-c", options.config) if options.config else argv


def daemon_unit(options: DaemonOptions, machine: Machine) -> ServiceUnit:
    """The unit that runs ``accelmux serve`` (with ``options.config``) on ``machine``."""
    daemon = ServiceUnit(
        name=options.name,
        description="accelmux: one resource manager for this machine's AI accelerator",
        exec_start=exec_start(options),
        notify=True,
        watchdog_s=WATCHDOG_S,
        stop_timeout_s=int(options.drain_s) + UNLOAD_S,
    )
    if options.user_mode:
        return replace(
            daemon,
            working_directory=machine.home,
            after=(),
            wants=(),
            wanted_by="default.target",
        )
    data_dir = resolved_data_dir(options, STATE_DIR)
    writable = () if _under(data_dir, (STATE_DIR,)) else (data_dir,)
    program_paths = [options.python, *([options.config] if options.config else [])]
    in_home = any(_under(p, HOME_ROOTS) for p in program_paths)
    protect_home: Literal["yes", "read-only"] = "read-only" if in_home else "yes"
    devices = tuple(group for family in machine.device_families for group in DEVICE_GROUPS[family])
    environment = [("ACCELMUX_MODEL_CACHE", f"{CACHE_DIR}/models")]
    if options.config is None:
        environment.insert(0, ("ACCELMUX_DATA_DIR", STATE_DIR))
    return replace(
        daemon,
        user=SERVICE_USER,
        group=SERVICE_USER,
        supplementary_groups=tuple(g for g in DEVICE_OWNER_GROUPS if g in machine.groups),
        state_directory=posixpath.basename(STATE_DIR),
        cache_directory=posixpath.basename(CACHE_DIR),
        working_directory=STATE_DIR,
        environment=tuple(environment),
        sandbox=Sandbox(read_write_paths=writable, devices=devices, protect_home=protect_home),
    )


def sysusers_entry(user: str = SERVICE_USER, home: str = STATE_DIR) -> str:
    """The ``sysusers.d`` file that creates the daemon's system user (no login, no
    password, its home the state directory)."""
    return (
        "# The system user accelmux.service runs as (written by `accelmux service install`).\n"
        f'u {user} - "accelmux daemon" {home} /usr/sbin/nologin\n'
    )
