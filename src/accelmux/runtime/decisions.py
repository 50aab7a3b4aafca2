"""What the daemon keeps of the Manager's decisions besides its own log.

* every decision goes to the :class:`~accelmux.runtime.bus.DecisionBus` while someone
  follows ``/admin/events``;
* a request that is delayed (Enqueue) or refused (Reject) keeps the ledger as it stood
  then, for ``/admin/explain/{id}`` (the last :data:`DECISION_LEDGERS_KEPT` requests);
* a broken invariant (:class:`~accelmux.core.manager.InvariantBroken`) is logged at ERROR
  with the decision log that led to it, and published on the bus.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from accelmux.core.actions import Action, Enqueue, Reject
from accelmux.core.events import Demand
from accelmux.core.manager import Decision, InvariantBroken, Manager
from accelmux.runtime.bus import DecisionBus
from accelmux.runtime.explain import eviction_needed, ledger_picture

log = logging.getLogger("accelmux.runtime")
#: Ledger pictures kept for /admin/explain/{id} (oldest dropped first).
DECISION_LEDGERS_KEPT = 1000


class DecisionRecorder:
    def __init__(
        self, manager: Manager, bus: DecisionBus, demand_of: Callable[[str], Demand | None]
    ) -> None:
        self._manager = manager
        self._bus = bus
        self._demand_of = demand_of
        #: The ledger at the moment a request was delayed or refused, by request id.
        self.ledgers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def observe(self, now: float, action: Action) -> None:
        """Called by the driver with every action, before it is executed."""
        if self._bus.active:
            self._bus.publish(Decision(now, action).as_dict())
        if isinstance(action, (Reject, Enqueue)):
            self._record_ledger(action)

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
