"""The policy's decision digest: which decisions a benchmark's figures were measured under.

A figure that comes from the Manager's decisions (an SLO attainment, a voice chain's
latency beside batch work) is only true of the policy that made them. Every benchmark
records, beside its commit (``bench/meta.py``), the digest of the decisions of the code
it ran, and ``tests/docs/test_freshness.py`` fails when a published figure comes from a
run whose digest differs from today's (``bench/freshness.py`` says which benchmarks
depend on the decisions, and why the others do not).

The digest, exactly:

- ``accelmux``: SHA-256 over the decision streams (``bench/decision_stream.py``: every
  event, action and wake-up, field by field) of the accelmux policy on each of the
  :data:`SCENARIOS` (the shipped scenarios of this checkout and the adversary's
  regression cases), seed 0, the first :data:`DURATION_S` simulated seconds: one line
  ``<scenario> <stream digest>`` per scenario, hashed. About 20 s of CPU.
- ``baselines``: SHA-256 over the golden streams of the baselines (``independent``,
  ``static``, ``ollama+containers``, ``llama-swap``, ``oracle``) on the golden scenario,
  as ``tests/sim/decision_digests.json`` pins them. The simulator's tables compare
  accelmux with them, so a change to a baseline makes those tables stale too.

Two versions of the code have the same digest when they decide alike on every one of
those runs (a rebuild that keeps every decision, issue by issue, keeps every figure).
A change that alters a decision on any of them changes the digest, and every figure it
published must be measured again (``scripts/gate`` re-runs what must not get worse).

Today's digest is committed in :data:`COMMITTED` (``tests/sim/test_policy_digest.py``
recomputes it); regenerate it together with the golden digests::

    PYTHONPATH=src:bench python bench/decision_stream.py --golden

Computing it costs about 15 s, so :func:`current` caches it under
``~/.cache/accelmux/policy-digest/``, keyed by the content of every file it depends on
(``src/accelmux``, the scenarios, this script and ``decision_stream.py``).

The digest of an older commit (to tell whether a result written before digests were
recorded was measured under today's policy)::

    PYTHONPATH=src:bench python bench/policy_digest.py --at COMMIT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: The shipped scenarios the accelmux digest runs, relative to the repository root.
SCENARIOS = (
    "scenarios/burst.yaml",
    "scenarios/four-gpus.yaml",
    "scenarios/home-evening.yaml",
    "scenarios/many-llms.yaml",
    "scenarios/shared-memory-host.yaml",
    "scenarios/small-gpu.yaml",
    "scenarios/two-gpus.yaml",
    "scenarios/stress/batch-no-window.yaml",
    "scenarios/stress/bias-2x.yaml",
    "scenarios/stress/bursty-chat.yaml",
    "scenarios/stress/foreign-mid-burst.yaml",
    "scenarios/stress/load-and-request-2x.yaml",
    "scenarios/stress/noisy-image.yaml",
    # The adversary's regression cases: where the policy's edges are. A change that
    # decided alike on the shipped scenarios alone changed decisions here twice
    # (a pinned camera yielding to voice; the reserve weighing a request's fresh need),
    # so figures measured before it would have passed for today's. Listed by name: a new
    # case joins the digest deliberately, with the benchmarks its change re-runs.
    *(
        f"scenarios/regressions/{name}.yaml"
        for name in (
            "adv-0033-night-cameras-648632-s1-interactive",
            "adv-0115-evening-game-518182-s3-batch",
            "adv-0149-night-cameras-648632-s1-interactive",
            "adv-0154-mixed-266770-s1-realtime",
            "adv-0163-mixed-755180-s1-interactive",
            "adv-0180-mixed-618590-s0-realtime",
            "adv-0265-night-cameras-254248-s2-batch",
            "adv-0433-mixed-631052-s2-realtime",
            "adv-0444-mixed-421115-s3-realtime",
            "adv-0497-night-cameras-254248-s1-background",
            "adv-0591-evening-game-220276-s3-realtime",
            "first-adv-0005-mixed-867819-s0-batch",
            "first-adv-0008-mixed-504958-s0-interactive",
            "first-adv-0023-mixed-268277-s3-background",
        )
    ),
)
DURATION_S = 600.0
SEED = 0
BASELINES = ("independent", "static", "ollama+containers", "llama-swap", "oracle")
COMMITTED = ROOT / "tests" / "sim" / "policy_digest.json"
#: What the digest covers, recorded beside it.
SCOPE = (
    f"accelmux: its decision streams on the {len(SCENARIOS)} shipped scenarios and "
    "regression cases, seed "
    f"{SEED}, first {DURATION_S:g} s; baselines: their golden streams (home-evening)"
)


def _sha(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def compute(root: Path = ROOT) -> dict[str, str]:
    """The digest of the code importable as ``accelmux`` on the scenarios under ``root``."""
    import decision_stream  # bench/ on sys.path

    def stream(path: Path, policy: str, duration_s: float) -> str:
        lines = decision_stream.simulation_stream(path, policy, SEED, duration_s)
        return str(decision_stream.digest(lines))

    per_scenario = [f"{rel} {stream(root / rel, 'accelmux', DURATION_S)}" for rel in SCENARIOS]
    golden = root / "scenarios" / "home-evening.yaml"
    baselines = [f"{p} {stream(golden, p, decision_stream.GOLDEN_DURATION_S)}" for p in BASELINES]
    return {"accelmux": _sha(per_scenario), "baselines": _sha(baselines)}


def _inputs(root: Path = ROOT) -> list[Path]:
    files = sorted((root / "src" / "accelmux").rglob("*.py"))
    files += sorted((root / "src" / "accelmux").rglob("*.csv"))
    files += [root / rel for rel in SCENARIOS]
    files += [BENCH / "decision_stream.py", Path(__file__).resolve()]
    return files


def _key(root: Path = ROOT) -> str:
    h = hashlib.sha256()
    for path in _inputs(root):
        h.update(str(path.relative_to(root) if path.is_relative_to(root) else path.name).encode())
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    return h.hexdigest()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "accelmux" / "policy-digest"


def current() -> dict[str, str]:
    """Today's digest of this checkout (cached by the content of what it depends on)."""
    key = _key()
    cached = _cache_dir() / f"{key}.json"
    try:
        data: dict[str, str] = json.loads(cached.read_text(encoding="utf-8"))
        if set(data) == {"accelmux", "baselines"}:
            return data
    except (OSError, ValueError):
        pass
    data = compute()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(data) + "\n", encoding="utf-8")
    except OSError:
        pass  # a read-only home: computed again next time
    return data


