"""What ``accelmux service install --node NAME`` reads from this machine, and the token.

:func:`node_plan` validates the cluster's config (every problem listed), finds the Ray
head's address, this machine's address on the way to it (as ``accelmux node`` does),
the ``ray`` command beside the interpreter, the cluster's token and the accelerator
memory to declare to Ray, and describes the units (:mod:`.node_units`).
:func:`install_token` puts the token where the units read it: a file of the service
user's, mode 0600, in a directory only that user may enter; never in a unit, an
environment setting or a command line.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from accelmux.cluster.hosting import check_node_name
from accelmux.cluster.ray_link import local_address, split_address
from accelmux.config.load import load_config
from accelmux.config.schema import AccelmuxConfig
from accelmux.runtime.devices import detect_devices
from accelmux.service.daemon_unit import SERVICE_USER
from accelmux.service.install import ServiceError, closed_to_others, this_machine
from accelmux.service.node_units import TOKEN_FILE, NodeOptions, node_units
from accelmux.service.unit import ServiceUnit

MIB = 2**20


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The units, the token's text and where it comes from; ``unreachable``: why the
    service user could not run them (None: it can)."""

    options: NodeOptions
    units: list[ServiceUnit]
    token: str
    token_source: Path
    unreachable: str | None = None


def default_token_file() -> Path:
    """Where Ray keeps the token of the user running this: ``RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token`` of the user who ran ``sudo``, else of this user."""
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if named:
        return Path(named)
    home = Path.home()
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user:
        with contextlib.suppress(KeyError):  # a user unknown here: this user's home
            home = Path(pwd.getpwnam(sudo_user).pw_dir)
    return home / ".ray" / "auth_token"


def head_addresses(head: str) -> set[str]:
    """The addresses the head's host name (or address) stands for."""
    host, port = split_address(head) or ("", 0)
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, port)}
    except OSError as exc:
        raise ServiceError(f"cannot resolve the Ray head {head}: {exc.strerror or exc}") from None


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ServiceError(
            f"no cluster token at {path} ({exc.strerror}): create it once on the head "
            "(RAY_AUTH_MODE=token ray get-auth-token --generate), copy it to every machine, "
            "and name it with --token-file (docs/cluster.md, step 1)"
        ) from None
    if not token or "\n" in token:
        raise ServiceError(f"{path} does not hold a cluster token (one line of text)")
    return token


def declared_mib(cfg: AccelmuxConfig) -> int:
    """The accelerator memory of this machine in MiB: its GPUs' and virtual devices'
    capacities, or, with none, its shared (host) memory; detected where the config
    leaves it to detection."""
    detected, _ = detect_devices(cfg)
    sizes = {
        name: int(dev.capacity) if dev.capacity is not None else detected[name]
        for name, dev in cfg.devices.items()
    }
    accelerators = [sizes[name] for name, dev in cfg.devices.items() if dev.kind != "host"]
    return sum(accelerators or sizes.values()) // MIB


def node_plan(
    config: Path,
    node: str,
    *,
    python: str,
    user_mode: bool,
    gateway: bool,
    cluster: str | None,
    token_file: Path | None,
    device_mib: int | None,
) -> NodePlan:
    """The units of node ``node`` on this machine. Raises ``ConfigError`` (a bad config,
    every problem), ``ClusterError`` (an unknown node, no route to the head) or
    :class:`ServiceError` (no head address, no Ray, no token)."""
    cfg = load_config(config)
    check_node_name(cfg, node)
    head = cluster or cfg.cluster.address
    if not head or split_address(head) is None:
        raise ServiceError(
            "the units need the Ray head's host:port: set cluster.address in the config "
            "or give --cluster HOST:PORT"
        )
    ray = Path(python).parent / "ray"
    if not ray.is_file():
        raise ServiceError(
            f"Ray is not installed beside {python} (no {ray}): pip install 'accelmux[cluster]'"
        )
    source = (token_file or default_token_file()).absolute()
    token = read_token(source)
    if user_mode and source.stat().st_mode & 0o077:
        raise ServiceError(
            f"{source} may be read by other users: chmod 600 {source} "
            "(the cluster's token must be its owner's alone)"
        )
    address = local_address(head)
    options = NodeOptions(
        python=python,
        ray=str(ray),
        node=node,
        config=str(config),
        head=head,
        address=address,
        is_head=address in head_addresses(head),
        token_file=str(source) if user_mode else TOKEN_FILE,
        device_mib=declared_mib(cfg) if device_mib is None else device_mib,
        gateway=gateway,
        drain_s=cfg.server.drain_s,
        user_mode=user_mode,
    )
    unreachable = None
    closed = None if user_mode else _first_closed(python, str(ray), str(config))
    if closed:
        unreachable = (
            f"the {SERVICE_USER} user cannot reach {closed}: install accelmux where every "
            "user may read it (docs/install.md) and keep the config in /etc/accelmux, or "
            "install the units with --user"
        )
    return NodePlan(options, node_units(options, this_machine()), token, source, unreachable)


def _first_closed(*paths: str) -> str | None:
    for path in paths:
        closed = closed_to_others(Path(path))
        if closed:
            return closed
    return None


def install_token(token: str, dest: Path, *, owner: str | None, base: Path) -> Path:
    """Write ``token`` to ``dest`` (mode 0600), replaced whole, never left half-written;
    the directories from ``base`` (the state directory) down to it are made mode 0700,
    and, with everything written, owned by ``owner`` when that user exists."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dirs = [dest.parent, *(p for p in dest.parent.parents if p == base or base in p.parents)]
    partial = dest.with_name(dest.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    os.chmod(partial, 0o600)  # whatever the umask
    try:
        user = pwd.getpwnam(owner) if owner else None
    except KeyError:
        user = None
    for path in (*dirs, partial):
        if path != partial:
            path.chmod(0o700)
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)
    partial.replace(dest)
    return dest
