"""What the accelmux policy learns per service (charges, high waters, realtime peaks) is
kept in the World (``World.learned``), shown in the snapshot and named in explanations."""

from __future__ import annotations

from accelmux.core.events import MemorySampled
from accelmux.core.learned import Learned
from accelmux.core.manager import Manager
from accelmux.core.specs import DeviceSpec
from accelmux.core.types import GIB, MIB, Reason, Residency, ServiceClass

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    manager,
    plain_profile,
    service,
    up,
)


def _row(m: Manager, name: str) -> dict[str, object]:
    rows = m.snapshot().as_dict()["services"]
    return next(s for s in rows if s["name"] == name)


def _measured(m: Manager, name: str, above: int, now: float) -> None:
    """A sample that measures ``name`` ``above`` bytes above what is accounted to it."""
    held = m.world.ledger.service_total("gpu", name) + above
    m.handle(MemorySampled(device="gpu", used_bytes=held, per_service={name: held}), now)


def test_nothing_learned_shows_as_null() -> None:
    m = manager(service("a"), knobs=EXACT)
    up(m, "a")
    assert m.world.learned == Learned()
    row = _row(m, "a")
    assert row["charged_bytes"] is None
    assert row["high_water_bytes"] is None
    assert row["realtime_peak_bytes"] is None


def test_a_service_measured_above_its_leases_is_charged_in_the_world_and_the_snapshot() -> None:
    m = manager(service("a", concurrency=2), knobs=EXACT)
    up(m, "a")
    assert dispatched(m.handle(arrive("a1", "a"), 1.0)) == ["a1"]
    lease = m.world.inflight["a1"].active_lease
    assert lease is not None
    _measured(m, "a", 500 * MIB, 2.0)

    learned = m.world.learned
    assert learned.charged == {"a": 500 * MIB}
    assert learned.high_water == {"a": lease.nbytes + 500 * MIB}
    row = _row(m, "a")
    assert row["charged_bytes"] == 500 * MIB
    assert row["high_water_bytes"] == lease.nbytes + 500 * MIB
    assert row["realtime_peak_bytes"] is None

    # the charge keeps a second request waiting, and its explanation names the bytes
    out = m.handle(arrive("a2", "a"), 3.0)
    assert enqueued(out)["a2"].detail == "uses more than its leases: one at a time"
    story = m.explain("a2")
    assert story is not None
    assert any(line.endswith(f"a measured {500 * MIB} B above its leases") for line in story)

    # measured within its leases with nothing running: the charge is lifted
    assert dispatched(m.handle(done("a1"), 4.0)) == ["a2"]
    m.handle(done("a2"), 5.0)
    _measured(m, "a", 0, 6.0)
    assert "a" not in m.world.learned.charged
    assert _row(m, "a")["charged_bytes"] is None


def _voice_and_image(image_workspace: int) -> Manager:
    """A 3.5 GiB device with a pinned realtime voice service whose requests may take
    more than its workspace estimate (0.5 GiB), and an interactive image service."""
    gpu: DeviceSpec = device(budget=4 * GIB, headroom=GIB // 2)
    voice = service(
        "voice",
        cls=ServiceClass.REALTIME,
        residency=Residency.PINNED,
        profile=plain_profile(weights=GIB, workspace=GIB // 2, per_unit=GIB / 2),
    )
    img = service("img", profile=plain_profile(weights=GIB, workspace=image_workspace))
    return manager(voice, img, devices=(gpu,), knobs=EXACT)


def test_a_realtime_peak_is_in_the_world_the_snapshot_and_the_reserve_explanation() -> None:
    m = _voice_and_image(GIB * 7 // 10)
    up(m, "voice", "img")  # img loads beside the 0.5 GiB voice was estimated to need
    assert m.world.learned.realtime_peak == {"voice": GIB // 2}
    assert dispatched(m.handle(arrive("v1", "voice", units=1.0), 1.0)) == ["v1"]
    m.handle(done("v1"), 2.0)

    assert m.world.learned.realtime_peak == {"voice": GIB}
    assert m.world.learned.realtime_peak_changes == 2
    assert _row(m, "voice")["realtime_peak_bytes"] == GIB
    assert _row(m, "img")["realtime_peak_bytes"] is None

    # 1.5 GiB free: img's 0.7 GiB fits, but not beside the 1 GiB now kept for voice
    out = m.handle(arrive("i1", "img"), 3.0)
    assert enqueued(out)["i1"].reason is Reason.NO_MEMORY
    _told_the_learned_peak(m, "i1")


def test_a_load_waiting_for_the_realtime_reserve_is_told_which_peak_sized_it() -> None:
    m = _voice_and_image(GIB * 6 // 5)
    up(m, "voice")
    assert dispatched(m.handle(arrive("v1", "voice", units=1.0), 1.0)) == ["v1"]
    m.handle(done("v1"), 2.0)

    # 2.5 GiB free: img's load and request (2.2 GiB) fit, but not beside voice's 1 GiB
    out = m.handle(arrive("i1", "img"), 3.0)
    assert enqueued(out)["i1"].reason is Reason.NO_MEMORY
    _told_the_learned_peak(m, "i1")


def _told_the_learned_peak(m: Manager, request_id: str) -> None:
    """``request_id``'s last explanation names voice's learned peak as the reserve."""
    story = m.explain(request_id)
    assert story is not None
    assert story[-1].endswith(
        f"kept {GIB} B free for realtime work: voice 1 x {GIB} B (learned peak)"
    )
