"""Learning from being wrong: crashes and measurements above the leases raise a service's
calibration at once, and memory measured above what was accounted is charged to the
service using it (``failure_calibration``, ``pressure_charging``, ``cache_accounting``).
"""

from __future__ import annotations

from accelmux.core.oom import attribute
from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.policies.accelmux.records import RoomFor, Seam
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.types import Category, Reason, ServiceClass
from accelmux.core.world import ServiceState


class Learning:
    """Learning from crashes and measurements, and giving memory back under pressure."""

    def __init__(self, seam: Seam, room: Room) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.room = room

    def learn(self) -> None:
        """Learn from being wrong, at once: crashes and measurements above the leases.

        A crash with requests in flight (an OOM kills the service that asked) raises the
        service's calibration to at least twice what those requests held. After each
        memory sample, a running service whose measured activation memory exceeds its
        leases and the highest activation measured before (what a caching allocator may
        still hold from earlier requests) is *charged* with the excess:
        its calibration rises to what was measured, and until it is measured within its
        leases it runs one request at a time and gives back its own work first under
        pressure (``Learning.relieve_pressure``).

        What it learns changes decisions on the service's device, so it touches the
        device's epoch (a round there is not a repeat of an earlier one).
        """
        knobs = self.view.knobs
        learn = knobs.switches.failure_calibration
        for name, size in list(self.view.learned.sizes.items()):
            if not size.testing and size.retest_at <= self.view.now:
                svc = self.view.services[name]
                self.ops.start_retest(svc)
                self.ops.touch(svc.spec.device)
        for svc in self.learners():
            name = svc.name
            dev = svc.spec.device
            if self.ops.see_crashes(svc):
                self.ops.touch(dev)
                if learn:
                    self.learn_from_crash(svc)
            if self.view.sampled_at.get(dev) != self.view.now:
                if not svc.inflight and self.ops.clear_charge(svc):
                    self.ops.touch(dev)
                continue
            self.ops.touch(dev)
            if not svc.holds_memory:
                self.ops.forget_activation(svc)
                continue
            # What the load measured above its leases is resident memory, not activations.
            reserved = max(
                0, self.view.ledger.amount(dev, name, Category.RESERVED) - svc.load_excess
            )
            leases = sum(r.active_lease.nbytes for r in svc.inflight.values() if r.active_lease)
            measured = reserved + leases
            before = self.ops.raise_high_water(svc, measured)
            excess = measured - max(leases, before)
            if (
                not svc.inflight
                and reserved > TUNING.excess_tolerance
                and knobs.switches.cache_accounting
            ):
                # a property of the backend: every replica of the service caches alike
                self.ops.mark_caching(svc)
            if not svc.inflight or excess <= TUNING.excess_tolerance:
                self.ops.clear_charge(svc)
                continue
            self.ops.charge(svc, excess)
            if learn:
                estimated = sum(r.estimate.active_bytes for r in svc.inflight.values())
                self.ops.observe_excess(svc, estimated, measured)

    def learn_from_crash(self, svc: ServiceState) -> None:
        """What a crash of ``svc`` teaches. A request that ran out of memory with what the
        shell measured (``crash_oom``) is attributed first (:func:`attribute`): only one
        that asked more than its lease changes the service's projection, by what it
        asked, never past the device's usable memory; the others running beside it
        caused nothing. A crash with nothing measured raises the calibration to at least
        twice what each running request held (``observe_failure``)."""
        oom = svc.crash_oom
        if oom is None:
            for estimated, lease in svc.crash_held:
                self.ops.observe_failure(svc, estimated, lease)
            return
        if oom.held is None:
            return  # the request that ran out is not known: nothing to attribute it to
        estimated, lease = oom.held
        dev = self.view.devices[svc.spec.device]
        report = attribute(
            asked=oom.asked,
            granted=lease,
            used_besides=oom.used_besides,
            capacity=dev.capacity_bytes,
            ceiling=dev.usable_bytes,
        )
        self.ops.note_oom(svc, f"{report.cause.value}: {report.evidence}")
        if report.learned is not None:
            self.ops.observe_request_failure(svc, estimated, report.learned)

    def learners(self) -> list[ServiceState]:
        """The services :meth:`Learning.learn` may learn from this round, in spec order.

        A crash leaves its service CRASHED until the round after it (the Manager applies
        the event, then the policy decides), a charge is lifted only from a charged
        service, and measurements come for the services of a device sampled now: every
        other service would pass through ``learn`` unchanged, so it is not visited.
        """
        view = self.view
        now = view.now
        sampled = [dev for dev, at in view.sampled_at.items() if at == now]
        charged = view.learned.charged
        if not sampled and not charged and not len(view.crashed):
            return []  # most rounds: nothing crashed, charged or measured
        found = {s.name: s for s in view.crashed}
        for name in charged:
            found[name] = view.services[name]
        for dev in sampled:
            found.update((s.name, s) for s in view.services_by_device[dev])
        return sorted(found.values(), key=lambda s: s.index)

    def relieve_pressure(self) -> None:
        """Foreign or reserved memory grew: give memory back until the ledger balances.

        Memory a running service uses above its leases is charged to it: its own
        (non-realtime, below the preemption bound) requests are stopped first, and other
        work yields only for the rest of the shortfall. Once measured, the excess is in
        the ledger until the next sample, so the shortfall other work must cover is what
        remains after the charged bytes.
        """
        charging = self.view.knobs.switches.pressure_charging
        ledger = self.view.ledger
        charges = self.view.learned.charged
        for device in self.view.devices:
            if ledger.available(device) >= 0:
                continue
            charged = [
                self.view.services[n]
                for n in (charges if charging else ())
                if self.view.services[n].spec.device == device
            ]
            excess = sum(charges[s.name] for s in charged)
            for svc in sorted(charged, key=lambda s: (-charges[s.name], s.name)):
                if svc.spec.cls is ServiceClass.REALTIME:
                    continue
                running = sorted(svc.inflight.values(), key=lambda r: -(r.dispatched_at or 0.0))
                for req in running:
                    if ledger.available(device) >= 0 or not facts.may_preempt(self.view, req):
                        continue
                    self.ops.preempt(
                        req,
                        reason=Reason.OVER_ESTIMATE,
                        detail=f"{svc.name} measured {charges[svc.name]} B above its leases",
                    )
            need = min(0, -excess)
            if ledger.available(device) < need:
                self.room.make_room(
                    device, need, RoomFor(ServiceClass.REALTIME, None, Reason.FOREIGN_PRESSURE)
                )
