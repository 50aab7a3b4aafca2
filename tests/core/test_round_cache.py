"""The round's cache keeps and skips only what a recomputation would find again.

The accelmux policy reads indexes and a cache (:class:`RoundCache`) where it once scanned
every service or request: the services that can learn (crashed, charged, sampled), the
waiting-cause counts, the restorable services of a device, a request's load sizes, a
service's wait reason in a class turn, memory on its way back, the window edges of the
queued services, TTLs that ask about a pending restore only when the answer matters, the
realtime reserve kept while its device and the realtime peaks stay as they were, a room
survey's failure shared by the requesters it answers for, the devices with realtime work
once per round, and what the spec says found once (warm services, who yields to realtime
work, where time sharing can pause a stream). The policy with the cache off
(``AccelmuxPolicy(cache=False)``: ``RoundCache(enabled=False)``, which keeps nothing and
lets the round skip nothing) makes the same decisions and asks for the same wake-ups for
any event sequence; the scans below are the from-scratch computations the indexes stand
for.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.actions import Resize, Unload
from accelmux.core.events import Demand, RequestArrived, Tick
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import (
    HEURISTICS,
    RESTORE_GRACE_S,
    AccelmuxPolicy,
    Parts,
    build_parts,
)
from accelmux.core.policies.accelmux.cache import RoundCache
from accelmux.core.policies.accelmux.facts import kept_floor, likely_reused, tier, unload_frees
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.policies.accelmux.room import UNSERVED_S
from accelmux.core.profiles import RATIO_MARGIN, RatioCalibrator
from accelmux.core.specs import (
    Capabilities,
    ManagerSpec,
    PolicyKnobs,
    Window,
    seconds_until_next,
    seconds_until_next_sorted,
)
from accelmux.core.types import (
    GIB,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceKind,
    ServiceStatus,
)
from accelmux.core.world import ServiceSet, ServiceState, World, WorldOps, WorldView, reuse_rate

from .fake_executor import FakeExecutor
from .support import (
    EXACT_TTL,
    arrive,
    device,
    done,
    llm_profile,
    loaded,
    manager,
    of,
    resized,
    service,
    up,
)
from .test_indexes import two_device_specs
from .test_properties import SETTINGS, Op, apply_op, manager_specs, ops_strategy, profiles

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_manager
import decision_stream


def scan_memory_wanted(world: World, parts: Parts, svc: ServiceState) -> bool:
    """Whether memory on ``svc``'s device is wanted, from a scan of every waiting request."""
    dev = svc.spec.device
    if any(
        r.wait_reason is Reason.NO_MEMORY and world.services[r.service].spec.device == dev
        for r in world.waiting.values()
    ):
        return True
    return world.ledger.available(dev) < parts.reserve.realtime_reserve(dev)


def scan_restore_pending(world: World, parts: Parts, holder: ServiceState) -> bool:
    """Whether a restore is pending on ``holder``'s device, from a scan of every service."""
    horizon = world.knobs.reuse_horizon_s
    own = reuse_rate(holder, world.now, horizon)
    dev = holder.spec.device
    room = world.ledger.available(dev) + unload_frees(world, holder)
    return any(
        s.status is ServiceStatus.UNLOADED
        and s.spec.residency is Residency.WARM
        and s.last_evicted_at is not None
        and likely_reused(world, s)
        and s.spec.cls <= holder.spec.cls
        and reuse_rate(s, world.now, horizon) > own
        and parts.residents.restore_need(s, parts.loading.load_pool(s, s.spec.profile.kv_floor))
        <= room
        for s in world.services.values()
        if s.spec.device == dev
    )


def scan_pending_free(world: World, device: str) -> int:
    """Memory on its way back to ``device``, from a scan of its services."""
    return sum(
        unload_frees(world, s) if s.status is ServiceStatus.UNLOADING else s.kv_shrinking
        for s in world.services_by_device[device]
        if s.status is ServiceStatus.UNLOADING or s.resizing
    )


def scan_max_possible(world: World, device: str, exclude: ServiceState) -> int:
    """The most ``exclude`` could have on ``device``, from a scan of every service: for
    realtime work the pinned services whose reload keeps their objective may go
    (``realtime_unpin``)."""
    unpin = exclude.spec.cls is ServiceClass.REALTIME and world.knobs.switches.realtime_unpin

    def stays(s: ServiceState) -> bool:
        if not unpin or s.admin_wants_loaded:
            return True
        objective = s.spec.objective_s
        served = max(
            (
                r.last_used
                for r in world.services.values()
                if r.spec.device == s.spec.device and r.spec.cls is ServiceClass.REALTIME
            ),
            default=world.now,
        )
        return (
            objective is not None
            and world.load_seconds(s, tier(world, s)) > objective
            and world.now - served < UNSERVED_S
        )

    held = sum(
        kept_floor(world, s)
        for s in world.services.values()
        if s.spec.device == device and s is not exclude and stays(s)
    )
    return world.devices[device].usable_bytes - held


