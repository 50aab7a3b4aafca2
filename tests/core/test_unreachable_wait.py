"""A request whose room only a higher class's loaded services hold does not hold lower
classes back.

Room made for a class never evicts a service of a higher class (``Room.evictable``), so
while an idle realtime service stays loaded, an interactive load larger than what the
rest of the device could ever free waits for it to unload on its own. ``Room.reachable``
used to count that realtime service as memory within reach: the waiting interactive
request blocked its device (``higher_class_waiting``), and a background camera whose
frame needed an idle service of its own rank evicted could not run for as long as
interactive requests kept arriving (found by bench/adversary.py: cameras at 22 % where
every baseline but one gave 97 %). Now the memory higher classes hold at their KV floor
is out of the requester's reach, and the camera runs on what it may take.
"""

from __future__ import annotations

from dataclasses import replace

from accelmux.core.events import Unloaded
from accelmux.core.manager import Manager
from accelmux.core.types import GIB, MIB, Reason, ServiceClass, ServiceKind

from .support import (
    EXACT,
    arrive,
    device,
    dispatched,
    enqueued,
    manager,
    plain_profile,
    service,
    unloads,
    up,
)


def _home() -> Manager:
    voice = service(
        "voice", cls=ServiceClass.REALTIME, profile=plain_profile(weights=4 * GIB), deadline_s=10.0
    )
    chat = service("chat", profile=plain_profile(weights=5 * GIB), deadline_s=60.0)
    cam = replace(
        service(
            "cam",
            cls=ServiceClass.BACKGROUND,
            kind=ServiceKind.DETECT,
            profile=plain_profile(weights=256 * MIB, workspace=0, per_unit=GIB),
            deadline_s=1.0,
        ),
        steady=True,
    )
    idx = service(
        "idx",
        cls=ServiceClass.BATCH,
        kind=ServiceKind.EMBEDDINGS,
        profile=plain_profile(weights=2 * GIB, workspace=0),
    )
    return manager(
        voice, chat, cam, idx, devices=(device(budget=8 * GIB, headroom=0),), knobs=EXACT
    )


def test_a_wait_only_a_higher_class_could_end_does_not_hold_the_camera_back() -> None:
    m = _home()
    up(m, "voice", "cam", "idx")  # 4 + 0.25 + 2 GiB loaded, all idle; 1.75 GiB free
    chat = m.handle(arrive("c1", "chat"), 1.0)
    # 5 GiB: only evicting the realtime voice service would make room, which room made
    # for interactive work never does
    assert enqueued(chat)["c1"].reason is Reason.NO_MEMORY
    frame = m.handle(arrive("f1", "cam", units=2.0), 1.1)  # 2 GiB: idx must go
    assert enqueued(frame)["f1"].reason is Reason.NO_MEMORY  # not HIGHER_CLASS_WAITING
    assert [u.service for u in unloads(frame)] == ["idx"]
    assert dispatched(m.handle(Unloaded(service="idx"), 1.6)) == ["f1"]
    # the chat request still waits (until the voice service unloads or its deadline)
    assert "c1" in m.world.waiting
