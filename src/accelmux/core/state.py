"""The Manager's world: service and request state, and the mutators policies call.

Policies never build actions by hand: they call the mutators here (``dispatch``,
``enqueue``, ``reject``, ``load``, ``unload``, ``resize``, ``preempt``), which update the
ledger and the states consistently and record the action. This keeps every policy,
baselines included, inside the same bookkeeping.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Preempt,
    Reject,
    Resize,
    Unload,
)
from accelmux.core.events import Demand
from accelmux.core.ledger import Lease, Ledger
from accelmux.core.profiles import RequestEstimate, ServiceCalibration, estimate_request
from accelmux.core.specs import DAY_S, ManagerSpec, ServiceSpec
from accelmux.core.types import Category, Reason, Residency, ServiceClass, ServiceStatus
from accelmux.errors import InvariantError

#: How many explanation lines one request keeps.
EXPLAIN_LINES = 16


@dataclass(slots=True)
class ServiceState:
    spec: ServiceSpec
    calibration: ServiceCalibration
    status: ServiceStatus = ServiceStatus.UNLOADED
    pinned: bool = False
    resident_leases: list[Lease] = field(default_factory=list)
    kv_lease: Lease | None = None
    kv_in_use: int = 0
    inflight: dict[str, RequestState] = field(default_factory=dict)
    waiting_count: int = 0
    last_used: float = -math.inf
    last_kv_demand: float = -math.inf
    loaded_at: float | None = None
    loading_since: float | None = None
    load_reason: Reason | None = None
    loads: int = 0
    cold_starts: int = 0
    evictions: int = 0
    thrash: int = 0
    last_evicted_at: float | None = None
    crashes: int = 0
    consecutive_failures: int = 0
    backoff_until: float = -math.inf
    admin_wants_loaded: bool = False
    measured_bytes: int | None = None
    over_limit: bool = False
    rate: float = 0.0
    rate_at: float = 0.0
    mean_service_s: float = 1.0
    served: int = 0
    peak_active_bytes: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kv_pool(self) -> int:
        return self.kv_lease.nbytes if self.kv_lease is not None else 0

    @property
    def resident_bytes(self) -> int:
        return sum(le.nbytes for le in self.resident_leases) + self.kv_pool

    @property
    def is_up(self) -> bool:
        return self.status is ServiceStatus.LOADED

    @property
    def holds_memory(self) -> bool:
        return self.status in (ServiceStatus.LOADING, ServiceStatus.LOADED, ServiceStatus.UNLOADING)

    @property
    def idle(self) -> bool:
        return not self.inflight


@dataclass(slots=True)
class RequestState:
    request_id: str
    service: str
    cls: ServiceClass
    demand: Demand
    estimate: RequestEstimate
    arrived_at: float
    deadline_at: float
    seq: int
    job_id: str | None = None
    attempt: int = 0
    active_lease: Lease | None = None
    kv_bytes: int = 0
    dispatched_at: float | None = None
    wait_reason: Reason | None = None
    announced: bool = False
    explain: deque[str] = field(default_factory=lambda: deque(maxlen=EXPLAIN_LINES))

    @property
    def sort_key(self) -> tuple[int, int]:
        return (int(self.cls), self.seq)


def reuse_rate(svc: ServiceState, now: float, horizon_s: float) -> float:
    """Arrival rate (1/s) of a service, decayed to ``now`` (exponential, tau = horizon)."""
    if svc.rate <= 0:
        return 0.0
    return svc.rate * math.exp(-max(0.0, now - svc.rate_at) / horizon_s)


class World:
    """Mutable state of one Manager. Policies mutate it only through the methods below."""

    def __init__(self, spec: ManagerSpec) -> None:
        self.spec = spec
        self.knobs = spec.knobs
        self.ledger = Ledger(spec.devices)
        self.devices = {d.name: d for d in spec.devices}
        self.services: dict[str, ServiceState] = {}
        for s in spec.services:
            self.services[s.name] = ServiceState(
                spec=s,
                calibration=ServiceCalibration(
                    window=spec.knobs.calibration_window,
                    safety_factor=spec.knobs.safety_factor,
                    learn=spec.knobs.enabled("calibration"),
                ),
                pinned=s.residency is Residency.PINNED,
            )
        self.services_by_device: dict[str, list[ServiceState]] = {d: [] for d in self.devices}
        for svc in self.services.values():
            self.services_by_device[svc.spec.device].append(svc)
        #: Realtime services per device (classes never change at run time).
        self.realtime_by_device: dict[str, list[ServiceState]] = {
            d: [s for s in svcs if s.spec.cls is ServiceClass.REALTIME]
            for d, svcs in self.services_by_device.items()
        }
        self.waiting: dict[str, RequestState] = {}
        self.inflight: dict[str, RequestState] = {}
        self.now = 0.0
        self.shutting_down = False
        self.admin_unload: set[str] = set()
        self._actions: list[Action] = []
        self._seq = 0
        #: Bumped by every recorded action: within one decide round, an unchanged
        #: version means no mutator ran, so per-device aggregates may be reused.
        self.version = 0
        self.finished_requests: deque[RequestState] = deque(maxlen=1000)
        #: When each device's memory was last measured (``MemorySampled``).
        self.sampled_at: dict[str, float] = {}

    # ---- time ---------------------------------------------------------------
    def time_of_day(self, now: float | None = None) -> float:
        t = self.now if now is None else now
        return (self.spec.clock_origin_s_of_day + t) % DAY_S

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ---- actions ------------------------------------------------------------
    def record(self, action: Action) -> None:
        self._actions.append(action)
        self.version += 1

    def drain(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def _explain(self, req: RequestState, text: str) -> None:
        req.explain.append(f"t={self.now:.3f} {text}")

    # ---- estimates ------------------------------------------------------------
    def estimate(self, service: str, demand: Demand) -> RequestEstimate:
        return estimate_request(self.services[service].spec.profile, demand)

    def projected_active(self, req: RequestState) -> int:
        svc = self.services[req.service]
        return svc.calibration.project_active(req.estimate)

    def projected_resident(self, svc: ServiceState, kv_pool: int) -> tuple[int, int, int]:
        """(weights, runtime, kv_pool) a load would commit, calibrated."""
        p = svc.spec.profile
        factor_total = svc.calibration.project_resident(p.weights + p.runtime)
        base = p.weights + p.runtime
        scale = factor_total / base if base else 1.0
        return (math.ceil(p.weights * scale), math.ceil(p.runtime * scale), kv_pool)

    def load_seconds(self, svc: ServiceState) -> float:
        dev = self.devices[svc.spec.device]
        return svc.spec.profile.weights / dev.load_bandwidth_bps + svc.spec.init_s

    # ---- request mutators -----------------------------------------------------
    def dispatch(
        self,
        req: RequestState,
        *,
        reason: Reason,
        active_bytes: int | None = None,
        enforce: bool = True,
        detail: str = "",
    ) -> bool:
        """Grant memory and start the request. False (and no action) if it does not fit."""
        svc = self.services[req.service]
        if not svc.is_up:
            raise InvariantError(f"dispatch to {svc.name} while {svc.status.value}")
        if req.request_id not in self.waiting:
            raise InvariantError(f"dispatch of {req.request_id} which is not waiting")
        kv = req.estimate.kv_bytes
        if kv > svc.kv_pool - svc.kv_in_use:
            return False
        need = self.projected_active(req) if active_bytes is None else active_bytes
        lease = self.ledger.reserve(
            svc.spec.device, svc.name, Category.ACTIVE, need, enforce=enforce
        )
        if lease is None:
            return False
        del self.waiting[req.request_id]
        svc.waiting_count -= 1
        req.attempt += 1
        req.active_lease = lease
        req.kv_bytes = kv
        req.dispatched_at = self.now
        req.wait_reason = None
        svc.kv_in_use += kv
        svc.peak_active_bytes = max(svc.peak_active_bytes, need)
        svc.inflight[req.request_id] = req
        svc.last_used = self.now
        self.inflight[req.request_id] = req
        self._explain(req, f"dispatch ({reason.value}) lease={need + kv}B {detail}".rstrip())
        self.record(
            Dispatch(
                request_id=req.request_id,
                service=svc.name,
                attempt=req.attempt,
                lease_bytes=need + kv,
                reason=reason,
                detail=detail,
            )
        )
        return True

    def enqueue(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        """Mark the request waiting; an action is recorded only when the cause changes."""
        if req.wait_reason is reason:
            return
        req.wait_reason = reason
        self._explain(req, f"wait ({reason.value}) {detail}".rstrip())
        self.record(
            Enqueue(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )

    def reject(
        self, req: RequestState, *, reason: Reason, retry_after_s: float, detail: str = ""
    ) -> None:
        if self.waiting.pop(req.request_id, None) is None:
            raise InvariantError(f"reject of {req.request_id} which is not waiting")
        self.services[req.service].waiting_count -= 1
        self._explain(req, f"reject ({reason.value}) retry_after={retry_after_s:.0f}s {detail}")
        self.record(
            Reject(
                request_id=req.request_id,
                service=req.service,
                reason=reason,
                retry_after_s=max(0.0, retry_after_s),
                detail=detail,
            )
        )
        self.finished_requests.append(req)

    def _release_request(self, req: RequestState) -> None:
        svc = self.services[req.service]
        if req.active_lease is not None:
            self.ledger.release(req.active_lease)
            req.active_lease = None
        svc.kv_in_use -= req.kv_bytes
        req.kv_bytes = 0
        if svc.kv_in_use < 0:
            raise InvariantError(f"{svc.name}: kv_in_use went negative")
        svc.inflight.pop(req.request_id, None)
        self.inflight.pop(req.request_id, None)

    def finish(self, req: RequestState) -> None:
        """Bookkeeping of a request that ended after dispatch (no action)."""
        self._release_request(req)
        self._explain(req, "finished")
        self.finished_requests.append(req)

    def fail(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        self._release_request(req)
        self._explain(req, f"failed ({reason.value}) {detail}".rstrip())
        self.record(
            Fail(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )
        self.finished_requests.append(req)

    def preempt(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        """Stop a running request and put it back at its place in the queue."""
        attempt = req.attempt
        self._release_request(req)
        self.waiting[req.request_id] = req
        # keep queue order stable: re-insert sorted by seq is done by policies' sort
        self.services[req.service].waiting_count += 1
        req.wait_reason = None
        self._explain(req, f"preempted ({reason.value}) {detail}".rstrip())
        self.record(
            Preempt(
                request_id=req.request_id,
                service=req.service,
                attempt=attempt,
                reason=reason,
                detail=detail,
            )
        )

    # ---- service mutators -----------------------------------------------------
    def load(
        self,
        svc: ServiceState,
        *,
        reason: Reason,
        kv_pool: int | None = None,
        enforce: bool = True,
        detail: str = "",
    ) -> bool:
        """Commit the service's resident memory and start loading it."""
        if svc.status not in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            raise InvariantError(f"load of {svc.name} while {svc.status.value}")
        pool = svc.spec.profile.kv_floor if kv_pool is None else kv_pool
        weights, runtime, pool = self.projected_resident(svc, pool)
        total = weights + runtime + pool
        device = svc.spec.device
        if enforce and not self.ledger.fits(device, total):
            return False
        leases = [
            self.ledger.reserve(device, svc.name, Category.WEIGHTS, weights, enforce=False),
            self.ledger.reserve(device, svc.name, Category.RUNTIME, runtime, enforce=False),
        ]
        svc.resident_leases = [le for le in leases if le is not None]
        svc.kv_lease = self.ledger.reserve(device, svc.name, Category.KV, pool, enforce=False)
        svc.status = ServiceStatus.LOADING
        svc.loading_since = self.now
        svc.load_reason = reason
        svc.loads += 1
        if svc.last_evicted_at is not None and self.now - svc.last_evicted_at <= 60.0:
            svc.thrash += 1
        self.record(
            Load(
                service=svc.name,
                reason=reason,
                weights_bytes=weights,
                runtime_bytes=runtime,
                kv_pool_bytes=pool,
                detail=detail,
            )
        )
        return True

    def unload(self, svc: ServiceState, *, reason: Reason, detail: str = "") -> None:
        if svc.status is not ServiceStatus.LOADED:
            raise InvariantError(f"unload of {svc.name} while {svc.status.value}")
        if svc.inflight:
            raise InvariantError(f"unload of {svc.name} with requests in flight")
        svc.status = ServiceStatus.UNLOADING
        if reason not in (Reason.TTL_EXPIRED, Reason.ADMIN):
            svc.evictions += 1
            svc.last_evicted_at = self.now
        self.record(Unload(service=svc.name, reason=reason, detail=detail))

    def resize(
        self,
        svc: ServiceState,
        new_pool: int,
        *,
        reason: Reason,
        enforce: bool = True,
        detail: str = "",
    ) -> bool:
        """Set the KV pool size; never below what is in use. False if growth does not fit."""
        if not svc.is_up:
            return False
        new_pool = max(new_pool, svc.kv_in_use)
        old = svc.kv_pool
        if new_pool == old:
            return False
        device = svc.spec.device
        if new_pool > old and enforce and not self.ledger.fits(device, new_pool - old):
            return False
        if svc.kv_lease is not None:
            self.ledger.release(svc.kv_lease)
        svc.kv_lease = self.ledger.reserve(device, svc.name, Category.KV, new_pool, enforce=False)
        self.record(Resize(service=svc.name, kv_pool_bytes=new_pool, reason=reason, detail=detail))
        return True

    def release_service(self, svc: ServiceState) -> None:
        """Drop every byte a service holds (after Unloaded, LoadFailed or a crash)."""
        for le in svc.resident_leases:
            self.ledger.release(le)
        svc.resident_leases = []
        if svc.kv_lease is not None:
            self.ledger.release(svc.kv_lease)
            svc.kv_lease = None
        self.ledger.drop_service(svc.spec.device, svc.name)
        svc.measured_bytes = None
        svc.over_limit = False
