"""Every measured byte is charged, and a pause releases nothing until it is confirmed.

- memory measured for a service that is not loaded is its ``leftover`` until a sample
  shows it gone; parked weights and KV state on the host device count against it; a
  weights copy shared by two services is charged once;
- a Pause holds the request's memory (and its model loaded) until ``PauseFinished``; a
  ``PauseRefused`` leaves the stream running to its end, never paused again or killed
  for time sharing;
- a backend that splits its KV pool between slots admits a request against one slot.

The property: for any event sequence, right after each memory sample is reconciled,
per device and per measured service ``s`` (``m_s`` bytes measured, ``decided_s`` its
leases, ``parked_s`` what the park budget holds of it on the host device):
``charged_s + parked_s == max(m_s, decided_s + parked_s)`` (every measured byte is
charged, and only the manager's own admitted estimates exceed a measurement),
``foreign == max(0, used - baseline - overhead - sum(m))`` (``overhead``: the workers'
memory beyond their services' claims) and the device's ``parked`` is the sum of
``parked_s``. So ``used == baseline + overhead + foreign + sum(charged + parked - unspent)``
with ``unspent_s = max(0, decided_s + parked_s - m_s)``, to the byte.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.actions import Dispatch, Load, Pause, Preempt, Reject, Unload
from accelmux.core.events import (
    AdminCommand,
    Demand,
    MemorySampled,
    PauseFinished,
    PauseRefused,
    RequestArrived,
    Tick,
    Unloaded,
)
from accelmux.core.ledger import DECIDED
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.policies.accelmux import TIME_SHARE_MIN_RUN_S
from accelmux.core.specs import Capabilities, ManagerSpec, ServiceSpec
from accelmux.core.types import (
    GIB,
    MIB,
    SERVICE_CATEGORIES,
    Category,
    Reason,
    ResizeSupport,
    ServiceKind,
    Tier,
)

from .fake_executor import FakeExecutor
from .support import EXACT, device, done, llm_profile, loaded, of, service
from .test_properties import SETTINGS, Op, apply_op, manager_specs, ops_strategy
from .world_oracle import check_indexes

PAUSABLE = Capabilities(pause=True, park=True, host_cache=True)


def llm(name: str, *, caps: Capabilities = PAUSABLE, weights: int = 5 * GIB) -> ServiceSpec:
    spec = service(
        name,
        kind=ServiceKind.CHAT,
        profile=llm_profile(weights=weights, kv_floor=256 * MIB, kv_ceiling=GIB),
    )
    return dataclasses.replace(spec, capabilities=caps)


def build(
    *services: ServiceSpec, budget: int = 8 * GIB, kind: str = "virtual", host: int = 16 * GIB
) -> Manager:
    dev = dataclasses.replace(device(budget=budget, headroom=0), kind=kind)
    spec = ManagerSpec(devices=(dev,), services=services, knobs=EXACT, host_budget_bytes=host)
    return Manager(spec, make_policy("accelmux"))


def ask(rid: str, svc: str, tokens: int = 1024, *, pausable: bool = True) -> RequestArrived:
    return RequestArrived(
        request_id=rid,
        service=svc,
        demand=Demand(kv_tokens=tokens, prompt_tokens=tokens // 2, output_tokens=tokens // 2),
        pausable=pausable,
    )


def a_running_b_waiting(m: Manager) -> float:
    """a streams a1; b1 arrives; at the returned time a1 ran long enough to be paused."""
    m.start(0.0)
    m.handle(ask("a1", "a"), 0.0)
    m.handle(loaded("a"), 0.0)
    m.handle(ask("b1", "b"), 0.1)
    return TIME_SHARE_MIN_RUN_S + 0.1


# ---- acknowledged pauses ---------------------------------------------------------------
def test_a_paused_stream_keeps_its_memory_and_model_until_the_backend_confirms() -> None:
    m = build(llm("a"), llm("b"))
    t = a_running_b_waiting(m)
    a = m.world.services["a"]
    out = m.handle(Tick(), t)
    (pause,) = of(Pause, out)
    assert pause.park and not of(Unload, out)
    a1 = m.world.inflight["a1"]
    assert a1.pausing is True and not a1.paused and a1.active_lease is not None
    assert a.kv_in_use == a1.kv_bytes > 0  # its KV is still in the pool
    assert m.world.host_kv == 0
    assert m.world.host_pending == a1.kv_bytes  # host room kept for it meanwhile
    # Nothing more happens on later rounds while the backend has not answered.
    assert not of(Unload, m.handle(Tick(), t + 1.0))
    assert not of(Pause, m.handle(Tick(), t + 1.5))  # never asked twice
    out = m.handle(PauseFinished(request_id="a1", attempt=1), t + 2.0)
    (unload,) = of(Unload, out)
    assert (unload.service, unload.tier) == ("a", Tier.PARKED)
    assert a1.active_lease is None and a.kv_in_use == 0 and m.world.host_pending == 0
    assert m.world.waiting["a1"].paused and m.world.host_kv == a1.parked_kv > 0


def test_a_refused_pause_lets_the_stream_run_to_its_end_then_the_other_model_runs() -> None:
    m = build(llm("a"), llm("b"))
    t = a_running_b_waiting(m)
    m.handle(Tick(), t)
    out = m.handle(PauseRefused(request_id="a1", attempt=1, error="it names tools"), t + 0.1)
    # It runs on, holding its memory; it is neither paused again nor preempted.
    assert not of(Unload, out) and not of(Preempt, out) and not of(Pause, out)
    a1 = m.world.inflight["a1"]
    assert a1.pausing is None and not a1.pausable and m.world.host_pending == 0
    assert "pause refused: it names tools" in m.explain("a1")[-1]
    for now in (t + 5.0, t + 20.0):
        later = m.handle(Tick(), now)
        assert not of(Pause, later) and not of(Preempt, later) and not of(Unload, later)
    out = m.handle(done("a1"), t + 25.0)
    out += m.handle(Tick(), t + 25.0)
    assert [u.service for u in of(Unload, out)] == ["a"]  # b1 gets the memory now
    assert not of(Reject, out)


def test_a_stale_or_unknown_answer_changes_nothing() -> None:
    m = build(llm("a"), llm("b"))
    t = a_running_b_waiting(m)
    m.handle(Tick(), t)
    m.handle(PauseFinished(request_id="a1", attempt=2), t)  # another attempt
    m.handle(PauseFinished(request_id="nobody", attempt=1), t)
    m.handle(PauseRefused(request_id="b1", attempt=1), t)  # b1 is not running
    assert m.world.inflight["a1"].pausing is True
    check_indexes(m.world)


def test_slot_files_on_disk_are_not_charged_to_host_ram() -> None:
    disk = dataclasses.replace(PAUSABLE, park_on_disk=True)
    m = build(llm("a", caps=disk), llm("b", caps=disk))
    t = a_running_b_waiting(m)
    m.handle(Tick(), t)
    m.handle(PauseFinished(request_id="a1", attempt=1), t)
    a1 = m.world.waiting["a1"]
    assert a1.paused and a1.parked and a1.parked_kv > 0
    assert m.world.host_kv == 0  # its KV is a file on disk
    check_indexes(m.world)


# ---- leftover, parked and shared memory ------------------------------------------------
def test_memory_measured_for_an_unloaded_service_is_leftover_until_a_sample_shows_it_gone() -> None:
    m = build(llm("a"), llm("b"))
    m.start(0.0)
    ledger = m.world.ledger
    before = ledger.available("gpu")
    sample = MemorySampled(device="gpu", used_bytes=GIB, per_service={"a": GIB})
    m.handle(sample, 1.0)
    assert ledger.amount("gpu", "a", Category.LEFTOVER) == GIB
    assert ledger.foreign("gpu") == 0
    assert ledger.available("gpu") == before - GIB
    snap = m.snapshot().as_dict()
    (a,) = [s for s in snap["services"] if s["name"] == "a"]
    assert a["ledger"]["leftover"] == GIB and a["estimated_bytes"] == 0
    m.handle(MemorySampled(device="gpu", used_bytes=0, per_service={"a": 0}), 2.0)
    assert ledger.amount("gpu", "a", Category.LEFTOVER) == 0
    m.handle(sample, 3.0)
    m.handle(MemorySampled(device="gpu", used_bytes=0, per_service={}), 4.0)  # not measured
    assert ledger.available("gpu") == before


def test_a_load_takes_over_its_own_leftover() -> None:
    m = build(llm("a", weights=2 * GIB), budget=4 * GIB)
    m.start(0.0)
    m.handle(MemorySampled(device="gpu", used_bytes=GIB, per_service={"a": GIB}), 0.5)
    out = m.handle(ask("a1", "a"), 1.0)
    assert of(Unload, out) == []
    ledger = m.world.ledger
    assert ledger.amount("gpu", "a", Category.LEFTOVER) == 0
    assert ledger.amount("gpu", "a", Category.WEIGHTS) == 2 * GIB


def test_parked_weights_on_the_host_device_count_against_its_budget() -> None:
    m = build(llm("a", weights=2 * GIB), kind="host")
    m.start(0.0)
    m.handle(ask("a1", "a"), 0.0)
    m.handle(loaded("a"), 0.0)
    m.handle(done("a1"), 1.0)
    ledger = m.world.ledger
    before = ledger.available("gpu")
    resident = m.world.services["a"].resident_bytes
    m.ops.unload(m.world.services["a"], reason=Reason.EVICTED_FOR_MEMORY, tier=Tier.PARKED)
    (unload,) = of(Unload, m.ops.drain())
    assert unload.tier is Tier.PARKED
    assert ledger.parked("gpu") == 0  # still device memory while it unloads
    m.handle(Unloaded(service="a"), 3.0)
    parked = m.world.host_weights["a"]
    assert parked == 2 * GIB and ledger.parked("gpu") == parked
    assert ledger.available("gpu") == before + resident - parked
    # A sample measuring the parked weights charges them once (parked), not as leftover.
    m.handle(MemorySampled(device="gpu", used_bytes=parked, per_service={"a": parked}), 4.0)
    assert ledger.amount("gpu", "a", Category.LEFTOVER) == 0 and ledger.foreign("gpu") == 0
    # Loaded again, the weights are device memory again.
    m.handle(ask("a2", "a"), 5.0)
    assert ledger.parked("gpu") == 0


def test_weights_shared_by_two_services_are_charged_once_and_handed_over() -> None:
    emb = dataclasses.replace(
        service("embeddings", kind=ServiceKind.EMBEDDINGS), weights_key="minilm:packaged"
    )
    idx = dataclasses.replace(emb, name="indexer")
    m = build(emb, idx)
    m.start(0.0)
    ledger = m.world.ledger
    m.handle(RequestArrived(request_id="e1", service="embeddings"), 0.0)
    m.handle(loaded("embeddings"), 0.0)
    m.handle(RequestArrived(request_id="i1", service="indexer"), 0.1)
    m.handle(loaded("indexer"), 0.1)
    assert ledger.amount("gpu", "embeddings", Category.WEIGHTS) == GIB
    assert ledger.amount("gpu", "indexer", Category.WEIGHTS) == 0
    snap = {s["name"]: s for s in m.snapshot().as_dict()["services"]}
    assert snap["embeddings"]["weights_shared_with"] == ["indexer"]
    assert snap["indexer"]["weights_shared_by"] == "embeddings"
    # embeddings goes: the copy stays loaded for the indexer, which is charged it now.
    m.handle(done("e1"), 1.0)
    m.handle(AdminCommand(service="embeddings", op="unload"), 1.0)
    m.handle(Unloaded(service="embeddings"), 1.5)
    assert ledger.amount("gpu", "indexer", Category.WEIGHTS) == GIB
    assert ledger.decided("gpu") >= GIB
    assert m.world.services["indexer"].weights_shared_by is None
    check_indexes(m.world)


# ---- one slot's share of the context ---------------------------------------------------
def test_a_request_longer_than_one_slot_is_too_large_naming_the_slot() -> None:
    caps = Capabilities(resize=ResizeSupport.NEXT_LOAD, kv_per_slot=True)
    spec = dataclasses.replace(llm("a", caps=caps), concurrency=4)
    m = build(spec)
    m.start(0.0)
    per_token = spec.profile.kv_bytes_per_token
    slot_tokens = spec.profile.kv_ceiling // 4 // per_token
    out = m.handle(ask("big", "a", tokens=slot_tokens + 1), 0.0)
    (reject,) = of(Reject, out)
    assert reject.reason is Reason.TOO_LARGE
    assert "one of its 4 slots" in reject.detail
    out = m.handle(ask("fits", "a", tokens=slot_tokens), 0.1)
    assert not of(Reject, out)


# ---- the property ----------------------------------------------------------------------
def _check_sample(m: Manager, event: MemorySampled) -> None:
    w = m.world
    ledger = w.ledger
    dev = event.device
    on_host = dev == w.park_device
    total_parked = 0
    for svc in w.services_by_device[dev]:
        parked = w.parked_of(svc) if on_host else 0
        total_parked += parked
        if svc.name not in event.per_service:
            assert ledger.amount(dev, svc.name, Category.LEFTOVER) == 0
            continue
        measured = event.per_service[svc.name]
        charged = sum(ledger.amount(dev, svc.name, c) for c in SERVICE_CATEGORIES)
        decided = sum(ledger.amount(dev, svc.name, c) for c in DECIDED)
        assert charged + parked == max(measured, decided + parked), svc.name
    managed = sum(event.per_service.values())
    unmanaged = event.used_bytes - event.baseline_bytes - event.overhead_bytes - managed
    assert ledger.foreign(dev) == max(0, unmanaged)
    assert ledger.overhead(dev) == event.overhead_bytes  # the workers': in use, not foreign
    assert ledger.parked(dev) == (total_parked if on_host else 0)


@st.composite
def accounting_specs(draw: st.DrawFn) -> ManagerSpec:
    spec: ManagerSpec = draw(manager_specs())
    kind = draw(st.sampled_from(["virtual", "host"]))
    devices = tuple(dataclasses.replace(d, kind=kind) for d in spec.devices)
    services = []
    for s in spec.services:
        caps = dataclasses.replace(
            s.capabilities,
            park_on_disk=draw(st.booleans()),
            kv_per_slot=s.kind.is_llm and draw(st.booleans()),
        )
        key = draw(st.sampled_from(["", "", "shared-a", "shared-b"]))
        services.append(dataclasses.replace(s, capabilities=caps, weights_key=key))
    return dataclasses.replace(spec, devices=devices, services=tuple(services))


def _sample(ex: FakeExecutor, a: int, b: float, dt: float) -> None:
    """Measure every service, loaded or not (a process that outlives its unload)."""
    w = ex.manager.world
    ledger = w.ledger
    per_service: dict[str, int] = {}
    for i, svc in enumerate(w.services.values()):
        held = sum(ledger.amount("gpu", svc.name, c) for c in DECIDED)
        if svc.holds_memory:
            per_service[svc.name] = int(held * (0.8 + 0.5 * ((a >> i) % 5) / 4))
        elif (a >> i) % 3 == 0:
            per_service[svc.name] = int(b * 512 * MIB) + w.parked_of(svc)
    foreign = 0 if a % 3 == 0 else int(b * GIB)
    baseline = (a % 4) * 64 * MIB
    overhead = (a % 5) * 96 * MIB  # a GPU worker's CUDA context and workspaces
    used = sum(per_service.values()) + foreign + baseline + overhead
    ex.send(
        MemorySampled(
            device="gpu",
            used_bytes=used,
            per_service=per_service,
            baseline_bytes=baseline,
            overhead_bytes=overhead,
        ),
        dt,
    )


@SETTINGS
@given(
    spec=accounting_specs(),
    ops=ops_strategy,
    refusals=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_every_measured_byte_is_charged_after_any_event_sequence(
    spec: ManagerSpec, ops: list[Op], refusals: list[bool]
) -> None:
    m = Manager(spec, make_policy("accelmux"))
    checked: list[int] = []
    reconcile = m._reconcile

    def reconcile_and_check(event: MemorySampled) -> None:
        reconcile(event)
        _check_sample(m, event)
        checked.append(1)

    m._reconcile = reconcile_and_check  # type: ignore[method-assign]
    ex = FakeExecutor(m)
    counter = [0]
    for i, op in enumerate(ops):
        ex.refuse_pauses = refusals[i % len(refusals)]
        kind, a, b, dt = op
        if kind == "sample" or i % 5 == 4:
            _sample(ex, a, b, dt)
        else:
            apply_op(ex, spec, op, counter)
        ex.check_world()
    assert checked
    ex.refuse_pauses = False
    ex.settle()
    ex.check_world()


def test_a_request_longer_than_a_slot_of_the_running_pool_reloads_it_larger() -> None:
    caps = Capabilities(resize=ResizeSupport.NEXT_LOAD, kv_per_slot=True)
    spec = dataclasses.replace(
        llm("a", caps=caps, weights=GIB),
        concurrency=2,
        profile=llm_profile(weights=GIB, kv_floor=256 * MIB, kv_ceiling=2 * GIB),
    )
    m = build(spec, budget=3 * GIB + 512 * MIB)
    m.start(0.0)
    per_token = spec.profile.kv_bytes_per_token
    m.handle(ask("small", "a", tokens=256), 0.0)
    m.handle(loaded("a"), 0.0)
    svc = m.world.services["a"]
    m.handle(done("small"), 1.0)
    # A request of 900 MiB of KV fits one slot of the 2 GiB ceiling, not of this pool.
    tokens = 900 * MIB // per_token
    assert svc.kv_slot < 900 * MIB <= svc.kv_request_limit
    out = m.handle(ask("long", "a", tokens=tokens), 2.0)
    (unload,) = of(Unload, out)
    assert unload.reason is Reason.RESIZE_AT_NEXT_LOAD
    out = m.handle(Unloaded(service="a"), 2.5)
    (load,) = [a for a in out if isinstance(a, Load)]
    assert load.kv_pool_bytes >= 2 * 900 * MIB  # a slot of it holds the request
    out = m.handle(loaded("a"), 3.0)
    assert [d.request_id for d in of(Dispatch, out)] == ["long"]
