"""Which services stay loaded: TTLs (and keeping idle services past them while memory is
spare), pinned and admin-loaded services, restores of evicted warm services, prewarming,
admin unloads and ballooning idle KV pools.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.policies.accelmux.loading import Loading
from accelmux.core.policies.accelmux.records import RoomFor, Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.policies.accelmux.routing import Routing
from accelmux.core.types import Reason, Residency, ServiceClass, ServiceStatus
from accelmux.core.world import ServiceState, reuse_rate

#: The TTL range of a service idle keeping never unloads.
_NO_TTL = (math.inf, math.inf)


@dataclass(frozen=True, slots=True)
class DeviceTtls:
    """The TTLs of the services of a device whose TTL runs (``Residents.device_ttls``):
    the time before which none of them can run out, the end of each TTL that does not
    depend on a pending restore (sorted, finite), and the services whose TTL does."""

    check_at: float
    ends: list[float]
    unsure: list[ServiceState]


class Residents:
    """Which services stay loaded, and which load with no request for them."""

    def __init__(
        self, seam: Seam, room: Room, reserve: Reserve, loading: Loading, routing: Routing
    ) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        self.room = room
        self.reserve = reserve
        self.loading = loading
        self.routing = routing
        #: When a restore of each service last evicted others to make its room.
        self.restore_tried_at: dict[str, float] = {}

    def preload_warm(self) -> None:
        """At start, load warm services (class order) into memory nobody else needs yet."""
        order = sorted(self.view.services.values(), key=lambda s: (int(s.spec.cls), s.name))
        for svc in order:
            if (
                svc.status is not ServiceStatus.UNLOADED
                or svc.spec.residency is not Residency.WARM
                or not svc.spec.in_window(self.view.time_of_day())
                or not self.routing.placed_here(svc)
            ):
                continue
            dev = svc.spec.device
            pool = self.loading.load_pool(svc, svc.spec.profile.kv_floor)
            need = sum(self.view.projected_resident(svc, pool))
            if need + self.reserve.realtime_reserve(dev) <= self.view.ledger.available(dev):
                self.ops.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="warm at start")

    def ttl(self, svc: ServiceState) -> float:
        short, ttl = self.ttl_range(svc)
        if short < ttl and self.restore_pending(svc):
            return short
        return ttl

    def ttl_range(self, svc: ServiceState) -> tuple[float, float]:
        """(the TTL if a restore is pending, the TTL if not) of ``svc``, without asking
        whether one is (:meth:`Residents.restore_pending` is the costly part of a TTL).

        Asked by the TTL expiry and again by the next wake-up: kept while no action runs
        (what it reads, the device's memory and the service's keep-alive, changes only
        through one or an event), for the round only (a new round drops it).

        A realtime service kept warm with no client's keep-alive has no TTL while idle
        keeping is on (:meth:`memory_spare` is always true for it): said at once."""
        spec = svc.spec
        if (
            spec.cls is ServiceClass.REALTIME
            and spec.residency is not Residency.ON_DEMAND
            and svc.keep_alive_s is None
            and self.view.knobs.switches.idle_keep
        ):
            return _NO_TTL
        version = self.view.version
        hit = self.cache.ttl_range.entries.get(svc.name)
        if hit is not None and hit[0] == version:
            return hit[1]
        return self.cache.ttl_range.put(svc.name, version, self._ttl_range(svc))

    def _ttl_range(self, svc: ServiceState) -> tuple[float, float]:
        knobs = self.view.knobs
        if svc.spec.residency is Residency.ON_DEMAND:
            ttl = svc.ttl_s
            if not knobs.switches.on_demand_keep or self.memory_wanted(svc):
                ttl = min(ttl, knobs.on_demand_ttl_s)
            elif knobs.switches.idle_keep and self.memory_spare(svc):
                ttl = math.inf
            if knobs.prewarm and knobs.switches.restore:
                return min(ttl, TUNING.restore_grace_s), ttl
            return ttl, ttl
        if knobs.switches.idle_keep and self.memory_spare(svc):
            return math.inf, math.inf
        return svc.ttl_s, svc.ttl_s

    def idle_past_ttl(self, svc: ServiceState) -> bool:
        """``self.view.now - svc.last_used >= self.ttl(svc)``, asking whether a
        restore is pending only when the answer depends on it, and its TTL only when it
        could be reached: no TTL is below the service's TTL floor (``ttl_range``: its own
        TTL, for an on-demand service the on-demand TTL and the restore grace too)."""
        idle_s = self.view.now - svc.last_used
        if not self.cache.enabled:  # the TTL itself, with no shortcut
            return idle_s >= self.ttl(svc)
        if idle_s < facts.ttl_floor(self.view, svc):
            return False
        short, ttl = self.ttl_range(svc)
        if idle_s >= ttl:
            return True
        if idle_s < short:
            return False
        return self.restore_pending(svc)

    def memory_wanted(self, svc: ServiceState) -> bool:
        """Whether memory an idle on-demand service holds is wanted by something else.

        It is while a request waits for memory on its device, or when less than the
        realtime reserve is free (a voice request then finds its room without an
        eviction first).
        Work held back for a higher class (``higher_class_waiting``) does not want it:
        it waits for compute, or for a higher class's request that itself waits for
        memory (and counts here).
        """
        return self.device_wanted(svc.spec.device)

    def device_wanted(self, dev: str) -> bool:
        """:meth:`memory_wanted` of the services of ``dev`` (the same for each)."""
        version = self.view.version
        hit = self.cache.memory_wanted.get(dev, version)
        if hit is not Miss.MISS:
            return hit
        causes = self.view.waiting_causes  # waiting requests per (device, class, wait reason)
        wanted = any(
            causes.get((dev, cls, Reason.NO_MEMORY)) for cls in ServiceClass
        ) or self.view.ledger.available(dev) < self.reserve.realtime_reserve(dev)
        return self.cache.memory_wanted.put(dev, version, wanted)

    def memory_spare(self, svc: ServiceState) -> bool:
        """Whether ``svc``'s device has memory to spare: nothing wants what is loaded
        (:meth:`Residents.memory_wanted`) and more than the realtime reserve plus the spare
        fraction of the budget is free (room for a foreign process to start).

        While it has, an idle service stays loaded past its TTL (``idle_keep``): memory
        nobody wants is worth more holding a model than empty, and it is given back the
        moment it is wanted (eviction by score, or the TTL once less is spare). A realtime
        service's memory is spare unless realtime work waits for memory on its device (a
        voice cold start is what the reserve exists to prevent, and no lower class may
        take a voice model's memory), and a service whose client gave a keep_alive has
        exactly that (never "spare")."""
        if svc.keep_alive_s is not None:
            return False  # a client's keep_alive is kept to the second
        if svc.spec.cls is ServiceClass.REALTIME:
            # Lower classes never take a voice service's memory (they cannot evict it
            # either), and realtime work waiting for memory evicts what it needs itself,
            # lower classes first (make_room): a TTL on top of that would also unload
            # the next steps of the voice chain that is waiting.
            return True
        return self.device_level(svc.spec.device) == 2

    def device_level(self, dev: str) -> int:
        """How much memory ``dev`` has to spare: 0, it is wanted (:meth:`memory_wanted`); 1,
        not wanted, but less than the realtime reserve and the spare fraction is free; 2,
        spare (:meth:`memory_spare` of a service with neither a keep_alive nor a
        realtime class). The same for every service there."""
        version = self.view.version
        level = self.cache.memory_spare.get(dev, version)
        if level is Miss.MISS:
            level = 0
            if not self.device_wanted(dev):
                spare = self.view.knobs.spare_fraction * self.view.devices[dev].usable_bytes
                free = self.view.ledger.available(dev) - self.reserve.realtime_reserve(dev)
                level = 2 if free >= spare else 1
            self.cache.memory_spare.put(dev, version, level)
        return level

    def restore_pending(self, holder: ServiceState) -> bool:
        """A warm service evicted for memory on ``holder``'s device, of a class at least
        as high as ``holder``'s, is likely to be used again, sooner than ``holder`` (an
        on-demand service used more often than what it displaced keeps its place), and
        would fit once ``holder`` is gone (no service is unloaded for a restore that
        cannot happen).

        Asked by the TTL expiry and again by the next wake-up: kept until anything
        changes (an action) or time passes, and for the round only (a new round drops it).
        """
        stamp = (self.view.version, self.view.now)
        hit = self.cache.restores.get(holder.name, stamp)
        if hit is not Miss.MISS:
            return hit
        return self.cache.restores.put(holder.name, stamp, self.compute_restore_pending(holder))

    def compute_restore_pending(self, holder: ServiceState) -> bool:
        horizon = self.view.knobs.reuse_horizon_s
        own = reuse_rate(holder, self.view.now, horizon)
        dev = holder.spec.device
        room = self.view.ledger.available(dev) + facts.unload_frees(self.view, holder)
        version = self.view.version
        for candidate in self.restorable(dev):
            s, rate, need, computed_at = candidate
            if s.spec.cls <= holder.spec.cls and rate > own:
                if computed_at != version:  # the need reads the ledger and the reserve
                    pool = self.loading.load_pool(s, s.spec.profile.kv_floor)
                    need = candidate[2] = self.restore_need(s, pool)
                    candidate[3] = version
                if need <= room:
                    return True
        return False

    def restorable(self, device: str) -> list[list[Any]]:
        """The warm services evicted from ``device`` that are likely to be used again, in
        spec order, as ``[service, reuse rate, restore need, the self.view.version it was
        computed at (None: not yet)]``.

        What every holder's :meth:`Residents.restore_pending` asks about them: kept while the
        evicted services stay the same and time does not pass, for the round only
        (a new round drops it; reuse rates change only with arrivals, between rounds).
        """
        stamp = (self.view.evicted_out.version, self.view.now)
        hit = self.cache.restorable.get(device, stamp)
        if hit is not Miss.MISS:
            return hit
        horizon = self.view.knobs.reuse_horizon_s
        found: list[list[Any]] = []
        # The warm services of ``device`` among those evicted and unloaded since, in spec
        # order (evicted_out's): that set is the smaller one to walk.
        for s in self.view.evicted_out:
            if s.spec.device == device and s.spec.residency is Residency.WARM:
                rate = reuse_rate(s, self.view.now, horizon)
                if 1.0 - math.exp(-rate * horizon) >= 0.5:  # _likely_reused
                    found.append([s, rate, 0, None])
        return self.cache.restorable.put(device, stamp, found)

    def evicted_warm(self) -> list[ServiceState]:
        """The warm services evicted and unloaded since (``WorldView.evicted_out``), in class
        order then by name, kept while that set stays the same (its ``version``)."""
        evicted = self.view.evicted_out
        hit = self.cache.evicted_warm.get(None, evicted.version)
        if hit is not Miss.MISS:
            return hit
        found = [s for s in self.warm_in_class_order() if s in evicted]
        return self.cache.evicted_warm.put(None, evicted.version, found)

    def warm_in_class_order(self) -> list[ServiceState]:
        """Every warm service, in class order then by name (what the spec says)."""
        hit = self.cache.warm_in_class_order.get(None, None)
        if hit is not Miss.MISS:
            return hit
        warm = [s for s in self.view.services.values() if s.spec.residency is Residency.WARM]
        ordered = sorted(warm, key=lambda s: (int(s.spec.cls), s.name))
        return self.cache.warm_in_class_order.put(None, None, ordered)

    def restore_need(self, svc: ServiceState, pool: int) -> int:
        """Free memory a prewarm of ``svc`` with a KV pool of ``pool`` needs: its resident
        size, plus the realtime reserve and a tenth of the budget left free after it
        (memory measured only at the next sample, e.g. an allocator's cache)."""
        dev = svc.spec.device
        spare = self.reserve.realtime_reserve(dev) + self.view.devices[dev].usable_bytes // 10
        return sum(self.view.projected_resident(svc, pool)) + spare

    def admin_unloads(self) -> None:
        for name in sorted(self.view.admin_unload):
            svc = self.view.services[name]
            if (
                svc.status is ServiceStatus.LOADED
                and svc.idle
                # a stream paused there whose state is not parked yet still needs it
                and not any(r.paused and not r.parked for r in svc.queue.values())
            ):
                self.ops.unload(svc, reason=Reason.ADMIN, detail="operator asked")
                self.ops.clear_admin_unload(name)
            elif svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
                # Already out (an eviction may have beaten the command): the operator's
                # word stands, so a prewarm must not bring it back as "evicted".
                self.ops.forget_eviction(svc)
                self.ops.clear_admin_unload(name)

    def keep_pinned_loaded(self) -> None:
        down = (
            s
            for s in self.view.kept
            if facts.keep(s) and s.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)
        )
        for svc in sorted(down, key=lambda s: (int(s.spec.cls), s.name)):
            if not facts.keep(svc) or svc.status not in (
                ServiceStatus.UNLOADED,
                ServiceStatus.CRASHED,
            ):
                continue
            if (
                self.view.now < svc.backoff_until
                or self.view.shutting_down
                or self.loading.loads_one_at_a_time(svc.spec.device)
                or self.yielded_to_realtime(svc)
            ):
                continue
            reason = (
                Reason.RELOAD_AFTER_CRASH
                if svc.status is ServiceStatus.CRASHED
                else Reason.ADMIN
                if svc.admin_wants_loaded and not svc.pinned
                else Reason.PINNED
            )
            pool = self.loading.load_pool(svc, svc.spec.profile.kv_floor)
            need = sum(self.view.projected_resident(svc, pool))
            if self.room.make_room(svc.spec.device, need, RoomFor(svc.spec.cls, svc, reason)):
                self.ops.load(svc, reason=reason, kv_pool=pool)

    def yielded_to_realtime(self, svc: ServiceState) -> bool:
        """Whether ``svc``, a pinned service evicted for a realtime request's room
        (``Room.unpins``: only such room evicts a pinned service), stays out while a
        realtime request still waits on its device: its restore would take back the
        memory the request is about to run in."""
        if not (svc.pinned and svc.last_evicted_at is not None):
            return False
        return self.view.waiting_classes.get((svc.spec.device, ServiceClass.REALTIME), 0) > 0

    def expire_idle(self) -> None:
        """Unload the services idle past their TTL (spec order).

        With the cache on, only the services whose TTL runs (``idle_up``) are asked, and of
        them only those on a device where one could have run out by now
        (:meth:`device_ttls`), until a service is unloaded: from then on every one is
        asked (an unload may change what another device has to spare)."""
        view = self.view
        now = view.now
        if not self.cache.enabled:
            candidates: Iterable[ServiceState] = view.loaded
            due: dict[str, bool] | None = None
        else:
            candidates = view.idle_up
            # each device's answer, found up front: none due, nothing to walk
            due = {
                dev: now >= self.device_ttls(dev).check_at
                for dev in view.devices
                if len(view.idle_up_on(dev))
            }
            if not any(due.values()):
                return
        for svc in candidates:
            if due is not None:
                dev = svc.spec.device
                if dev not in due:
                    due[dev] = now >= self.device_ttls(dev).check_at
                if not due[dev]:
                    continue
            if (
                svc.status is ServiceStatus.LOADED
                and svc.idle
                and svc.waiting_count == 0
                and not facts.keep(svc)
                and self.idle_past_ttl(svc)
            ):
                self.room.unload(
                    svc,
                    reason=Reason.TTL_EXPIRED,
                    detail=f"idle {now - svc.last_used:.0f}s",
                )
                due = None

    def device_ttls(self, dev: str) -> DeviceTtls:
        """The TTLs of the services on ``dev`` whose TTL runs (``idle_up``), kept while
        those services, their keep_alives and what the device has to spare stay the same
        (what their TTL ranges read: :meth:`ttl_range`)."""
        idle = self.view.idle_up_on(dev)
        stamp = (idle.version, self.device_level(dev))
        hit = self.cache.device_ttls.get(dev, stamp)
        if hit is not Miss.MISS:
            return cast(DeviceTtls, hit)
        check_at = math.inf
        ends: list[float] = []
        unsure: list[ServiceState] = []
        for svc in idle:
            short, ttl = self.ttl_range(svc)
            # a TTL runs out no earlier than the shorter end (a millisecond early: the
            # expiry compares the idle time, a difference of floats)
            check_at = min(check_at, svc.last_used + short - 1e-3)
            if short < ttl:
                unsure.append(svc)
            elif math.isfinite(ttl):
                ends.append(svc.last_used + ttl)
        ends.sort()
        found = DeviceTtls(check_at, ends, unsure)
        self.cache.device_ttls.put(dev, stamp, found)
        return found

    def balloon(self) -> None:
        view = self.view
        # With the cache on, the pools that can shrink now (the same services in the same
        # order: the index of those the walk below does not pass over).
        for svc in view.balloonable if self.cache.enabled else view.loaded:
            if svc.kv_pool <= svc.spec.profile.kv_floor or not self.view.resizable(svc):
                continue
            if (
                svc.waiting_count == 0
                and self.view.now - svc.last_used >= self.view.knobs.balloon_idle_s
            ):
                target = max(svc.spec.profile.kv_floor, svc.kv_in_use)
                if target < svc.kv_pool:
                    self.ops.resize(svc, target, reason=Reason.BALLOON_SHRINK, detail="idle pool")

    def prewarm(self) -> None:
        """WarmServe-style: reload a recently evicted, likely-reused service into spare memory."""
        horizon = self.view.knobs.reuse_horizon_s
        if self.view.waiting_for(Reason.NO_MEMORY):
            return  # memory goes to waiting requests first
        for svc in self.evicted_warm():
            if (
                svc.status is not ServiceStatus.UNLOADED
                or svc.spec.residency is not Residency.WARM
                or svc.last_evicted_at is None
                or self.view.now < svc.backoff_until
                or not svc.spec.in_window(self.view.time_of_day())
                or facts.other_replica_up(self.view, svc)
                or facts.form_rank(svc) > 0
                or self.loading.loads_one_at_a_time(svc.spec.device)
            ):
                continue
            if 1.0 - math.exp(-reuse_rate(svc, self.view.now, horizon) * horizon) < 0.5:
                continue
            dev = svc.spec.device
            pool = self.loading.load_pool(svc, svc.spec.profile.kv_floor)
            # Restoring what was evicted for a short on-demand job returns the device to
            # its steady state: it leaves the realtime reserve and a tenth of the budget
            # free (see _restore_need).
            need_with_spare = self.restore_need(svc, pool)
            fits = self.view.ledger.available(dev) >= need_with_spare
            tried = self.restore_tried_at.get(svc.name)
            if tried is not None and self.view.now - tried < TUNING.restore_retry_s:
                pass  # the room it made went to demand: do not evict for it again yet
            elif (
                not fits and svc.spec.cls < ServiceClass.BATCH and self.view.knobs.switches.restore
            ):
                # An interactive service outranks batch and background work: take its
                # memory back from them (they are preempted or evicted) to restore it.
                # Only strictly lower classes yield: two services of one class that cannot
                # both fit must never restore each other in turn (a load/unload loop).
                fits = self.room.make_room(
                    dev, need_with_spare, RoomFor(svc.spec.cls, svc, Reason.PRELOAD, strict=True)
                )
                if not fits and self.view.ledger.available(dev) + self.room.pending_free(dev) >= (
                    need_with_spare
                ):
                    self.restore_tried_at[svc.name] = self.view.now
            if fits:
                self.ops.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="likely reused soon")
                self.ops.forget_eviction(svc)
