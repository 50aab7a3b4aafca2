"""Each baseline's defining behaviour, driven through the Manager directly."""

from __future__ import annotations

from pathlib import Path

from tests.sim.support import scenario, tiny

from accelmux.core.actions import Action, Dispatch, Load, Reject, Unload
from accelmux.core.events import Demand, LoadFinished, RequestArrived, RequestFinished, Tick
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy, policy_names
from accelmux.core.policies.baselines import OLLAMA_KEEP_ALIVE_S, OLLAMA_MAX_LOADED
from accelmux.core.specs import DeviceSpec, ManagerSpec, MemoryProfile, ServiceSpec
from accelmux.core.types import GIB, MIB, Reason, Residency, ServiceClass, ServiceKind
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize


def _svc(
    name: str,
    weights: int,
    *,
    cls: ServiceClass = ServiceClass.INTERACTIVE,
    residency: Residency = Residency.WARM,
    workspace: int = 100 * MIB,
    concurrency: int = 1,
) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        kind=ServiceKind.IMAGE,
        cls=cls,
        residency=residency,
        device="gpu",
        profile=MemoryProfile(weights=weights, workspace=workspace),
        concurrency=concurrency,
        deadline_s=1000.0,
    )


def _manager(policy: str, *services: ServiceSpec, budget: int = 8 * GIB) -> Manager:
    dev = DeviceSpec(
        name="gpu", kind="virtual", capacity_bytes=budget, budget_bytes=budget, headroom_bytes=0
    )
    return Manager(ManagerSpec(devices=(dev,), services=services), make_policy(policy))


def _arrive(rid: str, svc: str) -> RequestArrived:
    return RequestArrived(request_id=rid, service=svc, demand=Demand(units=1.0))


def _of(kind: type, actions: list[Action]) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def test_all_baselines_are_registered() -> None:
    assert {"accelmux", "independent", "static", "ollama-like", "swap", "oracle"} <= set(
        policy_names()
    )


def test_independent_loads_everything_and_dispatches_without_lease() -> None:
    m = _manager("independent", _svc("a", 5 * GIB), _svc("b", 5 * GIB))
    loads = _of(Load, m.start(0.0))
    assert [ld.service for ld in loads] == ["a", "b"]  # 10 GiB on 8: no coordination
    m.handle(LoadFinished(service="a"), 1.0)
    acts = m.handle(_arrive("r1", "a"), 2.0)
    (d,) = _of(Dispatch, acts)
    assert d.lease_bytes == 0 and d.reason is Reason.UNCOORDINATED


def test_independent_oom_in_the_physical_model(tmp_path: Path) -> None:
    data = tiny()
    data["devices"]["gpu"]["capacity"] = "7GiB"  # asr + chat(ceiling) + image > 7 GiB
    out = Simulation(scenario(tmp_path, data), "independent", 1, duration_s=300).run()
    report = summarize(out)
    assert report["oom_events"] >= 1
    assert any(o["what"] == "load" for o in report["ooms"])


def test_static_refuses_services_whose_slice_does_not_fit() -> None:
    m = _manager(
        "static",
        _svc("voice", 2 * GIB, cls=ServiceClass.REALTIME, residency=Residency.PINNED),
        _svc("big", 7 * GIB),
        _svc("small", GIB, cls=ServiceClass.BATCH),
    )
    loads = _of(Load, m.start(0.0))
    assert sorted(ld.service for ld in loads) == ["small", "voice"]
    (rej,) = _of(Reject, m.handle(_arrive("r1", "big"), 1.0))
    assert rej.reason is Reason.SERVICE_UNAVAILABLE


def test_static_requests_beyond_the_slots_wait() -> None:
    m = _manager("static", _svc("a", GIB, concurrency=1))
    m.start(0.0)
    m.handle(LoadFinished(service="a"), 1.0)
    assert _of(Dispatch, m.handle(_arrive("r1", "a"), 2.0))
    acts = m.handle(_arrive("r2", "a"), 2.0)
    assert not _of(Dispatch, acts)
    assert _of(Dispatch, m.handle(RequestFinished(request_id="r1", attempt=1), 3.0))


def test_ollama_like_keeps_at_most_three_models_and_evicts_idle_ones() -> None:
    services = [_svc(f"m{i}", GIB) for i in range(OLLAMA_MAX_LOADED + 1)]
    m = _manager("ollama-like", *services, budget=24 * GIB)
    assert not m.start(0.0)
    t = 1.0
    for i in range(OLLAMA_MAX_LOADED):
        acts = m.handle(_arrive(f"r{i}", f"m{i}"), t)
        assert [ld.service for ld in _of(Load, acts)] == [f"m{i}"]
        m.handle(LoadFinished(service=f"m{i}"), t + 0.5)
        m.handle(RequestFinished(request_id=f"r{i}", attempt=1), t + 1.0)
        t += 2.0
    acts = m.handle(_arrive("rx", "m3"), t)
    (unload,) = _of(Unload, acts)
    assert unload.service == "m0"  # shortest remaining keep-alive
    assert not _of(Load, acts)  # head of line waits for the unload


def test_ollama_like_keep_alive_expires() -> None:
    m = _manager("ollama-like", _svc("a", GIB))
    m.handle(_arrive("r1", "a"), 0.0)
    m.handle(LoadFinished(service="a"), 1.0)
    m.handle(RequestFinished(request_id="r1", attempt=1), 2.0)
    assert m.next_wakeup(2.0) == 2.0 + OLLAMA_KEEP_ALIVE_S
    (unload,) = _of(Unload, m.handle(Tick(), 2.0 + OLLAMA_KEEP_ALIVE_S))
    assert unload.reason is Reason.TTL_EXPIRED


def test_swap_holds_one_service_at_a_time_in_fifo_order() -> None:
    m = _manager("swap", _svc("a", GIB), _svc("b", GIB), budget=24 * GIB)
    m.start(0.0)
    assert [ld.service for ld in _of(Load, m.handle(_arrive("r1", "a"), 0.0))] == ["a"]
    assert not _of(Load, m.handle(_arrive("r2", "b"), 0.1))
    acts = m.handle(_arrive("r3", "a"), 0.2)
    assert not _of(Load, acts)
    acts = m.handle(LoadFinished(service="a"), 1.0)
    assert [d.request_id for d in _of(Dispatch, acts)] == ["r1"]  # r3 is behind r2
    acts = m.handle(RequestFinished(request_id="r1", attempt=1), 2.0)
    assert [u.service for u in _of(Unload, acts)] == ["a"]


def test_oracle_has_infinite_memory_and_everything_warm() -> None:
    m = _manager("oracle", _svc("a", 20 * GIB), _svc("b", 20 * GIB))
    assert m.policy.infinite_memory
    assert sorted(ld.service for ld in _of(Load, m.start(0.0))) == ["a", "b"]
