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
    # run, alternating that checkout's src and this one's (same workloads, same seeds),
    # with the instructions per event each executes (valgrind's callgrind: a figure the
    # machine's load does not move) and the busy week below
    python bench/bench_manager.py --against /path/to/old/checkout
    # the busy week alone: WEEK_HOURS simulated hours of the busy home, timed whole
    python bench/bench_manager.py --week [--week-hours 168]

The busy week is a simulated week of one home (bench target: under 60 s): the first
generated home (``accelmux.sim.generate.generate_home``, by seed) that has 8 to 12
services and every class, replayed by the simulator with the accelmux policy, the whole
replay timed (simulator and Manager). ``--against`` times ``WEEK_HOURS`` of it per round
and projects the week in proportion (``projected_week_s``); ``--week-hours 168`` runs it
all.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
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
#: The busy week: simulated hours per timed round of ``--against`` (projected to a week),
#: rounds, and the generated homes searched for the first with 8-12 services of every class.
WEEK_HOURS = 2.0
WEEK_ROUNDS = 3
WEEK_SEEDS = range(100)
#: Events of the two runs whose difference gives the instructions per event (startup and
#: imports cancel out), under valgrind's callgrind.
INSTRUCTION_EVENTS = (200, 1200)


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


def one_run(n_services: int, events: int | None = None) -> dict[str, float]:
    """One full-length run of a case (the first repeat's seed), as ``--one`` prints it
    (``events``: that many instead)."""
    n_devices, n_events = next((d, e) for s, d, e in CASES if s == n_services)
    work = build_workload(n_services, n_devices, seed=n_services)
    return run_once(work, events or n_events, seed=1000)


def week_home() -> tuple[int, dict[str, object]]:
    """The busy week's home: (seed, scenario data) of the first generated home with 8-12
    services and every class (the same for any version of the core)."""
    from accelmux.sim.generate import generate_home

    for seed in WEEK_SEEDS:
        data = generate_home(seed).data
        services = data["services"]
        assert isinstance(services, dict)
        classes = {svc.get("class") for svc in services.values()}
        if 8 <= len(services) <= 12 and classes >= {
            "realtime",
            "interactive",
            "batch",
            "background",
        }:
            return seed, data
    raise SystemExit("no generated home has 8-12 services of every class")


def week_run(hours: float) -> dict[str, float]:
    """``hours`` of the busy week's home, simulated with the accelmux policy: the wall
    seconds of the whole replay, the Manager events it took, the projected week."""
    from accelmux.sim.executor import Simulation
    from accelmux.sim.generate import generate_home
    from accelmux.sim.scenario import load_scenario_data

    seed, _ = week_home()
    home = generate_home(seed, duration_s=hours * 3600.0)
    scenario = load_scenario_data(home.data, home.name, Path("."))
    t0 = time.perf_counter()
    sim = Simulation(scenario, "accelmux", 0, duration_s=hours * 3600.0)
    handled = [0]
    handle = sim.manager.handle

    def counting(event: Event, now: float) -> list[Action]:
        handled[0] += 1
        return handle(event, now)

    sim.manager.handle = counting  # type: ignore[method-assign]
    sim.run()
    wall = time.perf_counter() - t0
    return {
        "seed": seed,
        "hours": hours,
        "events": handled[0],
        "wall_s": wall,
        "events_per_s": handled[0] / wall,
        "projected_week_s": wall * 168.0 / hours,
    }


def _child(src: Path, *args: str) -> dict[str, float]:
    """What this script prints for ``args`` in a process of its own, importing the core
    from ``src``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(Path(__file__).parent)]))
    out = subprocess.run(
        [sys.executable, __file__, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _run_in(src: Path, n_services: int) -> float:
    """events/s of :func:`one_run` in a process of its own, importing the core from ``src``."""
    return float(_child(src, "--one", str(n_services))["events_per_s"])


def instructions_per_event(src: Path, n_services: int) -> float | None:
    """Instructions the core from ``src`` executes per event of the ``n_services`` case
    (callgrind; the difference of two runs, so startup cancels), or None without
    valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(Path(__file__).parent)]))
    for events in INSTRUCTION_EVENTS:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    __file__,
                    "--one",
                    str(n_services),
                    "--events",
                    str(events),
                ],
                env=env,
                capture_output=True,
                check=True,
            )
            counts.append(_callgrind_total(out))
    return (counts[1] - counts[0]) / (INSTRUCTION_EVENTS[1] - INSTRUCTION_EVENTS[0])


def _callgrind_total(path: Path) -> int:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{path}: no callgrind summary")


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
        old_ir = instructions_per_event(against / "src", n_services)
        new_ir = instructions_per_event(here, n_services)
        cases.append(
            {
                "services": n_services,
                "old_events_per_s": old,
                "new_events_per_s": new,
                "old_median": statistics.median(old),
                "new_median": statistics.median(new),
                "speedup": statistics.median(new) / statistics.median(old),
                "old_instructions_per_event": old_ir,
                "new_instructions_per_event": new_ir,
            }
        )
        c = cases[-1]
        print(
            f"{n_services:>8} services: {c['old_median']:>10,.0f} -> "
            f"{c['new_median']:>10,.0f} events/s ({c['speedup']:.2f}x); "
            f"instructions/event {old_ir} -> {new_ir}",
            flush=True,
        )
    week_old: list[dict[str, float]] = []
    week_new: list[dict[str, float]] = []
    for _ in range(WEEK_ROUNDS):
        week_old.append(_child(against / "src", "--week", "--week-hours", str(WEEK_HOURS)))
        week_new.append(_child(here, "--week", "--week-hours", str(WEEK_HOURS)))
    week = {
        "seed": week_new[0]["seed"],
        "hours": WEEK_HOURS,
        "events": week_new[0]["events"],
        "old_runs": week_old,
        "new_runs": week_new,
        "old_projected_week_s": statistics.median(r["projected_week_s"] for r in week_old),
        "new_projected_week_s": statistics.median(r["projected_week_s"] for r in week_new),
    }
    print(
        f"busy week (home seed {week['seed']}, {WEEK_HOURS} h timed): "
        f"{week['old_projected_week_s']:,.0f} s -> {week['new_projected_week_s']:,.0f} s",
        flush=True,
    )
    return {
        "against": _commit_of(against),
        "rounds": COMPARE_ROUNDS,
        "cases": cases,
        "week": week,
    }


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
    parser.add_argument("--week", action="store_true", help="time the busy week alone")
    parser.add_argument("--week-hours", type=float, default=168.0, metavar="H")
    parser.add_argument("--one", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.events)))
        return
    if args.week:
        print(json.dumps(week_run(args.week_hours)))
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
