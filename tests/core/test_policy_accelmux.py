"""Behaviour of the accelmux policy: admission, queues, classes, preemption, eviction,
ballooning, maintenance windows, foreign pressure, TTLs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.actions import Action, Dispatch, Fail, Preempt, Resize
from accelmux.core.events import (
    AdminCommand,
    LoadFailed,
    MemorySampled,
    RequestArrived,
    RequestFinished,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy, policy_names
from accelmux.core.policies.accelmux import AccelmuxPolicy
from accelmux.core.specs import MemoryProfile, PolicyKnobs, ServiceSpec, Window
from accelmux.core.types import (
    GIB,
    MIB,
    Reason,
    Residency,
    ServiceClass,
    ServiceKind,
    ServiceStatus,
)

from .support import (
    EXACT,
    EXACT_TTL,
    arrive,
    dispatched,
    done,
    enqueued,
    llm_profile,
    loaded,
    loads,
    manager,
    of,
    plain_profile,
    rejected,
    resized,
    service,
    unloads,
    up,
)

HOUR = 3600.0
RT, IA, BA, BG = (
    ServiceClass.REALTIME,
    ServiceClass.INTERACTIVE,
    ServiceClass.BATCH,
    ServiceClass.BACKGROUND,
)


def big(weights_gib: float = 1, workspace_gib: float = 0) -> MemoryProfile:
    return plain_profile(weights=int(weights_gib * GIB), workspace=int(workspace_gib * GIB))


def chat(name: str = "chat", **kw: object) -> ServiceSpec:
    return service(name, kind=ServiceKind.CHAT, **kw)  # type: ignore[arg-type]


def test_policy_registry() -> None:
    assert "accelmux" in policy_names()
    assert isinstance(make_policy("accelmux"), AccelmuxPolicy)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")


# ---- admission ---------------------------------------------------------------------------
def test_request_that_fits_is_dispatched_with_a_calibrated_lease() -> None:
    m = manager(service("img", profile=plain_profile(workspace=500 * MIB)))  # safety 1.2
    up(m, "img")
    (d,) = of(Dispatch, m.handle(arrive("r1", "img"), 1.0))
    assert (d.reason, d.lease_bytes) == (Reason.FITS, 600 * MIB)


def test_calibration_raises_the_lease_after_a_large_peak() -> None:
    m = manager(service("img", profile=plain_profile(workspace=500 * MIB)), knobs=EXACT)
    up(m, "img")
    m.handle(arrive("r1", "img"), 1.0)
    m.handle(done("r1", peak=1000 * MIB), 2.0)
    (d,) = of(Dispatch, m.handle(arrive("r2", "img"), 3.0))
    assert d.lease_bytes == int(1000 * MIB * 1.05)


def test_cold_start_loads_then_dispatches() -> None:
    m = manager(service("img"), knobs=EXACT)
    out = m.handle(arrive("r1", "img"), 0.0)
    assert [a.reason for a in loads(out)] == [Reason.DEMAND]
    assert enqueued(out)["r1"].reason is Reason.LOADING
    assert dispatched(m.handle(arrive("r2", "img"), 0.5)) == []  # still loading
    assert dispatched(m.handle(loaded("img"), 1.0)) == ["r1"]  # concurrency 1


# ---- bounded queue -----------------------------------------------------------------------
def test_queue_full_rejects_with_retry_after() -> None:
    m = manager(service("img", concurrency=1, queue_limit=2), knobs=EXACT)
    up(m, "img")
    assert dispatched(m.handle(arrive("r1", "img"), 1.0)) == ["r1"]
    for rid in ("r2", "r3"):
        assert enqueued(m.handle(arrive(rid, "img"), 1.0))[rid].reason is Reason.CONCURRENCY_LIMIT
    rej = rejected(m.handle(arrive("r4", "img"), 1.0))["r4"]
    assert rej.reason is Reason.QUEUE_FULL
    assert rej.retry_after_s >= 1.0
    assert "limit 2" in rej.detail
    # requests already queued are never rejected for a full queue later
    assert rejected(m.handle(Tick(), 2.0)) == {}
    assert dispatched(m.handle(done("r1"), 3.0)) == ["r2"]
    assert "r5" in enqueued(m.handle(arrive("r5", "img"), 3.0))


def test_zero_queue_limit_means_run_now_or_reject() -> None:
    m = manager(service("img", concurrency=1, queue_limit=0), knobs=EXACT)
    up(m, "img")
    m.handle(arrive("r1", "img"), 1.0)
    assert rejected(m.handle(arrive("r2", "img"), 1.0))["r2"].reason is Reason.QUEUE_FULL


def test_deadline_rejects_a_request_stuck_behind_concurrency() -> None:
    m = manager(service("img", concurrency=1, deadline_s=5.0), knobs=EXACT)
    up(m, "img")
    m.handle(arrive("r1", "img"), 0.0)
    m.handle(arrive("r2", "img"), 0.0)
    assert m.next_wakeup(0.0) == 5.0
    rej = rejected(m.handle(Tick(), 5.0))["r2"]
    assert rej.reason is Reason.DEADLINE_EXCEEDED
    assert "concurrency_limit" in rej.detail


# ---- classes ---------------------------------------------------------------------------------
def test_higher_class_goes_first_when_memory_frees() -> None:
    m = manager(
        service("ia", cls=IA, profile=big(1, 5), residency=Residency.PINNED, concurrency=2),
        service("bg", cls=BG, profile=big(1, 5), residency=Residency.PINNED, concurrency=2),
        knobs=EXACT,
    )
    m.start(0.0)
    m.handle(loaded("ia"), 0.0)
    m.handle(loaded("bg"), 0.0)
    assert dispatched(m.handle(arrive("i1", "ia"), 1.0)) == ["i1"]  # 4.5 GiB left
    out = m.handle(arrive("b1", "bg"), 2.0)
    assert enqueued(out)["b1"].reason is Reason.NO_MEMORY
    out = m.handle(arrive("i2", "ia"), 3.0)
    assert enqueued(out)["i2"].reason is Reason.NO_MEMORY  # interactive is never preempted
    assert of(Preempt, out) == []
    # while the interactive request waits for memory, lower classes are held back for it
    assert enqueued(out)["b1"].reason is Reason.HIGHER_CLASS_WAITING
    assert dispatched(m.handle(done("i1"), 4.0)) == ["i2"]  # b1 arrived first, i2 goes first
    assert dispatched(m.handle(done("i2"), 5.0)) == ["b1"]


def test_realtime_never_waits_for_memory_lower_classes_could_take() -> None:
    m = manager(
        service("rt", cls=RT, profile=big(1, 3)),
        service("ia", cls=IA, profile=big(1, 5), concurrency=2),
        knobs=EXACT,
    )
    up(m, "rt", "ia")
    assert dispatched(m.handle(arrive("i1", "ia"), 1.0)) == ["i1"]
    # 4.5 GiB are free, but 3 of them are kept for the loaded realtime service
    assert enqueued(m.handle(arrive("i2", "ia"), 2.0))["i2"].reason is Reason.NO_MEMORY
    assert dispatched(m.handle(arrive("r1", "rt"), 3.0)) == ["r1"]


def _lending_manager(knobs: PolicyKnobs) -> Manager:
    """A loaded realtime service keeping 3 GiB free for its next request, a busy-to-be
    interactive one and an idle interactive one holding 3 GiB (11.5 GiB usable)."""
    m = manager(
        service("rt", cls=RT, profile=big(1, 3)),
        service("ia", cls=IA, profile=big(1, 5), concurrency=2),
        service("idle", cls=IA, profile=big(3)),
        knobs=knobs,
    )
    up(m, "rt", "ia", "idle")
    return m


def test_the_realtime_reserve_may_be_held_by_an_idle_lower_class_service() -> None:
    m = _lending_manager(EXACT)
    # 6.5 GiB free: 5 for i1 leaves 1.5 free, and the idle service's 3 make up the reserve
    assert dispatched(m.handle(arrive("i1", "ia"), 1.0)) == ["i1"]
    out = m.handle(arrive("r1", "rt"), 2.0)
    assert [(u.service, u.reason) for u in unloads(out)] == [("idle", Reason.EVICTED_FOR_MEMORY)]
    assert dispatched(out) == []  # it waits for one unload, not for i1 to end
    assert dispatched(m.handle(Unloaded(service="idle"), 2.5)) == ["r1"]


def test_without_reserve_lending_the_reserve_stays_free() -> None:
    m = _lending_manager(
        PolicyKnobs(prewarm=False, safety_factor=1.0, disabled=frozenset({"reserve_lending"}))
    )
    assert enqueued(m.handle(arrive("i1", "ia"), 1.0))["i1"].reason is Reason.NO_MEMORY


def test_realtime_running_or_waiting_holds_back_batch_work() -> None:
    m = manager(
        service("asr", cls=RT, concurrency=1),
        service("emb", cls=BA),
        knobs=EXACT,
    )
    up(m, "asr", "emb")
    m.handle(arrive("a1", "asr"), 1.0)
    out = m.handle(arrive("e1", "emb"), 1.0)
    assert enqueued(out)["e1"].reason is Reason.HIGHER_CLASS_WAITING
    m.handle(arrive("a2", "asr"), 1.5)  # waits for concurrency
    out = m.handle(done("a1"), 2.0)
    assert dispatched(out) == ["a2"]  # e1 must not start beside the realtime request
    assert dispatched(m.handle(done("a2"), 3.0)) == ["e1"]


def test_interactive_work_is_not_held_back_by_realtime() -> None:
    m = manager(service("asr", cls=RT), service("img", cls=IA), knobs=EXACT)
    up(m, "asr", "img")
    m.handle(arrive("a1", "asr"), 1.0)
    assert dispatched(m.handle(arrive("i1", "img"), 1.0)) == ["i1"]


# ---- preemption ----------------------------------------------------------------------------
def preemption_manager() -> Manager:
    return manager(
        service("emb", cls=BA, profile=big(1, 5), kind=ServiceKind.EMBEDDINGS),
        service("ia", cls=IA, profile=big(1, 5)),
        knobs=EXACT,
    )


def test_batch_is_preempted_for_a_higher_class_and_runs_again_later() -> None:
    m = preemption_manager()
    up(m, "emb", "ia")
    assert dispatched(m.handle(arrive("e1", "emb"), 1.0)) == ["e1"]
    out = m.handle(arrive("i1", "ia"), 2.0)
    (p,) = of(Preempt, out)
    assert (p.request_id, p.attempt, p.reason) == ("e1", 1, Reason.PREEMPTED_FOR_HIGHER_CLASS)
    (d,) = of(Dispatch, out)
    assert (d.request_id, d.reason) == ("i1", Reason.FITS_AFTER_PREEMPTION)
    assert "e1" in m.world.waiting
    stale = m.handle(RequestFinished(request_id="e1", attempt=1), 2.5)
    assert of(Dispatch, stale) == []
    assert of(Fail, stale) == []
    (again,) = of(Dispatch, m.handle(done("i1"), 3.0))
    assert (again.request_id, again.attempt) == ("e1", 2)
    assert dispatched(m.handle(done("e1", attempt=2), 4.0)) == []
    assert not m.world.inflight


def test_background_is_preempted_before_batch() -> None:
    m = manager(
        service("emb", cls=BA, profile=big(1, 3)),
        service("cam", cls=BG, profile=big(1, 3)),
        service("ia", cls=IA, profile=big(1, 3)),
        knobs=EXACT,
    )
    up(m, "emb", "cam", "ia")
    m.handle(arrive("e1", "emb"), 1.0)
    m.handle(arrive("c1", "cam"), 1.0)  # 3 + 3 + 3 weights... 8.5 GiB used of 11.5
    out = m.handle(arrive("i1", "ia"), 2.0)
    assert [p.request_id for p in of(Preempt, out)] == ["c1"]
    assert dispatched(out) == ["i1"]


def test_batch_does_not_preempt_batch() -> None:
    m = manager(
        service("emb", cls=BA, profile=big(1, 5)),
        service("idx", cls=BA, profile=big(1, 5)),
        knobs=EXACT,
    )
    up(m, "emb", "idx")
    m.handle(arrive("e1", "emb"), 1.0)
    out = m.handle(arrive("x1", "idx"), 2.0)
    assert of(Preempt, out) == []
    assert enqueued(out)["x1"].reason is Reason.NO_MEMORY


# ---- eviction and victim score ----------------------------------------------------------------
def test_eviction_picks_the_lowest_victim_score_and_waits_for_the_unload() -> None:
    m = manager(
        service("warm", profile=big(3), residency=Residency.WARM),
        service("ondemand", profile=big(3), residency=Residency.ON_DEMAND),
        service("pin", profile=big(1), residency=Residency.PINNED),
        service("new", profile=big(5)),
        knobs=EXACT,
    )
    up(m, "pin", "warm", "ondemand")
    policy = m.policy
    assert isinstance(policy, AccelmuxPolicy)
    w = m.world
    assert policy.victim_score(w, w.services["ondemand"]) < policy.victim_score(
        w, w.services["warm"]
    )
    out = m.handle(arrive("n1", "new"), 1.0)
    assert [(u.service, u.reason) for u in unloads(out)] == [
        ("ondemand", Reason.EVICTED_FOR_MEMORY)
    ]
    assert enqueued(out)["n1"].reason is Reason.NO_MEMORY
    assert loads(out) == []
    # memory on its way out is not evicted for twice
    assert unloads(m.handle(arrive("n2", "new"), 1.5)) == []
    out = m.handle(Unloaded(service="ondemand"), 2.0)
    assert [(a.service, a.reason) for a in loads(out)] == [("new", Reason.DEMAND)]
    assert w.services["ondemand"].evictions == 1


def test_victim_score_prefers_rarely_used_large_low_class_services() -> None:
    m = manager(
        service("busy", profile=big(2)),
        service("idle", profile=big(2)),
        service("large", profile=big(4)),
        service("batch", profile=big(2), cls=BA),
        knobs=EXACT,
    )
    up(m, "busy", "idle", "large", "batch")
    for i in range(20):
        m.handle(arrive(f"b{i}", "busy"), 1.0 + i)
        m.handle(done(f"b{i}"), 1.0 + i)
    policy = m.policy
    assert isinstance(policy, AccelmuxPolicy)
    score = {name: policy.victim_score(m.world, s) for name, s in m.world.services.items()}
    assert score["idle"] < score["busy"]
    assert score["large"] < score["idle"]
    assert score["batch"] < score["idle"]


def test_pinned_busy_queued_and_higher_class_services_are_never_victims() -> None:
    m = manager(
        service("pin", profile=big(3), residency=Residency.PINNED, cls=BG),
        service("busy", profile=big(3)),  # its work is of the same class: not preemptible
        service("rt", profile=big(3), cls=RT),
        service("new", profile=big(4)),
        knobs=EXACT,
    )
    up(m, "pin", "busy", "rt")
    m.handle(arrive("b1", "busy"), 1.0)
    out = m.handle(arrive("n1", "new"), 2.0)
    assert unloads(out) == []
    assert enqueued(out)["n1"].reason is Reason.NO_MEMORY


def test_a_busy_batch_model_gives_way_once_its_work_is_preempted() -> None:
    def first_moves(*disabled: str) -> tuple[list[str], list[str]]:
        m = manager(
            service("emb", profile=big(7), cls=BA),
            service("chat", profile=big(5)),
            knobs=replace(EXACT, disabled=frozenset(disabled)),
        )
        up(m, "emb")
        m.handle(arrive("e1", "emb"), 1.0)
        out = m.handle(arrive("c1", "chat"), 2.0)
        return [a.request_id for a in of(Preempt, out)], [u.service for u in unloads(out)]

    # Preempting the batch request alone frees nothing worth having: its weights are
    # what the interactive load needs, so the batch model is evicted once idle.
    assert first_moves() == (["e1"], ["emb"])
    assert first_moves("evict_after_preemption") == ([], [])


def test_admin_loaded_services_are_not_victims() -> None:
    m = manager(service("kept", profile=big(6)), service("new", profile=big(6)), knobs=EXACT)
    m.handle(AdminCommand(service="kept", op="load"), 0.0)
    m.handle(loaded("kept"), 0.0)
    out = m.handle(arrive("n1", "new"), 1.0)
    assert unloads(out) == []
    # It can never fit beside it, but it fits the empty device: refused for now (the
    # operator may unload the kept one), not as too large.
    refused = rejected(out)["n1"]
    assert refused.reason is Reason.NO_MEMORY
    assert "beside the services kept loaded" in refused.detail


# ---- ballooning ---------------------------------------------------------------------------
def balloon_manager(**kw: object) -> Manager:
    profile = llm_profile(weights=4 * GIB, kv_floor=512 * MIB, kv_ceiling=4 * GIB)
    return manager(chat(profile=profile, concurrency=4), **kw)  # type: ignore[arg-type]


TOKENS_PER_GIB = GIB // (128 * 1024)


def test_kv_pool_grows_with_demand_and_shrinks_when_idle() -> None:
    m = balloon_manager(knobs=EXACT)
    up(m, "chat")
    svc = m.world.services["chat"]
    assert svc.kv_pool == 512 * MIB
    out = m.handle(arrive("c1", "chat", kv_tokens=2 * TOKENS_PER_GIB), 1.0)
    (r,) = of(Resize, out)
    assert (r.kv_pool_bytes, r.reason) == (2 * GIB, Reason.BALLOON_GROW)
    # The request runs once the backend confirms the larger pool.
    assert dispatched(out) == []
    assert enqueued(out)["c1"].reason is Reason.RESIZING
    (d,) = of(Dispatch, m.handle(resized("chat", 2 * GIB), 1.1))
    assert d.lease_bytes == 2 * GIB
    out = m.handle(arrive("c2", "chat", kv_tokens=TOKENS_PER_GIB), 2.0)
    assert [a.kv_pool_bytes for a in of(Resize, out)] == [3 * GIB]
    assert dispatched(m.handle(resized("chat", 3 * GIB), 2.1)) == ["c2"]
    assert svc.kv_in_use == 3 * GIB
    m.handle(done("c1"), 3.0)
    m.handle(done("c2"), 4.0)
    assert svc.kv_pool == 3 * GIB  # kept while demand may come back
    assert m.next_wakeup(4.0) == 4.0 + 30.0
    assert of(Resize, m.handle(Tick(), 33.0)) == []
    (r,) = of(Resize, m.handle(Tick(), 34.0))
    assert (r.kv_pool_bytes, r.reason) == (512 * MIB, Reason.BALLOON_SHRINK)
    assert svc.kv_pool == 3 * GIB  # held until the backend has shrunk it
    m.handle(resized("chat", 512 * MIB), 34.1)
    assert svc.kv_pool == 512 * MIB


def test_a_request_within_the_pool_does_not_resize() -> None:
    m = balloon_manager(knobs=EXACT)
    up(m, "chat")
    out = m.handle(arrive("c1", "chat", kv_tokens=TOKENS_PER_GIB // 4), 1.0)
    assert of(Resize, out) == []
    assert dispatched(out) == ["c1"]


def test_pool_shrinks_for_another_service_but_not_below_what_is_in_use() -> None:
    m = manager(
        chat(profile=llm_profile(weights=4 * GIB, kv_floor=512 * MIB, kv_ceiling=4 * GIB)),
        service("img", profile=big(1, 4)),
        knobs=EXACT,
    )
    up(m, "chat", "img")
    m.handle(arrive("c1", "chat", kv_tokens=4 * TOKENS_PER_GIB), 1.0)
    m.handle(resized("chat", 4 * GIB), 1.0)
    m.handle(done("c1"), 2.0)
    m.handle(arrive("c2", "chat", kv_tokens=TOKENS_PER_GIB), 3.0)
    # 4 + 4 (pool) + 1 used; the image request needs 4 of the 2.5 left
    out = m.handle(arrive("i1", "img"), 4.0)
    (r,) = of(Resize, out)
    assert (r.service, r.kv_pool_bytes, r.reason) == ("chat", GIB, Reason.BALLOON_SHRINK)
    # The memory comes back when the backend confirms the shrink, not before; nothing
    # else is evicted or preempted for it meanwhile.
    assert dispatched(out) == [] and unloads(out) == [] and of(Preempt, out) == []
    assert dispatched(m.handle(resized("chat", GIB), 4.1)) == ["i1"]


def test_full_pool_waits_without_taking_memory_from_others() -> None:
    m = manager(
        chat(
            profile=llm_profile(weights=4 * GIB, kv_floor=512 * MIB, kv_ceiling=GIB),
            concurrency=4,
        ),
        service("emb", cls=BA, profile=big(2, 4.5)),
        knobs=EXACT,
    )
    up(m, "chat", "emb")
    m.handle(arrive("e1", "emb"), 1.0)
    m.handle(arrive("c1", "chat", kv_tokens=TOKENS_PER_GIB), 2.0)
    m.handle(resized("chat", GIB), 2.0)
    assert m.world.ledger.available("gpu") == 0
    out = m.handle(arrive("c2", "chat", kv_tokens=TOKENS_PER_GIB // 8), 3.0)
    assert of(Preempt, out) == []
    assert enqueued(out)["c2"].reason is Reason.CONCURRENCY_LIMIT
    assert dispatched(m.handle(done("c1"), 4.0)) == ["c2"]


def test_kv_demand_above_the_ceiling_is_too_large() -> None:
    m = balloon_manager(knobs=EXACT)
    up(m, "chat")
    rej = rejected(m.handle(arrive("c1", "chat", kv_tokens=5 * TOKENS_PER_GIB), 1.0))["c1"]
    assert (rej.reason, rej.retry_after_s) == (Reason.TOO_LARGE, 0.0)


def test_kv_demand_on_a_service_without_a_pool_is_too_large() -> None:
    m = manager(
        chat(profile=llm_profile(weights=GIB, kv_floor=0, kv_ceiling=0)),
        knobs=EXACT,
    )
    up(m, "chat")
    assert rejected(m.handle(arrive("c1", "chat", kv_tokens=10), 1.0))["c1"].reason is (
        Reason.TOO_LARGE
    )


# ---- too large ----------------------------------------------------------------------------
def test_a_service_larger_than_the_budget_is_rejected_at_once() -> None:
    m = manager(service("huge", profile=big(20)), knobs=EXACT)
    out = m.handle(arrive("h1", "huge"), 0.0)
    assert loads(out) == []
    assert rejected(out)["h1"].reason is Reason.TOO_LARGE


def test_a_request_larger_than_the_budget_is_rejected() -> None:
    m = manager(service("img", profile=plain_profile(weights=GIB, per_unit=GIB)), knobs=EXACT)
    up(m, "img")
    assert rejected(m.handle(arrive("i1", "img", units=12), 1.0))["i1"].reason is (Reason.TOO_LARGE)


def test_a_pinned_pool_grown_for_a_burst_does_not_make_others_too_large() -> None:
    m = manager(
        chat(
            profile=llm_profile(weights=4 * GIB, kv_floor=512 * MIB, kv_ceiling=4 * GIB),
            residency=Residency.PINNED,
        ),
        service("img", profile=big(5, 1), residency=Residency.ON_DEMAND),
        knobs=EXACT,
    )
    m.start(0.0)
    m.handle(loaded("chat"), 0.0)
    m.handle(arrive("c1", "chat", kv_tokens=4 * TOKENS_PER_GIB), 1.0)
    m.handle(resized("chat", 4 * GIB), 1.0)
    m.handle(done("c1"), 2.0)
    out = m.handle(arrive("i1", "img"), 3.0)
    assert rejected(out) == {}
    assert [a.kv_pool_bytes for a in of(Resize, out)] == [512 * MIB]
    out = m.handle(resized("chat", 512 * MIB), 3.1)
    assert [a.service for a in loads(out)] == ["img"]


# ---- maintenance windows --------------------------------------------------------------------
NIGHT = (Window(start_s=2 * HOUR, end_s=6 * HOUR),)


def window_manager(origin_h: float, **kw: object) -> Manager:
    return manager(
        service(
            "emb",
            cls=BA,
            profile=plain_profile(weights=GIB, per_unit=GIB),
            windows=NIGHT,
            deadline_s=4 * HOUR,
            ttl_s=8 * HOUR,
        ),
        service("img", profile=big(1, 1)),
        knobs=EXACT,
        origin_s_of_day=origin_h * HOUR,
        **kw,  # type: ignore[arg-type]
    )


def test_batch_runs_freely_inside_its_window() -> None:
    m = window_manager(3)
    up(m, "emb")
    assert dispatched(m.handle(arrive("e1", "emb", units=8), 1.0)) == ["e1"]


def test_outside_its_window_batch_needs_spare_memory() -> None:
    m = window_manager(12)
    up(m, "emb")
    out = m.handle(arrive("e1", "emb", units=8), 1.0)  # 8 of 10.5 GiB left: no spare
    assert enqueued(out)["e1"].reason is Reason.OUTSIDE_WINDOW
    assert "spare" in enqueued(out)["e1"].detail


def test_outside_its_window_batch_runs_with_spare_memory_and_no_higher_demand() -> None:
    m = window_manager(12)
    up(m, "emb")
    assert dispatched(m.handle(arrive("e1", "emb", units=1), 1.0)) == ["e1"]


def test_outside_its_window_batch_yields_to_a_waiting_higher_class() -> None:
    m = manager(
        service("emb", cls=BA, windows=NIGHT),
        service("img", cls=IA),
        knobs=EXACT,
        origin_s_of_day=12 * HOUR,
    )
    up(m, "emb")
    m.handle(arrive("i1", "img"), 1.0)  # waits for its service to load
    out = m.handle(arrive("e1", "emb"), 2.0)
    assert enqueued(out)["e1"].reason is Reason.OUTSIDE_WINDOW
    assert "higher class" in enqueued(out)["e1"].detail


def test_window_opening_wakes_waiting_batch_work() -> None:
    m = window_manager(1)
    up(m, "emb")
    m.handle(arrive("e1", "emb", units=8), 10.0)
    assert "e1" in m.world.waiting
    assert m.next_wakeup(10.0) == pytest.approx(HOUR)
    assert dispatched(m.handle(Tick(), HOUR)) == ["e1"]


def test_outside_its_window_a_batch_service_is_not_loaded_without_spare_memory() -> None:
    m = window_manager(12)
    out = m.handle(arrive("e1", "emb", units=8), 1.0)
    assert loads(out) == []
    assert enqueued(out)["e1"].reason is Reason.OUTSIDE_WINDOW


# ---- foreign pressure -----------------------------------------------------------------------
def pressure_manager() -> Manager:
    return manager(
        service("rt", cls=RT, residency=Residency.PINNED, profile=big(2)),
        service("img", cls=IA, profile=big(2)),
        service("emb", cls=BA, profile=big(2, 3)),
        service("cam", cls=BG, profile=big(2)),
        knobs=EXACT,
    )


def foreign(m: Manager, nbytes: int, now: float) -> list[Action]:
    """A sample where managed services use what was accounted and others use ``nbytes``."""
    ledger = m.world.ledger
    per_service = {name: ledger.service_total("gpu", name) for name, s in m.world.services.items()}
    used = sum(per_service.values()) + nbytes
    return m.handle(MemorySampled(device="gpu", used_bytes=used, per_service=per_service), now)


def test_foreign_growth_evicts_the_lowest_class_idle_service() -> None:
    m = pressure_manager()
    up(m, "rt", "img", "emb", "cam")  # 8 of 11.5 GiB
    out = foreign(m, 4 * GIB + GIB // 2, 1.0)
    assert [(u.service, u.reason) for u in unloads(out)] == [("cam", Reason.EVICTED_FOR_MEMORY)]
    assert "foreign_pressure" in unloads(out)[0].detail
    m.handle(Unloaded(service="cam"), 2.0)
    assert m.world.ledger.available("gpu") >= 0


def test_foreign_growth_preempts_running_batch_work() -> None:
    m = pressure_manager()
    up(m, "rt", "img", "emb")
    m.handle(arrive("e1", "emb"), 1.0)  # 6 + 3 of 11.5 GiB
    out = foreign(m, 4 * GIB, 2.0)
    assert [(p.request_id, p.reason) for p in of(Preempt, out)] == [
        ("e1", Reason.PREEMPTED_FOR_HIGHER_CLASS)
    ]
    assert unloads(out) == []
    assert m.world.ledger.available("gpu") >= 0


def test_foreign_growth_never_evicts_a_pinned_service() -> None:
    m = pressure_manager()
    up(m, "rt")
    out = foreign(m, 11 * GIB, 1.0)
    assert unloads(out) == []
    assert m.world.services["rt"].status.value == "loaded"


# ---- loads after an out-of-memory load -------------------------------------------------------
def test_after_a_load_runs_out_of_memory_loads_on_the_device_go_one_at_a_time() -> None:
    m = manager(service("a", profile=big(2)), service("b", profile=big(2)), knobs=EXACT)
    m.start(0.0)
    assert [x.service for x in loads(m.handle(arrive("a1", "a"), 0.0))] == ["a"]
    m.handle(LoadFailed(service="a", error="out of memory", out_of_memory=True), 1.0)
    assert [x.service for x in loads(m.handle(arrive("a2", "a"), 5.0))] == ["a"]  # backoff over
    out = m.handle(arrive("b1", "b"), 5.0)
    assert loads(out) == []  # a's load is in flight: b's waits for it to be done
    assert enqueued(out)["b1"].reason is Reason.LOADING
    assert [x.service for x in loads(m.handle(loaded("a"), 6.0))] == ["b"]


def test_a_pinned_service_reloads_after_its_oom_only_once_no_other_load_is_in_flight() -> None:
    m = manager(
        service("asr", cls=RT, residency=Residency.PINNED, profile=big(2)),
        service("b", profile=big(2)),
        knobs=EXACT,
    )
    assert [x.service for x in loads(m.start(0.0))] == ["asr"]
    m.handle(LoadFailed(service="asr", error="out of memory", out_of_memory=True), 0.5)
    assert [x.service for x in loads(m.handle(arrive("b1", "b"), 0.6))] == ["b"]
    assert loads(m.handle(Tick(), 5.0)) == []  # its backoff is over, but b is loading
    assert [x.service for x in loads(m.handle(loaded("b"), 6.0))] == ["asr"]


def test_without_an_out_of_memory_load_loads_go_side_by_side() -> None:
    m = manager(service("a", profile=big(2)), service("b", profile=big(2)), knobs=EXACT)
    m.start(0.0)
    m.handle(arrive("a1", "a"), 0.0)
    assert [x.service for x in loads(m.handle(arrive("b1", "b"), 0.0))] == ["b"]


# ---- TTL --------------------------------------------------------------------------------------
def test_warm_service_expires_after_its_ttl() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT_TTL)
    up(m, "img", now=0.0)
    assert m.next_wakeup(0.0) == 100.0
    assert unloads(m.handle(Tick(), 99.0)) == []
    (u,) = unloads(m.handle(Tick(), 100.0))
    assert (u.service, u.reason) == ("img", Reason.TTL_EXPIRED)
    assert m.world.services["img"].evictions == 0


def test_an_idle_service_stays_past_its_ttl_while_memory_is_spare() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT)
    up(m, "img", now=0.0)
    assert m.next_wakeup(0.0) is None  # 10.5 of 11.5 GiB free: nothing wants it
    assert unloads(m.handle(Tick(), 1000.0)) == []


def test_an_idle_service_expires_at_its_ttl_once_memory_is_not_spare() -> None:
    m = manager(
        service("img", ttl_s=100.0),
        service("big", profile=big(8), residency=Residency.PINNED),
        knobs=EXACT,
    )
    up(m, "img", "big", now=0.0)
    # 2.5 GiB free is less than a quarter of the budget: the TTL applies
    assert m.next_wakeup(0.0) == 100.0
    assert [u.service for u in unloads(m.handle(Tick(), 100.0))] == ["img"]


def test_an_idle_realtime_service_stays_past_its_ttl_without_the_spare_fraction() -> None:
    m = manager(
        service("asr", cls=RT, ttl_s=100.0),
        service("big", profile=big(8), residency=Residency.PINNED),
        knobs=EXACT,
    )
    up(m, "asr", "big", now=0.0)
    assert unloads(m.handle(Tick(), 1000.0)) == []  # a voice cold start is kept away


def test_a_lower_class_waiting_for_memory_does_not_expire_an_idle_voice_service() -> None:
    m = manager(
        service("asr", cls=RT, ttl_s=100.0),
        service("big", profile=big(8), residency=Residency.PINNED),
        service("img", profile=big(3)),
        knobs=EXACT,
    )
    up(m, "asr", "big", now=0.0)
    assert enqueued(m.handle(arrive("i1", "img"), 1.0))["i1"].reason is Reason.NO_MEMORY
    assert unloads(m.handle(Tick(), 1000.0)) == []  # the image waits; voice stays


def test_a_clients_keep_alive_is_kept_to_the_second_even_while_memory_is_spare() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT)
    up(m, "img")
    m.handle(keep_alive("r1", "img", 50.0), 1.0)
    m.handle(done("r1"), 2.0)
    assert m.next_wakeup(2.0) == 52.0
    assert [u.reason for u in unloads(m.handle(Tick(), 52.0))] == [Reason.TTL_EXPIRED]


def _img_and_waiting_batch(knobs: PolicyKnobs) -> Manager:
    """An idle on-demand image service holding 10 of 12 GiB, and a batch request that
    cannot evict it (a lower class) waiting for that memory."""
    m = manager(
        service("img", profile=big(10), ttl_s=100.0, residency=Residency.ON_DEMAND),
        service("emb", cls=BA, profile=big(4)),
        knobs=knobs,
    )
    up(m, "img")
    out = m.handle(arrive("e1", "emb"), 0.0)
    assert enqueued(out)["e1"].reason is Reason.NO_MEMORY
    return m


def test_on_demand_service_expires_after_the_short_ttl_when_its_memory_is_wanted() -> None:
    m = _img_and_waiting_batch(PolicyKnobs(prewarm=False, on_demand_ttl_s=20.0))
    assert m.next_wakeup(0.0) == 20.0
    assert [u.reason for u in unloads(m.handle(Tick(), 20.0))] == [Reason.TTL_EXPIRED]


def test_an_on_demand_service_holding_most_of_the_budget_stays_while_nothing_waits() -> None:
    m = manager(
        service("img", profile=big(10), ttl_s=100.0, residency=Residency.ON_DEMAND),
        knobs=PolicyKnobs(prewarm=False, on_demand_ttl_s=20.0),
    )
    up(m, "img")
    assert m.next_wakeup(0.0) == 100.0
    assert unloads(m.handle(Tick(), 99.0)) == []


def test_idle_on_demand_service_stays_loaded_while_memory_is_free() -> None:
    # A quiet on-demand chat model is not cold-started on every request: with memory to
    # spare it keeps its own ttl, and it is the first victim when memory is needed.
    knobs = PolicyKnobs(prewarm=False, safety_factor=1.0, on_demand_ttl_s=20.0)
    m = manager(
        service("chat", profile=big(2), ttl_s=100.0, residency=Residency.ON_DEMAND),
        service("other", profile=big(9)),
        service("big", profile=big(1.5), residency=Residency.ON_DEMAND),
        knobs=knobs,
    )
    up(m, "chat")
    assert unloads(m.handle(Tick(), 20.0)) == []
    assert m.world.services["chat"].status is ServiceStatus.LOADED
    out = m.handle(arrive("o1", "other"), 30.0)
    assert unloads(out) == []  # 2 + 9 GiB fit beside each other: nothing is evicted
    m.handle(loaded("other"), 31.0)
    m.handle(done("o1"), 32.0)
    m.handle(arrive("b1", "big"), 33.0)
    assert m.world.services["chat"].status is not ServiceStatus.LOADED  # gives way at once


def test_work_held_back_for_voice_compute_does_not_expire_an_idle_on_demand_service() -> None:
    # A camera frame waits while a voice request runs: it wants compute, not the chat
    # model's memory, so the chat model keeps its own ttl (a reload would cost the next
    # chat request its first-token deadline).
    knobs = PolicyKnobs(prewarm=False, safety_factor=1.0, on_demand_ttl_s=20.0)
    m = manager(
        service("asr", cls=RT, residency=Residency.PINNED),
        service("chat", profile=big(4), ttl_s=1800.0, residency=Residency.ON_DEMAND),
        service("cam", cls=BG, profile=big(0.5)),
        knobs=knobs,
    )
    up(m, "asr", "chat", "cam")
    m.handle(arrive("v1", "asr"), 1.0)
    out = m.handle(arrive("f1", "cam"), 1.0)
    assert enqueued(out)["f1"].reason is Reason.HIGHER_CLASS_WAITING
    assert unloads(m.handle(Tick(), 25.0)) == []  # past on_demand_ttl_s, f1 still waits
    assert "f1" in m.world.waiting
    assert m.world.services["chat"].status is ServiceStatus.LOADED


@given(size_gib=st.integers(1, 11), idle_s=st.floats(0.0, 99.0))
def test_idle_on_demand_service_leaves_before_its_ttl_only_when_memory_is_wanted(
    size_gib: int, idle_s: float
) -> None:
    knobs = PolicyKnobs(prewarm=False, safety_factor=1.0, on_demand_ttl_s=20.0)
    m = manager(
        service("img", profile=big(size_gib), ttl_s=100.0, residency=Residency.ON_DEMAND),
        knobs=knobs,
    )
    up(m, "img")
    # Alone on the device, nothing wants its memory: it stays for its own ttl.
    assert not unloads(m.handle(Tick(), idle_s))


def test_without_on_demand_keep_an_idle_on_demand_service_expires_after_the_short_ttl() -> None:
    knobs = PolicyKnobs(prewarm=False, on_demand_ttl_s=20.0, disabled=frozenset({"on_demand_keep"}))
    m = manager(service("img", ttl_s=100.0, residency=Residency.ON_DEMAND), knobs=knobs)
    up(m, "img")
    assert m.next_wakeup(0.0) == 20.0
    assert [u.reason for u in unloads(m.handle(Tick(), 20.0))] == [Reason.TTL_EXPIRED]


def test_use_resets_the_ttl_and_busy_services_do_not_expire() -> None:
    m = manager(service("img", ttl_s=10.0, concurrency=1), knobs=EXACT_TTL)
    up(m, "img")
    m.handle(arrive("r1", "img"), 8.0)
    assert unloads(m.handle(Tick(), 30.0)) == []  # in flight
    m.handle(done("r1"), 31.0)
    assert unloads(m.handle(Tick(), 40.0)) == []
    assert len(unloads(m.handle(Tick(), 41.0))) == 1


def test_pinned_service_never_expires() -> None:
    m = manager(service("asr", residency=Residency.PINNED, ttl_s=1.0), knobs=EXACT)
    m.start(0.0)
    m.handle(loaded("asr"), 0.0)
    assert unloads(m.handle(Tick(), 10_000.0)) == []
    assert m.next_wakeup(10_000.0) is None


def keep_alive(request_id: str, svc: str, seconds: float | None) -> RequestArrived:
    return RequestArrived(request_id=request_id, service=svc, keep_alive_s=seconds)


def test_keep_alive_replaces_the_ttl_until_a_request_without_it() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT_TTL)
    up(m, "img")
    m.handle(keep_alive("r1", "img", 500.0), 1.0)
    m.handle(done("r1"), 2.0)
    assert m.next_wakeup(2.0) == 502.0
    assert unloads(m.handle(Tick(), 200.0)) == []
    m.handle(arrive("r2", "img"), 300.0)  # no keep_alive: the config's ttl again
    m.handle(done("r2"), 301.0)
    assert m.next_wakeup(301.0) == 401.0
    assert [u.reason for u in unloads(m.handle(Tick(), 401.0))] == [Reason.TTL_EXPIRED]


def test_keep_alive_zero_unloads_as_soon_as_idle() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT)
    up(m, "img")
    m.handle(keep_alive("r1", "img", 0.0), 1.0)
    (u,) = unloads(m.handle(done("r1"), 2.0))
    assert (u.service, u.reason) == ("img", Reason.TTL_EXPIRED)


def test_keep_alive_on_a_pinned_service_is_not_remembered_after_the_unpin() -> None:
    m = manager(service("img", ttl_s=100.0), knobs=EXACT_TTL)
    up(m, "img")
    m.handle(keep_alive("r0", "img", 500.0), 0.5)  # asked before the pin: dropped by it
    m.handle(done("r0"), 0.6)
    m.handle(AdminCommand(service="img", op="pin"), 0.7)
    m.handle(keep_alive("r1", "img", 0.0), 1.0)
    assert unloads(m.handle(done("r1"), 2.0)) == []  # the operator's pin wins
    m.handle(AdminCommand(service="img", op="unpin"), 3.0)
    assert m.world.services["img"].keep_alive_s is None  # the config's ttl_s again
    assert unloads(m.handle(Tick(), 4.0)) == []
    assert [u.reason for u in unloads(m.handle(Tick(), 103.0))] == [Reason.TTL_EXPIRED]


def test_keep_alive_forever_never_expires_but_can_be_evicted_for_memory() -> None:
    m = manager(
        service("img", profile=big(6), ttl_s=10.0),
        service("other", profile=big(6)),
        knobs=EXACT,
    )
    up(m, "img")
    m.handle(keep_alive("r1", "img", math.inf), 1.0)
    m.handle(done("r1"), 2.0)
    assert m.next_wakeup(2.0) is None
    assert unloads(m.handle(Tick(), 100_000.0)) == []
    m.handle(arrive("o1", "other"), 100_001.0)  # needs the room: img is evicted
    assert m.world.services["img"].status is not ServiceStatus.LOADED


def test_keep_alive_cannot_unload_a_pinned_service_or_lengthen_on_demand() -> None:
    m = manager(service("asr", residency=Residency.PINNED, ttl_s=1.0), knobs=EXACT)
    m.start(0.0)
    m.handle(loaded("asr"), 0.0)
    m.handle(keep_alive("a1", "asr", 0.0), 1.0)
    assert unloads(m.handle(done("a1"), 2.0)) == []
    m = _img_and_waiting_batch(PolicyKnobs(prewarm=False, on_demand_ttl_s=20.0))
    m.handle(keep_alive("r1", "img", math.inf), 1.0)
    m.handle(done("r1"), 2.0)
    assert m.next_wakeup(2.0) == 22.0


def test_keep_alive_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="keep_alive_s"):
        keep_alive("r1", "img", -1.0)


# ---- prewarm ----------------------------------------------------------------------------------
def test_recently_evicted_warm_service_is_prewarmed_into_spare_memory() -> None:
    m = manager(
        service("warm", profile=big(3)),
        service("big", profile=big(9), residency=Residency.ON_DEMAND, ttl_s=10.0),
        knobs=PolicyKnobs(on_demand_ttl_s=10.0, safety_factor=1.0),
    )
    up(m, "warm")
    m.handle(arrive("b1", "big"), 1.0)  # evicts warm
    m.handle(Unloaded(service="warm"), 2.0)
    m.handle(loaded("big"), 3.0)
    out = m.handle(done("b1"), 4.0) + m.handle(Tick(), 14.0)  # big goes (TTL or restore)
    assert [u.service for u in unloads(out)] == ["big"]
    out = m.handle(Unloaded(service="big"), 15.0) + m.handle(Tick(), 80.0)
    assert [(a.service, a.reason) for a in loads(out)] == [("warm", Reason.PRELOAD)]


def test_an_evicted_service_the_operator_unloaded_is_not_prewarmed_back() -> None:
    m = manager(
        service("warm", profile=big(3)),
        service("big", profile=big(9), residency=Residency.ON_DEMAND, ttl_s=10.0),
        knobs=PolicyKnobs(on_demand_ttl_s=10.0, safety_factor=1.0),
    )
    up(m, "warm")
    m.handle(arrive("b1", "big"), 1.0)  # evicts warm
    m.handle(AdminCommand(service="warm", op="unload"), 1.5)  # while it is unloading
    m.handle(Unloaded(service="warm"), 2.0)
    m.handle(loaded("big"), 3.0)
    m.handle(done("b1"), 4.0)
    m.handle(Tick(), 14.0)
    out = m.handle(Unloaded(service="big"), 15.0) + m.handle(Tick(), 80.0)
    assert loads(out) == []


def _restore_case(warm_uses: int, big_uses: int) -> list[Action]:
    """A warm service evicted by an on-demand one; what happens 2 s after the latter idles."""
    m = manager(
        service("warm", profile=big(3)),
        service("big", profile=big(9), residency=Residency.ON_DEMAND, ttl_s=300.0),
        knobs=PolicyKnobs(safety_factor=1.0),
    )
    up(m, "warm")
    for i in range(warm_uses):
        m.handle(arrive(f"w{i}", "warm"), 0.1 + i * 0.01)
        m.handle(done(f"w{i}"), 0.1 + i * 0.01)
    m.handle(arrive("b0", "big"), 1.0)  # evicts warm
    m.handle(Unloaded(service="warm"), 2.0)
    m.handle(loaded("big"), 3.0)
    m.handle(done("b0"), 3.0)
    for i in range(1, big_uses):
        m.handle(arrive(f"b{i}", "big"), 3.0 + i)
        m.handle(done(f"b{i}"), 3.0 + i)
    last = 3.0 + max(0, big_uses - 1)
    return m.handle(Tick(), last + 2.0)


def test_a_lower_class_service_is_not_restored_at_an_interactive_ones_expense() -> None:
    m = manager(
        service("cam", profile=big(3), cls=BG),
        service("big", profile=big(9), residency=Residency.ON_DEMAND, ttl_s=300.0),
        knobs=PolicyKnobs(safety_factor=1.0),
    )
    up(m, "cam")
    for i in range(6):
        m.handle(arrive(f"f{i}", "cam"), 0.1 + i * 0.01)
        m.handle(done(f"f{i}"), 0.1 + i * 0.01)
    m.handle(arrive("b0", "big"), 1.0)  # evicts the camera model
    m.handle(Unloaded(service="cam"), 2.0)
    m.handle(loaded("big"), 3.0)
    m.handle(done("b0"), 3.0)
    assert unloads(m.handle(Tick(), 5.0)) == []


def test_a_displaced_warm_service_used_more_often_is_restored_at_once() -> None:
    assert [u.service for u in unloads(_restore_case(warm_uses=6, big_uses=1))] == ["big"]


def test_an_on_demand_service_used_more_often_than_what_it_displaced_keeps_its_place() -> None:
    assert unloads(_restore_case(warm_uses=1, big_uses=6)) == []


# ---- explanation ------------------------------------------------------------------------------
def test_every_action_of_a_mixed_scenario_carries_a_reason() -> None:
    m = manager(
        service("asr", cls=RT, residency=Residency.PINNED, profile=big(0.5, 0.1)),
        chat(profile=llm_profile(weights=5 * GIB, kv_floor=512 * MIB, kv_ceiling=2 * GIB)),
        service("img", residency=Residency.ON_DEMAND, profile=big(6, 1)),
        service("emb", cls=BA, profile=big(1, 1), windows=NIGHT),
    )
    actions = m.start(0.0)
    actions += m.handle(loaded("asr"), 1.0)
    actions += m.handle(arrive("c1", "chat", kv_tokens=3000), 2.0)
    actions += m.handle(loaded("chat"), 5.0)
    actions += m.handle(arrive("i1", "img", units=1.0), 6.0)
    actions += m.handle(arrive("e1", "emb"), 6.5)
    actions += m.handle(done("c1", peak=700 * MIB), 8.0)
    actions += m.handle(Tick(), 9.0)
    for name in ("chat", "emb"):
        actions += m.handle(Unloaded(service=name), 9.5)
    actions += m.handle(loaded("img"), 12.0)
    actions += m.handle(Tick(), 1000.0)
    assert len(actions) > 5
    assert all(isinstance(a.reason, Reason) and a.reason.value for a in actions)
    logged = [d.as_dict() for d in m.log]
    assert all(isinstance(d["reason"], str) and d["reason"] for d in logged)
    assert sum(m.counts.values()) == len(actions)
    explained = m.explain("i1")
    assert explained is not None
    assert len(explained) >= 2


def _voice_chain_beside_idle_chat(knobs: PolicyKnobs) -> Manager:
    """ASR needs 2 GiB with 1 GiB free; the idle TTS (the next step of its chain) and
    the idle chat model each cover the shortfall, and the TTS reloads for less."""
    m = manager(
        service("asr", cls=RT, profile=big(1, 2)),
        service("tts", cls=RT, profile=big(1, 0.1), ttl_s=10.0),
        service("chat", profile=big(6, 0.1)),
        service("pin", profile=big(2.5, 0.1), residency=Residency.PINNED),
        knobs=knobs,
    )
    up(m, "pin", "chat", "asr", "tts")
    m.ops.observe_load_seconds(m.world.services["chat"], 60.0)  # a slow reload
    return m


def test_a_realtime_request_evicts_a_lower_class_before_its_own() -> None:
    m = _voice_chain_beside_idle_chat(EXACT)
    out = m.handle(arrive("a1", "asr"), 1.0)
    assert [u.service for u in unloads(out)] == ["chat"]
    assert enqueued(out)["a1"].reason is Reason.NO_MEMORY
    # the TTS stays for the rest of the chain, past its TTL too (only realtime evicts it)
    out = m.handle(Tick(), 20.0)
    assert unloads(out) == [] and "a1" in m.world.waiting
    assert m.world.services["tts"].status is ServiceStatus.LOADED


def test_without_lower_class_first_the_cheapest_victim_goes_whatever_its_class() -> None:
    m = _voice_chain_beside_idle_chat(replace(EXACT, disabled=frozenset({"lower_class_first"})))
    assert [u.service for u in unloads(m.handle(arrive("a1", "asr"), 1.0))] == ["tts"]


def test_a_service_unloaded_by_its_ttl_is_not_prewarmed_back() -> None:
    # evicted once for an image job, later loaded again on demand, then idle past its TTL
    m = manager(
        service("code", profile=big(4), ttl_s=100.0),
        service("img", profile=big(9), residency=Residency.ON_DEMAND),
        knobs=replace(EXACT_TTL, prewarm=True),
    )
    up(m, "code")
    assert [u.service for u in unloads(m.handle(arrive("i1", "img"), 1.0))] == ["code"]
    m.handle(Unloaded(service="code"), 2.0)
    m.handle(loaded("img"), 3.0)
    m.handle(done("i1"), 4.0)
    for t in (10.0, 20.0, 30.0):  # code is used again: likely reused soon
        out = m.handle(arrive(f"c{t:.0f}", "code"), t)
        if unloads(out):
            m.handle(Unloaded(service="img"), t)
            m.handle(loaded("code"), t)
        m.handle(done(f"c{t:.0f}"), t + 0.5)
    assert m.world.services["code"].status is ServiceStatus.LOADED
    assert [u.reason for u in unloads(m.handle(Tick(), 131.0))] == [Reason.TTL_EXPIRED]
    assert loads(m.handle(Unloaded(service="code"), 132.0)) == []
    assert loads(m.handle(Tick(), 133.0)) == []


def _two_voice_models_and_chat(knobs: PolicyKnobs) -> Manager:
    """Two loaded voice models with 3 GiB activations each (a full reserve of 6 GiB) and
    9.5 GiB free: a 6 GiB chat load fits beside one activation, never beside both."""
    m = manager(
        service("asr", cls=RT, profile=big(1, 3)),
        service("tts", cls=RT, profile=big(1, 3)),
        chat(profile=big(5, 1)),
        knobs=knobs,
    )
    up(m, "asr", "tts")
    return m


def test_a_load_the_full_reserve_would_keep_out_for_good_leaves_one_activation_free() -> None:
    m = _two_voice_models_and_chat(EXACT)
    assert [a.service for a in loads(m.handle(arrive("c1", "chat"), 1.0))] == ["chat"]


def test_without_reserve_fallback_that_load_waits_for_memory() -> None:
    m = _two_voice_models_and_chat(replace(EXACT, disabled=frozenset({"reserve_fallback"})))
    out = m.handle(arrive("c1", "chat"), 1.0)
    assert loads(out) == []
    assert enqueued(out)["c1"].reason is Reason.NO_MEMORY


# ---- the background floor: batch never takes a steady (camera) service ---------------------
def _camera(steady: bool, profile: MemoryProfile) -> ServiceSpec:
    return replace(service("cam", cls=BG, profile=profile, kind=ServiceKind.DETECT), steady=steady)


def test_batch_never_evicts_a_steady_camera_service() -> None:
    def first_moves(steady: bool) -> tuple[list[str], Reason | None]:
        m = manager(
            _camera(steady, big(6)),
            service("idx", cls=BA, profile=big(7), kind=ServiceKind.EMBEDDINGS),
            knobs=EXACT,
        )
        up(m, "cam")
        out = m.handle(arrive("x1", "idx"), 1.0)
        waiting = enqueued(out).get("x1")
        return [u.service for u in unloads(out)], waiting.reason if waiting else None

    assert first_moves(steady=True) == ([], Reason.NO_MEMORY)
    assert first_moves(steady=False)[0] == ["cam"]  # "room for class batch"


@pytest.mark.parametrize(("cls", "steady", "stopped"), [
    (BA, True, []),  # the floor
    (BA, False, ["c1"]),
    (IA, True, ["c1"]),  # higher classes still take it
])  # fmt: skip
def test_a_steady_cameras_frames_are_stopped_only_for_higher_classes(
    cls: ServiceClass, steady: bool, stopped: list[str]
) -> None:
    m = manager(
        _camera(steady, big(1, 5)),
        service("other", cls=cls, profile=big(1, 5), kind=ServiceKind.EMBEDDINGS),
        knobs=EXACT,
    )
    up(m, "cam", "other")
    assert dispatched(m.handle(arrive("c1", "cam"), 1.0)) == ["c1"]
    out = m.handle(arrive("o1", "other"), 2.0)
    assert [p.request_id for p in of(Preempt, out)] == stopped


def test_a_request_only_a_foreign_program_keeps_out_does_not_hold_lower_classes_back() -> None:
    def camera_moves(foreign_gib: float) -> tuple[list[str], Reason | None]:
        m = manager(
            service("chat", cls=IA, profile=big(6)),
            service("cam", cls=BG, profile=big(1, 1), kind=ServiceKind.DETECT),
            service("faces", cls=BG, profile=big(2), kind=ServiceKind.DETECT),
            knobs=EXACT,
        )
        up(m, "cam", "faces")
        # a game takes the memory: only the foreign program's leaving can make room for chat
        m.handle(MemorySampled(device="gpu", used_bytes=int(foreign_gib * GIB)), 0.5)
        assert enqueued(m.handle(arrive("i1", "chat"), 1.0))["i1"].reason is Reason.NO_MEMORY
        out = m.handle(arrive("c1", "cam"), 1.5)
        waiting = enqueued(out).get("c1")
        return [u.service for u in unloads(out)], waiting.reason if waiting else None

    # chat cannot fit beside the game whatever is evicted: the camera's frame makes its
    # own room (the idle face detector of its class goes) instead of waiting behind it
    assert camera_moves(8.0) == (["faces"], Reason.NO_MEMORY)  # waits for the unload
