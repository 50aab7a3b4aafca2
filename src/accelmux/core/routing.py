"""Cluster routing: which node serves a request for a model, from the nodes' snapshots.

Pure: the cluster gateway polls every node agent for its snapshot, turns each into a
:class:`NodeView` and asks :func:`route` where a request goes; nothing here waits,
reads a clock or talks to a node. Each node's own Manager still decides everything on
its own devices (admission, eviction, loading): the route only picks the node whose
Manager can serve the request soonest. Each candidate has a :class:`Readiness`:

1. ``IDLE``: the service is loaded there with a free slot and nobody waiting;
2. ``BUSY``: loaded (or loading) there, its slots taken: it waits its turn;
3. ``FITS``: not loaded, but its weights fit in its device's free memory there;
4. ``FREES``: not loaded; it fits once the node's Manager evicts services that are idle
   now and that it may evict for this service (not pinned, not of a more important
   class): the memory the node *can free now*;
5. ``BLOCKED``: not loaded, and even that is not enough: the memory it needs is held by
   services that are busy (streaming, or running a job); it waits until they finish;
6. ``BACKING_OFF``: it crashed there and waits for its restart.

Candidates rank by (:func:`rank`): whether they can start after a wait that can be
estimated (1-4) or not (5, then 6); then the **expected wait** (nothing when idle; the
requests ahead times the service's time per request, over its slots, when busy; the load
time when it must load, plus the requests ahead); then the readiness; then the most
memory left over (free plus freeable, less what it needs); then the node name, so a
route is a function of its inputs (and no two candidates ever rank equal). Raw free
memory alone never decides: a node with more free memory whose only eviction candidate
is busy ranks after a node that can free an idle service now. A node that is down
(``alive`` false) is never chosen, and neither is a node whose view does not list the
service (a node lists only the services it may host). When no live node can take it,
:class:`NoRoute` says why: the model is unknown everywhere, or the only nodes that
hosted it are down (named, so the client's error can say which).

:func:`route` is the definition: a scan of every node, O(nodes) per request. The gateway
asks :func:`route_indexed` instead, over a :class:`RouteIndex` built once per poll
(O(nodes log nodes)): each model's live hosts sorted by their rank without the
gateway's own requests in flight. Those can only make a host rank worse, never better,
so a decision walks the sorted hosts only while one of them might still win: in the
usual case it looks at one or two. The two give the same answer for every input (a
property test holds them to it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from accelmux.core.types import ServiceStatus


class Readiness(IntEnum):
    """How soon a node can serve a request for a service (lower is sooner)."""

    IDLE = 0
    BUSY = 1
    FITS = 2
    FREES = 3
    BLOCKED = 4
    BACKING_OFF = 5


#: The time per request assumed for a service nothing has been measured of yet.
DEFAULT_SERVICE_S = 1.0


class NoRouteReason(StrEnum):
    UNKNOWN_MODEL = "model_not_found"
    NODES_LOST = "node_unavailable"
    #: Every live host was tried for this request (``exclude``) and refused it.
    NODES_TRIED = "nodes_tried"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceOnNode:
    """One service as one node's snapshot shows it."""

    service: str
    models: frozenset[str]
    state: ServiceStatus
    inflight: int
    waiting: int
    concurrency: int
    #: What loading it would take (weights + runtime, the ledger's estimate).
    load_bytes: int
    #: Free memory of its device on that node (the ledger's ``available``).
    free_bytes: int
    backing_off: bool = False
    #: Memory of its device the node could free now for it: idle, loaded services it may
    #: evict (not pinned, of its own class or a less important one). See
    #: :func:`freeable_for`.
    freeable_bytes: int = 0
    #: How long loading it takes there (seconds, from where its weights are now).
    load_s: float = 0.0
    #: How long one request holds a slot there (measured; None: not known yet).
    service_s: float | None = None
    #: Its class (``ServiceClass`` value: lower is more important).
    cls: int = 1
    #: What unloading it would give back (its bytes in the ledger).
    held_bytes: int = 0
    #: Pinned there (never evicted).
    pinned: bool = False
    device: str = ""

    def __post_init__(self) -> None:
        if self.inflight < 0 or self.waiting < 0 or self.concurrency < 1:
            raise ValueError(f"{self.service}: counts must be >= 0, concurrency >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """One node: alive or not, and the services it may host (its last snapshot)."""

    name: str
    alive: bool
    services: tuple[ServiceOnNode, ...] = ()
    #: model name -> its service, built from ``services``.
    by_model: Mapping[str, ServiceOnNode] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.by_model and self.services:
            index = {m: s for s in self.services for m in sorted(s.models)}
            object.__setattr__(self, "by_model", index)

    def serving(self, model: str) -> ServiceOnNode | None:
        return self.by_model.get(model)


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    node: str
    service: str
    readiness: Readiness


@dataclass(frozen=True, slots=True, kw_only=True)
class NoRoute:
    reason: NoRouteReason
    model: str
    #: The down nodes that hosted the model, sorted (empty for an unknown model).
    lost_nodes: tuple[str, ...] = ()
    service: str | None = None


def freeable_for(target: ServiceOnNode, others: Iterable[ServiceOnNode]) -> int:
    """Bytes the node could free now on ``target``'s device by evicting services its
    Manager may evict for it: loaded, idle (nothing running, nobody waiting), not pinned,
    of ``target``'s class or a less important one. An estimate from the snapshot: the
    node's Manager decides what it evicts."""
    return sum(
        s.held_bytes
        for s in others
        if s is not target
        and s.device == target.device
        and s.state is ServiceStatus.LOADED
        and s.inflight == 0
        and s.waiting == 0
        and not s.pinned
        and s.cls >= target.cls
    )


def readiness(svc: ServiceOnNode, pending: int = 0) -> Readiness:
    """How soon ``svc`` can serve one more request; ``pending``: requests the gateway sent
    there that the snapshot may not count yet."""
    if svc.backing_off or svc.state is ServiceStatus.CRASHED:
        return Readiness.BACKING_OFF
    if svc.state in (ServiceStatus.LOADED, ServiceStatus.LOADING):
        busy = max(svc.inflight + svc.waiting, pending)
        idle = svc.state is ServiceStatus.LOADED and busy < svc.concurrency
        return Readiness.IDLE if idle else Readiness.BUSY
    if svc.load_bytes <= svc.free_bytes:
        return Readiness.FITS
    if svc.load_bytes <= svc.free_bytes + svc.freeable_bytes:
        return Readiness.FREES
    return Readiness.BLOCKED


def expected_wait_s(svc: ServiceOnNode, ready: Readiness, pending: int = 0) -> float:
    """How long a request would wait there before it runs (0 for the last two readiness
    levels, whose wait cannot be estimated: they rank after every other)."""
    if ready in (Readiness.IDLE, Readiness.BLOCKED, Readiness.BACKING_OFF):
        return 0.0
    per = svc.service_s if svc.service_s is not None else DEFAULT_SERVICE_S
    ahead = max(svc.inflight + svc.waiting, pending) + 1 - svc.concurrency
    queued = max(0, ahead) * per / svc.concurrency
    loading = svc.state not in (ServiceStatus.LOADED,)
    return (svc.load_s if loading else 0.0) + queued


#: A candidate's sort key: (tier, expected wait in ms, readiness, -room, node).
Key = tuple[int, int, int, int, str]


def rank(svc: ServiceOnNode, node: str, pending: int = 0) -> Key:
    """The sort key of one candidate (lower is better): whether its wait can be estimated,
    the expected wait, the readiness, the memory left over, the node's name."""
    ready = readiness(svc, pending)
    tier = 0 if ready <= Readiness.FREES else int(ready) - int(Readiness.FREES)
    wait_ms = round(expected_wait_s(svc, ready, pending) * 1000)
    room = svc.free_bytes + svc.freeable_bytes - svc.load_bytes
    return (tier, wait_ms, int(ready), -room, node)


def route(
    nodes: Iterable[NodeView],
    model: str,
    pending: Mapping[tuple[str, str], int] | None = None,
    exclude: Collection[str] = (),
) -> Route | NoRoute:
    """Where a request for ``model`` goes; ``pending``: the gateway's own requests in
    flight by (node, service), fresher than the snapshots; ``exclude``: nodes already
    tried for this request (they refused it)."""
    pending = pending or {}
    best: tuple[Key, Route] | None = None
    lost: list[str] = []
    tried: list[str] = []
    lost_service: str | None = None
    for node in nodes:
        svc = node.serving(model)
        if svc is None:
            continue
        if not node.alive:
            lost.append(node.name)
            lost_service = lost_service or svc.service
            continue
        if node.name in exclude:
            tried.append(node.name)
            lost_service = svc.service
            continue
        key = rank(svc, node.name, pending.get((node.name, svc.service), 0))
        if best is None or key < best[0]:
            best = (key, Route(node=node.name, service=svc.service, readiness=Readiness(key[2])))
    if best is not None:
        return best[1]
    if tried:
        return NoRoute(
            reason=NoRouteReason.NODES_TRIED,
            model=model,
            lost_nodes=tuple(sorted(tried)),
            service=lost_service,
        )
    if lost:
        return NoRoute(
            reason=NoRouteReason.NODES_LOST,
            model=model,
            lost_nodes=tuple(sorted(lost)),
            service=lost_service,
        )
    return NoRoute(reason=NoRouteReason.UNKNOWN_MODEL, model=model)


Candidate = tuple[Key, str, ServiceOnNode]


@dataclass(frozen=True, slots=True)
class RouteIndex:
    """The nodes' views arranged for fast routing (built once per poll)."""

    #: model -> its live hosts as (rank with nothing pending, node, service), best first.
    candidates: Mapping[str, tuple[Candidate, ...]]
    #: model -> (the down nodes that hosted it, sorted; the service), for models no live
    #: node hosts.
    lost: Mapping[str, tuple[tuple[str, ...], str]]


def build_index(nodes: Iterable[NodeView]) -> RouteIndex:
    live: dict[str, list[Candidate]] = {}
    lost: dict[str, tuple[list[str], str]] = {}
    for node in nodes:
        for model, svc in node.by_model.items():
            if node.alive:
                live.setdefault(model, []).append((rank(svc, node.name), node.name, svc))
            else:
                lost.setdefault(model, ([], svc.service))[0].append(node.name)
    return RouteIndex(
        candidates={m: tuple(sorted(c, key=lambda c: c[0])) for m, c in live.items()},
        lost={m: (tuple(sorted(n)), s) for m, (n, s) in lost.items() if m not in live},
    )


def route_indexed(
    index: RouteIndex,
    model: str,
    pending: Mapping[tuple[str, str], int] | None = None,
    exclude: Collection[str] = (),
) -> Route | NoRoute:
    """:func:`route`'s answer, from ``index``: a host's rank with pending requests is never
    better than its rank without, so the walk stops at the first host whose rank without
    cannot beat the best found."""
    pending = pending or {}
    best: Candidate | None = None
    for key, node, svc in index.candidates.get(model, ()):
        if best is not None and key >= best[0]:
            break
        if node in exclude:
            continue
        waiting = pending.get((node, svc.service), 0)
        actual = rank(svc, node, waiting) if waiting else key
        if best is None or actual < best[0]:
            best = (actual, node, svc)
    if best is not None:
        return Route(node=best[1], service=best[2].service, readiness=Readiness(best[0][2]))
    hosts = index.candidates.get(model, ())
    if hosts:  # every live host is excluded
        return NoRoute(
            reason=NoRouteReason.NODES_TRIED,
            model=model,
            lost_nodes=tuple(sorted(node for _, node, _ in hosts)),
            service=hosts[0][2].service,
        )
    gone = index.lost.get(model)
    if gone is not None:
        return NoRoute(
            reason=NoRouteReason.NODES_LOST, model=model, lost_nodes=gone[0], service=gone[1]
        )
    return NoRoute(reason=NoRouteReason.UNKNOWN_MODEL, model=model)


def live_models(nodes: Sequence[NodeView]) -> list[tuple[str, str]]:
    """(model, service) served by at least one live node, sorted by model."""
    seen: dict[str, str] = {}
    for node in nodes:
        if node.alive:
            for model, svc in node.by_model.items():
                seen.setdefault(model, svc.service)
    return sorted(seen.items())
