"""Learning from an out-of-memory failure cannot lock a service out.

An OOM is attributed before anything is learned (``accelmux.core.oom``): the device was
full (the service asked no more than it was granted), or the service exceeded its own
estimate. Only the latter changes the service's size, by what was measured, never past
what the device could ever hold, and (a bound or an assumption) until a re-test; a
request whose estimate fits the device is never rejected ``too_large``. These tests fail
on the policy before the attribution: one OOM on a full device taught the service twice
its grant and every later request was refused ``too_large`` for the rest of the run.
"""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from accelmux.core.events import BackendCrashed, LoadFailed, LoadFinished, Tick
from accelmux.core.manager import Manager
from accelmux.core.oom import RETEST_MAX_S, RETEST_S, OomCause, attribute, retest_after
from accelmux.core.specs import MemoryProfile
from accelmux.core.types import GIB, MIB, Reason

from .support import EXACT, arrive, device, dispatched, done, loads, manager, rejected, service

# ---- the attribution itself -----------------------------------------------------------------


def test_a_load_within_its_grant_on_a_full_device_teaches_nothing() -> None:
    # the case: 6.0 GB asked, 7.7 GB in use on a 12 GiB device, estimate right
    r = attribute(
        asked=6_000_000_000,
        granted=6_000_000_000,
        used_besides=7_700_000_000,
        capacity=12 * GIB,
        ceiling=11 * GIB,
    )
    assert r.cause is OomCause.DEVICE_FULL and r.learned is None
    assert "within its grant" in r.evidence


def test_a_load_above_its_grant_learns_what_it_asked() -> None:
    r = attribute(
        asked=5 * GIB, granted=3 * GIB, used_besides=8 * GIB, capacity=12 * GIB, ceiling=11 * GIB
    )
    assert r.cause is OomCause.OWN_ESTIMATE and r.learned == 5 * GIB


def test_room_measured_but_not_what_it_asked() -> None:
    # the device had less room than granted: something else took it
    full = attribute(
        asked=None, granted=4 * GIB, used_besides=9 * GIB, capacity=12 * GIB, ceiling=11 * GIB
    )
    assert full.cause is OomCause.DEVICE_FULL and full.learned is None
    # the room was there: it asked more than the room it found (and at least twice its grant)
    own = attribute(
        asked=None, granted=2 * GIB, used_besides=7 * GIB, capacity=12 * GIB, ceiling=11 * GIB
    )
    assert own.cause is OomCause.OWN_ESTIMATE and own.learned == 5 * GIB + 1


def test_nothing_measured_assumes_twice_the_grant_within_the_device() -> None:
    r = attribute(
        asked=None, granted=7 * GIB, used_besides=None, capacity=12 * GIB, ceiling=11 * GIB
    )
    assert r.cause is OomCause.UNMEASURED and r.learned == 11 * GIB


sizes = st.integers(0, 64 * GIB)


@given(asked=st.none() | sizes, granted=sizes, used=st.none() | sizes, cap=st.integers(1, 64 * GIB))
# a device sampled past its capacity, and a grant of nothing: the device was full
@example(asked=None, granted=0, used=GIB + 2, cap=1)
def test_what_is_learned_never_passes_the_device(
    asked: int | None, granted: int, used: int | None, cap: int
) -> None:
    r = attribute(asked=asked, granted=granted, used_besides=used, capacity=cap + GIB, ceiling=cap)
    assert r.learned is None or 0 <= r.learned <= cap
    if asked is not None:
        # only a service that asked more than it was granted is learned larger, by what it asked
        assert (r.learned is not None) == (asked > granted)
        assert r.learned is None or r.learned == min(cap, asked)
    elif used is not None:
        assert (r.cause is OomCause.DEVICE_FULL) == (cap + GIB - used < granted)


def test_a_re_test_waits_longer_after_each_failure_in_a_row() -> None:
    assert [retest_after(n) for n in (1, 2, 3)] == [RETEST_S, 2 * RETEST_S, 4 * RETEST_S]
    assert retest_after(30) == RETEST_MAX_S


# ---- in the Manager -------------------------------------------------------------------------


