"""Making room: freeing ``need`` bytes on a device for a class, in order of cost (shrink
elastic KV pools, stop lower-class work, evict idle services by victim score), and what
an unload costs.

:meth:`Room.plan` finds what can be freed and in which order, changing nothing;
:meth:`Room.apply` takes the steps (the split of llama-swap's swapper: the plan is
checked before any step is taken, so nothing is evicted for a request that would not
fit anyway).
"""

from __future__ import annotations

import math
from dataclasses import replace

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.preemption import Preemption
from accelmux.core.policies.accelmux.records import RoomFor, RoomPlan, Seam, Survey
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.specs import room_rank
from accelmux.core.types import Reason, Residency, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceState, reuse_rate

#: How long realtime work on a device may go unserved before a pinned service whose
#: reload misses its own objective yields to it anyway (s).
UNSERVED_S = 120.0


class Room:
    """Room for a class on a device: what can be freed (:meth:`plan`) and freeing it
    (:meth:`apply`); :meth:`make_room` does both."""

    def __init__(self, seam: Seam, preemption: Preemption, time_sharing: TimeSharing) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        self.preemption = preemption
        self.time_sharing = time_sharing

    def victim_score(self, svc: ServiceState) -> float:
        """Lower is a better victim: cheap to reload, unlikely reused, large."""
        view = self.view
        horizon = view.knobs.reuse_horizon_s
        rate = reuse_rate(svc, view.now, horizon)
        p_reuse = max(0.01, 1.0 - math.exp(-rate * horizon))
        weight = view.knobs.class_weights[int(svc.spec.cls)]
        if svc.spec.residency is Residency.ON_DEMAND:
            weight *= 0.5
        freed = max(1, facts.unload_frees(view, svc))
        return view.load_seconds(svc, facts.tier(view, svc)) * p_reuse * weight / (freed / 1e9)

    def unload(self, svc: ServiceState, *, reason: Reason, detail: str) -> None:
        """Unload ``svc``, its weights to the tier its backend and the host budget allow."""
        self.ops.unload(svc, reason=reason, tier=facts.tier(self.view, svc), detail=detail)

    def eviction_cost(self, svc: ServiceState) -> float:
        """The victim score without the per-byte normalisation."""
        return self.victim_score(svc) * max(1, facts.unload_frees(self.view, svc)) / 1e9

    def pending_free(self, device: str) -> int:
        """Memory on its way back: services unloading, KV pools shrinking."""
        view = self.view
        epoch = view.epoch(device)
        hit = self.cache.pending_free.entries.get(device)  # asked by every make_room
        if hit is not None and hit[0] == epoch:
            return hit[1]
        # A resize awaits its answer only while loaded or unloading (the index oracle).
        value = sum(
            facts.unload_frees(view, s) - facts.parked_stays(view, s)
            for s in view.unloading_on(device)
        ) + sum(s.kv_shrinking for s in view.loaded_on(device) if s.resize_target is not None)
        return self.cache.pending_free.put(device, epoch, value)

    @staticmethod
    def evictable(
        svc: ServiceState, for_: RoomFor, once_preempted: bool = False, yielded: int = 0
    ) -> bool:
        """Whether ``svc`` may be evicted for ``for_`` (its class; its service, ranked
        above batch when steady, :func:`room_rank`; strictly lower classes only when
        ``strict``; pinned ones only for ``unpin``; an aged request's ranks as interactive
        work's, :func:`room_rank_of`); ``once_preempted``: it is busy,
        but every request it runs is being preempted for this room; ``yielded``: how
        many of its waiting requests are streams it paused for this room."""
        cls, exclude = for_.cls, for_.exclude
        spec = svc.spec
        if (
            svc is exclude
            or svc.status is not ServiceStatus.LOADED
            or not (svc.idle or once_preempted)
            or (svc.pinned and not for_.unpin)
            or svc.admin_wants_loaded
            or (spec.steady and cls >= ServiceClass.BATCH)  # floored
        ):
            return False
        rank = room_rank(spec.cls, steady=spec.steady)
        for_rank = room_rank_of(for_)
        return (svc.waiting_count == yielded or rank > for_rank) and (
            rank > for_rank if for_.strict else rank >= for_rank
        )

    def survey(self, device: str, for_: RoomFor, sharing: object) -> Survey:
        """What a plan could free on ``device`` for ``for_``, in one pass over its loaded
        services (services with requests in flight are loaded): KV pools to shrink,
        running requests to stop, idle services to evict. ``sharing`` is None when no
        stream there can be paused for time sharing (``TimeSharing.room_key``)."""
        view = self.view
        switches = view.knobs.switches
        preempting = switches.preemption
        shrinking = switches.ballooning
        clearing = switches.evict_after_preemption
        cls, exclude, requester = for_.cls, for_.exclude, for_.requester
        yielded_to = self.time_sharing.yielded_to
        found = Survey()
        for svc in view.loaded_on(device):
            cleared = False
            yielded = 0
            stopped_kv = 0  # KV the stopped requests of svc give back to its pool
            inflight = svc.inflight
            if inflight:
                stopped: list[RequestState] = []
                if preempting and facts.preemptible(svc, cls, facts.regaining(exclude)):
                    stopped = self.stoppable_for(svc, for_)
                    cleared = clearing and len(stopped) == len(inflight)
                elif sharing is not None:
                    stopped = facts.time_shared(view, svc, cls, requester)
                    cleared = bool(stopped)
                for r in stopped:
                    found.preempts.append(r)
                    found.gain += r.active_lease.nbytes if r.active_lease else 0
                    stopped_kv += r.kv_bytes
            elif requester is not None and svc.queue and yielded_to:
                # Its streams were paused (and confirmed parked) for this requester in an
                # earlier round: it counts as cleared for it, as in the round it paused them.
                rid = requester.request_id
                yielded = sum(
                    1
                    for r in svc.queue.values()
                    if r.paused and r.parked and yielded_to.get(r.request_id) == rid
                )
                cleared = yielded > 0
            if svc is exclude or svc.status is not ServiceStatus.LOADED:
                continue
            if shrinking and view.resizable(svc):
                floor = svc.spec.profile.kv_floor
                pool = svc.kv_pool
                target = max(floor, svc.kv_in_use)
                if pool > target:
                    found.shrinks.append((svc, target))
                # KV freed by a preemption comes back only as far as its pool can shrink.
                found.gain += max(0, pool - max(floor, svc.kv_in_use - stopped_kv))
            if self.evictable(svc, for_, once_preempted=cleared, yielded=yielded) and (
                not svc.pinned or self.pinned_yields(svc, for_.cls)
            ):
                found.victims.append(svc)
                found.gain += facts.unload_frees(view, svc)
        if device == view.park_device:
            self.survey_parked(device, for_, found)
        return found

    def stoppable_for(self, svc: ServiceState, for_: RoomFor) -> list[RequestState]:
        """``svc``'s requests that may be stopped for ``for_`` (``facts.stoppable``), but
        those that aged when room is made for a restore: stopped, they would wait again
        for the room they were given (``RequestState.aged``)."""
        stopped = facts.stoppable(self.view, svc)
        if for_.reason is Reason.PRELOAD:
            return [r for r in stopped if not r.aged]
        return stopped

    def survey_parked(self, device: str, for_: RoomFor, found: Survey) -> None:
        """Add to ``found`` the parked weights on ``device`` (the park device, whose RAM
        they are) that may be dropped for ``for_``: a copy is dropped for room (its next
        load reads from disk) where an eviction would be allowed to take its service."""
        exclude = for_.exclude
        for_rank = room_rank_of(for_)
        for svc in facts.droppable_parked(self.view, device, for_rank, for_.strict):
            if svc is not exclude:
                found.drops.append(svc)
                found.gain += self.view.host_weights[svc.name]

    def plan(self, device: str, need: int, for_: RoomFor) -> RoomPlan | None:
        """How ``need`` bytes are found on ``device`` for ``for_``, changing nothing: a plan
        with no steps when they are free (or on their way back: memory already on its
        way out is not evicted for twice), the steps in the order they are taken (shrinks
        lowest class first, stops lowest class and latest first, victims by score or
        least recently used), or None when not enough can be freed.

        What can be freed depends on the state, the class and the requester (only when it
        holds memory), not on the need: a failure answers every need above what it found
        it could free, until something on the device changes (its epoch; a new wait
        reason frees nothing)."""
        view = self.view
        available = view.ledger.available(device)
        if available >= need:
            return RoomPlan(device, need, for_)
        pending = self.pending_free(device)
        if available + pending >= need:
            return RoomPlan(device, need, for_, pending)
        exclude = for_.exclude
        holding = exclude.name if exclude is not None and exclude.is_up else None
        steady = exclude is not None and exclude.spec.steady  # it ranks above batch
        # None: no stream on the device can be paused for time sharing (see room_key).
        sharing = self.time_sharing.room_key(device, for_.requester)
        # (a request that cannot wait for the unloads, its queue holding none, is not
        # worth a pinned service)
        unpin = (
            for_.requester is not None
            and self.unpins(for_.cls)
            and (exclude is None or exclude.spec.queue_limit > 0)
        )
        key = (device, for_.cls, steady, for_.strict, holding, sharing, unpin, for_.aged)
        epoch = view.epoch(device)
        failed = self.cache.room_failed.get(key, epoch)
        if failed is not Miss.MISS and need > failed:
            return None
        found = self.survey(device, for_, sharing)
        freeable = available + pending + found.gain
        if freeable < need and unpin:
            # The last resort of a realtime request: idle pinned services may go too.
            for_ = replace(for_, unpin=True)
            found = self.survey(device, for_, sharing)
            freeable = available + pending + found.gain
        if freeable < need:
            self.cache.room_failed.put(key, epoch, freeable)
            return None
        found.shrinks.sort(key=lambda st: -int(st[0].spec.cls))  # stable: lowest class first
        found.preempts.sort(key=lambda r: (-int(r.cls), -(r.dispatched_at or 0.0)))
        if view.knobs.switches.victim_scoring:
            found.victims.sort(key=lambda s: (self.victim_score(s), s.name))
        else:
            found.victims.sort(key=lambda s: (s.last_used, s.name))
        return RoomPlan(device, need, for_, pending, found)

    def apply(self, plan: RoomPlan) -> bool:
        """Take the plan's steps until its need would fit; whether it fits now.

        Evictions free memory only once the backend confirms the unload, so after issuing
        them this returns False and the caller waits."""
        ledger = self.view.ledger
        device, need = plan.device, plan.need
        found = plan.survey
        if found is None:
            return ledger.available(device) >= need
        # A shrink frees its memory once the backend answers: it counts as pending.
        pending = plan.pending + self.shrink_for_room(plan, found.shrinks)
        self.drop_for_room(plan, pending, found.drops)
        stopped = self.stop_for_room(plan, pending, found.preempts)
        if stopped is None:
            return False  # the memory comes back with the unload
        pending = stopped
        if ledger.available(device) >= need:
            return True
        if ledger.available(device) + pending >= need:
            return False  # shrinks and unloads under way cover it
        short = need - ledger.available(device) - pending
        victims = self.pick_victims(found.victims, plan.for_.cls, short)
        self.evict_for_room(plan, pending, victims)
        return False

    def make_room(self, device: str, need: int, for_: RoomFor) -> bool:
        """Free memory for ``need`` bytes on ``device`` for ``for_``: :meth:`plan`, then
        :meth:`apply`. True when ``need`` fits now."""
        plan = self.plan(device, need, for_)
        return plan is not None and self.apply(plan)

    def unpins(self, cls: ServiceClass) -> bool:
        """Whether room for ``cls`` work that nothing else could make may evict idle pinned
        services (``realtime_unpin``): realtime work only. Pinning sizes a device for the
        services it keeps; when a foreign program takes part of that memory, keeping every
        pinned service loaded refuses voice while the ones it does not need now sit idle.
        A request's room only (a restore of a pinned service never evicts another), lower
        classes first (``pick_victims``); what it evicts is reloaded when room returns
        (``Residency.keep_pinned_loaded``). The operator's own loads stay."""
        return cls is ServiceClass.REALTIME and self.view.knobs.switches.realtime_unpin

    def pinned_yields(self, svc: ServiceState, cls: ServiceClass) -> bool:
        """Whether pinned ``svc`` may yield to room for ``cls`` work that unpins
        (:meth:`unpins`): one of a lower class always (voice comes first: a camera model
        kept loaded while the voice chain cannot run is the wrong way round, adv-0444),
        one of its own class when its reload keeps its objective
        (:meth:`reload_keeps_objective`)."""
        return svc.spec.cls > cls or self.reload_keeps_objective(svc)

    def reload_keeps_objective(self, svc: ServiceState) -> bool:
        """Whether pinned ``svc`` may yield to a realtime request (``unpins``): its
        reload (from the tier it would go to) is within its own latency objective, or it
        has none. Evicting one whose reload is slower would trade its next request for
        this one: on a game evening with tight objectives every step of every voice chain
        became a cold start that missed its objective (stress
        ``game-takes-pinned-room.yaml``: realtime 79 -> 63 %)."""
        objective = svc.spec.objective_s
        view = self.view
        if objective is None or view.load_seconds(svc, facts.tier(view, svc)) <= objective:
            return True
        # Voice unserved for long on this device: a late answer beats none.
        served = max(
            (s.last_used for s in view.realtime_by_device[svc.spec.device]), default=view.now
        )
        return view.now - served >= UNSERVED_S

    def max_possible(self, device: str, exclude: ServiceState) -> int:
        """The most ``exclude`` could ever have on ``device``: its usable memory less what
        the other kept services hold at their floors (for realtime work, the pinned ones
        whose reload keeps their objective may go: :meth:`unpins`)."""
        view = self.view
        if self.unpins(exclude.spec.cls):
            held = sum(
                facts.kept_floor(view, s)
                for s in view.kept
                if s.spec.device == device
                and s is not exclude
                and (s.admin_wants_loaded or not self.pinned_yields(s, exclude.spec.cls))
            )
            return view.devices[device].usable_bytes - held
        epoch = view.epoch(device)
        hit = self.cache.kept_floor.entries.get(device)  # asked for every request considered
        if hit is not None and hit[0] == epoch:
            held = hit[1]
        else:
            held = self.cache.kept_floor.put(
                device,
                epoch,
                sum(facts.kept_floor(view, s) for s in view.kept if s.spec.device == device),
            )
        return view.devices[device].usable_bytes - (held - facts.kept_floor(view, exclude))

    def reachable(self, device: str, need: int, svc: ServiceState) -> bool:
        """Whether ``need`` more bytes for ``svc`` could be found on ``device`` by evicting
        everything that may go, with what the device's foreign programs, workers' overhead
        and park hold now. A request that cannot does not hold lower classes back (fair
        progress): it waits for a foreign program to leave, which their work cannot delay."""
        view = self.view
        ledger = view.ledger
        outside = ledger.foreign(device) + ledger.overhead(device) + ledger.parked(device)
        # Parked weights that may be dropped for it are within reach, and its own come
        # back onto the device with its load.
        rank = room_rank(svc.spec.cls, steady=svc.spec.steady)
        droppable = facts.droppable_parked(view, device, rank)
        outside -= sum(view.host_weights[s.name] for s in droppable if s is not svc)
        own = svc.resident_bytes if svc.holds_memory else -self.own_parked(svc)
        above = facts.held_above(view, device, svc)
        return need <= self.max_possible(device, svc) - own - outside - above

    def own_parked(self, svc: ServiceState) -> int:
        """Weights of ``svc`` parked on its own device (the park device): its load takes
        them back onto the device, so they need no room."""
        view = self.view
        if svc.holds_memory or svc.spec.device != view.park_device:
            return 0
        return view.host_weights.get(svc.name, 0)

    def refuse(self, req: RequestState, device: str, need: int) -> None:
        """Refuse ``req`` at once: no eviction could give it ``need`` bytes on ``device``
        (memory outside the policy's reach holds them), so waiting out its deadline would
        only hide why."""
        ledger = self.view.ledger
        self.ops.reject(
            req,
            reason=Reason.NO_MEMORY,
            retry_after_s=1.0,
            detail=(
                f"needs {need} B ({ledger.available(device)} B free), which no eviction can "
                "free: foreign programs hold "
                f"{ledger.foreign(device)} B, workers' overhead {ledger.overhead(device)} B, "
                f"parked state {ledger.parked(device)} B, "
                + (
                    "services the operator keeps loaded their floors"
                    if self.unpins(req.cls)
                    else "kept services their floors"
                )
            ),
        )

    def shrink_for_room(self, plan: RoomPlan, shrinks: list[tuple[ServiceState, int]]) -> int:
        """Shrink KV pools in order until the plan's need would fit in free memory; the
        bytes the shrinks give back once the backends answer."""
        ledger = self.view.ledger
        device, need = plan.device, plan.need
        detail = f"room for {plan.for_.reason.value}"
        shrunk = 0
        for svc, target in shrinks:
            if ledger.available(device) + shrunk >= need:
                break
            if self.ops.resize(svc, target, reason=Reason.BALLOON_SHRINK, detail=detail):
                shrunk += svc.kv_shrinking
        return shrunk

    def drop_for_room(self, plan: RoomPlan, pending: int, drops: list[ServiceState]) -> None:
        """Drop parked weights on the park device, largest first, until the plan's need
        would fit (what a copy held is free at once: no backend holds it for a service
        that is not loaded)."""
        ledger = self.view.ledger
        device, need = plan.device, plan.need
        host = self.view.host_weights
        for svc in sorted(drops, key=lambda s: (-host.get(s.name, 0), s.name)):
            if ledger.available(device) + pending >= need:
                break
            self.ops.drop_host_copy(svc, reason=Reason.EVICTED_FOR_MEMORY)

    def stop_for_room(
        self, plan: RoomPlan, pending: int, preempts: list[RequestState]
    ) -> int | None:
        """Stop running requests in order until the plan's need would fit, shrinking the
        pools they leave; the memory then on its way back (``pending`` and what the
        shrinks free), or None when a stopped request's service was evicted for its
        allocator cache (the memory comes back with the unload).

        A caching allocator keeps what a preempted request held: the World charges it to
        the service (RESERVED) until the service unloads."""
        view = self.view
        ledger = view.ledger
        device, need, for_ = plan.device, plan.need, plan.for_
        shrinking = view.knobs.switches.ballooning
        evicted_cache = False
        for req in preempts:
            if ledger.available(device) + pending >= need:
                break
            self.preemption.stop(req, for_.cls, for_.requester)
            holder = view.services[req.service]
            target = max(holder.spec.profile.kv_floor, holder.kv_in_use)
            if (
                shrinking
                and holder.kv_pool > target
                and self.ops.resize(
                    holder, target, reason=Reason.BALLOON_SHRINK, detail="after preemption"
                )
            ):
                pending += holder.kv_shrinking
            if (
                holder.spec.addressed_as in view.caching_backends
                and holder.idle
                and self.evictable(holder, for_)
            ):
                self.unload(
                    holder,
                    reason=Reason.EVICTED_FOR_MEMORY,
                    detail=f"room for class {for_.cls.label}: its allocator keeps freed memory",
                )
                evicted_cache = True
        return None if evicted_cache else pending

    def pick_victims(
        self, victims: list[ServiceState], cls: ServiceClass, short: int
    ) -> list[ServiceState]:
        """The victims, in eviction order, to evict for ``short`` bytes: strictly lower
        classes alone when they cover it (``lower_class_first``); when one victim alone
        covers it, the cheapest such one (reload cost x reuse x class weight, not the best
        per byte: a few MB must not cost the largest model; ``single_victim``); pinned
        services (``unpins``) only after every other victim."""
        view = self.view
        switches = view.knobs.switches
        pinned = [s for s in victims if s.pinned]
        if pinned:
            # a realtime request's last resort (``unpins``): the others first, then the
            # pinned services, lower classes first and the cheapest to reload first
            others = [s for s in victims if not s.pinned]
            if sum(facts.unload_frees(view, s) for s in others) < short:
                pinned.sort(key=lambda s: (-int(s.spec.cls), self.eviction_cost(s), s.name))
                return [*others, *pinned]
            victims = others
        if switches.lower_class_first:
            lower = [s for s in victims if s.spec.cls > cls]
            if (
                len(lower) < len(victims)
                and sum(facts.unload_frees(view, s) for s in lower) >= short
            ):
                victims = lower
        single = [s for s in victims if facts.unload_frees(view, s) >= short]
        if single and switches.single_victim:
            victims = [min(single, key=lambda s: (self.eviction_cost(s), s.name))]
        return victims

    def evict_for_room(self, plan: RoomPlan, pending: int, victims: list[ServiceState]) -> None:
        """Evict ``victims`` in order until the plan's need would fit once their unloads
        are done."""
        ledger = self.view.ledger
        device, need = plan.device, plan.need
        detail = f"room for class {plan.for_.cls.label} ({plan.for_.reason.value})"
        freed = 0
        for svc in victims:
            if ledger.available(device) + pending + freed >= need:
                break
            if not svc.idle or svc.status is not ServiceStatus.LOADED:
                continue  # its work was not all preempted (or parked) after all
            frees = facts.unload_frees(self.view, svc)
            stays = facts.parked_stays(self.view, svc)
            why = detail
            if plan.for_.aged and svc.spec.cls <= plan.for_.cls:
                why = (
                    f"{detail}: it waited {self.view.knobs.batch_age_fraction} of its "
                    "deadline behind this idle model"
                )
            if svc.pinned:
                why = (
                    f"{detail}: pinned, it yields to realtime work no other room could serve "
                    f"(foreign programs hold {ledger.foreign(device)} B) and is reloaded when "
                    "room returns"
                )
            if stays and ledger.available(device) + pending + freed + frees - stays < need:
                # Parked weights would stay on this device: the room needs them too.
                self.ops.unload(svc, reason=Reason.EVICTED_FOR_MEMORY, detail=why)
            else:
                self.unload(svc, reason=Reason.EVICTED_FOR_MEMORY, detail=why)
                frees -= stays
            freed += frees


def room_rank_of(for_: RoomFor) -> int:
    """The rank room is made at for ``for_`` (:func:`room_rank`): its class's, a steady
    service's above batch, and an aged request's (``RequestState.aged``) that of interactive
    work, so idle interactive services with no request waiting may go for it."""
    exclude = for_.exclude
    rank = room_rank(for_.cls, steady=exclude is not None and exclude.spec.steady)
    if for_.aged:
        return min(rank, _INTERACTIVE_RANK)
    return rank


_INTERACTIVE_RANK = room_rank(ServiceClass.INTERACTIVE, steady=False)
