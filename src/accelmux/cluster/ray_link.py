"""Ray, imported only here and only when cluster mode runs.

Ray is an optional extra (``pip install 'accelmux[cluster]'``): importing accelmux never
imports it, and a single machine needs none of it. Every problem joining a cluster is a
one-line :class:`~accelmux.errors.ClusterError`.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from accelmux.errors import ClusterError

#: The Ray namespace of accelmux's named actors.
NAMESPACE = "accelmux"
#: A node agent's actor name is this prefix and the node's name.
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


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`ClusterError` saying how to install it."""
    try:
        import ray  # noqa: PLC0415  # optional extra: only cluster mode needs Ray
    except ImportError:
        raise ClusterError(NO_RAY) from None
    return ray


def connect(address: str, timeout_s: float = JOIN_TIMEOUT_S) -> Any:
    """Join the Ray cluster at ``address`` (``host:port`` of its head, or ``auto``) in
    accelmux's namespace; the ``ray`` module.

    ``ray.init`` runs in a thread of its own, given ``timeout_s``: it can wait forever
    when the cluster answers but this machine's address is not one of its nodes'."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    why = unreachable(address)
    if why is not None:  # ray.init would retry for minutes
        raise ClusterError(f"cannot join the Ray cluster at {address}: {why}")
    failures: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                include_dashboard=False,
            )
        except BaseException as exc:  # Ray raises ConnectionError, RuntimeError, ...
            failures.append(exc)

    joining = threading.Thread(target=join, name="ray-join", daemon=True)
    joining.start()
    joining.join(timeout_s)
    if joining.is_alive():
        raise ClusterError(
            f"cannot join the Ray cluster at {address}: no answer within {timeout_s:g} s "
            "(is a Ray node running on this machine, started with ray start --address, "
            "with an address the cluster reaches: --node-ip-address?)"
        )
    if failures:
        exc = failures[0]
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ClusterError(f"cannot join the Ray cluster at {address}: {first}") from None
    return ray


def unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing listens at ``host:port`` (None: something does, or ``address`` is not
    of that form, such as ``auto``)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.removeprefix("ray://").strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers there ({exc.strerror or type(exc).__name__})"


def agent_names(ray: Any) -> list[str]:
    """Node names of the live agents registered in accelmux's namespace, sorted."""
    names = ray.util.list_named_actors(all_namespaces=False)
    return sorted(n[len(AGENT_PREFIX) :] for n in names if n.startswith(AGENT_PREFIX))