def _chat(weights: int = 6 * GIB, workspace: int = 64 * MIB) -> Manager:
    """A 12 GiB device with one service whose estimate fits it (``weights``)."""
    dev = device(budget=12 * GIB, headroom=GIB // 2)
    return manager(
        service("chat", profile=MemoryProfile(weights=weights, workspace=workspace)),
        devices=(dev,),
        knobs=EXACT,
    )


def test_one_oom_on_a_full_device_does_not_ban_the_service() -> None:
    m = _chat()
    (first,) = loads(m.handle(arrive("c1", "chat"), 0.0))
    m.handle(
        LoadFailed(
            service="chat",
            error="out of memory",
            out_of_memory=True,
            asked_bytes=first.weights_bytes,
            device_used_bytes=int(7.7e9),
        ),
        0.1,
    )
    assert m.world.learned.sizes == {}
    assert (m.world.learned.oom["chat"] or "").startswith("device_full")
    out = m.handle(arrive("c2", "chat"), 30.0) + m.handle(Tick(), 31.0)
    assert "c2" not in rejected(out)
    (second,) = loads(out)
    assert second.weights_bytes == first.weights_bytes  # nothing learned about its size


def test_a_service_above_its_estimate_learns_what_it_asked_and_says_so() -> None:
    m = _chat(weights=3 * GIB)
    loads(m.handle(arrive("c1", "chat"), 0.0))
    m.handle(
        LoadFailed(
            service="chat",
            error="out of memory",
            out_of_memory=True,
            asked_bytes=5 * GIB,
            device_used_bytes=8 * GIB,
        ),
        0.1,
    )
    size = m.world.learned.sizes["chat"]
    # what it asked was measured: a measurement, kept until a load measures it again
    assert size.nbytes == 5 * GIB and size.retest_at == math.inf
    row = next(s for s in m.snapshot().as_dict()["services"] if s["name"] == "chat")
    assert row["learned_size"]["bytes"] == 5 * GIB
    assert row["learned_size"]["evidence"] == size.evidence
    assert row["learned_size"]["retest_at"] is None
    out = m.handle(arrive("c2", "chat"), 30.0) + m.handle(Tick(), 31.0)
    (second,) = loads(out)
    assert second.weights_bytes == 5 * GIB
    story = m.explain("c2") or []
    assert any("learned to need" in line and "kept until a load" in line for line in story)
    # a load that measures it drops what the failure taught
    m.handle(LoadFinished(service="chat", weights_bytes=5 * GIB, runtime_bytes=0), 35.0)
    assert m.world.learned.sizes == {}


def test_a_learned_size_the_device_cannot_hold_refuses_until_its_re_test_then_is_re_tested() -> (
    None
):
    m = _chat(weights=7 * GIB)
    loads(m.handle(arrive("c1", "chat"), 0.0))
    # nothing measured: assumed twice its grant, which is more than the device can hold
    m.handle(LoadFailed(service="chat", error="out of memory", out_of_memory=True), 0.1)
    size = m.world.learned.sizes["chat"]
    assert size.nbytes <= m.world.devices["gpu"].usable_bytes
    out = m.handle(arrive("c2", "chat"), 60.0)
    refusal = rejected(out)["c2"]
    assert refusal.reason is Reason.LOAD_FAILED  # never too_large: its estimate fits
    assert "re-tested at t=300" in refusal.detail and refusal.retry_after_s >= 239
    # past the re-test one load is admitted at the size measured before the failure
    out = m.handle(Tick(), 301.0) + m.handle(arrive("c3", "chat"), 302.0)
    (retest,) = loads(out)
    assert retest.weights_bytes == 7 * GIB
    assert m.world.learned.sizes["chat"].testing
    # it fails again: learned again, and the next re-test waits twice as long
    m.handle(LoadFailed(service="chat", error="out of memory", out_of_memory=True), 303.0)
    again = m.world.learned.sizes["chat"]
    assert again.failures == 2 and again.retest_at == 303.0 + 2 * RETEST_S
    # ...a re-test that loads drops it
    m.handle(Tick(), again.retest_at)
    (retest,) = loads(m.handle(arrive("c4", "chat"), again.retest_at + 1))
    assert dispatched(m.handle(LoadFinished(service="chat"), again.retest_at + 2)) == ["c4"]
    assert m.world.learned.sizes == {}


def test_a_request_oom_within_its_lease_teaches_nothing_one_above_learns_its_ask() -> None:
    m = _chat(weights=2 * GIB, workspace=GIB)
    loads(m.handle(arrive("c1", "chat"), 0.0))
    m.handle(LoadFinished(service="chat"), 1.0)
    lease = m.world.inflight["c1"].active_lease
    assert lease is not None
    before = m.world.services["chat"].calibration.active.factor
    m.handle(
        BackendCrashed(
            service="chat",
            error="out of memory",
            out_of_memory=True,
            request_id="c1",
            asked_bytes=lease.nbytes,
            device_used_bytes=11 * GIB,
        ),
        2.0,
    )
    m.handle(Tick(), 2.1)
    assert m.world.services["chat"].calibration.active.factor == before
    assert (m.world.learned.oom["chat"] or "").startswith("device_full")
    loads(m.handle(Tick(), 10.0) + m.handle(arrive("c2", "chat"), 10.0))
    m.handle(LoadFinished(service="chat"), 11.0)
    m.handle(
        BackendCrashed(
            service="chat",
            error="out of memory",
            out_of_memory=True,
            request_id="c2",
            asked_bytes=3 * GIB,
            device_used_bytes=2 * GIB,
        ),
        12.0,
    )
    m.handle(Tick(), 12.1)
    cal = m.world.services["chat"].calibration.active
    assert cal.project_observed(GIB) == 3 * GIB


# ---- over random event sequences ------------------------------------------------------------

steps = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "load_ok", "load_oom", "done", "tick"]),
        st.none() | st.integers(0, 24).map(lambda n: n * GIB // 2),  # asked
        st.none() | st.integers(0, 24).map(lambda n: n * GIB // 2),  # used besides
        st.floats(0.1, 400.0),
    ),
    max_size=40,
)


