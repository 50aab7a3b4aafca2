"""A systemd service unit described as data, and rendered to the text of its file.

Every unit accelmux installs is a :class:`ServiceUnit` turned into text by
:func:`render_unit`, a pure function: the daemon's own unit (:mod:`.daemon_unit`) is one
description, and another program run the same way (a cluster node's Ray runtime or its
node agent) is another description of the same type, rendered and installed by the same
code (:mod:`.install`). What the user may change without editing the unit (the
environment) goes to a drop-in (:func:`render_environment_dropin`), which an upgrade
leaves alone.

Hardening (:class:`Sandbox`) is for system units: the per-user service manager cannot
apply most of it without unprivileged user namespaces, so a user unit carries only what
works everywhere (``NoNewPrivileges``, ``UMask``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

#: Device groups (``/proc/devices`` names) of each accelerator family, for ``DeviceAllow``:
#: NVIDIA's driver (``nvidia-frontend``: /dev/nvidia0.., nvidiactl, nvidia-modeset;
#: ``nvidiactl``, which some driver versions register on its own; ``nvidia-uvm``, CUDA's
#: memory; ``nvidia-caps`` for MIG), the kernel's DRM render nodes (AMD and Intel GPUs,
#: /dev/dri), AMD's compute interface (/dev/kfd) and the kernel's accel class (NPUs,
#: /dev/accel). A group the running kernel does not have is skipped by systemd.
DEVICE_GROUPS: dict[str, tuple[str, ...]] = {
    "nvidia": (
        "char-nvidia-frontend",
        "char-nvidiactl",
        "char-nvidia-uvm",
        "char-nvidia-caps",
    ),
    "dri": ("char-drm",),
    "kfd": ("char-kfd",),
    "accel": ("char-accel",),
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Sandbox:
    """The hardening of a system unit.

    The service sees the file system read-only (``ProtectSystem=strict``) except its
    state and cache directories and ``read_write_paths``; home directories are hidden,
    or read-only where the program itself lives under one (``protect_home``); of the
    device nodes only the pseudo devices and ``devices`` (``DeviceAllow`` specifiers,
    read and write) are reachable; no privilege can be gained, no kernel setting
    changed, no capability held.
    """

    read_write_paths: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    protect_home: Literal["yes", "read-only"] = "yes"
    address_families: tuple[str, ...] = ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK")


@dataclass(frozen=True, slots=True)
class ServiceUnit:
    """One long-running program as a systemd service.

    ``notify``: the program tells systemd when it is ready (``Type=notify``) and, with
    ``watchdog_s``, pings it at least that often or is restarted. ``user`` (a system unit)
    runs it as that dedicated user, with ``supplementary_groups`` (the groups owning the
    GPU device nodes) and the ``state_directory`` and ``cache_directory`` systemd creates
    under /var/lib and /var/cache owned by it. ``stop_timeout_s``: how long a stop may
    take before the rest of the unit is killed (the main process is asked first and stops
    its own children: ``KillMode=mixed``). ``restart``: started again when it fails
    (``on-failure``), or whenever it ends (``always``: a program whose clean exit is
    not a reason to stay down).
    """

    name: str
    description: str
    exec_start: tuple[str, ...]
    documentation: tuple[str, ...] = ()
    notify: bool = False
    watchdog_s: int | None = None
    start_timeout_s: int = 300
    stop_timeout_s: int = 30
    restart_s: int = 5
    restart: Literal["on-failure", "always"] = "on-failure"
    user: str | None = None
    group: str | None = None
    supplementary_groups: tuple[str, ...] = ()
    state_directory: str | None = None
    cache_directory: str | None = None
    working_directory: str | None = None
    environment: tuple[tuple[str, str], ...] = ()
    after: tuple[str, ...] = ("network-online.target",)
    wants: tuple[str, ...] = ("network-online.target",)
    part_of: tuple[str, ...] = ()
    wanted_by: str = "multi-user.target"
    sandbox: Sandbox | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def file_name(self) -> str:
        return f"{self.name}.service"


def unit_problems(unit: ServiceUnit) -> list[str]:
    """What makes ``unit`` unrenderable, one line each (empty: it renders)."""
    problems = []
    if not _NAME.match(unit.name):
        problems.append(f"unit name {unit.name!r}: letters, digits and :_.@- only")
    if not unit.exec_start:
        problems.append("exec_start: the command line is empty")
    elif not unit.exec_start[0].startswith("/"):
        problems.append(f"exec_start: {unit.exec_start[0]!r} must be an absolute path")
    for key, _ in unit.environment:
        if not _ENV_NAME.match(key):
            problems.append(f"environment: {key!r} is not a variable name")
    if unit.watchdog_s is not None and not unit.notify:
        problems.append("watchdog_s needs notify (the program sends the pings)")
    for text in (unit.description, *unit.exec_start, *(v for _, v in unit.environment)):
        if "\n" in text or "\0" in text:
            problems.append(f"{text[:40]!r}: a value cannot hold a newline or NUL")
    return problems


def quote_arg(arg: str, *, command: bool = True) -> str:
    """``arg`` as one word of a systemd setting: ``%`` kept literal (no specifier
    expansion), and ``$`` too in a command line (``command``: no variable expansion);
    quoted where it has blanks, quotes, backslashes or a semicolon."""
    text = arg.replace("%", "%%")
    if command:
        text = text.replace("$", "$$")
    if text and not re.search(r"[\s\"'\\;]", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_assignment(key: str, value: str) -> str:
    return quote_arg(f"{key}={value}", command=False)


def _lines(key: str, values: Iterable[str]) -> list[str]:
    return [f"{key}={value}" for value in values]


def _unit_section(unit: ServiceUnit) -> list[str]:
    lines = ["[Unit]", f"Description={unit.description}"]
    if unit.documentation:
        lines.append("Documentation=" + " ".join(unit.documentation))
    lines += _lines("Wants", unit.wants) + _lines("After", unit.after)
    lines += _lines("PartOf", unit.part_of)
    return lines


def _identity(unit: ServiceUnit) -> list[str]:
    lines = []
    if unit.user is not None:
        lines.append(f"User={unit.user}")
        lines.append(f"Group={unit.group or unit.user}")
    if unit.supplementary_groups:
        lines.append("SupplementaryGroups=" + " ".join(unit.supplementary_groups))
    if unit.state_directory:
        lines += [f"StateDirectory={unit.state_directory}", "StateDirectoryMode=0700"]
    if unit.cache_directory:
        lines += [f"CacheDirectory={unit.cache_directory}", "CacheDirectoryMode=0700"]
    if unit.working_directory:
        lines.append(f"WorkingDirectory={unit.working_directory}")
    lines += [f"Environment={_env_assignment(k, v)}" for k, v in unit.environment]
    return lines


def _lifecycle(unit: ServiceUnit) -> list[str]:
    lines = [f"Type={'notify' if unit.notify else 'exec'}"]
    if unit.notify:
        lines.append("NotifyAccess=main")
    lines.append("ExecStart=" + " ".join(quote_arg(a) for a in unit.exec_start))
    if unit.watchdog_s is not None:
        lines.append(f"WatchdogSec={unit.watchdog_s}")
    lines += [
        f"Restart={unit.restart}",
        f"RestartSec={unit.restart_s}",
        f"TimeoutStartSec={unit.start_timeout_s}",
        f"TimeoutStopSec={unit.stop_timeout_s}",
        "KillMode=mixed",
        "StandardOutput=journal",
        "StandardError=journal",
        f"SyslogIdentifier={unit.name}",
    ]
    return lines


def _sandbox(sandbox: Sandbox | None) -> list[str]:
    if sandbox is None:
        return ["NoNewPrivileges=yes", "UMask=0077"]
    lines = [
        "NoNewPrivileges=yes",
        "UMask=0077",
        "ProtectSystem=strict",
        f"ProtectHome={sandbox.protect_home}",
    ]
    lines += _lines(
        "ReadWritePaths", (quote_arg(p, command=False) for p in sandbox.read_write_paths)
    )
    lines += [
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        *(f"DeviceAllow={device} rw" for device in sandbox.devices),
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "RestrictAddressFamilies=" + " ".join(sandbox.address_families),
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
    ]
    return lines


def render_unit(unit: ServiceUnit) -> str:
    """The unit file's text. Raises ``ValueError`` naming each problem
    (:func:`unit_problems`)."""
    problems = unit_problems(unit)
    if problems:
        raise ValueError("; ".join(problems))
    service = ["[Service]", *_lifecycle(unit), *_identity(unit), *_sandbox(unit.sandbox)]
    service += [f"{key}={value}" for key, value in unit.extra]
    sections = [
        _unit_section(unit),
        service,
        ["[Install]", f"WantedBy={unit.wanted_by}"],
    ]
    header = [
        f"# {unit.file_name}: written by `accelmux service install`; it is rewritten on",
        f"# the next install. Put your own settings in a drop-in (systemctl edit {unit.name}).",
    ]
    return "\n".join(header) + "\n\n" + "\n\n".join("\n".join(s) for s in sections) + "\n"


def render_environment_dropin(unit_name: str, environment: Iterable[tuple[str, str]]) -> str:
    """The drop-in holding the service's environment: the variables a user sets for
    the daemon (API keys, the model cache), kept across reinstalls and upgrades."""
    pairs = list(environment)
    for key, value in pairs:
        if not _ENV_NAME.match(key):
            raise ValueError(f"environment: {key!r} is not a variable name")
        if "\n" in value or "\0" in value:
            raise ValueError(f"environment: {key}'s value holds a newline or NUL")
    lines = [
        f"# The environment of {unit_name}.service. `accelmux service install` writes this",
        "# file once and never overwrites it: edit it, then `systemctl daemon-reload` and",
        f"# `systemctl restart {unit_name}`.",
        "[Service]",
        *(f"Environment={_env_assignment(k, v)}" for k, v in pairs),
    ]
    if not pairs:
        lines.append('# Environment="ACCELMUX_ADMIN_KEY=..."')
    return "\n".join(lines) + "\n"
