"""Each baseline's defining behaviour, driven through the Manager directly."""

from __future__ import annotations

from pathlib import Path

from tests.sim.support import scenario, tiny

from accelmux.core.actions import Action, Dispatch, Load, Reject, Unload
from accelmux.core.events import (
    Demand,
    LoadFinished,
    RequestArrived,
    RequestFinished,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.specs import DeviceSpec, ManagerSpec, MemoryProfile, ServiceSpec
from accelmux.core.types import (
    GIB,
    MIB,
    Reason,
    Residency,
    ServiceClass,
    ServiceKind,
    ServiceStatus,
)
from accelmux.sim.baselines import make_policy, policy_names
from accelmux.sim.baselines.policies import (
    BaselineSettings,
    LlamaSwapSettings,
    OllamaSettings,
    SwapGroup,
)
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
    kind: ServiceKind = ServiceKind.IMAGE,
    ttl_s: float = 300.0,
) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        kind=kind,
        ttl_s=ttl_s,
        cls=cls,
        residency=residency,
        device="gpu",
        profile=MemoryProfile(weights=weights, workspace=workspace),
        concurrency=concurrency,
        deadline_s=1000.0,
    )


def _manager(
    policy: str,
    *services: ServiceSpec,
    budget: int = 8 * GIB,
    settings: BaselineSettings | None = None,
) -> Manager:
    dev = DeviceSpec(
        name="gpu", kind="virtual", capacity_bytes=budget, budget_bytes=budget, headroom_bytes=0
    )
    return Manager(ManagerSpec(devices=(dev,), services=services), make_policy(policy, settings))


def _llm(name: str, weights: int = GIB, **kw: object) -> ServiceSpec:
    return _svc(name, weights, kind=ServiceKind.CHAT, **kw)  # type: ignore[arg-type]


def _ollama(**kw: object) -> BaselineSettings:
    return BaselineSettings(ollama=OllamaSettings(**kw))  # type: ignore[arg-type]


def _swap(**kw: object) -> BaselineSettings:
    return BaselineSettings(llama_swap=LlamaSwapSettings(**kw))  # type: ignore[arg-type]


def _served(m: Manager, rid: str, svc: str, t: float) -> float:
    """Arrive, load, finish one request on ``svc``; the time after it."""
    m.handle(_arrive(rid, svc), t)
    m.handle(LoadFinished(service=svc), t + 0.5)
    m.handle(RequestFinished(request_id=rid, attempt=1), t + 1.0)
    return t + 2.0


def _arrive(rid: str, svc: str) -> RequestArrived:
    return RequestArrived(request_id=rid, service=svc, demand=Demand(units=1.0))


