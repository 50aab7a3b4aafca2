"""The Manager's world: services, requests, their derived indexes and the host tiers.

:class:`World` holds the state; it has no method that changes it. Every change is a
named operation of :class:`~accelmux.core.world.ops.WorldOps` (the one writer), which
keeps the ledger, the states and the indexes below consistent, records the action, and
notes what it changed (:class:`~accelmux.core.world.ops.Change`). Parts of a policy and
the shell read the World through :class:`~accelmux.core.world.view.WorldView`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from accelmux.core.actions import Action
from accelmux.core.events import Demand
from accelmux.core.learned import Learned
from accelmux.core.ledger import Ledger
from accelmux.core.profiles import RequestEstimate, ServiceCalibration, estimate_request
from accelmux.core.specs import DAY_S, ManagerSpec
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    Tier,
)
from accelmux.core.world.data import MIN_LOAD_S, RequestState, ServiceState
from accelmux.core.world.sets import ServiceSet


class World:
    """The state of one Manager, and what can be read of it (no method here changes it).

    Besides the states, the World keeps indexes that spare policies a scan of every
    service or request per event: services by status, with requests in flight, with
    waiting requests, kept loaded, evicted and still out; waiting requests by cause and
    by (device, class); a deadline heap. Only :class:`~accelmux.core.world.ops.WorldOps`
    changes them, with the states they are built from (``tests/core/world_oracle.py``
    recomputes them from scratch, for tests).
    """

    def __init__(self, spec: ManagerSpec) -> None:
        self.spec = spec
        self.knobs = spec.knobs
        self.ledger = Ledger(spec.devices)
        self.devices = {d.name: d for d in spec.devices}
        self._init_services(spec)
        self._init_requests()
        self._init_indexes()
        self._init_host(spec)

    def _init_services(self, spec: ManagerSpec) -> None:
        """Each service's state, by name, per device, per group and realtime per device."""
        self.services: dict[str, ServiceState] = {}
        #: One calibration per model: the replicas of a service learn together (what a
        #: request or a load really takes does not depend on the device it runs on).
        calibrations: dict[str, ServiceCalibration] = {}
        for i, s in enumerate(spec.services):
            calibration = calibrations.setdefault(
                s.addressed_as,
                ServiceCalibration(
                    window=spec.knobs.calibration_window,
                    safety_factor=spec.knobs.safety_factor,
                    learn=spec.knobs.switches.calibration,
                ),
            )
            self.services[s.name] = ServiceState(
                spec=s,
                calibration=calibration,
                index=i,
                pinned=s.residency is Residency.PINNED,
            )
        self.services_by_device: dict[str, list[ServiceState]] = {d: [] for d in self.devices}
        for svc in self.services.values():
            self.services_by_device[svc.spec.device].append(svc)
        #: The replicas of each service that may run on several devices, by the name
        #: requests address (``core.placement``), in config order.
        self.groups: dict[str, tuple[ServiceState, ...]] = {}
        for svc in self.services.values():
            if svc.spec.group:
                self.groups[svc.spec.group] = (*self.groups.get(svc.spec.group, ()), svc)
        #: Realtime services per device (classes never change at run time).
        self.realtime_by_device: dict[str, list[ServiceState]] = {
            d: [s for s in svcs if s.spec.cls is ServiceClass.REALTIME]
            for d, svcs in self.services_by_device.items()
        }

    def _init_requests(self) -> None:
        """Requests, the round's actions, and what events taught about devices and services."""
        self.waiting: dict[str, RequestState] = {}
        self.inflight: dict[str, RequestState] = {}
        self.now = 0.0
        self.shutting_down = False
        self.admin_unload: set[str] = set()
        self.actions: list[Action] = []
        self.seq = 0
        #: Bumped by every recorded action: within one decide round, an unchanged
        #: version means no mutator ran, so per-device aggregates may be reused.
        self.version = 0
        self.finished_requests: deque[RequestState] = deque(maxlen=1000)
        #: When each device's memory was last measured (``MemorySampled``).
        self.sampled_at: dict[str, float] = {}
        #: Devices where a load has run out of memory: what their ledger says about the
        #: size of a load is not to be trusted with another load beside it.
        self.load_oom_devices: set[str] = set()
        #: Services (as addressed) whose allocator keeps the memory a finished request
        #: freed (a caching allocator, as measured): that memory stays charged to the
        #: service, as RESERVED, until the next sample measures what it really holds.
        self.caching_backends: set[str] = set()
        #: What the policy learned per service from measurements and crashes (charges,
        #: high waters, realtime peaks): changed through the mutators below, shown in
        #: the snapshot.
        self.learned = Learned()

    def _init_indexes(self) -> None:
        """The indexes of the class docstring, empty but for the kept services."""
        #: Status LOADED, all and per device. Services with requests in flight are loaded.
        self.loaded = ServiceSet()
        self.loaded_by_device = {d: ServiceSet() for d in self.devices}
        #: Status UNLOADING, per device (their memory is on its way back).
        self.unloading_by_device = {d: ServiceSet() for d in self.devices}
        #: At least one request in flight.
        self.busy = ServiceSet()
        #: At least one waiting request.
        self.queued = ServiceSet()
        #: Pinned or loaded by the operator.
        self.kept = ServiceSet()
        #: Evicted (``last_evicted_at`` set) and UNLOADED since.
        self.evicted_out = ServiceSet()
        #: Status CRASHED (a crash or a failed load); a policy learns from crashes here.
        self.crashed = ServiceSet()
        for svc in self.services.values():
            self.kept.update(svc, svc.pinned or svc.admin_wants_loaded)
        #: Waiting requests per ``wait_reason`` (None: not yet told why).
        self.wait_reasons: dict[Reason | None, int] = {}
        #: Waiting requests per (device, class), and per (device, class, wait_reason).
        self.waiting_classes: dict[tuple[str, ServiceClass], int] = {}
        self.waiting_causes: dict[tuple[str, ServiceClass, Reason | None], int] = {}
        #: Services with waiting requests per (device, class).
        self.queued_by_class: dict[tuple[str, ServiceClass], ServiceSet] = {
            (d, c): ServiceSet() for d in self.devices for c in ServiceClass
        }
        #: (deadline, queued_mark, request) of every request that entered the queue;
        #: entries of requests that left it (or re-entered later) are skipped lazily.
        self.deadlines: list[tuple[float, int, RequestState]] = []
        self.queue_mark = 0
        #: Per device, bumped by every change that can alter a decision there (every
        #: event about it, every action on it but an Enqueue): equal epochs, same state.
        self.epochs: dict[str, int] = dict.fromkeys(self.devices, 0)
        #: Per device, bumped by every change of an epoch but those that change nothing a
        #: service's load reads there: a request joining or leaving the queue of a service
        #: that is down (it holds nothing, and no survey of the device sees that queue).
        self.memory_epochs: dict[str, int] = dict.fromkeys(self.devices, 0)

    def _init_host(self, spec: ManagerSpec) -> None:
        """The host RAM held for parked weights and KV state, and the host device."""
        #: Host RAM held for parked and sleeping weights (per service, oldest first)
        #: and for parked KV state (total), against ``spec.host_budget_bytes``.
        self.host_weights: dict[str, int] = {}
        self.host_kv = 0
        #: Host RAM held for KV state of pauses the backend has not confirmed yet (each
        #: request's ``pause_reserved``): the budget keeps room for it.
        self.host_pending = 0
        #: The device whose memory is the host RAM (kind ``host``), if any: the park
        #: budget is carved out of its budget (``Ledger.parked``).
        self.park_device: str | None = next(
            (d.name for d in spec.devices if d.kind == "host"), None
        )

    # ---- time ---------------------------------------------------------------
    def time_of_day(self, now: float | None = None) -> float:
        t = self.now if now is None else now
        return (self.spec.clock_origin_s_of_day + t) % DAY_S

    def epoch(self, device: str) -> int:
        return self.epochs[device]

    def memory_epoch(self, device: str) -> int:
        return self.memory_epochs[device]

    def loaded_on(self, device: str) -> ServiceSet:
        return self.loaded_by_device[device]

    def unloading_on(self, device: str) -> ServiceSet:
        return self.unloading_by_device[device]

    def queued_services(self, device: str, cls: ServiceClass) -> ServiceSet:
        """Services of class ``cls`` on ``device`` with waiting requests."""
        return self.queued_by_class[(device, cls)]

    def waiting_for(self, reason: Reason) -> int:
        """How many waiting requests were last told to wait for ``reason``."""
        return self.wait_reasons.get(reason, 0)

    def queued_now(self, entry: tuple[float, int, RequestState]) -> bool:
        _, mark, req = entry
        return req.queued_mark == mark and self.waiting.get(req.request_id) is req

    def next_deadline(self, now: float) -> float | None:
        """The earliest deadline after ``now`` of a waiting request."""
        heap = self.deadlines
        while heap and not self.queued_now(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return None
        if heap[0][0] > now:
            return heap[0][0]
        # A request re-queued after the deadline check is already past its deadline.
        future = [e[0] for e in heap if e[0] > now and self.queued_now(e)]
        return min(future) if future else None

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

    def load_seconds(self, svc: ServiceState, tier: Tier | None = None) -> float:
        """Seconds a load from ``tier`` (default: where the weights are now) takes: the
        measured mean of past loads from that tier, else the bandwidth model (a sleeping
        service wakes without the start-up time)."""
        tier = svc.tier if tier is None else tier
        measured = svc.load_s.get(tier)
        if measured is not None:
            return max(measured, MIN_LOAD_S)
        dev = self.devices[svc.spec.device]
        weights = svc.spec.profile.weights
        if tier is Tier.COLD:
            return weights / dev.load_bandwidth_bps + svc.spec.init_s
        copy = weights / dev.host_bandwidth_bps
        return copy if tier is Tier.SLEEPING else copy + svc.spec.init_s

    @property
    def host_used(self) -> int:
        return sum(self.host_weights.values()) + self.host_kv + self.host_pending

    def host_free(self) -> int:
        return self.spec.host_budget_bytes - self.host_used

    def parked_on_host(self) -> int:
        """Bytes the park budget holds that are not also device memory of a service."""
        weights = sum(
            n for name, n in self.host_weights.items() if not self.services[name].holds_memory
        )
        return weights + self.host_kv

    def parked_of(self, svc: ServiceState) -> int:
        """What the park budget holds of ``svc`` (its weights once it holds no device
        memory, and the KV state its paused requests parked in RAM)."""
        weights = 0 if svc.holds_memory else self.host_weights.get(svc.name, 0)
        return weights + sum(
            r.parked_kv for r in svc.queue.values() if r.paused and r.parked_in_ram
        )

    def park_tier(self, svc: ServiceState) -> Tier:
        """Where ``svc``'s weights may go when it unloads, by what its backend declares
        (``sleep``: sleeping; ``host_cache``: parked) and whether the host budget could
        hold them (after dropping other parked weights): cold otherwise."""
        caps = svc.spec.capabilities
        if not self.spec.host_budget_bytes or not (caps.sleep or caps.host_cache):
            return Tier.COLD
        held_kv = self.host_kv + self.host_pending
        if self.host_weight_bytes(svc) > self.spec.host_budget_bytes - held_kv:
            return Tier.COLD
        return Tier.SLEEPING if caps.sleep else Tier.PARKED

    def host_weight_bytes(self, svc: ServiceState) -> int:
        leased = sum(le.nbytes for le in svc.resident_leases if le.category is Category.WEIGHTS)
        return leased or svc.spec.profile.weights

    def parks_in_ram(self, svc: ServiceState) -> bool:
        """Whether ``svc``'s backend parks KV state in host RAM (else on disk: no charge)."""
        return not svc.spec.capabilities.park_on_disk

    def resizable(self, svc: ServiceState) -> bool:
        """Whether the service's KV pool can change now: it is loaded, its backend
        declares a live resize, and no earlier resize awaits its answer."""
        return svc.is_up and svc.resize_support is ResizeSupport.LIVE and svc.resize_target is None

    def weights_holder(self, svc: ServiceState) -> ServiceState | None:
        """The service on ``svc``'s device that holds (and is charged) the weights copy
        ``svc`` shares (same ``weights_key``), if one holds memory."""
        key = svc.spec.weights_key
        if not key:
            return None
        for other in self.services_by_device[svc.spec.device]:
            if (
                other is not svc
                and other.spec.weights_key == key
                and other.holds_memory
                and other.weights_shared_by is None
            ):
                return other
        return None

    def weights_sharers(self, svc: ServiceState) -> list[str]:
        """The services whose weights are the copy ``svc`` holds (and is charged)."""
        if not svc.spec.weights_key or svc.weights_shared_by is not None:
            return []
        return [
            s.name
            for s in self.services_by_device[svc.spec.device]
            if s.weights_shared_by == svc.name and s.holds_memory
        ]
