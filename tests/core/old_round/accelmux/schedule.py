"""One round of scheduling: the round's scratch state (:class:`Round`), the waiting requests
considered in class order, and skipping devices and requests a round would only decide
again as before.
"""

from __future__ import annotations

from accelmux.core.specs import room_rank
from accelmux.core.types import (
    ServiceClass,
)

from .interface import Parts, Round
from .state import RequestState, ServiceState, World


def schedule(self: Parts, world: World) -> None:
    if not world.waiting:
        return  # a device's quiet record stays true: it names the state it saw
    rnd, classes = _open_round(self, world)
    if len(world.waiting) <= self.few_waiting:
        # A short queue: considering every request costs less than finding the ones
        # to skip (both decide the same).
        for req in sorted(world.waiting.values(), key=lambda r: _rank_key(world, r)):
            self._consider(world, req, rnd)
            world.mark_announced(req)
        return
    start, inputs = _find_quiet(self, world, rnd)
    # Requests in rank order (class order, a steady service's work before batch), then
    # arrival order; those requeued meanwhile (preempted in this round) wait for the next.
    mark = world.queue_mark
    for cls, steady in turns(world, classes):
        todo = [r for r in self._unsettled(world, cls, rnd) if _in_turn(world, r, mark, steady)]
        for req in sorted(todo, key=lambda r: r.seq):
            self._consider(world, req, rnd)
            world.mark_announced(req)
    # Where the epoch did not move, nothing there changed: the inputs read now are
    # those at the start of the round.
    self._quiet = {
        dev: (epoch, inputs[dev] if dev in inputs else self._round_inputs(world, rnd, dev))
        for dev, epoch in start.items()
        if world.epoch(dev) == epoch
    }


def _open_round(self: Parts, world: World) -> tuple[Round, set[ServiceClass]]:
    """A new round's realtime and class state, and the classes with waiting requests."""
    rnd = Round(tod=world.time_of_day())
    knobs = world.knobs
    hold = knobs.switches.realtime_hold
    grace = knobs.realtime_grace_s  # 0 (the default) turns it off
    for svcs in world.realtime_by_device.values():
        for svc in svcs:
            if (hold and svc.inflight) or world.now < svc.last_used + grace:
                rnd.realtime_active.add(svc.spec.device)
    if knobs.switches.realtime_yield:
        rnd.realtime_work = self._round_realtime_devices(world)
    if knobs.switches.batch_yield:
        for svc in world.busy:
            if svc.spec.cls is ServiceClass.INTERACTIVE:
                rnd.interactive_active.add(svc.spec.device)
    classes: set[ServiceClass] = set()
    for (dev, cls), count in world.waiting_classes.items():
        if not count:
            continue
        classes.add(cls)
        if hold and cls is ServiceClass.REALTIME:
            rnd.realtime_active.add(dev)
        current = rnd.higher_waiting.get(dev)
        if current is None or cls < current:
            rnd.higher_waiting[dev] = cls
    return rnd, classes


def _find_quiet(
    self: Parts, world: World, rnd: Round
) -> tuple[dict[str, int], dict[str, tuple[object, ...]]]:
    """Each device's epoch at the start of the round and the round inputs read; a device
    whose state (its World epoch) and round inputs are those of a round that changed
    nothing there (wait reasons aside) would repeat it: it goes to ``rnd.quiet``. Its
    inputs are read only where the epoch alone does not tell it apart."""
    start = {dev: world.epoch(dev) for dev in world.devices}
    inputs: dict[str, tuple[object, ...]] = {}
    for dev, epoch in start.items():
        seen = self._quiet.get(dev)
        if seen is not None and seen[0] == epoch:
            inputs[dev] = self._round_inputs(world, rnd, dev)
            if seen[1] == inputs[dev]:
                rnd.quiet.add(dev)
    return start, inputs


def _rank_key(world: World, req: RequestState) -> tuple[int, int, int]:
    """A waiting request's place in a round: its rank (:func:`room_rank`), class and
    arrival, the order of :func:`turns` (steady batch work, then steady background)."""
    steady = world.services[req.service].spec.steady
    return (room_rank(req.cls, steady=steady), int(req.cls), req.seq)


def _in_turn(world: World, req: RequestState, mark: int, steady: bool | None) -> bool:
    """Whether the turn of its class that takes its services' requests if steady is
    ``steady`` (all: None) decides ``req`` this round: it was queued by ``mark``."""
    return req.queued_mark <= mark and (
        steady is None or world.services[req.service].spec.steady is steady
    )


def turns(world: World, classes: set[ServiceClass]) -> list[tuple[ServiceClass, bool | None]]:
    """The turns of a round in rank order (:func:`room_rank`): each a class waiting
    requests have and which of its services' requests it takes (steady ones, the others,
    or all: None). A steady service's batch and background work takes its turn before
    batch, so that the memory its room-making frees goes to it, not back to batch work."""
    steady_waiting = any(s.spec.steady for s in world.queued)
    if not steady_waiting:
        return [(cls, None) for cls in sorted(classes)]
    low = [cls for cls in sorted(classes) if cls >= ServiceClass.BATCH]
    return [
        *((cls, None) for cls in sorted(classes) if cls < ServiceClass.BATCH),
        *((cls, True) for cls in low),
        *((cls, False) for cls in low),
    ]


def round_inputs(self: Parts, world: World, rnd: Round, device: str) -> tuple[object, ...]:
    """What a round's decisions on ``device`` read besides its state: time (windows,
    backoffs of the queued services there) and the round's realtime and class state.
    """
    now = world.now
    in_window = self._in_window
    queued = tuple(
        # no windows: inside them (what _in_window says, without the call)
        (svc.index, not spec.windows or in_window(svc, rnd), now < svc.backoff_until)
        for svc in world.queued
        if (spec := svc.spec).device == device
    )
    return (
        device in rnd.realtime_active,
        device in rnd.realtime_work,
        device in rnd.interactive_active,
        rnd.higher_waiting.get(device),
        queued,
        self._share_thresholds(world, device),
    )


def in_window(svc: ServiceState, rnd: Round) -> bool:
    """Whether ``svc`` has no windows or one of them is open: once per round."""
    if not svc.spec.windows:
        return True
    inside = rnd.inside.get(svc.name)
    if inside is None:
        inside = rnd.inside[svc.name] = svc.spec.in_window(rnd.tod)
    return inside


def unsettled(self: Parts, world: World, cls: ServiceClass, rnd: Round) -> list[RequestState]:
    """Waiting requests of ``cls`` that this round may decide differently.

    Called when the class's turn comes. Whether a request has to wait without
    competing for memory (:meth:`_must_wait`) depends, by then, only on the round's
    state and on its service, and none of them changes during the class's turn. A
    request already told to wait for that same reason would only be told again (a
    no-op): it is skipped. A request never told why (new or preempted) is not.
    """
    out: list[RequestState] = []
    fair_progress = world.knobs.switches.fair_progress
    for dev in world.devices:
        services = world.queued_services(dev, cls)
        if not len(services) or dev in rnd.quiet:
            continue
        steady = any(s.spec.steady for s in services)
        group = self._class_must_wait(dev, cls, rnd, fair_progress, steady)
        if group is not None and world.waiting_causes.get(
            (dev, cls, group[0]), 0
        ) == world.waiting_classes.get((dev, cls), 0):
            continue
        for svc in services:
            wait = self._service_wait(world, svc, cls, rnd)[1]
            if wait is None:
                out.extend(svc.queue.values())
            else:
                out.extend(r for r in svc.queue.values() if r.wait_reason is not wait[0])
    return out
