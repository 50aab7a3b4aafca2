"""Writing units to where systemd reads them, creating the service user, enabling.

:func:`write_units` is the one way units reach the disk, whatever they run: each
:class:`~.unit.ServiceUnit` becomes ``NAME.service`` (rewritten on every install) and an
environment drop-in ``NAME.service.d/environment.conf`` (written once, then left to the
user). A system install also writes the ``sysusers.d`` entry of the service user and
runs ``systemd-sysusers``; then ``systemctl daemon-reload``, ``enable`` and (unless told
not to) ``restart``. ``root`` writes everything under another directory instead (a
staging tree, as ``systemctl --root``) and runs nothing.
"""

from __future__ import annotations

import contextlib
import getpass
import grp
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accelmux.config.load import load_config
from accelmux.errors import AccelmuxError
from accelmux.service.daemon_unit import (
    DEVICE_OWNER_GROUPS,
    SERVICE_USER,
    DaemonOptions,
    Machine,
    daemon_unit,
)
from accelmux.service.unit import ServiceUnit, render_environment_dropin, render_unit

SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
SYSUSERS_DIR = Path("/etc/sysusers.d")
#: The device nodes that tell which accelerator families this machine has.
DEVICE_NODES = {
    "nvidia": ("/dev/nvidiactl",),
    "dri": ("/dev/dri",),
    "kfd": ("/dev/kfd",),
    "accel": ("/dev/accel",),
}


class ServiceError(AccelmuxError):
    """Installing or removing a unit failed; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where units go: the unit directory, the sysusers.d directory (system units), and
    the systemctl command line (``--user`` for a user's units; None: run nothing)."""

    unit_dir: Path
    sysusers_dir: Path | None
    systemctl: tuple[str, ...] | None

    @classmethod
    def of(
        cls, *, user_mode: bool, root: Path | None = None, home: Path | None = None
    ) -> Placement:
        if user_mode:
            base = home or Path.home()
            config = Path(os.environ.get("XDG_CONFIG_HOME") or base / ".config")
            unit_dir = config / "systemd" / "user"
            if root is not None:
                unit_dir = root / unit_dir.relative_to("/")
            return cls(unit_dir, None, None if root else ("systemctl", "--user"))
        if root is not None:
            return cls(
                root / SYSTEM_UNIT_DIR.relative_to("/"), root / SYSUSERS_DIR.relative_to("/"), None
            )
        return cls(SYSTEM_UNIT_DIR, SYSUSERS_DIR, ("systemctl",))


def this_machine(home: Path | None = None) -> Machine:
    """The accelerator families with device nodes here and the device-owning groups."""
    families = tuple(
        family for family, nodes in DEVICE_NODES.items() if any(os.path.exists(n) for n in nodes)
    )
    groups = []
    for name in DEVICE_OWNER_GROUPS:
        try:
            grp.getgrnam(name)
        except KeyError:
            continue
        groups.append(name)
    return Machine(families, tuple(groups), str(home or Path.home()))


def closed_to_others(path: Path) -> str | None:
    """The first directory on the way to ``path`` that a user other than its owner
    cannot pass (no execute bit for others), or ``path`` itself when others cannot read
    it; None when every step is open. A symbolic link is followed too: a virtualenv's
    ``python`` links to an interpreter that may live under a private home."""
    for candidate in dict.fromkeys((path.absolute(), path.resolve())):
        closed = _closed_on_the_way(candidate)
        if closed is not None:
            return closed
    return None


def _closed_on_the_way(target: Path) -> str | None:
    for parent in reversed(target.parents):
        try:
            mode = parent.stat().st_mode
        except OSError as exc:
            return f"{parent} ({exc.strerror})"
        if not mode & stat.S_IXOTH:
            return f"{parent} (mode {stat.filemode(mode)})"
    try:
        mode = target.stat().st_mode
    except OSError as exc:
        return f"{target} ({exc.strerror})"
    if not mode & stat.S_IROTH:
        return f"{target} (mode {stat.filemode(mode)})"
    return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(0o644)
    partial.replace(path)


def write_units(
    units: Sequence[tuple[ServiceUnit, Sequence[tuple[str, str]]]], placement: Placement
) -> list[Path]:
    """Write each unit and, when it has none yet, its environment drop-in; the paths
    written."""
    written = []
    for unit, environment in units:
        path = placement.unit_dir / unit.file_name
        _write(path, render_unit(unit))
        written.append(path)
        dropin = placement.unit_dir / f"{unit.file_name}.d" / "environment.conf"
        if not dropin.exists():
            _write(dropin, render_environment_dropin(unit.name, environment))
            dropin.chmod(0o600)  # it may hold API keys
            written.append(dropin)
    return written


