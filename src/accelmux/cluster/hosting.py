"""Which services of the one cluster config a node builds, and how its daemon listens."""

from __future__ import annotations

from pathlib import Path

from accelmux.config.schema import AccelmuxConfig
from accelmux.errors import ClusterError
from accelmux.gateway.guard import LOOPBACK_NAMES


def hosts(cfg: AccelmuxConfig, service: str, node: str) -> bool:
    """Whether ``node`` may run ``service`` (``services.NAME.nodes``; none: every node)."""
    nodes = cfg.services[service].nodes
    return nodes is None or node in nodes


def check_node_name(cfg: AccelmuxConfig, node: str) -> None:
    """Raise :class:`ClusterError` for a node name ``cluster.nodes`` does not list."""
    known = cfg.cluster.nodes
    if known and node not in known:
        raise ClusterError(f"unknown node {node!r}: cluster.nodes lists {', '.join(known)}")


def config_for_node(
    cfg: AccelmuxConfig, node: str, *, port: int, data_dir: Path, lan_address: str | None = None
) -> AccelmuxConfig:
    """The daemon ``node`` runs: only the services it may host, on loopback at ``port``
    (and on ``lan_address``, which its ``Host`` check then accepts too), with its own
    ``data_dir`` (jobs, logs), and no Wyoming server unless both of its services stay
    (Wyoming is served by each node's own daemon, not the gateway)."""
    check_node_name(cfg, node)
    services = {name: svc for name, svc in cfg.services.items() if hosts(cfg, name, node)}
    wyoming = cfg.server.wyoming
    if wyoming is not None and any(
        name is not None and name not in services for name in (wyoming.asr, wyoming.tts)
    ):
        wyoming = None
    update: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "data_dir": str(data_dir),
        "wyoming": wyoming,
    }
    if lan_address is not None:
        allowed = cfg.server.allowed_hosts
        names = list(LOOPBACK_NAMES) if allowed is None else list(allowed)
        update["allowed_hosts"] = [*names, lan_address]
    server = cfg.server.model_copy(update=update)
    return cfg.model_copy(update={"services": services, "server": server})


def configured_hosts(cfg: AccelmuxConfig) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each model name -> (its service, the nodes that may host it; empty: any node), so
    the gateway can name them when no live node serves the model yet."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, svc in cfg.services.items():
        nodes = tuple(svc.nodes if svc.nodes is not None else cfg.cluster.nodes)
        for model in [svc.model or name, *svc.aliases]:
            out[model] = (name, nodes)
    return out


def deadlines(cfg: AccelmuxConfig) -> dict[str, float]:
    """Each model name -> its service's queue deadline (``queue.deadline_s``): how long
    the gateway may go on trying nodes for a request."""
    out: dict[str, float] = {}
    for name, svc in cfg.services.items():
        for model in [svc.model or name, *svc.aliases]:
            out[model] = float(svc.queue.deadline_s)
    return out