def committed() -> dict[str, Any]:
    """Today's digest as committed (tests/sim/policy_digest.json)."""
    data: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    return data


def write_committed() -> dict[str, str]:
    data = compute()
    COMMITTED.write_text(json.dumps({**data, "scope": SCOPE}, indent=2) + "\n", encoding="utf-8")
    return data


def at_commit(commit: str) -> dict[str, str] | None:
    """The digest of ``commit``'s code and scenarios (this script's streams), or None when
    that commit lacks one of the scenarios or cannot run them."""
    with tempfile.TemporaryDirectory(prefix="policy-digest-") as tmp:
        archive = subprocess.run(
            ["git", "archive", commit, "src", "scenarios"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        tar_path = Path(tmp) / "tree.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        if not all((Path(tmp) / rel).is_file() for rel in SCENARIOS):
            return None
        env = {**os.environ, "PYTHONPATH": f"{tmp}/src{os.pathsep}{BENCH}"}
        out = subprocess.run(
            [sys.executable, __file__, "--root", tmp],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            return None
        data: dict[str, str] = json.loads(out.stdout)
        return data


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--at", metavar="COMMIT", help="the digest of an older commit")
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help=f"rewrite {COMMITTED.name}")
    args = parser.parse_args()
    if args.write:
        print(json.dumps(write_committed()))
    elif args.at:
        print(json.dumps(at_commit(args.at)))
    elif args.root:
        print(json.dumps(compute(args.root)))
    else:
        print(json.dumps(current()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
