"""Test doubles for testing one part of the accelmux policy alone.

``FakeView`` is a :class:`~accelmux.core.world.WorldView` made of plain data the test
sets: service and request states (the World's own record types), free memory and amounts
per device, the time, the world's version and epochs. Every index is computed on the fly
from those states (no operation keeps anything), so a test writes a field and the view
reads it. ``RecordingOps`` stands for :class:`~accelmux.core.world.WorldOps`: it records
each operation it is asked for (name and arguments) and changes nothing; what an
operation answers (``load``, ``resize``, ``dispatch``, ``pause`` return a bool) is set per
operation. ``part`` builds one part over them, the parts it takes built the same way
unless the test passes its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from accelmux.core.events import Demand
from accelmux.core.learned import Learned
from accelmux.core.ledger import Lease
from accelmux.core.policies.accelmux.cache import RoundCache
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.profiles import RequestEstimate, ServiceCalibration, estimate_request
from accelmux.core.specs import DAY_S, ManagerSpec
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceStatus,
    Tier,
)
from accelmux.core.world import RequestPhase, RequestState, ServiceState


class FakeSet:
    """A read-only set of services computed from a predicate over the view's services."""

    def __init__(self, members: Callable[[], list[ServiceState]]) -> None:
        self._members = members
        self.version = 0

    def __iter__(self) -> Iterator[ServiceState]:
        return iter(self._members())

    def __len__(self) -> int:
        return len(self._members())

    def __contains__(self, svc: object) -> bool:
        return any(s is svc for s in self._members())

    def names(self) -> set[str]:
        return {s.name for s in self._members()}


@dataclass
class FakeLedger:
    """Free memory per device as the test sets it, and amounts per (device, service,
    category) (0 unless set)."""

    free: dict[str, int] = field(default_factory=dict)
    amounts: dict[tuple[str, str, Category], int] = field(default_factory=dict)
    foreign_bytes: dict[str, int] = field(default_factory=dict)

    def available(self, device: str) -> int:
        return self.free.get(device, 0)

    def amount(self, device: str, service: str, category: Category) -> int:
        return self.amounts.get((device, service, category), 0)

    def fits(self, device: str, nbytes: int) -> bool:
        return nbytes <= self.available(device)

    def foreign(self, device: str) -> int:
        return self.foreign_bytes.get(device, 0)

    def overhead(self, device: str) -> int:
        return 0

    def parked(self, device: str) -> int:
        return 0


