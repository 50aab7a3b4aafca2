"""Replay a request script through the LIVE runtime on a manual clock (parity checks).

The runtime runs exactly as in production (driver, executor, tickets, fake backends)
except that time is a :class:`~.clock.ManualClock` and the fake backends sleep on it:
a fake's ``load_s`` and ``latency_s`` become virtual durations. The result is the
Manager's decision log, to compare with the simulator's for the same script.
Ordering rule at equal times: due timers fire (one at a time, each followed by
everything it set off) before a new arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accelmux.backends.base import Backend
from accelmux.backends.fake import FakeBackend
from accelmux.config.backends import FakeBackendConfig
from accelmux.config.schema import AccelmuxConfig
from accelmux.core.events import Demand
from accelmux.core.specs import ServiceSpec
from accelmux.core.types import ServiceKind
from accelmux.runtime.call import Call
from accelmux.runtime.clock import ManualClock
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused

#: The endpoint a replayed request of each kind calls on its fake backend.
KIND_ENDPOINT = {
    ServiceKind.CHAT: "/v1/chat/completions",
    ServiceKind.COMPLETION: "/v1/completions",
    ServiceKind.EMBEDDINGS: "/v1/embeddings",
    ServiceKind.IMAGE: "/v1/images/generations",
    ServiceKind.ASR: "/v1/audio/transcriptions",
    ServiceKind.TTS: "/v1/audio/speech",
    ServiceKind.DETECT: "/v1/detections",
    ServiceKind.CAMERA: "/v1/detections",
}

#: Event-loop turns that let everything a timer set off run before time moves again.
SETTLE_TURNS = 30


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    at: float
    request_id: str
    service: str
    demand: Demand


async def _settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


async def live_decision_log(
    cfg: AccelmuxConfig,
    arrivals: list[Arrival],
    *,
    horizon_s: float,
    clock_origin_s_of_day: float = 0.0,
) -> list[dict[str, Any]]:
    """Run ``arrivals`` through a Runtime with fake backends on a manual clock."""
    clock = ManualClock()
    sections: dict[str, FakeBackendConfig] = {}
    for name, svc in cfg.services.items():
        if not isinstance(svc.backend, FakeBackendConfig):
            raise ValueError(f"service {name}: replay needs a fake backend")
        sections[name] = svc.backend.model_copy(update={"allocate": False})

    def fakes(services: Sequence[ServiceSpec]) -> dict[str, Backend]:
        """A fake on the manual clock for each of the Manager's services (replicas too)."""
        out: dict[str, Backend] = {}
        for spec in services:
            svc = cfg.services[spec.addressed_as]
            out[spec.name] = FakeBackend(
                spec.name,
                svc.kind,
                svc.model or spec.addressed_as,
                sections[spec.addressed_as],
                sleep=clock.sleep,
                profile=(int(svc.memory.weights), int(svc.memory.runtime)),
                answers_as=spec.addressed_as,
            )
        return out

    runtime = Runtime(
        cfg,
        make_backends=fakes,
        clock=clock,
        clock_origin_s_of_day=clock_origin_s_of_day,
        sample=False,
    )
    await runtime.start()
    pending = sorted(arrivals, key=lambda a: a.at)
    tasks: list[asyncio.Task[Any]] = []

    async def one(arrival: Arrival) -> None:
        kind = runtime.service_state(arrival.service).spec.kind
        call = Call(kind=kind, endpoint=KIND_ENDPOINT[kind])
        with contextlib.suppress(Refused):
            await runtime.call(arrival.service, arrival.demand, call, request_id=arrival.request_id)

    while True:
        await _settle()
        next_timer = clock.next_timer()
        next_arrival = pending[0].at if pending else math.inf
        timer_at = next_timer if next_timer is not None else math.inf
        if min(timer_at, next_arrival) > horizon_s:
            break
        if timer_at <= next_arrival:
            clock.step()
        else:
            arrival = pending.pop(0)
            clock.advance(arrival.at)
            tasks.append(asyncio.create_task(one(arrival)))
    log = [d.as_dict() for d in runtime.manager.log]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    runtime.driver.close()
    return log
