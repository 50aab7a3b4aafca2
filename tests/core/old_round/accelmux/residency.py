"""Which services stay loaded: TTLs (and keeping idle services past them while memory is
spare), pinned and admin-loaded services, restores of evicted warm services, prewarming,
admin unloads and ballooning idle KV pools.
"""

from __future__ import annotations

import math
from typing import Any

from accelmux.core.types import (
    Reason,
    Residency,
    ServiceClass,
    ServiceStatus,
)

from .heuristics import TUNING
from .interface import Parts
from .state import ServiceState, World, reuse_rate


def preload_warm(self: Parts, world: World) -> None:
    """At start, load warm services (class order) into memory nobody else needs yet."""
    order = sorted(world.services.values(), key=lambda s: (int(s.spec.cls), s.name))
    for svc in order:
        if (
            svc.status is not ServiceStatus.UNLOADED
            or svc.spec.residency is not Residency.WARM
            or not svc.spec.in_window(world.time_of_day())
            or not self._placed_here(world, svc)
        ):
            continue
        dev = svc.spec.device
        pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
        need = sum(world.projected_resident(svc, pool))
        if need + self._realtime_reserve(world, dev) <= world.ledger.available(dev):
            world.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="warm at start")


def keep(svc: ServiceState) -> bool:
    return svc.pinned or svc.admin_wants_loaded


def ttl(self: Parts, world: World, svc: ServiceState) -> float:
    short, ttl = self._ttl_range(world, svc)
    if short < ttl and self._restore_pending(world, svc):
        return short
    return ttl


def ttl_range(self: Parts, world: World, svc: ServiceState) -> tuple[float, float]:
    """(the TTL if a restore is pending, the TTL if not) of ``svc``, without asking
    whether one is (:meth:`_restore_pending` is the costly part of a TTL).

    Asked by the TTL expiry and again by the next wake-up: kept while no action runs
    (what it reads, the device's memory and the service's keep-alive, changes only
    through one or an event), for the round only (decide clears it)."""
    version = world.version
    hit = self._ttl_memo.get(svc.name)
    if hit is not None and hit[0] == version:
        return hit[1]
    found = self._ttl_memo[svc.name] = (version, _ttl_range(self, world, svc))
    return found[1]


def _ttl_range(self: Parts, world: World, svc: ServiceState) -> tuple[float, float]:
    knobs = world.knobs
    if svc.spec.residency is Residency.ON_DEMAND:
        ttl = svc.ttl_s
        if not knobs.switches.on_demand_keep or self._memory_wanted(world, svc):
            ttl = min(ttl, knobs.on_demand_ttl_s)
        elif knobs.switches.idle_keep and self._memory_spare(world, svc):
            ttl = math.inf
        if knobs.prewarm and knobs.switches.restore:
            return min(ttl, TUNING.restore_grace_s), ttl
        return ttl, ttl
    if knobs.switches.idle_keep and self._memory_spare(world, svc):
        return math.inf, math.inf
    return svc.ttl_s, svc.ttl_s


def ttl_floor(world: World, svc: ServiceState) -> float:
    """The shortest TTL :meth:`_ttl_range` can give ``svc``, whatever the memory and
    the restores: its own TTL, for an on-demand service also the on-demand TTL and the
    restore grace. Read without asking about memory or restores."""
    floor = svc.ttl_s
    if svc.spec.residency is Residency.ON_DEMAND:
        floor = min(floor, world.knobs.on_demand_ttl_s, TUNING.restore_grace_s)
    return floor


def idle_past_ttl(self: Parts, world: World, svc: ServiceState) -> bool:
    """``world.now - svc.last_used >= self._ttl(world, svc)``, asking whether a
    restore is pending only when the answer depends on it, and its TTL only when it
    could be reached: no TTL is below the service's TTL floor (``ttl_range``: its own
    TTL, for an on-demand service the on-demand TTL and the restore grace too)."""
    idle_s = world.now - svc.last_used
    if idle_s < self._ttl_floor(world, svc):
        return False
    short, ttl = self._ttl_range(world, svc)
    if idle_s >= ttl:
        return True
    if idle_s < short:
        return False
    return self._restore_pending(world, svc)


def memory_wanted(self: Parts, world: World, svc: ServiceState) -> bool:
    """Whether memory an idle on-demand service holds is wanted by something else.

    It is while a request waits for memory on its device, or when less than the
    realtime reserve is free (a voice request then finds its room without an
    eviction first).
    Work held back for a higher class (``higher_class_waiting``) does not want it:
    it waits for compute, or for a higher class's request that itself waits for
    memory (and counts here).
    """
    dev = svc.spec.device
    key = ("memory_wanted", dev)
    hit = self._memo.get(key)  # the same for every service of the device, per version
    if hit is not None and hit[0] == world.version:
        return bool(hit[1])
    causes = world.waiting_causes  # waiting requests per (device, class, wait reason)
    wanted = any(
        causes.get((dev, cls, Reason.NO_MEMORY)) for cls in ServiceClass
    ) or world.ledger.available(dev) < self._realtime_reserve(world, dev)
    self._memo[key] = (world.version, int(wanted))
    return wanted