def plain_parts(world: World, ops: WorldOps) -> Parts:
    """The policy's parts over ``world`` with the round cache off: nothing kept or skipped."""
    return build_parts(Seam(world, ops, RoundCache(world, enabled=False)))


KEEP_ALIVES = (None, 0.0, 7.0, math.inf)


def apply(ex: FakeExecutor, spec: ManagerSpec, op: Op, counter: list[int]) -> None:
    """``apply_op``, where an arrival may also carry a client's keep_alive."""
    kind, a, b, dt = op
    keep_alive = KEEP_ALIVES[(a // 7) % len(KEEP_ALIVES)]
    if kind != "arrive" or keep_alive is None:
        apply_op(ex, spec, op, counter)
        return
    svc = spec.services[a % len(spec.services)]
    counter[0] += 1
    demand = Demand(units=round(b * 4, 3)) if not svc.profile.kv_bytes_per_token else Demand()
    event = RequestArrived(
        request_id=f"r{counter[0]}", service=svc.name, demand=demand, keep_alive_s=keep_alive
    )
    ex.send(event, dt)


def drive(
    spec: ManagerSpec, policy: AccelmuxPolicy, ops: list[Op]
) -> tuple[FakeExecutor, list[float | None]]:
    """Apply ``ops``; after each, ask for the wake-up and sometimes tick at it."""
    policy.few_waiting = 0  # no short-queue path: what skips is skipped however short
    ex = FakeExecutor(Manager(spec, policy))
    counter = [0]
    wakes: list[float | None] = []
    for op in ops:
        apply(ex, spec, op, counter)
        wake = ex.manager.next_wakeup(ex.now)
        wakes.append(wake)
        if wake is not None and op[2] < 0.3:
            ex.send(Tick(), wake - ex.now)  # the policy's own wake-up, not the deadlines
            wakes.append(ex.manager.next_wakeup(ex.now))
    return ex, wakes


@st.composite
def crowded_specs(draw: st.DrawFn) -> ManagerSpec:
    """More services than fit, on one or two devices: long queues of services down."""
    devices = tuple(
        device(name, budget=draw(st.integers(6, 12)) * GIB, headroom=GIB // 4)
        for name in ("gpu", "gpu2")[: draw(st.integers(1, 2))]  # memory samples are of "gpu"
    )
    services = []
    for i in range(draw(st.integers(3, 7))):
        llm = draw(st.booleans())
        services.append(
            replace(
                service(
                    f"s{i}",
                    cls=draw(st.sampled_from(list(ServiceClass))),
                    residency=draw(st.sampled_from(list(Residency))),
                    profile=draw(profiles(llm)),
                    kind=ServiceKind.CHAT if llm else ServiceKind.IMAGE,
                    device_name=devices[i % len(devices)].name,
                    concurrency=draw(st.integers(1, 2)),
                    queue_limit=16,
                    deadline_s=float(draw(st.integers(20, 120))),
                    windows=draw(st.sampled_from([(), (Window(start_s=0.0, end_s=3600.0),)])),
                ),
                capabilities=Capabilities(resize=draw(st.sampled_from(list(ResizeSupport)))),
            )
        )
    knobs = PolicyKnobs(prewarm=draw(st.booleans()), safety_factor=1.2)
    return ManagerSpec(devices=devices, services=tuple(services), knobs=knobs)


#: Mostly arrivals: queues grow, and the requests of services that do not fit wait.
crowded_ops = st.lists(
    st.tuples(
        st.sampled_from(("arrive",) * 6 + ("finish", "finish", "load_done", "tick", "unloaded")),
        st.integers(0, 10**6),
        st.floats(0.0, 1.0),
        st.floats(0.0, 2.0),
    ),
    min_size=30,
    max_size=120,
)


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.one_of(manager_specs(), two_device_specs(), crowded_specs()),
    ops=st.one_of(ops_strategy, crowded_ops),
    disabled=st.frozensets(st.sampled_from(sorted(HEURISTICS))),
    grace=st.sampled_from([0.0, 2.0]),
    ageing=st.sampled_from([None, 0.05, 0.25]),
)
def test_the_round_decides_alike_with_its_cache_off(
    spec: ManagerSpec,
    ops: list[Op],
    disabled: frozenset[str],
    grace: float,
    ageing: float | None,
) -> None:
    knobs = replace(
        spec.knobs, disabled=disabled, realtime_grace_s=grace, batch_age_fraction=ageing
    )
    spec = replace(spec, knobs=knobs)
    fast, fast_wakes = drive(spec, AccelmuxPolicy(), ops)
    plain, plain_wakes = drive(spec, AccelmuxPolicy(cache=False), ops)
    assert fast.actions == plain.actions
    assert fast_wakes == plain_wakes
    assert [d.as_dict() for d in fast.manager.log] == [d.as_dict() for d in plain.manager.log]


def assert_helpers_agree(policy: AccelmuxPolicy, world: World, ops: WorldOps) -> None:
    """Each kept or skipped computation of ``policy`` equals its recomputation with the
    cache off and its scan, on the World as it is now."""
    fast = policy.parts(world)
    plain = plain_parts(world, ops)
    plain.time_sharing.yielded_to = fast.time_sharing.yielded_to
    plain.time_sharing.yielded_realtime = fast.time_sharing.yielded_realtime
    now = world.now
    assert fast.wakeup.next_wakeup(now) == plain.wakeup.next_wakeup(now)
    learners = {s.name for s in fast.learning.learners()}
    for svc in world.services.values():
        learns = (
            svc.crashes != world.learned.seen_crashes.get(svc.name, 0)
            or svc.name in world.learned.charged
            or world.sampled_at.get(svc.spec.device) == now
        )
        assert svc.name in learners or not learns
        wanted = fast.residents.memory_wanted(svc)
        assert wanted == plain.residents.memory_wanted(svc) == scan_memory_wanted(world, fast, svc)
        if svc.status is ServiceStatus.LOADED:
            pending = fast.residents.restore_pending(svc)
            assert pending == scan_restore_pending(world, fast, svc)
            assert pending == plain.residents.restore_pending(svc)
            assert fast.residents.ttl(svc) == plain.residents.ttl(svc)
            assert fast.residents.idle_past_ttl(svc) == plain.residents.idle_past_ttl(svc)
        dev = svc.spec.device
        assert fast.room.max_possible(dev, svc) == scan_max_possible(world, dev, svc)
        assert fast.room.max_possible(dev, svc) == plain.room.max_possible(dev, svc)
    for dev in world.devices:
        assert fast.room.pending_free(dev) == scan_pending_free(world, dev)
        assert fast.room.pending_free(dev) == plain.room.pending_free(dev)


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.one_of(manager_specs(), two_device_specs()),
    ops=ops_strategy,
    disabled=st.frozensets(
        st.sampled_from(
            ["on_demand_keep", "restore", "realtime_reserve", "idle_keep", "reserve_lending"]
        )
    ),
)
def test_each_kept_or_skipped_computation_equals_a_recomputation(
    spec: ManagerSpec, ops: list[Op], disabled: frozenset[str]
) -> None:
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled))
    policy = AccelmuxPolicy()
    ex = FakeExecutor(Manager(spec, policy))
    world, ops_ = ex.manager.world, ex.manager.ops
    counter = [0]
    for op in ops:
        apply(ex, spec, op, counter)
        assert_helpers_agree(policy, world, ops_)
        wake = ex.manager.next_wakeup(ex.now)
        if wake is not None and op[2] < 0.5:
            ex.send(Tick(), wake - ex.now)  # time passes: TTLs run out, reuse decays
            assert_helpers_agree(policy, world, ops_)


