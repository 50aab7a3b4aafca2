"""Throughput of ``core.Manager`` with the accelmux policy.

A synthetic workload (Zipf-popular services of mixed classes on 1-4 devices, Poisson
arrivals, a fake executor that answers loads, unloads, resizes and requests after
plausible delays, periodic ticks plus the Manager's own wake-ups) is replayed through a Manager.
Only the Manager's work is timed: ``handle(event, now)`` and ``next_wakeup(now)``, as a
driver calls them after every event.

    python bench/bench_manager.py            # full run, writes bench/results/manager.json
    python bench/bench_manager.py --quick    # one repeat, fewer events
    python bench/bench_manager.py --profile 1000   # cProfile of one run
    # also compare with another checkout of the core, side by side: one process per
    # run, alternating that checkout's src and this one's (same workloads, same seeds)
    python bench/bench_manager.py --against /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from meta import run_meta

from accelmux.core.actions import Action, Dispatch, Load, Resize, Unload
from accelmux.core.events import (
    Demand,
    Event,
    LoadFinished,
    RequestArrived,
    RequestFinished,
    ResizeFinished,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.core.specs import (
    DeviceSpec,
    ManagerSpec,
    MemoryProfile,
    PolicyKnobs,
    ServiceSpec,
    Window,
)
from accelmux.core.types import GIB, MIB, Residency, ServiceClass, ServiceKind

RESULTS = Path(__file__).parent / "results" / "manager.json"

#: (services, devices, events per run)
CASES: tuple[tuple[int, int, int], ...] = ((10, 1, 10_000), (100, 2, 4_000), (1000, 4, 500))
REPEATS = 5
TICK_PERIOD_S = 5.0
#: Cases (services) and alternating rounds of ``--against``.
COMPARED = (10, 100, 1000)
COMPARE_ROUNDS = 9


@dataclass(frozen=True)
class Workload:
    spec: ManagerSpec
    weights: list[float]  # popularity of each service
    rate_per_s: float
    service_s: dict[str, float]


def build_workload(n_services: int, n_devices: int, seed: int, peak_util: float = 0.6) -> Workload:
    rng = random.Random(seed)
    devices = tuple(
        DeviceSpec(
            name=f"gpu{d}",
            kind="virtual",
            capacity_bytes=24 * GIB,
            budget_bytes=24 * GIB,
            headroom_bytes=GIB,
        )
        for d in range(n_devices)
    )
    services = []
    service_s: dict[str, float] = {}
    for i in range(n_services):
        roll = rng.random()
        if i < n_devices:  # one pinned voice service per device, as a home server has
            cls, residency = ServiceClass.REALTIME, Residency.PINNED
        elif roll < 0.05:
            cls, residency = ServiceClass.REALTIME, Residency.WARM
        elif roll < 0.55:
            cls, residency = (
                ServiceClass.INTERACTIVE,
                rng.choice([Residency.WARM, Residency.ON_DEMAND]),
            )
        elif roll < 0.85:
            cls, residency = ServiceClass.BATCH, Residency.ON_DEMAND
        else:
            cls, residency = ServiceClass.BACKGROUND, Residency.ON_DEMAND
        llm = cls is not ServiceClass.REALTIME and rng.random() < 0.4
        weights = rng.randint(200, 4000 if i >= n_devices else 800) * MIB
        if llm:
            kind = ServiceKind.CHAT
            floor = rng.randint(1, 4) * 128 * MIB
            profile = MemoryProfile(
                weights=weights,
                runtime=rng.randint(50, 300) * MIB,
                kv_bytes_per_token=64 * 1024,
                kv_floor=floor,
                kv_ceiling=floor + rng.randint(2, 16) * 128 * MIB,
                workspace=rng.randint(20, 200) * MIB,
            )
        else:
            kind = rng.choice([ServiceKind.IMAGE, ServiceKind.ASR, ServiceKind.EMBEDDINGS])
            profile = MemoryProfile(
                weights=weights,
                runtime=rng.randint(20, 300) * MIB,
                workspace=rng.randint(20, 500) * MIB,
                per_unit=float(rng.randint(1, 200) * MIB),
            )
        windows: tuple[Window, ...] = ()
        if cls is ServiceClass.BATCH and rng.random() < 0.5:
            start = float(rng.randint(0, 23) * 3600)
            windows = (Window(start_s=start, end_s=(start + 6 * 3600) % 86_400 or 86_400),)
        name = f"svc{i:04d}"
        services.append(
            ServiceSpec(
                name=name,
                kind=kind,
                cls=cls,
                residency=residency,
                device=f"gpu{i % n_devices}",
                profile=profile,
                concurrency=rng.randint(1, 4),
                ttl_s=float(rng.choice([30, 120, 600])),
                queue_limit=rng.randint(4, 32),
                deadline_s=float(rng.choice([5, 30, 120])),
                windows=windows,
            )
        )
        service_s[name] = rng.uniform(0.2, 4.0)
    # Per-service utilisation falls off Zipf-like: the most popular service runs at
    # ``peak_util`` of its concurrency, the long tail sees an occasional request.
    ranks = list(range(n_services))
    rng.shuffle(ranks)
    rates = [
        peak_util / (rank + 1) ** 0.9 * s.concurrency / service_s[s.name]
        for rank, s in zip(ranks, services, strict=True)
    ]
    spec = ManagerSpec(devices=devices, services=tuple(services), knobs=PolicyKnobs())
    return Workload(spec=spec, weights=rates, rate_per_s=sum(rates), service_s=service_s)


def run_once(work: Workload, n_events: int, seed: int) -> dict[str, float]:
    """Replay ``n_events`` events; returns timings and counts."""
    rng = random.Random(seed)
    manager = Manager(work.spec, make_policy("accelmux"))
    specs = {s.name: s for s in work.spec.services}
    names = [s.name for s in work.spec.services]
    heap: list[tuple[float, int, Event]] = []
    seq = 0

    def push(at: float, event: Event) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (at, seq, event))

    def react(now: float, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                took = rng.expovariate(1.0 / work.service_s[a.service])
                peak = int(a.lease_bytes * rng.uniform(0.6, 1.0))
                push(
                    now + took,
                    RequestFinished(request_id=a.request_id, attempt=a.attempt, peak_bytes=peak),
                )
            elif isinstance(a, Load):
                push(now + a.weights_bytes / 2e9 + 0.5, LoadFinished(service=a.service))
            elif isinstance(a, Unload):
                push(now + 0.3, Unloaded(service=a.service))
            elif isinstance(a, Resize):
                push(now + 0.05, ResizeFinished(service=a.service, kv_pool_bytes=a.kv_pool_bytes))

    # arrivals and periodic ticks
    t = 0.0
    n_arrivals = int(n_events * 0.4)
    picks = rng.choices(names, weights=work.weights, k=n_arrivals)
    for i, name in enumerate(picks):
        t += rng.expovariate(work.rate_per_s)
        spec = specs[name]
        if spec.kind.is_llm:
            tokens = rng.randint(100, 6000)
            demand = Demand(kv_tokens=tokens, prompt_tokens=tokens // 2, output_tokens=256)
        else:
            demand = Demand(units=round(rng.uniform(0.1, 4.0), 2))
        push(t, RequestArrived(request_id=f"r{i}", service=name, demand=demand))
    tick_at = 0.0
    while tick_at < t:
        tick_at += TICK_PERIOD_S
        push(tick_at, Tick())

    busy = 0.0
    handle_only = 0.0
    handled = 0
    n_actions = 0
    wakeups: set[float] = set()
    perf = time.perf_counter
    t0 = perf()
    out = manager.start(0.0)
    busy += perf() - t0
    react(0.0, out)
    while heap and handled < n_events:
        now, _, event = heapq.heappop(heap)
        t0 = perf()
        out = manager.handle(event, now)
        t1 = perf()
        wake = manager.next_wakeup(now)
        t2 = perf()
        busy += t2 - t0
        handle_only += t1 - t0
        handled += 1
        n_actions += len(out)
        react(now, out)
        if wake is not None and wake not in wakeups:
            wakeups.add(wake)
            push(wake, Tick())
    return {
        "events": handled,
        "actions": n_actions,
        "seconds": busy,
        "handle_seconds": handle_only,
        "events_per_s": handled / busy,
        "actions_per_s": n_actions / busy,
        "handle_events_per_s": handled / handle_only,
        "sim_seconds": now,
    }


def bench(quick: bool) -> dict[str, object]:
    cases = []
    repeats = 1 if quick else REPEATS
    for n_services, n_devices, events in CASES:
        n_events = events // 5 if quick else events
        work = build_workload(n_services, n_devices, seed=n_services)
        runs = [run_once(work, n_events, seed=1000 + r) for r in range(repeats)]
        cases.append(
            {
                "services": n_services,
                "devices": n_devices,
                "events_per_run": runs[0]["events"],
                "actions_per_run": statistics.median(r["actions"] for r in runs),
                "repeats": repeats,
                "events_per_s": statistics.median(r["events_per_s"] for r in runs),
                "actions_per_s": statistics.median(r["actions_per_s"] for r in runs),
                "handle_events_per_s": statistics.median(r["handle_events_per_s"] for r in runs),
                "us_per_event": 1e6 / statistics.median(r["events_per_s"] for r in runs),
                "runs": runs,
            }
        )
        c = cases[-1]
        print(
            f"{n_services:>8} {n_devices:>7} {c['events_per_run']:>8} "
            f"{c['events_per_s']:>12,.0f} {c['actions_per_s']:>12,.0f} "
            f"{c['us_per_event']:>10.1f}",
            flush=True,
        )
    return {
        "meta": run_meta({"repeats": repeats, "quick": quick}),
        "benchmark": "core.Manager + accelmux policy: handle() + next_wakeup() per event",
        "implementation": platform.python_implementation(),
        "repeats": repeats,
        "cases": cases,
    }


def one_run(n_services: int) -> dict[str, float]:
    """One full-length run of a case (the first repeat's seed), as ``--one`` prints it."""
    n_devices, n_events = next((d, e) for s, d, e in CASES if s == n_services)
    work = build_workload(n_services, n_devices, seed=n_services)
    return run_once(work, n_events, seed=1000)


def _run_in(src: Path, n_services: int) -> float:
    """events/s of :func:`one_run` in a process of its own, importing the core from ``src``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(Path(__file__).parent)]))
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(n_services)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout)["events_per_s"])


def _commit_of(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def compare(against: Path) -> dict[str, object]:
    """This checkout's core against ``against``'s on the :data:`COMPARED` cases.

    The machine may be shared and its speed drift: each round runs the old core, then the
    new one, each in a fresh process, so both see the same conditions; the medians of
    the rounds are compared."""
    here = Path(__file__).resolve().parents[1] / "src"
    cases = []
    for n_services in COMPARED:
        old: list[float] = []
        new: list[float] = []
        for _ in range(COMPARE_ROUNDS):
            old.append(_run_in(against / "src", n_services))
            new.append(_run_in(here, n_services))
        cases.append(
            {
                "services": n_services,
                "old_events_per_s": old,
                "new_events_per_s": new,
                "old_median": statistics.median(old),
                "new_median": statistics.median(new),
                "speedup": statistics.median(new) / statistics.median(old),
            }
        )
        c = cases[-1]
        print(
            f"{n_services:>8} services: {c['old_median']:>10,.0f} -> "
            f"{c['new_median']:>10,.0f} events/s ({c['speedup']:.2f}x)",
            flush=True,
        )
    return {"against": _commit_of(against), "rounds": COMPARE_ROUNDS, "cases": cases}


def profile(n_services: int) -> None:
    import cProfile
    import pstats

    n_devices, n_events = next((d, e) for s, d, e in CASES if s == n_services)
    work = build_workload(n_services, n_devices, seed=n_services)
    prof = cProfile.Profile()
    prof.enable()
    run_once(work, n_events // 2, seed=1000)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer events")
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile the N-service case")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--against", type=Path, metavar="CHECKOUT", help="also compare with that core"
    )
    parser.add_argument("--one", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one)))
        return
    if args.profile:
        profile(args.profile)
        return
    print(
        f"{'services':>8} {'devices':>7} {'events':>8} {'events/s':>12} {'actions/s':>12} "
        f"{'us/event':>10}"
    )
    result = bench(args.quick)
    if args.against:
        result["comparison"] = compare(args.against)
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