def memory_spare(self: Parts, world: World, svc: ServiceState) -> bool:
    """Whether ``svc``'s device has memory to spare: nothing wants what is loaded
    (:meth:`_memory_wanted`) and more than the realtime reserve plus the spare
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
    dev = svc.spec.device
    key = ("memory_spare", dev)
    hit = self._memo.get(key)  # the same for every service of the device, per version
    if hit is not None and hit[0] == world.version:
        level = hit[1]
    else:
        # 0: wanted; 1: not wanted, less than the spare fraction free; 2: spare
        level = 0
        if not self._memory_wanted(world, svc):
            spare = world.knobs.spare_fraction * world.devices[dev].usable_bytes
            free = world.ledger.available(dev) - self._realtime_reserve(world, dev)
            level = 2 if free >= spare else 1
        self._memo[key] = (world.version, level)
    return level == 2


def likely_reused(world: World, svc: ServiceState) -> bool:
    horizon = world.knobs.reuse_horizon_s
    return 1.0 - math.exp(-reuse_rate(svc, world.now, horizon) * horizon) >= 0.5


def restore_pending(self: Parts, world: World, holder: ServiceState) -> bool:
    """A warm service evicted for memory on ``holder``'s device, of a class at least
    as high as ``holder``'s, is likely to be used again, sooner than ``holder`` (an
    on-demand service used more often than what it displaced keeps its place), and
    would fit once ``holder`` is gone (no service is unloaded for a restore that
    cannot happen).

    Asked by the TTL expiry and again by the next wake-up: kept until anything
    changes (an action) or time passes, and for the round only (decide clears it).
    """
    stamp = (world.version, world.now)
    hit = self._restores_memo.get(holder.name)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    pending = self._compute_restore_pending(world, holder)
    self._restores_memo[holder.name] = (stamp, pending)
    return pending


def compute_restore_pending(self: Parts, world: World, holder: ServiceState) -> bool:
    horizon = world.knobs.reuse_horizon_s
    own = reuse_rate(holder, world.now, horizon)
    dev = holder.spec.device
    room = world.ledger.available(dev) + self.unload_frees(world, holder)
    version = world.version
    for candidate in self._restorable(world, dev):
        s, rate, need, computed_at = candidate
        if s.spec.cls <= holder.spec.cls and rate > own:
            if computed_at != version:  # the need reads the ledger and the reserve
                pool = self._load_pool(world, s, s.spec.profile.kv_floor)
                need = candidate[2] = self._restore_need(world, s, pool)
                candidate[3] = version
            if need <= room:
                return True
    return False


def restorable(self: Parts, world: World, device: str) -> list[list[Any]]:
    """The warm services evicted from ``device`` that are likely to be used again, in
    spec order, as ``[service, reuse rate, restore need, the world.version it was
    computed at (None: not yet)]``.

    What every holder's :meth:`_restore_pending` asks about them: kept while the
    evicted services stay the same and time does not pass, for the round only
    (decide clears it; reuse rates change only with arrivals, between rounds).
    """
    stamp = (world.evicted_out.version, world.now)
    hit = self._restorable_memo.get(device)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    horizon = world.knobs.reuse_horizon_s
    found: list[list[Any]] = []
    # The warm services of ``device`` among those evicted and unloaded since, in spec
    # order (evicted_out's): that set is the smaller one to walk.
    for s in world.evicted_out:
        if s.spec.device == device and s.spec.residency is Residency.WARM:
            rate = reuse_rate(s, world.now, horizon)
            if 1.0 - math.exp(-rate * horizon) >= 0.5:  # _likely_reused
                found.append([s, rate, 0, None])
    self._restorable_memo[device] = (stamp, found)
    return found


def warm_services(self: Parts, world: World, device: str) -> list[ServiceState]:
    """The warm services of ``device``, in spec order (what the spec says)."""
    self._know_warm(world)
    return self._warm[device]


def know_warm(self: Parts, world: World) -> None:
    """Find ``world``'s warm services once: per device, and all in class order."""
    if self._warm_world is not world:
        self._warm_world = world
        self._warm = {
            dev: [s for s in svcs if s.spec.residency is Residency.WARM]
            for dev, svcs in world.services_by_device.items()
        }
        self._warm_ordered = sorted(
            (s for svcs in self._warm.values() for s in svcs),
            key=lambda s: (int(s.spec.cls), s.name),
        )


def evicted_warm(self: Parts, world: World) -> list[ServiceState]:
    """The warm services evicted and unloaded since (``World.evicted_out``), in class
    order then by name, kept while that set stays the same (``ServiceSet.version``)."""
    evicted = world.evicted_out
    memo = self._evicted_warm_memo
    if memo is None or memo[0] is not evicted or memo[1] != evicted.version:
        found = [s for s in self._warm_in_class_order(world) if s in evicted]
        memo = self._evicted_warm_memo = (evicted, evicted.version, found)
    return memo[2]


def warm_in_class_order(self: Parts, world: World) -> list[ServiceState]:
    """Every warm service, in class order then by name (what the spec says)."""
    self._know_warm(world)
    return self._warm_ordered


