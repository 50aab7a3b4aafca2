"""Parity: one request script through the live runtime (fake backends, manual clock) and
through a bare Manager driven by a reference discrete-event loop gives the same
decision log.

The reference loop below is deliberately tiny and independent of the runtime: a heap of
(time, sequence, event); a Load completes after the fake's ``load_s``, a Dispatch after
its ``latency_s`` with peak = lease x ``peak_factor``, an Unload at once; one pending
Tick at ``next_wakeup + WAKE_EPSILON_S``, re-armed after every event (as the driver
does). When ``accelmux.sim.parity`` lands, the same script is also checked against the
simulator (see the last test).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from pathlib import Path
from typing import Any

from accelmux.config.backends import FakeBackendConfig
from accelmux.config.load import load_config_data
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.specs import to_manager_spec
from accelmux.core.actions import Dispatch, Load, Preempt, Unload
from accelmux.core.events import (
    Demand,
    Event,
    LoadFinished,
    RequestArrived,
    RequestFinished,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.runtime.clock import ManualClock
from accelmux.runtime.driver import WAKE_EPSILON_S, Driver
from accelmux.runtime.replay import Arrival, live_decision_log
from accelmux.sim import parity


def _fake(latency: float, load: float) -> dict[str, Any]:
    return {"type": "fake", "latency_s": latency, "load_s": load, "allocate": False}


CONFIG: dict[str, Any] = {
    "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
    "services": {
        "chat": {
            "kind": "chat",
            "concurrency": 1,
            "ttl_s": 20,
            "queue": {"limit": 2, "deadline_s": 3},
            "memory": {
                "weights": "1GiB",
                "kv_per_token": "64KiB",
                "kv_floor": "64MiB",
                "kv_ceiling": "512MiB",
            },
            "backend": _fake(0.31, 0.53),
        },
        "image": {
            "kind": "image",
            "residency": "on-demand",
            "memory": {"weights": "2.5GiB", "per_unit": "128MiB"},
            "backend": _fake(0.71, 1.13),
        },
        "embed": {
            "kind": "embeddings",
            "class": "batch",
            "concurrency": 2,
            "memory": {"weights": "256MiB", "per_unit": "4MiB"},
            "backend": _fake(0.17, 0.29),
        },
        "asr": {
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "memory": {"weights": "128MiB", "per_unit": "2MiB"},
            "backend": _fake(0.05, 0.21),
        },
    },
    "policy": {"prewarm": True},
}


def script() -> list[Arrival]:
    out = []
    chat = Demand(kv_tokens=900, prompt_tokens=400, output_tokens=500)
    for i in range(6):  # a burst: concurrency 1, queue limit 2 -> queue_full
        out.append(Arrival(at=0.101 + i * 0.013, request_id=f"c{i}", service="chat", demand=chat))
    out.append(
        Arrival(at=0.407, request_id="huge", service="chat", demand=Demand(kv_tokens=100_000))
    )
    for i in range(4):
        out.append(
            Arrival(
                at=0.9 + i * 0.37, request_id=f"e{i}", service="embed", demand=Demand(units=8.0)
            )
        )
    out.append(Arrival(at=1.7, request_id="img1", service="image", demand=Demand(units=1.0)))
    out.append(Arrival(at=1.83, request_id="asr1", service="asr", demand=Demand(units=3.0)))
    out.append(Arrival(at=4.2, request_id="img2", service="image", demand=Demand(units=2.0)))
    out.append(Arrival(at=4.35, request_id="c9", service="chat", demand=chat))
    out.append(Arrival(at=30.5, request_id="c10", service="chat", demand=chat))
    return out


def reference_log(
    cfg: AccelmuxConfig, arrivals: list[Arrival], horizon: float
) -> list[dict[str, Any]]:
    spec = to_manager_spec(cfg, clock_origin_s_of_day=0.0)
    manager = Manager(spec, make_policy(cfg.policy.name))
    fakes = {n: s.backend for n, s in cfg.services.items()}
    seq = itertools.count()
    heap: list[tuple[float, int, Event | None]] = []
    for a in arrivals:
        heapq.heappush(
            heap,
            (
                a.at,
                1_000_000 + next(seq),
                RequestArrived(request_id=a.request_id, service=a.service, demand=a.demand),
            ),
        )
    tick: list[Any] = [None, None]  # (time, seq) of the one pending tick
    stale: set[tuple[str, int]] = set()

    def execute(now: float, actions: list[Any]) -> None:
        for act in actions:
            fake = fakes[act.service]
            assert isinstance(fake, FakeBackendConfig)
            if isinstance(act, Load):
                svc = cfg.services[act.service]
                ev = LoadFinished(
                    service=act.service,
                    weights_bytes=int(svc.memory.weights),
                    runtime_bytes=int(svc.memory.runtime),
                )
                heapq.heappush(heap, (now + fake.load_s, next(seq), ev))
            elif isinstance(act, Unload):
                heapq.heappush(heap, (now, next(seq), Unloaded(service=act.service)))
            elif isinstance(act, Dispatch):
                ev2 = RequestFinished(
                    request_id=act.request_id,
                    attempt=act.attempt,
                    peak_bytes=int(act.lease_bytes * fake.peak_factor),
                )
                heapq.heappush(heap, (now + fake.latency_s, next(seq), ev2))
            elif isinstance(act, Preempt):
                stale.add((act.request_id, act.attempt))

    def rearm(now: float) -> None:
        wake = manager.next_wakeup(now)
        if wake == tick[0]:
            return
        tick[0] = wake
        tick[1] = None
        if wake is not None:
            s = next(seq)
            tick[1] = s
            heapq.heappush(heap, (wake + WAKE_EPSILON_S, s, None))

    execute(0.0, manager.start(0.0))
    rearm(0.0)
    while heap and heap[0][0] <= horizon:
        now, s, ev = heapq.heappop(heap)
        if ev is None:
            if s != tick[1]:
                continue  # a tick that was re-armed since
            tick[0] = tick[1] = None
            ev = Tick()
        if isinstance(ev, RequestFinished) and (ev.request_id, ev.attempt) in stale:
            continue
        execute(now, manager.handle(ev, now))
        rearm(now)
    return [d.as_dict() for d in manager.log]


def test_live_runtime_matches_reference_decision_log() -> None:
    cfg = load_config_data(CONFIG, "parity")
    arrivals = script()
    horizon = 80.0
    expected = reference_log(cfg, arrivals, horizon)
    got = asyncio.run(live_decision_log(cfg, arrivals, horizon_s=horizon))
    kinds = {(d["action"], d["reason"]) for d in expected}
    # the script exercises the interesting decisions
    for needed in [
        ("load", "pinned"),
        ("dispatch", "fits"),
        ("enqueue", "concurrency_limit"),
        ("reject", "queue_full"),
        ("reject", "too_large"),
        ("unload", "ttl_expired"),
        ("unload", "evicted_for_memory"),
    ]:
        assert needed in kinds, (needed, sorted(kinds))
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"decision {i} differs:\nlive      {a}\nreference {b}"
    assert not math.isnan(horizon)


def test_live_driver_replays_the_simulators_inputs_to_the_same_decisions() -> None:
    """The simulator's exact (time, event) inputs, fed through the live Driver on a
    manual clock (its own wakeup timers armed, as in the daemon), give the simulator's
    decision log: the live loop adds, drops and reorders nothing."""
    scenario = str(Path(__file__).resolve().parents[2] / "scenarios" / "burst.yaml")
    spec, events = parity.event_log(scenario, 7, duration_s=300.0)
    expected = parity.decision_log(scenario, 7, duration_s=300.0)
    manager = Manager(spec, make_policy("accelmux"))
    clock = ManualClock()
    driver = Driver(manager, clock, lambda action: None)
    driver.start()
    for t, event in events:
        clock.advance(t)
        driver.submit(event)
    got = [d.as_dict() for d in manager.log]
    assert len(events) > 500
    assert got == expected