@pytest.mark.slow
@SETTINGS
@given(
    spec=st.one_of(manager_specs(), two_device_specs()),
    ops=ops_strategy,
)
def test_kept_load_sizes_and_window_edges_equal_a_recomputation(
    spec: ManagerSpec, ops: list[Op]
) -> None:
    policy = AccelmuxPolicy()
    ex = FakeExecutor(Manager(spec, policy))
    world = ex.manager.world
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)
        ex.manager.next_wakeup(ex.now)
        parts = policy.parts(world)
        plain = plain_parts(world, ex.manager.ops)
        for rid, (stamp, (req, sizes)) in parts.seam.cache.load_sizes.entries.items():
            svc = world.services[req.service]
            cal = svc.calibration
            if (
                world.waiting.get(rid) is req
                and stamp == (cal.active.version, cal.resident.version)
                and svc.resize_support is not ResizeSupport.NEXT_LOAD
            ):  # what a request waiting now would be given
                assert sizes == plain.loading.load_sizes(req, svc)
        edges = {e for s in world.queued for w in s.spec.windows for e in w.edges}
        assert parts.wakeup.window_edges() == tuple(sorted(edges))


@pytest.mark.slow
@given(
    ratios=st.lists(
        st.tuples(st.integers(0, 10**9), st.integers(-5, 10**9)), min_size=0, max_size=40
    ),
    window=st.integers(1, 8),
)
def test_a_calibrators_kept_worst_ratio_equals_a_recomputation(
    ratios: list[tuple[int, int]], window: int
) -> None:
    cal = RatioCalibrator(window=window, safety_factor=1.2)
    versions = [cal.version]
    for estimated, observed in ratios:
        if observed % 3 == 0:
            cal.observe_ratio(observed / max(1, estimated))
        else:
            cal.observe(estimated, observed)
        kept = list(cal._ratios)
        worst = max(kept, default=None)
        assert cal.worst == max(1.0, worst if worst is not None else 1.0)
        if worst is None:
            assert cal.factor == cal.safety_factor
        elif len(kept) >= 8:
            assert cal.factor == max(1.0, worst * RATIO_MARGIN)
        else:
            assert cal.factor == max(cal.safety_factor, worst * RATIO_MARGIN)
        versions.append(cal.version)
    # the version moves whenever a ratio was kept, so equal versions mean equal ratios
    assert versions == sorted(versions)


