"""The test oracle of the World's indexes: each recomputed from the states, from scratch.

Every test that drives a Manager may call :func:`check_indexes` after an event: it fails
when an index the operations keep differs from what the states say.
"""

from __future__ import annotations

from accelmux.core.types import Reason, ServiceClass, ServiceStatus, Tier
from accelmux.core.world import ServiceState, World
from accelmux.errors import InvariantError


def _expect_index(what: str, got: object, want: object) -> None:
    if got != want:
        raise InvariantError(f"index {what}: kept {got!r}, recomputed {want!r}")


def check_indexes(world: World) -> None:
    """Recompute every index from the states; raise if one differs (for tests)."""
    svcs = list(world.services.values())
    check_service_sets(world, svcs)
    check_waiting_indexes(world, svcs)
    check_queue_order(world)
    check_pauses(world, svcs)
    if world.host_used > world.spec.host_budget_bytes:
        raise InvariantError(f"host budget: {world.host_used} > {world.spec.host_budget_bytes}")
    world.ledger.check_totals()


def check_service_sets(world: World, svcs: list[ServiceState]) -> None:
    """The service sets (loaded, unloading, crashed, busy, queued, kept, evicted)."""
    _expect_index("loaded", world.loaded.names(), {s.name for s in svcs if s.is_up})
    for dev in world.devices:
        _expect_index(
            f"loaded on {dev}",
            world.loaded_on(dev).names(),
            {s.name for s in svcs if s.is_up and s.spec.device == dev},
        )
        _expect_index(
            f"unloading on {dev}",
            world.unloading_on(dev).names(),
            {s.name for s in svcs if s.status is ServiceStatus.UNLOADING and s.spec.device == dev},
        )
    _expect_index(
        "crashed",
        world.crashed.names(),
        {s.name for s in svcs if s.status is ServiceStatus.CRASHED},
    )
    _expect_index(
        "resizing services are loaded or unloading",
        {s.name for s in svcs if s.resizing} - world.loaded.names(),
        {s.name for s in svcs if s.resizing and s.status is ServiceStatus.UNLOADING},
    )
    _expect_index("busy", world.busy.names(), {s.name for s in svcs if s.inflight})
    _expect_index("busy services are loaded", world.busy.names() - world.loaded.names(), set())
    _expect_index("queued", world.queued.names(), {s.name for s in svcs if s.waiting_count})
    _expect_index(
        "kept", world.kept.names(), {s.name for s in svcs if s.pinned or s.admin_wants_loaded}
    )
    _expect_index(
        "evicted_out",
        world.evicted_out.names(),
        {
            s.name
            for s in svcs
            if s.last_evicted_at is not None and s.status is ServiceStatus.UNLOADED
        },
    )


def check_waiting_indexes(world: World, svcs: list[ServiceState]) -> None:
    """Each service's queue, and the waiting counts by reason, class and cause."""
    for s in svcs:
        queue = [r for r in world.waiting.values() if r.service == s.name]
        _expect_index(f"{s.name}.queue", list(s.queue.values()), queue)
        _expect_index(f"{s.name}.waiting_count", s.waiting_count, len(queue))
    reasons: dict[Reason | None, int] = {}
    classes: dict[tuple[str, ServiceClass], int] = {}
    causes: dict[tuple[str, ServiceClass, Reason | None], int] = {}
    by_class: dict[tuple[str, ServiceClass], set[str]] = {}
    for r in world.waiting.values():
        dev = world.services[r.service].spec.device
        reasons[r.wait_reason] = reasons.get(r.wait_reason, 0) + 1
        classes[(dev, r.cls)] = classes.get((dev, r.cls), 0) + 1
        causes[(dev, r.cls, r.wait_reason)] = causes.get((dev, r.cls, r.wait_reason), 0) + 1
        by_class.setdefault((dev, r.cls), set()).add(r.service)
    _expect_index("wait_reasons", {k: v for k, v in world.wait_reasons.items() if v}, reasons)
    _expect_index("waiting_classes", {k: v for k, v in world.waiting_classes.items() if v}, classes)
    _expect_index("waiting_causes", {k: v for k, v in world.waiting_causes.items() if v}, causes)
    _expect_index(
        "queued_by_class",
        {k: v.names() for k, v in world.queued_by_class.items() if len(v)},
        by_class,
    )


def check_queue_order(world: World) -> None:
    """Waiting requests in the order they entered the queue, each with a deadline."""
    marks = [r.queued_mark for r in world.waiting.values()]
    _expect_index("queue order", marks, sorted(marks))
    live = {e[2].request_id for e in world.deadlines if world.queued_now(e)}
    _expect_index("deadlines", live, set(world.waiting))


def check_pauses(world: World, svcs: list[ServiceState]) -> None:
    """Paused KV state and host copies: what each service and the host hold for them."""
    paused = [r for r in world.waiting.values() if r.paused]
    _expect_index("host_kv", world.host_kv, sum(r.parked_kv for r in paused if r.parked_in_ram))
    _expect_index(
        "host_pending",
        world.host_pending,
        sum(r.pause_reserved for r in world.inflight.values()),
    )
    _expect_index(
        "pausing requests run",
        {r.request_id for r in world.waiting.values() if r.pausing is not None},
        set(),
    )
    for svc in svcs:
        mine = [r for r in paused if r.service == svc.name and not r.parked]
        _expect_index(f"{svc.name}.paused_kv", svc.paused_kv, sum(r.kv_bytes for r in mine))
        held = sum(r.kv_bytes for r in svc.inflight.values()) + svc.paused_kv
        _expect_index(f"{svc.name}.kv_in_use", svc.kv_in_use, held)
        lease = svc.kv_lease
        _expect_index(f"{svc.name}.kv_pool", svc.kv_pool, lease.nbytes if lease is not None else 0)
        _expect_index(
            f"{svc.name}.host copy",
            svc.name in world.host_weights,
            svc.tier is not Tier.COLD,
        )
