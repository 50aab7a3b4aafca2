"""``/admin/status``: the Manager's snapshot with what only the daemon knows.

Per device, the last memory sample; per service, what its backend describes, its last
error, the activity the daemon measured (switches per hour, cold starts), its memory
limit and its usage figures in one place (:func:`service_usage`, which ``/metrics``
exports too); and the server's own state.

A service that runs on several devices shows as one entry per replica (``chat@gpu1``,
each with its own device, state and backend); every entry's ``group`` names the service
clients address (an ordinary service's own name), and ``groups`` lists each replicated
service's replicas.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from accelmux.backends.base import Backend
from accelmux.core.manager import Manager
from accelmux.runtime.activity import ServiceActivity
from accelmux.runtime.sampler import SamplerLoop


def build_status(
    manager: Manager,
    *,
    backends: Mapping[str, Backend],
    sampling: SamplerLoop,
    last_errors: Mapping[str, str],
    activity: Mapping[str, ServiceActivity],
    server: dict[str, Any],
) -> dict[str, Any]:
    snap = manager.snapshot().as_dict()
    monitors = {}
    for device, (at, sample) in sampling.last_samples.items():
        monitors[device] = {
            "sampled_at": at,
            "total_bytes": sample.total_bytes,
            "per_service_bytes": dict(sample.event.per_service),
            **sample.details,
        }
    for name, sampler in sampling.samplers.items():
        error = getattr(sampler, "error", None)
        if error:
            monitors.setdefault(name, {})["error"] = error
    for dev in snap["devices"]:
        dev["measured"] = monitors.get(dev["name"])
    now = time.monotonic()
    world = manager.world
    for svc in snap["services"]:
        svc["group"] = world.services[svc["name"]].spec.addressed_as
        backend = backends.get(svc["name"])
        described = backend.describe() if backend is not None else None
        svc["backend"] = described
        svc["last_error"] = last_errors.get(svc["name"])
        used = activity[svc["name"]].as_dict(now)
        svc["activity"] = used
        svc["limit"] = (described or {}).get("limit", {}).get("summary")
        svc["usage"] = service_usage(svc, described or {}, used)
    snap["groups"] = {g: [r.name for r in reps] for g, reps in world.groups.items()}
    snap["server"] = server
    return snap


def service_usage(
    svc: dict[str, Any], described: dict[str, Any], activity: dict[str, Any]
) -> dict[str, Any]:
    """One service's memory and load figures in one place (status page and /metrics).

    KV in use and context in use come from the server itself where it reports them
    (llama-server's ``/slots`` and ``/metrics``, vLLM's ``/metrics``), else from the
    ledger."""
    server = described.get("server") or {}
    measured = described.get("measured") or {}
    kv_pool = int(svc["kv_pool_bytes"])
    kv_in_use = int(svc["kv_in_use_bytes"])
    if "kv_usage_ratio" in server and kv_pool:
        kv_in_use = int(float(server["kv_usage_ratio"]) * kv_pool)
    ledger = svc["ledger"]
    return {
        "weights_bytes": ledger.get("weights", 0),
        "reserved_bytes": ledger.get("reserved", 0),
        "active_bytes": ledger.get("active", 0),
        "kv_in_use_bytes": kv_in_use,
        "kv_pool_bytes": kv_pool,
        "concurrency": svc["concurrency"],
        "inflight": svc["inflight"],
        "context_in_use_tokens": server.get("context_in_use_tokens"),
        "context_per_slot_tokens": server.get("context_per_slot"),
        "batch_size": measured.get("batch_size"),
        "busy_slots_per_decode": server.get("busy_slots_per_decode"),
        "switches_per_hour": activity["switches_per_hour"],
        "cold_start_s": activity["cold_start_s_last"],
    }
