"""Resizes are acknowledged, and the policy uses only what a backend declares it can do.

Until the backend answers a Resize, the ledger holds the larger of the old and new KV
pools and requests are admitted only into the smaller; a refused resize leaves the old
pool. A pool that changes only at the next load is never resized live: a request too
large for it reloads the service with a larger pool.
"""

from __future__ import annotations

from accelmux.core.actions import Resize, Unload
from accelmux.core.events import BackendCrashed, Unloaded
from accelmux.core.specs import Capabilities, MemoryProfile, ServiceSpec
from accelmux.core.types import GIB, MIB, Reason, ResizeSupport, ServiceKind

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    llm_profile,
    loaded,
    loads,
    manager,
    of,
    resized,
    service,
    up,
)

TOKENS_PER_GIB = GIB // (128 * 1024)
POOL = llm_profile(weights=4 * GIB, kv_floor=512 * MIB, kv_ceiling=4 * GIB)


def chat(
    resize: ResizeSupport = ResizeSupport.LIVE,
    *,
    request_peaks: bool = True,
    profile: MemoryProfile = POOL,
) -> ServiceSpec:
    spec = service("chat", kind=ServiceKind.CHAT, profile=profile, concurrency=4)
    caps = Capabilities(resize=resize, request_peaks=request_peaks)
    return ServiceSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "capabilities": caps})


