"""Placement across devices: replicas, routing, pinned placement (core.placement)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.config.load import load_config_text
from accelmux.config.specs import to_manager_spec
from accelmux.core.actions import Dispatch, Load
from accelmux.core.events import Demand, RequestArrived
from accelmux.core.manager import Manager
from accelmux.core.placement import place_pinned, replica_name, without_replicas
from accelmux.core.policies import make_policy
from accelmux.core.specs import ManagerSpec, PolicyKnobs
from accelmux.core.types import GIB, Residency, ServiceKind, ServiceStatus
from accelmux.errors import ConfigError, InvariantError

from .fake_executor import FakeExecutor
from .support import arrive, device, done, loaded, of, plain_profile, service
from .test_properties import SETTINGS, apply_op, manager_specs, ops_strategy
from .world_oracle import check_indexes

POLICIES = ("accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle")


def replicated(*names: str, devices: tuple[str, ...] = ("gpu0", "gpu1"), **kw: object) -> list:
    """One replica per device of each named service (``chat@gpu0``...)."""
    out = []
    for name in names:
        for dev in devices:
            spec = service(replica_name(name, dev), device_name=dev, **kw)  # type: ignore[arg-type]
            out.append(replace(spec, group=name))
    return out


def two_device_manager(
    *services: object, policy: str = "accelmux", budget: int = 12 * GIB
) -> Manager:
    spec = ManagerSpec(
        devices=(device("gpu0", budget=budget), device("gpu1", budget=budget)),
        services=tuple(services),  # type: ignore[arg-type]
        knobs=PolicyKnobs(prewarm=False, safety_factor=1.0),
    )
    return Manager(spec, make_policy(policy))


# ---- pinned placement -------------------------------------------------------------------
@given(
    room=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 10**10), min_size=1),
    sizes=st.lists(st.integers(0, 10**9), max_size=6),
    data=st.data(),
)
def test_pinned_placement_is_a_candidate_and_ignores_input_order(
    room: dict[str, int], sizes: list[int], data: st.DataObject
) -> None:
    devices = sorted(room)
    pinned = [
        (f"s{i}", size, data.draw(st.lists(st.sampled_from(devices), min_size=1, unique=True)))
        for i, size in enumerate(sizes)
    ]
    placed = place_pinned(room, pinned)
    assert set(placed) == {p[0] for p in pinned}
    for name, _, candidates in pinned:
        assert placed[name] in candidates
    assert place_pinned(room, list(reversed(pinned))) == placed


def test_pinned_services_pack_largest_first() -> None:
    placed = place_pinned(
        {"gpu0": 10, "gpu1": 12},
        [
            ("small", 2, ["gpu0", "gpu1"]),
            ("big", 8, ["gpu0", "gpu1"]),
            ("mid", 5, ["gpu0", "gpu1"]),
        ],
    )
    # big fits best on gpu0 (2 left); mid then only fits gpu1; small fills gpu0
    assert placed == {"big": "gpu0", "mid": "gpu1", "small": "gpu0"}


def test_a_pinned_service_too_large_everywhere_goes_where_most_room_is() -> None:
    assert place_pinned({"a": 3, "b": 5}, [("huge", 9, ["a", "b"])]) == {"huge": "b"}


# ---- config -------------------------------------------------------------------------------
CONFIG = """
devices:
  gpu0: {kind: virtual, capacity: 12GiB, headroom: 512MiB}
  gpu1: {kind: virtual, capacity: 8GiB, headroom: 512MiB}
services:
  chat: {kind: chat, memory: {weights: 4GiB, kv_per_token: 128KiB, kv_ceiling: 1GiB}}
  coder:
    {kind: chat, devices: [gpu1], memory: {weights: 4GiB, kv_per_token: 1KiB, kv_ceiling: 1GiB}}
  image: {kind: image, device: gpu0, memory: {weights: 5GiB}}
  big: {kind: image, memory: {weights: 10GiB}}
  asr: {kind: asr, class: realtime, residency: pinned, memory: {weights: 1GiB}}
