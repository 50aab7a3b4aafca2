"""A realtime request that no other room could serve evicts idle pinned services.

Pinning sizes a device for the services it keeps. When a foreign program (a game, a
render) takes part of that memory, the pinned services still fit but the next voice
request's activations do not: the policy refused it ``no_memory`` at once while the other
steps of the voice chain sat idle, and kept refusing every voice request for as long as
the game ran (found by bench/adversary.py: realtime 38.9 % where llama-swap, which loads
one model at a time, gave 80.8 % and left the game less short of memory). Now such a
request evicts idle pinned services as a last resort, lower classes first, and they are
reloaded when room returns; a restore of a pinned service never evicts another, and
work below realtime never evicts a pinned service.
"""

from __future__ import annotations

from dataclasses import replace

from accelmux.core.events import MemorySampled, Unloaded
from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux.room import UNSERVED_S
from accelmux.core.specs import PolicyKnobs
from accelmux.core.types import GIB, MIB, Reason, Residency, ServiceClass, ServiceKind

from .support import (
    arrive,
    device,
    dispatched,
    done,
    enqueued,
    loaded,
    loads,
    manager,
    plain_profile,
    rejected,
    service,
    unloads,
    up,
)

SIZES = {"asr": GIB, "tts": GIB, "cam": 256 * MIB}


def _home(
    knobs: PolicyKnobs | None = None,
    tts_objective_s: float | None = None,
    cam_objective_s: float | None = None,
) -> Manager:
    def pinned(name: str, cls: ServiceClass, kind: ServiceKind, per_unit: float) -> object:
        return service(
            name,
            cls=cls,
            kind=kind,
            residency=Residency.PINNED,
            profile=plain_profile(weights=SIZES[name], workspace=0, per_unit=per_unit),
            deadline_s=10.0,
        )

    asr = pinned("asr", ServiceClass.REALTIME, ServiceKind.ASR, GIB)
    tts = replace(
        pinned("tts", ServiceClass.REALTIME, ServiceKind.TTS, 0.0),  # type: ignore[type-var]
        objective_s=tts_objective_s,
    )
    cam = replace(
        pinned("cam", ServiceClass.BACKGROUND, ServiceKind.DETECT, 64 * MIB),  # type: ignore[type-var]
        objective_s=cam_objective_s,
    )
    chat = service("chat", profile=plain_profile(weights=GIB, workspace=0, per_unit=GIB))
    return manager(
        asr,  # type: ignore[arg-type]
        tts,  # type: ignore[arg-type]
        cam,  # type: ignore[arg-type]
        chat,
        devices=(device(budget=8 * GIB, headroom=0),),
        knobs=knobs or PolicyKnobs(prewarm=False, safety_factor=1.0),
    )


def _game(m: Manager, now: float, foreign: int, *names: str) -> None:
    held = {n: SIZES[n] for n in names}
    used = sum(held.values()) + foreign
    m.handle(MemorySampled(device="gpu", used_bytes=used, per_service=held), now)


def test_a_voice_request_a_game_leaves_no_room_for_evicts_idle_pinned_services() -> None:
    m = _home()
    up(m, "asr", "tts", "cam")  # 2.25 GiB pinned of 8
    _game(m, 1.0, 5 * GIB, "asr", "tts", "cam")  # 0.75 GiB left
    acts = m.handle(arrive("a1", "asr", units=1.5), 2.0)  # needs 1.5 GiB of activations
    assert "a1" not in rejected(acts)
    # the camera detector first (a lower class), then the idle speech synthesiser
    assert [u.service for u in unloads(acts)] == ["cam", "tts"]
    assert all("pinned, it yields to realtime" in u.detail for u in unloads(acts))
    m.handle(Unloaded(service="cam"), 2.1)
    assert dispatched(m.handle(Unloaded(service="tts"), 2.2)) == ["a1"]
    # the synthesiser is not reloaded into the memory the request runs in (the detector
    # fits in what is left beside it) ...
    assert [ld.service for ld in loads(m.handle(arrive("x", "chat"), 2.3))] == ["cam"]
    # ... and comes back once the request is done and room returns
    assert [ld.service for ld in loads(m.handle(done("a1"), 4.0))] == ["tts"]


