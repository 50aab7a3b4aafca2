"""Stopping running work for higher-class work: which services' requests may be stopped
(:func:`preemptible`), the preemption and pause bounds, and the stop itself (a pause that
parks the request's KV when its backend can, else a preemption).
"""

from __future__ import annotations

from accelmux.core.specs import floored, ranks_below
from accelmux.core.types import (
    Reason,
    Residency,
    ServiceClass,
)

from .heuristics import TUNING
from .interface import Parts
from .state import RequestState, ServiceState, World


def may_preempt(self: Parts, world: World, req: RequestState) -> bool:
    """A request may be preempted again: it has not reached the bound."""
    return not world.knobs.switches.preemption_bound or req.attempt <= TUNING.max_preemptions


def may_stop(self: Parts, world: World, req: RequestState) -> bool:
    """A running request may be stopped for higher-class work: paused (below the
    pause bound) when its backend can pause, else preempted (below that bound)."""
    if self._can_pause(world, world.services[req.service]):
        return req.pauses < TUNING.max_pauses
    return self._may_preempt(world, req)


def stop(
    self: Parts,
    world: World,
    req: RequestState,
    cls: ServiceClass,
    requester: RequestState | None,
) -> None:
    """Stop a running request to make room: pause and park it when its backend can,
    else preempt it (it starts again later)."""
    svc = world.services[req.service]
    if req.pausing is not None:
        return  # its pause is under way: its memory comes back with the answer
    if self._can_pause(world, svc):
        why = requester.request_id if requester is not None else f"class {cls.label}"
        if world.pause(req, reason=Reason.TIME_SHARE, park=True, detail=f"room for {why}"):
            if requester is not None:
                self._yielded_to[req.request_id] = requester.request_id
            return
    world.preempt(
        req, reason=Reason.PREEMPTED_FOR_HIGHER_CLASS, detail=f"room for class {cls.label}"
    )


def preemptible(svc: ServiceState, cls: ServiceClass, steady: bool = False) -> bool:
    """Whether work of ``svc`` may be stopped (and re-queued) for class ``cls`` (of a
    steady service when ``steady``: it ranks above batch, :func:`room_rank`).

    Batch and background work yields to any higher rank; a non-LLM on-demand
    interactive job (an image) yields to realtime work: it restarts a few seconds
    later within its looser SLO, while a voice request cannot wait.
    """
    if not ranks_below(svc.spec, cls, steady=steady) or floored(svc.spec, cls):
        return False
    if svc.spec.cls >= ServiceClass.BATCH:
        return True
    return (
        cls is ServiceClass.REALTIME
        and svc.spec.residency is Residency.ON_DEMAND
        and not svc.spec.kind.is_llm
    )


def stoppable(self: Parts, world: World, svc: ServiceState) -> list[RequestState]:
    """The running requests of ``svc`` that :meth:`_may_stop` allows to stop."""
    running = svc.inflight.values()
    if self._can_pause(world, svc):
        return [r for r in running if r.pauses < TUNING.max_pauses]
    if not world.knobs.switches.preemption_bound:
        return list(running)
    return [r for r in running if r.attempt <= TUNING.max_preemptions]
