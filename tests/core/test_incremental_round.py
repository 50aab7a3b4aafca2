"""The incremental round decides as a round that recomputes everything.

What the round keeps between rounds and skips (requests whose last consideration would
only repeat, whole turns of a device where nothing they read changed, timers instead of
walks) is checked here against the same policy with its cache off
(``AccelmuxPolicy(cache=False)``: nothing kept, nothing skipped) on the Manager
benchmark's workloads: Zipf-popular services of every class on one to three devices,
more than fit, with windows, pinned voice services, long queues of services that are
down, preemptions and evictions, with heuristics switched off at random and a realtime
grace or none. Both must return the same actions and ask for the same wake-ups.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.events import Demand, RequestArrived, Tick
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import HEURISTICS, AccelmuxPolicy
from accelmux.core.specs import ManagerSpec, PolicyKnobs, Window
from accelmux.core.types import GIB, Reason, Residency, ServiceClass

from .fake_executor import FakeExecutor
from .support import arrive, device, enqueued, loaded, loads, plain_profile, service, up
from .test_indexes import two_device_specs
from .test_properties import SETTINGS, Op, manager_specs, ops_strategy
from .test_round_cache import apply, crowded_ops, crowded_specs, drive, plain_parts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_manager
import decision_stream


def stream(work: bench_manager.Workload, cache: bool, events: int, seed: int) -> list[str]:
    """The decision stream of ``events`` events of ``work`` with the cache on or off."""
    lines: list[str] = []
    real = bench_manager.Manager

    def recording(spec: ManagerSpec, policy: object) -> Manager:
        manager = real(spec, AccelmuxPolicy(cache=cache))
        decision_stream._record(manager, lines)
        return manager

    bench_manager.Manager = recording  # type: ignore[assignment,misc]
    try:
        bench_manager.run_once(work, events, seed=seed)
    finally:
        bench_manager.Manager = real  # type: ignore[misc]
    return lines


#: The runs at length take minutes (a few on a quiet machine, more on a busy one): past
#: the suite's timeout of 300 s a timeout stops an example midway, which hypothesis
#: then reports as a flaky failure of the example, not as a decision that differs.
LENGTHY_S = 1200

workloads = st.builds(
    lambda services, devices, seed: (services, min(devices, services), seed),
    st.integers(4, 48),
    st.integers(1, 3),
    st.integers(0, 10**6),
)
knobs = {
    "disabled": st.frozensets(st.sampled_from(sorted(HEURISTICS)), max_size=4),
    "grace": st.sampled_from([0.0, 0.0, 2.0]),
    "util": st.sampled_from([0.6, 1.5, 4.0]),
    # the clock starts this many seconds before a window of the workload opens or closes
    # (None: at midnight), so that windows open and close while requests wait
    "before_edge": st.one_of(st.none(), st.floats(0.0, 240.0)),
}


def assert_decides_alike(
    workload: tuple[int, int, int],
    disabled: frozenset[str],
    grace: float,
    util: float,
    before_edge: float | None,
) -> None:
    services, devices, seed = workload
    work = bench_manager.build_workload(services, devices, seed=seed, peak_util=util)
    spec = work.spec
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled, realtime_grace_s=grace))
    edges = sorted({e for s in spec.services for w in s.windows for e in w.edges})
    if edges and before_edge is not None:
        edge = edges[seed % len(edges)]
        spec = replace(spec, clock_origin_s_of_day=(edge - before_edge) % 86_400.0)
    work = replace(work, spec=spec)
    fast = stream(work, True, 500, seed)
    plain = stream(work, False, 500, seed)
    assert fast == plain


@settings(SETTINGS, max_examples=12)
@given(workload=workloads, **knobs)
def test_benchmark_workloads_decide_alike_with_the_cache_off(
    workload: tuple[int, int, int],
    disabled: frozenset[str],
    grace: float,
    util: float,
    before_edge: float | None,
) -> None:
    assert_decides_alike(workload, disabled, grace, util, before_edge)


@pytest.mark.slow
@pytest.mark.timeout(LENGTHY_S)
@settings(SETTINGS, max_examples=150)
@given(workload=workloads, **knobs)
def test_benchmark_workloads_decide_alike_with_the_cache_off_at_length(
    workload: tuple[int, int, int],
    disabled: frozenset[str],
    grace: float,
    util: float,
    before_edge: float | None,
) -> None:
    assert_decides_alike(workload, disabled, grace, util, before_edge)


@st.composite
def specs_near_an_edge(draw: st.DrawFn) -> ManagerSpec:
    """Crowded specs (some services with a window from midnight to 1 am) whose clock starts
    shortly before the window opens or closes, on one or two devices."""
    spec = draw(st.one_of(crowded_specs(), two_device_specs()))
    edge = draw(st.sampled_from([0.0, 3600.0]))
    origin = (edge - draw(st.floats(0.0, 60.0))) % 86_400.0
    windowed = tuple(
        replace(s, windows=(Window(start_s=0.0, end_s=3600.0),)) if i % 2 else s
        for i, s in enumerate(spec.services)
    )
    return replace(spec, services=windowed, clock_origin_s_of_day=origin)


def assert_alike_on_ops(spec: ManagerSpec, ops: list[Op], disabled: frozenset[str]) -> None:
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled))
    fast, fast_wakes = drive(spec, AccelmuxPolicy(), ops)
    plain, plain_wakes = drive(spec, AccelmuxPolicy(cache=False), ops)
    assert fast.actions == plain.actions
    assert fast_wakes == plain_wakes


@settings(SETTINGS, max_examples=40)
@given(
    spec=specs_near_an_edge(),
    ops=st.one_of(ops_strategy, crowded_ops),
    disabled=st.frozensets(st.sampled_from(sorted(HEURISTICS)), max_size=3),
)
def test_windows_opening_and_closing_decide_alike_with_the_cache_off(
    spec: ManagerSpec, ops: list[Op], disabled: frozenset[str]
) -> None:
    assert_alike_on_ops(spec, ops, disabled)


@pytest.mark.slow
@pytest.mark.timeout(LENGTHY_S)
@settings(SETTINGS, max_examples=300)
@given(
    spec=specs_near_an_edge(),
    ops=st.one_of(ops_strategy, crowded_ops),
    disabled=st.frozensets(st.sampled_from(sorted(HEURISTICS)), max_size=3),
)
def test_windows_opening_and_closing_decide_alike_with_the_cache_off_at_length(
    spec: ManagerSpec, ops: list[Op], disabled: frozenset[str]
) -> None:
    assert_alike_on_ops(spec, ops, disabled)


def test_a_turn_left_out_as_a_whole_is_decided_again_once_a_window_opens() -> None:
    # A batch job waits outside its window (memory is short of the spare fraction) behind
    # an interactive request that waits for memory: its turn is left out as a whole while
    # further interactive requests arrive (nothing of the batch turn changes), until the
    # window opens: then the job loads into the idle memory (fair progress). Batch work
    # does not wait for the running interactive request here (batch_yield off).
    knobs = PolicyKnobs(prewarm=False, safety_factor=1.0, disabled=frozenset({"batch_yield"}))
    spec = ManagerSpec(
        devices=(device(budget=12 * GIB, headroom=GIB // 2),),
        services=(
            service("chat", profile=plain_profile(weights=6 * GIB)),
            service("big", residency=Residency.ON_DEMAND, profile=plain_profile(weights=7 * GIB)),
            service(
                "job",
                cls=ServiceClass.BATCH,
                residency=Residency.ON_DEMAND,
                profile=plain_profile(weights=3 * GIB),
                deadline_s=600.0,
                windows=(Window(start_s=0.0, end_s=3600.0),),
            ),
        ),
        knobs=knobs,
        clock_origin_s_of_day=86_400.0 - 60.0,  # the job's window opens 60 s in
    )
    policy = AccelmuxPolicy()
    policy.few_waiting = 0  # turn by turn, skipping what can be skipped
    m = Manager(spec, policy)
    m.handle(arrive("c1", "chat"), 0.0)
    m.handle(loaded("chat"), 0.5)  # c1 runs for the whole test
    assert enqueued(m.handle(arrive("j1", "job"), 1.0))["j1"].reason is Reason.OUTSIDE_WINDOW
    assert enqueued(m.handle(arrive("b1", "big"), 2.0))["b1"].reason is (Reason.NO_MEMORY)
    for i, t in enumerate((10.0, 20.0, 30.0, 59.0)):
        out = m.handle(arrive(f"b{i + 2}", "big"), t)
        assert not loads(out) and "j1" not in enqueued(out)
    assert m.next_wakeup(59.0) == pytest.approx(60.0)
    assert [a.service for a in loads(m.handle(Tick(), 60.0))] == ["job"]


def assert_timers_agree(policy: AccelmuxPolicy, manager: Manager) -> None:
    """What the kept TTLs and indexes say equals a walk of every service, now."""
    world = manager.world
    fast = policy.parts(world)
    plain = plain_parts(world, manager.ops)
    now = world.now
    assert fast.wakeup.next_wakeup(now) == plain.wakeup.next_wakeup(now)
    for dev in world.devices:
        ttls = fast.residents.device_ttls(dev)
        for svc in world.loaded_on(dev):
            expires = (
                svc.idle
                and not (svc.pinned or svc.admin_wants_loaded)
                and plain.residents.idle_past_ttl(svc)
            )
            assert not expires or now >= ttls.check_at, svc.name


@settings(SETTINGS, max_examples=60)
@given(
    spec=st.one_of(manager_specs(), two_device_specs(), crowded_specs()),
    ops=st.one_of(ops_strategy, crowded_ops),
    disabled=st.frozensets(
        st.sampled_from(["on_demand_keep", "restore", "idle_keep", "ballooning"]), max_size=2
    ),
)
def test_kept_ttls_and_wake_ups_equal_a_walk_of_every_service(
    spec: ManagerSpec, ops: list[Op], disabled: frozenset[str]
) -> None:
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled))
    policy = AccelmuxPolicy()
    ex = FakeExecutor(Manager(spec, policy))
    counter = [0]
    for op in ops:
        apply(ex, spec, op, counter)
        assert_timers_agree(policy, ex.manager)
        wake = ex.manager.next_wakeup(ex.now)
        if wake is not None and op[2] < 0.5:
            ex.send(Tick(), wake - ex.now)  # time passes: TTLs run out, pools shrink
            assert_timers_agree(policy, ex.manager)


def test_a_keep_alive_given_to_an_idle_service_whose_request_waits_moves_its_wake_up() -> None:
    # The batch job is loaded and idle; a request for it, with a client's keep_alive of
    # 7 s, waits while voice work runs: its TTL (what the next wake-up reads) is 7 s now.
    spec = ManagerSpec(
        devices=(device(budget=24 * GIB),),
        services=(
            service("asr", cls=ServiceClass.REALTIME),
            service("job", cls=ServiceClass.BATCH, residency=Residency.WARM, ttl_s=300.0),
        ),
        knobs=PolicyKnobs(prewarm=False, safety_factor=1.0, disabled=frozenset({"idle_keep"})),
    )
    policy = AccelmuxPolicy()
    m = Manager(spec, policy)
    up(m, "asr", "job")
    assert m.next_wakeup(1.0) == pytest.approx(300.0)
    m.handle(arrive("a1", "asr"), 1.0)  # runs until the end of the test
    out = m.handle(
        RequestArrived(request_id="j1", service="job", demand=Demand(), keep_alive_s=7.0), 2.0
    )
    assert enqueued(out)["j1"].reason is Reason.HIGHER_CLASS_WAITING
    assert m.next_wakeup(2.0) == plain_parts(m.world, m.ops).wakeup.next_wakeup(2.0) == 7.0