@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=40))
def test_a_service_sets_version_moves_whenever_its_members_change(
    steps: list[tuple[bool, int]],
) -> None:
    spec = ManagerSpec(devices=(device(),), services=tuple(service(f"s{i}") for i in range(5)))
    world = World(spec)
    members = ServiceSet()
    for add, i in steps:
        svc = world.services[f"s{i}"]
        before, version = members.names(), members.version
        members.update(svc, add)
        assert (members.names() != before) == (members.version != version)
        assert [s.name for s in members] == sorted(members.names(), key=lambda n: int(n[1:]))


@given(
    edges=st.lists(st.integers(0, 86_399).map(float), max_size=6),
    tod=st.floats(0.0, 10 * 86_400.0),
)
def test_the_next_edge_over_windows_is_the_earliest_of_each_windows_next(
    edges: list[float], tod: float
) -> None:
    windows = [Window(start_s=e, end_s=(e + 3600.0) % 86_400 or 86_400) for e in edges]
    union = {x for w in windows for x in w.edges}
    expected = min((w.seconds_until_edge(tod) for w in windows), default=86_400.0)
    assert seconds_until_next(sorted(union), tod) == expected


def test_memory_on_its_way_back_counts_a_pool_shrinking_and_a_service_unloading() -> None:
    m = manager(
        service("chat", kind=ServiceKind.CHAT, profile=llm_profile(), residency=Residency.WARM),
        service("img", ttl_s=5.0, residency=Residency.WARM),
        knobs=EXACT_TTL,
    )
    policy = m.policy
    assert isinstance(policy, AccelmuxPolicy)
    up(m, "chat", "img")
    grow = m.handle(arrive("r1", "chat", kv_tokens=12_000), 1.0)  # the pool grows for it
    m.handle(resized("chat", of(Resize, grow)[0].kv_pool_bytes), 1.0)
    m.handle(done("r1"), 2.0)
    assert of(Unload, m.handle(Tick(), 10.0))  # img idle past its TTL
    assert of(Resize, m.handle(Tick(), 40.0))  # chat idle past balloon_idle_s: it shrinks
    world = m.world
    assert world.unloading_on("gpu").names() == {"img"}
    assert [s.name for s in world.loaded_on("gpu") if s.resizing] == ["chat"]
    pending = policy.parts(world).room.pending_free("gpu")
    assert pending == scan_pending_free(world, "gpu")
    assert pending > world.services["chat"].kv_shrinking > 0


def test_a_client_keeping_a_service_loaded_forever_asks_for_no_wake_up() -> None:
    m = manager(
        service("img", residency=Residency.ON_DEMAND, ttl_s=60.0),
        knobs=PolicyKnobs(prewarm=True),
    )
    m.start(0.0)
    m.handle(RequestArrived(request_id="r1", service="img", keep_alive_s=math.inf), 0.0)
    m.handle(loaded("img"), 1.0)
    m.handle(done("r1"), 2.0)
    policy = m.policy
    assert isinstance(policy, AccelmuxPolicy)
    svc = m.world.services["img"]
    parts = policy.parts(m.world)
    assert svc.is_up and svc.idle and parts.residents.ttl_range(svc) == (RESTORE_GRACE_S, math.inf)
    assert policy.next_wakeup(m.world, 2.0) is None
    assert plain_parts(m.world, m.ops).wakeup.next_wakeup(2.0) is None


