"""A test double of the executor: it feeds the Manager the events a real shell would.

It keeps its own view of every request (waiting, running, ended) and service (down,
loading, loaded, unloading), built only from the actions it received, and checks that each
action is legal in that view: a request is dispatched only while waiting, ends at most
once, a service is loaded only while down, and so on. A violation raises AssertionError.
"""

from __future__ import annotations

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
from accelmux.core.events import (
    BackendCrashed,
    Event,
    LoadFailed,
    LoadFinished,
    PauseFinished,
    PauseRefused,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    ResizeFinished,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import MAX_PAUSES
from accelmux.core.types import Category, Reason, ResizeSupport, ServiceClass, ServiceStatus, Tier
from accelmux.core.world import ServiceState

from .world_oracle import check_indexes

DOWN, LOADING, LOADED, UNLOADING = "down", "loading", "loaded", "unloading"
_VIEW = {
    ServiceStatus.UNLOADED: DOWN,
    ServiceStatus.CRASHED: DOWN,
    ServiceStatus.LOADING: LOADING,
    ServiceStatus.LOADED: LOADED,
    ServiceStatus.UNLOADING: UNLOADING,
}
WAITING, RUNNING, PAUSED, FAILING, ENDED = "waiting", "running", "paused", "failing", "ended"


@dataclass
class FakeExecutor:
    manager: Manager
    now: float = 0.0
    services: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    lease_bytes: dict[str, int] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    #: The service each request named when it arrived (a group, for replicas).
    addressed: dict[str, str] = field(default_factory=dict)
    #: Paused requests whose state left the device (``Pause(park=True)``): their service
    #: may unload, whatever the size of that state (a request may hold no KV yet).
    parked: set[str] = field(default_factory=set)
    endings: dict[str, list[str]] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    pinned_evictions: list[Unload] = field(default_factory=list)
    #: Resizes not answered yet: service -> the pool asked for.
    resizes: dict[str, int] = field(default_factory=dict)
    #: Pauses not answered yet: request -> park. ``ack_pauses``: answer each at once
    #: (PauseFinished, or PauseRefused with ``refuse_pauses``), as the simulator does.
    pausing: dict[str, bool] = field(default_factory=dict)
    ack_pauses: bool = True
    refuse_pauses: bool = False

    def __post_init__(self) -> None:
        self.services = {name: DOWN for name in self.manager.world.services}
        self.react(self.manager.start(self.now))

    # ---- views ----------------------------------------------------------------
    def in_state(self, state: str) -> list[str]:
        return sorted(r for r, s in self.requests.items() if s == state)

    def services_in(self, state: str) -> list[str]:
        return sorted(n for n, s in self.services.items() if s == state)

    # ---- driving ----------------------------------------------------------------
    def send(self, event: Event, dt: float = 0.0) -> list[Action]:
        self.now += dt
        self._before(event)
        out = self.manager.handle(event, self.now)
        self.react(out)
        self._after(event, out)
        while self.ack_pauses and self.pausing:
            self.answer_pause(next(iter(self.pausing)))
        return out

    def answer_pause(self, request_id: str) -> list[Action]:
        """Answer the pending Pause of ``request_id`` (refused with ``refuse_pauses``)."""
        attempt = self.attempts[request_id]
        if self.refuse_pauses:
            return self.send(
                PauseRefused(request_id=request_id, attempt=attempt, error="cannot pause")
            )
        return self.send(PauseFinished(request_id=request_id, attempt=attempt))

    def _before(self, event: Event) -> None:
        match event:
            case RequestArrived():
                assert self.requests.get(event.request_id) in (None, ENDED)
                self.requests[event.request_id] = WAITING
                self.owner[event.request_id] = event.service
                self.addressed[event.request_id] = event.service
                self.attempts[event.request_id] = 0
            case PauseFinished():
                park = self.pausing.pop(event.request_id, None)
                if park is not None and self.requests.get(event.request_id) == RUNNING:
                    self.requests[event.request_id] = PAUSED
                    if park:
                        self.parked.add(event.request_id)
                    else:
                        self.parked.discard(event.request_id)
            case PauseRefused():
                self.pausing.pop(event.request_id, None)
            case RequestFinished():
                self.pausing.pop(event.request_id, None)
                if (
                    self.requests.get(event.request_id) in (RUNNING, PAUSED)
                    and self.attempts[event.request_id] == event.attempt
                ):  # a paused request may end as it was paused
                    if event.ok:
                        self._end(event.request_id, "finished")
                    else:
                        self.requests[event.request_id] = FAILING
            case LoadFinished():
                assert self.services[event.service] == LOADING
                self.services[event.service] = LOADED
            case ResizeFinished():
                assert self.resizes.pop(event.service, None) == event.kv_pool_bytes
            case LoadFailed():
                assert self.services[event.service] == LOADING
                self.services[event.service] = DOWN
            case Unloaded():
                assert self.services[event.service] == UNLOADING
                self.services[event.service] = DOWN
                self.resizes.pop(event.service, None)
            case BackendCrashed():
                self.services[event.service] = DOWN
                self.resizes.pop(event.service, None)
            case _:
                pass

    def _after(self, event: Event, out: list[Action]) -> None:
        failing = self.in_state(FAILING)
        assert not failing, f"RequestFinished(ok=False) answered without Fail: {failing}"
        if isinstance(event, BackendCrashed):
            running = [r for r in self.in_state(RUNNING) if self.owner[r] == event.service]
            assert not running, f"crash of {event.service} left {running} running"
        if isinstance(event, RequestCancelled):
            assert self.requests.get(event.request_id) in (None, ENDED)

    def _end(self, request_id: str, how: str) -> None:
        ends = self.endings.setdefault(request_id, [])
        ends.append(how)
        assert len(ends) == 1, f"{request_id} ended twice: {ends}"
        self.requests[request_id] = ENDED

    def react(self, out: list[Action]) -> None:
        world = self.manager.world
        for a in out:
            self.actions.append(a)
            assert isinstance(a.reason, Reason), a
            match a:
                case Dispatch():
                    assert self.requests.get(a.request_id) == WAITING, a
                    assert self.services[a.service] == LOADED, a
                    assert a.attempt == self.attempts[a.request_id] + 1, a
                    self.attempts[a.request_id] = a.attempt
                    self.lease_bytes[a.request_id] = a.lease_bytes
                    self.requests[a.request_id] = RUNNING
                    # the replica it runs on (a waiting request may have moved to another)
                    self.owner[a.request_id] = a.service
                case Preempt():
                    assert self.requests.get(a.request_id) == RUNNING, a
                    assert a.attempt == self.attempts[a.request_id], a
                    assert a.request_id not in self.pausing, f"preempt while pausing: {a}"
                    self.requests[a.request_id] = WAITING
                case Pause():
                    assert self.requests.get(a.request_id) == RUNNING, a
                    assert a.attempt == self.attempts[a.request_id], a
                    caps = world.services[a.service].spec.capabilities
                    assert caps.pause and (caps.park or not a.park), a
                    # It may have resumed (or ended) later in the same round.
                    req = world.waiting.get(a.request_id) or world.inflight.get(a.request_id)
                    if req is None:
                        req = next(
                            r for r in world.finished_requests if r.request_id == a.request_id
                        )
                    assert req.pausable, a
                    assert a.request_id not in self.pausing, f"second pause before the answer: {a}"
                    # It runs (and holds its memory) until the backend answers.
                    self.pausing[a.request_id] = a.park
                case Resume():
                    assert self.requests.get(a.request_id) == PAUSED, a
                    assert self.services[a.service] == LOADED, a
                    assert a.attempt == self.attempts[a.request_id], a
                    self.lease_bytes[a.request_id] = a.lease_bytes
                    self.requests[a.request_id] = RUNNING
                    self.parked.discard(a.request_id)
                case Fail():
                    assert self.requests.get(a.request_id) in (RUNNING, FAILING, PAUSED), a
                    self.pausing.pop(a.request_id, None)
                    self._end(a.request_id, f"fail:{a.reason.value}")
                case Reject():
                    assert self.requests.get(a.request_id) == WAITING, a
                    self._end(a.request_id, f"reject:{a.reason.value}")
                case Enqueue():
                    assert self.requests.get(a.request_id) in (WAITING, PAUSED), a
                case Load():
                    assert self.services[a.service] == DOWN, a
                    self.services[a.service] = LOADING
                case Unload() if self.services[a.service] == DOWN:
                    # Only a parked or sleeping copy in host RAM is dropped.
                    assert a.tier is Tier.COLD and a.reason is not Reason.TTL_EXPIRED, a
                case Unload():
                    assert self.services[a.service] == LOADED, a
                    paused = [
                        r
                        for r in self.in_state(PAUSED)
                        if self.owner[r] == a.service and r not in self.parked
                    ]
                    assert not paused, (a, paused)
                    caps = world.services[a.service].spec.capabilities
                    assert a.tier is not Tier.SLEEPING or caps.sleep, a
                    assert a.tier is not Tier.PARKED or caps.host_cache, a
                    running = [r for r in self.in_state(RUNNING) if self.owner[r] == a.service]
                    assert not running, (a, running)
                    self.services[a.service] = UNLOADING
                    svc = world.services[a.service]
                    if (
                        a.reason in (Reason.EVICTED_FOR_MEMORY, Reason.TTL_EXPIRED)
                        and (svc.pinned or svc.admin_wants_loaded)
                        and not self.yields_to_realtime(svc, a)
                    ):
                        self.pinned_evictions.append(a)
                case Resize():
                    assert self.services[a.service] == LOADED, a
                    assert a.service not in self.resizes, f"second resize before the answer: {a}"
                    self.resizes[a.service] = a.kv_pool_bytes

    def yields_to_realtime(self, svc: ServiceState, a: Unload) -> bool:
        """Whether the eviction of kept ``svc`` is the one a pinned service may suffer
        (``realtime_unpin``): pinned by its configuration (not by the operator), evicted
        for memory while a realtime request waits on its device."""
        world = self.manager.world
        return (
            svc.pinned
            and not svc.admin_wants_loaded
            and a.reason is Reason.EVICTED_FOR_MEMORY
            and world.knobs.switches.realtime_unpin
            and any(
                r.cls is ServiceClass.REALTIME
                and world.services[r.service].spec.device == svc.spec.device
                for r in world.waiting.values()
            )
        )

    # ---- convenience ------------------------------------------------------------
    def finish(self, request_id: str, *, ok: bool = True, peak: int | None = None) -> None:
        self.send(
            RequestFinished(
                request_id=request_id,
                attempt=self.attempts[request_id],
                ok=ok,
                peak_bytes=peak,
                error=None if ok else "boom",
            )
        )

    def settle(self, rounds: int = 200, step_s: float = 50.0) -> None:
        """Answer every pending load/unload and finish every request until all ended."""
        from accelmux.core.events import Tick

        for _ in range(rounds):
            for name in self.services_in(LOADING):
                self.send(LoadFinished(service=name))
            for name in self.services_in(UNLOADING):
                self.send(Unloaded(service=name))
            for name, nbytes in sorted(self.resizes.items()):
                self.send(ResizeFinished(service=name, kv_pool_bytes=nbytes))
            for rid in self.in_state(RUNNING):
                if self.requests[rid] == RUNNING:  # a crash may have ended it meanwhile
                    self.finish(rid)
            busy = self.in_state(WAITING) + self.in_state(RUNNING) + self.in_state(PAUSED)
            if (
                not busy
                and not self.resizes
                and not self.services_in(LOADING)
                and not self.services_in(UNLOADING)
            ):
                return
            self.send(Tick(), step_s)
        raise AssertionError(f"did not settle: {self.in_state(WAITING)} {self.in_state(RUNNING)}")

    def check_world(self) -> None:
        """Ledger and state invariants that must hold after every event."""
        world = self.manager.world
        ledger = world.ledger
        for name, dev in world.devices.items():
            assert ledger.decided(name) <= dev.usable_bytes
        expected = 0
        for svc in world.services.values():
            if svc.holds_memory:
                expected += len(svc.resident_leases) + (svc.kv_lease is not None)
                p = svc.spec.profile
                assert 0 <= svc.kv_in_use <= svc.kv_usable <= svc.kv_pool
                if svc.is_up:
                    assert p.kv_floor <= svc.kv_pool <= max(p.kv_ceiling, p.kv_floor)
                if svc.resizing:
                    # Until the backend answers, the ledger holds the larger pool.
                    assert svc.resize_from is not None and svc.resize_target is not None
                    assert svc.kv_pool == max(svc.resize_from, svc.resize_target)
                    assert self.resizes[svc.name] == svc.resize_target
                if svc.spec.capabilities.resize is ResizeSupport.NONE:
                    assert svc.kv_pool == p.kv_ceiling
            else:
                assert not svc.resident_leases and svc.kv_lease is None
                leftover = ledger.amount(svc.spec.device, svc.name, Category.LEFTOVER)
                assert ledger.service_total(svc.spec.device, svc.name) == leftover
            if svc.spec.capabilities.resize is not ResizeSupport.LIVE:
                assert not any(
                    isinstance(a, Resize) and a.service == svc.name for a in self.actions[-50:]
                ), f"{svc.name} cannot resize live"
            assert _VIEW[svc.status] == self.services[svc.name], svc.name
            assert svc.waiting_count == sum(
                1 for r in world.waiting.values() if r.service == svc.name
            )
            decided = sum(
                le.nbytes
                for le in ledger.leases()
                if le.service == svc.name and le.device == svc.spec.device
            )
            total = ledger.service_total(svc.spec.device, svc.name)
            measured = sum(
                ledger.amount(svc.spec.device, svc.name, c)
                for c in (Category.RESERVED, Category.LEFTOVER)
            )
            assert total - measured == decided
            assert svc.kv_in_use == sum(r.kv_bytes for r in svc.inflight.values()) + svc.paused_kv
        for req in world.inflight.values():
            assert req.active_lease is not None
            expected += 1
        assert ledger.lease_count() == expected
        assert set(world.inflight) == set(self.in_state(RUNNING))
        assert set(world.waiting) == set(self.in_state(WAITING) + self.in_state(PAUSED))
        assert {r for r, q in world.waiting.items() if q.paused} == set(self.in_state(PAUSED))
        assert all(r.pauses <= MAX_PAUSES for r in world.waiting.values())
        assert all(r.pauses <= MAX_PAUSES for r in world.inflight.values())
        assert world.host_used <= world.spec.host_budget_bytes
        check_indexes(world)