def write_sysusers(placement: Placement, name: str, text: str) -> Path | None:
    if placement.sysusers_dir is None:
        return None
    path = placement.sysusers_dir / f"{name}.conf"
    _write(path, text)
    return path


def _run(argv: Sequence[str]) -> None:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ServiceError(f"cannot run {argv[0]}: {exc.strerror}") from None
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[0]
        raise ServiceError(f"`{' '.join(argv)}` failed: {why}")


def create_user(sysusers: Path) -> None:
    """Create the service user from its sysusers.d entry."""
    if shutil.which("systemd-sysusers") is None:
        raise ServiceError("systemd-sysusers is missing: is this a systemd machine?")
    _run(["systemd-sysusers", str(sysusers)])


def activate(placement: Placement, names: Sequence[str], *, start: bool) -> list[str]:
    """daemon-reload, enable and (``start``) restart the units; the commands run."""
    if placement.systemctl is None:
        return []
    systemctl = list(placement.systemctl)
    units = [f"{name}.service" for name in names]
    commands = [[*systemctl, "daemon-reload"], [*systemctl, "enable", *units]]
    if start:
        commands.append([*systemctl, "restart", *units])
    for argv in commands:
        _run(argv)
    return [" ".join(argv) for argv in commands]


def remove_units(
    placement: Placement, names: Sequence[str], *, keep_environment: bool
) -> list[Path]:
    """Stop and disable the units, then delete their files (the drop-ins too unless
    ``keep_environment``); the paths removed. Data directories stay."""
    if placement.systemctl is not None:
        units = [f"{name}.service" for name in names]
        with contextlib.suppress(ServiceError):  # not installed or not running: the files go
            _run([*placement.systemctl, "disable", "--now", *units])
    removed = []
    for name in names:
        path = placement.unit_dir / f"{name}.service"
        if path.exists():
            path.unlink()
            removed.append(path)
        dropins = placement.unit_dir / f"{name}.service.d"
        if dropins.is_dir() and not keep_environment:
            shutil.rmtree(dropins)
            removed.append(dropins)
    if placement.systemctl is not None:
        _run([*placement.systemctl, "daemon-reload"])
    return removed


def daemon_plan(
    config: Path | None, *, user_mode: bool, python: str
) -> tuple[ServiceUnit, str | None]:
    """The daemon's unit for ``config`` (validated first: a bad config is a
    ``ConfigError`` listing every problem) on this machine, and, for a system unit, why
    its user could not reach the interpreter or the config (None: it can)."""
    cfg = load_config(config) if config is not None else None
    options = DaemonOptions(
        python=python,
        config=str(config) if config else None,
        data_dir=cfg.server.data_dir if cfg is not None else None,
        drain_s=cfg.server.drain_s if cfg is not None else 10.0,
        user_mode=user_mode,
    )
    unit = daemon_unit(options, this_machine())
    if user_mode:
        return unit, None
    for path in (python, config):
        closed = closed_to_others(Path(path)) if path else None
        if closed:
            return unit, (
                f"the {SERVICE_USER} user cannot reach {closed}: install accelmux with a "
                "Python every user may run, where every user may read it (/usr/bin/python3 "
                "-m venv /opt/accelmux && /opt/accelmux/bin/pip install accelmux), keep the "
                "config in /etc/accelmux, or install a unit of your own with --user"
            )
    return unit, None


def install_units(
    units: Sequence[ServiceUnit], placement: Placement, sysusers: str | None, *, start: bool
) -> list[str]:
    """Write ``units`` (and the ``sysusers`` entry of their user, created at once), then
    enable and (``start``) restart them; one line per thing done."""
    written = write_units([(unit, []) for unit in units], placement)
    if sysusers is not None:
        path = write_sysusers(placement, units[0].name, sysusers)
        if path is not None:
            written.append(path)
            if placement.systemctl is not None:
                create_user(path)
    lines = [f"wrote {path}" for path in written]
    ran = activate(placement, [unit.name for unit in units], start=start)
    lines += [f"ran {command}" for command in ran]
    if ran:
        user = "--user " if "--user" in (placement.systemctl or ()) else ""
        lines.append(f"logs: journalctl {user}-u {units[0].name} -f; state: accelmux status")
        if user:
            lines.append(
                "to start it at boot without logging in: loginctl enable-linger "
                + getpass.getuser()
            )
    return lines
