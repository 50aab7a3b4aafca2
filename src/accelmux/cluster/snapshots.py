"""A node's snapshot, and the router's view of it.

A node's daemon answers ``GET /cluster/snapshot`` (:mod:`.listener`) from its Manager's
own picture and its config (which model names each service answers to, what loading it
costs): a small JSON-ready dict, so polling it often stays cheap. The gateway turns each
into a :class:`~accelmux.core.routing.NodeView` for the router, adding what it measured
itself (each service's time per request there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from accelmux.config.schema import AccelmuxConfig
from accelmux.core.routing import NodeView, ServiceOnNode, freeable_for
from accelmux.core.types import ServiceClass, ServiceStatus


def service_models(cfg: AccelmuxConfig) -> dict[str, list[str]]:
    """Each service's model names: its model (default: its name) and its aliases."""
    return {name: [svc.model or name, *svc.aliases] for name, svc in cfg.services.items()}


def node_snapshot(node: str, manager: dict[str, Any], cfg: AccelmuxConfig) -> dict[str, Any]:
    """The snapshot of ``node`` from its Manager's snapshot (``Manager.snapshot()``)."""
    devices = {
        dev["name"]: {
            "budget_bytes": int(dev["budget_bytes"]),
            "available_bytes": int(dev["available_bytes"]),
        }
        for dev in manager["devices"]
    }
    models = service_models(cfg)
    services = []
    for svc in manager["services"]:
        name = svc["name"]
        memory = cfg.services[name].memory
        load_s = svc.get("load_seconds", {}).get(svc.get("tier", "cold"))
        services.append(
            {
                "service": name,
                "kind": svc["kind"],
                "class": svc["class"],
                "models": models[name],
                "state": svc["state"],
                "pinned": bool(svc["pinned"]),
                "inflight": int(svc["inflight"]),
                "waiting": int(svc["waiting"]),
                "concurrency": int(svc["concurrency"]),
                "device": svc["device"],
                "load_bytes": int(memory.weights + memory.runtime + memory.kv_floor),
                "held_bytes": int(svc["estimated_bytes"]),
                "load_s": float(load_s) if load_s is not None else 0.0,
                "backing_off": svc.get("backoff_until") is not None,
            }
        )
    return {"node": node, "devices": devices, "services": services}


def view_of(
    snapshot: dict[str, Any],
    *,
    alive: bool,
    service_s: Mapping[str, float] | None = None,
) -> NodeView:
    """The router's view of one node's snapshot; ``service_s``: each service's measured
    time per request on that node."""
    free = {name: int(dev["available_bytes"]) for name, dev in snapshot["devices"].items()}
    times = service_s or {}
    plain = [
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
            load_s=float(svc.get("load_s", 0.0)),
            service_s=times.get(svc["service"]),
            cls=int(ServiceClass.parse(svc.get("class", "interactive"))),
            held_bytes=int(svc.get("held_bytes", 0)),
            pinned=bool(svc.get("pinned", False)),
            device=str(svc["device"]),
        )
        for svc in snapshot["services"]
    ]
    services = tuple(_with_freeable(s, plain) for s in plain)
    return NodeView(name=str(snapshot["node"]), alive=alive, services=services)


def _with_freeable(svc: ServiceOnNode, others: list[ServiceOnNode]) -> ServiceOnNode:
    if svc.state is ServiceStatus.LOADED or svc.load_bytes <= svc.free_bytes:
        return svc  # loaded, or fits as it is: what could be freed does not matter
    freeable = freeable_for(svc, others)
    if not freeable:
        return svc
    return replace(svc, freeable_bytes=freeable)


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
