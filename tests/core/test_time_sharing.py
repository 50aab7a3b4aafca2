"""Many LLMs on one device: paused requests, residency tiers and time sharing.

A request is paused only when its backend declares ``pause`` (and ``park`` to park its
KV state); a paused request resumes in the same attempt; an LLM request waiting for its
first token pauses another model's streams to switch models, and the paused streams do
not take the memory back before it started; realtime work pauses interactive streams
and they resume after it; parked weights stay within the host budget and reload at the
cost measured for their tier.
"""

from __future__ import annotations

import dataclasses

from accelmux.core.actions import Action, Fail, Load, Pause, Resume, Unload
from accelmux.core.events import Demand, PauseFinished, RequestArrived, Tick, Unloaded
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.policies.accelmux import TIME_SHARE_MIN_RUN_S
from accelmux.core.specs import Capabilities, ManagerSpec, ServiceSpec
from accelmux.core.types import (
    GIB,
    MIB,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceKind,
    Tier,
)

from .support import EXACT, device, dispatched, done, llm_profile, loaded, of, service

PAUSABLE = Capabilities(pause=True, park=True, host_cache=True)


def llm(
    name: str,
    *,
    cls: ServiceClass = ServiceClass.INTERACTIVE,
    caps: Capabilities = PAUSABLE,
    weights: int = 5 * GIB,
    residency: Residency = Residency.WARM,
) -> ServiceSpec:
    spec = service(
        name,
        kind=ServiceKind.CHAT,
        cls=cls,
        residency=residency,
        profile=llm_profile(weights=weights, kv_floor=256 * MIB, kv_ceiling=GIB),
    )
    return dataclasses.replace(spec, capabilities=caps)


def build(*services: ServiceSpec, host_budget: int = 16 * GIB, budget: int = 8 * GIB) -> Manager:
    spec = ManagerSpec(
        devices=(device(budget=budget, headroom=0),),
        services=services,
        knobs=EXACT,
        host_budget_bytes=host_budget,
    )
    return Manager(spec, make_policy("accelmux"))