"""


def test_a_service_without_a_device_gets_a_replica_on_every_device_it_fits() -> None:
    spec = to_manager_spec(load_config_text(CONFIG))
    by_name = {s.name: s for s in spec.services}
    assert by_name["chat@gpu0"].group == "chat" and by_name["chat@gpu0"].device == "gpu0"
    assert by_name["chat@gpu1"].device == "gpu1"
    assert by_name["coder"].device == "gpu1" and not by_name["coder"].group
    assert by_name["image"].device == "gpu0"
    # 10 GiB fits only the 12 GiB device: no replica where it cannot run
    assert by_name["big"].device == "gpu0" and not by_name["big"].group
    # pinned: placed once, no replicas
    assert by_name["asr"].group == "" and by_name["asr"].device in ("gpu0", "gpu1")
    assert {s.addressed_as for s in spec.services} == {"chat", "coder", "image", "big", "asr"}


def test_device_and_devices_together_is_a_clear_error() -> None:
    text = CONFIG.replace("devices: [gpu1]", "device: gpu1, devices: [gpu1]")
    with pytest.raises(ConfigError, match="device or devices"):
        load_config_text(text)


def test_an_unknown_device_in_devices_is_named() -> None:
    with pytest.raises(ConfigError, match="gpu7"):
        load_config_text(CONFIG.replace("devices: [gpu1]", "devices: [gpu1, gpu7]"))


def test_a_service_too_large_for_a_listed_device_is_an_error() -> None:
    with pytest.raises(ConfigError, match="gpu1"):
        load_config_text(
            CONFIG.replace("big: {kind: image,", "big: {kind: image, devices: [gpu0, gpu1],")
        )


def test_without_replicas_keeps_the_first_device_under_the_service_name() -> None:
    spec = without_replicas(to_manager_spec(load_config_text(CONFIG)))
    by_name = {s.name: s for s in spec.services}
    assert by_name["chat"].device == "gpu0" and not by_name["chat"].group
    assert not any("@" in s.name for s in spec.services)


# ---- routing ------------------------------------------------------------------------------
def test_a_request_for_the_group_lands_on_a_replica_and_loads_it() -> None:
    m = two_device_manager(*replicated("chat", kind=ServiceKind.IMAGE))
    out = m.handle(arrive("r1", "chat"), 0.0)
    (load,) = of(Load, out)
    assert load.service in ("chat@gpu0", "chat@gpu1")
    assert m.world.waiting["r1"].service == load.service


def test_a_second_request_loads_a_second_replica_when_the_first_is_busy() -> None:
    m = two_device_manager(*replicated("chat"))
    m.handle(arrive("r1", "chat"), 0.0)
    first = m.world.waiting["r1"].service
    m.handle(loaded(first), 1.0)
    m.world.services[first].mean_service_s = 30.0  # a long request runs
    out = m.handle(arrive("r2", "chat"), 1.5)
    (load,) = of(Load, out)
    assert load.service != first
    assert {r.status for r in m.world.groups["chat"]} == {
        ServiceStatus.LOADED,
        ServiceStatus.LOADING,
    }


def test_a_second_replica_never_evicts_anyone() -> None:
    # gpu1 is full of an idle service: a second replica of chat would have to evict it,
    # so the second request waits for the first replica instead.
    other = service("other", device_name="gpu1", profile=plain_profile(weights=11 * GIB))
    m = two_device_manager(*replicated("chat", profile=plain_profile(weights=4 * GIB)), other)
    m.handle(arrive("o1", "other"), 0.0)
    m.handle(loaded("other"), 0.5)
    m.handle(done("o1"), 1.0)
    m.handle(arrive("r1", "chat"), 1.0)
    assert m.world.waiting["r1"].service == "chat@gpu0"
    m.handle(loaded("chat@gpu0"), 2.0)
    m.world.services["chat@gpu0"].mean_service_s = 30.0
    out = m.handle(arrive("r2", "chat"), 2.5)
    assert not of(Load, out)
    assert m.world.waiting["r2"].service == "chat@gpu0"
    assert m.world.services["other"].status is ServiceStatus.LOADED


def test_a_free_loaded_replica_serves_before_any_load() -> None:
    m = two_device_manager(*replicated("chat"))
    m.handle(arrive("r1", "chat"), 0.0)
    first = m.world.waiting["r1"].service
    m.handle(loaded(first), 1.0)
    m.handle(done("r1"), 2.0)
    out = m.handle(arrive("r2", "chat"), 3.0)
    (d,) = of(Dispatch, out)
    assert d.service == first and not of(Load, out)


def test_ollama_keeps_one_runner_per_model() -> None:
    m = two_device_manager(*replicated("chat", kind=ServiceKind.CHAT), policy="ollama+containers")
    m.handle(arrive("r1", "chat"), 0.0)
    first = m.world.waiting["r1"].service
    m.handle(loaded(first), 1.0)
    m.handle(arrive("r2", "chat"), 1.5)
    assert m.world.waiting["r2"].service == first


def test_a_route_outside_the_group_is_a_bug_the_manager_catches() -> None:
    m = two_device_manager(*replicated("chat"), service("other", device_name="gpu0"))
    m.policy.route = lambda *_: m.world.services["other"]  # type: ignore[attr-defined]
    with pytest.raises(InvariantError, match="routed"):
        m.handle(RequestArrived(request_id="r1", service="chat", demand=Demand()), 0.0)


def test_disabling_placement_routes_to_the_replica_that_is_up() -> None:
    spec = ManagerSpec(
        devices=(device("gpu0"), device("gpu1")),
        services=tuple(replicated("chat")),
        knobs=PolicyKnobs(prewarm=False, disabled=frozenset({"placement"})),
    )
    m = Manager(spec, make_policy("accelmux"))
    m.handle(arrive("r1", "chat"), 0.0)
    assert m.world.waiting["r1"].service == "chat@gpu0"
    m.handle(loaded("chat@gpu0"), 1.0)
    m.world.services["chat@gpu0"].mean_service_s = 30.0
    m.handle(arrive("r2", "chat"), 1.5)
    assert m.world.waiting["r2"].service == "chat@gpu0"


# ---- properties ---------------------------------------------------------------------------
@st.composite
def replicated_specs(draw: st.DrawFn) -> ManagerSpec:
    """A random spec on two devices where some non-pinned services have a replica on each."""
    spec = draw(manager_specs())
    first = spec.devices[0]
    second = replace(first, name="gpu2")
    services = []
    for s in spec.services:
        if s.residency is not Residency.PINNED and draw(st.booleans()):
            services.append(replace(s, name=replica_name(s.name, "gpu"), group=s.name))
            services.append(
                replace(s, name=replica_name(s.name, "gpu2"), group=s.name, device="gpu2")
            )
        else:
            services.append(s)
    return replace(spec, devices=(first, second), services=tuple(services))


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(spec=replicated_specs(), ops=ops_strategy)
def test_routed_requests_stay_in_their_group_and_the_indexes_hold(
    policy: str, spec: ManagerSpec, ops: list
) -> None:
    ex = FakeExecutor(Manager(spec, make_policy(policy)))
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)
        world = ex.manager.world
        check_indexes(world)
        for req in (*world.waiting.values(), *world.inflight.values()):
            assert world.services[req.service].spec.addressed_as == ex.addressed[req.request_id]
    ex.settle()
    check_indexes(ex.manager.world)


@pytest.mark.slow
@SETTINGS
@given(spec=replicated_specs(), ops=ops_strategy)
def test_routing_is_deterministic(spec: ManagerSpec, ops: list) -> None:
    runs = []
    for _ in range(2):
        ex = FakeExecutor(Manager(spec, make_policy("accelmux")))
        counter = [0]
        for op in ops:
            apply_op(ex, spec, op, counter)
        runs.append(ex.actions)
    assert runs[0] == runs[1]
