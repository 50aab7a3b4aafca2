"""When the policy wants to be asked again with no event: the next TTL, balloon, backoff,
window edge or realtime grace to pass.
"""

from __future__ import annotations

import math

from accelmux.core.specs import seconds_until_next_sorted

from .interface import Parts
from .state import ServiceState, World


def next_wakeup(self: Parts, world: World, now: float) -> float | None:
    # The earliest of the times below after ``now``. A TTL that a pending restore
    # would shorten is settled last, and only when either TTL could be the earliest.
    # The TTLs are read last: an idle service whose TTL floor (``_ttl_floor``) ends
    # after now and no earlier than the earliest time found so far cannot be the
    # earliest, and its TTL is not asked (a minimum does not depend on the order).
    best = _earliest_timer(self, world, now)
    balloon_idle_s = world.knobs.balloon_idle_s
    idle: list[ServiceState] = []
    for svc in world.loaded:  # the World's indexes: only services that can ask
        # idle and not kept (ServiceState.idle and _keep, without the calls)
        if not (svc.inflight or svc.paused_kv or svc.pinned or svc.admin_wants_loaded):
            idle.append(svc)
        if svc.kv_pool > svc.spec.profile.kv_floor and world.resizable(svc):
            t = svc.last_used + balloon_idle_s
            if t > now and (best is None or t < best):
                best = t
    return _earliest_ttl(self, world, now, idle, best)


def _earliest_timer(self: Parts, world: World, now: float) -> float | None:
    """The earliest after ``now`` of the backoffs, the next window edge and the realtime
    grace ends (None: none of them)."""
    best: float | None = None
    for svc in world.kept:
        t = svc.backoff_until
        if t > now and (best is None or t < best):
            best = t
    for svc in world.queued:
        t = svc.backoff_until
        if t > now and (best is None or t < best):
            best = t
    edges = self._window_edges(world)
    if edges:  # the next edge of any window of a service with waiting requests
        t = now + seconds_until_next_sorted(edges, world.time_of_day(now))
        if t > now and (best is None or t < best):
            best = t
    grace = world.knobs.realtime_grace_s
    if grace > 0:
        for svcs in world.realtime_by_device.values():
            for svc in svcs:  # held work resumes
                t = svc.last_used + grace
                if t > now and (best is None or t < best):
                    best = t
    return best


def _earliest_ttl(
    self: Parts, world: World, now: float, idle: list[ServiceState], best: float | None
) -> float | None:
    """The earliest of ``best`` and the TTL ends of the ``idle`` services after ``now``."""
    unsure: list[tuple[ServiceState, float, float]] = []
    ttl_floor = self._ttl_floor
    for svc in idle:
        soonest = svc.last_used + ttl_floor(world, svc)
        if best is not None and now < soonest and best <= soonest:
            continue  # its TTL ends no earlier than best
        short, ttl = self._ttl_range(world, svc)
        if short < ttl:
            unsure.append((svc, short, ttl))
        elif math.isfinite(ttl):
            t = svc.last_used + ttl
            if t > now and (best is None or t < best):
                best = t
    for svc, short, ttl in unsure:
        # ``short`` (finite) if a restore is pending, else ``ttl`` (inf: no wake-up).
        pending = svc.last_used + short
        not_pending = svc.last_used + ttl if math.isfinite(ttl) else None
        if any(
            t is not None and t > now and (best is None or t < best) for t in (pending, not_pending)
        ):
            chosen = pending if self._restore_pending(world, svc) else not_pending
            if chosen is not None and chosen > now and (best is None or chosen < best):
                best = chosen
    return best


def window_edges(self: Parts, world: World) -> tuple[float, ...]:
    """The edges of the windows of the services with waiting requests (sorted, each
    once), kept while those services stay the same."""
    queued = world.queued
    memo = self._edges_memo
    if memo is None or memo[0] is not queued or memo[1] != queued.version:
        edges = {e for svc in queued for w in svc.spec.windows for e in w.edges}
        memo = self._edges_memo = (queued, queued.version, tuple(sorted(edges)))
    return memo[2]
