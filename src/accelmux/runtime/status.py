"""``/admin/status``: the Manager's snapshot with what only the daemon knows.

Per device, the last memory sample; per service, what its backend describes, its last
error, the activity the daemon measured (switches per hour, cold starts), its memory
limit and its usage figures in one place (:func:`service_usage`, which ``/metrics``
exports too: live TTFT and TBT percentiles, context in use and batch size among them,
see :mod:`accelmux.runtime.live_latency`); where its model runs (``accelerator``:
``cuda:0``, ``cpu``, or ``cpu (fallback: WHY)``, for worker services once loaded);
each service's objectives and their attainment over the last minutes (``slo``, and
``slo_classes`` per class: :mod:`accelmux.runtime.live_slo`); and the server's own state.

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
from accelmux.runtime.live_latency import LiveLatency
from accelmux.runtime.live_slo import LiveSlo
from accelmux.runtime.sampler import SamplerLoop


def build_status(
    manager: Manager,
    *,
    backends: Mapping[str, Backend],
    sampling: SamplerLoop,
    last_errors: Mapping[str, str],
    activity: Mapping[str, ServiceActivity],
    server: dict[str, Any],
    live: LiveLatency | None = None,
    slo: LiveSlo | None = None,
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
    world = manager.view
    for svc in snap["services"]:
        svc["group"] = world.services[svc["name"]].spec.addressed_as
        backend = backends.get(svc["name"])
        described = backend.describe() if backend is not None else None
        svc["backend"] = described
        svc["last_error"] = last_errors.get(svc["name"])
        used = activity[svc["name"]].as_dict(now)
        svc["activity"] = used
        svc["limit"] = (described or {}).get("limit", {}).get("summary")
        svc["accelerator"] = (described or {}).get("accelerator")
        figures = live.figures(svc["group"]) if live is not None else {}
        svc["usage"] = service_usage(svc, described or {}, used, figures)
        svc["slo"] = slo.service(svc["group"]) if slo is not None else None
    snap["slo_classes"] = slo.by_class() if slo is not None else {}
    snap["groups"] = {g: [r.name for r in reps] for g, reps in world.groups.items()}
    snap["server"] = server
    return snap


def service_usage(
    svc: dict[str, Any],
    described: dict[str, Any],
    activity: dict[str, Any],
    live: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One service's memory and load figures in one place (status page and /metrics).

    KV in use and context in use come from the server itself where it reports them
    (llama-server's ``/slots`` and ``/metrics``, vLLM's ``/metrics``), else from the
    ledger; context in use then from the latest answer's usage (``live``, the gateway's
    figures). Batch size: the server's busy slots, else the requests the inference worker
    runs for it, else the requests in flight. TTFT and TBT: the gateway's percentiles
    over its window (``live``)."""
    server = described.get("server") or {}
    measured = described.get("measured") or {}
    kv_pool = int(svc["kv_pool_bytes"])
    kv_in_use = int(svc["kv_in_use_bytes"])
    if "kv_usage_ratio" in server and kv_pool:
        kv_in_use = int(float(server["kv_usage_ratio"]) * kv_pool)
    ledger = svc["ledger"]
    figures = live or {}
    worker = described.get("live") or {}
    context = server.get("context_in_use_tokens")
    if context is None:
        context = figures.get("context_in_use_tokens")
    batch = measured.get("batch_size")
    if batch is None:
        batch = worker.get("batch_size")
    if batch is None:
        batch = svc["inflight"]
    ttft = figures.get("ttft_s") or {}
    tbt = figures.get("tbt_s") or {}
    return {
        "weights_bytes": ledger.get("weights", 0),
        "reserved_bytes": ledger.get("reserved", 0),
        "active_bytes": ledger.get("active", 0),
        "kv_in_use_bytes": kv_in_use,
        "kv_pool_bytes": kv_pool,
        "concurrency": svc["concurrency"],
        "inflight": svc["inflight"],
        "context_in_use_tokens": context,
        "context_per_slot_tokens": server.get("context_per_slot"),
        "context_size_tokens": worker.get("context_tokens") or server.get("context_per_slot"),
        "batch_size": batch,
        "ttft_p50_s": ttft.get("p50"),
        "ttft_p95_s": ttft.get("p95"),
        "tbt_p50_s": tbt.get("p50"),
        "tbt_p95_s": tbt.get("p95"),
        "latency_window_s": figures.get("window_s"),
        "busy_slots_per_decode": server.get("busy_slots_per_decode"),
        "switches_per_hour": activity["switches_per_hour"],
        "cold_start_s": activity["cold_start_s_last"],
    }
