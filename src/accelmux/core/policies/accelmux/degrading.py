"""Degrading: the forms of a service that may degrade (:mod:`accelmux.core.degrade`) after a
request chose one (:meth:`Routing.route_forms`).

Each round, for every such service:

1. **Move waiting requests down**: a request waiting on a form that is not up and cannot
   be held now (its room would evict a higher class, or only busy work could free it)
   moves to the best lesser form that is up or can be held (``degraded``); on the last
   form it waits there.
2. **Back up when room returns**: while a lesser form serves and nothing loads, the best
   better form whose whole footprint fits in free memory now, with a margin, loads
   (``room_returned``); it does not evict anyone to get there, so the move back never
   costs another service its memory.
3. **Retire**: a loaded lesser form with nothing running or waiting unloads once a better
   form of its service is loaded (``superseded``); its requests in flight finish first.

Every load and unload carries its reason and a detail in the decision log.
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.loading import Loading
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.routing import Routing
from accelmux.core.types import Reason, ServiceStatus
from accelmux.core.world import ServiceState

#: A better form loads when free memory exceeds its footprint by this share of it: a
#: foreign program that grows a little does not send it straight back down.
RESTORE_MARGIN = 0.1
_UP = (ServiceStatus.LOADED, ServiceStatus.LOADING)


class Degrading:
    """Moves requests between the forms of services that may degrade, and the forms back."""

    def __init__(self, seam: Seam, routing: Routing, loading: Loading, reserve: Reserve) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.routing = routing
        self.loading = loading
        self.reserve = reserve
        #: The groups whose services have forms (fixed by the spec).
        self._groups: list[str] | None = None
        #: Per group, the better form a lesser one left its place to (loads next).
        self._swapping: dict[str, str] = {}

    def groups(self) -> list[str]:
        if self._groups is None:
            self._groups = [
                g for g, members in self.view.groups.items() if members[0].spec.variant is not None
            ]
        return self._groups

    def step(self) -> None:
        for group in self.groups():
            forms = sorted(self.view.groups[group], key=facts.form_rank)
            self.move_down(forms)
            self.restore(forms)
            self.retire(forms)

    def move_down(self, forms: list[ServiceState]) -> None:
        for form in forms:
            if form.status in _UP or not form.queue:
                continue
            waiting = [q for q in form.queue.values() if q.dispatched_at is None and not q.paused]
            if not waiting or self.routing.holds(form, waiting[0].demand):
                continue
            below = [f for f in forms if facts.form_rank(f) > facts.form_rank(form)]
            if not below:
                continue  # the last form: its requests wait there (or meet their deadline)
            lesser = next((f for f in below if f.status in _UP), None) or self.routing.best_form(
                below, waiting[0].demand
            )
            if lesser is None:
                continue
            for q in waiting:
                self.ops.reroute(
                    q, lesser, detail=f"degraded: {facts.why_degraded(self.view, lesser)}"
                )

    def restore(self, forms: list[ServiceState]) -> None:
        up = [f for f in forms if f.status in _UP]
        if any(f.status in (ServiceStatus.LOADING, ServiceStatus.UNLOADING) for f in forms):
            return
        group = forms[0].spec.group
        if not up:  # a swap in place: the lesser form left, the better one loads now
            target = self._swapping.pop(group, None)
            form = next((f for f in forms if f.name == target), None)
            if form is not None and form.status is ServiceStatus.UNLOADED:
                self._load_better(form, None, self._room(form)[0])
            return
        self._swapping.pop(group, None)
        rank = facts.form_rank(up[0])
        for form in forms[:rank]:
            if not self._may_restore(form):
                continue
            pool, need, free = self._room(form)
            if free >= need * (1.0 + RESTORE_MARGIN):
                if self._load_better(form, up[0], pool):
                    return
                continue
            # Where a lesser form holds the better one's place on its GPU and runs nothing,
            # it leaves first and the better one loads in its place.
            idle = [
                f
                for f in up
                if f.spec.device == form.spec.device
                and f.status is ServiceStatus.LOADED
                and not (f.inflight or f.queue or f.paused_kv or f.pinned)
            ]
            freed = sum(facts.unload_frees(self.view, f) for f in idle)
            if len(idle) == len(up) and free + freed >= need * (1.0 + RESTORE_MARGIN):
                variant = form.spec.variant
                assert variant is not None
                for f in idle:
                    self.ops.unload(
                        f,
                        reason=Reason.SUPERSEDED,
                        detail=f"{variant.describe()} fits again in its place",
                    )
                self._swapping[group] = form.name
                return

    def _may_restore(self, form: ServiceState) -> bool:
        if form.status is not ServiceStatus.UNLOADED and form.status is not ServiceStatus.CRASHED:
            return False
        if form.status is ServiceStatus.CRASHED and form.backoff_until > self.view.now:
            return False
        return not facts.wanted_by_higher_class(self.view, form)

    def _room(self, form: ServiceState) -> tuple[int, int, int]:
        """(KV pool, bytes, free bytes): what loading ``form`` at its KV floor takes, and
        what its device has free beside the realtime reserve."""
        device = form.spec.device
        pool = self.loading.load_pool(form, form.spec.profile.kv_floor)
        need = sum(self.view.projected_resident(form, pool))
        free = self.view.ledger.available(device) - self.reserve.realtime_reserve(device)
        return pool, need, free

    def _load_better(self, form: ServiceState, serving: ServiceState | None, pool: int) -> bool:
        variant = form.spec.variant
        assert variant is not None
        if serving is not None and serving.spec.variant is not None:
            lesser = serving.spec.variant.describe()
            detail = f"{variant.describe()} fits again; {lesser} serves until it is loaded"
        else:
            detail = f"{variant.describe()} fits again"
        return self.ops.load(form, reason=Reason.ROOM_RETURNED, kv_pool=pool, detail=detail)

    def retire(self, forms: list[ServiceState]) -> None:
        loaded = [f for f in forms if f.status is ServiceStatus.LOADED]
        if len(loaded) < 2:
            return
        best = loaded[0]
        variant = best.spec.variant
        assert variant is not None
        for form in loaded[1:]:
            if form.inflight or form.queue or form.paused_kv or form.pinned:
                continue
            self.ops.unload(
                form, reason=Reason.SUPERSEDED, detail=f"{variant.describe()} serves again"
            )
