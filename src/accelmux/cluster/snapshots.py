"""A node's snapshot, and the router's view of it.

The node agent builds its snapshot from its daemon's ``/admin/status`` (the Manager's
own picture) and its config (which model names each service answers to and what loading
it costs): a small JSON-ready dict, so a poll of many nodes stays cheap. The gateway
turns each into a :class:`~accelmux.core.routing.NodeView` for the router.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from accelmux.config.schema import AccelmuxConfig
from accelmux.core.routing import NodeView, ServiceOnNode
from accelmux.core.types import ServiceStatus


def service_models(cfg: AccelmuxConfig) -> dict[str, list[str]]:
    """Each service's model names: its model (default: its name) and its aliases."""
    return {name: [svc.model or name, *svc.aliases] for name, svc in cfg.services.items()}


def node_snapshot(
    node: str, port: int, status: dict[str, Any], cfg: AccelmuxConfig
) -> dict[str, Any]:
    """The snapshot of ``node`` from its daemon's ``status`` (``/admin/status``)."""
    devices = {
        dev["name"]: {
            "budget_bytes": int(dev["budget_bytes"]),
            "available_bytes": int(dev["available_bytes"]),
        }
        for dev in status["devices"]
    }
    models = service_models(cfg)
    services = []
    for svc in status["services"]:
        name = svc["name"]
        memory = cfg.services[name].memory
        services.append(
            {
                "service": name,
                "kind": svc["kind"],
                "models": models[name],
                "state": svc["state"],
                "inflight": int(svc["inflight"]),
                "waiting": int(svc["waiting"]),
                "concurrency": int(svc["concurrency"]),
                "device": svc["device"],
                "load_bytes": int(memory.weights + memory.runtime + memory.kv_floor),
                "backing_off": svc.get("backoff_until") is not None,
            }
        )
    return {
        "node": node,
        "port": port,
        "stopping": status.get("server", {}).get("stopping", False),
        "devices": devices,
        "services": services,
        "queues": status.get("queues", {}),
    }


def view_of(snapshot: dict[str, Any], *, alive: bool) -> NodeView:
    """The router's view of one node's snapshot."""
    free = {name: int(dev["available_bytes"]) for name, dev in snapshot["devices"].items()}
    services = tuple(
        ServiceOnNode(
            service=svc["service"],
            models=frozenset(svc["models"]),
            state=ServiceStatus(svc["state"]),
            inflight=int(svc["inflight"]),
            waiting=int(svc["waiting"]),
            concurrency=int(svc["concurrency"]),
            load_bytes=int(svc["load_bytes"]),
            free_bytes=free.get(svc["device"], 0),
            backing_off=bool(svc["backing_off"]),
        )
        for svc in snapshot["services"]
    )
    return NodeView(
        name=str(snapshot["node"]), alive=alive and not snapshot["stopping"], services=services
    )


#: The state a listed model shows, best first, when several nodes host it.
STATE_ORDER = ("loaded", "loading", "unloading", "unloaded", "crashed")


def model_entries(snapshots: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``GET /v1/models`` of the cluster from the live nodes' snapshots, sorted by id: a
    single machine's entries, with its best state anywhere and the nodes hosting it."""
    entries: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        for svc in snap["services"]:
            for model in svc["models"]:
                entry = entries.setdefault(
                    model,
                    {
                        "id": model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "accelmux",
                        "service": svc["service"],
                        "kind": svc["kind"],
                        "state": svc["state"],
                        "nodes": [],
                    },
                )
                entry["nodes"].append(snap["node"])
                rank = STATE_ORDER.index
                if rank(svc["state"]) < rank(entry["state"]):
                    entry["state"] = svc["state"]
    for entry in entries.values():
        entry["nodes"].sort()
    return [entries[k] for k in sorted(entries)]
