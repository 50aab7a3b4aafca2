"""Learning from being wrong: crashes and measurements above the leases raise a service's
calibration at once, and memory measured above what was accounted is charged to the
service using it (``failure_calibration``, ``pressure_charging``, ``cache_accounting``).
"""

from __future__ import annotations

from accelmux.core.types import (
    Category,
    Reason,
    ServiceClass,
)

from .heuristics import TUNING
from .interface import Parts
from .state import ServiceState, World


def learn(self: Parts, world: World) -> None:
    """Learn from being wrong, at once: crashes and measurements above the leases.

    A crash with requests in flight (an OOM kills the service that asked) raises the
    service's calibration to at least twice what those requests held. After each
    memory sample, a running service whose measured activation memory exceeds its
    leases and the highest activation measured before (what a caching allocator may
    still hold from earlier requests) is *charged* with the excess:
    its calibration rises to what was measured, and until it is measured within its
    leases it runs one request at a time and gives back its own work first under
    pressure (``_relieve_pressure``).

    What it learns changes decisions on the service's device, so it touches the
    device's epoch (a round there is not a repeat of an earlier one).
    """
    knobs = world.knobs
    learn = knobs.switches.failure_calibration
    for svc in self._learners(world):
        name = svc.name
        dev = svc.spec.device
        if world.see_crashes(svc):
            world.touch(dev)
            if learn:
                for estimated, lease in svc.crash_held:
                    world.observe_failure(svc, estimated, lease)
        if world.sampled_at.get(dev) != world.now:
            if not svc.inflight and world.clear_charge(svc):
                world.touch(dev)
            continue
        world.touch(dev)
        if not svc.holds_memory:
            world.forget_activation(svc)
            continue
        # What the load measured above its leases is resident memory, not activations.
        reserved = max(0, world.ledger.amount(dev, name, Category.RESERVED) - svc.load_excess)
        leases = sum(r.active_lease.nbytes for r in svc.inflight.values() if r.active_lease)
        measured = reserved + leases
        before = world.raise_high_water(svc, measured)
        excess = measured - max(leases, before)
        if not svc.inflight and reserved > TUNING.excess_tolerance:
            # a property of the backend: every replica of the service caches alike
            self._caching.add(svc.spec.addressed_as)
            if knobs.switches.cache_accounting:
                world.mark_caching(svc)
        if not svc.inflight or excess <= TUNING.excess_tolerance:
            world.clear_charge(svc)
            continue
        world.charge(svc, excess)
        if learn:
            estimated = sum(r.estimate.active_bytes for r in svc.inflight.values())
            world.observe_excess(svc, estimated, measured)


def learners(self: Parts, world: World) -> list[ServiceState]:
    """The services :meth:`_learn` may learn from this round, in spec order.

    A crash leaves its service CRASHED until the round after it (the Manager applies
    the event, then the policy decides), a charge is lifted only from a charged
    service, and measurements come for the services of a device sampled now: every
    other service would pass through ``_learn`` unchanged, so it is not visited.
    """
    found = {s.name: s for s in world.crashed}
    for name in world.learned.charged:
        found[name] = world.services[name]
    for dev, at in world.sampled_at.items():
        if at == world.now:
            found.update((s.name, s) for s in world.services_by_device[dev])
    return sorted(found.values(), key=lambda s: s.index)


def relieve_pressure(self: Parts, world: World) -> None:
    """Foreign or reserved memory grew: give memory back until the ledger balances.

    Memory a running service uses above its leases is charged to it: its own
    (non-realtime, below the preemption bound) requests are stopped first, and other
    work yields only for the rest of the shortfall. Once measured, the excess is in
    the ledger until the next sample, so the shortfall other work must cover is what
    remains after the charged bytes.
    """
    charging = world.knobs.switches.pressure_charging
    ledger = world.ledger
    charges = world.learned.charged
    for device in world.devices:
        if ledger.available(device) >= 0:
            continue
        charged = [
            world.services[n]
            for n in (charges if charging else ())
            if world.services[n].spec.device == device
        ]
        excess = sum(charges[s.name] for s in charged)
        for svc in sorted(charged, key=lambda s: (-charges[s.name], s.name)):
            if svc.spec.cls is ServiceClass.REALTIME:
                continue
            running = sorted(svc.inflight.values(), key=lambda r: -(r.dispatched_at or 0.0))
            for req in running:
                if ledger.available(device) >= 0 or not self._may_preempt(world, req):
                    continue
                world.preempt(
                    req,
                    reason=Reason.OVER_ESTIMATE,
                    detail=f"{svc.name} measured {charges[svc.name]} B above its leases",
                )
        need = min(0, -excess)
        if ledger.available(device) < need:
            self.make_room(
                world, device, need, ServiceClass.REALTIME, None, Reason.FOREIGN_PRESSURE
            )