def _of(kind: type, actions: list[Action]) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def test_all_baselines_are_registered() -> None:
    assert {"accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle"} <= (
        set(policy_names())
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


def test_ollama_runs_what_it_does_not_host_as_processes_beside_it() -> None:
    m = _manager("ollama+containers", _llm("chat"), _svc("asr", GIB), _svc("image", GIB))
    loads = _of(Load, m.start(0.0))
    assert sorted(ld.service for ld in loads) == ["asr", "image"]  # chat loads on demand
    m.handle(LoadFinished(service="asr"), 1.0)
    (d,) = _of(Dispatch, m.handle(_arrive("r1", "asr"), 2.0))
    assert d.reason is Reason.UNCOORDINATED


def test_ollama_counts_only_its_own_models_toward_max_loaded() -> None:
    others = [_svc(f"c{i}", GIB) for i in range(3)]  # three always-on processes
    llms = [_llm(f"m{i}") for i in range(4)]
    m = _manager("ollama+containers", *others, *llms, budget=24 * GIB, settings=_ollama())
    m.start(0.0)
    t = 1.0
    for i in range(3):  # three of Ollama's own fit under the default cap of 3
        acts = m.handle(_arrive(f"r{i}", f"m{i}"), t)
        assert [ld.service for ld in _of(Load, acts)] == [f"m{i}"]
        m.handle(LoadFinished(service=f"m{i}"), t + 0.5)
        m.handle(RequestFinished(request_id=f"r{i}", attempt=1), t + 1.0)
        t += 2.0
    acts = m.handle(_arrive("rx", "m3"), t)
    (unload,) = _of(Unload, acts)
    assert unload.service == "m0"  # one of its own, never a process beside it
    assert not _of(Load, acts)  # the head of line waits for the unload


def test_ollama_without_a_cap_loads_while_memory_fits() -> None:
    llms = [_llm(f"m{i}") for i in range(5)]
    m = _manager(
        "ollama+containers", *llms, budget=24 * GIB, settings=_ollama(max_loaded_models=None)
    )
    t = 0.0
    for i in range(5):
        assert [ld.service for ld in _of(Load, m.handle(_arrive(f"r{i}", f"m{i}"), t))] == [f"m{i}"]
        m.handle(LoadFinished(service=f"m{i}"), t + 0.5)
        t += 1.0


def test_ollama_fit_check_leaves_out_the_gpu_overhead() -> None:
    def second_load(overhead: int) -> list[Action]:
        m = _manager(
            "ollama+containers",
            _llm("a", 3 * GIB),
            _llm("b", 3 * GIB),
            settings=_ollama(gpu_overhead_bytes=overhead),
        )
        _served(m, "r1", "a", 0.0)
        return m.handle(_arrive("r2", "b"), 5.0)

    assert [ld.service for ld in _of(Load, second_load(0))] == ["b"]
    acts = second_load(3 * GIB)  # 8 - 3 - 3 GiB overhead leaves 2 GiB: evict a first
    assert not _of(Load, acts) and [u.service for u in _of(Unload, acts)] == ["a"]


def test_ollama_loads_one_model_at_a_time() -> None:
    m = _manager("ollama+containers", _llm("a"), _llm("b"), budget=24 * GIB)
    assert [ld.service for ld in _of(Load, m.handle(_arrive("r1", "a"), 0.0))] == ["a"]
    assert not _of(Load, m.handle(_arrive("r2", "b"), 0.1))  # a is still loading
    acts = m.handle(LoadFinished(service="a"), 1.0)
    assert [ld.service for ld in _of(Load, acts)] == ["b"]
    assert [d.request_id for d in _of(Dispatch, acts)] == ["r1"]


def test_ollama_num_parallel_bounds_requests_per_model() -> None:
    for parallel, expected in ((1, 1), (3, 3)):
        m = _manager(
            "ollama+containers",
            _llm("a", concurrency=4),
            budget=24 * GIB,
            settings=_ollama(num_parallel=parallel),
        )
        for i in range(4):
            m.handle(_arrive(f"r{i}", "a"), 0.0)
        acts = m.handle(LoadFinished(service="a"), 1.0)
        assert len(_of(Dispatch, acts)) == expected


def test_ollama_max_queue_refuses_beyond_it() -> None:
    m = _manager("ollama+containers", _llm("a"), settings=_ollama(max_queue=2))
    m.handle(_arrive("r1", "a"), 0.0)
    m.handle(_arrive("r2", "a"), 0.1)
    (rej,) = _of(Reject, m.handle(_arrive("r3", "a"), 0.2))
    assert rej.reason is Reason.QUEUE_FULL


def test_ollama_keep_alive_expires_and_minus_one_keeps_a_pinned_model() -> None:
    pinned = _llm("voice", residency=Residency.PINNED, cls=ServiceClass.REALTIME)
    for forever in (True, False):
        m = _manager(
            "ollama+containers", pinned, _llm("chat"), settings=_ollama(pinned_forever=forever)
        )
        t = _served(m, "r1", "voice", 0.0)
        _served(m, "r2", "chat", t)
        voice_expiry = 1.0 + 300.0  # last used at 1.0
        assert m.next_wakeup(t + 1.0) == (t + 1.0 + 300.0 if forever else voice_expiry)
        acts = m.handle(Tick(), 10_000.0)
        unloaded = sorted(u.service for u in _of(Unload, acts))
        assert all(u.reason is Reason.TTL_EXPIRED for u in _of(Unload, acts))
        assert unloaded == (["chat"] if forever else ["chat", "voice"])


def test_ollama_evicts_a_model_kept_forever_last() -> None:
    voice = _llm("voice", 2 * GIB, residency=Residency.PINNED, cls=ServiceClass.REALTIME)
    m = _manager("ollama+containers", voice, _llm("a", 2 * GIB), _llm("big", 5 * GIB))
    t = _served(m, "r1", "voice", 0.0)
    t = _served(m, "r2", "a", t)  # 4 GiB loaded, big needs 5 of the 4 left
    (unload,) = _of(Unload, m.handle(_arrive("r3", "big"), t))
    assert unload.service == "a"


def test_llama_swap_persistent_group_never_swaps_out() -> None:
    voice = _svc("voice", GIB, residency=Residency.PINNED, cls=ServiceClass.REALTIME)
    m = _manager("llama-swap", voice, _llm("a"), _llm("b"), budget=24 * GIB)
    assert [ld.service for ld in _of(Load, m.start(0.0))] == ["voice"]  # preloaded
    m.handle(LoadFinished(service="voice"), 0.5)
    unloaded: list[str] = []
    t = 1.0
    for i in range(6):  # a, b, a, b, ...: the swap group swaps every time
        name = "ab"[i % 2]
        acts = m.handle(_arrive(f"r{i}", name), t)
        acts += m.handle(Tick(), t + 0.2)
        for svc in ("a", "b"):
            acts += m.handle(Unloaded(service=svc), t + 0.3)
        acts += m.handle(LoadFinished(service=name), t + 0.5)
        acts += m.handle(RequestFinished(request_id=f"r{i}", attempt=1), t + 1.0)
        unloaded += [u.service for u in _of(Unload, acts)]
        t += 2.0
    assert "voice" not in unloaded and set(unloaded) <= {"a", "b"}
    assert m.world.services["voice"].status is ServiceStatus.LOADED


def test_llama_swap_without_groups_holds_one_model_at_a_time_in_fifo_order() -> None:
    m = _manager("llama-swap", _llm("a"), _llm("b"), budget=24 * GIB, settings=_swap(groups=()))
    m.start(0.0)
    assert [ld.service for ld in _of(Load, m.handle(_arrive("r1", "a"), 0.0))] == ["a"]
    assert not _of(Load, m.handle(_arrive("r2", "b"), 0.1))
    acts = m.handle(_arrive("r3", "a"), 0.2)
    assert not _of(Load, acts)
    acts = m.handle(LoadFinished(service="a"), 1.0)
    assert [d.request_id for d in _of(Dispatch, acts)] == ["r1"]  # r3 is behind r2
    acts = m.handle(RequestFinished(request_id="r1", attempt=1), 2.0)
    assert [u.service for u in _of(Unload, acts)] == ["a"]


def test_llama_swap_exclusive_group_stops_the_other_groups_first() -> None:
    groups = (
        SwapGroup(name="big", members=("big",), swap=True, exclusive=True),
        SwapGroup(name="small", members=("*",), swap=False, exclusive=False),
    )
    m = _manager(
        "llama-swap",
        _llm("big"),
        _llm("a"),
        _llm("b"),
        budget=24 * GIB,
        settings=_swap(groups=groups),
    )
    t = _served(m, "r1", "a", 0.0)
    t = _served(m, "r2", "b", t)  # a non-swapping group: both stay loaded
    acts = m.handle(_arrive("r3", "big"), t)
    assert sorted(u.service for u in _of(Unload, acts)) == ["a", "b"]
    assert not _of(Load, acts)
    m.handle(Unloaded(service="a"), t + 0.5)
    acts = m.handle(Unloaded(service="b"), t + 0.6)
    assert [ld.service for ld in _of(Load, acts)] == ["big"]


def test_llama_swap_ttl_stops_an_idle_model_but_not_a_pinned_one() -> None:
    voice = _llm("voice", residency=Residency.PINNED, cls=ServiceClass.REALTIME, ttl_s=10.0)
    m = _manager("llama-swap", voice, _llm("a", ttl_s=60.0), budget=24 * GIB)
    m.start(0.0)
    m.handle(LoadFinished(service="voice"), 0.5)
    t = _served(m, "r1", "a", 1.0)
    assert m.next_wakeup(t) == 2.0 + 60.0
    acts = m.handle(Tick(), 100.0)
    assert [u.service for u in _of(Unload, acts)] == ["a"]


def test_detection_runs_beside_llama_swap() -> None:
    cam = _svc("cam", GIB, kind=ServiceKind.DETECT, cls=ServiceClass.BACKGROUND)
    m = _manager("llama-swap", cam, _llm("a"))
    assert [ld.service for ld in _of(Load, m.start(0.0))] == ["cam"]


def test_oracle_has_infinite_memory_and_everything_warm() -> None:
    m = _manager("oracle", _svc("a", 20 * GIB), _svc("b", 20 * GIB))
    assert m.policy.infinite_memory
    assert sorted(ld.service for ld in _of(Load, m.start(0.0))) == ["a", "b"]
