"""A cluster node's units: its Ray node, its node agent and (optionally) a gateway.

``accelmux service install --node NAME`` makes one machine of a cluster (docs/cluster.md)
start by itself at boot and after any of its parts ends:

* ``accelmux-ray``: ``ray start --block``, the head when this machine holds the
  cluster's address, else joining it; token authentication on; a Ray node that lost its
  head ends after :data:`HEADLESS_S` (Ray's default is 60 s) so that its unit starts it
  again and it joins the head as soon as the head is back;
* ``accelmux-node``: ``accelmux node --node NAME``, which keeps the node's daemon and
  its registration in Ray running; it does not stop with Ray (``Wants``, not
  ``PartOf``): the daemon serves whatever happens to Ray;
* ``accelmux-gateway`` (``gateway``): ``accelmux serve -c CONFIG``, the gateway in
  front of every node, taking the head's address from ``cluster.address``.

Each is a :class:`~.unit.ServiceUnit` rendered and installed by the same code as the
daemon's own unit. All three run as the ``accelmux`` user in ``/var/lib/accelmux`` and
restart whenever they end (``Restart=always``: a Ray node ending when its head is lost
is the normal way back, not a failure to stop at). The cluster's token is a file only
that user can read (:data:`TOKEN_FILE`, named by ``RAY_AUTH_TOKEN_PATH``): never in a
unit, an environment setting or a command line, which other users can read
(``systemctl show``, ``ps``).

These units carry no sandbox beyond ``NoNewPrivileges`` and ``UMask``: Ray starts its
own processes, shares memory through /dev/shm and keeps sessions under /tmp, and the
hardening of the daemon's unit has not been verified with it; the node's daemon runs
under the agent, in the agent's unit.

Pure: what the machine has is passed in (:class:`NodeOptions`).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, replace

from accelmux.service.daemon_unit import (
    CACHE_DIR,
    DEVICE_OWNER_GROUPS,
    SERVICE_USER,
    STATE_DIR,
    UNLOAD_S,
    Machine,
)
from accelmux.service.unit import ServiceUnit

RAY_UNIT = "accelmux-ray"
AGENT_UNIT = "accelmux-node"
GATEWAY_UNIT = "accelmux-gateway"
NODE_UNITS = (RAY_UNIT, AGENT_UNIT, GATEWAY_UNIT)
#: Where a system install keeps the cluster's token: where Ray itself looks for the
#: service user's (its home is the state directory), readable by that user only.
TOKEN_FILE = f"{STATE_DIR}/.ray/auth_token"
#: How long a Ray node without its head lives before it ends (and its unit restarts it).
HEADLESS_S = 15
#: The smallest object store Ray accepts (bytes): accelmux puts nothing in it.
OBJECT_STORE_BYTES = 100_000_000
RESTART_S = 3


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """One machine of a cluster. ``python``: the interpreter accelmux is installed in;
    ``ray``: the ``ray`` command beside it; ``config``: the cluster's config (absolute);
    ``head``: the Ray head's ``host:port``; ``address``: this machine's address on the
    way to the head; ``is_head``: this machine is the head; ``device_mib``: the
    accelerator memory this machine declares to Ray (0: none); ``token_file``: the
    cluster's token as the units read it; ``drain_s``: the config's
    ``server.drain_s``."""

    python: str
    ray: str
    node: str
    config: str
    head: str
    address: str
    is_head: bool = False
    token_file: str = TOKEN_FILE
    device_mib: int = 0
    gateway: bool = False
    drain_s: float = 10.0
    user_mode: bool = False

    @property
    def head_port(self) -> str:
        return self.head.rpartition(":")[2]


def ray_command(options: NodeOptions) -> tuple[str, ...]:
    """``ray start --block`` for this machine: the head, or a node joining it."""
    role = (
        ("--head", "--port", options.head_port, "--include-dashboard", "false")
        if options.is_head
        else ("--address", options.head)
    )
    resources = (
        ("--resources", json.dumps({"accelmux_device_mib": options.device_mib}))
        if options.device_mib > 0
        else ()
    )
    return (
        options.ray,
        "start",
        "--block",
        *role,
        "--node-ip-address",
        options.address,
        "--num-cpus",
        "0",
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        *resources,
        "--disable-usage-stats",
    )


def _ray_environment(options: NodeOptions) -> tuple[tuple[str, str], ...]:
    return (
        ("RAY_AUTH_MODE", "token"),
        ("RAY_AUTH_TOKEN_PATH", options.token_file),
        ("RAY_USAGE_STATS_ENABLED", "0"),
    )


def _accelmux(options: NodeOptions, *command: str) -> tuple[str, ...]:
    """``accelmux COMMAND`` with the cluster's config and head."""
    return (
        *(options.python, "-m", "accelmux", *command),
        *("-c", options.config, "--cluster", options.head),
    )


def _as_machine_unit(unit: ServiceUnit, options: NodeOptions, machine: Machine) -> ServiceUnit:
    """``unit`` run as the service user in the state directory (a system unit), or as
    the installing user in their home (a user unit)."""
    if options.user_mode:
        return replace(
            unit, working_directory=machine.home, after=(), wants=(), wanted_by="default.target"
        )
    return replace(
        unit,
        user=SERVICE_USER,
        group=SERVICE_USER,
        state_directory=posixpath.basename(STATE_DIR),
        working_directory=STATE_DIR,
    )


def node_units(options: NodeOptions, machine: Machine) -> list[ServiceUnit]:
    """The machine's units: its Ray node, its agent and (``options.gateway``) a gateway."""
    ray = ServiceUnit(
        name=RAY_UNIT,
        description=f"Ray node of the accelmux cluster (node {options.node})",
        exec_start=ray_command(options),
        restart="always",
        restart_s=RESTART_S,
        environment=(
            *_ray_environment(options),
            ("RAY_gcs_rpc_server_reconnect_timeout_s", str(HEADLESS_S)),
        ),
    )
    agent = ServiceUnit(
        name=AGENT_UNIT,
        description=f"accelmux node agent (node {options.node})",
        exec_start=_accelmux(options, "node", "--node", options.node),
        restart="always",
        restart_s=RESTART_S,
        stop_timeout_s=int(options.drain_s) + UNLOAD_S,
        environment=(
            *_ray_environment(options),
            *(() if options.user_mode else (("ACCELMUX_MODEL_CACHE", f"{CACHE_DIR}/models"),)),
        ),
        after=("network-online.target", f"{RAY_UNIT}.service"),
        wants=("network-online.target", f"{RAY_UNIT}.service"),
    )
    if not options.user_mode:
        agent = replace(
            agent,
            cache_directory=posixpath.basename(CACHE_DIR),
            supplementary_groups=tuple(g for g in DEVICE_OWNER_GROUPS if g in machine.groups),
        )
    units = [ray, agent]
    if options.gateway:
        units.append(
            ServiceUnit(
                name=GATEWAY_UNIT,
                description="accelmux cluster gateway",
                exec_start=_accelmux(options, "serve"),
                restart="always",
                restart_s=RESTART_S,
                stop_timeout_s=int(options.drain_s) + UNLOAD_S,
                environment=_ray_environment(options),
                after=("network-online.target", f"{RAY_UNIT}.service"),
                wants=("network-online.target",),
            )
        )
    return [_as_machine_unit(unit, options, machine) for unit in units]
