"""Property tests: random specs and event sequences driven through a fake executor.

For any sequence: decided memory stays within budget - headroom, every request ends
exactly once, leases never leak, pinned services are never evicted or expired, and the
same sequence gives the same decisions.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelmux.core.events import (
    AdminCommand,
    BackendCrashed,
    Demand,
    LoadFailed,
    LoadFinished,
    MemorySampled,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    ResizeFinished,
    ShutdownRequested,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.specs import (
    Capabilities,
    DeviceSpec,
    ManagerSpec,
    MemoryProfile,
    PolicyKnobs,
    ServiceSpec,
    Window,
)
from accelmux.core.types import (
    GIB,
    MIB,
    Category,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceKind,
    ServiceStatus,
)

from .fake_executor import DOWN, ENDED, LOADING, RUNNING, UNLOADING, FakeExecutor

SETTINGS = settings(
    max_examples=max(200, settings().max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

LLM_KINDS = (ServiceKind.CHAT, ServiceKind.COMPLETION)
OTHER_KINDS = (ServiceKind.IMAGE, ServiceKind.ASR, ServiceKind.EMBEDDINGS, ServiceKind.DETECT)


@st.composite
def profiles(draw: st.DrawFn, llm: bool) -> MemoryProfile:
    weights = draw(st.integers(0, 6 * 1024)) * MIB
    runtime = draw(st.integers(0, 512)) * MIB
    workspace = draw(st.integers(0, 1024)) * MIB
    if llm:
        floor = draw(st.integers(0, 1024)) * MIB
        ceiling = floor + draw(st.integers(0, 3 * 1024)) * MIB
        return MemoryProfile(
            weights=weights,
            runtime=runtime,
            kv_bytes_per_token=draw(st.sampled_from([32, 64, 128, 256])) * 1024,
            kv_floor=floor,
            kv_ceiling=ceiling,
            workspace=workspace,
        )
    per_unit = float(draw(st.integers(0, 1024)) * MIB)
    return MemoryProfile(weights=weights, runtime=runtime, workspace=workspace, per_unit=per_unit)


@st.composite
def manager_specs(draw: st.DrawFn) -> ManagerSpec:
    budget = draw(st.integers(4, 24)) * GIB
    dev = DeviceSpec(
        name="gpu",
        kind="virtual",
        capacity_bytes=budget,
        budget_bytes=budget,
        headroom_bytes=draw(st.integers(0, 1024)) * MIB,
    )
    services = []
    for i in range(draw(st.integers(1, 4))):
        llm = draw(st.booleans())
        kind = draw(st.sampled_from(LLM_KINDS if llm else OTHER_KINDS))
        cls = draw(st.sampled_from(list(ServiceClass)))
        windows: tuple[Window, ...] = ()
        if cls >= ServiceClass.BATCH and draw(st.booleans()):
            start = float(draw(st.integers(0, 23)) * 3600)
            windows = (Window(start_s=start, end_s=(start + 4 * 3600) % 86_400 or 86_400),)
        services.append(
            ServiceSpec(
                name=f"s{i}",
                kind=kind,
                cls=cls,
                residency=draw(st.sampled_from(list(Residency))),
                device="gpu",
                profile=draw(profiles(llm)),
                concurrency=draw(st.integers(1, 4)),
                ttl_s=float(draw(st.integers(0, 600))),
                queue_limit=draw(st.integers(0, 8)),
                deadline_s=float(draw(st.integers(1, 60))),
                windows=windows,
                capabilities=Capabilities(
                    resize=draw(st.sampled_from(list(ResizeSupport))),
                    pause=(pause := llm and draw(st.booleans())),
                    park=pause and draw(st.booleans()),
                    sleep=draw(st.booleans()),
                    host_cache=draw(st.booleans()),
                ),
            )
        )
    knobs = PolicyKnobs(
        safety_factor=draw(st.sampled_from([1.0, 1.2, 1.5])),
        prewarm=draw(st.booleans()),
        crash_backoff_s=draw(st.sampled_from([0.5, 1.0, 5.0])),
    )
    return ManagerSpec(
        devices=(dev,),
        services=tuple(services),
        knobs=knobs,
        clock_origin_s_of_day=float(draw(st.integers(0, 86_399))),
        host_budget_bytes=draw(st.sampled_from([0, 2 * GIB, 16 * GIB])),
    )


OP_KINDS = (
    "arrive",
    "arrive",
    "arrive",
    "arrive",
    "finish",
    "finish",
    "finish",
    "load_done",
    "stale",
    "cancel",
    "tick",
    "tick",
    "load_done",
    "load_done",
    "load_fail",
    "resize_done",
    "resize_done",
    "unloaded",
    "unloaded",
    "crash",
    "sample",
    "admin",
    "shutdown",
)
Op = tuple[str, int, float, float]
ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(OP_KINDS),
        st.integers(0, 10**6),
        st.floats(0.0, 1.0),
        st.floats(0.0, 5.0),
    ),
    min_size=20,
    max_size=80,
)


def _pick(items: list[str], a: int) -> str | None:
    return items[a % len(items)] if items else None


def apply_op(ex: FakeExecutor, spec: ManagerSpec, op: Op, counter: list[int]) -> None:
    kind, a, b, dt = op
    names = [s.name for s in spec.services]
    world = ex.manager.world
    if kind == "arrive":
        svc = spec.services[a % len(spec.services)]
        p = svc.profile
        if p.kv_bytes_per_token:
            tokens = int(b * 1.3 * max(p.kv_ceiling, 64 * MIB) / p.kv_bytes_per_token)
            demand = Demand(kv_tokens=tokens, prompt_tokens=tokens // 2, output_tokens=tokens // 4)
        else:
            demand = Demand(units=round(b * 4, 3))
        counter[0] += 1
        ex.send(
            RequestArrived(
                request_id=f"r{counter[0]}",
                service=svc.addressed_as,
                demand=demand,
                pausable=b < 0.7,
            ),
            dt,
        )
    elif kind == "finish":
        rid = _pick(ex.in_state(RUNNING), a)
        if rid is not None:
            peak = int(ex.lease_bytes[rid] * (0.5 + b))
            ex.now += dt
            ex.finish(rid, ok=a % 10 != 0, peak=peak if a % 7 else None)
    elif kind == "stale":
        rid = _pick(sorted(ex.attempts), a)
        if rid is not None:
            attempt = ex.attempts[rid] + (1 if b < 0.5 else 0)
            if attempt >= 1 and not (ex.requests[rid] == RUNNING and attempt == ex.attempts[rid]):
                ex.send(RequestFinished(request_id=rid, attempt=attempt, peak_bytes=1), dt)
    elif kind == "cancel":
        rid = _pick(sorted(ex.requests), a)
        if rid is not None:
            ex.send(RequestCancelled(request_id=rid), dt)
    elif kind == "tick":
        ex.send(Tick(), dt * 120)
    elif kind == "load_done":
        name = _pick(ex.services_in(LOADING), a)
        if name is not None:
            p = world.services[name].spec.profile
            measured = int(p.weights * (0.8 + 0.5 * b)) if a % 2 else None
            ex.send(LoadFinished(service=name, weights_bytes=measured), dt)
    elif kind == "load_fail":
        name = _pick(ex.services_in(LOADING), a)
        if name is not None:
            ex.send(LoadFailed(service=name, error="bad model"), dt)
    elif kind == "resize_done":
        name = _pick(sorted(ex.resizes), a)
        if name is not None:
            ok = a % 4 != 0
            ex.send(
                ResizeFinished(service=name, kv_pool_bytes=ex.resizes[name], ok=ok, error="no"),
                dt,
            )
    elif kind == "unloaded":
        name = _pick(ex.services_in(UNLOADING), a)
        if name is not None:
            ex.send(Unloaded(service=name), dt)
    elif kind == "crash":
        ex.send(BackendCrashed(service=names[a % len(names)], error="segfault"), dt)
    elif kind == "sample":
        ledger = world.ledger
        per_service = {}
        for state in world.services.values():
            if state.holds_memory:
                decided = ledger.service_total("gpu", state.name) - ledger.amount(
                    "gpu", state.name, Category.RESERVED
                )
                per_service[state.name] = int(decided * (0.9 + 0.4 * ((a >> 3) % 5) / 4))
        usable = spec.devices[0].usable_bytes
        foreign = 0 if a % 3 == 0 else int(b * 0.6 * usable)
        used = sum(per_service.values()) + foreign
        ex.send(MemorySampled(device="gpu", used_bytes=used, per_service=per_service), dt)
    elif kind == "admin":
        op_name = ("load", "unload", "pin", "unpin")[(a // len(names)) % 4]
        ex.send(AdminCommand(service=names[a % len(names)], op=op_name), dt)
    elif kind == "shutdown" and b < 0.05:
        ex.send(ShutdownRequested(), dt)


def run(spec: ManagerSpec, ops: list[Op]) -> FakeExecutor:
    ex = FakeExecutor(Manager(spec, make_policy("accelmux")))
    ex.check_world()
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)
        ex.check_world()
    return ex


def unload_everything(ex: FakeExecutor) -> None:
    for name in sorted(ex.services):
        ex.send(AdminCommand(service=name, op="unload"))
        ex.check_world()
    for _ in range(100):
        if all(state == DOWN for state in ex.services.values()):
            return
        ex.settle()
        ex.send(Tick(), 1000.0)
        ex.check_world()
    raise AssertionError(f"services never unloaded: {ex.services}")


@pytest.mark.slow
@SETTINGS
@given(spec=manager_specs(), ops=ops_strategy)
def test_invariants_hold_for_any_event_sequence(spec: ManagerSpec, ops: list[Op]) -> None:
    ex = run(spec, ops)
    assert not ex.pinned_evictions, ex.pinned_evictions
    # Before draining nothing is lost: every request is ended, waiting or running.
    for rid, state in ex.requests.items():
        assert state == ENDED or rid in ex.manager.world.waiting or rid in ex.manager.world.inflight
    ex.settle()
    ex.check_world()
    assert all(state == ENDED for state in ex.requests.values())
    assert all(len(ex.endings[rid]) == 1 for rid in ex.requests)
    # No leaks: only resident leases of services holding memory remain.
    world = ex.manager.world
    resident = sum(
        len(s.resident_leases) + (s.kv_lease is not None)
        for s in world.services.values()
        if s.holds_memory
    )
    assert world.ledger.lease_count() == resident
    unload_everything(ex)
    assert not ex.pinned_evictions, ex.pinned_evictions
    assert world.ledger.lease_count() == 0
    assert world.ledger.decided("gpu") == 0
    assert world.ledger.committed("gpu") == 0
    assert all(
        s.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED) for s in world.services.values()
    )


@pytest.mark.slow
@SETTINGS
@given(spec=manager_specs(), ops=ops_strategy)
def test_same_events_give_same_decisions(spec: ManagerSpec, ops: list[Op]) -> None:
    first = run(spec, ops)
    second = run(spec, ops)
    assert first.actions == second.actions
    assert [d.as_dict() for d in first.manager.log] == [d.as_dict() for d in second.manager.log]
    assert first.manager.snapshot().as_dict() == second.manager.snapshot().as_dict()