def benchmark_stream(
    cache: bool,
    services: int,
    devices: int,
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> list[str]:
    """The decision stream of the Manager benchmark's workload with ``policy_class``."""
    lines: list[str] = []

    def recording(spec: ManagerSpec, policy: object) -> Manager:
        manager = Manager(spec, AccelmuxPolicy(cache=cache))
        decision_stream._record(manager, lines)
        return manager

    monkeypatch.setattr(bench_manager, "Manager", recording)
    work = bench_manager.build_workload(services, devices, seed=seed)
    bench_manager.run_once(work, 1500, seed=seed)
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(("services", "devices", "seed"), [(10, 1, 1), (12, 1, 2), (30, 2, 3)])
def test_crowded_benchmark_homes_decide_alike(
    services: int, devices: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench/bench_manager.py's workload: long queues of services that do not fit, whose
    # requests wait for memory behind each other (what the short property runs rarely
    # reach).
    fast = benchmark_stream(True, services, devices, seed, monkeypatch)
    plain = benchmark_stream(False, services, devices, seed, monkeypatch)
    assert len(fast) > 1500
    assert fast == plain


class HeldAtRoundEnd(AccelmuxPolicy):
    """The policy, keeping what each service's running requests held at the end of every
    round (the policy once kept that itself, to learn from a crash in the next round)."""

    def __init__(self) -> None:
        super().__init__()
        self.held_at_end: dict[str, list[tuple[int, int]]] = {}
        self.crashes_seen = 0

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        for svc in world.services.values():
            if svc.crashes != world.learned.seen_crashes.get(svc.name, 0):  # type: ignore[attr-defined]
                assert svc.crash_held == self.held_at_end.get(svc.name, [])
                self.crashes_seen += 1
        super().decide(world, ops, now)
        self.held_at_end = {
            s.name: [
                (r.estimate.active_bytes, r.active_lease.nbytes if r.active_lease else 0)
                for r in s.inflight.values()
            ]
            for s in world.busy
        }


@pytest.mark.slow
@SETTINGS
@given(spec=st.one_of(manager_specs(), two_device_specs()), ops=ops_strategy)
def test_what_crashed_requests_held_is_what_they_held_at_the_last_round(
    spec: ManagerSpec, ops: list[Op]
) -> None:
    # World.note_crash keeps it when the crash is applied: the requests in flight then
    # are those at the end of the round before (nothing runs between two rounds).
    policy = HeldAtRoundEnd()
    ex = FakeExecutor(Manager(spec, policy))
    counter = [0]
    for op in ops:
        apply_op(ex, spec, op, counter)


@given(
    edges=st.lists(st.floats(0.0, 86_400.0, exclude_max=True), max_size=12),
    tod=st.one_of(st.floats(0.0, 86_400.0), st.sampled_from([0.0, 3600.0, 86_399.5])),
)
def test_the_next_window_edge_found_by_bisection_is_the_one_a_scan_finds(
    edges: list[float], tod: float
) -> None:
    ordered = sorted(set(edges + [tod % 86_400.0] * (len(edges) % 2)))
    assert seconds_until_next_sorted(ordered, tod) == seconds_until_next(ordered, tod)


@SETTINGS
@given(spec=st.one_of(manager_specs(), two_device_specs(), crowded_specs()), ops=crowded_ops)
def test_a_new_round_starts_with_every_per_round_memo_empty(
    spec: ManagerSpec, ops: list[Op]
) -> None:
    """A round clears only the per-round memos it filled (:meth:`RoundCache.new_round`):
    at the start of every round each of them is as empty as a clear of them all leaves it."""
    policy = AccelmuxPolicy()
    ex = FakeExecutor(Manager(spec, policy))
    cache = policy.parts(ex.manager.world, ex.manager.ops).seam.cache
    starts: list[int] = []
    new_round = cache.new_round

    def checked() -> None:
        new_round()
        starts.append(sum(len(memo) for memo in cache._per_round))

    cache.new_round = checked  # type: ignore[method-assign]
    counter = [0]
    for op in ops:
        apply(ex, spec, op, counter)
    assert starts and not any(starts)
