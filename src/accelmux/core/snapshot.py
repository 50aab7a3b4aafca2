"""A read-only, JSON-ready picture of the Manager for status pages, metrics and the UI."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accelmux.core.ledger import DECIDED
from accelmux.core.specs import DeviceSpec
from accelmux.core.types import SERVICE_CATEGORIES, ServiceClass
from accelmux.core.world import ServiceState, World

RECENT_DECISIONS = 50


@dataclass(frozen=True, slots=True)
class Snapshot:
    time: float
    devices: list[dict[str, Any]]
    services: list[dict[str, Any]]
    queues: dict[str, int]
    decisions: list[dict[str, Any]]
    counts: dict[str, int]
    host: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "devices": self.devices,
            "services": self.services,
            "host": self.host,
            "queues": self.queues,
            "decisions": self.decisions,
            "counts": self.counts,
        }


class LogLine(Protocol):
    """A line of the decision log, as the snapshot shows it."""

    def as_dict(self) -> dict[str, object]: ...


def build_snapshot(
    w: World, log: Iterable[LogLine], counts: Mapping[tuple[str, str], int]
) -> Snapshot:
    """The picture of ``w``, with the last decisions of ``log`` and the decision ``counts``
    (by action and reason)."""
    devices = [device_view(w, name, dev) for name, dev in w.devices.items()]
    services = [service_view(w, svc) for svc in w.services.values()]
    queues = {c.label: 0 for c in ServiceClass}
    for req in w.waiting.values():
        queues[req.cls.label] += 1
    decisions = [d.as_dict() for d in list(log)[-RECENT_DECISIONS:]]
    return Snapshot(
        time=w.now,
        devices=devices,
        services=services,
        queues=queues,
        decisions=decisions,
        counts={f"{k}:{r}": n for (k, r), n in sorted(counts.items())},
        host={
            "park_budget_bytes": w.spec.host_budget_bytes,
            "parked_weights_bytes": sum(w.host_weights.values()),
            "parked_kv_bytes": w.host_kv,
        },
    )


def device_view(w: World, name: str, dev: DeviceSpec) -> dict[str, Any]:
    """One device in the snapshot: its sizes and what the ledger holds on it."""
    ledger = w.ledger
    return {
        "name": name,
        "kind": dev.kind,
        "capacity_bytes": dev.capacity_bytes,
        "budget_bytes": dev.budget_bytes,
        "headroom_bytes": dev.headroom_bytes,
        "foreign_bytes": ledger.foreign(name),
        "parked_bytes": ledger.parked(name),
        "overhead_bytes": ledger.overhead(name),
        "decided_bytes": ledger.decided(name),
        "committed_bytes": ledger.committed(name),
        "available_bytes": ledger.available(name),
    }


def service_view(w: World, svc: ServiceState) -> dict[str, Any]:
    """One service in the snapshot: its spec, state, ledger entries, KV pool, counters
    and what the policy learned about it."""
    spec = svc.spec
    learned = w.learned
    breakdown = w.ledger.service_breakdown(spec.device, svc.name)
    return {
        "name": svc.name,
        "kind": spec.kind.value,
        "class": spec.cls.label,
        "residency": spec.residency.value,
        "pinned": svc.pinned,
        "device": spec.device,
        "model": spec.model,
        "state": svc.status.value,
        "ledger": {c.value: breakdown[c] for c in SERVICE_CATEGORIES},
        "estimated_bytes": sum(breakdown[c] for c in DECIDED),
        "measured_bytes": svc.measured_bytes,
        "inflight": len(svc.inflight),
        "concurrency": spec.concurrency,
        "waiting": svc.waiting_count,
        "paused": sum(1 for r in svc.queue.values() if r.paused),
        "pausing": sum(1 for r in svc.inflight.values() if r.pausing is not None),
        "weights_shared_by": svc.weights_shared_by,
        "weights_shared_with": w.weights_sharers(svc),
        "tier": svc.tier.value,
        "load_seconds": {t.value: round(v, 3) for t, v in sorted(svc.load_s.items())},
        "kv_pool_bytes": svc.kv_pool,
        "kv_in_use_bytes": svc.kv_in_use,
        "kv_usable_bytes": svc.kv_usable,
        "resize_pending_bytes": svc.resize_target,
        "resize_failures": svc.resize_failures,
        "capabilities": spec.capabilities.as_dict(),
        "kv_floor_bytes": spec.profile.kv_floor,
        "kv_ceiling_bytes": spec.profile.kv_ceiling,
        "loads": svc.loads,
        "cold_starts": svc.cold_starts,
        "evictions": svc.evictions,
        "thrash": svc.thrash,
        "crashes": svc.crashes,
        "served": svc.served,
        "over_limit": svc.over_limit,
        "backoff_until": svc.backoff_until if svc.backoff_until > w.now else None,
        "calibration_factor": round(svc.calibration.active.factor, 4),
        # what the policy learned (World.learned); null where nothing is known
        "charged_bytes": learned.charged.get(svc.name),
        "high_water_bytes": learned.high_water.get(svc.name),
        "realtime_peak_bytes": learned.realtime_peak.get(svc.name),
        "windows": [[win.start_s, win.end_s] for win in spec.windows],
        "in_window": spec.in_window(w.time_of_day()),
    }