def test_a_growth_is_held_in_the_ledger_but_not_used_until_confirmed() -> None:
    m = manager(chat(), knobs=EXACT)
    up(m, "chat")
    svc = m.world.services["chat"]
    out = m.handle(arrive("c1", "chat", kv_tokens=2 * TOKENS_PER_GIB), 1.0)
    (r,) = of(Resize, out)
    assert r.kv_pool_bytes == 2 * GIB
    assert svc.kv_pool == 2 * GIB  # the ledger holds the larger pool at once
    assert svc.kv_usable == 512 * MIB  # requests get only what the backend has
    # Later requests do not take the KV the growth is for, and a second growth waits
    # for the answer to the first.
    out = m.handle(arrive("c2", "chat", kv_tokens=TOKENS_PER_GIB // 4), 1.0)
    out += m.handle(arrive("c3", "chat", kv_tokens=TOKENS_PER_GIB), 1.0)
    assert of(Resize, out) == [] and dispatched(out) == []
    assert {enqueued(out)[r].reason for r in ("c2", "c3")} == {Reason.RESIZING}
    out = m.handle(resized("chat", 2 * GIB), 1.2)
    assert svc.kv_usable >= 2 * GIB
    started = dispatched(out)
    # Each later request gets its growth in turn, in arrival order.
    answers = 0
    while of(Resize, out) and answers < 5:
        answers += 1
        (r,) = of(Resize, out)
        out = m.handle(resized("chat", r.kv_pool_bytes), 1.3)
        started += dispatched(out)
    assert started == ["c1", "c2", "c3"]
    assert svc.kv_usable == svc.kv_pool


def test_a_refused_growth_returns_the_pool_and_later_reloads_it_larger() -> None:
    m = manager(chat(), knobs=EXACT)
    up(m, "chat")
    svc = m.world.services["chat"]
    m.handle(arrive("c1", "chat", kv_tokens=2 * TOKENS_PER_GIB), 1.0)
    out = m.handle(resized("chat", 2 * GIB, ok=False), 1.1)
    assert svc.kv_pool == 512 * MIB and svc.resize_failures == 1
    # No second live attempt: the idle service is reloaded with a pool that holds c1.
    assert of(Resize, out) == []
    (u,) = of(Unload, out)
    assert u.reason is Reason.RESIZE_AT_NEXT_LOAD
    out = m.handle(Unloaded(service="chat"), 1.2)
    (ld,) = loads(out)
    assert ld.kv_pool_bytes >= 2 * GIB  # sized at load from now on, like a next_load pool
    assert dispatched(m.handle(loaded("chat"), 1.5)) == ["c1"]
    assert svc.evictions == 0  # a reload to resize is not an eviction
    # The refusal was about the load before: this load may resize live again.
    assert svc.resize_refused is False and m.world.resizable(svc)


def test_a_shrink_frees_memory_only_once_confirmed() -> None:
    m = manager(chat(), service("img", profile=MemoryProfile(weights=5 * GIB)), knobs=EXACT)
    up(m, "chat")
    m.handle(arrive("c1", "chat", kv_tokens=4 * TOKENS_PER_GIB), 1.0)
    m.handle(resized("chat", 4 * GIB), 1.0)
    m.handle(done("c1"), 2.0)
    svc = m.world.services["chat"]
    ledger = m.world.ledger
    out = m.handle(arrive("i1", "img"), 3.0)
    (r,) = of(Resize, out)
    assert (r.kv_pool_bytes, r.reason) == (512 * MIB, Reason.BALLOON_SHRINK)
    assert loads(out) == []
    assert svc.kv_pool == 4 * GIB and svc.kv_usable == 512 * MIB
    before = ledger.available("gpu")
    # Other events before the answer issue no second shrink and no eviction.
    out = m.handle(arrive("c2", "chat", kv_tokens=TOKENS_PER_GIB // 8), 3.1)
    assert of(Resize, out) == [] and of(Unload, out) == []
    assert ledger.available("gpu") <= before
    out = m.handle(resized("chat", 512 * MIB), 3.2)
    assert svc.kv_pool == 512 * MIB
    assert [a.service for a in loads(out)] == ["img"]


def test_a_crash_while_resizing_drops_the_pending_resize() -> None:
    m = manager(chat(), knobs=EXACT)
    up(m, "chat")
    m.handle(arrive("c1", "chat", kv_tokens=2 * TOKENS_PER_GIB), 1.0)
    m.handle(BackendCrashed(service="chat", error="boom"), 1.1)
    svc = m.world.services["chat"]
    assert not svc.resizing and svc.kv_pool == 0
    assert m.world.ledger.service_total("gpu", "chat") == 0
    m.handle(resized("chat", 2 * GIB), 1.2)  # a late answer changes nothing
    assert m.world.ledger.service_total("gpu", "chat") == 0


def test_a_pool_fixed_until_the_next_load_is_never_resized_live() -> None:
    m = manager(chat(ResizeSupport.NEXT_LOAD), devices=(device(budget=8 * GIB),), knobs=EXACT)
    out = up(m, "chat")
    svc = m.world.services["chat"]
    # Sized at load for what fits beyond the spare fraction, since it cannot grow later.
    (ld,) = loads(out)
    assert 512 * MIB < ld.kv_pool_bytes <= 4 * GIB
    assert svc.kv_pool == ld.kv_pool_bytes
    big = svc.kv_pool // (128 * 1024) + TOKENS_PER_GIB // 4
    assert big * 128 * 1024 <= 4 * GIB
    out = m.handle(arrive("c1", "chat", kv_tokens=big), 1.0)
    assert of(Resize, out) == []
    (u,) = of(Unload, out)
    assert u.reason is Reason.RESIZE_AT_NEXT_LOAD
    (ld,) = loads(m.handle(Unloaded(service="chat"), 1.1))
    assert ld.kv_pool_bytes >= big * 128 * 1024
    assert dispatched(m.handle(loaded("chat"), 1.5)) == ["c1"]
    m.handle(done("c1"), 2.0)
    assert of(Resize, m.handle(arrive("x", "chat"), 500.0)) == []  # no ballooning either


def test_a_busy_fixed_pool_waits_instead_of_reloading() -> None:
    m = manager(chat(ResizeSupport.NEXT_LOAD), devices=(device(budget=8 * GIB),), knobs=EXACT)
    up(m, "chat")
    svc = m.world.services["chat"]
    assert dispatched(m.handle(arrive("c1", "chat", kv_tokens=TOKENS_PER_GIB // 4), 1.0)) == ["c1"]
    big = svc.kv_pool // (128 * 1024) + 1
    out = m.handle(arrive("c2", "chat", kv_tokens=big), 1.1)
    assert of(Unload, out) == [] and of(Resize, out) == []
    assert enqueued(out)["c2"].reason is Reason.CONCURRENCY_LIMIT
    (u,) = of(Unload, m.handle(done("c1"), 2.0))
    assert u.reason is Reason.RESIZE_AT_NEXT_LOAD


def test_a_backend_that_cannot_resize_holds_its_ceiling() -> None:
    m = manager(chat(ResizeSupport.NONE), knobs=EXACT)
    (ld,) = loads(up(m, "chat"))
    assert ld.kv_pool_bytes == 4 * GIB
    out = m.handle(arrive("c1", "chat", kv_tokens=3 * TOKENS_PER_GIB), 1.0)
    assert of(Resize, out) == [] and dispatched(out) == ["c1"]


def test_peaks_calibrate_only_a_backend_that_declares_them() -> None:
    def lease_after_big_peak(request_peaks: bool) -> int:
        profile = llm_profile(weights=GIB, kv_floor=0, kv_ceiling=GIB, workspace=100 * MIB)
        m = manager(chat(request_peaks=request_peaks, profile=profile), knobs=EXACT)
        up(m, "chat")
        m.handle(arrive("c1", "chat"), 1.0)
        m.handle(done("c1", peak=400 * MIB), 2.0)
        (d,) = [a for a in m.handle(arrive("c2", "chat"), 3.0) if a.request_id == "c2"]
        return int(getattr(d, "lease_bytes", 0))

    assert lease_after_big_peak(True) > lease_after_big_peak(False) == 100 * MIB
