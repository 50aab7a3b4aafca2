"""What the parts of the policy see of it and of each other: its state, and each part's
methods by the name the policy gives them (:class:`Parts`), and the scratch records they
pass around (:class:`Round`, :class:`Survey`).

Each part module types its functions' ``self`` as :class:`Parts`, so no part imports
another or the class that wires them (``policy.py``): the parts depend on this module
only, and mypy checks every call between them against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from accelmux.core.events import Demand
from accelmux.core.types import Reason, ServiceClass, Tier

from .state import RequestState, ServiceSet, ServiceState, World


@dataclass(slots=True)
class Round:
    """Per-decide scratch state."""

    blocked: dict[str, ServiceClass] = field(default_factory=dict)
    realtime_active: set[str] = field(default_factory=set)
    #: Devices with realtime work running, waiting or within its grace (realtime_yield).
    realtime_work: set[str] = field(default_factory=set)
    interactive_active: set[str] = field(default_factory=set)
    higher_waiting: dict[str, ServiceClass] = field(default_factory=dict)
    #: Devices where this round would repeat a round that changed nothing.
    quiet: set[str] = field(default_factory=set)
    #: (service, class) -> (world.version, outside its windows, why it waits): see
    #: AccelmuxPolicy._service_wait.
    waits: dict[tuple[str, ServiceClass], tuple[int, bool, tuple[Reason, str] | None]] = field(
        default_factory=dict
    )
    #: The time of day (windows): the round's time does not change.
    tod: float = 0.0
    #: Per service with windows, whether one is open (see AccelmuxPolicy._in_window).
    inside: dict[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class Survey:
    """What make_room found it could free on a device (see AccelmuxPolicy._survey)."""

    shrinks: list[tuple[ServiceState, int]] = field(default_factory=list)
    preempts: list[RequestState] = field(default_factory=list)
    victims: list[ServiceState] = field(default_factory=list)
    #: Bytes the shrinks, stops and evictions would free, beyond what is free or on its
    #: way back.
    gain: int = 0


class Preemptible(Protocol):
    """:func:`~accelmux.core.policies.accelmux.preemption.preemptible`'s signature."""

    def __call__(self, svc: ServiceState, cls: ServiceClass, steady: bool = False) -> bool: ...


