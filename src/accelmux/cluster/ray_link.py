"""Ray, imported only here and only in the processes that talk to Ray.

Ray is an optional extra (``pip install 'accelmux[cluster]'``): importing accelmux never
imports it, and a single machine needs none of it. Only the link processes of
:mod:`accelmux.cluster.registry` join a Ray cluster; the daemons and the gateway never
do, so neither Ray's end of a lost cluster nor its output reaches them. Every problem
joining a cluster is a one-line :class:`~accelmux.errors.ClusterError`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading
from typing import Any

from accelmux.cluster.secret import require_token
from accelmux.errors import ClusterError

#: The Ray namespace of accelmux's named actors.
NAMESPACE = "accelmux"
#: A node's entry (a small actor, see :mod:`.registry`) is named this prefix and the node.
AGENT_PREFIX = "accelmux-node-"
#: The custom resource a Ray node may declare for its accelerator memory, in MiB
#: (``ray start --resources '{"accelmux_device_mib": 24576}'``): coarse placement and
#: visibility only, the node's ledger stays the authority.
DEVICE_RESOURCE = "accelmux_device_mib"
#: How long joining a cluster may take before it is given up.
JOIN_TIMEOUT_S = 60.0
NO_RAY = "cluster mode needs Ray: pip install 'accelmux[cluster]' (ray>=2.40)"


def agent_name(node: str) -> str:
    return AGENT_PREFIX + node


def need_ray() -> None:
    """A :class:`ClusterError` saying how to install Ray when it is missing; Ray itself
    is not imported (only the link processes import it)."""
    try:
        found = importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ClusterError(NO_RAY)


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`ClusterError` saying how to install it."""
    try:
        import ray  # noqa: PLC0415  # optional extra: only cluster mode needs Ray
    except ImportError:
        raise ClusterError(NO_RAY) from None
    return ray


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` (None: another form, such as ``auto``)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.removeprefix("ray://").strip("[]") or "127.0.0.1", int(port)


def local_address(address: str) -> str:
    """This machine's address on the way to ``address`` (the head): the one its Ray node
    and its node's LAN listener use. No packet is sent (a UDP socket is only routed)."""
    parts = split_address(address)
    if parts is None:
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in parts[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(parts)
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ClusterError(
            f"no route to the Ray cluster at {address}: {exc.strerror or exc}"
        ) from None


def unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing listens at ``host:port`` (None: something does, or ``address`` is not
    of that form, such as ``auto``)."""
    parts = split_address(address)
    if parts is None:
        return None
    try:
        with socket.create_connection(parts, timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers there ({exc.strerror or type(exc).__name__})"


def token_mode() -> None:
    """Ray's token authentication for this process and its children, unless the user
    chose otherwise (``RAY_AUTH_MODE`` set); the token must be on this machine."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    require_token()


def connect(address: str, timeout_s: float = JOIN_TIMEOUT_S) -> Any:
    """Join the Ray cluster at ``address`` (``host:port`` of its head) in accelmux's
    namespace, through this machine's own Ray node (the one at this machine's address on
    the way to the head, so several "machines" on one host each find their own); the
    ``ray`` module.

    ``ray.init`` runs in a thread of its own, given ``timeout_s``: it can wait forever
    when the cluster answers but this machine's address is not one of its nodes'."""
    token_mode()  # before Ray reads its configuration, at import
    ray = import_ray()
    if ray.is_initialized():
        return ray
    why = unreachable(address)
    if why is not None:  # ray.init would retry for minutes
        raise ClusterError(f"cannot join the Ray cluster at {address}: {why}")
    here = local_address(address)
    failures: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.ERROR,
                include_dashboard=False,
                _node_ip_address=here,
            )
        except BaseException as exc:  # Ray raises ConnectionError, RuntimeError, ...
            failures.append(exc)

    joining = threading.Thread(target=join, name="ray-join", daemon=True)
    joining.start()
    joining.join(timeout_s)
    if joining.is_alive():
        raise ClusterError(
            f"cannot join the Ray cluster at {address}: no answer within {timeout_s:g} s "
            f"(is this machine's Ray node running, started with ray start --address "
            f"{address} --node-ip-address {here}?)"
        )
    if failures:
        raise ClusterError(join_failure(address, here, failures[0])) from None
    return ray


def join_failure(address: str, here: str, exc: BaseException) -> str:
    """One line for a failed ``ray.init``, in accelmux's words (Ray's are in the log)."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f" {type(cause).__name__}: {cause}"
    if "AuthenticationError" in text or "InvalidAuthToken" in text:
        return (
            f"the Ray cluster at {address} refused this machine's token: copy "
            "~/.ray/auth_token from the head (docs/cluster.md, step 1)"
        )
    if "No node info found" in text:
        return (
            f"no Ray node of this machine ({here}) is in the cluster at {address}: start "
            f"one first (ray start --address {address} --node-ip-address {here})"
        )
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"cannot join the Ray cluster at {address}: {first[:200]}"


def agent_names(ray: Any) -> list[str]:
    """Node names of the entries registered in accelmux's namespace, sorted."""
    names = ray.util.list_named_actors(all_namespaces=False)
    return sorted(n[len(AGENT_PREFIX) :] for n in names if n.startswith(AGENT_PREFIX))
