"""The one writer of the World: every change is a named operation here.

Policies never build actions by hand or write a field: they call these operations
(``dispatch``, ``enqueue``, ``reject``, ``load``, ``unload``, ``resize``, ``preempt``,
``pause``...), which update the ledger, the states and the derived indexes consistently
and record the action; they note what they learn through operations as well
(``mark_announced``, ``clear_admin_unload``, ``forget_eviction``, ``observe_failure``,
``charge``, ``touch``...). The Manager applies each event's bookkeeping through
operations too (``finish_request``, ``load_finished``, ``crashed``, ``reconcile``...).

Each operation notes what it changed in :attr:`WorldOps.changes` (a :class:`Change`: the
operation, and the service, device, class and request it touched), for whoever wants to
know what an event or a round changed. ``tests/core/test_policy_mutators.py`` fails on
code outside this package that writes a field of the World, a service or a request.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import NamedTuple

from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Pause,
    Preempt,
    Rebatch,
    Reject,
    Resize,
    Resume,
    Unload,
)
from accelmux.core.events import MemorySampled
from accelmux.core.learned import LearnedSize
from accelmux.core.ledger import Lease
from accelmux.core.oom import OomReport, attribute, retest_after
from accelmux.core.shrink import FULL, scaled_demand
from accelmux.core.types import (
    Category,
    Reason,
    ResizeSupport,
    ServiceClass,
    ServiceStatus,
    Tier,
)
from accelmux.core.world.data import (
    STATUS_MOVES,
    CrashOom,
    RequestPhase,
    RequestState,
    ServiceState,
)
from accelmux.core.world.world import World
from accelmux.errors import InvariantError

#: The statuses of a service that holds nothing and that no survey of its device sees.
_DOWN = (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)


class Change(NamedTuple):
    """What one operation changed: its name, and the service, device, class and request it
    touched (None where it touched none)."""

    op: str
    service: str | None
    device: str | None
    cls: ServiceClass | None
    request: str | None


class WorldOps:
    """The named operations that change a :class:`World` (see the module docstring)."""

    __slots__ = ("changes", "world")

    def __init__(self, world: World) -> None:
        self.world = world
        #: What the operations changed since the last :meth:`take_changes`.
        self.changes: list[Change] = []

    def take_changes(self) -> list[Change]:
        """The changes noted since the last call, oldest first."""
        out, self.changes = self.changes, []
        return out

    def _note(self, op: str, svc: ServiceState, req: RequestState | None = None) -> None:
        self.changes.append(
            Change(
                op,
                svc.name,
                svc.spec.device,
                req.cls if req is not None else svc.spec.cls,
                req.request_id if req is not None else None,
            )
        )

    def next_seq(self) -> int:
        w = self.world
        w.seq += 1
        return w.seq

    def record(self, action: Action, *, memory: bool = True) -> None:
        """Record ``action``; ``memory`` False: it changes nothing a load on its device
        reads (see :meth:`touch`)."""
        w = self.world
        w.actions.append(action)
        w.version += 1
        svc = w.services[action.service]
        self.changes.append(
            Change(
                type(action).__name__,
                svc.name,
                svc.spec.device,
                svc.spec.cls,
                getattr(action, "request_id", None),
            )
        )
        if not isinstance(action, Enqueue):  # a new wait reason changes no decision input
            self.touch(svc.spec.device, memory=memory)

    def drain(self) -> list[Action]:
        w = self.world
        out, w.actions = w.actions, []
        return out

    def _explain(self, req: RequestState, text: str) -> None:
        req.explain.append(f"t={self.world.now:.3f} {text}")

    def touch(self, device: str, *, memory: bool = True) -> None:
        """Something on ``device`` changed (the Manager calls it for every event);
        ``memory`` False: only a queue of a service that is down (``memory_epochs``)."""
        w = self.world
        w.epochs[device] += 1
        if memory:
            w.memory_epochs[device] += 1

    def set_status(self, svc: ServiceState, status: ServiceStatus) -> None:
        """Move ``svc`` to ``status`` (along :data:`STATUS_MOVES`; any other move is a bug)."""
        w = self.world
        if status not in STATUS_MOVES[svc.status]:
            raise InvariantError(f"{svc.name}: {svc.status.value} -> {status.value} is no move")
        svc.status = status
        self._note("status", svc)
        w.loaded.update(svc, status is ServiceStatus.LOADED)
        w.loaded_by_device[svc.spec.device].update(svc, status is ServiceStatus.LOADED)
        w.unloading_by_device[svc.spec.device].update(svc, status is ServiceStatus.UNLOADING)
        w.crashed.update(svc, status is ServiceStatus.CRASHED)
        self._update_evicted(svc)
        self._reindex(svc)
        if svc.name in w.host_weights:
            self._host_changed()  # whether its parked weights alone hold the RAM

    def set_kept(self, svc: ServiceState, *, pinned: bool, admin_wants_loaded: bool) -> None:
        """The operator's pin and load; either one drops a client's keep_alive, so what a
        client asked before the pin does not take effect after it."""
        self._note("kept", svc)
        svc.pinned = pinned
        svc.admin_wants_loaded = admin_wants_loaded
        kept = pinned or admin_wants_loaded
        if kept:
            svc.keep_alive_s = None
        self.world.kept.update(svc, kept)
        self._reindex(svc)

    def forget_eviction(self, svc: ServiceState) -> None:
        """The evicted service was restored: it no longer counts as evicted."""
        self._note("restored", svc)
        svc.last_evicted_at = None
        self._update_evicted(svc)

    def _reindex(self, svc: ServiceState) -> None:
        """Keep ``svc`` in the service indexes of its TTL and its KV pool (``idle_up``,
        ``balloonable``): after any change of its status, requests in flight or paused in
        its pool, pin, KV pool or pending resize."""
        w = self.world
        up = svc.status is ServiceStatus.LOADED
        idle = (
            up
            and not svc.inflight
            and not svc.paused_kv
            and not svc.pinned
            and not svc.admin_wants_loaded
        )
        w.idle_up.update(svc, idle)
        w.idle_up_by_device[svc.spec.device].update(svc, idle)
        w.balloonable.update(
            svc,
            up
            and svc.resize_target is None
            and svc.kv_pool > svc.spec.profile.kv_floor
            and svc.resize_support is ResizeSupport.LIVE,
        )

    def _update_evicted(self, svc: ServiceState) -> None:
        self.world.evicted_out.update(
            svc, svc.last_evicted_at is not None and svc.status is ServiceStatus.UNLOADED
        )

    def _count_reason(self, req: RequestState, reason: Reason | None, delta: int) -> None:
        w = self.world
        w.wait_reasons[reason] = w.wait_reasons.get(reason, 0) + delta
        key = (w.services[req.service].spec.device, req.cls, reason)
        w.waiting_causes[key] = w.waiting_causes.get(key, 0) + delta

    def add_waiting(self, req: RequestState) -> None:
        """Put a request (new or preempted) at the end of the queue."""
        self._note("waiting", self.world.services[req.service], req)
        w = self.world
        w.queue_mark += 1
        req.queued_mark = w.queue_mark
        svc = w.services[req.service]
        self.touch(svc.spec.device, memory=svc.status not in _DOWN)
        w.waiting[req.request_id] = req
        svc.queue[req.request_id] = req
        svc.waiting_count += 1
        w.queued.add(svc)
        w.queued_services(svc.spec.device, req.cls).add(svc)
        if svc.spec.windows:
            w.queued_windowed.add(svc)
        self._count_reason(req, req.wait_reason, 1)
        key = (svc.spec.device, req.cls)
        w.waiting_classes[key] = w.waiting_classes.get(key, 0) + 1
        w.queue_epochs[key] += 1
        heapq.heappush(w.deadlines, (req.deadline_at, req.queued_mark, req))

    def _remove_waiting(self, req: RequestState) -> bool:
        w = self.world
        if w.waiting.pop(req.request_id, None) is None:
            return False
        svc = w.services[req.service]
        del svc.queue[req.request_id]
        svc.waiting_count -= 1
        if not svc.queue:
            w.queued.discard(svc)
            w.queued_services(svc.spec.device, req.cls).discard(svc)
            w.queued_windowed.discard(svc)
        self._count_reason(req, req.wait_reason, -1)
        key = (svc.spec.device, req.cls)
        w.waiting_classes[key] -= 1
        w.queue_epochs[key] += 1
        return True

    def expired_requests(self) -> list[RequestState]:
        """Waiting requests whose deadline is now or past, in queue order."""
        w = self.world
        heap = w.deadlines
        out: list[RequestState] = []
        while heap and heap[0][0] <= w.now:
            entry = heapq.heappop(heap)
            if w.queued_now(entry):
                out.append(entry[2])
        out.sort(key=lambda r: r.queued_mark)
        return out

    def observe_load_seconds(self, svc: ServiceState, seconds: float) -> None:
        """A load from ``svc.loading_from`` took ``seconds`` (LoadFinished)."""
        before = svc.load_s.get(svc.loading_from)
        svc.load_s[svc.loading_from] = seconds if before is None else 0.7 * before + 0.3 * seconds

    def _host_changed(self) -> None:
        """The park budget's use changed: on the host device it is that device's memory
        (weights of a service still holding its device memory are the same pages, not
        counted twice)."""
        w = self.world
        if w.park_device is None:
            return
        w.ledger.set_parked(w.park_device, w.parked_on_host())
        self.touch(w.park_device)

    def _make_host_room(self, nbytes: int, keep: ServiceState | None = None) -> bool:
        """Drop the oldest parked or sleeping weights (each an Unload to ``cold``) until
        ``nbytes`` fit the host budget; False if they cannot."""
        w = self.world
        for name in list(w.host_weights):
            if w.host_free() >= nbytes:
                break
            other = w.services[name]
            if other is keep:
                continue
            self.drop_host_copy(other, reason=Reason.HOST_BUDGET)
        return w.host_free() >= nbytes

    def drop_host_copy(self, svc: ServiceState, *, reason: Reason) -> None:
        """Release the host RAM ``svc``'s parked or sleeping weights hold (an Unload to
        ``cold`` of a service that is not loaded)."""
        if self.world.host_weights.pop(svc.name, None) is None:
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
        w = self.world
        svc = w.services[req.service]
        if not svc.is_up:
            raise InvariantError(f"dispatch to {svc.name} while {svc.status.value}")
        if req.request_id not in w.waiting:
            raise InvariantError(f"dispatch of {req.request_id} which is not waiting")
        if req.paused:
            return self._resume(req, svc, reason=reason, active_bytes=active_bytes, detail=detail)
        kv = req.estimate.kv_bytes
        if kv > svc.kv_usable - svc.kv_in_use or kv > svc.kv_slot:
            return False
        need = w.projected_active(req) if active_bytes is None else active_bytes
        lease = w.ledger.reserve(svc.spec.device, svc.name, Category.ACTIVE, need, enforce=enforce)
        if lease is None:
            return False
        self._absorb_cache(svc, need)
        self._remove_waiting(req)
        req.move_to(RequestPhase.RUNNING)
        req.attempt += 1
        req.active_lease = lease
        req.kv_bytes = kv
        req.dispatched_at = w.now
        req.running_since = w.now
        req.wait_reason = None
        svc.kv_in_use += kv
        svc.peak_active_bytes = max(svc.peak_active_bytes, need)
        svc.inflight[req.request_id] = req
        w.busy.add(svc)
        svc.last_used = w.now
        w.inflight[req.request_id] = req
        self._reindex(svc)
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

    def size_at_full_batch(self, req: RequestState, svc: ServiceState) -> None:
        """Size ``req`` at its full batch again (a request put back in its queue may still
        carry a smaller batch's estimate); its service's batch is left as it is."""
        self._size_at(req, svc, FULL)

    def _size_at(self, req: RequestState, svc: ServiceState, fraction: float) -> None:
        """``req``'s estimate becomes one batch of ``fraction`` of its units."""
        req.estimate = self.world.estimate(svc.name, scaled_demand(req.demand, fraction))
        req.batch_fraction = fraction

    def rebatch(
        self, req: RequestState, svc: ServiceState, fraction: float, *, reason: Reason, detail: str
    ) -> None:
        """Run ``req`` (and its service's next requests) at ``fraction`` of the full batch:
        its estimate becomes one such batch's (see :mod:`accelmux.core.shrink`)."""
        shrink = svc.spec.shrink
        if shrink is None:
            raise InvariantError(f"rebatch of {svc.name}, which declares no shrink")
        self._size_at(req, svc, fraction)
        changed = fraction != svc.batch_fraction
        svc.batch_fraction = fraction
        if not changed:
            return
        parallel = shrink.parallel(fraction, svc.spec.concurrency)
        self._explain(req, f"rebatch ({reason.value}) fraction={fraction:g} {detail}".rstrip())
        self.record(
            Rebatch(
                request_id=req.request_id,
                service=svc.name,
                fraction=fraction,
                parallel=parallel,
                reason=reason,
                detail=detail,
            )
        )

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
        w = self.world
        restore = req.parked_kv
        if restore > svc.kv_usable - svc.kv_in_use:
            return False
        need = w.projected_active(req) if active_bytes is None else active_bytes
        lease = w.ledger.reserve(svc.spec.device, svc.name, Category.ACTIVE, need)
        if lease is None:
            return False
        self._absorb_cache(svc, need)
        self._remove_waiting(req)
        if req.parked:
            if req.parked_in_ram:
                w.host_kv -= restore
                self._host_changed()
            svc.kv_in_use += restore
            req.kv_bytes = restore
        else:
            svc.paused_kv -= req.kv_bytes
        req.parked_kv = 0
        req.parked_in_ram = False
        req.move_to(RequestPhase.RUNNING)
        req.active_lease = lease
        req.running_since = w.now
        req.wait_reason = None
        svc.inflight[req.request_id] = req
        w.busy.add(svc)
        svc.last_used = w.now
        w.inflight[req.request_id] = req
        self._reindex(svc)
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
        w = self.world
        svc = w.services[req.service]
        caps = svc.spec.capabilities
        if req.request_id not in w.inflight:
            raise InvariantError(f"pause of {req.request_id} which is not running")
        if req.pausing is not None:
            return False
        if not req.pausable or not caps.pause or (park and not caps.park):
            return False
        in_ram = park and w.parks_in_ram(svc)
        if in_ram and not self._make_host_room(req.kv_bytes):
            return False
        if in_ram:  # room kept for its state until the backend answers
            req.pause_reserved = req.kv_bytes
            w.host_pending += req.kv_bytes
        req.move_to(RequestPhase.PAUSING)
        req.pause_parks = park
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
        self._note("paused", self.world.services[req.service], req)
        w = self.world
        park = bool(req.pausing)
        svc = w.services[req.service]
        self._unreserve_pause(req)
        self._release_active(req, svc)
        if park:
            svc.kv_in_use -= req.kv_bytes
            if w.parks_in_ram(svc):
                w.host_kv += req.kv_bytes
                req.parked_in_ram = True
            req.parked_kv, req.kv_bytes = req.kv_bytes, 0
            self._host_changed()
        else:
            svc.paused_kv += req.kv_bytes
        svc.inflight.pop(req.request_id, None)
        if not svc.inflight:
            w.busy.discard(svc)
        w.inflight.pop(req.request_id, None)
        self._reindex(svc)
        req.move_to(RequestPhase.PARKED if park else RequestPhase.PAUSED)
        if req.pausing_for_realtime:
            req.yields += 1
        else:
            req.pauses += 1
        req.running_since = None
        req.wait_reason = None
        # A paused stream has a client waiting on it: its wait is bounded afresh.
        req.deadline_at = w.now + svc.spec.deadline_s
        self.add_waiting(req)
        self._explain(req, f"paused{' (parked)' if park else ''}")

    def pause_refused(self, req: RequestState, *, error: str) -> None:
        """The backend could not pause ``req``: it runs on with what it holds and is not
        asked again (it counts as a request that cannot pause from now on)."""
        self._note("pause_refused", self.world.services[req.service], req)
        req.move_to(RequestPhase.RUNNING)
        req.pausable = False
        self._unreserve_pause(req)
        self.touch(self.world.services[req.service].spec.device)
        self._explain(req, f"pause refused: {error}".rstrip(": "))

    def _unreserve_pause(self, req: RequestState) -> None:
        """Give back the host room kept for ``req``'s pause (answered, or it ended)."""
        if req.pause_reserved:
            self.world.host_pending -= req.pause_reserved
            req.pause_reserved = 0

    def _release_paused(self, req: RequestState) -> None:
        """A paused request ends (finished meanwhile, cancelled, failed): its KV state
        is given back, wherever it is."""
        w = self.world
        svc = w.services[req.service]
        self._remove_waiting(req)
        if req.parked:
            if req.parked_in_ram:
                w.host_kv -= req.parked_kv
                self._host_changed()
            req.parked_kv = 0
            req.parked_in_ram = False
        else:
            svc.paused_kv -= req.kv_bytes
            svc.kv_in_use -= req.kv_bytes
            self._reindex(svc)
        req.kv_bytes = 0
        req.move_to(RequestPhase.ENDED)

    def end_paused(self, req: RequestState, *, ok: bool, reason: Reason, detail: str = "") -> None:
        """A paused request ended: it finished just as it was paused (``ok``), or it is
        failed (cancelled, its deadline, its backend died)."""
        self._release_paused(req)
        self.world.finished_requests.append(req)
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
        w = self.world
        here = w.services[req.service]
        if (
            req.dispatched_at is not None
            or req.paused
            or not to.spec.group
            or to.spec.group != here.spec.group
        ):
            raise InvariantError(f"request {req.request_id} cannot move to {to.name}")
        self._remove_waiting(req)
        req.service = to.name
        req.estimate = w.estimate(to.name, req.demand)
        self.add_waiting(req)
        self._explain(req, f"moved to {to.name}: {detail}")

    def enqueue(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        """Mark the request waiting; an action is recorded only when the cause changes."""
        if req.wait_reason is reason:
            return
        w = self.world
        if req.request_id in w.waiting:
            self._count_reason(req, req.wait_reason, -1)
            self._count_reason(req, reason, 1)
            w.queue_epochs[(w.services[req.service].spec.device, req.cls)] += 1
        req.wait_reason = reason
        self._explain(req, f"wait ({reason.value}) {detail}".rstrip())
        self.record(
            Enqueue(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )

    def reject(
        self, req: RequestState, *, reason: Reason, retry_after_s: float, detail: str = ""
    ) -> None:
        w = self.world
        if req.held_for_realtime and reason is Reason.DEADLINE_EXCEEDED:
            w.services[req.service].skipped_for_realtime += 1
        if req.paused and req.request_id in w.waiting:
            # Part of its answer went out: it ends with an error, not a refusal.
            self.end_paused(req, ok=False, reason=reason, detail=detail)
            return
        if not self._remove_waiting(req):
            raise InvariantError(f"reject of {req.request_id} which is not waiting")
        req.move_to(RequestPhase.ENDED)
        self._explain(req, f"reject ({reason.value}) retry_after={retry_after_s:.0f}s {detail}")
        self.record(
            Reject(
                request_id=req.request_id,
                service=req.service,
                reason=reason,
                retry_after_s=max(0.0, retry_after_s),
                detail=detail,
            ),
            # a waiting request (not paused) holds nothing: only a loaded service's
            # queue is read by a survey of its device (whether it may be evicted)
            memory=w.services[req.service].status not in _DOWN,
        )
        w.finished_requests.append(req)

    def mark_caching(self, svc: ServiceState) -> None:
        """``svc``'s backend was measured keeping freed memory (every replica alike):
        from now on what its requests held stays charged to it when they end."""
        self._note("caching", svc)
        self.world.caching_backends.add(svc.spec.addressed_as)

    def _absorb_cache(self, svc: ServiceState, need: int) -> None:
        """A request of a caching allocator runs first in the memory its cache holds:
        its lease takes that much out of the service's RESERVED, so the cache is not
        counted twice (once as cache, once as the lease) until the next sample."""
        w = self.world
        if not need or svc.spec.addressed_as not in w.caching_backends:
            return
        dev = svc.spec.device
        cached = w.ledger.amount(dev, svc.name, Category.RESERVED)
        if cached:
            w.ledger.set_reserved(dev, svc.name, cached - min(cached, need))

    def _release_active(self, req: RequestState, svc: ServiceState) -> None:
        """Give back the activation lease of ``req``. A caching allocator keeps those
        bytes: they move to the service's RESERVED (what the next sample would measure
        above its leases), so no other work is admitted into memory still held."""
        w = self.world
        lease = req.active_lease
        if lease is None:
            return
        w.ledger.release(lease)
        req.active_lease = None
        if lease.nbytes and svc.holds_memory and svc.spec.addressed_as in w.caching_backends:
            dev = svc.spec.device
            kept = w.ledger.amount(dev, svc.name, Category.RESERVED) + lease.nbytes
            w.ledger.set_reserved(dev, svc.name, kept)

    def _release_request(self, req: RequestState) -> None:
        w = self.world
        svc = w.services[req.service]
        self._unreserve_pause(req)
        self._release_active(req, svc)
        svc.kv_in_use -= req.kv_bytes
        req.kv_bytes = 0
        if svc.kv_in_use < 0:
            raise InvariantError(f"{svc.name}: kv_in_use went negative")
        svc.inflight.pop(req.request_id, None)
        if not svc.inflight:
            w.busy.discard(svc)
        w.inflight.pop(req.request_id, None)
        self._reindex(svc)

    def finish(self, req: RequestState) -> None:
        """Bookkeeping of a request that ended after dispatch (no action)."""
        self._release_request(req)
        req.move_to(RequestPhase.ENDED)
        self._explain(req, "finished")
        self.world.finished_requests.append(req)

    def fail(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        self._release_request(req)
        req.move_to(RequestPhase.ENDED)
        self._explain(req, f"failed ({reason.value}) {detail}".rstrip())
        self.record(
            Fail(request_id=req.request_id, service=req.service, reason=reason, detail=detail)
        )
        self.world.finished_requests.append(req)

    def preempt(self, req: RequestState, *, reason: Reason, detail: str = "") -> None:
        """Stop a running request and put it back at its place in the queue."""
        attempt = req.attempt
        self._release_request(req)
        req.move_to(RequestPhase.WAITING)
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
        w = self.world
        if svc.status not in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            raise InvariantError(f"load of {svc.name} while {svc.status.value}")
        weights, runtime, pool = w.projected_resident(svc, _pool_to_load(svc, kv_pool))
        owner = w.weights_holder(svc)
        if owner is not None:
            weights = 0  # the copy another service loaded is shared, and charged to it
        svc.weights_shared_by = owner.name if owner is not None else None
        total = weights + runtime + pool
        device = svc.spec.device
        # What was measured of it while down (a sleeping process) is part of this load;
        # so are its parked weights (they move back onto the device).
        leftover = w.ledger.amount(device, svc.name, Category.LEFTOVER)
        parked_here = w.host_weights.get(svc.name, 0) if device == w.park_device else 0
        if enforce and not w.ledger.fits(device, total - leftover - parked_here):
            return False
        w.ledger.set_leftover(device, svc.name, 0)
        leases = [
            w.ledger.reserve(device, svc.name, Category.WEIGHTS, weights, enforce=False),
            w.ledger.reserve(device, svc.name, Category.RUNTIME, runtime, enforce=False),
        ]
        svc.resident_leases = [le for le in leases if le is not None]
        self._hold_kv(svc, w.ledger.reserve(device, svc.name, Category.KV, pool, enforce=False))
        self.set_status(svc, ServiceStatus.LOADING)
        from_tier = svc.tier
        svc.loading_from = from_tier
        svc.tier = Tier.COLD
        if w.host_weights.pop(svc.name, None) is not None:  # back onto the device
            self._host_changed()
        svc.loading_since = w.now
        svc.load_reason = reason
        svc.loads += 1
        if svc.last_evicted_at is not None and w.now - svc.last_evicted_at <= 60.0:
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
        w = self.world
        if svc.status is not ServiceStatus.LOADED:
            raise InvariantError(f"unload of {svc.name} while {svc.status.value}")
        if svc.inflight or svc.paused_kv:
            raise InvariantError(f"unload of {svc.name} with requests in flight")
        if tier is not Tier.COLD:
            caps = svc.spec.capabilities
            declared = caps.sleep if tier is Tier.SLEEPING else caps.host_cache
            nbytes = w.host_weight_bytes(svc)
            if not declared or not self._make_host_room(nbytes, keep=svc):
                tier = Tier.COLD
            else:
                w.host_weights[svc.name] = nbytes
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
            svc.last_evicted_at = w.now
        self.set_status(svc, ServiceStatus.UNLOADING)
        self.record(Unload(service=svc.name, reason=reason, tier=tier, detail=detail))

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
        w = self.world
        if not w.resizable(svc):
            return False
        new_pool = max(new_pool, svc.kv_in_use)
        old = svc.kv_pool
        if new_pool == old:
            return False
        device = svc.spec.device
        if new_pool > old:
            if enforce and not w.ledger.fits(device, new_pool - old):
                return False
            self._set_kv_lease(svc, new_pool)
        svc.resize_from = old
        svc.resize_target = new_pool
        self._reindex(svc)
        self.record(Resize(service=svc.name, kv_pool_bytes=new_pool, reason=reason, detail=detail))
        return True

    def resize_done(self, svc: ServiceState, *, ok: bool) -> None:
        """The backend answered the pending resize: the pool becomes the new size (ok)
        or stays the old one; the ledger then holds exactly that."""
        self._note("resized", svc)
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
        self._reindex(svc)
        self.touch(svc.spec.device)

    def _set_kv_lease(self, svc: ServiceState, nbytes: int) -> None:
        w = self.world
        if svc.kv_lease is not None:
            w.ledger.release(svc.kv_lease)
        self._hold_kv(
            svc,
            w.ledger.reserve(svc.spec.device, svc.name, Category.KV, nbytes, enforce=False),
        )
        self._reindex(svc)

    @staticmethod
    def _hold_kv(svc: ServiceState, lease: Lease | None) -> None:
        """``svc``'s KV pool is now ``lease`` (None: none)."""
        svc.kv_lease = lease
        svc.kv_pool = lease.nbytes if lease is not None else 0

    def hold_for_realtime(self, req: RequestState) -> None:
        """``req`` (of a steady service) waits while realtime work runs on its shared
        compute: counted once per request on its service, as is its skip if its
        deadline passes so."""
        if not req.held_for_realtime:
            req.held_for_realtime = True
            self.world.services[req.service].held_for_realtime += 1

    def age(self, req: RequestState, *, detail: str) -> None:
        """``req`` waited past its ageing point: room may now be made for it at a higher
        rank (``RoomFor.aged``). Everything on its device is decided afresh."""
        if req.aged:
            return
        req.aged = True
        w = self.world
        w.version += 1
        self._explain(req, f"aged: {detail}")
        device = w.services[req.service].spec.device
        self.touch(device)
        w.queue_epochs[(device, req.cls)] += 1

    def mark_announced(self, req: RequestState) -> None:
        """The policy has considered ``req``: its queue's bound no longer refuses it."""
        if not req.announced:
            req.announced = True
            w = self.world
            if req.request_id in w.waiting:
                w.queue_epochs[(w.services[req.service].spec.device, req.cls)] += 1

    def request_admin_unload(self, name: str) -> None:
        """The operator asked to unload ``name``: the policy does it once it is idle."""
        self.world.admin_unload.add(name)

    def clear_admin_unload(self, name: str) -> None:
        """The operator's unload is done, or no longer wanted (a later pin or load)."""
        self.world.admin_unload.discard(name)

    def observe_failure(self, svc: ServiceState, estimated_active: int, lease_bytes: int) -> None:
        """A request of ``svc`` was in flight when it crashed: raise its calibration."""
        self._note("calibration", svc)
        svc.calibration.observe_failure(estimated_active, lease_bytes)
        self._calibrated(svc)

    def observe_request_failure(
        self, svc: ServiceState, estimated_active: int, asked_active: int
    ) -> None:
        """A request of ``svc`` ran out of memory asking ``asked_active`` bytes of
        activations, more than it was granted: its calibration learns them."""
        self._note("calibration", svc)
        svc.calibration.observe_request_failure(estimated_active, asked_active)
        self._calibrated(svc)

    def note_oom(self, svc: ServiceState, words: str) -> None:
        """The attribution of ``svc``'s last out-of-memory failure, in words."""
        self._note("oom_attributed", svc)
        self.world.learned.oom[svc.name] = words

    def observe_excess(
        self, svc: ServiceState, estimated_active: int, measured_active: int
    ) -> None:
        """``svc``'s running requests were measured above their leases."""
        self._note("calibration", svc)
        svc.calibration.observe_excess(estimated_active, measured_active)
        self._calibrated(svc)

    def _calibrated(self, svc: ServiceState) -> None:
        """``svc``'s calibration changed: what a load reads on the device of every service
        of its model (replicas share one calibration) changed."""
        for device in self.world.model_devices[svc.spec.addressed_as]:
            self.touch(device)

    def see_crashes(self, svc: ServiceState) -> bool:
        """Note ``svc``'s crash count as seen: whether it changed since last seen."""
        return self.world.learned.see_crashes(svc.name, svc.crashes)

    def charge(self, svc: ServiceState, nbytes: int) -> None:
        """``svc`` was measured ``nbytes`` above its leases: charge them to it."""
        self._note("charged", svc)
        self.world.learned.charge(svc.name, nbytes)

    def clear_charge(self, svc: ServiceState) -> bool:
        """``svc`` is measured within its leases again: whether it was charged."""
        self._note("charge_cleared", svc)
        return self.world.learned.clear_charge(svc.name)

    def raise_high_water(self, svc: ServiceState, measured: int) -> int:
        """``svc``'s activation memory was measured at ``measured``: its highest
        measurement before (0: none)."""
        return self.world.learned.raise_high_water(svc.name, measured)

    def forget_activation(self, svc: ServiceState) -> None:
        """``svc`` holds no memory: forget its high water and its charge."""
        self.world.learned.forget_activation(svc.name)

    def note_realtime_activation(self, svc: ServiceState, active: int) -> None:
        """A request of realtime ``svc`` is about to run with ``active`` bytes projected."""
        self._note("realtime_peak", svc)
        self.world.learned.raise_realtime_peak(svc.name, active)

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

    def _hand_over_weights(self, svc: ServiceState) -> None:
        """``svc`` lets go of the weights copy others share: the first of them that still
        holds memory is charged it from now on (the copy stays loaded for it)."""
        w = self.world
        sharers = [w.services[n] for n in w.weights_sharers(svc)]
        if not sharers:
            return
        weights = [le for le in svc.resident_leases if le.category is Category.WEIGHTS]
        nbytes = sum(le.nbytes for le in weights)
        heir = sharers[0]
        lease = w.ledger.reserve(
            heir.spec.device, heir.name, Category.WEIGHTS, nbytes, enforce=False
        )
        if lease is not None:
            heir.resident_leases.append(lease)
        heir.weights_shared_by = None
        for other in sharers[1:]:
            other.weights_shared_by = heir.name

    def release_service(self, svc: ServiceState) -> None:
        """Drop every byte a service holds (after Unloaded, LoadFailed or a crash)."""
        w = self.world
        self._hand_over_weights(svc)
        svc.weights_shared_by = None
        for le in svc.resident_leases:
            w.ledger.release(le)
        svc.resident_leases = []
        if svc.kv_lease is not None:
            w.ledger.release(svc.kv_lease)
            self._hold_kv(svc, None)
        w.ledger.drop_service(svc.spec.device, svc.name)
        svc.resize_target = None
        svc.resize_from = None
        svc.resize_refused = False  # the next load may resize live again
        svc.load_excess = 0
        svc.measured_bytes = None
        svc.over_limit = False
        self._reindex(svc)

    # ---- the Manager's bookkeeping of events -------------------------------------
    def advance(self, now: float) -> None:
        """Time is ``now`` (it never goes back: the Manager checks); backoffs that ended
        leave ``backing_off``."""
        w = self.world
        w.now = now
        if w.backing_off:
            for svc in w.backing_off:
                if svc.backoff_until <= now:
                    w.backing_off.discard(svc)

    def shut_down(self) -> None:
        """accelmux is shutting down: every waiting request is refused."""
        w = self.world
        w.shutting_down = True
        for req in list(w.waiting.values()):
            self.reject(
                req,
                reason=Reason.SHUTTING_DOWN,
                retry_after_s=30.0,
                detail="accelmux is shutting down",
            )

    def arrive(self, req: RequestState, keep_alive_s: float | None) -> None:
        """A new request waits at the end of its queue; its service's reuse rate rises."""
        w = self.world
        svc = w.services[req.service]
        self.add_waiting(req)
        # The operator's pin (or load) wins over a client's keep_alive, which is not kept
        # for after the unpin either: then the service's ttl_s applies again.
        kept = svc.pinned or svc.admin_wants_loaded
        keep_alive = None if kept else keep_alive_s
        if keep_alive != svc.keep_alive_s and svc in w.idle_up:
            w.idle_up.touch()  # its TTL changes
            w.idle_up_by_device[svc.spec.device].touch()
        svc.keep_alive_s = keep_alive
        horizon = w.knobs.reuse_horizon_s
        svc.rate = svc.rate * math.exp(-max(0.0, w.now - svc.rate_at) / horizon) + 1.0 / horizon
        svc.rate_at = w.now
        if w.shutting_down:
            self.reject(
                req,
                reason=Reason.SHUTTING_DOWN,
                retry_after_s=30.0,
                detail="accelmux is shutting down",
            )

    def request_done(self, req: RequestState, peak_bytes: int | None, error: str | None) -> None:
        """``req`` ended after dispatch: its peak calibrates its service (when its backend
        reports peaks), its time the service's mean; ``error`` (not None): it failed."""
        w = self.world
        svc = w.services[req.service]
        if peak_bytes is not None and svc.spec.capabilities.request_peaks:
            svc.calibration.observe_request(req.estimate, peak_bytes)
            self._calibrated(svc)
        if req.dispatched_at is not None:
            took = max(0.0, w.now - req.dispatched_at)
            svc.mean_service_s = 0.8 * svc.mean_service_s + 0.2 * took
        svc.served += 1
        svc.last_used = w.now
        self.finish(req)
        if error is not None:
            self.record(
                Fail(
                    request_id=req.request_id,
                    service=req.service,
                    reason=Reason.BACKEND_CRASHED,
                    detail=error,
                )
            )

    def load_failed(
        self,
        svc: ServiceState,
        *,
        out_of_memory: bool,
        error: str,
        asked: int | None = None,
        used_besides: int | None = None,
    ) -> None:
        """``svc``'s load failed: it is down (crashed, backing off) and its queue refused.
        Out of memory, the failure is attributed first (:func:`attribute`: ``asked``, the
        bytes the load tried to hold, and ``used_besides``, what the device held besides
        it, as the shell measured them), and only a load that exceeded its own estimate
        teaches its service a size (:meth:`learn_size`)."""
        w = self.world
        if out_of_memory:
            w.load_oom_devices.add(svc.spec.device)
        if out_of_memory and w.knobs.switches.failure_calibration:
            dev = w.devices[svc.spec.device]
            pool = svc.kv_pool
            report = attribute(
                asked=asked,
                granted=sum(le.nbytes for le in svc.resident_leases) + pool,
                used_besides=used_besides,
                capacity=dev.capacity_bytes,
                ceiling=dev.usable_bytes,
            )
            self.learn_size(svc, report, pool)
            self._calibrated(svc)
        self.release_service(svc)
        self.set_status(svc, ServiceStatus.CRASHED)
        self.back_off(svc)
        for req in list(svc.queue.values()):
            self.reject(
                req,
                reason=Reason.LOAD_FAILED,
                retry_after_s=max(1.0, svc.backoff_until - w.now),
                detail=error,
            )

    def learn_size(self, svc: ServiceState, report: OomReport, pool: int) -> None:
        """Note the attribution of ``svc``'s out-of-memory load; when it is its own, its
        loads are projected at least at the size learned (less the KV ``pool`` the load
        asked for) until it is re-tested, later with each failure in a row."""
        w = self.world
        self.note_oom(svc, f"{report.cause.value}: {report.evidence}")
        if report.learned is None:
            return
        resident = max(0, report.learned - pool)
        before = w.learned.sizes.get(svc.name)
        failures = before.failures + 1 if before is not None else 1
        w.learned.sizes[svc.name] = LearnedSize(
            nbytes=resident,
            evidence=report.evidence,
            at=w.now,
            retest_at=math.inf if report.measured else w.now + retest_after(failures),
            failures=failures,
        )
        svc.calibration.set_resident_floor(resident)
        p = svc.spec.profile
        svc.calibration.observe_load_failure(p.weights + p.runtime, resident)
        self._calibrated(svc)

    def start_retest(self, svc: ServiceState) -> None:
        """``svc``'s learned size is due for its re-test: the next load is projected as
        measured before it (one admission; a failure learns it again, a success drops it)."""
        learned = self.world.learned
        size = learned.sizes[svc.name]
        self._note("retest", svc)
        learned.sizes[svc.name] = LearnedSize(
            nbytes=size.nbytes,
            evidence=size.evidence,
            at=size.at,
            retest_at=size.retest_at,
            failures=size.failures,
            testing=True,
        )
        svc.calibration.set_resident_floor(0)
        self._calibrated(svc)

    def load_done(self, svc: ServiceState, reported: Mapping[Category, int]) -> None:
        """``svc``'s load finished; ``reported``: its weights and runtime bytes as its
        backend reported them (empty: none; a category it did not report counts at its
        estimate)."""
        w = self.world
        self.set_status(svc, ServiceStatus.LOADED)
        svc.loaded_at = w.now
        if svc.loading_since is not None:
            self.observe_load_seconds(svc, w.now - svc.loading_since)
        svc.consecutive_failures = 0
        svc.resize_refused = False  # a refusal was about the previous load
        self._reindex(svc)
        if svc.load_reason in (Reason.DEMAND, Reason.RELOAD_AFTER_CRASH, Reason.DEGRADED):
            svc.cold_starts += 1
        svc.last_used = max(svc.last_used, w.now)
        measured: int | None = None
        if reported:
            p = svc.spec.profile
            measured = reported.get(Category.WEIGHTS, p.weights) + reported.get(
                Category.RUNTIME, p.runtime
            )
            svc.calibration.observe_load(p.weights + p.runtime, measured)
            self._calibrated(svc)
            granted = sum(le.nbytes for le in svc.resident_leases)
            svc.load_excess = max(0, measured - granted)
            if measured < granted:
                self._settle_resident(svc, granted - measured, reported)
        size = w.learned.sizes.get(svc.name)
        if size is not None and (size.testing or measured is not None):
            # Measured now, or loaded at the size it was re-tested at: what was learned
            # from the failure has served its turn.
            del w.learned.sizes[svc.name]
            svc.calibration.set_resident_floor(0)
            self._note("relearned", svc)
            self._calibrated(svc)

    def _settle_resident(
        self, svc: ServiceState, surplus: int, measured: Mapping[Category, int]
    ) -> None:
        """``svc`` loaded into ``surplus`` bytes less than its resident leases (the
        calibrated projection with its margin): they shrink by that much, as memory
        measured above them is charged to it. The cut falls on each category by how far
        its leases exceed what the backend ``measured`` of it (runtime's own weights, a
        GGUF's tensors, stay as reported); without a split, on each by its size. The
        margin was for the load; what the service grows afterwards is measured like any
        other memory (``reserved``)."""
        held: dict[Category, int] = {}
        for le in svc.resident_leases:
            held[le.category] = held.get(le.category, 0) + le.nbytes
        over = {c: max(0, n - measured[c]) if c in measured else n for c, n in held.items()}
        total = sum(over.values())
        if total <= 0:
            return
        cut = {c: surplus * o // total for c, o in over.items()}
        w = self.world
        device = svc.spec.device
        settled = []
        for le in svc.resident_leases:
            take = min(le.nbytes, cut.get(le.category, 0))
            if take <= 0:
                settled.append(le)
                continue
            cut[le.category] -= take
            w.ledger.release(le)
            lease = w.ledger.reserve(device, svc.name, le.category, le.nbytes - take, enforce=False)
            if lease is not None:
                settled.append(lease)
        svc.resident_leases = settled

    def unloaded(self, svc: ServiceState) -> None:
        """``svc``'s backend confirmed its unload: every byte it held comes back."""
        self.release_service(svc)
        self.set_status(svc, ServiceStatus.UNLOADED)
        svc.loaded_at = None

    def crashed(
        self, svc: ServiceState, *, reason: Reason, error: str, oom: CrashOom | None = None
    ) -> None:
        """``svc``'s backend died: its running requests fail, its paused ones end, its
        memory and host copy are released, and it backs off before a restart. ``oom``:
        a request ran out of memory, as the shell measured it (``CrashOom``)."""
        self.note_crash(svc)
        svc.crash_oom = oom
        for req in list(svc.inflight.values()):
            self.fail(req, reason=reason, detail=error)
        for req in [r for r in svc.queue.values() if r.paused]:
            # Its saved state lived in the backend that died.
            self.end_paused(req, ok=False, reason=reason, detail=error)
        self.drop_host_copy(svc, reason=reason)
        if svc.holds_memory:
            self.release_service(svc)
        self.set_status(svc, ServiceStatus.CRASHED)
        svc.crashes += 1
        svc.loaded_at = None
        self.back_off(svc)

    def back_off(self, svc: ServiceState) -> None:
        """One more failure of ``svc`` in a row: its restart waits twice as long."""
        w = self.world
        svc.consecutive_failures += 1
        delay = min(
            w.knobs.crash_backoff_max_s,
            w.knobs.crash_backoff_s * (2 ** (svc.consecutive_failures - 1)),
        )
        svc.backoff_until = w.now + delay
        w.backing_off.update(svc, svc.backoff_until > w.now)

    def reconcile(self, event: MemorySampled) -> None:
        """Measured memory replaces guesses: foreign usage, per-service reserved, and
        the leftover of services that are not loaded.

        Every measured byte is charged somewhere: a loaded service's bytes to its
        leases, the rest of them to its ``reserved``; a service that is not loaded to
        what the park budget holds of it (on the host device), the rest to its
        ``leftover`` until a sample shows it gone; whatever no service accounts for
        (less the device's baseline) to ``foreign``."""
        w = self.world
        device = event.device
        if device not in w.devices:
            return
        ledger = w.ledger
        on_host = device == w.park_device
        managed = 0
        seen: set[str] = set()
        for name, measured in event.per_service.items():
            svc = w.services.get(name)
            if svc is None or svc.spec.device != device:
                continue
            managed += measured
            seen.add(name)
            svc.measured_bytes = measured
            parked = w.parked_of(svc) if on_host else 0
            if not svc.holds_memory:
                ledger.set_leftover(device, name, measured - parked)
                continue
            accounted = sum(
                ledger.amount(device, name, c)
                for c in (Category.WEIGHTS, Category.RUNTIME, Category.KV, Category.ACTIVE)
            )
            ledger.set_reserved(device, name, measured - parked - accounted)
            p = svc.spec.profile
            per_request = max(p.workspace, svc.peak_active_bytes)
            ceiling = p.weights + p.runtime + p.kv_ceiling + svc.spec.concurrency * per_request
            svc.over_limit = measured > max(accounted, ceiling) * 1.5
            if svc.over_limit and svc.idle and svc.is_up:
                # Idle, what it holds is its resident size: the next load is sized by it.
                svc.calibration.observe_load(p.weights + p.runtime, measured - svc.kv_pool)
                self._calibrated(svc)
        for name in ledger.leftovers(device):
            if name not in seen:  # not measured any more: gone
                ledger.set_leftover(device, name, 0)
        ledger.set_overhead(device, event.overhead_bytes)
        ledger.set_foreign(
            device,
            event.used_bytes - managed - event.baseline_bytes - event.overhead_bytes,
        )
        w.sampled_at[device] = w.now


def _pool_to_load(svc: ServiceState, kv_pool: int | None) -> int:
    """The KV pool a load of ``svc`` asks for when a policy asks for ``kv_pool`` (None:
    its floor): a backend that cannot resize holds its ceiling, a sleeping server wakes
    with the pool it started with."""
    pool = svc.spec.profile.kv_floor if kv_pool is None else kv_pool
    if svc.spec.capabilities.resize is ResizeSupport.NONE:
        pool = svc.spec.profile.kv_ceiling  # what the backend is configured to hold
    if svc.tier is Tier.SLEEPING and svc.slept_pool is not None:
        pool = svc.slept_pool  # a sleeping server wakes with the sizes it started with
    return pool