def ask(rid: str, svc: str, tokens: int = 1024) -> RequestArrived:
    return RequestArrived(
        request_id=rid,
        service=svc,
        demand=Demand(kv_tokens=tokens, prompt_tokens=tokens // 2, output_tokens=tokens // 2),
        pausable=True,
    )


def acked(m: Manager, out: list[Action], now: float) -> list[Action]:
    """``out`` and what the Manager does once the backend confirmed each of its pauses."""
    more: list[Action] = []
    for p in of(Pause, out):
        more += m.handle(PauseFinished(request_id=p.request_id, attempt=p.attempt), now)
    return out + (acked(m, more, now) if more else [])


def running_a(m: Manager) -> None:
    """Model a is loaded and streams request a1 since t=0."""
    m.start(0.0)
    m.handle(ask("a1", "a"), 0.0)
    m.handle(loaded("a"), 0.0)
    assert m.world.inflight.keys() == {"a1"}


def test_a_first_token_due_elsewhere_pauses_a_stream_that_ran_long_enough() -> None:
    m = build(llm("a"), llm("b"))
    running_a(m)
    # Before a1 ran TIME_SHARE_MIN_RUN_S, b's request waits for memory.
    early = m.handle(ask("b1", "b"), TIME_SHARE_MIN_RUN_S / 2)
    assert not of(Pause, early)
    out = m.handle(Tick(), TIME_SHARE_MIN_RUN_S + 0.1)
    (pause,) = of(Pause, out)
    assert (pause.request_id, pause.park, pause.reason) == ("a1", True, Reason.TIME_SHARE)
    # a unloads only once the backend confirmed a1 is parked.
    assert not of(Unload, out) and "a1" in m.world.inflight
    out = acked(m, out, TIME_SHARE_MIN_RUN_S + 0.1)
    (unload,) = of(Unload, out)
    assert (unload.service, unload.tier) == ("a", Tier.PARKED)
    out = m.handle(Unloaded(service="a"), 2.0)
    (load,) = of(Load, out)
    assert load.service == "b"
    # a1 does not take the memory back before b1 started.
    assert not of(Load, [a for a in out if getattr(a, "service", "") == "a"])
    out = m.handle(loaded("b"), 3.0)
    assert dispatched(out) == ["b1"]
    w = m.world
    assert w.waiting["a1"].paused and w.waiting["a1"].parked_kv > 0
    assert w.host_kv == w.waiting["a1"].parked_kv
    # b1 ends and b goes idle: a reloads from host RAM and a1 resumes in its attempt.
    out = m.handle(done("b1"), 5.0)
    out += m.handle(Tick(), 5.0)
    assert of(Unload, out) and of(Unload, out)[0].service == "b"
    out = m.handle(Unloaded(service="b"), 5.5)
    (load,) = of(Load, out)
    assert (load.service, load.from_tier) == ("a", Tier.PARKED)
    out = m.handle(loaded("a"), 6.0)
    (resume,) = of(Resume, out)
    assert (resume.request_id, resume.attempt) == ("a1", 1)
    assert w.host_kv == 0 and "a1" in w.inflight
    out = m.handle(done("a1", attempt=1), 8.0)
    assert not w.inflight and not w.waiting


def test_a_backend_that_cannot_pause_is_never_paused() -> None:
    plain = Capabilities()
    m = build(llm("a", caps=plain), llm("b", caps=plain))
    running_a(m)
    out = m.handle(ask("b1", "b"), 0.5)
    out += m.handle(Tick(), 10.0)
    assert not of(Pause, out)
    assert not of(Unload, out)  # a is busy: b waits for it
    assert m.world.waiting["b1"].wait_reason is Reason.NO_MEMORY


def test_a_request_that_does_not_stream_is_never_paused() -> None:
    m = build(llm("a"), llm("b"))
    m.start(0.0)
    m.handle(dataclasses.replace(ask("a1", "a"), pausable=False), 0.0)
    m.handle(loaded("a"), 0.0)
    out = m.handle(ask("b1", "b"), 0.5)
    out += m.handle(Tick(), 10.0)
    assert not of(Pause, out)


def test_realtime_work_pauses_interactive_streams_and_they_resume_after() -> None:
    voice = service("voice", cls=ServiceClass.REALTIME, residency=Residency.PINNED)
    m = build(llm("a", weights=2 * GIB), voice, budget=12 * GIB)
    m.start(0.0)
    m.handle(loaded("voice"), 0.0)
    m.handle(ask("a1", "a"), 0.0)
    m.handle(loaded("a"), 0.0)
    out = acked(m, m.handle(RequestArrived(request_id="v1", service="voice"), 2.0), 2.0)
    (pause,) = of(Pause, out)
    # Parked: if the realtime work needs the memory, a's model can be evicted.
    assert pause.request_id == "a1" and pause.park
    assert dispatched(out) == ["v1"]
    out = m.handle(done("v1"), 2.5)
    (resume,) = of(Resume, out)
    assert resume.request_id == "a1"
    assert m.world.inflight.keys() == {"a1"}
    assert m.world.inflight["a1"].pauses == 0  # a yield to realtime is not a time-share


def test_a_paused_request_past_its_deadline_ends_with_an_error() -> None:
    m = build(llm("a"), llm("b"))
    running_a(m)
    m.handle(ask("b1", "b"), 0.1)
    acked(m, m.handle(Tick(), TIME_SHARE_MIN_RUN_S + 0.1), TIME_SHARE_MIN_RUN_S + 0.1)
    assert m.world.waiting["a1"].paused
    # b never finishes loading: a1 waits past its deadline and fails (never a hang).
    m.handle(Unloaded(service="a"), 2.0)
    out = m.handle(Tick(), 2.0 + 31.0)
    fails = [f for f in of(Fail, out) if f.request_id == "a1"]
    assert fails and fails[0].reason is Reason.DEADLINE_EXCEEDED
    assert m.world.host_kv == 0


def test_parked_weights_stay_within_the_host_budget() -> None:
    m = build(llm("a"), llm("b"), llm("c"), host_budget=6 * GIB)
    w = m.world
    for i, name in enumerate(("a", "b", "c")):
        t = 100.0 * i
        m.handle(ask(f"{name}1", name), t)
        m.handle(Tick(), t)
        for other in ("a", "b", "c"):
            if w.services[other].status.value == "unloading":
                m.handle(Unloaded(service=other), t + 1)
        m.handle(loaded(name), t + 2)
        m.handle(done(f"{name}1"), t + 3)
        assert w.host_used <= 6 * GIB
    # Only one 5 GiB model fits the budget: the oldest parked copy was dropped.
    assert sum(1 for s in w.services.values() if s.tier is not Tier.COLD) <= 1


def test_reload_costs_are_measured_per_tier() -> None:
    m = build(llm("a"))
    w = m.world
    svc = w.services["a"]
    modelled = w.load_seconds(svc, Tier.PARKED)
    m.handle(ask("a1", "a"), 0.0)
    m.handle(loaded("a"), 4.0)  # a cold load that took 4 s
    assert w.load_seconds(svc, Tier.COLD) == 4.0
    assert w.load_seconds(svc, Tier.PARKED) == modelled  # no parked load measured yet


def test_a_sleeping_server_wakes_with_the_pool_it_slept_with() -> None:
    caps = Capabilities(sleep=True, resize=ResizeSupport.NEXT_LOAD)
    m = build(llm("a", caps=caps), llm("b", caps=caps))
    w = m.world
    m.handle(ask("a1", "a", tokens=4096), 0.0)
    m.handle(loaded("a"), 1.0)
    pool = w.services["a"].kv_pool
    m.handle(done("a1"), 2.0)
    out = m.handle(ask("b1", "b"), 3.0)
    out += m.handle(Tick(), 3.0)
    (unload,) = of(Unload, out)
    assert (unload.service, unload.tier) == ("a", Tier.SLEEPING)
    m.handle(Unloaded(service="a"), 3.5)
    m.handle(loaded("b"), 4.0)
    m.handle(done("b1"), 5.0)
    out = m.handle(ask("a2", "a", tokens=16), 6.0)
    out += m.handle(Tick(), 6.0)
    for name in ("b",):
        if w.services[name].status.value == "unloading":
            out += m.handle(Unloaded(service=name), 6.5)
    wakes = [a for a in of(Load, out) if a.service == "a"]
    assert wakes and wakes[0].from_tier is Tier.SLEEPING
    assert wakes[0].kv_pool_bytes == pool
