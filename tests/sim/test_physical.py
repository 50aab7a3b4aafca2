"""The physical device: true memory, allocator caches, foreign processes, OOMs."""

from __future__ import annotations

import math

from accelmux.core.types import GIB, MIB
from accelmux.sim.compute import ComputeDevice, Job, solo_work
from accelmux.sim.physical import OomEvent, PhysicalDevice


def test_load_that_crosses_capacity_is_refused_and_allocates_nothing() -> None:
    dev = PhysicalDevice("gpu", 4 * GIB)
    assert dev.load("a", 3 * GIB, 0, caching=False)
    assert not dev.load("b", 2 * GIB, 0, caching=False)
    assert dev.used == 3 * GIB
    assert "b" not in dev.services


def test_request_peak_that_crosses_capacity_is_an_oom() -> None:
    dev = PhysicalDevice("gpu", 4 * GIB)
    dev.load("a", 3 * GIB, 512 * MIB, caching=False)
    assert dev.start_request("a", "r1", 256 * MIB)
    assert not dev.start_request("a", "r2", 512 * MIB)
    assert dev.used == 3 * GIB + 768 * MIB
    dev.end_request("a", "r1")
    assert dev.used == 3 * GIB + 512 * MIB
    assert dev.free("a") == 3 * GIB + 512 * MIB
    assert dev.used == 0


def test_caching_allocator_keeps_its_high_water_mark_until_unload() -> None:
    dev = PhysicalDevice("gpu", 8 * GIB)
    dev.load("img", 4 * GIB, 0, caching=True)
    dev.start_request("img", "r1", 2 * GIB)
    dev.end_request("img", "r1")
    assert dev.used == 6 * GIB
    assert dev.services["img"].reserved == 2 * GIB
    # The next request reuses the cache: no new memory.
    assert dev.start_request("img", "r2", GIB)
    assert dev.used == 6 * GIB
    dev.end_request("img", "r2")
    dev.free("img")
    assert dev.used == 0


def test_a_free_only_foreign_process_gets_only_what_is_free() -> None:
    dev = PhysicalDevice("gpu", 4 * GIB)
    dev.load("a", 3 * GIB, 0, caching=False)
    assert dev.set_foreign("x", 2 * GIB, free_only=True) == GIB
    assert dev.used == 4 * GIB
    assert dev.set_foreign("x", 0) == 0
    assert dev.used == 3 * GIB


def _oom(dev: PhysicalDevice, asked: int) -> OomEvent:
    return OomEvent(
        time=0.0,
        device=dev.name,
        service="s",
        what="request",
        asked=asked,
        used=dev.used,
        capacity=dev.capacity,
        unseen_foreign=dev.unseen_foreign,
    )


def test_an_oom_from_foreign_memory_no_sample_showed_is_told_apart() -> None:
    dev = PhysicalDevice("gpu", 10 * GIB)
    assert dev.load("s", 5 * GIB, 0, caching=False)
    dev.set_foreign("game", 4 * GIB)  # after the last sample: nobody was told
    assert not dev.start_request("s", "r1", 2 * GIB)
    assert _oom(dev, 2 * GIB).foreign_surge  # it would have fitted without the game
    dev.foreign_seen = dev.foreign_total  # the next sample shows the game
    assert not _oom(dev, 2 * GIB).foreign_surge  # from now on the policy knew


def test_an_oom_the_policy_caused_is_not_blamed_on_foreign_memory() -> None:
    dev = PhysicalDevice("gpu", 10 * GIB)
    assert dev.load("s", 5 * GIB, 0, caching=False)
    dev.set_foreign("game", 1 * GIB)  # unseen, but not what broke the allocation
    assert not dev.start_request("s", "r1", 6 * GIB)
    assert not _oom(dev, 6 * GIB).foreign_surge  # 5 + 6 > 10 even without the game
    dev.set_foreign("game", 0)
    assert dev.unseen_foreign == 0  # foreign memory that shrank hides nothing


def test_resize_growth_can_oom() -> None:
    dev = PhysicalDevice("gpu", 4 * GIB)
    dev.load("llm", 3 * GIB, 256 * MIB, caching=False)
    assert dev.resize("llm", 512 * MIB)
    assert not dev.resize("llm", 2 * GIB)
    assert dev.services["llm"].kv_pool == 512 * MIB


def test_infinite_device_never_ooms() -> None:
    dev = PhysicalDevice("gpu", math.inf)
    assert dev.load("a", 100 * GIB, 0, caching=False)
    assert dev.set_foreign("x", 50 * GIB) == 50 * GIB


def test_processor_sharing_slows_everyone_when_shares_exceed_one() -> None:
    comp = ComputeDevice("gpu")
    comp.add(Job(rid="a", service="s", share=1.0, work=2.0, prefill=0.0, started_at=0.0), 0.0)
    assert comp.next_completion() == 2.0
    comp.add(Job(rid="b", service="t", share=1.0, work=1.0, prefill=0.0, started_at=0.0), 0.0)
    # both at half speed: b ends at 2.0, then a runs alone for its last second
    assert comp.next_completion() == 2.0
    done = comp.finished(2.0)
    assert [j.rid for j in done] == ["b"]
    assert math.isclose(comp.next_completion() or 0.0, 3.0)


def test_small_shares_do_not_interfere() -> None:
    comp = ComputeDevice("gpu")
    comp.add(Job(rid="a", service="s", share=0.4, work=1.0, prefill=0.0, started_at=0.0), 0.0)
    comp.add(Job(rid="b", service="t", share=0.5, work=1.0, prefill=0.0, started_at=0.0), 0.0)
    assert comp.next_completion() == 1.0


def test_first_token_time_follows_prefill_progress() -> None:
    work, prefill = solo_work(
        is_llm=True,
        base_s=0.0,
        per_unit_s=0.0,
        prefill_tps=1000.0,
        tbt_s=0.01,
        units=0.0,
        prompt_tokens=1000,
        output_tokens=100,
    )
    assert (work, prefill) == (2.0, 1.0)
    comp = ComputeDevice("gpu")
    comp.add(Job(rid="llm", service="c", share=0.5, work=work, prefill=prefill, started_at=0), 0)
    comp.add(Job(rid="img", service="i", share=1.0, work=10.0, prefill=0.0, started_at=0), 0)
    comp.advance(2.0)
    job = comp.jobs["llm"]
    assert job.first_token_at is not None
    assert math.isclose(job.first_token_at, 1.5)


def test_isolated_device_has_no_contention() -> None:
    comp = ComputeDevice("gpu", isolated=True)
    for rid in ("a", "b", "c"):
        comp.add(Job(rid=rid, service=rid, share=1.0, work=1.0, prefill=0, started_at=0), 0)
    assert comp.next_completion() == 1.0