def restore_need(self: Parts, world: World, svc: ServiceState, pool: int) -> int:
    """Free memory a prewarm of ``svc`` with a KV pool of ``pool`` needs: its resident
    size, plus the realtime reserve and a tenth of the budget left free after it
    (memory measured only at the next sample, e.g. an allocator's cache)."""
    dev = svc.spec.device
    spare = self._realtime_reserve(world, dev) + world.devices[dev].usable_bytes // 10
    return sum(world.projected_resident(svc, pool)) + spare


def admin_unloads(self: Parts, world: World) -> None:
    for name in sorted(world.admin_unload):
        svc = world.services[name]
        if svc.status is ServiceStatus.LOADED and svc.idle:
            world.unload(svc, reason=Reason.ADMIN, detail="operator asked")
            world.clear_admin_unload(name)
        elif svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            # Already out (an eviction may have beaten the command): the operator's
            # word stands, so a prewarm must not bring it back as "evicted".
            world.forget_eviction(svc)
            world.clear_admin_unload(name)


def keep_pinned_loaded(self: Parts, world: World) -> None:
    down = (
        s
        for s in world.kept
        if self._keep(s) and s.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)
    )
    for svc in sorted(down, key=lambda s: (int(s.spec.cls), s.name)):
        if not self._keep(svc) or svc.status not in (
            ServiceStatus.UNLOADED,
            ServiceStatus.CRASHED,
        ):
            continue
        if (
            world.now < svc.backoff_until
            or world.shutting_down
            or self._loads_one_at_a_time(world, svc.spec.device)
        ):
            continue
        reason = (
            Reason.RELOAD_AFTER_CRASH
            if svc.status is ServiceStatus.CRASHED
            else Reason.ADMIN
            if svc.admin_wants_loaded and not svc.pinned
            else Reason.PINNED
        )
        pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
        need = sum(world.projected_resident(svc, pool))
        if self.make_room(world, svc.spec.device, need, svc.spec.cls, svc, reason):
            world.load(svc, reason=reason, kv_pool=pool)


def expire_idle(self: Parts, world: World) -> None:
    for svc in world.loaded:
        if (
            svc.status is ServiceStatus.LOADED
            and svc.idle
            and svc.waiting_count == 0
            and not self._keep(svc)
            and self._idle_past_ttl(world, svc)
        ):
            self._unload(
                world,
                svc,
                reason=Reason.TTL_EXPIRED,
                detail=f"idle {world.now - svc.last_used:.0f}s",
            )


def balloon(self: Parts, world: World) -> None:
    for svc in world.loaded:
        if svc.kv_pool <= svc.spec.profile.kv_floor or not world.resizable(svc):
            continue
        if svc.waiting_count == 0 and world.now - svc.last_used >= world.knobs.balloon_idle_s:
            target = max(svc.spec.profile.kv_floor, svc.kv_in_use)
            if target < svc.kv_pool:
                world.resize(svc, target, reason=Reason.BALLOON_SHRINK, detail="idle pool")


def prewarm(self: Parts, world: World) -> None:
    """WarmServe-style: reload a recently evicted, likely-reused service into spare memory."""
    horizon = world.knobs.reuse_horizon_s
    if world.waiting_for(Reason.NO_MEMORY):
        return  # memory goes to waiting requests first
    for svc in self._evicted_warm(world):
        if (
            svc.status is not ServiceStatus.UNLOADED
            or svc.spec.residency is not Residency.WARM
            or svc.last_evicted_at is None
            or world.now < svc.backoff_until
            or not svc.spec.in_window(world.time_of_day())
            or self._other_replica_up(world, svc)
            or self._loads_one_at_a_time(world, svc.spec.device)
        ):
            continue
        if 1.0 - math.exp(-reuse_rate(svc, world.now, horizon) * horizon) < 0.5:
            continue
        dev = svc.spec.device
        pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
        # Restoring what was evicted for a short on-demand job returns the device to
        # its steady state: it leaves the realtime reserve and a tenth of the budget
        # free (see _restore_need).
        need_with_spare = self._restore_need(world, svc, pool)
        fits = world.ledger.available(dev) >= need_with_spare
        tried = self._restore_tried_at.get(svc.name)
        if tried is not None and world.now - tried < TUNING.restore_retry_s:
            pass  # the room it made went to demand: do not evict for it again yet
        elif not fits and svc.spec.cls < ServiceClass.BATCH and world.knobs.switches.restore:
            # An interactive service outranks batch and background work: take its
            # memory back from them (they are preempted or evicted) to restore it.
            # Only strictly lower classes yield: two services of one class that cannot
            # both fit must never restore each other in turn (a load/unload loop).
            fits = self.make_room(
                world, dev, need_with_spare, svc.spec.cls, svc, Reason.PRELOAD, strict=True
            )
            if not fits and world.ledger.available(dev) + self._pending_free(world, dev) >= (
                need_with_spare
            ):
                self._restore_tried_at[svc.name] = world.now
        if fits:
            world.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="likely reused soon")
            world.forget_eviction(svc)
