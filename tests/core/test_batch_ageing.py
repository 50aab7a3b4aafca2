"""Opt-in: a batch request that has waited a share of its deadline may evict idle chat models.

Interactive models left warm (a TTL of ten minutes, used every minute or two) never
time out, and batch work may not evict them: a batch request whose load needs their
memory waits its whole deadline behind models that sit idle (generated ``home-0013``:
an indexing job did 30 % of its documents, where every baseline did all of them;
``home-0084``: both image jobs ran out their 120 s). With ``batch_age_fraction`` set, a
batch request ages once it has waited that share of its queue deadline
(``WorldOps.age``, told in its explanation): room for it may then evict an interactive
service that is idle with no request waiting, never one that is busy or has one
waiting, nor realtime or steady work. A restore of the evicted model (``restore``) does
not stop the aged request; it takes the memory back once the request is done. The
policy asks to be woken at the ageing time (``next_wakeup``), so that ageing never waits
for an unrelated event. Unset (the default), nothing ages: why is in
docs/architecture.md, "Batch ageing, opt-in".
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.events import LoadFinished, Tick, Unloaded
from accelmux.core.manager import Manager
from accelmux.core.specs import PolicyKnobs
from accelmux.core.types import GIB, Reason, Residency, ServiceClass

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    loads,
    manager,
    plain_profile,
    service,
    unloads,
    up,
)

#: The image job's queue deadline; it ages at a quarter of it.
DEADLINE_S = 120.0
AGES_AFTER_S = 0.25 * DEADLINE_S


#: EXACT with batch ageing on, at a quarter of the deadline.
AGEING = dataclasses.replace(EXACT, batch_age_fraction=0.25)


def _home(knobs: PolicyKnobs = AGEING) -> Manager:
    """Two 3 GiB chat models left warm on a 7.5 GiB device: a 3 GiB image job fits only
    where one of them was."""
    chat = service("chat", profile=plain_profile(weights=3 * GIB))
    code = service("code", profile=plain_profile(weights=3 * GIB))
    image = service(
        "image",
        cls=ServiceClass.BATCH,
        residency=Residency.ON_DEMAND,
        profile=plain_profile(weights=3 * GIB),
        deadline_s=DEADLINE_S,
    )
    return manager(chat, code, image, devices=(device(budget=8 * GIB),), knobs=knobs)


def test_an_image_job_evicts_an_idle_chat_model_once_it_has_aged() -> None:
    m = _home()
    up(m, "chat", "code")
    wait = enqueued(m.handle(arrive("img", "image", units=1.0), 1.0))["img"]
    assert wait.reason is Reason.NO_MEMORY
    # before it ages, the idle chat models stay: nothing is unloaded for it
    assert unloads(m.handle(Tick(), 1.0 + AGES_AFTER_S - 1.0)) == []
    # the policy asks to be woken when it ages
    assert m.next_wakeup(1.0 + AGES_AFTER_S - 1.0) == 1.0 + AGES_AFTER_S
    acts = m.handle(Tick(), 1.0 + AGES_AFTER_S)
    (gone,) = unloads(acts)
    assert gone.service in ("chat", "code")
    assert gone.reason is Reason.EVICTED_FOR_MEMORY
    assert "of its deadline behind this idle model" in gone.detail
    request = m.world.waiting["img"]
    assert request.aged
    assert any("aged: waited 30.0 s" in line for line in request.explain)


def test_a_chat_model_with_a_request_waiting_or_running_is_not_evicted_for_it() -> None:
    m = _home()
    up(m, "chat", "code")
    assert dispatched(m.handle(arrive("c1", "chat"), 0.5)) == ["c1"]
    assert dispatched(m.handle(arrive("k1", "code"), 0.6)) == ["k1"]
    enqueued(m.handle(arrive("img", "image", units=1.0), 1.0))
    # aged, but both models are busy: it keeps waiting
    assert unloads(m.handle(Tick(), 1.0 + AGES_AFTER_S)) == []
    assert m.world.waiting["img"].aged
    # one ends: batch work still yields to the chat request running on the device
    assert unloads(m.handle(done("k1"), 40.0)) == []
    # both idle, nothing waiting for either: one of them goes for it
    (gone,) = unloads(m.handle(done("c1"), 41.0))
    assert gone.service in ("chat", "code")


def test_a_restore_does_not_stop_the_aged_job_it_waits_until_it_ends() -> None:
    knobs = dataclasses.replace(AGEING, prewarm=True)
    m = _home(knobs)
    up(m, "chat", "code")
    enqueued(m.handle(arrive("img", "image", units=1.0), 1.0))
    (gone,) = unloads(m.handle(Tick(), 1.0 + AGES_AFTER_S))
    acts = m.handle(Unloaded(service=gone.service), 31.5)
    assert [a.service for a in loads(acts)] == ["image"]
    assert dispatched(m.handle(LoadFinished(service="image"), 33.0)) == ["img"]
    # the image job runs: the evicted model's restore does not stop it
    for t in (34.0, 40.0, 60.0):
        acts = m.handle(Tick(), t)
        assert not any(getattr(a, "request_id", None) == "img" for a in acts)
    assert "img" in m.world.services["image"].inflight


def test_by_default_nothing_ages_it_waits_out_its_deadline() -> None:
    m = _home(EXACT)
    up(m, "chat", "code")
    enqueued(m.handle(arrive("img", "image", units=1.0), 1.0))
    for t in (1.0 + AGES_AFTER_S, 60.0, 100.0):
        assert unloads(m.handle(Tick(), t)) == []
    assert not m.world.waiting["img"].aged


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["chat", "code", "image", "done", "tick"]), st.integers(0, 7)),
        min_size=1,
        max_size=30,
    )
)
def test_only_aged_batch_work_evicts_an_interactive_model_and_only_an_idle_one(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever arrives and ends, in any order and at any pace: an interactive model is
    evicted for batch work only for a request that has waited past its ageing point, and
    only while no request of its own runs or waits."""
    m = _home()
    up(m, "chat", "code")
    running: set[str] = set()
    now = 1.0
    for i, (what, pick) in enumerate(steps):
        now += 2.0 + 3.0 * pick
        if what == "done":
            if not running:
                continue
            rid = sorted(running)[pick % len(running)]
            running.discard(rid)
            acts = m.handle(done(rid), now)
        elif what == "tick":
            acts = m.handle(Tick(), now)
        else:
            acts = m.handle(arrive(f"{what}-{i}", what, units=1.0), now)
        pending = [acts]
        while pending:
            acts = pending.pop()
            waiting = m.world.waiting
            for a in unloads(acts):
                if a.service in ("chat", "code") and a.detail.startswith("room for class batch"):
                    svc = m.world.services[a.service]
                    assert not svc.inflight and svc.waiting_count == 0
                    assert any(r.service == "image" and r.aged for r in waiting.values()), (
                        "an interactive model went for no aged batch request"
                    )
            for a in unloads(acts):
                pending.append(m.handle(Unloaded(service=a.service), now))
            for a in loads(acts):
                pending.append(m.handle(LoadFinished(service=a.service), now))
        running = {rid for s in m.world.services.values() for rid in s.inflight}
