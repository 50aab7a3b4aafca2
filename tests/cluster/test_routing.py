"""The cluster router (:mod:`accelmux.core.routing`): its order (readiness, the memory a
node can free now, the expected wait), and its invariants for any set of nodes
(hypothesis): never a dead node nor a node already tried, never a node that does not
host the model, the best-ranked host, the same answer for the same inputs whatever the
nodes' order, and the indexed route equal to the scan."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.routing import (
    NodeView,
    NoRoute,
    NoRouteReason,
    Readiness,
    Route,
    ServiceOnNode,
    build_index,
    expected_wait_s,
    live_models,
    rank,
    readiness,
    route,
    route_indexed,
)
from accelmux.core.types import ServiceStatus

MIB = 1024**2


def svc(
    name: str = "chat",
    state: ServiceStatus = ServiceStatus.UNLOADED,
    *,
    inflight: int = 0,
    waiting: int = 0,
    concurrency: int = 2,
    free: int = 1024 * MIB,
    load: int = 256 * MIB,
    backing_off: bool = False,
    models: tuple[str, ...] = (),
    freeable: int = 0,
    load_s: float = 1.0,
    service_s: float | None = None,
) -> ServiceOnNode:
    return ServiceOnNode(
        service=name,
        models=frozenset(models or (name,)),
        state=state,
        inflight=inflight,
        waiting=waiting,
        concurrency=concurrency,
        load_bytes=load,
        free_bytes=free,
        backing_off=backing_off,
        freeable_bytes=freeable,
        load_s=load_s,
        service_s=service_s,
    )


def node(name: str, *services: ServiceOnNode, alive: bool = True) -> NodeView:
    return NodeView(name=name, alive=alive, services=services)


def test_loaded_and_idle_beats_loaded_and_busy_beats_loadable() -> None:
    nodes = [
        node("a", svc(free=4096 * MIB)),
        node("b", svc(state=ServiceStatus.LOADED, inflight=2, concurrency=2)),
        node("c", svc(state=ServiceStatus.LOADED, inflight=1, concurrency=2)),
    ]
    assert route(nodes, "chat") == Route(node="c", service="chat", readiness=Readiness.IDLE)
    assert route(nodes[:2], "chat") == Route(node="b", service="chat", readiness=Readiness.BUSY)


def test_the_shortest_wait_then_the_most_room_wins() -> None:
    busy = [
        node("a", svc(state=ServiceStatus.LOADED, inflight=2, waiting=3)),
        node("b", svc(state=ServiceStatus.LOADED, inflight=2, waiting=1)),
    ]
    assert route(busy, "chat").node == "b"  # type: ignore[union-attr]
    cold = [node("a", svc(free=512 * MIB)), node("b", svc(free=2048 * MIB))]
    assert route(cold, "chat") == Route(node="b", service="chat", readiness=Readiness.FITS)


def test_a_long_queue_loses_to_a_quick_load_elsewhere() -> None:
    queued = svc(state=ServiceStatus.LOADED, inflight=2, waiting=8, service_s=5.0)
    assert expected_wait_s(queued, Readiness.BUSY) == 9 * 5.0 / 2
    nodes = [node("a", queued), node("b", svc(load_s=3.0))]
    assert route(nodes, "chat") == Route(node="b", service="chat", readiness=Readiness.FITS)
    quick = svc(state=ServiceStatus.LOADED, inflight=2, waiting=0, service_s=0.2)
    nodes = [node("a", quick), node("b", svc(load_s=3.0))]
    assert route(nodes, "chat") == Route(node="a", service="chat", readiness=Readiness.BUSY)


def test_a_node_that_can_free_memory_now_beats_one_whose_victims_are_busy() -> None:
    """Both nodes full, a 5 GiB request: a has more free memory but its only eviction
    candidate is streaming; b can evict an idle service at once."""
    gib = 1024 * MIB
    a = node("a", svc(free=2 * gib, load=5 * gib, freeable=0))
    b = node("b", svc(free=1 * gib, load=5 * gib, freeable=6 * gib))
    assert readiness(a.services[0]) is Readiness.BLOCKED
    assert readiness(b.services[0]) is Readiness.FREES
    assert route([a, b], "chat") == Route(node="b", service="chat", readiness=Readiness.FREES)
    fits = node("c", svc(free=6 * gib, load=5 * gib))
    assert route([a, b, fits], "chat").node == "c"  # type: ignore[union-attr]


def test_a_node_already_tried_is_not_chosen_again() -> None:
    nodes = [node("a", svc(state=ServiceStatus.LOADED)), node("b", svc())]
    assert route(nodes, "chat").node == "a"  # type: ignore[union-attr]
    assert route(nodes, "chat", exclude={"a"}).node == "b"  # type: ignore[union-attr]
    assert route(nodes, "chat", exclude={"a", "b"}) == NoRoute(
        reason=NoRouteReason.NODES_TRIED, model="chat", lost_nodes=("a", "b"), service="chat"
    )


def test_a_crashed_service_is_the_last_resort() -> None:
    nodes = [
        node("a", svc(state=ServiceStatus.LOADED, backing_off=True)),
        node("b", svc(free=10 * MIB)),
    ]
    assert route(nodes, "chat").node == "b"  # type: ignore[union-attr]
    assert route(nodes[:1], "chat").readiness is Readiness.BACKING_OFF  # type: ignore[union-attr]


def test_the_gateways_own_requests_in_flight_count_before_the_next_snapshot() -> None:
    nodes = [
        node("a", svc(state=ServiceStatus.LOADED, concurrency=1)),
        node("b", svc(state=ServiceStatus.LOADED, concurrency=1)),
    ]
    assert route(nodes, "chat").node == "a"  # type: ignore[union-attr]
    assert route(nodes, "chat", {("a", "chat"): 1}).node == "b"  # type: ignore[union-attr]


def test_an_alias_routes_to_its_service() -> None:
    nodes = [node("a", svc("chat", models=("chat", "gpt-4o")))]
    assert route(nodes, "gpt-4o") == Route(node="a", service="chat", readiness=Readiness.FITS)


def test_no_route_names_the_lost_nodes_or_says_the_model_is_unknown() -> None:
    nodes = [
        node("b", svc("solo"), alive=False),
        node("a", svc("solo"), alive=False),
        node("c", svc("chat")),
    ]
    assert route(nodes, "solo") == NoRoute(
        reason=NoRouteReason.NODES_LOST, model="solo", lost_nodes=("a", "b"), service="solo"
    )
    assert route(nodes, "nope") == NoRoute(reason=NoRouteReason.UNKNOWN_MODEL, model="nope")
    assert live_models(nodes) == [("chat", "chat")]


# ---- properties -----------------------------------------------------------------------

MODELS = ["chat", "embed", "image"]
services = st.builds(
    svc,
    name=st.sampled_from(MODELS),
    state=st.sampled_from(list(ServiceStatus)),
    inflight=st.integers(0, 8),
    waiting=st.integers(0, 8),
    concurrency=st.integers(1, 4),
    free=st.integers(0, 4096).map(lambda m: m * MIB),
    load=st.integers(1, 2048).map(lambda m: m * MIB),
    backing_off=st.booleans(),
    freeable=st.integers(0, 4096).map(lambda m: m * MIB),
    load_s=st.floats(0, 60),
    service_s=st.none() | st.floats(0.001, 30),
)


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    count = draw(st.integers(0, 8))
    out = []
    for i in range(count):
        hosted = draw(st.lists(services, max_size=3, unique_by=lambda s: s.service))
        out.append(node(f"n{i}", *hosted, alive=draw(st.booleans())))
    return out


pendings = st.dictionaries(
    st.tuples(st.sampled_from([f"n{i}" for i in range(8)]), st.sampled_from(MODELS)),
    st.integers(0, 6),
    max_size=6,
)


@given(clusters(), st.sampled_from([*MODELS, "unknown"]), pendings)
def test_a_route_is_a_live_node_that_hosts_the_model(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int]
) -> None:
    choice = route(nodes, model, pending)
    by_name = {n.name: n for n in nodes}
    hosts = [n for n in nodes if n.serving(model) is not None]
    if isinstance(choice, Route):
        chosen = by_name[choice.node]
        assert chosen.alive
        assert chosen.serving(model) is not None
        assert chosen.serving(model).service == choice.service  # type: ignore[union-attr]
    else:
        assert not any(n.alive for n in hosts)
        if hosts:
            assert choice.reason is NoRouteReason.NODES_LOST
            assert choice.lost_nodes == tuple(sorted(n.name for n in hosts))
        else:
            assert choice.reason is NoRouteReason.UNKNOWN_MODEL


@given(clusters(), st.sampled_from(MODELS), pendings, st.randoms(use_true_random=False))
def test_a_route_does_not_depend_on_the_order_of_the_nodes(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int], rnd: object
) -> None:
    shuffled = list(nodes)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert route(shuffled, model, pending) == route(nodes, model, pending)


@given(clusters(), st.sampled_from(MODELS), pendings)
def test_no_live_host_is_better_ranked_than_the_route(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int]
) -> None:
    choice = route(nodes, model, pending)
    if not isinstance(choice, Route):
        return
    chosen = next(n for n in nodes if n.name == choice.node).serving(model)
    assert chosen is not None
    best = rank(chosen, choice.node, pending.get((choice.node, chosen.service), 0))
    for n in nodes:
        s = n.serving(model)
        if n.alive and s is not None:
            assert rank(s, n.name, pending.get((n.name, s.service), 0)) >= best


@given(clusters(), st.sampled_from(MODELS), pendings, st.integers(0, 6))
def test_pending_requests_never_make_a_host_rank_better(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int], more: int
) -> None:
    for n in nodes:
        s = n.serving(model)
        if s is not None:
            now = pending.get((n.name, s.service), 0)
            assert rank(s, n.name, now + more) >= rank(s, n.name, now)


tried = st.frozensets(st.sampled_from([f"n{i}" for i in range(8)]), max_size=4)


@given(clusters(), st.sampled_from([*MODELS, "unknown"]), pendings, tried)
def test_the_indexed_route_is_the_scan(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int], exclude: frozenset[str]
) -> None:
    indexed = route_indexed(build_index(nodes), model, pending, exclude)
    assert indexed == route(nodes, model, pending, exclude)
    if isinstance(indexed, Route):
        assert indexed.node not in exclude
