"""The cluster router (:mod:`accelmux.core.routing`): its order, and its invariants for
any set of nodes (hypothesis): never a dead node, never a node that does not host the
model, the same answer for the same inputs whatever the nodes' order."""

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
    live_models,
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


def test_the_shortest_queue_then_the_most_free_memory_wins() -> None:
    busy = [
        node("a", svc(state=ServiceStatus.LOADED, inflight=2, waiting=3)),
        node("b", svc(state=ServiceStatus.LOADED, inflight=2, waiting=1)),
    ]
    assert route(busy, "chat").node == "b"  # type: ignore[union-attr]
    cold = [node("a", svc(free=512 * MIB)), node("b", svc(free=2048 * MIB))]
    assert route(cold, "chat") == Route(node="b", service="chat", readiness=Readiness.FITS)


def test_a_node_that_must_evict_ranks_after_one_where_it_fits() -> None:
    nodes = [node("a", svc(free=100 * MIB)), node("b", svc(free=300 * MIB))]
    assert readiness(nodes[0].services[0]) is Readiness.EVICTS
    assert route(nodes, "chat").node == "b"  # type: ignore[union-attr]


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


@given(clusters(), st.sampled_from(MODELS))
def test_no_live_host_is_better_ranked_than_the_route(nodes: list[NodeView], model: str) -> None:
    choice = route(nodes, model)
    if not isinstance(choice, Route):
        return
    for n in nodes:
        s = n.serving(model)
        if n.alive and s is not None:
            assert readiness(s) >= choice.readiness


@given(clusters(), st.sampled_from([*MODELS, "unknown"]), pendings)
def test_the_indexed_route_is_the_scan(
    nodes: list[NodeView], model: str, pending: dict[tuple[str, str], int]
) -> None:
    assert route_indexed(build_index(nodes), model, pending) == route(nodes, model, pending)