class FakeView:
    """A WorldView of plain data (see the module docstring)."""

    def __init__(self, spec: ManagerSpec) -> None:
        self.spec = spec
        self.knobs = spec.knobs
        self.devices = {d.name: d for d in spec.devices}
        self.services: dict[str, ServiceState] = {}
        for i, s in enumerate(spec.services):
            cal = ServiceCalibration(window=64, safety_factor=spec.knobs.safety_factor)
            self.services[s.name] = ServiceState(
                spec=s, calibration=cal, index=i, pinned=s.residency is Residency.PINNED
            )
        self.services_by_device = {
            d: [s for s in self.services.values() if s.spec.device == d] for d in self.devices
        }
        self.groups: dict[str, tuple[ServiceState, ...]] = {}
        for svc in self.services.values():
            if svc.spec.group:
                self.groups[svc.spec.group] = (*self.groups.get(svc.spec.group, ()), svc)
        self.realtime_by_device = {
            d: [s for s in svcs if s.spec.cls is ServiceClass.REALTIME]
            for d, svcs in self.services_by_device.items()
        }
        self.park_device: str | None = None
        self.now = 0.0
        self.shutting_down = False
        self.ledger = FakeLedger(free={d: 0 for d in self.devices})
        self.learned = Learned()
        self.waiting: dict[str, RequestState] = {}
        self.inflight: dict[str, RequestState] = {}
        self.finished_requests: deque[RequestState] = deque()
        self.admin_unload: set[str] = set()
        self.sampled_at: dict[str, float] = {}
        self.load_oom_devices: set[str] = set()
        self.caching_backends: set[str] = set()
        self.host_weights: dict[str, int] = {}
        self.host_kv = 0
        self.host_pending = 0
        self.version = 0
        self.epochs = dict.fromkeys(self.devices, 0)
        self.queue_mark = 0
        svcs = self.services.values
        self.loaded = FakeSet(lambda: [s for s in svcs() if s.is_up])
        self.busy = FakeSet(lambda: [s for s in svcs() if s.inflight])
        self.queued = FakeSet(lambda: [s for s in svcs() if s.queue])
        self.kept = FakeSet(lambda: [s for s in svcs() if s.pinned or s.admin_wants_loaded])
        self.evicted_out = FakeSet(
            lambda: [
                s
                for s in svcs()
                if s.last_evicted_at is not None and s.status is ServiceStatus.UNLOADED
            ]
        )
        self.crashed = FakeSet(lambda: [s for s in svcs() if s.status is ServiceStatus.CRASHED])

    # ---- test set-up ----------------------------------------------------------------
    def set_status(self, name: str, status: ServiceStatus) -> ServiceState:
        svc = self.services[name]
        svc.status = status
        return svc

    def add_request(
        self,
        rid: str,
        service: str,
        *,
        running: bool = False,
        demand: Demand | None = None,
        since: float | None = None,
    ) -> RequestState:
        """A request of ``service``, waiting (in its queue) or running (in flight)."""
        svc = self.services[service]
        self.queue_mark += 1
        req = RequestState(
            request_id=rid,
            service=service,
            cls=svc.spec.cls,
            demand=demand or Demand(),
            estimate=estimate_request(svc.spec.profile, demand or Demand()),
            arrived_at=self.now,
            deadline_at=self.now + svc.spec.deadline_s,
            seq=self.queue_mark,
            queued_mark=self.queue_mark,
        )
        if running:
            req.phase = RequestPhase.RUNNING
            req.attempt = 1
            req.dispatched_at = req.running_since = self.now if since is None else since
            svc.inflight[rid] = req
            self.inflight[rid] = req
        else:
            svc.queue[rid] = req
            svc.waiting_count += 1
            self.waiting[rid] = req
        return req

    def hold(self, name: str, nbytes: int) -> ServiceState:
        """``name`` holds ``nbytes`` of resident memory (its weights lease)."""
        svc = self.services[name]
        svc.resident_leases = [
            Lease(
                lease_id=0,
                device=svc.spec.device,
                service=name,
                category=Category.WEIGHTS,
                nbytes=nbytes,
            )
        ]
        return svc

    # ---- the reads of WorldView -------------------------------------------------------
    @property
    def wait_reasons(self) -> dict[Reason | None, int]:
        out: dict[Reason | None, int] = {}
        for r in self.waiting.values():
            out[r.wait_reason] = out.get(r.wait_reason, 0) + 1
        return out

    @property
    def waiting_classes(self) -> dict[tuple[str, ServiceClass], int]:
        out: dict[tuple[str, ServiceClass], int] = {}
        for r in self.waiting.values():
            key = (self.services[r.service].spec.device, r.cls)
            out[key] = out.get(key, 0) + 1
        return out

    @property
    def waiting_causes(self) -> dict[tuple[str, ServiceClass, Reason | None], int]:
        out: dict[tuple[str, ServiceClass, Reason | None], int] = {}
        for r in self.waiting.values():
            key = (self.services[r.service].spec.device, r.cls, r.wait_reason)
            out[key] = out.get(key, 0) + 1
        return out

    def epoch(self, device: str) -> int:
        return self.epochs[device]

    def memory_epoch(self, device: str) -> int:
        return self.epochs[device]

    def loaded_on(self, device: str) -> FakeSet:
        return FakeSet(lambda: [s for s in self.loaded if s.spec.device == device])

    def unloading_on(self, device: str) -> FakeSet:
        return FakeSet(
            lambda: [
                s for s in self.services_by_device[device] if s.status is ServiceStatus.UNLOADING
            ]
        )

    def queued_services(self, device: str, cls: ServiceClass) -> FakeSet:
        return FakeSet(
            lambda: [
                s
                for s in self.services_by_device[device]
                if any(r.cls is cls for r in s.queue.values())
            ]
        )

    def waiting_for(self, reason: Reason) -> int:
        return self.wait_reasons.get(reason, 0)

    def next_deadline(self, now: float) -> float | None:
        future = [r.deadline_at for r in self.waiting.values() if r.deadline_at > now]
        return min(future) if future else None

    def time_of_day(self, now: float | None = None) -> float:
        return (self.spec.clock_origin_s_of_day + (self.now if now is None else now)) % DAY_S

    def estimate(self, service: str, demand: Demand) -> RequestEstimate:
        return estimate_request(self.services[service].spec.profile, demand)

    def projected_active(self, req: RequestState) -> int:
        return self.services[req.service].calibration.project_active(req.estimate)

    def projected_resident(self, svc: ServiceState, kv_pool: int) -> tuple[int, int, int]:
        p = svc.spec.profile
        return p.weights, p.runtime, kv_pool

    def load_seconds(self, svc: ServiceState, tier: Tier | None = None) -> float:
        return svc.spec.profile.weights / 1e9 + svc.spec.init_s

    @property
    def host_used(self) -> int:
        return sum(self.host_weights.values()) + self.host_kv + self.host_pending

    def host_free(self) -> int:
        return self.spec.host_budget_bytes - self.host_used

    def parked_on_host(self) -> int:
        return 0

    def parked_of(self, svc: ServiceState) -> int:
        return 0

    def park_tier(self, svc: ServiceState) -> Tier:
        return Tier.COLD

    def resizable(self, svc: ServiceState) -> bool:
        return svc.is_up and svc.resize_support is ResizeSupport.LIVE and svc.resize_target is None

    def weights_holder(self, svc: ServiceState) -> ServiceState | None:
        return None

    def weights_sharers(self, svc: ServiceState) -> list[str]:
        return []


class RecordingOps:
    """Records each operation asked for, as ``(name, args, kwargs)``, and changes
    nothing. ``answers`` sets what an operation returns (default: True)."""

    def __init__(self, **answers: bool) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers = answers
        self.changes: list[object] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def record(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return self.answers.get(name, True)

        return record

    def named(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The calls of the operation ``name``, in order."""
        return [(a, k) for n, a, k in self.calls if n == name]

    def names(self) -> list[str]:
        return [n for n, _, _ in self.calls]


def seam(view: FakeView, ops: RecordingOps | None = None, *, cache: bool = True) -> Seam:
    """What a part is built on, over ``view`` and a recording ops."""
    return Seam(view, ops or RecordingOps(), RoundCache(view, enabled=cache))  # type: ignore[arg-type]


INF = math.inf
