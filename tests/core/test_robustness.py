"""Property tests of the robustness guarantees of the accelmux policy.

- bounded preemption: no request is preempted more than ``MAX_PREEMPTIONS`` times,
  whatever the events (foreign growth, measurements above the leases, crashes);
- learning at once: after a crash with requests in flight, or a sample that measures
  running requests above their leases, the service's next projection covers what was
  learnt (at least twice the crashed leases; at least the measured ratio);
- fair progress: a lower-class request on a loaded service never waits for a higher
  class while its lease fits in the memory nobody holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.actions import Action, Dispatch, Preempt
from accelmux.core.events import (
    BackendCrashed,
    Demand,
    LoadFinished,
    MemorySampled,
    RequestArrived,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.policies.accelmux import MAX_PREEMPTIONS
from accelmux.core.specs import ManagerSpec, MemoryProfile, PolicyKnobs
from accelmux.core.types import GIB, MIB, Category, Reason, ServiceClass, ServiceStatus
from accelmux.core.world import World

from .fake_executor import FakeExecutor
from .support import EXACT, arrive, done, manager, of, plain_profile, service, unloads, up
from .test_properties import SETTINGS, Op, apply_op, manager_specs, ops_strategy, run


@pytest.mark.slow
@SETTINGS
@given(spec=manager_specs(), ops=ops_strategy)
def test_no_request_is_preempted_more_than_the_bound(spec: ManagerSpec, ops: list[Op]) -> None:
    ex = run(spec, ops)
    preempted = Counter(a.request_id for a in ex.actions if isinstance(a, Preempt))
    assert max(preempted.values(), default=0) <= MAX_PREEMPTIONS, preempted


def test_a_request_at_the_bound_runs_to_its_end_under_pressure() -> None:
    # Foreign memory comes and goes: each time the batch request is preempted, until the
    # bound; then it keeps running while others yield.
    m = manager(
        service("emb", cls=ServiceClass.BATCH, profile=plain_profile(weights=GIB, workspace=GIB)),
        knobs=EXACT,
    )
    up(m, "emb")
    m.handle(arrive("e1", "emb"), 1.0)
    preempts = 0
    for i in range(2 * MAX_PREEMPTIONS + 2):
        t = 2.0 + i
        grab = 10 * GIB if i % 2 == 0 else 0
        held = m.world.ledger.decided("gpu")
        out = m.handle(
            MemorySampled(device="gpu", used_bytes=grab + held, per_service={"emb": held}), t
        )
        preempts += len(of(Preempt, out))
    assert preempts == MAX_PREEMPTIONS
    assert "e1" in m.world.inflight


profiles = st.builds(
    lambda w, ws, pu: MemoryProfile(weights=w * MIB, workspace=ws * MIB, per_unit=float(pu * MIB)),
    st.integers(0, 2048),
    st.integers(1, 512),
    st.integers(0, 256),
)


def _running(profile: MemoryProfile, n: int, units: list[float]) -> Manager:
    m = manager(
        service("img", cls=ServiceClass.INTERACTIVE, profile=profile, concurrency=n),
        knobs=replace(EXACT, safety_factor=1.2),
    )
    up(m, "img")
    for i in range(n):
        m.handle(
            RequestArrived(request_id=f"r{i}", service="img", demand=Demand(units=units[i])), 1
        )
    return m


@SETTINGS
@given(
    profile=profiles,
    n=st.integers(1, 3),
    units=st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),
)
def test_a_crash_raises_the_calibration_at_once(
    profile: MemoryProfile, n: int, units: list[float]
) -> None:
    m = _running(profile, n, units)
    svc = m.world.services["img"]
    running = list(svc.inflight.values())
    held = [(r.estimate, r.active_lease.nbytes if r.active_lease else 0) for r in running]
    m.handle(BackendCrashed(service="img", error="out of memory"), 2.0)
    assert svc.status is ServiceStatus.CRASHED
    for estimate, lease in held:
        assert svc.calibration.project_active(estimate) >= 2 * lease - 1


@SETTINGS
@given(
    profile=profiles,
    n=st.integers(1, 3),
    units=st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),
    ratio=st.floats(1.05, 4.0),
)
def test_a_measurement_above_the_leases_raises_the_calibration_at_once(
    profile: MemoryProfile, n: int, units: list[float], ratio: float
) -> None:
    m = _running(profile, n, units)
    world = m.world
    svc = world.services["img"]
    running = list(svc.inflight.values())
    leases = sum(r.active_lease.nbytes for r in running if r.active_lease)
    estimated = sum(r.estimate.active_bytes for r in running)
    measured_active = int(leases * ratio) + 32 * MIB  # clearly above the leases
    resident = svc.resident_bytes
    m.handle(
        MemorySampled(
            device="gpu",
            used_bytes=resident + measured_active,
            per_service={"img": resident + measured_active},
        ),
        2.0,
    )
    assert world.ledger.amount("gpu", "img", Category.RESERVED) == measured_active - leases
    # The next request of the same size is projected at least at the measured ratio...
    for r in running:
        expected = r.estimate.active_bytes * measured_active / estimated
        assert svc.calibration.project_active(r.estimate) >= int(expected)
    # ... and the service, charged with the excess, runs one request at a time.
    out = m.handle(arrive("more", "img"), 2.5)
    assert "more" not in [a.request_id for a in of(Dispatch, out)]


# ---- fair progress ---------------------------------------------------------------
NO_SAMPLE_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ("arrive", "arrive", "arrive", "finish", "finish", "load_done", "tick", "unloaded")
        ),
        st.integers(0, 10**6),
        st.floats(0.0, 1.0),
        st.floats(0.0, 5.0),
    ),
    min_size=20,
    max_size=80,
)


def _waits_in_idle_memory(world: World) -> list[str]:
    """Lower-class requests held for a higher class although their lease fits now."""
    out = []
    for req in world.waiting.values():
        svc = world.services[req.service]
        spec = svc.spec
        if (
            req.wait_reason is not Reason.HIGHER_CLASS_WAITING
            or svc.status is not ServiceStatus.LOADED
            or len(svc.inflight) >= spec.concurrency
            or not spec.in_window(world.time_of_day())
            or svc.over_limit
        ):
            continue
        interactive_runs = any(r.cls is ServiceClass.INTERACTIVE for r in world.inflight.values())
        if req.cls is ServiceClass.BATCH and interactive_runs:
            continue  # batch yields compute to running interactive work
        if req.cls is ServiceClass.BACKGROUND and svc.inflight and interactive_runs:
            continue  # background runs one request at a time beside interactive work
        kv = req.estimate.kv_bytes
        if svc.kv_in_use + kv > max(spec.profile.kv_ceiling, svc.kv_pool):
            continue
        grow = max(0, kv - (svc.kv_pool - svc.kv_in_use))
        need = world.projected_active(req) + grow
        if need <= world.ledger.available(spec.device):
            out.append(req.request_id)
    return out


@pytest.mark.slow
@SETTINGS
@given(spec=manager_specs(), ops=NO_SAMPLE_OPS)
def test_lower_classes_are_never_held_while_their_lease_fits_in_idle_memory(
    spec: ManagerSpec, ops: list[Op]
) -> None:
    # Without realtime services (whose compute is protected on purpose).
    services = tuple(
        replace(s, cls=ServiceClass.INTERACTIVE) if s.cls is ServiceClass.REALTIME else s
        for s in spec.services
    )
    spec = replace(spec, services=services)
    ex = FakeExecutor(Manager(spec, make_policy("accelmux")))
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)
        ex.send(Tick())
        assert _waits_in_idle_memory(ex.manager.world) == []


@SETTINGS
@given(
    hog_gib=st.floats(2.0, 8.0),
    big_gib=st.floats(4.0, 10.0),
    low_mib=st.integers(1, 2048),
)
def test_work_a_waiting_class_could_preempt_runs_in_idle_memory(
    hog_gib: float, big_gib: float, low_mib: int
) -> None:
    # "hog" runs a large interactive request; "big" (interactive) waits for memory it
    # holds; "low" (background: batch would yield compute to the running interactive
    # request) is loaded and idle, and its small request arrives meanwhile.
    low_cls = ServiceClass.BACKGROUND
    m = manager(
        service("hog", profile=plain_profile(weights=GIB // 2, workspace=int(hog_gib * GIB))),
        service("big", profile=plain_profile(weights=GIB // 2, workspace=int(big_gib * GIB))),
        service(
            "low", cls=low_cls, profile=plain_profile(weights=GIB // 4, workspace=low_mib * MIB)
        ),
        knobs=EXACT,
    )
    up(m, "hog", "big", "low")
    m.handle(arrive("h", "hog"), 1.0)
    m.handle(arrive("b", "big"), 2.0)
    waits_for_memory = "b" in m.world.waiting
    # (unless its memory is what "big" waits for: then "low" is on its way out)
    up_and_fits = m.world.services[
        "low"
    ].status is ServiceStatus.LOADED and low_mib * MIB <= m.world.ledger.available("gpu")
    out = m.handle(arrive("l", "low"), 3.0)
    if waits_for_memory and up_and_fits:
        assert "l" in [a.request_id for a in of(Dispatch, out)]
    assert _waits_in_idle_memory(m.world) == []


def _caching_embedder_running(*disabled: str) -> Manager:
    """A batch embedder measured caching 4 GiB, running e1 in that cache (and measured
    so), beside an idle interactive service whose requests need 6 GiB: 5.5 GiB is free."""
    m = manager(
        service(
            "emb", cls=ServiceClass.BATCH, profile=plain_profile(weights=GIB, workspace=4 * GIB)
        ),
        service("ia", profile=plain_profile(weights=GIB, workspace=6 * GIB)),
        knobs=replace(EXACT, disabled=frozenset(disabled)),
    )
    up(m, "emb", "ia")
    emb, ia = m.world.services["emb"].resident_bytes, m.world.services["ia"].resident_bytes
    # Idle, the embedder is measured holding 4 GiB beyond its resident size: its cache.
    held = {"emb": emb + 4 * GIB, "ia": ia}
    m.handle(MemorySampled(device="gpu", used_bytes=sum(held.values()), per_service=held), 1.0)
    m.handle(arrive("e1", "emb"), 2.0)  # runs in its cache: the device holds no more
    assert "e1" in m.world.inflight
    m.handle(MemorySampled(device="gpu", used_bytes=sum(held.values()), per_service=held), 2.5)
    assert m.world.ledger.available("gpu") == 5 * GIB + GIB // 2
    return m


def _caching_embedder(*disabled: str) -> tuple[Manager, list[Action]]:
    m = _caching_embedder_running(*disabled)
    return m, m.handle(arrive("i1", "ia"), 3.0)


def test_a_caching_service_runs_in_its_cache_without_counting_it_twice() -> None:
    m = manager(
        service(
            "emb", cls=ServiceClass.BATCH, profile=plain_profile(weights=GIB, workspace=4 * GIB)
        ),
        knobs=EXACT,
    )
    up(m, "emb")
    held = {"emb": m.world.services["emb"].resident_bytes + 4 * GIB}
    m.handle(MemorySampled(device="gpu", used_bytes=sum(held.values()), per_service=held), 1.0)
    free = m.world.ledger.available("gpu")
    m.handle(arrive("e1", "emb"), 2.0)
    assert "e1" in m.world.inflight
    assert m.world.ledger.available("gpu") == free  # the lease took the cache's place
    m.handle(done("e1"), 3.0)
    assert m.world.ledger.available("gpu") == free  # and gave it back to the cache


def test_preempting_a_caching_service_evicts_it_instead_of_counting_its_lease_free() -> None:
    m, out = _caching_embedder()
    assert [a.request_id for a in of(Preempt, out)] == ["e1"]
    assert [(u.service, u.reason) for u in unloads(out)] == [("emb", Reason.EVICTED_FOR_MEMORY)]
    assert "i1" in m.world.waiting  # until the unload gives the memory back
    # Without it, the released lease is taken as free memory the device does not have.
    m, out = _caching_embedder("cache_accounting")
    assert unloads(out) == []
    assert "i1" in m.world.inflight


def test_what_a_caching_service_finished_with_stays_charged_to_it_until_it_unloads() -> None:
    m = _caching_embedder_running()
    lease = m.world.inflight["e1"].active_lease
    assert lease is not None
    m.handle(done("e1"), 2.6)
    # The allocator keeps what e1 held: the device does not have it back.
    assert m.world.ledger.amount("gpu", "emb", Category.RESERVED) == lease.nbytes
    out = m.handle(arrive("i2", "ia"), 2.7)
    assert "i2" not in [a.request_id for a in of(Dispatch, out)]
    assert [(u.service, u.reason) for u in unloads(out)] == [("emb", Reason.EVICTED_FOR_MEMORY)]
    out = m.handle(Unloaded(service="emb"), 3.5)
    assert "i2" in [a.request_id for a in of(Dispatch, out)]


def test_a_load_larger_than_granted_is_not_taken_for_activation_memory() -> None:
    # The load measures twice its grant; a memory sample with a request running shows
    # that excess as reserved. It is resident memory: the requests' calibration stays.
    m = manager(
        service("img", profile=MemoryProfile(weights=2 * GIB, workspace=64 * MIB)),
        knobs=PolicyKnobs(prewarm=False, safety_factor=1.0),
    )
    m.handle(RequestArrived(request_id="i1", service="img"), 0.0)
    m.handle(LoadFinished(service="img", weights_bytes=4 * GIB, runtime_bytes=0), 1.0)
    svc = m.world.services["img"]
    assert svc.inflight and svc.load_excess == 2 * GIB
    before = svc.calibration.active.factor
    lease = sum(r.active_lease.nbytes for r in svc.inflight.values() if r.active_lease)
    used = 4 * GIB + lease
    m.handle(MemorySampled(device="gpu", used_bytes=used, per_service={"img": used}), 2.0)
    assert svc.calibration.active.factor == before
    # Activation memory above the lease still counts.
    used += 256 * MIB
    m.handle(MemorySampled(device="gpu", used_bytes=used, per_service={"img": used}), 3.0)
    assert svc.calibration.active.factor > before
