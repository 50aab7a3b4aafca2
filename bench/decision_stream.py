"""The exact decision stream of simulated runs: proof that two versions of the core decide alike.

Every call the simulator (or the Manager benchmark) makes into the Manager is written as
text: the time and every field of each event, of each action it returned (one JSON
object a line) and the ``next_wakeup`` that followed. Two versions of ``core/`` decide
alike on a run when their streams are byte for byte equal. The script uses only what the
simulator and the benchmark have always had, so it runs against any checkout's ``src``:

    # the streams of every shipped scenario x policy (and the benchmark workloads),
    # one file each under DIR, with a digest per run on stdout
    PYTHONPATH=src:bench python bench/decision_stream.py --out DIR
    # the same from an older checkout, then compare
    PYTHONPATH=/path/to/old/src:bench python bench/decision_stream.py --out OLD
    diff -r OLD DIR

    # regenerate the golden digests tests/sim/test_decision_stream.py checks (and the
    # policy digest benchmarks record, bench/policy_digest.py)
    PYTHONPATH=src:bench python bench/decision_stream.py --golden

``--duration-s`` shortens the simulated runs (default 900 s), ``--seeds`` sets how many
seeds per run (default 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted(
    (ROOT / "scenarios" / "stress").glob("*.yaml")
)
POLICIES = ("accelmux", "independent", "static", "ollama+containers", "llama-swap", "oracle")
#: What the golden digests cover: one short scenario, every policy.
GOLDEN = ROOT / "tests" / "sim" / "decision_digests.json"
GOLDEN_SCENARIO = ROOT / "scenarios" / "home-evening.yaml"
GOLDEN_DURATION_S = 600.0
#: Benchmark workloads streamed too: (services, devices, events).
BENCH_CASES = ((10, 1, 4000), (100, 2, 4000))


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data that reads the same on every Python version."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__} | {
            f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, frozenset | set) else items
    return value


def line(value: Any) -> str:
    """One event or action as a line of the stream."""
    return json.dumps(_plain(value), sort_keys=True)


def _record(manager: Any, lines: list[str]) -> None:
    """Wrap ``manager``'s driving methods so that every call appends its lines."""
    start, handle, wakeup = manager.start, manager.handle, manager.next_wakeup

    def emit(actions: list[Any]) -> None:
        lines.extend(f"  {line(a)}" for a in actions)

    def rec_start(now: float) -> list[Any]:
        out = start(now)
        lines.append(f"{now!r} start")
        emit(out)
        return out  # type: ignore[no-any-return]

    def rec_handle(event: Any, now: float) -> list[Any]:
        out = handle(event, now)
        lines.append(f"{now!r} {line(event)}")
        emit(out)
        return out  # type: ignore[no-any-return]

    def rec_wakeup(now: float) -> float | None:
        wake = wakeup(now)
        lines.append(f"  wake {wake!r}")
        return wake  # type: ignore[no-any-return]

    manager.start, manager.handle, manager.next_wakeup = rec_start, rec_handle, rec_wakeup


def simulation_stream(scenario: Path, policy: str, seed: int, duration_s: float) -> list[str]:
    """The stream of one simulated run."""
    from accelmux.sim.executor import Simulation
    from accelmux.sim.scenario import load_scenario

    sim = Simulation(load_scenario(scenario), policy, seed, duration_s=duration_s)
    lines: list[str] = []
    _record(sim.manager, lines)
    sim.run()
    return lines


def bench_stream(n_services: int, n_devices: int, n_events: int) -> list[str]:
    """The stream of one run of ``bench_manager.py``'s workload (accelmux policy)."""
    import bench_manager

    lines: list[str] = []
    real = bench_manager.Manager

    def recording(*args: Any, **kwargs: Any) -> Any:
        manager = real(*args, **kwargs)
        _record(manager, lines)
        return manager

    bench_manager.Manager = recording  # type: ignore[assignment,misc]
    try:
        work = bench_manager.build_workload(n_services, n_devices, seed=n_services)
        bench_manager.run_once(work, n_events, seed=1000)
    finally:
        bench_manager.Manager = real  # type: ignore[misc]
    return lines


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def golden_digests() -> dict[str, str]:
    """Per policy, the digest of the golden scenario's stream (seed 0)."""
    return {
        p: digest(simulation_stream(GOLDEN_SCENARIO, p, 0, GOLDEN_DURATION_S)) for p in POLICIES
    }


def runs(
    scenarios: list[Path], policies: list[str], seeds: int, duration_s: float, bench: bool
) -> Iterator[tuple[str, Callable[[], list[str]]]]:
    for path in scenarios:
        for policy in policies:
            for seed in range(seeds):
                name = f"{path.parent.name}-{path.stem}__{policy}__s{seed}"
                yield name, lambda p=path, q=policy, s=seed: simulation_stream(p, q, s, duration_s)
    if bench:
        for n, d, e in BENCH_CASES:
            yield f"bench-{n}__accelmux", lambda n=n, d=d, e=e: bench_stream(n, d, e)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path, help="default: every shipped one")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path, help="write each run's stream here")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark workloads")
    parser.add_argument("--golden", action="store_true", help=f"rewrite {GOLDEN.name}")
    args = parser.parse_args()
    if args.golden:
        GOLDEN.write_text(json.dumps(golden_digests(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN}")
        import policy_digest  # the digest benchmarks record, from the same code

        policy_digest.write_committed()
        print(f"wrote {policy_digest.COMMITTED}")
        return 0
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    policies = [p for p in args.policies.split(",") if p]
    for name, stream in runs(
        args.scenarios or SCENARIOS, policies, args.seeds, args.duration_s, not args.no_bench
    ):
        lines = stream()
        if args.out:
            (args.out / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{digest(lines)}  {len(lines):>8}  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
