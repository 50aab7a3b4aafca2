"""One round of scheduling: the round's scratch state (:class:`Round`), the waiting requests
considered in class order, and skipping devices and requests a round would only decide
again as before.
"""

from __future__ import annotations

import math

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.admission import Admission
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import Round, Seam
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.specs import room_rank, seconds_until_next_sorted
from accelmux.core.types import ResizeSupport, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceSetView, ServiceState, WorldView

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
        self.age_waiting()
        rnd, classes = self._open_round()
        if len(self.view.waiting) <= self.few_waiting:
            # A short queue: considering every request costs less than finding the ones
            # to skip (both decide the same).
            for req in sorted(self.view.waiting.values(), key=lambda r: _rank_key(self.view, r)):
                self.consider(req, rnd)
                self.ops.mark_announced(req)
            return
        start = self._find_quiet(rnd)
        # Requests in rank order (class order, a steady service's work before batch), then
        # arrival order; those requeued meanwhile (preempted in this round) wait for the next.
        mark = self.view.queue_mark
        for cls, steady in turns(self.view, classes):
            self._turn(cls, steady, rnd, mark)
        self.record_quiet(rnd, start)

    def age_waiting(self) -> None:
        """Age each waiting batch request past its ageing point (``facts.ages_at``), before
        the round reads anything: an ageing changes its device's state (``WorldOps.age``),
        so no record of an earlier round there is replayed."""
        view = self.view
        now = view.now
        due = [req for req, at in facts.not_yet_aged(view) if at <= now]
        for req in due:  # listed first: an ageing touches the device, not the queues
            self.ops.age(
                req,
                detail=f"waited {now - req.arrived_at:.1f} s, "
                f"{view.knobs.batch_age_fraction:g} of its deadline: idle "
                "interactive models with nothing waiting may be evicted for it",
            )

    def _turn(self, cls: ServiceClass, steady: bool | None, rnd: Round, mark: int) -> None:
        """The turn of class ``cls`` (of its steady services' requests, the others', or all:
        ``steady`` None): its unsettled requests queued by ``mark``, in arrival order,
        each considered (:meth:`consider`), or replayed when it is known at the start of
        the turn that its consideration would repeat its last one and nothing on its
        device has changed by its place in the turn (its memory epoch and the realtime
        peaks: what an action there moves). A device whose requests of the turn were
        all replayed or left out, with nothing there changed by the end of the turn,
        keeps that as its record of the turn (:meth:`unsettled`)."""
        view = self.view
        peaks = view.learned
        memory_epochs = view.memory_epochs
        considered = self.cache.considered.entries
        standing: dict[str, tuple[tuple[object, tuple[int, int, int]], float, bool]] = {}
        todo = self.unsettled(cls, rnd, mark, steady, standing)
        todo.sort(key=_first)
        for _, req, dev, stamp in todo:
            if (
                stamp is not None
                and stamp[0] == memory_epochs[dev]
                and stamp[1] == peaks.realtime_peak_changes
            ):
                # What its last consideration set in the round, set again (it did
                # nothing else); it was considered before, so it is announced already.
                if considered[req.request_id][1]:
                    rnd.block(dev, req.cls)
                continue
            self.consider(req, rnd)
            self.ops.mark_announced(req)
        turns = self.cache.turns
        for dev, (state, until, blocks) in standing.items():
            if state[1] == self.turn_state(dev, cls):  # nothing there changed since
                turns.put((dev, cls, steady), state, (until, blocks))

    def turn_state(self, dev: str, cls: ServiceClass) -> tuple[int, int, int]:
        """What moves when anything a turn of ``cls`` reads on ``dev`` may have changed, but
        the round's state and the time: the device's memory epoch, the realtime peaks, and
        its waiting requests of ``cls`` (:attr:`WorldView.queue_epochs`)."""
        view = self.view
        return (
            view.memory_epochs[dev],
            view.learned.realtime_peak_changes,
            view.queue_epochs[(dev, cls)],
        )

    def consider(self, req: RequestState, rnd: Round) -> None:
        """Decide ``req`` (``Admission.consider``), or replay its last decision when it
        would only repeat it.

        A request of a service that is down, already told why it waits, whose last
        consideration did nothing (no action, no explanation; at most it marked its
        device blocked for the rest of the round) decides the same while nothing it
        read has changed (:meth:`inputs_of`): its device's memory state, its service,
        the round's state on its device, the time where the time matters. Then it is not
        considered again; what it set in the round (its device blocked) is set again at
        its turn, so that the requests after it read what they would have read."""
        view = self.view
        svc = view.services[req.service]
        dev = svc.spec.device
        inputs = self.inputs_of(req, svc, rnd) if self.cache.enabled else None
        if inputs is not None:
            hit = self.cache.considered.entries.get(req.request_id)
            if hit is not None and hit[0] == inputs:
                if hit[1]:
                    rnd.block(dev, req.cls)
                return
        version = view.version
        marks = rnd.marks
        self.admission.consider(req, rnd)
        if (
            inputs is not None
            and view.version == version  # it did nothing: no action, no explanation
            and svc.status in _DOWN
            and req.request_id in view.waiting
        ):
            self.cache.considered.put(req.request_id, inputs, rnd.marks != marks)

    def inputs_of(
        self, req: RequestState, svc: ServiceState, rnd: Round
    ) -> tuple[object, ...] | None:
        """What deciding ``req`` reads when it waits for a load of ``svc`` (down, its pool
        fixed: sized without its queue), already told why; None otherwise (it is decided).

        The device's part (:meth:`device_inputs`), the service's (:meth:`service_inputs`)
        and the request's wait reason."""
        if (
            svc.status not in _DOWN
            or req.wait_reason is None
            or not req.announced
            or req.paused
            or svc.resize_support is ResizeSupport.NEXT_LOAD
        ):
            return None
        return (
            self.device_inputs(svc.spec.device, req.cls, rnd),
            self.service_inputs(svc, rnd),
            req.wait_reason,
        )

    def device_inputs(self, dev: str, cls: ServiceClass, rnd: Round) -> tuple[object, ...]:
        """What deciding a request of ``cls`` waiting for a load on ``dev`` reads of the
        device and the round.

        The device's memory state moves ``memory_epoch``: every event and action there
        but a queue of a service that is down changing (a survey sees only loaded
        services' queues). Beside it the realtime peaks, whether a load ran out of memory
        there, the round's state on the device (its blocked class only where it is
        higher than ``cls``: a request reads no other, see ``facts.held_back``), and what
        time sharing could pause there now (time alone changes it). Found once per round,
        device and class while the memory epoch, the peaks and the blocked class stay."""
        view = self.view
        blocked = rnd.blocked.get(dev)
        if blocked is not None and blocked >= cls:
            blocked = None
        stamp = (view.memory_epochs[dev], view.learned.realtime_peak_changes, blocked)
        key = (dev, cls)
        hit = self.cache.device_inputs.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        sharing: object = None
        if view.knobs.switches.time_share and dev in self.time_sharing.time_sharing_devices():
            sharing = self.share_thresholds(dev)
        found = (
            *stamp,
            dev in view.load_oom_devices,
            dev in rnd.realtime_active,
            dev in rnd.realtime_work,
            dev in rnd.interactive_active,
            rnd.higher_waiting.get(dev),
            sharing,
        )
        return self.cache.device_inputs.put(key, stamp, found)

    def service_inputs(self, svc: ServiceState, rnd: Round) -> tuple[object, ...]:
        """What deciding a request waiting for a load of ``svc`` reads of the service: its
        status, backoff, window, calibrations, tier and the size it learned from an
        out-of-memory load (its re-test)."""
        cal = svc.calibration
        size = self.view.learned.sizes.get(svc.name)
        return (
            svc.status,
            self.view.now < svc.backoff_until,
            facts.in_window(svc, rnd),
            cal.active.version,
            cal.resident.version,
            svc.tier,
            None if size is None else (size.nbytes, size.testing, size.retest_at),
        )

    def shared_compute(self) -> frozenset[str]:
        """The devices whose compute every model shares (``facts.compute_is_shared``)."""
        shared = self.cache.shared_compute.get(None, None)
        if shared is Miss.MISS:
            view = self.view
            shared = self.cache.shared_compute.put(
                None, None, frozenset(d for d in view.devices if facts.compute_is_shared(view, d))
            )
        return shared

    def _open_round(self) -> tuple[Round, set[ServiceClass]]:
        """A new round's realtime and class state, and the classes with waiting requests."""
        view = self.view
        rnd = Round(tod=view.time_of_day(), shared=self.shared_compute())
        knobs = view.knobs
        hold = knobs.switches.realtime_hold
        self._running_work(rnd)
        if knobs.switches.realtime_yield:
            rnd.realtime_work = self.time_sharing.round_realtime_devices()
        classes: set[ServiceClass] = set()
        for (dev, cls), count in view.waiting_classes.items():
            if not count:
                continue
            classes.add(cls)
            if hold and cls is ServiceClass.REALTIME:
                rnd.realtime_active.add(dev)
            current = rnd.higher_waiting.get(dev)
            if current is None or cls < current:
                rnd.higher_waiting[dev] = cls
        return rnd, classes

    def _running_work(self, rnd: Round) -> None:
        """The devices where realtime work runs or ended within the grace (``realtime_hold``)
        and where interactive work runs (``batch_yield``)."""
        view = self.view
        switches = view.knobs.switches
        hold = switches.realtime_hold
        now = view.now
        for dev, svcs in view.realtime_by_device.items():
            grace = facts.realtime_grace(view, dev)
            if grace > 0 and any(now < svc.last_used + grace for svc in svcs):
                rnd.realtime_active.add(dev)
        batch_yield = switches.batch_yield
        if hold or batch_yield:
            # A realtime service holds its device while it runs: the services running
            # are the busy ones.
            for svc in view.busy:
                cls = svc.spec.cls
                if cls is ServiceClass.REALTIME and hold:
                    rnd.realtime_active.add(svc.spec.device)
                elif cls is ServiceClass.INTERACTIVE and batch_yield:
                    rnd.interactive_active.add(svc.spec.device)

    def _find_quiet(self, rnd: Round) -> dict[str, int]:
        """Each device's epoch at the start of the round; a device whose state (its
        WorldView epoch), round state and clock are those of a round that changed nothing
        there (wait reasons aside) would repeat it: it goes to ``rnd.quiet``. The round's
        state there is read only where the epoch alone does not tell it apart; the clock
        is read as the time before which none of its queued services' backoffs ends and
        none of their windows opens or closes (:meth:`record_quiet`)."""
        start = dict(self.view.epochs)
        now = self.view.now
        for dev, epoch in start.items():
            seen = self.cache.quiet.get(dev, epoch)
            if seen is not Miss.MISS and now < seen[1] and seen[0] == self.round_inputs(rnd, dev):
                rnd.quiet.add(dev)
        return start

    def record_quiet(self, rnd: Round, start: dict[str, int]) -> None:
        """Where the epoch did not move, nothing there changed: the round's state read now
        is that at the start of the round (kept as it is where the device was quiet)."""
        quiet = self.cache.quiet
        view = self.view
        now = view.now
        for dev, epoch in start.items():
            if view.epochs[dev] != epoch:
                quiet.entries.pop(dev, None)
            elif dev not in rnd.quiet and self.cache.enabled:
                quiet.put(dev, epoch, (self.round_inputs(rnd, dev), self.flips_on(dev, now)))

    def round_inputs(self, rnd: Round, device: str) -> tuple[object, ...]:
        """What a round's decisions on ``device`` read besides its state and the clock: the
        round's realtime and class state, and what time sharing could pause there."""
        return (
            device in rnd.realtime_active,
            device in rnd.realtime_work,
            device in rnd.interactive_active,
            rnd.higher_waiting.get(device),
            self.share_thresholds(device),
        )

    def share_thresholds(self, device: str) -> tuple[object, ...]:
        """:func:`facts.share_thresholds` of ``device``, found once per round (none where no
        backend there declares a pause)."""
        found = self.cache.share_thresholds.get(device, None)
        if found is Miss.MISS:
            found = ()
            if device in self.time_sharing.pausing_devices():
                found = facts.share_thresholds(self.view, device)
            self.cache.share_thresholds.put(device, None, found)
        return found

    def unsettled(
        self,
        cls: ServiceClass,
        rnd: Round,
        mark: int,
        steady: bool | None,
        standing: dict[str, tuple[tuple[object, tuple[int, int, int]], float, bool]],
    ) -> list[Todo]:
        """The waiting requests of the turn of ``cls`` (queued by ``mark``, of services
        whose ``steady`` is that of the turn, or all: None) that this round may decide
        differently, as (arrival, request, device, stamp): ``stamp`` (the device's
        memory epoch and the realtime peaks now) when its consideration would repeat its
        last one as long as they stay (:meth:`consider`), else None.

        Called when the class's turn comes. Whether a request has to wait without
        competing for memory (:meth:`Admission.must_wait`) depends, by then, only on the
        round's state and on its service, and none of them changes during the class's
        turn. A request already told to wait for that same reason would only be told
        again (a no-op): it is left out. A request never told why (new or preempted) is
        not. With the cache off, every request is considered.

        A device whose requests of the turn were all left out or replayed (``standing``
        notes it, for :meth:`_turn` to keep) is left out as a whole while nothing there
        changes (:meth:`turn_state`), the round's state there stays, and the time stays
        before the next backoff end or window edge of its services: each request would
        be left out or replayed again; what they set in the round is set again.
        """
        view = self.view
        if not self.cache.enabled:
            return [
                (r.seq, r, view.services[r.service].spec.device, None)
                for r in view.waiting.values()
                if r.cls is cls and _in_turn(view, r, mark, steady)
            ]
        out: list[Todo] = []
        fair_progress = view.knobs.switches.fair_progress
        turns = self.cache.turns.entries
        for dev in view.devices:
            services = view.queued_services(dev, cls)
            if not len(services) or dev in rnd.quiet:
                continue
            is_steady = any(s.spec.steady for s in services)
            group = facts.class_must_wait(dev, cls, rnd, fair_progress, is_steady)
            if group is not None and view.waiting_causes.get(
                (dev, cls, group[0]), 0
            ) == view.waiting_classes.get((dev, cls), 0):
                continue
            device = self.device_inputs(dev, cls, rnd)
            state = (device, self.turn_state(dev, cls))
            hit = turns.get((dev, cls, steady))
            if hit is not None and hit[0] == state and view.now < hit[1][0]:
                if hit[1][1]:
                    rnd.block(dev, cls)
                continue
            found = self._unsettled_on(dev, services, (cls, steady, rnd, mark), device, out)
            if found is not None:
                standing[dev] = (state, *found)
        return out

    def _unsettled_on(
        self,
        dev: str,
        services: ServiceSetView,
        turn: tuple[ServiceClass, bool | None, Round, int],
        device: tuple[object, ...],
        out: list[Todo],
    ) -> tuple[float, bool] | None:
        """:meth:`unsettled` on ``dev``: its requests of the turn added to ``out``; when each
        is left out or replayed, (until when that holds by the clock: the next backoff
        end or window edge of their services, whether one of them sets the round's
        blocked class), else None."""
        cls, steady, rnd, mark = turn
        view = self.view
        now = view.now
        considered = self.cache.considered.entries
        stamp = (view.memory_epochs[dev], view.learned.realtime_peak_changes)
        until = math.inf
        blocks = False
        standing = True
        for svc in services:
            if steady is not None and svc.spec.steady is not steady:
                continue
            wait = self.admission.service_wait(svc, cls, rnd)[1]
            told = wait[0] if wait is not None else None
            service: tuple[object, ...] | None = None
            if svc.status in _DOWN and svc.resize_support is not ResizeSupport.NEXT_LOAD:
                service = self.service_inputs(svc, rnd)
            for r in svc.queue.values():
                reason = r.wait_reason
                if r.queued_mark > mark:
                    standing = False  # queued during this round: decided in the next
                    continue
                if told is not None and reason is told:
                    continue
                if service is not None and reason is not None and r.announced and not r.paused:
                    hit = considered.get(r.request_id)
                    if hit is not None and hit[0] == (device, service, reason):
                        out.append((r.seq, r, dev, stamp))
                        blocks = blocks or hit[1]
                        continue
                out.append((r.seq, r, dev, None))
                standing = False
            if standing:
                until = min(until, self.flips_at(svc, now))
        return (until, blocks) if standing else None

    def flips_on(self, dev: str, now: float) -> float:
        """The earliest :meth:`flips_at` of the services with waiting requests on ``dev``.

        Only a service backing off or with windows has one before the end of time: those
        two sets (the world's ``backing_off``, whose backoffs all end after ``now``, and
        ``queued_windowed``, all queued) are walked instead of every queued service."""
        view = self.view
        until = math.inf
        queued = view.queued
        for svc in view.backing_off:
            if svc.spec.device == dev and svc in queued and svc.backoff_until < until:
                until = svc.backoff_until
        for svc in view.queued_windowed:
            if svc.spec.device == dev:
                until = min(until, self.flips_at(svc, now))
        return until

    def flips_at(self, svc: ServiceState, now: float) -> float:
        """The next time after ``now`` at which the clock alone changes what a round reads
        of ``svc``: its backoff ends, or one of its windows opens or closes (a little
        before: the time of day is a sum of floats)."""
        until = svc.backoff_until if svc.backoff_until > now else math.inf
        if not svc.spec.windows:
            return until
        edges = self.window_edges(svc)
        if edges:
            until = min(
                until, now + seconds_until_next_sorted(edges, self.view.time_of_day()) - 1e-3
            )
        return until

    def window_edges(self, svc: ServiceState) -> tuple[float, ...]:
        """The edges of ``svc``'s windows, sorted, each once (what the spec says)."""
        hit = self.cache.service_edges.get(svc.name, None)
        if hit is Miss.MISS:
            hit = self.cache.service_edges.put(
                svc.name, None, tuple(sorted({e for w in svc.spec.windows for e in w.edges}))
            )
        return hit


#: A request of a turn: (arrival, request, device, the stamp under which it is replayed).
Todo = tuple[int, RequestState, str, tuple[int, int] | None]


def _first(item: Todo) -> int:
    return item[0]


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
