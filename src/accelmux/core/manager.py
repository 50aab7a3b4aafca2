"""The Manager: ``handle(event, now) -> list[Action]`` and ``snapshot()``.

It owns the :class:`World` and its one writer (:class:`WorldOps`), applies each event's
bookkeeping through named operations, lets the policy decide (it reads the world and
writes only through the operations too),
checks the invariants before the round's actions leave it, and keeps a bounded decision
log. It reads no clock: ``now`` comes with every call, so the simulator and the live
daemon drive it identically.

A broken invariant (the budget: what was decided exceeds ``budget - headroom``) is a
bug. ``strict`` (the default: tests, the simulator) raises :class:`InvariantError`.
Otherwise (the daemon) the round's actions still leave, and an :class:`InvariantBroken`
entry goes into the decision log with the failing detail and the decisions before it,
for the shell to take (:meth:`Manager.take_broken`) and report; it is never an
exception in whoever submitted the event.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from accelmux.core.actions import Action, action_kind
from accelmux.core.events import (
    AdminCommand,
    BackendCrashed,
    Demand,
    Event,
    LoadFailed,
    LoadFinished,
    MemorySampled,
    PauseFinished,
    PauseRefused,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    ResizeFinished,
    ShutdownRequested,
    Tick,
    Unloaded,
)
from accelmux.core.placement import first_up
from accelmux.core.policy import Policy
from accelmux.core.snapshot import Snapshot, build_snapshot
from accelmux.core.specs import ManagerSpec
from accelmux.core.types import Category, Reason, ServiceStatus
from accelmux.core.world import (
    Change,
    CrashOom,
    RequestState,
    ServiceState,
    World,
    WorldOps,
    WorldView,
)
from accelmux.errors import InvariantError


@dataclass(frozen=True, slots=True)
class Decision:
    """One line of the decision log."""

    time: float
    action: Action

    def as_dict(self) -> dict[str, object]:
        a = self.action
        out: dict[str, object] = {"t": round(self.time, 6), "action": action_kind(a)}
        for key in (
            "service",
            "request_id",
            "reason",
            "detail",
            "lease_bytes",
            "retry_after_s",
            "kv_pool_bytes",
            "attempt",
        ):
            if hasattr(a, key):
                value = getattr(a, key)
                out[key] = value.value if isinstance(value, Reason) else value
        return out


#: Decisions an :class:`InvariantBroken` report keeps from before the round that broke it.
REPORTED_DECISIONS = 50


@dataclass(frozen=True, slots=True)
class InvariantBroken:
    """A line of the decision log: an invariant broke in the round ending at ``time``.

    ``actions`` are that round's decisions (they still left the Manager), ``recent`` the
    decisions logged before them, oldest first."""

    time: float
    detail: str
    actions: tuple[dict[str, object], ...]
    recent: tuple[dict[str, object], ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "t": round(self.time, 6),
            "action": "invariant_broken",
            "detail": self.detail,
            "actions": list(self.actions),
            "recent": list(self.recent),
        }


#: The method of :class:`Manager` that does each kind of event's bookkeeping (``_apply``).
_APPLIERS: dict[type[Event], str] = {
    RequestArrived: "_arrive",
    RequestFinished: "_request_finished",
    RequestCancelled: "_cancelled",
    LoadFinished: "_load_finished",
    LoadFailed: "_load_failed",
    ResizeFinished: "_resize_finished",
    PauseFinished: "_pause_finished",
    PauseRefused: "_pause_refused",
    Unloaded: "_unloaded",
    BackendCrashed: "_backend_crashed",
    MemorySampled: "_reconcile",
    AdminCommand: "_admin",
    ShutdownRequested: "_shutdown_requested",
    Tick: "_tick",
}


class Manager:
    def __init__(self, spec: ManagerSpec, policy: Policy, *, strict: bool = True) -> None:
        self.spec = spec
        self.policy = policy
        self.strict = strict
        self.world = World(spec)
        self.ops = WorldOps(self.world)
        self.last_changes: list[Change] = []
        self.log: deque[Decision | InvariantBroken] = deque(maxlen=spec.knobs.max_decision_log)
        self.counts: dict[tuple[str, str], int] = {}
        self._started = False
        self._last_now = -math.inf
        #: Reports not yet taken by the shell (``strict=False``), oldest first.
        self._broken: deque[InvariantBroken] = deque(maxlen=REPORTED_DECISIONS)
        #: Devices over budget at the last check: a report is made when one goes over.
        self._over_budget: set[str] = set()

    # ---- driving ---------------------------------------------------------------
    def start(self, now: float) -> list[Action]:
        """Let the policy preload; idempotent. ``handle`` calls it on first use."""
        if self._started:
            return []
        self._started = True
        self._advance(now)
        self.policy.start(self.world, self.ops, now)
        self.policy.decide(self.world, self.ops, now)
        return self._finish(now)

    def handle(self, event: Event, now: float) -> list[Action]:
        pre = self.start(now) if not self._started else []
        self._advance(now)
        # An arrival changes its device's memory state only if its service holds memory
        # (``WorldOps.add_waiting`` says so then).
        memory = not isinstance(event, RequestArrived)
        for device in self._devices_of(event):
            self.ops.touch(device, memory=memory)
        self._apply(event)
        self._expire_deadlines()
        self.policy.decide(self.world, self.ops, now)
        return pre + self._finish(now)

    def next_wakeup(self, now: float) -> float | None:
        """Earliest time the Manager wants a Tick (deadlines, TTLs, windows, backoffs)."""
        deadline = self.world.next_deadline(now)
        wake = self.policy.next_wakeup(self.world, now)
        future = [t for t in (deadline, wake) if t is not None and t > now]
        return min(future) if future else None

    def _advance(self, now: float) -> None:
        if now < self._last_now:
            raise InvariantError(f"time went backwards: {now} < {self._last_now}")
        self._last_now = now
        self.ops.advance(now)

    def _finish(self, now: float) -> list[Action]:
        """Check the invariants, then hand out the round's actions (and log them)."""
        broken = self._check_budget() if self.policy.enforces_budget else []
        if broken and self.strict:
            raise InvariantError("; ".join(broken))
        recent = tuple(d.as_dict() for d in list(self.log)[-REPORTED_DECISIONS:]) if broken else ()
        actions = self.ops.drain()
        #: What the operations changed in the call that ends here (event and round).
        self.last_changes = self.ops.take_changes()
        for a in actions:
            self.log.append(Decision(now, a))
            key = (action_kind(a), a.reason.value)
            self.counts[key] = self.counts.get(key, 0) + 1
        if broken:
            report = InvariantBroken(
                time=now,
                detail="; ".join(broken),
                actions=tuple(Decision(now, a).as_dict() for a in actions),
                recent=recent,
            )
            self.log.append(report)
            key = ("invariant_broken", "budget")
            self.counts[key] = self.counts.get(key, 0) + 1
            self._broken.append(report)
        return actions

    def _check_budget(self) -> list[str]:
        """What broke the budget: every device over it (strict), or each that went over
        since the last check (a device that stays over is reported once)."""
        ledger = self.world.ledger
        over = self._over_budget
        broken: list[str] = []
        for name, dev in self.world.devices.items():
            decided = ledger.decided(name)
            if decided <= dev.usable_bytes:
                over.discard(name)
            elif self.strict or name not in over:
                over.add(name)
                broken.append(f"device {name}: decided {decided} > usable {dev.usable_bytes}")
        return broken

    def take_broken(self) -> list[InvariantBroken]:
        """The invariant reports made since the last call (``strict=False``), oldest first."""
        out = list(self._broken)
        self._broken.clear()
        return out

    # ---- bookkeeping per event ---------------------------------------------------
    def _devices_of(self, event: Event) -> Iterable[str]:
        """The devices whose state an event may change."""
        w = self.world
        if isinstance(event, Tick):
            return ()
        service: str | None = getattr(event, "service", None)
        if service is not None:
            svc = w.services.get(service)
            if svc is None:  # a service with replicas: any of their devices
                return tuple(dict.fromkeys(r.spec.device for r in w.groups.get(service, ())))
            return (svc.spec.device,)
        request_id: str | None = getattr(event, "request_id", None)
        if request_id is not None:
            req = w.inflight.get(request_id) or w.waiting.get(request_id)
            return (w.services[req.service].spec.device,) if req is not None else ()
        if isinstance(event, MemorySampled):
            return (event.device,) if event.device in w.devices else ()
        return w.devices  # shutdown: everything

    def _apply(self, event: Event) -> None:
        """The bookkeeping an event brings, one method per kind of event."""
        getattr(self, _APPLIERS[type(event)])(event)

    def _cancelled(self, event: RequestCancelled) -> None:
        self._cancel(event.request_id)

    def _shutdown_requested(self, event: ShutdownRequested) -> None:
        self.ops.shut_down()

    def _tick(self, event: Tick) -> None:
        """A tick brings no bookkeeping: time has moved (``_advance``)."""

    def _request_finished(self, event: RequestFinished) -> None:
        w, ops = self.world, self.ops
        req = w.inflight.get(event.request_id)
        if req is None:
            paused = w.waiting.get(event.request_id)
            if paused is not None and paused.paused and paused.attempt == event.attempt:
                # It ended just as it was paused: nothing is left to resume.
                ops.end_paused(
                    paused,
                    ok=event.ok,
                    reason=Reason.BACKEND_CRASHED,
                    detail=event.error or "failed",
                )
            return
        if req.attempt != event.attempt:
            return  # stale: preempted, failed or cancelled already
        ops.request_done(req, event.peak_bytes, None if event.ok else event.error or "failed")

    def _load_failed(self, event: LoadFailed) -> None:
        svc = self.world.services[event.service]
        if svc.status is ServiceStatus.LOADING:
            self.ops.load_failed(
                svc,
                out_of_memory=event.out_of_memory,
                error=event.error,
                asked=event.asked_bytes,
                used_besides=event.device_used_bytes,
            )

    def _resize_finished(self, event: ResizeFinished) -> None:
        svc = self.world.services[event.service]
        if svc.resize_target == event.kv_pool_bytes:
            self.ops.resize_done(svc, ok=event.ok)

    def _pause_finished(self, event: PauseFinished) -> None:
        req = self.world.inflight.get(event.request_id)
        if req is not None and req.attempt == event.attempt and req.pausing is not None:
            self.ops.pause_done(req)

    def _pause_refused(self, event: PauseRefused) -> None:
        req = self.world.inflight.get(event.request_id)
        if req is not None and req.attempt == event.attempt and req.pausing is not None:
            self.ops.pause_refused(req, error=event.error)

    def _unloaded(self, event: Unloaded) -> None:
        svc = self.world.services[event.service]
        if svc.status is ServiceStatus.UNLOADING or (
            svc.status is ServiceStatus.LOADED and not svc.inflight
        ):
            self.ops.unloaded(svc)

    def _backend_crashed(self, event: BackendCrashed) -> None:
        svc = self.world.services[event.service]
        oom = None
        if event.out_of_memory and (
            event.asked_bytes is not None or event.device_used_bytes is not None
        ):
            req = svc.inflight.get(event.request_id or "")
            held = None
            if req is not None:
                lease = req.active_lease.nbytes if req.active_lease else 0
                held = (req.estimate.active_bytes, lease)
            oom = CrashOom(asked=event.asked_bytes, used_besides=event.device_used_bytes, held=held)
        self.ops.crashed(svc, reason=event.reason, error=event.error, oom=oom)

    def _arrive(self, event: RequestArrived) -> None:
        w, ops = self.world, self.ops
        if event.request_id in w.waiting or event.request_id in w.inflight:
            raise InvariantError(f"duplicate request id {event.request_id}")
        svc = w.services.get(event.service) or self._route(event)
        estimate = w.estimate(svc.name, event.demand)
        req = RequestState(
            request_id=event.request_id,
            service=svc.name,
            cls=svc.spec.cls,
            demand=event.demand,
            estimate=estimate,
            arrived_at=w.now,
            deadline_at=w.now + svc.spec.deadline_s,
            seq=ops.next_seq(),
            job_id=event.job_id,
            pausable=event.pausable,
        )
        ops.arrive(req, event.keep_alive_s)

    def _route(self, event: RequestArrived) -> ServiceState:
        """The replica a request for a service with replicas waits on (the policy's
        ``route``, else the one replica that is up)."""
        replicas = self.world.groups.get(event.service)
        if not replicas:
            raise InvariantError(f"request for unknown service {event.service!r}")
        route: Callable[[World, Sequence[ServiceState], Demand], ServiceState] | None = getattr(
            self.policy, "route", None
        )
        chosen = first_up(replicas) if route is None else route(self.world, replicas, event.demand)
        if chosen not in replicas:
            raise InvariantError(f"policy routed {event.service!r} to {chosen.name!r}")
        return chosen

    def _cancel(self, request_id: str) -> None:
        w, ops = self.world, self.ops
        if request_id in w.waiting:
            ops.reject(
                w.waiting[request_id],
                reason=Reason.CANCELLED,
                retry_after_s=0.0,
                detail="client went away",
            )
        elif request_id in w.inflight:
            ops.fail(w.inflight[request_id], reason=Reason.CANCELLED, detail="client went away")

    def _load_finished(self, event: LoadFinished) -> None:
        svc = self.world.services[event.service]
        if svc.status is not ServiceStatus.LOADING:
            return
        reported = (
            (Category.WEIGHTS, event.weights_bytes),
            (Category.RUNTIME, event.runtime_bytes),
        )
        self.ops.load_done(svc, {c: n for c, n in reported if n is not None})

    def _reconcile(self, event: MemorySampled) -> None:
        self.ops.reconcile(event)

    def _admin(self, event: AdminCommand) -> None:
        w = self.world
        svc = w.services.get(event.service)
        if svc is None and event.service in w.groups:
            # A service with replicas: unload and unpin reach every replica; load and
            # pin the one that is up, else the first.
            replicas = w.groups[event.service]
            targets = replicas if event.op in ("unload", "unpin") else (first_up(replicas),)
            for replica in targets:
                self._admin(AdminCommand(service=replica.name, op=event.op))
            return
        if svc is None:
            raise InvariantError(f"admin command for unknown service {event.service!r}")
        ops = self.ops
        if event.op == "pin":
            ops.set_kept(svc, pinned=True, admin_wants_loaded=svc.admin_wants_loaded)
            ops.clear_admin_unload(svc.name)
        elif event.op == "unpin":
            ops.set_kept(svc, pinned=False, admin_wants_loaded=svc.admin_wants_loaded)
        elif event.op == "load":
            ops.set_kept(svc, pinned=svc.pinned, admin_wants_loaded=True)
            ops.clear_admin_unload(svc.name)
        elif event.op == "unload":
            ops.set_kept(svc, pinned=False, admin_wants_loaded=False)
            ops.request_admin_unload(svc.name)

    def _expire_deadlines(self) -> None:
        w = self.world
        for req in self.ops.expired_requests():
            svc = w.services[req.service]
            self.ops.reject(
                req,
                reason=Reason.DEADLINE_EXCEEDED,
                retry_after_s=max(1.0, math.ceil(svc.mean_service_s)),
                detail=f"waited {w.now - req.arrived_at:.1f}s "
                f"(last cause: {req.wait_reason.value if req.wait_reason else 'none'})",
            )

    # ---- reading ----------------------------------------------------------------
    @property
    def view(self) -> WorldView:
        """The world, read-only: what the shell reads (it writes nothing of it)."""
        return self.world

    def snapshot(self) -> Snapshot:
        return build_snapshot(self.world, self.log, self.counts)

    def explain(self, request_id: str) -> list[str] | None:
        w = self.world
        req: RequestState | None = w.waiting.get(request_id) or w.inflight.get(request_id)
        if req is None:
            for r in reversed(w.finished_requests):
                if r.request_id == request_id:
                    req = r
                    break
        return None if req is None else list(req.explain)
