"""One round of scheduling: the round's scratch state (:class:`Round`), the waiting requests
considered in class order, and skipping devices and requests a round would only decide
again as before.
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.admission import Admission
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import Round, Seam
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.specs import room_rank
from accelmux.core.types import Reason, ResizeSupport, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceState, WorldView

#: The statuses of a service that is down (it holds no memory, a load would bring it up).
_DOWN = (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)

#: Up to this many waiting requests a round considers them all, skipping nothing.
FEW_WAITING = 8


class Schedule:
    """One round of scheduling: the waiting requests considered in class order."""

    def __init__(self, seam: Seam, admission: Admission, time_sharing: TimeSharing) -> None:
        #: Up to this many waiting requests a round considers them all (FEW_WAITING).
        self.few_waiting = FEW_WAITING
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        self.admission = admission
        self.time_sharing = time_sharing

    def schedule(self) -> None:
        if not self.view.waiting:
            return  # a device's quiet record stays true: it names the state it saw
        rnd, classes = self._open_round()
        if len(self.view.waiting) <= self.few_waiting:
            # A short queue: considering every request costs less than finding the ones
            # to skip (both decide the same).
            for req in sorted(self.view.waiting.values(), key=lambda r: _rank_key(self.view, r)):
                self.consider(req, rnd)
                self.ops.mark_announced(req)
            return
        start, inputs = self._find_quiet(rnd)
        # Requests in rank order (class order, a steady service's work before batch), then
        # arrival order; those requeued meanwhile (preempted in this round) wait for the next.
        mark = self.view.queue_mark
        for cls, steady in turns(self.view, classes):
            todo = [r for r in self.unsettled(cls, rnd) if _in_turn(self.view, r, mark, steady)]
            for req in sorted(todo, key=lambda r: r.seq):
                self.consider(req, rnd)
                self.ops.mark_announced(req)
        # Where the epoch did not move, nothing there changed: the inputs read now are
        # those at the start of the round.
        quiet = self.cache.quiet
        quiet.clear()
        for dev, epoch in start.items():
            if self.view.epoch(dev) == epoch:
                quiet.put(dev, epoch, inputs[dev] if dev in inputs else self.round_inputs(rnd, dev))

    def consider(self, req: RequestState, rnd: Round) -> None:
        """Decide ``req`` (``Admission.consider``), or replay its last decision when it
        would only repeat it.

        A request of a service that is down, told to wait for memory, whose last
        consideration did nothing else (no action; at most it marked its device's
        blocked class for the rest of the round) decides the same while nothing it read
        has changed (:meth:`inputs_of`): its device's memory state, its service, the
        round's state on its device, the time where the time matters. Then it is not
        considered again; what it set in the round (the blocked class) is set again at
        its turn, so that the requests after it read what they would have read."""
        view = self.view
        svc = view.services[req.service]
        dev = svc.spec.device
        inputs = self.inputs_of(req, svc, rnd) if self.cache.enabled else None
        if inputs is not None:
            hit = self.cache.considered.entries.get(req.request_id)
            if hit is not None and hit[0] == inputs:
                if hit[1]:
                    rnd.blocked[dev] = min(req.cls, rnd.blocked.get(dev, req.cls))
                return
        version = view.version
        blocked = rnd.blocked.get(dev)
        self.admission.consider(req, rnd)
        if (
            inputs is not None
            and view.version == version  # it did nothing: no action, no explanation
            and req.wait_reason is Reason.NO_MEMORY
            and svc.status in _DOWN
            and req.request_id in view.waiting
        ):
            self.cache.considered.put(req.request_id, inputs, rnd.blocked.get(dev) != blocked)

    def inputs_of(
        self, req: RequestState, svc: ServiceState, rnd: Round
    ) -> tuple[object, ...] | None:
        """What deciding ``req`` reads, when it waits for memory for a load of ``svc``
        (down, its pool fixed: sized without its queue); None otherwise (it is decided).

        The device's memory state moves ``memory_epoch``: every event and action there
        but a queue of a service that is down changing (a survey sees only loaded
        services' queues). Beside it, what is not memory: the service's status,
        backoff, window and calibrations, the realtime peaks, the round's state on the
        device, and what time sharing could pause there now (time alone changes it)."""
        if (
            svc.status not in _DOWN
            or req.wait_reason is not Reason.NO_MEMORY
            or not req.announced
            or req.paused
            or svc.resize_support is ResizeSupport.NEXT_LOAD
        ):
            return None
        view = self.view
        dev = svc.spec.device
        cal = svc.calibration
        sharing: object = None
        if self.time_sharing.room_key(dev, req) is not None:
            sharing = self.cache.share_thresholds.get(dev, None)
            if sharing is Miss.MISS:
                sharing = self.cache.share_thresholds.put(
                    dev, None, facts.share_thresholds(view, dev)
                )
        return (
            view.memory_epoch(dev),
            svc.status,
            view.now < svc.backoff_until,
            facts.in_window(svc, rnd),
            cal.active.version,
            cal.resident.version,
            svc.tier,
            view.learned.realtime_peak_changes,
            dev in view.load_oom_devices,
            rnd.blocked.get(dev),
            dev in rnd.realtime_active,
            dev in rnd.realtime_work,
            dev in rnd.interactive_active,
            rnd.higher_waiting.get(dev),
            sharing,
        )

    def _open_round(self) -> tuple[Round, set[ServiceClass]]:
        """A new round's realtime and class state, and the classes with waiting requests."""
        rnd = Round(tod=self.view.time_of_day())
        knobs = self.view.knobs
        hold = knobs.switches.realtime_hold
        grace = knobs.realtime_grace_s  # 0 (the default) turns it off
        for svcs in self.view.realtime_by_device.values():
            for svc in svcs:
                if (hold and svc.inflight) or self.view.now < svc.last_used + grace:
                    rnd.realtime_active.add(svc.spec.device)
        if knobs.switches.realtime_yield:
            rnd.realtime_work = self.time_sharing.round_realtime_devices()
        if knobs.switches.batch_yield:
            for svc in self.view.busy:
                if svc.spec.cls is ServiceClass.INTERACTIVE:
                    rnd.interactive_active.add(svc.spec.device)
        classes: set[ServiceClass] = set()
        for (dev, cls), count in self.view.waiting_classes.items():
            if not count:
                continue
            classes.add(cls)
            if hold and cls is ServiceClass.REALTIME:
                rnd.realtime_active.add(dev)
            current = rnd.higher_waiting.get(dev)
            if current is None or cls < current:
                rnd.higher_waiting[dev] = cls
        return rnd, classes

    def _find_quiet(self, rnd: Round) -> tuple[dict[str, int], dict[str, tuple[object, ...]]]:
        """Each device's epoch at the start of the round and the round inputs read; a device
        whose state (its WorldView epoch) and round inputs are those of a round that changed
        nothing there (wait reasons aside) would repeat it: it goes to ``rnd.quiet``. Its
        inputs are read only where the epoch alone does not tell it apart."""
        start = {dev: self.view.epoch(dev) for dev in self.view.devices}
        inputs: dict[str, tuple[object, ...]] = {}
        for dev, epoch in start.items():
            seen = self.cache.quiet.get(dev, epoch)
            if seen is not Miss.MISS:
                inputs[dev] = self.round_inputs(rnd, dev)
                if seen == inputs[dev]:
                    rnd.quiet.add(dev)
        return start, inputs

    def round_inputs(self, rnd: Round, device: str) -> tuple[object, ...]:
        """What a round's decisions on ``device`` read besides its state: time (windows,
        backoffs of the queued services there) and the round's realtime and class state.
        """
        now = self.view.now
        in_window = facts.in_window
        queued = tuple(
            # no windows: inside them (what _in_window says, without the call)
            (svc.index, not spec.windows or in_window(svc, rnd), now < svc.backoff_until)
            for svc in self.view.queued
            if (spec := svc.spec).device == device
        )
        return (
            device in rnd.realtime_active,
            device in rnd.realtime_work,
            device in rnd.interactive_active,
            rnd.higher_waiting.get(device),
            queued,
            facts.share_thresholds(self.view, device),
        )

    def unsettled(self, cls: ServiceClass, rnd: Round) -> list[RequestState]:
        """Waiting requests of ``cls`` that this round may decide differently.

        Called when the class's turn comes. Whether a request has to wait without
        competing for memory (:meth:`Admission.must_wait`) depends, by then, only on the round's
        state and on its service, and none of them changes during the class's turn. A
        request already told to wait for that same reason would only be told again (a
        no-op): it is skipped. A request never told why (new or preempted) is not. With
        the cache off, nothing is skipped.
        """
        if not self.cache.enabled:
            return [r for r in self.view.waiting.values() if r.cls is cls]
        out: list[RequestState] = []
        fair_progress = self.view.knobs.switches.fair_progress
        for dev in self.view.devices:
            services = self.view.queued_services(dev, cls)
            if not len(services) or dev in rnd.quiet:
                continue
            steady = any(s.spec.steady for s in services)
            group = facts.class_must_wait(dev, cls, rnd, fair_progress, steady)
            if group is not None and self.view.waiting_causes.get(
                (dev, cls, group[0]), 0
            ) == self.view.waiting_classes.get((dev, cls), 0):
                continue
            for svc in services:
                wait = self.admission.service_wait(svc, cls, rnd)[1]
                if wait is None:
                    out.extend(svc.queue.values())
                else:
                    out.extend(r for r in svc.queue.values() if r.wait_reason is not wait[0])
        return out


def _rank_key(view: WorldView, req: RequestState) -> tuple[int, int, int]:
    """A waiting request's place in a round: its rank (:func:`room_rank`), class and
    arrival, the order of :func:`turns` (steady batch work, then steady background)."""
    steady = view.services[req.service].spec.steady
    return (room_rank(req.cls, steady=steady), int(req.cls), req.seq)


def _in_turn(view: WorldView, req: RequestState, mark: int, steady: bool | None) -> bool:
    """Whether the turn of its class that takes its services' requests if steady is
    ``steady`` (all: None) decides ``req`` this round: it was queued by ``mark``."""
    return req.queued_mark <= mark and (
        steady is None or view.services[req.service].spec.steady is steady
    )


def turns(view: WorldView, classes: set[ServiceClass]) -> list[tuple[ServiceClass, bool | None]]:
    """The turns of a round in rank order (:func:`room_rank`): each a class waiting
    requests have and which of its services' requests it takes (steady ones, the others,
    or all: None). A steady service's batch and background work takes its turn before
    batch, so that the memory its room-making frees goes to it, not back to batch work."""
    steady_waiting = any(s.spec.steady for s in view.queued)
    if not steady_waiting:
        return [(cls, None) for cls in sorted(classes)]
    low = [cls for cls in sorted(classes) if cls >= ServiceClass.BATCH]
    return [
        *((cls, None) for cls in sorted(classes) if cls < ServiceClass.BATCH),
        *((cls, True) for cls in low),
        *((cls, False) for cls in low),
    ]
