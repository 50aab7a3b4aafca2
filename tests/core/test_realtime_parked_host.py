"""A realtime request on a shared-memory host does not wait for memory that a lower class's
parked weights hold (the voice chain's chat request of ``bench/bench_stack_llms.py``), and
one that no eviction can serve is told so at once.

On the host device the park budget is the device's own RAM: weights parked there are
charged against the device (``available`` subtracts ``parked``), so evicting an idle
interactive model to the ``parked`` tier frees only its runtime and KV. The policy used to
evict to ``parked`` for a realtime need, count parked memory as out of its reach
(``room.reachable``: "outside", like a foreign program) and never drop the parked copy for
device room: the realtime request waited out its whole deadline and was rejected
``deadline_exceeded ... (last cause: no_memory)``. Now an eviction for room goes to
``cold`` when the parked copy would leave the need unmet, a parked copy is dropped for
room like an idle service is evicted, and a realtime request whose need only memory out
of the policy's reach (a foreign program) holds is refused ``no_memory`` with the reason.
"""

from __future__ import annotations

import dataclasses

from accelmux.core.actions import Dispatch, Load, Reject, Unload
from accelmux.core.events import (
    Demand,
    LoadFinished,
    MemorySampled,
    RequestArrived,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.specs import Capabilities, ManagerSpec
from accelmux.core.types import GIB, MIB, Residency, ServiceClass, ServiceKind

from .support import EXACT, device, dispatched, done, llm_profile, of, plain_profile, service

PARKABLE = Capabilities(pause=True, park=True, host_cache=True)


def _host_with_voice_and_idle_chat() -> Manager:
    """4 GiB host device: a pinned realtime service (1 GiB) and an idle interactive LLM
    (2 GiB weights, parkable) loaded; 0.75 GiB free."""
    chat = dataclasses.replace(
        service(
            "chat",
            kind=ServiceKind.CHAT,
            profile=llm_profile(weights=2 * GIB, kv_floor=256 * MIB, kv_ceiling=GIB),
        ),
        capabilities=PARKABLE,
    )
    voice = service(
        "voice",
        cls=ServiceClass.REALTIME,
        residency=Residency.PINNED,
        profile=plain_profile(weights=GIB, workspace=100 * MIB, per_unit=GIB),
        deadline_s=10.0,
    )
    dev = dataclasses.replace(device(budget=4 * GIB, headroom=0), kind="host")
    spec = ManagerSpec(
        devices=(dev,), services=(voice, chat), knobs=EXACT, host_budget_bytes=16 * GIB
    )
    m = Manager(spec, make_policy("accelmux"))
    for load in of(Load, m.start(0.0)):
        m.handle(LoadFinished(service=load.service), 0.0)
    # after the realtime grace of the voice model's start (a host device holds other
    # work for it: TUNING.host_realtime_grace_s)
    m.handle(RequestArrived(request_id="c1", service="chat", demand=Demand(kv_tokens=100)), 0.5)
    m.handle(LoadFinished(service="chat"), 0.6)
    m.handle(done("c1"), 1.0)
    assert m.world.ledger.available("gpu") == 3 * GIB // 4
    return m


def _serve_voice(m: Manager) -> tuple[list[str], list[Reject]]:
    """A 1.6 GiB voice request arrives at t=2; every unload it asks for completes half a
    second later; ticks every second to its deadline."""
    actions = m.handle(
        RequestArrived(request_id="v1", service="voice", demand=Demand(units=1.5)), 2.0
    )
    dispatched = [a.request_id for a in actions if isinstance(a, Dispatch)]
    rejects = of(Reject, actions)
    t = 2.5
    while t < 13.0 and not dispatched and not rejects:
        out = []
        for unload in of(Unload, actions):
            out += m.handle(Unloaded(service=unload.service), t)
        out += m.handle(Tick(), t)
        dispatched += [a.request_id for a in out if isinstance(a, Dispatch)]
        rejects += of(Reject, out)
        actions = out
        t += 0.5
    return dispatched, rejects


def test_a_voice_request_on_a_host_device_gets_the_memory_parked_weights_hold() -> None:
    m = _host_with_voice_and_idle_chat()
    dispatched, rejects = _serve_voice(m)
    assert dispatched == ["v1"] and rejects == []
    assert m.world.ledger.parked("gpu") == 0


def test_a_realtime_request_that_cannot_be_served_says_why_before_its_deadline() -> None:
    m = _host_with_voice_and_idle_chat()
    actions = m.handle(
        RequestArrived(request_id="v1", service="voice", demand=Demand(units=1.5)), 2.0
    )
    for unload in of(Unload, actions):
        actions += m.handle(Unloaded(service=unload.service), 2.5)
    actions += m.handle(Tick(), 3.0)
    served = any(isinstance(a, Dispatch) for a in actions)
    refused = [r for r in of(Reject, actions) if r.request_id == "v1"]
    assert served or refused, "neither served nor told why one second after arriving"


def test_a_parked_copy_is_dropped_for_a_realtime_request() -> None:
    m = _host_with_voice_and_idle_chat()
    # a smaller voice request first: parking the chat model frees enough for it
    first = m.handle(
        RequestArrived(request_id="v0", service="voice", demand=Demand(units=0.9)), 2.0
    )
    assert [(u.service, u.tier.value) for u in of(Unload, first)] == [("chat", "parked")]
    assert dispatched(m.handle(Unloaded(service="chat"), 2.5)) == ["v0"]
    assert m.world.ledger.parked("gpu") == 2 * GIB
    m.handle(done("v0"), 3.0)
    # the next one needs the parked copy's memory too: the copy is dropped at once
    actions = m.handle(
        RequestArrived(request_id="v1", service="voice", demand=Demand(units=1.5)), 4.0
    )
    assert [(u.service, u.tier.value) for u in of(Unload, actions)] == [("chat", "cold")]
    assert dispatched(actions) == ["v1"]
    assert m.world.ledger.parked("gpu") == 0


def test_a_realtime_request_only_foreign_memory_keeps_out_is_refused_at_once() -> None:
    m = _host_with_voice_and_idle_chat()
    # a foreign program takes 2.5 GiB: with the chat model gone, 1.6 GiB still cannot fit
    m.handle(
        MemorySampled(device="gpu", used_bytes=5 * GIB // 2),
        1.5,
    )
    actions = m.handle(
        RequestArrived(request_id="v1", service="voice", demand=Demand(units=1.5)), 2.0
    )
    refused = [r for r in of(Reject, actions) if r.request_id == "v1"]
    assert [r.reason.value for r in refused] == ["no_memory"]
    assert "foreign programs hold" in refused[0].detail
