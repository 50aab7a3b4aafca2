"""The data of the Manager's world: each service's and each request's state.

A request's life is one :class:`RequestPhase` (not a handful of booleans), moved along
:data:`REQUEST_MOVES`; a service's status moves along :data:`STATUS_MOVES` (both in the
spirit of h11's state machine: a move the table does not list is a bug, raised at once).
Only :class:`~accelmux.core.world.ops.WorldOps` writes these records; parts and the shell
read them through :class:`~accelmux.core.world.view.WorldView`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from accelmux.core.events import Demand
from accelmux.core.ledger import Lease
from accelmux.core.profiles import RequestEstimate, ServiceCalibration
from accelmux.core.specs import ServiceSpec
from accelmux.core.types import (
    Reason,
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

#: The statuses a service may move to from each status: a load starts from unloaded or
#: crashed, ends loaded or crashed; a loaded service unloads (or is found unloaded idle);
#: a backend may crash in any status.
STATUS_MOVES: dict[ServiceStatus, frozenset[ServiceStatus]] = {
    ServiceStatus.UNLOADED: frozenset({ServiceStatus.LOADING, ServiceStatus.CRASHED}),
    ServiceStatus.LOADING: frozenset({ServiceStatus.LOADED, ServiceStatus.CRASHED}),
    ServiceStatus.LOADED: frozenset(
        {ServiceStatus.UNLOADING, ServiceStatus.UNLOADED, ServiceStatus.CRASHED}
    ),
    ServiceStatus.UNLOADING: frozenset({ServiceStatus.UNLOADED, ServiceStatus.CRASHED}),
    ServiceStatus.CRASHED: frozenset({ServiceStatus.LOADING, ServiceStatus.CRASHED}),
}


class RequestPhase(StrEnum):
    """Where a request is in its life."""

    #: In its queue, never run or put back (preempted, moved to another replica).
    WAITING = "waiting"
    #: Dispatched (or resumed): it holds an activation lease and its KV.
    RUNNING = "running"
    #: Running, with a Pause the backend has not answered yet.
    PAUSING = "pausing"
    #: Paused between tokens, its KV state kept in its service's pool; in its queue.
    PAUSED = "paused"
    #: Paused between tokens, its KV state parked off the device; in its queue.
    PARKED = "parked"
    #: Finished, failed or rejected.
    ENDED = "ended"


#: The phases a request may move to from each phase.
REQUEST_MOVES: dict[RequestPhase, frozenset[RequestPhase]] = {
    RequestPhase.WAITING: frozenset(
        {RequestPhase.RUNNING, RequestPhase.WAITING, RequestPhase.ENDED}
    ),
    RequestPhase.RUNNING: frozenset(
        {RequestPhase.PAUSING, RequestPhase.WAITING, RequestPhase.ENDED}
    ),
    RequestPhase.PAUSING: frozenset(
        {
            RequestPhase.PAUSED,
            RequestPhase.PARKED,
            RequestPhase.RUNNING,
            RequestPhase.WAITING,
            RequestPhase.ENDED,
        }
    ),
    RequestPhase.PAUSED: frozenset({RequestPhase.RUNNING, RequestPhase.ENDED}),
    RequestPhase.PARKED: frozenset({RequestPhase.RUNNING, RequestPhase.ENDED}),
    RequestPhase.ENDED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class CrashOom:
    """A request ran out of memory and its backend died: what the allocation asked
    (``asked``), what the device held besides it (``used_besides``), and what the
    request was granted (``held``: its estimated activation and lease; None when the
    shell did not name it or it was not running)."""

    asked: int | None
    used_besides: int | None
    held: tuple[int, int] | None


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
    #: What the shell measured of the last crash when a request ran out of memory (None:
    #: not an out-of-memory crash, or nothing measured): a policy attributes it first.
    crash_oom: CrashOom | None = None
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
    #: Requests of this (steady) service held back while realtime work ran on its shared
    #: compute, and how many of them ran out their deadline so (a frame skipped).
    held_for_realtime: int = 0
    skipped_for_realtime: int = 0
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
    #: The batch fraction its latest request ran with (1.0: full; see core/shrink.py).
    batch_fraction: float = 1.0

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
    #: It was held back for realtime work on its shared compute (counted once).
    held_for_realtime: bool = False
    #: It waited past its ageing point (``facts.ages_at``): room for it may evict idle
    #: interactive models, and a restore does not stop it (``WorldOps.age``).
    aged: bool = False
    #: When the request last entered the queue (a World counter): ``World.waiting``
    #: is in this order.
    queued_mark: int = 0
    #: Where it is in its life (:class:`RequestPhase`); changed only through
    #: :meth:`move_to`, along :data:`REQUEST_MOVES`.
    phase: RequestPhase = field(default=RequestPhase.WAITING)
    #: Its answer is streamed: it may be paused (see ``RequestArrived.pausable``).
    pausable: bool = False
    #: KV bytes of its state parked off the device (PARKED), and whether that state is
    #: in host RAM (charged to the host budget) rather than on disk.
    parked_kv: int = 0
    parked_in_ram: bool = False
    #: PAUSING: whether the pause asked parks its KV state (else it keeps its place in
    #: the pool), and whether it gives the compute to realtime work.
    pause_parks: bool = False
    pausing_for_realtime: bool = False
    #: Host RAM kept for the KV state a pending parked pause will save (0: none).
    pause_reserved: int = 0
    pauses: int = 0
    #: Pauses that gave the compute to realtime work (not counted in ``pauses``).
    yields: int = 0
    #: When its current run (dispatch or resume) started.
    running_since: float | None = None
    #: The batch fraction it runs with (1.0: full); ``estimate`` is of one such batch.
    batch_fraction: float = 1.0
    explain: deque[str] = field(default_factory=lambda: deque(maxlen=EXPLAIN_LINES))

    @property
    def sort_key(self) -> tuple[int, int]:
        return (int(self.cls), self.seq)

    @property
    def paused(self) -> bool:
        """Paused between tokens: it waits for a Resume, not a Dispatch (``pauses``: how
        often so far), its KV state in its service's pool or parked (:attr:`parked`)."""
        return self.phase is RequestPhase.PAUSED or self.phase is RequestPhase.PARKED

    @property
    def parked(self) -> bool:
        """Paused with its KV state off the device (``parked_kv`` may be 0)."""
        return self.phase is RequestPhase.PARKED

    @property
    def pausing(self) -> bool | None:
        """A Pause the backend has not answered yet: whether it parks (None: none asked).
        Until the answer the request runs and keeps what it holds."""
        return self.pause_parks if self.phase is RequestPhase.PAUSING else None

    def move_to(self, phase: RequestPhase) -> None:
        """Enter ``phase``; a move :data:`REQUEST_MOVES` does not allow is a bug."""
        if phase not in REQUEST_MOVES[self.phase]:
            raise InvariantError(
                f"request {self.request_id}: {self.phase.value} -> {phase.value} is no move"
            )
        self.phase = phase


def reuse_rate(svc: ServiceState, now: float, horizon_s: float) -> float:
    """Arrival rate (1/s) of a service, decayed to ``now`` (exponential, tau = horizon)."""
    if svc.rate <= 0:
        return 0.0
    return svc.rate * math.exp(-max(0.0, now - svc.rate_at) / horizon_s)