def test_work_below_realtime_never_evicts_a_pinned_service() -> None:
    m = _home()
    up(m, "asr", "tts", "cam")
    _game(m, 1.0, 5 * GIB, "asr", "tts", "cam")
    acts = m.handle(arrive("c1", "chat"), 2.0)  # 2 GiB for an interactive model
    assert not unloads(acts)
    assert enqueued(acts)["c1"].reason is Reason.NO_MEMORY


def test_with_the_switch_off_the_voice_request_is_refused() -> None:
    m = _home(PolicyKnobs(prewarm=False, safety_factor=1.0, disabled=frozenset({"realtime_unpin"})))
    up(m, "asr", "tts", "cam")
    _game(m, 1.0, 5 * GIB, "asr", "tts", "cam")
    acts = m.handle(arrive("a1", "asr", units=1.5), 2.0)
    assert rejected(acts)["a1"].reason is Reason.NO_MEMORY
    assert not unloads(acts)


def test_a_pinned_service_whose_reload_misses_its_objective_stays() -> None:
    # tts was measured to load in 1.4 s, more than its 0.5 s objective: evicting it would
    # make its next request miss
    m = _home(tts_objective_s=0.5)
    assert sorted(ld.service for ld in loads(m.start(0.0))) == ["asr", "cam", "tts"]
    m.handle(loaded("asr"), 0.2)
    m.handle(loaded("cam"), 0.2)
    m.handle(loaded("tts"), 1.4)
    _game(m, 1.5, 5 * GIB, "asr", "tts", "cam")
    acts = m.handle(arrive("a1", "asr", units=1.5), 2.0)
    assert "tts" not in [u.service for u in unloads(acts)]
    assert rejected(acts)["a1"].reason is Reason.NO_MEMORY


def test_voice_unserved_for_long_takes_even_a_slow_reloading_pinned_service() -> None:
    # the same home, but realtime work there has gone unserved for two minutes: a late
    # answer beats none, so the synthesiser yields although its reload misses its
    # objective (game-takes-pinned-room: voice refused for 19-22 minutes per seed)
    m = _home(tts_objective_s=0.5)
    m.start(0.0)
    m.handle(loaded("asr"), 0.2)
    m.handle(loaded("cam"), 0.2)
    m.handle(loaded("tts"), 1.4)
    _game(m, 1.5, 5 * GIB, "asr", "tts", "cam")
    assert rejected(m.handle(arrive("a1", "asr", units=1.5), 2.0))["a1"].reason is Reason.NO_MEMORY
    acts = m.handle(arrive("a2", "asr", units=1.5), 2.0 + UNSERVED_S)
    assert "a2" not in rejected(acts)
    assert [u.service for u in unloads(acts)] == ["cam", "tts"]


def _slow_reloads(m: Manager) -> None:
    """Start ``m`` with the synthesiser and the camera detector measured to load slower
    than any objective under a second (1.2 s)."""
    m.start(0.0)
    m.handle(loaded("asr"), 0.2)
    m.handle(loaded("cam"), 1.2)
    m.handle(loaded("tts"), 1.2)


def test_a_pinned_camera_yields_to_voice_even_when_its_reload_misses_its_objective() -> None:
    # Voice comes first: the camera's objective guards its frames against other camera
    # work, not against the voice chain (adv-0444: a game took 57 % of the card and the
    # detector stayed while every voice request waited or was refused).
    m = _home(cam_objective_s=0.05)
    _slow_reloads(m)
    _game(m, 1.5, 5 * GIB, "asr", "tts", "cam")  # 0.75 GiB left
    acts = m.handle(arrive("a1", "asr", units=0.9), 2.0)
    assert [u.service for u in unloads(acts)] == ["cam"]  # not the synthesiser


def test_a_voice_request_is_not_refused_while_a_pinned_camera_could_yield() -> None:
    # The synthesiser's reload misses its objective and stays; the camera's does too,
    # but it is of a lower class and yields: the request runs instead of being refused.
    m = _home(tts_objective_s=0.5, cam_objective_s=0.05)
    _slow_reloads(m)
    _game(m, 1.5, 5 * GIB, "asr", "tts", "cam")
    acts = m.handle(arrive("a1", "asr", units=1.0), 2.0)
    assert "a1" not in rejected(acts)
    assert [u.service for u in unloads(acts)] == ["cam"]
    assert dispatched(m.handle(Unloaded(service="cam"), 2.1)) == ["a1"]