class Parts(Protocol):
    """The accelmux policy (:class:`~accelmux.core.policies.accelmux.policy.AccelmuxPolicy`)
    as its parts see it.

    A part's function that needs no policy (a staticmethod in the class) is a read-only
    callable here. ``policy.py`` checks that the class is a ``Parts``."""

    name: str
    few_waiting: int
    # state (documented where AccelmuxPolicy.__init__ sets it)
    _reserves: dict[str, tuple[int, int, int]]
    _memo: dict[tuple[str, str], tuple[int, int]]
    _warm_world: World | None
    _warm: dict[str, list[ServiceState]]
    _warm_ordered: list[ServiceState]
    _facts_world: World | None
    _facts: dict[str, bool]
    _sharing_devices: tuple[World, frozenset[str]] | None
    _room_failed: dict[tuple[str, ServiceClass, bool, bool, str | None, object], tuple[int, int]]
    _sizes: dict[str, tuple[RequestState, tuple[int, int], tuple[int, int, int, int]]]
    _edges_memo: tuple[ServiceSet, int, tuple[float, ...]] | None
    _restorable_memo: dict[str, tuple[tuple[int, float], list[list[Any]]]]
    _rt_devices: set[str] | None
    _restores_memo: dict[str, tuple[tuple[int, float], bool]]
    _ttl_memo: dict[str, tuple[int, tuple[float, float]]]
    _evicted_warm_memo: tuple[ServiceSet, int, list[ServiceState]] | None
    _quiet: dict[str, tuple[int, tuple[object, ...]]]
    _caching: set[str]
    _restore_tried_at: dict[str, float]
    _yielded_to: dict[str, str]
    _yielded_realtime: set[str]

    def _cached(
        self,
        world: World,
        key: tuple[str, str],
        compute: Callable[[], int],
        stamp: int | None = None,
    ) -> int: ...

    # learning.py
    def _learn(self, world: World) -> None: ...
    def _learners(self, world: World) -> list[ServiceState]: ...
    def _relieve_pressure(self, world: World) -> None: ...

    # preemption.py
    def _may_preempt(self, world: World, req: RequestState) -> bool: ...
    def _may_stop(self, world: World, req: RequestState) -> bool: ...
    def _stop(
        self, world: World, req: RequestState, cls: ServiceClass, requester: RequestState | None
    ) -> None: ...

    @property
    def _preemptible(self) -> Preemptible: ...

    def _stoppable(self, world: World, svc: ServiceState) -> list[RequestState]: ...

    # steady.py
    def _steady_reserve(self, world: World, svc: ServiceState, need: int, limit: int) -> int: ...

    # time_sharing.py
    def _pause_for_first_token(
        self, world: World, svc: ServiceState, req: RequestState
    ) -> bool: ...
    def _yielding(self, world: World, req: RequestState) -> bool: ...

    @property
    def _sharing_key(self) -> Callable[[World, RequestState | None], object]: ...

    def _room_key(self, world: World, device: str, requester: RequestState | None) -> object: ...
    def _time_sharing_devices(self, world: World) -> frozenset[str]: ...

    @property
    def _can_pause(self) -> Callable[[World, ServiceState], bool]: ...

    def _time_shared(
        self, world: World, svc: ServiceState, cls: ServiceClass, requester: RequestState | None
    ) -> list[RequestState]: ...

    @property
    def _realtime_devices(self) -> Callable[[World], set[str]]: ...

    def _round_realtime_devices(self, world: World) -> set[str]: ...
    def _yields_compute(self, world: World, svc: ServiceState) -> bool: ...

    @property
    def _compute_is_shared(self) -> Callable[[World, str], bool]: ...

    def _yield_to_realtime(self, world: World) -> None: ...

    @property
    def _share_thresholds(self) -> Callable[[World, str], tuple[tuple[str, bool, bool], ...]]: ...

    # reserve.py
    def _realtime_reserve(self, world: World, device: str) -> int: ...
    def _yields_to_realtime(self, world: World, svc: ServiceState) -> bool: ...
    def _static_facts(self, world: World) -> dict[str, bool]: ...
    def _compute_yields_to_realtime(self, world: World, svc: ServiceState) -> bool: ...
    def _fitting_reserve(self, world: World, svc: ServiceState, need: int, limit: int) -> int: ...
    def _quickly_freeable(self, world: World, device: str, exclude: ServiceState) -> int: ...
    def _sum_quickly_freeable(self, world: World, device: str) -> int: ...
    def _freeable_for_realtime(self, world: World, svc: ServiceState) -> bool: ...
    def _typical_activation(self, world: World, svc: ServiceState) -> int: ...
    def _compute_realtime_reserve(self, world: World, device: str) -> int: ...

    def _explain_reserve(
        self,
        world: World,
        req: RequestState,
        device: str,
        reserve: int,
        was: Reason | None,
    ) -> None: ...

    # room.py
    def victim_score(self, world: World, svc: ServiceState) -> float: ...

    @property
    def _tier(self) -> Callable[[World, ServiceState], Tier]: ...

    def _unload(self, world: World, svc: ServiceState, *, reason: Reason, detail: str) -> None: ...
    def eviction_cost(self, world: World, svc: ServiceState) -> float: ...

    @property
    def unload_frees(self) -> Callable[[World, ServiceState], int]: ...

    def _pending_free(self, world: World, device: str) -> int: ...
    def _evictable(
        self,
        svc: ServiceState,
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool = False,
        once_preempted: bool = False,
        yielded: int = 0,
    ) -> bool: ...
    def _survey(
        self,
        world: World,
        device: str,
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool,
        requester: RequestState | None,
        sharing: object,
    ) -> Survey: ...
    def make_room(
        self,
        world: World,
        device: str,
        need: int,
        cls: ServiceClass,
        exclude: ServiceState | None,
        reason: Reason,
        *,
        strict: bool = False,
        requester: RequestState | None = None,
    ) -> bool: ...

    @property
    def _kept_floor(self) -> Callable[[World, ServiceState], int]: ...

    def _max_possible(self, world: World, device: str, exclude: ServiceState) -> int: ...
    def _reachable(self, world: World, device: str, need: int, svc: ServiceState) -> bool: ...

    def _room_plan(
        self,
        world: World,
        device: str,
        need: int,
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool,
        requester: RequestState | None,
        within: int,
    ) -> Survey | None: ...

    @property
    def _shrink_for_room(
        self,
    ) -> Callable[[World, str, int, list[tuple[ServiceState, int]], Reason], int]: ...

    def _stop_for_room(
        self,
        world: World,
        device: str,
        need: int,
        pending: int,
        preempts: list[RequestState],
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool,
        requester: RequestState | None,
    ) -> int | None: ...

    def _pick_victims(
        self, world: World, victims: list[ServiceState], cls: ServiceClass, short: int
    ) -> list[ServiceState]: ...

    def _evict_for_room(
        self,
        world: World,
        device: str,
        need: int,
        pending: int,
        victims: list[ServiceState],
        cls: ServiceClass,
        reason: Reason,
    ) -> None: ...

    # residency.py
    def _preload_warm(self, world: World) -> None: ...

    @property
    def _keep(self) -> Callable[[ServiceState], bool]: ...
    @property
    def _ttl_floor(self) -> Callable[[World, ServiceState], float]: ...

    def _ttl(self, world: World, svc: ServiceState) -> float: ...
    def _ttl_range(self, world: World, svc: ServiceState) -> tuple[float, float]: ...
    def _idle_past_ttl(self, world: World, svc: ServiceState) -> bool: ...
    def _memory_wanted(self, world: World, svc: ServiceState) -> bool: ...
    def _memory_spare(self, world: World, svc: ServiceState) -> bool: ...

    @property
    def _likely_reused(self) -> Callable[[World, ServiceState], bool]: ...

    def _restore_pending(self, world: World, holder: ServiceState) -> bool: ...
    def _compute_restore_pending(self, world: World, holder: ServiceState) -> bool: ...
    def _restorable(self, world: World, device: str) -> list[list[Any]]: ...
    def _warm_services(self, world: World, device: str) -> list[ServiceState]: ...
    def _know_warm(self, world: World) -> None: ...
    def _warm_in_class_order(self, world: World) -> list[ServiceState]: ...
    def _evicted_warm(self, world: World) -> list[ServiceState]: ...
    def _restore_need(self, world: World, svc: ServiceState, pool: int) -> int: ...
    def _admin_unloads(self, world: World) -> None: ...
    def _keep_pinned_loaded(self, world: World) -> None: ...
    def _expire_idle(self, world: World) -> None: ...
    def _balloon(self, world: World) -> None: ...
    def _prewarm(self, world: World) -> None: ...

    # routing.py
    def route(
        self, world: World, replicas: Sequence[ServiceState], demand: Demand
    ) -> ServiceState: ...

    @property
    def _reroute_to_free_replicas(self) -> Callable[[World], None]: ...
    @property
    def _other_replica_up(self) -> Callable[[World, ServiceState], bool]: ...

    def _placed_here(self, world: World, svc: ServiceState) -> bool: ...

    @property
    def _wanted_by_higher_class(self) -> Callable[[World, ServiceState], bool]: ...
    @property
    def _footprint(self) -> Callable[[World, ServiceState], int]: ...

    def _expected_start_s(self, world: World, svc: ServiceState, room_s: float | None) -> float: ...
    def _room_seconds(self, world: World, svc: ServiceState, demand: Demand) -> float | None: ...

    # schedule.py
    def _schedule(self, world: World) -> None: ...
    def _round_inputs(self, world: World, rnd: Round, device: str) -> tuple[object, ...]: ...

    @property
    def _in_window(self) -> Callable[[ServiceState, Round], bool]: ...

    def _unsettled(self, world: World, cls: ServiceClass, rnd: Round) -> list[RequestState]: ...

    # admission.py
    def _retry_after(self, svc: ServiceState) -> float: ...

    @property
    def _told(self) -> Callable[[RequestState, Reason], bool]: ...

    def _queue_or_reject(
        self, world: World, req: RequestState, reason: Reason, detail: str = ""
    ) -> None: ...

    @property
    def _class_must_wait(
        self,
    ) -> Callable[[str, ServiceClass, Round, bool, bool], tuple[Reason, str] | None]: ...

    def _service_wait(
        self, world: World, svc: ServiceState, cls: ServiceClass, rnd: Round
    ) -> tuple[bool, tuple[Reason, str] | None]: ...
    def _must_wait(
        self, world: World, svc: ServiceState, cls: ServiceClass, outside: bool, rnd: Round
    ) -> tuple[Reason, str] | None: ...
    def _consider(self, world: World, req: RequestState, rnd: Round) -> None: ...

    @property
    def _earlier_waits_for_growth(self) -> Callable[[ServiceState, RequestState], bool]: ...

    def _gives_way(
        self, world: World, req: RequestState, svc: ServiceState, rnd: Round
    ) -> bool: ...

    def _one_at_a_time(self, world: World, req: RequestState, svc: ServiceState) -> bool: ...

    def _admit(
        self,
        world: World,
        req: RequestState,
        svc: ServiceState,
        rnd: Round,
        outside: bool,
        blocked: ServiceClass | None,
    ) -> None: ...

    def _kv_fit(
        self, world: World, req: RequestState, svc: ServiceState
    ) -> tuple[int, int] | None: ...

    def _admission_need(
        self, world: World, req: RequestState, svc: ServiceState, active: int, grow: int
    ) -> tuple[int, int, int | None] | None: ...

    @property
    def _reusable_cache(self) -> Callable[[World, ServiceState, int], int]: ...

    def _start_admitted(
        self,
        world: World,
        req: RequestState,
        svc: ServiceState,
        rnd: Round,
        kv: int,
        grow: int,
        before: int,
        running: int,
        lease: int | None,
        own_cache: int,
    ) -> None: ...

    # loading.py
    def _loads_one_at_a_time(self, world: World, device: str) -> bool: ...
    def _load_pool(self, world: World, svc: ServiceState, wanted: int) -> int: ...
    def _kv_pool_fixed(self, world: World, req: RequestState, svc: ServiceState) -> None: ...
    def _load_for(
        self,
        world: World,
        req: RequestState,
        svc: ServiceState,
        rnd: Round,
        outside: bool,
        idle_only: bool = False,
    ) -> None: ...
    def _load_sizes(
        self, world: World, req: RequestState, svc: ServiceState
    ) -> tuple[int, int, int, int]: ...

    def _load_plan(
        self, world: World, req: RequestState, svc: ServiceState
    ) -> tuple[int, int, int, int]: ...

    # wakeup.py
    def next_wakeup(self, world: World, now: float) -> float | None: ...
    def _window_edges(self, world: World) -> tuple[float, ...]: ...
