"""What the daemon keeps of the Manager's decisions besides its own log.

* every decision goes to the :class:`~accelmux.runtime.bus.DecisionBus` while someone
  follows ``/admin/events``;
* a request that is delayed (Enqueue) or refused (Reject) keeps the ledger as it stood
  then, for ``/admin/explain/{id}`` (the last :data:`DECISION_LEDGERS_KEPT` requests);
* a broken invariant (:class:`~accelmux.core.manager.InvariantBroken`) is logged at ERROR
  with the decision log that led to it, and published on the bus;
* each service's last unload (``last_unloads``): its reason and detail, when (wall
  clock), its tier, and for whom: the services the same round of decisions then loaded
  or dispatched on that device, else the requests waiting there when it was decided
  (an operator's unload or an expired TTL is for nobody).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from accelmux.core.actions import Action, Dispatch, Enqueue, Load, Reject, Unload
from accelmux.core.events import Demand
from accelmux.core.manager import Decision, InvariantBroken, Manager
from accelmux.core.types import Reason
from accelmux.runtime.bus import DecisionBus
from accelmux.runtime.explain import eviction_needed, ledger_picture

log = logging.getLogger("accelmux.runtime")
#: Ledger pictures kept for /admin/explain/{id} (oldest dropped first).
DECISION_LEDGERS_KEPT = 1000
#: Waiting requests named as what an unload was for (highest class, oldest first).
UNLOAD_FOR_KEPT = 5
#: Unloads made for no other service: the operator's, an idle TTL's, the daemon stopping,
#: a resize that waits for the next load (foreign pressure names the foreign programs in
#: its detail).
FOR_NOBODY = frozenset(
    {
        Reason.ADMIN,
        Reason.TTL_EXPIRED,
        Reason.SHUTTING_DOWN,
        Reason.RESIZE_AT_NEXT_LOAD,
        Reason.FOREIGN_PRESSURE,
    }
)


class DecisionRecorder:
    def __init__(
        self, manager: Manager, bus: DecisionBus, demand_of: Callable[[str], Demand | None]
    ) -> None:
        self._manager = manager
        self._bus = bus
        self._demand_of = demand_of
        #: The ledger at the moment a request was delayed or refused, by request id.
        self.ledgers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: Each service's last unload (see the module's docstring).
        self.last_unloads: dict[str, dict[str, Any]] = {}
        self._round: tuple[float, list[str]] = (-1.0, [])  # (now, unloads this round)

    def observe(self, now: float, action: Action) -> None:
        """Called by the driver with every action, before it is executed."""
        if self._bus.active:
            self._bus.publish(Decision(now, action).as_dict())
        if isinstance(action, (Reject, Enqueue)):
            self._record_ledger(action)
        if self._round[0] != now:
            self._round = (now, [])
        if isinstance(action, Unload):
            self._record_unload(action)
        elif isinstance(action, (Load, Dispatch)):
            self._credit_unloads(action.service)

    def _device_of(self, service: str) -> str | None:
        svc = self._manager.view.services.get(service)
        return svc.spec.device if svc is not None else None

    def _record_unload(self, action: Unload) -> None:
        world = self._manager.view
        device = self._device_of(action.service)
        waiting = sorted(
            (r for r in world.waiting.values() if r.service != action.service),
            key=lambda r: (r.cls, r.arrived_at),
        )
        waiting = [r for r in waiting if self._device_of(r.service) == device]
        nobody = action.reason in FOR_NOBODY
        self.last_unloads[action.service] = {
            "reason": action.reason.value,
            "detail": action.detail,
            "tier": action.tier.value,
            "at": round(time.time(), 3),
            "for_services": [] if nobody else list(dict.fromkeys(r.service for r in waiting)),
            "for_requests": [] if nobody else [r.request_id for r in waiting[:UNLOAD_FOR_KEPT]],
        }
        if not nobody:
            self._round[1].append(action.service)

    def _credit_unloads(self, service: str) -> None:
        """A load or dispatch of ``service`` in the round that unloaded others on its
        device: those unloads were for it (it goes first in their ``for_services``)."""
        device = self._device_of(service)
        for unloaded in self._round[1]:
            record = self.last_unloads.get(unloaded)
            if record is None or unloaded == service or self._device_of(unloaded) != device:
                continue
            names = [n for n in record["for_services"] if n != service]
            record["for_services"] = [service, *names]

    def invariant_broken(self, report: InvariantBroken) -> None:
        """A bug in the policy or the Manager: logged with the decisions that led to it."""
        lines = [json.dumps(d, sort_keys=True) for d in (*report.recent, *report.actions)]
        log.error(
            "invariant broken at t=%.3f: %s; the decision log up to it (%d before the round, "
            "then the round's %d):\n%s",
            report.time,
            report.detail,
            len(report.recent),
            len(report.actions),
            "\n".join(lines),
        )
        if self._bus.active:
            self._bus.publish(report.as_dict())

    def _record_ledger(self, action: Reject | Enqueue) -> None:
        """Keep the ledger as it stands when a request is delayed or refused."""
        snap = self._manager.snapshot().as_dict()
        picture = ledger_picture(snap)
        for device in picture.values():
            for name, entry in device["services"].items():
                entry["last_unload"] = self.last_unloads.get(name)
        world = self._manager.view
        svc = world.services.get(action.service)
        demand = self._demand_of(action.request_id)
        record: dict[str, Any] = {
            "decision": type(action).__name__.lower(),
            "reason": action.reason.value,
            "devices": picture,
        }
        if svc is not None and demand is not None:
            estimate = world.estimate(action.service, demand)
            needed = estimate.total
            if not svc.is_up:
                p = svc.spec.profile
                needed += p.weights + p.runtime + p.kv_floor
            record["request_bytes"] = needed
            record["eviction"] = eviction_needed(
                picture[svc.spec.device], needed, exclude=action.service
            )
        self.ledgers[action.request_id] = record
        self.ledgers.move_to_end(action.request_id)
        while len(self.ledgers) > DECISION_LEDGERS_KEPT:
            self.ledgers.popitem(last=False)