def _taught(m: Manager) -> tuple[object, ...]:
    """What OOMs taught ``chat``: its resident ratios and its learned size's figures."""
    svc = m.world.services["chat"]
    size = m.world.learned.sizes.get("chat")
    learned = None if size is None else (size.nbytes, size.failures, size.at, size.evidence)
    return (svc.calibration.resident.observations, svc.calibration.resident.factor, learned)


@settings(max_examples=150, deadline=None)
@given(weights=st.integers(1, 10).map(lambda n: n * GIB), events=steps)
@example(
    weights=GIB,
    # a device-full failure of the reload at the learned size, at the moment its re-test
    # falls due: the re-test starts (the floor lifts) but the failure teaches nothing
    events=[
        ("arrive", None, None, 1.0),
        ("load_oom", None, None, 1.0),
        ("arrive", None, None, 286.0),
        ("load_oom", 0, None, 14.0),
    ],
)
def test_no_event_sequence_locks_a_fitting_service_out(
    weights: int, events: list[tuple[str, int | None, int | None, float]]
) -> None:
    """Whatever OOMs happen: a request whose estimate fits the device is never refused
    ``too_large``; a learned size never passes the device; a device-full OOM never
    changes the projection; and a size learned from a bound or an assumption is
    re-tested once its time has come."""
    m = _chat(weights=weights)
    usable = m.world.devices["gpu"].usable_bytes
    svc = m.world.services["chat"]
    now, n = 0.0, 0
    for kind, asked, used, dt in events:
        now += dt
        out = []
        if kind == "arrive":
            n += 1
            out = m.handle(arrive(f"c{n}", "chat"), now)
        elif kind == "tick":
            out = m.handle(Tick(), now)
        elif kind == "done" and m.world.inflight:
            rid = next(iter(m.world.inflight))
            out = m.handle(done(rid, m.world.inflight[rid].attempt), now)
        elif kind in ("load_ok", "load_oom") and svc.status.value == "loading":
            if kind == "load_ok":
                out = m.handle(LoadFinished(service="chat"), now)
            else:
                granted = svc.resident_bytes
                taught = _taught(m)
                out = m.handle(
                    LoadFailed(
                        service="chat",
                        error="out of memory",
                        out_of_memory=True,
                        asked_bytes=asked,
                        device_used_bytes=used,
                    ),
                    now,
                )
                if asked is not None and asked <= granted:
                    # the failure teaches nothing (a re-test may start in the same round)
                    assert _taught(m) == taught
        assert all(r.reason is not Reason.TOO_LARGE for r in rejected(out).values())
        for size in m.world.learned.sizes.values():
            assert size.nbytes <= usable
            # re-tested unless what it asked was measured (a measurement is kept)
            assert size.retest_at <= size.at + RETEST_MAX_S or (
                size.retest_at == math.inf and "asked" in size.evidence
            )
            if not size.testing and m.world.now == now:
                assert now < size.retest_at  # due ones start their re-test in a round
