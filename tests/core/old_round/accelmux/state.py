"""The Manager's world: service and request state, and the mutators policies call.

Policies never build actions by hand: they call the mutators here (``dispatch``,
``enqueue``, ``reject``, ``load``, ``unload``, ``resize``, ``preempt``), which update the
ledger and the states consistently and record the action, and they note what they learn
through the World as well (``mark_announced``, ``clear_admin_unload``,
``forget_eviction``, ``observe_failure``, ``observe_excess``, ``charge``, ``touch``; the
facts a policy learns per service are kept in ``World.learned``). This keeps
every policy, baselines included, inside the same bookkeeping; a test
(``tests/core/test_policy_mutators.py``) fails on a policy that writes a field of the
World, a service or a request itself.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Pause,
    Preempt,
    Reject,
    Resize,
    Resume,
    Unload,
)
from accelmux.core.events import Demand
from accelmux.core.learned import Learned
from accelmux.core.ledger import Lease, Ledger
from accelmux.core.profiles import RequestEstimate, ServiceCalibration, estimate_request
from accelmux.core.specs import DAY_S, ManagerSpec, ServiceSpec
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceStatus,
    Tier,
)
from accelmux.errors import InvariantError

#: How many explanation lines one request keeps.
EXPLAIN_LINES = 16
#: The shortest load time a measurement is taken for (an instant load still costs).
MIN_LOAD_S = 0.01


@dataclass(slots=True)
class ServiceState:
    spec: ServiceSpec
    calibration: ServiceCalibration
    #: Position of the service in the spec: indexes list services in this order.
    index: int = 0
    #: ``spec.name`` (read on every decision: a field, not a property).
    name: str = field(init=False, default="")
    status: ServiceStatus = ServiceStatus.UNLOADED
    pinned: bool = False
    resident_leases: list[Lease] = field(default_factory=list)
    kv_lease: Lease | None = None
    #: ``kv_lease``'s bytes (0 without one), kept with it by ``World._hold_kv``: read
    #: on every decision, so a field rather than a property.
    kv_pool: int = 0
    kv_in_use: int = 0
    #: A Resize the backend has not answered yet: the pool it asked for, and the pool
    #: before it. Meanwhile the ledger holds the larger and requests get the smaller.
    resize_target: int | None = None
    resize_from: int | None = None
    resize_failures: int = 0
    #: The backend refused a live resize: from then on its pool is treated as one that
    #: changes only at the next load (a backend that refused once is not asked again).
    resize_refused: bool = False
    inflight: dict[str, RequestState] = field(default_factory=dict)
    #: This service's waiting requests, in the order of ``World.waiting``.
    queue: dict[str, RequestState] = field(default_factory=dict)
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
    #: (estimated activation, lease bytes) of each request that was running when its
    #: backend last crashed (``World.note_crash``): a policy learns from them.
    crash_held: list[tuple[int, int]] = field(default_factory=list)
    consecutive_failures: int = 0
    backoff_until: float = -math.inf
    admin_wants_loaded: bool = False
    measured_bytes: int | None = None
    #: How much more the last load measured than its resident leases grant: memory
    #: samples show it as ``reserved``, and it is not its requests' activation memory.
    load_excess: int = 0
    over_limit: bool = False
    rate: float = 0.0
    rate_at: float = 0.0
    mean_service_s: float = 1.0
    served: int = 0
    peak_active_bytes: int = 0
    #: The latest request's keep_alive (None: it gave none, ``spec.ttl_s`` applies).
    keep_alive_s: float | None = None
    #: Where the weights are while not loaded (cold: disk only), and since when they
    #: are held in host RAM (for the host budget's least-recently-parked order).
    tier: Tier = Tier.COLD
    #: The tier the load in progress reads from, and the measured seconds of past
    #: loads from each tier (exponentially weighted): reload costs are measured.
    loading_from: Tier = Tier.COLD
    load_s: dict[Tier, float] = field(default_factory=dict)
    #: The KV pool a sleeping service's process still holds: it wakes with it.
    slept_pool: int | None = None
    #: KV bytes of paused requests that kept their place in the pool (not parked):
    #: the service cannot unload while they wait.
    paused_kv: int = 0
    #: The service whose weights copy this one shares while loaded (``weights_key``):
    #: its own WEIGHTS are then 0, the copy is charged once, to that service.
    weights_shared_by: str | None = None

    def __post_init__(self) -> None:
        self.name = self.spec.name

    @property
    def ttl_s(self) -> float:
        """Idle seconds before a TTL unload: the latest client's keep_alive, else the config's."""
        return self.spec.ttl_s if self.keep_alive_s is None else self.keep_alive_s

    @property
    def kv_usable(self) -> int:
        """KV bytes requests may be admitted into: the smaller pool while a resize waits."""
        if self.resize_target is None or self.resize_from is None:
            return self.kv_pool
        return min(self.resize_target, self.resize_from)

    @property
    def resize_support(self) -> ResizeSupport:
        """What the backend declared, less a live resize it refused since this load."""
        declared = self.spec.capabilities.resize
        if declared is ResizeSupport.LIVE and self.resize_refused:
            return ResizeSupport.NEXT_LOAD
        return declared

    @property
    def kv_request_limit(self) -> int:
        """The most KV one request may ever hold: the ceiling of the pool, or one slot's
        share of it where the backend splits its pool between ``concurrency`` slots."""
        ceiling = self.spec.profile.kv_ceiling
        if self.spec.capabilities.kv_per_slot:
            return ceiling // self.spec.concurrency
        return ceiling

    @property
    def kv_slot(self) -> int:
        """The most KV one request may hold in the pool now (one slot's share of the
        usable pool where the backend splits it, else the whole usable pool)."""
        if self.spec.capabilities.kv_per_slot:
            return self.kv_usable // self.spec.concurrency
        return self.kv_usable

    @property
    def resizing(self) -> bool:
        return self.resize_target is not None

    @property
    def kv_shrinking(self) -> int:
        """KV bytes a pending shrink gives back once the backend answers (0: none)."""
        if self.resize_target is None or self.resize_from is None:
            return 0
        return max(0, self.resize_from - self.resize_target)

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
        """No request runs and none is paused in its KV pool (it may unload)."""
        return not self.inflight and not self.paused_kv


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
    #: When the request last entered the queue (a World counter): ``World.waiting``
    #: is in this order.
    queued_mark: int = 0
    #: Paused between tokens (it waits for a Resume, not a Dispatch), with its KV
    #: state parked off the device (``parked_kv`` bytes, charged to the host budget)
    #: or still in its service's pool (``kv_bytes``). ``pauses``: how often so far.
    #: Its answer is streamed: it may be paused (see ``RequestArrived.pausable``).
    pausable: bool = False
    paused: bool = False
    parked_kv: int = 0
    #: Paused with its KV state off the device (``parked_kv`` may be 0), and whether
    #: that state is in host RAM (charged to the host budget) rather than on disk.
    parked: bool = False
    parked_in_ram: bool = False
    #: A Pause the backend has not answered yet: whether it parks (None: none asked).
    #: Until the answer the request runs and keeps what it holds.
    pausing: bool | None = None
    pausing_for_realtime: bool = False
    #: Host RAM kept for the KV state a pending parked pause will save (0: none).
    pause_reserved: int = 0
    pauses: int = 0
    #: Pauses that gave the compute to realtime work (not counted in ``pauses``).
    yields: int = 0
    #: When its current run (dispatch or resume) started.
    running_since: float | None = None
    explain: deque[str] = field(default_factory=lambda: deque(maxlen=EXPLAIN_LINES))

    @property
    def sort_key(self) -> tuple[int, int]:
        return (int(self.cls), self.seq)


def reuse_rate(svc: ServiceState, now: float, horizon_s: float) -> float:
    """Arrival rate (1/s) of a service, decayed to ``now`` (exponential, tau = horizon)."""
    if svc.rate <= 0:
        return 0.0
    return svc.rate * math.exp(-max(0.0, now - svc.rate_at) / horizon_s)


class ServiceSet:
    """A subset of the services, iterated in spec order; the World's mutators keep it.

    Iteration walks a snapshot: mutating the set inside the loop is safe, and a member
    removed meanwhile is still visited (loops re-check the state they filter on).
    """

    __slots__ = ("_members", "_ordered", "version")

    def __init__(self) -> None:
        self._members: dict[str, ServiceState] = {}
        self._ordered: list[ServiceState] | None = []
        #: Bumped by every change of members: what is derived from them may be kept.
        self.version = 0

    def add(self, svc: ServiceState) -> None:
        if svc.spec.name not in self._members:
            self._members[svc.spec.name] = svc
            self._ordered = None
            self.version += 1

    def discard(self, svc: ServiceState) -> None:
        if self._members.pop(svc.spec.name, None) is not None:
            self._ordered = None
            self.version += 1

    def update(self, svc: ServiceState, member: bool) -> None:
        if member:
            self.add(svc)
        else:
            self.discard(svc)

    def __contains__(self, svc: object) -> bool:
        return isinstance(svc, ServiceState) and svc.spec.name in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[ServiceState]:
        if self._ordered is None:
            self._ordered = sorted(self._members.values(), key=_spec_order)
        return iter(self._ordered)

    def names(self) -> set[str]:
        return set(self._members)


def _expect_index(what: str, got: object, want: object) -> None:
    if got != want:
        raise InvariantError(f"index {what}: kept {got!r}, recomputed {want!r}")


def _spec_order(svc: ServiceState) -> int:
    return svc.index


class World:
    """Mutable state of one Manager. Policies mutate it only through the methods below.

    Besides the states, the World keeps indexes that spare policies a scan of every
    service or request per event: services by status, with requests in flight, with
    waiting requests, kept loaded, evicted and still out; waiting requests by cause and
    by (device, class); a deadline heap. Only the mutators below change what the indexes
    are built from (:meth:`check_indexes` recomputes them from scratch, for tests).
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
        self._actions: list[Action] = []
        self._seq = 0
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
        self._loaded_by_device = {d: ServiceSet() for d in self.devices}
        #: Status UNLOADING, per device (their memory is on its way back).
        self._unloading_by_device = {d: ServiceSet() for d in self.devices}
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
        self.queued_by_class: dict[tuple[str, ServiceClass], ServiceSet] = {}
        #: (deadline, queued_mark, request) of every request that entered the queue;
        #: entries of requests that left it (or re-entered later) are skipped lazily.
        self._deadlines: list[tuple[float, int, RequestState]] = []
        self._queue_mark = 0
        #: Per device, bumped by every change that can alter a decision there (every
        #: event about it, every action on it but an Enqueue): equal epochs, same state.
        self._epochs: dict[str, int] = dict.fromkeys(self.devices, 0)

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

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ---- actions ------------------------------------------------------------
    def record(self, action: Action) -> None:
        self._actions.append(action)
        self.version += 1
        if not isinstance(action, Enqueue):  # a new wait reason changes no decision input
            self.touch(self.services[action.service].spec.device)

    def drain(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def _explain(self, req: RequestState, text: str) -> None:
        req.explain.append(f"t={self.now:.3f} {text}")

    # ---- index upkeep ---------------------------------------------------------
    def touch(self, device: str) -> None:
        """Something on ``device`` changed (the Manager calls it for every event)."""
        self._epochs[device] += 1

    def epoch(self, device: str) -> int:
        return self._epochs[device]

    def set_status(self, svc: ServiceState, status: ServiceStatus) -> None:
        svc.status = status
        self.loaded.update(svc, status is ServiceStatus.LOADED)
        self._loaded_by_device[svc.spec.device].update(svc, status is ServiceStatus.LOADED)
        self._unloading_by_device[svc.spec.device].update(svc, status is ServiceStatus.UNLOADING)
        self.crashed.update(svc, status is ServiceStatus.CRASHED)
        self._update_evicted(svc)
        if svc.name in self.host_weights:
            self._host_changed()  # whether its parked weights alone hold the RAM

    def loaded_on(self, device: str) -> ServiceSet:
        return self._loaded_by_device[device]

    def unloading_on(self, device: str) -> ServiceSet:
        return self._unloading_by_device[device]

    def set_kept(self, svc: ServiceState, *, pinned: bool, admin_wants_loaded: bool) -> None:
        """The operator's pin and load; either one drops a client's keep_alive, so what a
        client asked before the pin does not take effect after it."""
        svc.pinned = pinned
        svc.admin_wants_loaded = admin_wants_loaded
        kept = pinned or admin_wants_loaded
        if kept:
            svc.keep_alive_s = None
        self.kept.update(svc, kept)

    def forget_eviction(self, svc: ServiceState) -> None:
        """The evicted service was restored: it no longer counts as evicted."""
        svc.last_evicted_at = None
        self._update_evicted(svc)

    def _update_evicted(self, svc: ServiceState) -> None:
        self.evicted_out.update(
            svc, svc.last_evicted_at is not None and svc.status is ServiceStatus.UNLOADED
        )

    def _count_reason(self, req: RequestState, reason: Reason | None, delta: int) -> None:
        self.wait_reasons[reason] = self.wait_reasons.get(reason, 0) + delta
        key = (self.services[req.service].spec.device, req.cls, reason)
        self.waiting_causes[key] = self.waiting_causes.get(key, 0) + delta

    @property
    def queue_mark(self) -> int:
        """The ``queued_mark`` of the request that entered the queue last."""
        return self._queue_mark

    def queued_services(self, device: str, cls: ServiceClass) -> ServiceSet:
        """Services of class ``cls`` on ``device`` with waiting requests."""
        found = self.queued_by_class.get((device, cls))
        if found is None:
            found = self.queued_by_class[(device, cls)] = ServiceSet()
        return found

    def waiting_for(self, reason: Reason) -> int:
        """How many waiting requests were last told to wait for ``reason``."""
        return self.wait_reasons.get(reason, 0)

    def add_waiting(self, req: RequestState) -> None:
        """Put a request (new or preempted) at the end of the queue."""
        self._queue_mark += 1
        req.queued_mark = self._queue_mark
        svc = self.services[req.service]
        self.touch(svc.spec.device)
        self.waiting[req.request_id] = req
        svc.queue[req.request_id] = req
        svc.waiting_count += 1
        self.queued.add(svc)
        self.queued_services(svc.spec.device, req.cls).add(svc)
        self._count_reason(req, req.wait_reason, 1)
        key = (svc.spec.device, req.cls)
        self.waiting_classes[key] = self.waiting_classes.get(key, 0) + 1
        heapq.heappush(self._deadlines, (req.deadline_at, req.queued_mark, req))

    def _remove_waiting(self, req: RequestState) -> bool:
        if self.waiting.pop(req.request_id, None) is None:
            return False
        svc = self.services[req.service]
        del svc.queue[req.request_id]
        svc.waiting_count -= 1
        if not svc.queue:
            self.queued.discard(svc)
            self.queued_services(svc.spec.device, req.cls).discard(svc)
        self._count_reason(req, req.wait_reason, -1)
        self.waiting_classes[(svc.spec.device, req.cls)] -= 1
        return True

    def _queued_now(self, entry: tuple[float, int, RequestState]) -> bool:
        _, mark, req = entry
        return req.queued_mark == mark and self.waiting.get(req.request_id) is req

    def expired_requests(self) -> list[RequestState]:
        """Waiting requests whose deadline is now or past, in queue order."""
        heap = self._deadlines
        out: list[RequestState] = []
        while heap and heap[0][0] <= self.now:
            entry = heapq.heappop(heap)
            if self._queued_now(entry):
                out.append(entry[2])
        out.sort(key=lambda r: r.queued_mark)
        return out

    def next_deadline(self, now: float) -> float | None:
        """The earliest deadline after ``now`` of a waiting request."""
        heap = self._deadlines
        while heap and not self._queued_now(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return None
        if heap[0][0] > now:
            return heap[0][0]
        # A request re-queued after the deadline check is already past its deadline.
        future = [e[0] for e in heap if e[0] > now and self._queued_now(e)]
        return min(future) if future else None

    def check_indexes(self) -> None:
        """Recompute every index from the states; raise if one differs (for tests)."""
        svcs = list(self.services.values())
        self._check_service_sets(svcs)
        self._check_waiting_indexes(svcs)
        self._check_queue_order()
        self._check_pauses(svcs)
        if self.host_used > self.spec.host_budget_bytes:
            raise InvariantError(f"host budget: {self.host_used} > {self.spec.host_budget_bytes}")
        self.ledger.check_totals()

    def _check_service_sets(self, svcs: list[ServiceState]) -> None:
        """The service sets (loaded, unloading, crashed, busy, queued, kept, evicted)."""
        _expect_index("loaded", self.loaded.names(), {s.name for s in svcs if s.is_up})
        for dev in self.devices:
            _expect_index(
                f"loaded on {dev}",
                self.loaded_on(dev).names(),
                {s.name for s in svcs if s.is_up and s.spec.device == dev},
            )
            _expect_index(
                f"unloading on {dev}",
                self.unloading_on(dev).names(),
                {
                    s.name
                    for s in svcs
                    if s.status is ServiceStatus.UNLOADING and s.spec.device == dev
                },
            )
        _expect_index(
            "crashed",
            self.crashed.names(),
            {s.name for s in svcs if s.status is ServiceStatus.CRASHED},
        )
        _expect_index(
            "resizing services are loaded or unloading",
            {s.name for s in svcs if s.resizing} - self.loaded.names(),
            {s.name for s in svcs if s.resizing and s.status is ServiceStatus.UNLOADING},
        )
        _expect_index("busy", self.busy.names(), {s.name for s in svcs if s.inflight})
        _expect_index("busy services are loaded", self.busy.names() - self.loaded.names(), set())
        _expect_index("queued", self.queued.names(), {s.name for s in svcs if s.waiting_count})
        _expect_index(
            "kept", self.kept.names(), {s.name for s in svcs if s.pinned or s.admin_wants_loaded}
        )
        _expect_index(
            "evicted_out",
            self.evicted_out.names(),
            {
                s.name
                for s in svcs
                if s.last_evicted_at is not None and s.status is ServiceStatus.UNLOADED
            },
        )

    def _check_waiting_indexes(self, svcs: list[ServiceState]) -> None:
        """Each service's queue, and the waiting counts by reason, class and cause."""
        for s in svcs:
            queue = [r for r in self.waiting.values() if r.service == s.name]
            _expect_index(f"{s.name}.queue", list(s.queue.values()), queue)
            _expect_index(f"{s.name}.waiting_count", s.waiting_count, len(queue))
        reasons: dict[Reason | None, int] = {}
        classes: dict[tuple[str, ServiceClass], int] = {}
        causes: dict[tuple[str, ServiceClass, Reason | None], int] = {}
        by_class: dict[tuple[str, ServiceClass], set[str]] = {}
        for r in self.waiting.values():
            dev = self.services[r.service].spec.device
            reasons[r.wait_reason] = reasons.get(r.wait_reason, 0) + 1
            classes[(dev, r.cls)] = classes.get((dev, r.cls), 0) + 1
            causes[(dev, r.cls, r.wait_reason)] = causes.get((dev, r.cls, r.wait_reason), 0) + 1
            by_class.setdefault((dev, r.cls), set()).add(r.service)
        _expect_index("wait_reasons", {k: v for k, v in self.wait_reasons.items() if v}, reasons)
        _expect_index(
            "waiting_classes", {k: v for k, v in self.waiting_classes.items() if v}, classes
        )
        _expect_index("waiting_causes", {k: v for k, v in self.waiting_causes.items() if v}, causes)
        _expect_index(
            "queued_by_class",
            {k: v.names() for k, v in self.queued_by_class.items() if len(v)},
            by_class,
        )

    def _check_queue_order(self) -> None:
        """Waiting requests in the order they entered the queue, each with a deadline."""
        marks = [r.queued_mark for r in self.waiting.values()]
        _expect_index("queue order", marks, sorted(marks))
        live = {e[2].request_id for e in self._deadlines if self._queued_now(e)}
        _expect_index("deadlines", live, set(self.waiting))

    def _check_pauses(self, svcs: list[ServiceState]) -> None:
        """Paused KV state and host copies: what each service and the host hold for them."""
        paused = [r for r in self.waiting.values() if r.paused]
        _expect_index("host_kv", self.host_kv, sum(r.parked_kv for r in paused if r.parked_in_ram))
        _expect_index(
            "host_pending",
            self.host_pending,
            sum(r.pause_reserved for r in self.inflight.values()),
        )
        _expect_index(
            "pausing requests run",
            {r.request_id for r in self.waiting.values() if r.pausing is not None},
            set(),
        )
        for svc in svcs:
            mine = [r for r in paused if r.service == svc.name and not r.parked]
            _expect_index(f"{svc.name}.paused_kv", svc.paused_kv, sum(r.kv_bytes for r in mine))
            held = sum(r.kv_bytes for r in svc.inflight.values()) + svc.paused_kv
            _expect_index(f"{svc.name}.kv_in_use", svc.kv_in_use, held)
            lease = svc.kv_lease
            _expect_index(
                f"{svc.name}.kv_pool", svc.kv_pool, lease.nbytes if lease is not None else 0
            )
            _expect_index(
                f"{svc.name}.host copy",
                svc.name in self.host_weights,
                svc.tier is not Tier.COLD,
            )

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

    def observe_load_seconds(self, svc: ServiceState, seconds: float) -> None:
        """A load from ``svc.loading_from`` took ``seconds`` (LoadFinished)."""
        before = svc.load_s.get(svc.loading_from)
        svc.load_s[svc.loading_from] = seconds if before is None else 0.7 * before + 0.3 * seconds

    # ---- host tiers -------------------------------------------------------------
    @property
    def host_used(self) -> int:
        return sum(self.host_weights.values()) + self.host_kv + self.host_pending

    def host_free(self) -> int:
        return self.spec.host_budget_bytes - self.host_used

    def _host_changed(self) -> None:
        """The park budget's use changed: on the host device it is that device's memory
        (weights of a service still holding its device memory are the same pages, not
        counted twice)."""
        if self.park_device is None:
            return
        self.ledger.set_parked(self.park_device, self.parked_on_host())
        self.touch(self.park_device)

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
        if self._host_weight_bytes(svc) > self.spec.host_budget_bytes - held_kv:
            return Tier.COLD
        return Tier.SLEEPING if caps.sleep else Tier.PARKED

    def _host_weight_bytes(self, svc: ServiceState) -> int:
        leased = sum(le.nbytes for le in svc.resident_leases if le.category is Category.WEIGHTS)
        return leased or svc.spec.profile.weights

    def _make_host_room(self, nbytes: int, keep: ServiceState | None = None) -> bool:
        """Drop the oldest parked or sleeping weights (each an Unload to ``cold``) until
        ``nbytes`` fit the host budget; False if they cannot."""
        for name in list(self.host_weights):
            if self.host_free() >= nbytes:
                break
            other = self.services[name]
            if other is keep:
                continue
            self.drop_host_copy(other, reason=Reason.HOST_BUDGET)
        return self.host_free() >= nbytes

    def drop_host_copy(self, svc: ServiceState, *, reason: Reason) -> None:
        """Release the host RAM ``svc``'s parked or sleeping weights hold (an Unload to
        ``cold`` of a service that is not loaded)."""
        if self.host_weights.pop(svc.name, None) is None:
            return
        self._host_changed()
        tier, svc.tier = svc.tier, Tier.COLD
        if svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            self.record(
                Unload(
                    service=svc.name,
                    reason=reason,
                    tier=Tier.COLD,
                    detail=f"drops its {tier.value} weights from host RAM",
                )
            )

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
        """Grant memory and start the request (resume it, when it is paused). False (and
        no action) if it does not fit."""
        svc = self.services[req.service]
        if not svc.is_up:
            raise InvariantError(f"dispatch to {svc.name} while {svc.status.value}")
        if req.request_id not in self.waiting:
            raise InvariantError(f"dispatch of {req.request_id} which is not waiting")
        if req.paused:
            return self._resume(req, svc, reason=reason, active_bytes=active_bytes, detail=detail)
        kv = req.estimate.kv_bytes
        if kv > svc.kv_usable - svc.kv_in_use or kv > svc.kv_slot:
            return False
        need = self.projected_active(req) if active_bytes is None else active_bytes
        lease = self.ledger.reserve(
            svc.spec.device, svc.name, Category.ACTIVE, need, enforce=enforce
        )
        if lease is None:
            return False
        self._absorb_cache(svc, need)
        self._remove_waiting(req)
        req.attempt += 1
        req.active_lease = lease
        req.kv_bytes = kv
        req.dispatched_at = self.now
        req.running_since = self.now
        req.wait_reason = None
        svc.kv_in_use += kv
        svc.peak_active_bytes = max(svc.peak_active_bytes, need)
        svc.inflight[req.request_id] = req
        self.busy.add(svc)
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

    def _resume(
        self,
        req: RequestState,
        svc: ServiceState,
        *,
        reason: Reason,
        active_bytes: int | None,
        detail: str,
    ) -> bool:
        """Dispatch of a paused request: its KV comes back into the pool (when parked),
        it gets an activation lease again, and it continues in the same attempt."""
        restore = req.parked_kv
        if restore > svc.kv_usable - svc.kv_in_use:
            return False
        need = self.projected_active(req) if active_bytes is None else active_bytes
        lease = self.ledger.reserve(svc.spec.device, svc.name, Category.ACTIVE, need)
        if lease is None:
            return False
        self._absorb_cache(svc, need)
        self._remove_waiting(req)
        if req.parked:
            if req.parked_in_ram:
                self.host_kv -= restore
                self._host_changed()
            svc.kv_in_use += restore
            req.kv_bytes = restore
        else:
            svc.paused_kv -= req.kv_bytes
        req.parked_kv = 0
        req.parked = req.parked_in_ram = False
        req.paused = False
        req.active_lease = lease
        req.running_since = self.now
        req.wait_reason = None
        svc.inflight[req.request_id] = req
        self.busy.add(svc)
        svc.last_used = self.now
        self.inflight[req.request_id] = req
        self._explain(req, f"resume ({reason.value}) lease={need + req.kv_bytes}B {detail}")
        self.record(
            Resume(
                request_id=req.request_id,
                service=svc.name,
                attempt=req.attempt,
                lease_bytes=need + req.kv_bytes,
                reason=reason,
                detail=detail,
            )
        )
        return True

    def pause(
        self,
        req: RequestState,
        *,
        reason: Reason,
        park: bool,
        detail: str = "",
        for_realtime: bool = False,
    ) -> bool:
        """Ask the backend to pause a running request between tokens. ``park``: its KV
        state is to leave the pool (so the service may unload); otherwise it keeps its
        place in the pool. False (and no action) when its backend does not declare it,
        the request cannot pause (it does not stream, or its backend refused before), a
        pause of it is already under way, or the host budget cannot hold the parked state.

        Nothing is released yet: the request runs, holding every byte it holds, until
        the backend confirms (:meth:`pause_done`, on ``PauseFinished``) or refuses
        (:meth:`pause_refused`). Its service cannot unload meanwhile."""
        svc = self.services[req.service]
        caps = svc.spec.capabilities
        if req.request_id not in self.inflight:
            raise InvariantError(f"pause of {req.request_id} which is not running")
        if req.pausing is not None:
            return False
        if not req.pausable or not caps.pause or (park and not caps.park):
            return False
        in_ram = park and self._parks_in_ram(svc)
        if in_ram and not self._make_host_room(req.kv_bytes):
            return False
        if in_ram:  # room kept for its state until the backend answers
            req.pause_reserved = req.kv_bytes
            self.host_pending += req.kv_bytes
        req.pausing = park
        req.pausing_for_realtime = for_realtime
        self._explain(req, f"pausing ({reason.value}{', park' if park else ''}) {detail}")
        self.record(
            Pause(
                request_id=req.request_id,
                service=svc.name,
                attempt=req.attempt,
                park=park,
                reason=reason,
                detail=detail,
            )
        )
        return True

    def pause_done(self, req: RequestState) -> None:
        """The backend paused ``req``: it gives back its activation lease and waits again,
        at its place, for a Resume; a parked one's KV state leaves the pool (charged to
        host RAM, or to nothing where the backend parks on disk)."""
        park = bool(req.pausing)
        svc = self.services[req.service]
        req.pausing = None
        self._unreserve_pause(req)
        self._release_active(req, svc)
        if park:
            svc.kv_in_use -= req.kv_bytes
            if self._parks_in_ram(svc):
                self.host_kv += req.kv_bytes
                req.parked_in_ram = True
            req.parked_kv, req.kv_bytes = req.kv_bytes, 0
            self._host_changed()
        else:
            svc.paused_kv += req.kv_bytes
        svc.inflight.pop(req.request_id, None)
        if not svc.inflight:
            self.busy.discard(svc)
        self.inflight.pop(req.request_id, None)
        req.paused = True
        req.parked = park
        if req.pausing_for_realtime:
            req.yields += 1
        else:
            req.pauses += 1
        req.running_since = None
        req.wait_reason = None
        # A paused stream has a client waiting on it: its wait is bounded afresh.
        req.deadline_at = self.now + svc.spec.deadline_s
        self.add_waiting(req)
        self._explain(req, f"paused{' (parked)' if park else ''}")

    def pause_refused(self, req: RequestState, *, error: str) -> None:
        """The backend could not pause ``req``: it runs on with what it holds and is not
        asked again (it counts as a request that cannot pause from now on)."""
        req.pausing = None
        req.pausable = False
        self._unreserve_pause(req)
        self.touch(self.services[req.service].spec.device)
        self._explain(req, f"pause refused: {error}".rstrip(": "))

    def _unreserve_pause(self, req: RequestState) -> None:
        """Give back the host room kept for ``req``'s pause (answered, or it ended)."""
        if req.pause_reserved:
            self.host_pending -= req.pause_reserved
            req.pause_reserved = 0

    def _parks_in_ram(self, svc: ServiceState) -> bool:
        """Whether ``svc``'s backend parks KV state in host RAM (else on disk: no charge)."""
        return not svc.spec.capabilities.park_on_disk

    def _release_paused(self, req: RequestState) -> None:
        """A paused request ends (finished meanwhile, cancelled, failed): its KV state
        is given back, wherever it is."""
        svc = self.services[req.service]
        self._remove_waiting(req)
        if req.parked:
            if req.parked_in_ram:
                self.host_kv -= req.parked_kv
                self._host_changed()
            req.parked_kv = 0
            req.parked = req.parked_in_ram = False
        else:
            svc.paused_kv -= req.kv_bytes
            svc.kv_in_use -= req.kv_bytes
        req.kv_bytes = 0
        req.paused = False

    def end_paused(self, req: RequestState, *, ok: bool, reason: Reason, detail: str = "") -> None:
        """A paused request ended: it finished just as it was paused (``ok``), or it is
        failed (cancelled, its deadline, its backend died)."""
        self._release_paused(req)
        self.finished_requests.append(req)
        if ok:
            self._explain(req, "finished (while pausing)")
            return
        self._explain(req, f"failed while paused ({reason.value}) {detail}".rstrip())
        self.record(
            Fail(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )

    def reroute(self, req: RequestState, to: ServiceState, *, detail: str) -> None:
        """Move a waiting request that never ran to another replica of its service (it
        keeps its deadline; its estimate is the new replica's)."""
        here = self.services[req.service]
        if (
            req.dispatched_at is not None
            or req.paused
            or not to.spec.group
            or to.spec.group != here.spec.group
        ):
            raise InvariantError(f"request {req.request_id} cannot move to {to.name}")
        self._remove_waiting(req)
        req.service = to.name
        req.estimate = self.estimate(to.name, req.demand)
        self.add_waiting(req)
        self._explain(req, f"moved to {to.name}: {detail}")

    def enqueue(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        """Mark the request waiting; an action is recorded only when the cause changes."""
        if req.wait_reason is reason:
            return
        if req.request_id in self.waiting:
            self._count_reason(req, req.wait_reason, -1)
            self._count_reason(req, reason, 1)
        req.wait_reason = reason
        self._explain(req, f"wait ({reason.value}) {detail}".rstrip())
        self.record(
            Enqueue(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )

    def reject(
        self, req: RequestState, *, reason: Reason, retry_after_s: float, detail: str = ""
    ) -> None:
        if req.paused and req.request_id in self.waiting:
            # Part of its answer went out: it ends with an error, not a refusal.
            self.end_paused(req, ok=False, reason=reason, detail=detail)
            return
        if not self._remove_waiting(req):
            raise InvariantError(f"reject of {req.request_id} which is not waiting")
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

    def mark_caching(self, svc: ServiceState) -> None:
        """``svc``'s backend was measured keeping freed memory (every replica alike):
        from now on what its requests held stays charged to it when they end."""
        self.caching_backends.add(svc.spec.addressed_as)

    def _absorb_cache(self, svc: ServiceState, need: int) -> None:
        """A request of a caching allocator runs first in the memory its cache holds:
        its lease takes that much out of the service's RESERVED, so the cache is not
        counted twice (once as cache, once as the lease) until the next sample."""
        if not need or svc.spec.addressed_as not in self.caching_backends:
            return
        dev = svc.spec.device
        cached = self.ledger.amount(dev, svc.name, Category.RESERVED)
        if cached:
            self.ledger.set_reserved(dev, svc.name, cached - min(cached, need))

    def _release_active(self, req: RequestState, svc: ServiceState) -> None:
        """Give back the activation lease of ``req``. A caching allocator keeps those
        bytes: they move to the service's RESERVED (what the next sample would measure
        above its leases), so no other work is admitted into memory still held."""
        lease = req.active_lease
        if lease is None:
            return
        self.ledger.release(lease)
        req.active_lease = None
        if lease.nbytes and svc.holds_memory and svc.spec.addressed_as in self.caching_backends:
            dev = svc.spec.device
            kept = self.ledger.amount(dev, svc.name, Category.RESERVED) + lease.nbytes
            self.ledger.set_reserved(dev, svc.name, kept)

    def _release_request(self, req: RequestState) -> None:
        svc = self.services[req.service]
        req.pausing = None
        self._unreserve_pause(req)
        self._release_active(req, svc)
        svc.kv_in_use -= req.kv_bytes
        req.kv_bytes = 0
        if svc.kv_in_use < 0:
            raise InvariantError(f"{svc.name}: kv_in_use went negative")
        svc.inflight.pop(req.request_id, None)
        if not svc.inflight:
            self.busy.discard(svc)
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
        # Back at the end of the queue; policies order it by its ``seq``.
        req.wait_reason = None
        self.add_waiting(req)
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
        if svc.spec.capabilities.resize is ResizeSupport.NONE:
            pool = svc.spec.profile.kv_ceiling  # what the backend is configured to hold
        if svc.tier is Tier.SLEEPING and svc.slept_pool is not None:
            pool = svc.slept_pool  # a sleeping server wakes with the sizes it started with
        weights, runtime, pool = self.projected_resident(svc, pool)
        owner = self.weights_holder(svc)
        if owner is not None:
            weights = 0  # the copy another service loaded is shared, and charged to it
        svc.weights_shared_by = owner.name if owner is not None else None
        total = weights + runtime + pool
        device = svc.spec.device
        # What was measured of it while down (a sleeping process) is part of this load;
        # so are its parked weights (they move back onto the device).
        leftover = self.ledger.amount(device, svc.name, Category.LEFTOVER)
        parked_here = self.host_weights.get(svc.name, 0) if device == self.park_device else 0
        if enforce and not self.ledger.fits(device, total - leftover - parked_here):
            return False
        self.ledger.set_leftover(device, svc.name, 0)
        leases = [
            self.ledger.reserve(device, svc.name, Category.WEIGHTS, weights, enforce=False),
            self.ledger.reserve(device, svc.name, Category.RUNTIME, runtime, enforce=False),
        ]
        svc.resident_leases = [le for le in leases if le is not None]
        self._hold_kv(svc, self.ledger.reserve(device, svc.name, Category.KV, pool, enforce=False))
        self.set_status(svc, ServiceStatus.LOADING)
        from_tier = svc.tier
        svc.loading_from = from_tier
        svc.tier = Tier.COLD
        if self.host_weights.pop(svc.name, None) is not None:  # back onto the device
            self._host_changed()
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
                from_tier=from_tier,
                detail=detail,
            )
        )
        return True

    def unload(
        self, svc: ServiceState, *, reason: Reason, tier: Tier = Tier.COLD, detail: str = ""
    ) -> None:
        """Unload ``svc``; ``tier`` (see :meth:`park_tier`): where its weights go. A
        parked or sleeping copy is charged to the host budget, dropping the oldest
        others if needed (it is cold if the budget cannot hold it)."""
        if svc.status is not ServiceStatus.LOADED:
            raise InvariantError(f"unload of {svc.name} while {svc.status.value}")
        if svc.inflight or svc.paused_kv:
            raise InvariantError(f"unload of {svc.name} with requests in flight")
        if tier is not Tier.COLD:
            caps = svc.spec.capabilities
            declared = caps.sleep if tier is Tier.SLEEPING else caps.host_cache
            nbytes = self._host_weight_bytes(svc)
            if not declared or not self._make_host_room(nbytes, keep=svc):
                tier = Tier.COLD
            else:
                self.host_weights[svc.name] = nbytes
                self._host_changed()
        svc.tier = tier
        svc.slept_pool = svc.kv_pool if tier is Tier.SLEEPING else None
        if reason in (Reason.ADMIN, Reason.TTL_EXPIRED):
            # The operator asked it out, or it sat idle past its TTL: an earlier
            # eviction no longer makes it a candidate for a prewarm, which would bring
            # it straight back (a TTL unload followed by a reload in the same second).
            svc.last_evicted_at = None
        elif reason is not Reason.RESIZE_AT_NEXT_LOAD:
            svc.evictions += 1
            svc.last_evicted_at = self.now
        self.set_status(svc, ServiceStatus.UNLOADING)
        self.record(Unload(service=svc.name, reason=reason, tier=tier, detail=detail))

    def resizable(self, svc: ServiceState) -> bool:
        """Whether the service's KV pool can change now: it is loaded, its backend
        declares a live resize, and no earlier resize awaits its answer."""
        return svc.is_up and svc.resize_support is ResizeSupport.LIVE and svc.resize_target is None

    def resize(
        self,
        svc: ServiceState,
        new_pool: int,
        *,
        reason: Reason,
        enforce: bool = True,
        detail: str = "",
    ) -> bool:
        """Ask the backend for a new KV pool size, never below what is in use.

        False (and no action) when the backend cannot resize now (see :meth:`resizable`)
        or a growth does not fit. Until the backend answers (``ResizeFinished``) the
        ledger holds the larger of the old and new pools and requests are admitted only
        into the smaller: a growth is reserved now, a shrink frees memory once done.
        """
        if not self.resizable(svc):
            return False
        new_pool = max(new_pool, svc.kv_in_use)
        old = svc.kv_pool
        if new_pool == old:
            return False
        device = svc.spec.device
        if new_pool > old:
            if enforce and not self.ledger.fits(device, new_pool - old):
                return False
            self._set_kv_lease(svc, new_pool)
        svc.resize_from = old
        svc.resize_target = new_pool
        self.record(Resize(service=svc.name, kv_pool_bytes=new_pool, reason=reason, detail=detail))
        return True

    def resize_done(self, svc: ServiceState, *, ok: bool) -> None:
        """The backend answered the pending resize: the pool becomes the new size (ok)
        or stays the old one; the ledger then holds exactly that."""
        if svc.resize_target is None or svc.resize_from is None:
            return
        final = svc.resize_target if ok else svc.resize_from
        svc.resize_target = None
        svc.resize_from = None
        if not ok:
            svc.resize_failures += 1
            svc.resize_refused = True
        if final != svc.kv_pool and svc.holds_memory:
            self._set_kv_lease(svc, max(final, svc.kv_in_use))
        self.touch(svc.spec.device)

    def _set_kv_lease(self, svc: ServiceState, nbytes: int) -> None:
        if svc.kv_lease is not None:
            self.ledger.release(svc.kv_lease)
        self._hold_kv(
            svc, self.ledger.reserve(svc.spec.device, svc.name, Category.KV, nbytes, enforce=False)
        )

    @staticmethod
    def _hold_kv(svc: ServiceState, lease: Lease | None) -> None:
        """``svc``'s KV pool is now ``lease`` (None: none)."""
        svc.kv_lease = lease
        svc.kv_pool = lease.nbytes if lease is not None else 0

    # ---- what a policy learns and notes ------------------------------------------
    def mark_announced(self, req: RequestState) -> None:
        """The policy has considered ``req``: its queue's bound no longer refuses it."""
        req.announced = True

    def request_admin_unload(self, name: str) -> None:
        """The operator asked to unload ``name``: the policy does it once it is idle."""
        self.admin_unload.add(name)

    def clear_admin_unload(self, name: str) -> None:
        """The operator's unload is done, or no longer wanted (a later pin or load)."""
        self.admin_unload.discard(name)

    def observe_failure(self, svc: ServiceState, estimated_active: int, lease_bytes: int) -> None:
        """A request of ``svc`` was in flight when it crashed: raise its calibration."""
        svc.calibration.observe_failure(estimated_active, lease_bytes)

    def observe_excess(
        self, svc: ServiceState, estimated_active: int, measured_active: int
    ) -> None:
        """``svc``'s running requests were measured above their leases."""
        svc.calibration.observe_excess(estimated_active, measured_active)

    def see_crashes(self, svc: ServiceState) -> bool:
        """Note ``svc``'s crash count as seen: whether it changed since last seen."""
        return self.learned.see_crashes(svc.name, svc.crashes)

    def charge(self, svc: ServiceState, nbytes: int) -> None:
        """``svc`` was measured ``nbytes`` above its leases: charge them to it."""
        self.learned.charge(svc.name, nbytes)

    def clear_charge(self, svc: ServiceState) -> bool:
        """``svc`` is measured within its leases again: whether it was charged."""
        return self.learned.clear_charge(svc.name)

    def raise_high_water(self, svc: ServiceState, measured: int) -> int:
        """``svc``'s activation memory was measured at ``measured``: its highest
        measurement before (0: none)."""
        return self.learned.raise_high_water(svc.name, measured)

    def forget_activation(self, svc: ServiceState) -> None:
        """``svc`` holds no memory: forget its high water and its charge."""
        self.learned.forget_activation(svc.name)

    def note_realtime_activation(self, svc: ServiceState, active: int) -> None:
        """A request of realtime ``svc`` is about to run with ``active`` bytes projected."""
        self.learned.raise_realtime_peak(svc.name, active)

    def add_explanation(self, req: RequestState, text: str) -> None:
        """A line of ``req``'s explanation that no action carries (what a decision used)."""
        self._explain(req, text)

    def note_crash(self, svc: ServiceState) -> None:
        """``svc``'s backend died (before its requests are failed): keep what each
        running request held, for the policy to learn from (``crash_held``)."""
        svc.crash_held = [
            (r.estimate.active_bytes, r.active_lease.nbytes if r.active_lease else 0)
            for r in svc.inflight.values()
        ]

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

    def _hand_over_weights(self, svc: ServiceState) -> None:
        """``svc`` lets go of the weights copy others share: the first of them that still
        holds memory is charged it from now on (the copy stays loaded for it)."""
        sharers = [self.services[n] for n in self.weights_sharers(svc)]
        if not sharers:
            return
        weights = [le for le in svc.resident_leases if le.category is Category.WEIGHTS]
        nbytes = sum(le.nbytes for le in weights)
        heir = sharers[0]
        lease = self.ledger.reserve(
            heir.spec.device, heir.name, Category.WEIGHTS, nbytes, enforce=False
        )
        if lease is not None:
            heir.resident_leases.append(lease)
        heir.weights_shared_by = None
        for other in sharers[1:]:
            other.weights_shared_by = heir.name

    def release_service(self, svc: ServiceState) -> None:
        """Drop every byte a service holds (after Unloaded, LoadFailed or a crash)."""
        self._hand_over_weights(svc)
        svc.weights_shared_by = None
        for le in svc.resident_leases:
            self.ledger.release(le)
        svc.resident_leases = []
        if svc.kv_lease is not None:
            self.ledger.release(svc.kv_lease)
            self._hold_kv(svc, None)
        self.ledger.drop_service(svc.spec.device, svc.name)
        svc.resize_target = None
        svc.resize_from = None
        svc.resize_refused = False  # the next load may resize live again
        svc.load_excess = 0
        svc.measured_bytes = None
        svc.over_limit = False
