"""The Manager's bookkeeping per event (with the accelmux policy deciding)."""

from __future__ import annotations

import pytest

from accelmux.core.actions import Dispatch, Fail
from accelmux.core.events import (
    AdminCommand,
    BackendCrashed,
    LoadFailed,
    LoadFinished,
    MemorySampled,
    RequestCancelled,
    RequestFinished,
    ShutdownRequested,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Decision, Manager
from accelmux.core.specs import ManagerSpec, PolicyKnobs
from accelmux.core.types import GIB, MIB, Category, Reason, Residency, ServiceClass, ServiceStatus
from accelmux.core.world import WorldOps, WorldView
from accelmux.errors import InvariantError

from .support import (
    EXACT,
    EXACT_TTL,
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    loaded,
    loads,
    manager,
    of,
    plain_profile,
    rejected,
    service,
    unloads,
)

IMG = plain_profile(weights=2 * GIB, runtime=256 * MIB, workspace=512 * MIB)


def img_manager(knobs: PolicyKnobs = EXACT, **kw: object) -> Manager:
    return manager(service("img", profile=IMG, **kw), knobs=knobs)  # type: ignore[arg-type]


def resident(m: Manager, name: str) -> int:
    return m.world.ledger.service_total("gpu", name)


def status(m: Manager, name: str) -> ServiceStatus:
    return m.world.services[name].status


# ---- start and time ---------------------------------------------------------------
def test_start_loads_pinned_services_once() -> None:
    m = manager(
        service("asr", cls=ServiceClass.REALTIME, residency=Residency.PINNED),
        service("img"),
        knobs=EXACT,
    )
    first = m.start(0.0)
    assert [(a.service, a.reason) for a in loads(first)] == [("asr", Reason.PINNED)]
    assert m.start(1.0) == []
    assert m.world.services["asr"].status is ServiceStatus.LOADING


def test_handle_starts_the_manager_on_first_use() -> None:
    m = manager(service("asr", residency=Residency.PINNED), knobs=EXACT)
    out = m.handle(Tick(), 0.0)
    assert [a.service for a in loads(out)] == ["asr"]


def test_time_must_not_go_backwards() -> None:
    m = img_manager()
    m.handle(Tick(), 10.0)
    m.handle(Tick(), 10.0)
    with pytest.raises(InvariantError, match="backwards"):
        m.handle(Tick(), 9.0)


# ---- arrivals -------------------------------------------------------------------------
def test_arrival_creates_a_waiting_request_with_its_deadline() -> None:
    m = img_manager(deadline_s=20.0)
    out = m.handle(arrive("r1", "img", units=1.0), 5.0)
    req = m.world.waiting["r1"]
    assert (req.arrived_at, req.deadline_at, req.cls) == (5.0, 25.0, ServiceClass.INTERACTIVE)
    assert m.world.services["img"].waiting_count == 1
    assert [a.service for a in loads(out)] == ["img"]
    assert enqueued(out)["r1"].reason is Reason.LOADING
    assert m.world.services["img"].rate > 0


def test_duplicate_and_unknown_requests_are_invariant_errors() -> None:
    m = img_manager()
    m.handle(arrive("r1", "img"), 0.0)
    with pytest.raises(InvariantError, match="duplicate"):
        m.handle(arrive("r1", "img"), 0.0)
    with pytest.raises(InvariantError, match="unknown service"):
        m.handle(arrive("r2", "nope"), 0.0)


# ---- load finished / failed --------------------------------------------------------
def test_load_commits_resident_memory_and_finish_dispatches() -> None:
    m = img_manager()
    out = m.handle(arrive("r1", "img"), 0.0)
    (load,) = loads(out)
    assert (load.weights_bytes, load.runtime_bytes, load.kv_pool_bytes) == (
        2 * GIB,
        256 * MIB,
        0,
    )
    assert resident(m, "img") == 2 * GIB + 256 * MIB  # committed while loading
    out = m.handle(loaded("img"), 3.0)
    svc = m.world.services["img"]
    assert svc.status is ServiceStatus.LOADED
    assert svc.loaded_at == 3.0
    assert svc.cold_starts == 1
    (d,) = of(Dispatch, out)
    assert d.lease_bytes == 512 * MIB
    assert d.attempt == 1
    assert m.world.ledger.amount("gpu", "img", Category.ACTIVE) == 512 * MIB


def test_load_finished_for_a_service_not_loading_is_ignored() -> None:
    m = img_manager()
    assert m.handle(loaded("img"), 0.0) == []
    assert m.world.services["img"].status is ServiceStatus.UNLOADED


def test_measured_load_sizes_calibrate_the_next_load() -> None:
    m = img_manager(ttl_s=10.0)
    m.handle(arrive("r1", "img"), 0.0)
    m.handle(LoadFinished(service="img", weights_bytes=3 * GIB), 1.0)
    m.handle(done("r1"), 2.0)
    m.handle(Tick(), 20.0)  # TTL
    m.handle(Unloaded(service="img"), 21.0)
    out = m.handle(arrive("r2", "img"), 22.0)
    (load,) = loads(out)
    assert load.weights_bytes + load.runtime_bytes > 3 * GIB + 256 * MIB


def test_load_failure_rolls_back_and_rejects_waiting_requests() -> None:
    m = img_manager()
    m.handle(arrive("r1", "img"), 0.0)
    m.handle(arrive("r2", "img"), 0.5)
    out = m.handle(LoadFailed(service="img", error="file not found"), 1.0)
    assert resident(m, "img") == 0
    assert m.world.ledger.lease_count() == 0
    svc = m.world.services["img"]
    assert svc.status is ServiceStatus.CRASHED
    assert svc.backoff_until == 2.0
    rej = rejected(out)
    assert set(rej) == {"r1", "r2"}
    assert all(r.reason is Reason.LOAD_FAILED and r.retry_after_s >= 1.0 for r in rej.values())
    assert rej["r1"].detail == "file not found"
    assert not m.world.waiting


def test_load_failed_for_a_service_not_loading_is_ignored() -> None:
    m = img_manager()
    running_img(m)
    before = m.world.ledger.decided("gpu")
    assert m.handle(LoadFailed(service="img", error="late"), 1.0) == []
    assert status(m, "img") is ServiceStatus.LOADED
    assert m.world.ledger.decided("gpu") == before
    assert "r1" in m.world.inflight


def test_backoff_doubles_on_consecutive_failures_and_is_capped() -> None:
    knobs = PolicyKnobs(prewarm=False, crash_backoff_s=1.0, crash_backoff_max_s=3.0)
    m = manager(service("img", profile=IMG, residency=Residency.PINNED), knobs=knobs)
    now = 0.0
    m.start(now)
    delays = []
    for _ in range(4):
        m.handle(LoadFailed(service="img", error="x"), now)
        delays.append(m.world.services["img"].backoff_until - now)
        now = m.world.services["img"].backoff_until
        out = m.handle(Tick(), now)  # pinned: reloaded after the backoff
        assert [a.reason for a in loads(out)] == [Reason.RELOAD_AFTER_CRASH]
    assert delays == [1.0, 2.0, 3.0, 3.0]
    m.handle(loaded("img"), now)
    assert m.world.services["img"].consecutive_failures == 0


# ---- finishing ---------------------------------------------------------------------
def running_img(m: Manager, rid: str = "r1", now: float = 0.0) -> None:
    m.handle(arrive(rid, "img"), now)
    if m.world.services["img"].status is ServiceStatus.LOADING:
        m.handle(loaded("img"), now)
    assert rid in m.world.inflight


def test_finish_releases_the_lease_and_learns() -> None:
    m = img_manager()
    running_img(m)
    out = m.handle(done("r1", peak=1024 * MIB), 4.0)
    assert out == []
    svc = m.world.services["img"]
    assert m.world.ledger.amount("gpu", "img", Category.ACTIVE) == 0
    assert m.world.ledger.lease_count() == 3  # weights, runtime, kv pool (empty)
    assert svc.served == 1
    assert svc.last_used == 4.0
    assert svc.calibration.active.observations == 1
    assert svc.mean_service_s == pytest.approx(0.8 * 1.0 + 0.2 * 4.0)
    assert m.explain("r1") is not None
    assert m.explain("r1")[-1].endswith("finished")  # type: ignore[index]


def test_stale_or_unknown_finish_is_ignored() -> None:
    m = img_manager()
    running_img(m)
    assert m.handle(RequestFinished(request_id="r1", attempt=2), 1.0) == []
    assert "r1" in m.world.inflight
    assert m.handle(RequestFinished(request_id="ghost", attempt=1), 1.0) == []
    m.handle(done("r1"), 2.0)
    assert m.handle(done("r1"), 3.0) == []  # finished twice: the second is stale
    assert m.world.services["img"].served == 1


def test_failed_finish_ends_the_request_with_a_fail() -> None:
    m = img_manager()
    running_img(m)
    out = m.handle(RequestFinished(request_id="r1", attempt=1, ok=False, error="oom"), 1.0)
    (fail,) = of(Fail, out)
    assert (fail.request_id, fail.reason, fail.detail) == ("r1", Reason.BACKEND_CRASHED, "oom")
    assert not m.world.inflight
    assert m.world.ledger.amount("gpu", "img", Category.ACTIVE) == 0


# ---- cancel ------------------------------------------------------------------------
def test_cancel_of_a_waiting_request_rejects_it() -> None:
    m = img_manager()
    m.handle(arrive("r1", "img"), 0.0)
    out = m.handle(RequestCancelled(request_id="r1"), 1.0)
    rej = rejected(out)["r1"]
    assert (rej.reason, rej.retry_after_s) == (Reason.CANCELLED, 0.0)
    assert m.world.services["img"].waiting_count == 0


def test_cancel_of_a_running_request_fails_it_and_frees_its_lease() -> None:
    m = img_manager()
    running_img(m)
    out = m.handle(RequestCancelled(request_id="r1"), 1.0)
    assert [(a.request_id, a.reason) for a in of(Fail, out)] == [("r1", Reason.CANCELLED)]
    assert m.world.ledger.amount("gpu", "img", Category.ACTIVE) == 0
    assert m.handle(done("r1"), 2.0) == []  # the backend's late answer is stale
    assert m.handle(RequestCancelled(request_id="r1"), 3.0) == []


# ---- unload --------------------------------------------------------------------------
def test_unloaded_releases_everything() -> None:
    m = img_manager(knobs=EXACT_TTL, ttl_s=5.0)
    running_img(m)
    m.handle(done("r1"), 1.0)
    out = m.handle(Tick(), 6.0)
    assert [(a.service, a.reason) for a in unloads(out)] == [("img", Reason.TTL_EXPIRED)]
    assert status(m, "img") is ServiceStatus.UNLOADING
    assert resident(m, "img") > 0  # memory is freed only when the backend confirms
    m.handle(Unloaded(service="img"), 7.0)
    assert status(m, "img") is ServiceStatus.UNLOADED
    assert m.world.services["img"].loaded_at is None
    assert resident(m, "img") == 0
    assert m.world.ledger.lease_count() == 0


def test_unsolicited_unloaded_only_for_an_idle_service() -> None:
    m = img_manager()
    running_img(m)
    m.handle(Unloaded(service="img"), 1.0)  # busy: ignored
    assert status(m, "img") is ServiceStatus.LOADED
    m.handle(done("r1"), 2.0)
    m.handle(Unloaded(service="img"), 3.0)  # idle: the backend went away
    assert status(m, "img") is ServiceStatus.UNLOADED
    assert m.world.ledger.lease_count() == 0


# ---- crash -----------------------------------------------------------------------------
def test_crash_fails_inflight_releases_memory_and_backs_off() -> None:
    m = manager(service("img", profile=IMG, concurrency=1), knobs=EXACT)
    running_img(m)
    m.handle(arrive("r2", "img"), 0.5)  # waits for concurrency
    out = m.handle(BackendCrashed(service="img", error="segfault"), 1.0)
    assert [(a.request_id, a.reason, a.detail) for a in of(Fail, out)] == [
        ("r1", Reason.BACKEND_CRASHED, "segfault")
    ]
    svc = m.world.services["img"]
    assert svc.status is ServiceStatus.CRASHED
    assert svc.crashes == 1
    assert resident(m, "img") == 0
    assert m.world.ledger.lease_count() == 0
    assert enqueued(out)["r2"].reason is Reason.BACKOFF
    assert m.next_wakeup(1.0) == 2.0
    out = m.handle(Tick(), 2.0)
    assert [a.reason for a in loads(out)] == [Reason.RELOAD_AFTER_CRASH]
    assert m.handle(done("r1"), 2.5) == []  # stale
    out = m.handle(loaded("img"), 3.0)
    assert dispatched(out) == ["r2"]


def test_crash_reason_comes_from_the_event() -> None:
    m = img_manager()
    running_img(m)
    out = m.handle(
        BackendCrashed(service="img", error="killed", reason=Reason.FOREIGN_PRESSURE), 1.0
    )
    assert [a.reason for a in of(Fail, out)] == [Reason.FOREIGN_PRESSURE]


# ---- memory samples ------------------------------------------------------------------
def test_sample_sets_foreign_and_reserved() -> None:
    m = img_manager()
    running_img(m)
    accounted = resident(m, "img")
    m.handle(
        MemorySampled(
            device="gpu",
            used_bytes=accounted + 300 * MIB + 2 * GIB + 100 * MIB,
            per_service={"img": accounted + 300 * MIB},
            baseline_bytes=100 * MIB,
        ),
        1.0,
    )
    ledger = m.world.ledger
    assert ledger.foreign("gpu") == 2 * GIB
    assert ledger.amount("gpu", "img", Category.RESERVED) == 300 * MIB
    assert ledger.committed("gpu") == ledger.decided("gpu") + 300 * MIB
    svc = m.world.services["img"]
    assert svc.measured_bytes == accounted + 300 * MIB
    assert not svc.over_limit
    snap = m.snapshot().as_dict()
    assert snap["devices"][0]["foreign_bytes"] == 2 * GIB
    assert snap["services"][0]["ledger"]["reserved"] == 300 * MIB
    # measured below what was accounted: no negative reserved
    m.handle(MemorySampled(device="gpu", used_bytes=GIB, per_service={"img": GIB}), 2.0)
    assert ledger.amount("gpu", "img", Category.RESERVED) == 0
    assert ledger.foreign("gpu") == 0
    # the reserved memory goes away with the service
    m.handle(done("r1"), 3.0)
    m.handle(MemorySampled(device="gpu", used_bytes=10 * GIB, per_service={"img": 8 * GIB}), 4.0)
    m.handle(Unloaded(service="img"), 5.0)
    assert ledger.committed("gpu") == 0


def test_sample_flags_a_service_far_above_its_limit() -> None:
    m = img_manager()
    running_img(m)
    m.handle(MemorySampled(device="gpu", used_bytes=9 * GIB, per_service={"img": 9 * GIB}), 1.0)
    assert m.world.services["img"].over_limit
    # while it serves, it may not take more: a second request waits
    out = m.handle(arrive("r2", "img"), 1.5)
    assert enqueued(out)["r2"].reason is Reason.NO_MEMORY
    assert "limit" in enqueued(out)["r2"].detail
    # it is never blocked for good: once idle it serves again, one request at a time
    out = m.handle(done("r1"), 2.0)
    assert dispatched(out) == ["r2"]


def test_sample_of_unknown_device_or_foreign_service_is_ignored() -> None:
    m = manager(
        service("a"),
        service("b", device_name="npu"),
        devices=(device("gpu"), device("npu")),
        knobs=EXACT,
    )
    m.handle(MemorySampled(device="tpu", used_bytes=GIB), 0.0)
    m.handle(MemorySampled(device="gpu", used_bytes=3 * GIB, per_service={"b": GIB}), 1.0)
    assert m.world.ledger.foreign("gpu") == 3 * GIB  # b lives on npu: not subtracted here
    assert m.world.ledger.foreign("npu") == 0
    assert m.world.services["b"].measured_bytes is None


# ---- admin ---------------------------------------------------------------------------
def test_admin_load_keeps_a_service_resident_until_admin_unload() -> None:
    m = img_manager(ttl_s=1.0)
    out = m.handle(AdminCommand(service="img", op="load"), 0.0)
    assert [a.reason for a in loads(out)] == [Reason.ADMIN]
    m.handle(loaded("img"), 1.0)
    assert unloads(m.handle(Tick(), 100.0)) == []  # kept despite TTL
    out = m.handle(AdminCommand(service="img", op="unload"), 101.0)
    assert [a.reason for a in unloads(out)] == [Reason.ADMIN]
    assert m.world.services["img"].evictions == 0  # an order is not an eviction
    m.handle(Unloaded(service="img"), 102.0)
    assert m.world.admin_unload == set()


def test_admin_unload_waits_for_inflight_requests() -> None:
    m = img_manager()
    running_img(m)
    assert unloads(m.handle(AdminCommand(service="img", op="unload"), 1.0)) == []
    out = m.handle(done("r1"), 2.0)
    assert [a.reason for a in unloads(out)] == [Reason.ADMIN]


def test_admin_unload_unpins_and_pin_cancels_a_pending_unload() -> None:
    m = manager(service("asr", residency=Residency.PINNED, ttl_s=1.0), knobs=EXACT)
    m.start(0.0)
    m.handle(loaded("asr"), 0.0)
    m.handle(arrive("r1", "asr"), 1.0)
    m.handle(AdminCommand(service="asr", op="unload"), 2.0)  # busy: deferred
    assert not m.world.services["asr"].pinned
    m.handle(AdminCommand(service="asr", op="pin"), 3.0)
    out = m.handle(done("r1"), 4.0)
    assert unloads(out) == []  # the later pin wins
    assert unloads(m.handle(Tick(), 100.0)) == []


def test_admin_pin_and_unpin() -> None:
    m = img_manager(knobs=EXACT_TTL, ttl_s=5.0)
    running_img(m)
    m.handle(AdminCommand(service="img", op="pin"), 0.0)
    m.handle(done("r1"), 1.0)
    assert unloads(m.handle(Tick(), 50.0)) == []
    out = m.handle(AdminCommand(service="img", op="unpin"), 51.0)
    assert [a.reason for a in unloads(out)] == [Reason.TTL_EXPIRED]


def test_admin_command_for_unknown_service_raises() -> None:
    with pytest.raises(InvariantError):
        img_manager().handle(AdminCommand(service="nope", op="load"), 0.0)


# ---- shutdown and deadlines ---------------------------------------------------------------
def test_shutdown_rejects_waiting_and_new_requests() -> None:
    m = manager(service("img", profile=IMG, residency=Residency.PINNED), knobs=EXACT)
    m.start(0.0)
    m.handle(arrive("r1", "img"), 0.0)
    out = m.handle(ShutdownRequested(), 1.0)
    assert rejected(out)["r1"].reason is Reason.SHUTTING_DOWN
    out = m.handle(arrive("r2", "img"), 2.0)
    assert rejected(out)["r2"].reason is Reason.SHUTTING_DOWN
    assert rejected(out)["r2"].retry_after_s > 0
    m.handle(BackendCrashed(service="img", error="x"), 3.0)
    assert loads(m.handle(Tick(), 100.0)) == []  # no restarts while shutting down


def test_deadline_rejects_a_waiting_request() -> None:
    m = img_manager(deadline_s=10.0)
    m.handle(arrive("r1", "img"), 0.0)
    assert m.next_wakeup(0.0) == 10.0
    assert rejected(m.handle(Tick(), 9.9)) == {}
    rej = rejected(m.handle(Tick(), 10.0))["r1"]
    assert rej.reason is Reason.DEADLINE_EXCEEDED
    assert rej.retry_after_s >= 1.0
    assert "loading" in rej.detail
    assert m.next_wakeup(10.0) is None


# ---- reading -------------------------------------------------------------------------------
def test_decision_log_counts_snapshot_and_explain() -> None:
    m = img_manager(concurrency=2)
    running_img(m)
    m.handle(arrive("r2", "img"), 1.0)
    assert [(d.time, type(d.action)) for d in m.log][-1] == (1.0, Dispatch)
    assert m.counts[("load", "demand")] == 1
    assert m.counts[("dispatch", "fits")] == 2
    snap = m.snapshot().as_dict()
    assert snap["time"] == 1.0
    assert snap["counts"]["load:demand"] == 1
    assert snap["decisions"][0] == {
        "t": 0.0,
        "action": "load",
        "service": "img",
        "reason": "demand",
        "detail": "for r1",
        "kv_pool_bytes": 0,
    }
    (svc,) = snap["services"]
    assert (svc["state"], svc["inflight"], svc["waiting"]) == ("loaded", 2, 0)
    assert svc["ledger"]["active"] == 2 * 512 * MIB
    assert svc["estimated_bytes"] == resident(m, "img")
    assert snap["queues"] == {"realtime": 0, "interactive": 0, "batch": 0, "background": 0}
    lines = m.explain("r1")
    assert lines is not None
    assert any("wait (loading)" in line for line in lines)
    assert any("dispatch (fits)" in line for line in lines)
    assert m.explain("nobody") is None


def test_decision_log_is_bounded() -> None:
    knobs = PolicyKnobs(prewarm=False, max_decision_log=5)
    m = manager(service("img", queue_limit=0), knobs=knobs)
    for i in range(10):
        m.handle(arrive(f"r{i}", "img"), float(i))
    assert len(m.log) == 5


class _Overcommitting:
    """A broken policy: admits a load with enforce=False beyond the budget."""

    name = "broken"
    infinite_memory = False
    enforces_budget = True

    def start(self, world: WorldView, ops: WorldOps, now: float) -> None:
        ops.load(world.services["img"], reason=Reason.DEMAND, enforce=False)

    def decide(self, world: WorldView, ops: WorldOps, now: float) -> None:
        return None

    def next_wakeup(self, world: WorldView, now: float) -> float | None:
        return None


def test_manager_raises_when_a_policy_breaks_the_budget() -> None:
    spec = ManagerSpec(
        devices=(device(budget=4 * GIB),),
        services=(service("img", profile=plain_profile(weights=8 * GIB)),),
    )
    with pytest.raises(InvariantError, match="decided"):
        Manager(spec, _Overcommitting()).start(0.0)


def test_a_broken_budget_is_checked_before_the_actions_leave() -> None:
    """Strict (the default): the round's actions never leave a broken Manager."""
    spec = ManagerSpec(
        devices=(device(budget=4 * GIB),),
        services=(service("img", profile=plain_profile(weights=8 * GIB)),),
    )
    m = Manager(spec, _Overcommitting())
    with pytest.raises(InvariantError, match="decided"):
        m.start(0.0)
    assert list(m.log) == []


def test_not_strict_a_broken_budget_is_reported_not_raised() -> None:
    spec = ManagerSpec(
        devices=(device(budget=4 * GIB, headroom=0),),
        services=(service("img", profile=plain_profile(weights=8 * GIB)),),
    )
    m = Manager(spec, _Overcommitting(), strict=False)
    out = m.start(0.0)
    assert [type(a).__name__ for a in out] == ["Load"]  # the actions still leave
    (report,) = m.take_broken()
    assert report.detail == f"device gpu: decided {8 * GIB} > usable {4 * GIB}"
    assert report.actions == (Decision(0.0, out[0]).as_dict(),)
    assert report.recent == ()
    assert m.log[-1] is report and m.log[-1].as_dict()["action"] == "invariant_broken"
    assert m.snapshot().as_dict()["counts"]["invariant_broken:budget"] == 1
    assert m.take_broken() == []
    m.handle(Tick(), 1.0)  # still over: reported once, not at every event
    assert m.take_broken() == []
    m.handle(LoadFailed(service="img", error="no"), 2.0)  # back within the budget
    assert m.take_broken() == []
    assert report in m.log


def test_every_kind_of_event_has_its_bookkeeping_method() -> None:
    from typing import get_args

    from accelmux.core import manager as manager_module
    from accelmux.core.events import Event

    appliers = manager_module._APPLIERS
    assert set(appliers) == set(get_args(Event))
    assert all(callable(getattr(manager_module.Manager, name)) for name in appliers.values())
