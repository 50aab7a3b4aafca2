"""When the policy wants to be asked again with no event: the next TTL, balloon, backoff,
window edge or realtime grace to pass.
"""

from __future__ import annotations

import bisect
import math

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.policies.accelmux.residency import Residents
from accelmux.core.specs import seconds_until_next_sorted
from accelmux.core.world import ServiceState


class Wakeup:
    """When the policy wants to be asked again with no event (it only reads)."""

    def __init__(self, seam: Seam, residents: Residents) -> None:
        self.view = seam.view
        self.cache = seam.cache
        self.residents = residents

    def next_wakeup(self, now: float) -> float | None:
        if self.cache.enabled and now >= self.view.now:
            return self._next_wakeup_kept(now)
        # The earliest of the times below after ``now``. A TTL that a pending restore
        # would shorten is settled last, and only when either TTL could be the earliest.
        # The TTLs are read last: an idle service whose TTL floor (``facts.ttl_floor``) ends
        # after now and no earlier than the earliest time found so far cannot be the
        # earliest, and its TTL is not asked (a minimum does not depend on the order).
        best = self._earliest_timer(now)
        balloon_idle_s = self.view.knobs.balloon_idle_s
        idle: list[ServiceState] = []
        for svc in self.view.loaded:  # the WorldView's indexes: only services that can ask
            # idle and not kept (ServiceState.idle and _keep, without the calls)
            if not (svc.inflight or svc.paused_kv or svc.pinned or svc.admin_wants_loaded):
                idle.append(svc)
            if svc.kv_pool > svc.spec.profile.kv_floor and self.view.resizable(svc):
                t = svc.last_used + balloon_idle_s
                if t > now and (best is None or t < best):
                    best = t
        return self._earliest_ttl(now, idle, best)

    def _next_wakeup_kept(self, now: float) -> float | None:
        """:meth:`next_wakeup` from the indexes and what is kept: the backoffs of the
        services backing off, the pools that can shrink, and each device's TTLs
        (``Residents.device_ttls``): the first end after ``now`` of those that do not
        depend on a pending restore, and those that do, settled last (the same minimum)."""
        view = self.view
        best = self._earliest_timer(now)
        balloon_idle_s = view.knobs.balloon_idle_s
        for svc in view.balloonable:
            t = svc.last_used + balloon_idle_s
            if t > now and (best is None or t < best):
                best = t
        unsure: list[ServiceState] = []
        for dev in view.devices:
            if not len(view.idle_up_on(dev)):
                continue
            ttls = self.residents.device_ttls(dev)
            ends = ttls.ends
            i = bisect.bisect_right(ends, now)
            if i < len(ends) and (best is None or ends[i] < best):
                best = ends[i]
            unsure.extend(ttls.unsure)
        for svc in unsure:
            short, ttl = self.residents.ttl_range(svc)
            best = self._settle(svc, short, ttl, now, best)
        return best

    def _settle(
        self, svc: ServiceState, short: float, ttl: float, now: float, best: float | None
    ) -> float | None:
        """``best``, or the end of ``svc``'s TTL if after ``now`` and earlier: ``short``
        (finite) if a restore is pending, else ``ttl`` (inf: no wake-up); whether one is
        is asked only when either end could be the earliest."""
        pending = svc.last_used + short
        not_pending = svc.last_used + ttl if math.isfinite(ttl) else None
        if any(
            t is not None and t > now and (best is None or t < best) for t in (pending, not_pending)
        ):
            chosen = pending if self.residents.restore_pending(svc) else not_pending
            if chosen is not None and chosen > now and (best is None or chosen < best):
                best = chosen
        return best

    def _earliest_backoff(self, now: float) -> float | None:
        """The earliest backoff end after ``now`` of a kept or queued service."""
        best: float | None = None
        view = self.view
        if self.cache.enabled and now >= view.now:
            # ``backing_off`` holds every service whose backoff ends after the world's time
            candidates = [s for s in view.backing_off if s in view.kept or s in view.queued]
        else:
            candidates = [*view.kept, *view.queued]
        for svc in candidates:
            t = svc.backoff_until
            if t > now and (best is None or t < best):
                best = t
        return best

    def _earliest_timer(self, now: float) -> float | None:
        """The earliest after ``now`` of the backoffs, the next window edge and the realtime
        grace ends (None: none of them)."""
        best = self._earliest_backoff(now)
        edges = self.window_edges()
        if edges:  # the next edge of any window of a service with waiting requests
            t = now + seconds_until_next_sorted(edges, self.view.time_of_day(now))
            if t > now and (best is None or t < best):
                best = t
        return self._earliest_learned(now, best)

    def _earliest_learned(self, now: float, best: float | None) -> float | None:
        """The earliest of ``best``, the ageing of waiting batch requests, the re-tests
        of learned sizes and the realtime grace ends after ``now``."""
        for _, t in facts.not_yet_aged(self.view):  # a waiting batch request ages
            if now < t < math.inf and (best is None or t < best):
                best = t
        for size in self.view.learned.sizes.values():  # a learned size's re-test
            t = size.retest_at
            if not size.testing and now < t < math.inf and (best is None or t < best):
                best = t
        for dev, svcs in self.view.realtime_by_device.items():
            grace = facts.realtime_grace(self.view, dev)
            if grace > 0:
                for svc in svcs:  # held work resumes
                    t = svc.last_used + grace
                    if t > now and (best is None or t < best):
                        best = t
        return best

    def _earliest_ttl(
        self, now: float, idle: list[ServiceState], best: float | None
    ) -> float | None:
        """The earliest of ``best`` and the TTL ends of the ``idle`` services after ``now``."""
        if not self.cache.enabled:  # every TTL asked, with no shortcut
            for svc in idle:
                t = svc.last_used + self.residents.ttl(svc)
                if math.isfinite(t) and t > now and (best is None or t < best):
                    best = t
            return best
        unsure: list[tuple[ServiceState, float, float]] = []
        ttl_floor = facts.ttl_floor
        for svc in idle:
            soonest = svc.last_used + ttl_floor(self.view, svc)
            if best is not None and now < soonest and best <= soonest:
                continue  # its TTL ends no earlier than best
            short, ttl = self.residents.ttl_range(svc)
            if short < ttl:
                unsure.append((svc, short, ttl))
            elif math.isfinite(ttl):
                t = svc.last_used + ttl
                if t > now and (best is None or t < best):
                    best = t
        for svc, short, ttl in unsure:
            best = self._settle(svc, short, ttl, now, best)
        return best

    def window_edges(self) -> tuple[float, ...]:
        """The edges of the windows of the services with waiting requests (sorted, each
        once), kept while those of them with windows stay the same."""
        queued = self.view.queued_windowed
        hit = self.cache.window_edges.get(None, queued.version)
        if hit is not Miss.MISS:
            return hit
        edges = {e for svc in queued for w in svc.spec.windows for e in w.edges}
        return self.cache.window_edges.put(None, queued.version, tuple(sorted(edges)))
