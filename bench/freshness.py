"""Which published figures were measured under today's policy, and which are stale.

The rule (docs/benchmarks.md, "Figures and the policy that made them"):

- A benchmark is **policy-dependent** when its figures come from the Manager's decisions:
  who loads, waits, runs, is paused, evicted or refused. Every simulator benchmark is
  (the policies' decisions are all it measures: they depend on accelmux's digest and on
  the baselines'), and so is every real-stack benchmark that makes services compete for
  the machine (what the voice chain waits for is a decision). :data:`DEPENDENT` lists
  them with the digests they depend on.
- A benchmark is **not policy-dependent** when no decision of the policy changes what it
  measures: the gateway's added latency, the front door and connection limits, setup
  times, a model's memory, a backend's pause and park mechanics, the cluster router's
  and the Manager's speed (speed is not a decision: a rebuild that keeps every decision
  keeps the digest and is measured by its own benchmark). :data:`INDEPENDENT` lists
  them with the reason.

Every JSON under ``bench/results`` is in exactly one of the two (a test fails on a new
one that is in neither). A figure in the docs comes from a policy-dependent JSON whose
recorded digest (``meta.decisions``, bench/meta.py) differs from today's (committed in
``tests/sim/policy_digest.json``) is **stale**. ``tests/docs/test_freshness.py`` fails on
a stale figure unless the benchmark is listed in ``bench/stale.yaml`` with the reason it
could not be measured again; a listed figure is marked stale where it is shown (the
generated block says so), and the test fails too when a listed one is fresh again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STALE_LIST = ROOT / "bench" / "stale.yaml"

#: What a policy-dependent benchmark's figures depend on: ``all`` (accelmux and the
#: baselines: the simulator compares them) or ``accelmux`` (the real stack runs only it).
ALL = ("accelmux", "baselines")
ACCELMUX = ("accelmux",)

DEPENDENT: dict[str, tuple[str, ...]] = {
    "sim-home-evening.json": ALL,
    "sim-burst.json": ALL,
    "sim-small-gpu.json": ALL,
    "sim-shared-memory-host.json": ALL,
    "stress.json": ALL,
    "stress-failure-classes.json": ALL,
    "suite.json": ALL,
    "suite-holdout.json": ALL,
    "suite-foreign.json": ALL,
    # degrade.json's own decisions (services with forms) are pinned apart:
    # tests/sim/degrade_digest.json (tests/sim/test_degrade.py)
    "degrade.json": ALL,
    "ablation.json": ACCELMUX,
    "switches.json": ACCELMUX,
    "many_llms.json": ALL,
    "placement.json": ALL,
    # the adversary's search: accelmux against every baseline on the homes it found
    "adversary.json": ALL,
    "stack.json": ACCELMUX,
    "stack_llms.json": ACCELMUX,
    "wyoming.json": ACCELMUX,
    # the real stack under a mixed workload, and its replay by the same Manager
    "sim_real.json": ACCELMUX,
}

INDEPENDENT: dict[str, str] = {
    "gateway.json": "the gateway's added latency on a fake backend: no decision is timed",
    "frontdoor.json": "body and route limits of the front door, refused before any decision",
    "connections.json": "idle-connection limits of the server, fake services",
    "setup.json": "install and first-run times of a fresh clone",
    "models.json": "each model's memory and speed, measured alone in a process of its own",
    "pause.json": "the backend's pause, park and resume mechanics, driven directly",
    "pause_unload.json": "a parked stream over an unload, driven directly on the backend",
    "manager.json": "the Manager's speed: the decisions are pinned by the digest, not timed",
    "cluster.json": "the cluster gateway's hop and the router's speed, fake services",
    "gateway_profile.json": "the event loop's CPU per request and layer: a cost, not a choice",
    "hostile.json": "the front door's accept and refusal under a hostile address, fake services",
    "conformance.json": "the API document against the daemon's answers, fake services",
    "llama_build.json": "the llama.cpp build's compile times, no daemon runs",
    "gil.json": "how long each model's call holds Python's lock, one call at a time",
}


@dataclass(frozen=True)
class Staleness:
    result: str
    depends_on: tuple[str, ...]
    recorded: dict[str, str] | None
    today: dict[str, str]

    @property
    def stale(self) -> bool:
        if not self.recorded:
            return True
        return any(self.recorded.get(k) != self.today.get(k) for k in self.depends_on)

    def note(self, reason: str) -> str:
        """The line shown with a stale figure where it is published."""
        recorded = (self.recorded or {}).get("accelmux")
        was = f"decision digest `{recorded[:10]}`" if recorded else "no decision digest"
        return (
            f"**Stale**: `{self.result}` was measured under an older policy ({was}; "
            f"today's accelmux digest is `{self.today['accelmux'][:10]}`). {reason}"
        )


def today() -> dict[str, str]:
    import policy_digest

    data = policy_digest.committed()
    return {k: str(data[k]) for k in ALL}


def recorded(path: Path) -> dict[str, str] | None:
    """The digest a result records (None when it records none)."""
    import json

    meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")).get("meta", {})
    digest = meta.get("decisions")
    return {k: str(v) for k, v in digest.items()} if isinstance(digest, dict) else None


def staleness(name: str, now: dict[str, str] | None = None) -> Staleness | None:
    """How ``bench/results/<name>`` stands against today's digest (None: not dependent)."""
    if name not in DEPENDENT:
        return None
    return Staleness(name, DEPENDENT[name], recorded(RESULTS / name), now or today())


def listed_stale() -> dict[str, str]:
    """The benchmarks known to be stale, with the reason each was not measured again."""
    if not STALE_LIST.is_file():
        return {}
    data = yaml.safe_load(STALE_LIST.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{STALE_LIST}: expected a mapping of result file -> reason")
    return {str(k): str(v) for k, v in data.items()}
