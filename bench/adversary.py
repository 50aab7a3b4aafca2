"""The adversary: search the space of homes for where accelmux loses most to a baseline.

A *candidate* is a generated home (:func:`accelmux.sim.generate.generate_home`, any
kind) with changes laid over it, each one of the ways a real home differs from the ones
the policy was tuned on:

- ``device``: the device is smaller or larger (0.6x to 1.4x its memory);
- ``drop``: a service is not there (with its workloads);
- ``bias``: one service's estimates are wrong (its own request bias 0.5x-3x and resident
  bias 0.8x-2x, ``simulation.services.<name>``), the others as the home draws them;
- ``oom``: an out-of-memory injection: a program grabs 30-95 % of the device for 2-30 s
  without asking (``allocates: regardless``), so whatever allocates then fails as on a
  real device that filled up;
- ``foreign``: a program (a game, a transcode) takes 10-70 % of the memory and up to 90 %
  of the compute for 1-30 minutes;
- ``burst``: a burst of requests on one LLM (120-600 an hour, gamma CV 2-4, 2-15 minutes);
- ``window``: a maintenance window removed, or moved or added so that it opens within
  the run (the job starting when it opens), on a batch or background service that no
  camera feeds (:func:`_windowed` says why not on a camera);
- the simulation seed (0-4).

Each candidate runs accelmux and every baseline (``independent``, ``static``,
``ollama+containers``, ``llama-swap``) for :data:`DURATION_S` simulated seconds; its
*loss in a class* (one with at least :data:`MIN_REQUESTS` requests) is the best
baseline's attainment minus accelmux's in that same run. The search is a simple
evolutionary one: a first generation of random candidates, then each generation the
candidates that lost most so far are changed (a change added, redrawn or removed, another
seed) beside a few new random ones, the parents drawn from every class's worst in turn
(a niche per class: a class that loses 100 points easily does not crowd out the search
for the others). Candidates are drawn from ``--seed`` only and every run is
deterministic, so a search is the same for the same ``--seed`` and ``--evaluations``
whatever the number of workers; ``--minutes`` stops it earlier, between generations (the
JSON records how many evaluations ran: ``--evaluations`` that number repeats it).

Every class in which a candidate loses more than ``--threshold`` (10 points) is a
*finding*; its failure class is the losing class and what accelmux's misses there mostly
were (rejected and why, failed and why, served too late, never served). The worst findings
(``--shrink``) are then reduced: each change is taken out in turn and left out when the
loss stays past the threshold, so what remains is what the loss needs. Each finding is
written as a scenario file ``accelmux simulate`` reads (``simulation.seeds`` includes the
losing seed); ``bench/results/adversary.json`` has them all and
``bench/render_adversary.py`` renders docs/benchmarks.md's table. ``--keep N`` copies the
N worst into ``scenarios/regressions/`` and records their losses in its ``losses.json``
(``scripts/gate`` holds accelmux to them)::

    python bench/adversary.py --seed 1 --minutes 30 --out-dir /tmp/adversary
    python bench/adversary.py --seed 1 --evaluations 400      # the same search, repeated
    accelmux simulate /tmp/adversary/adv-0001-....yaml --policies accelmux,static
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import random
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accelmux.errors import ConfigError
from accelmux.sim.executor import Simulation
from accelmux.sim.generate import generate_home
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import Scenario, load_scenario, load_scenario_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worst_case
from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "adversary.json"
OURS = "accelmux"
BASELINES = ("independent", "static", "ollama+containers", "llama-swap")
POLICIES = (OURS, *BASELINES)
CLASSES = ("realtime", "interactive", "batch", "background")
DURATION_S = 1200.0
MIN_REQUESTS = 10
SIM_SEEDS = 5
KINDS_WEIGHTS = {"mixed": 0.6, "night-cameras": 0.2, "evening-game": 0.2}
CHANGE_KINDS = ("device", "drop", "bias", "oom", "foreign", "burst", "window")
MIB = 2**20


# ---- candidates ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    kind: str
    home: int
    seed: int
    changes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def describe(self) -> list[dict[str, Any]]:
        return [{"change": k, **dict(p)} for k, p in self.changes]

    def key(self) -> str:
        return json.dumps([self.kind, self.home, self.seed, self.describe()], sort_keys=True)


@dataclass
class Evaluated:
    """A candidate's runs; ``loss``, ``cls``, ``baseline`` and ``failure`` are those of
    one class (its worst, unless :meth:`of_class` chose another)."""

    candidate: Candidate
    loss: float
    cls: str | None
    baseline: str | None
    per_policy: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    index: int = 0
    #: per class with enough requests: (loss, best baseline, failure), against the
    #: baselines that gave up no higher class for it (worst_case.traded)
    losses: dict[str, tuple[float, str, str]] = field(default_factory=dict)
    #: per class: (loss, best baseline) against every baseline, traded or not
    raw: dict[str, tuple[float, str]] = field(default_factory=dict)

    def of_class(self, cls: str) -> Evaluated:
        loss, baseline, failure = self.losses[cls]
        return dataclasses.replace(self, loss=loss, cls=cls, baseline=baseline, failure=failure)


def _services(data: dict[str, Any]) -> list[str]:
    return list(data["services"])


def _llms(data: dict[str, Any]) -> list[str]:
    return [n for n, s in data["services"].items() if s["kind"] in ("chat", "completion")]


def _windowed(data: dict[str, Any]) -> list[str]:
    """The services a maintenance window may be laid on: batch and background services
    that no camera feeds. A camera's service is steady (a frame each fraction of a
    second, a deadline of about one): a window on it tells accelmux to let its frames
    use only spare memory outside the window, a configuration no baseline knows (none
    has windows), so the comparison would measure the configuration, not the policy.
    The generated homes never window a camera either."""
    fed = {w.get("service") for w in data["workloads"] if w.get("type") == "camera"}
    return [
        n
        for n, s in data["services"].items()
        if s["class"] in ("batch", "background") and n not in fed and not s.get("steady")
    ]


def _capacity(data: dict[str, Any]) -> int:
    dev = next(iter(data["devices"].values()))
    return _bytes(dev["capacity"])


def _bytes(text: str | int) -> int:
    if isinstance(text, int):
        return text
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "GB": 10**9, "MB": 10**6}
    for suffix, mult in units.items():
        if str(text).endswith(suffix):
            return int(float(str(text)[: -len(suffix)]) * mult)
    return int(float(text))


def draw_change(
    rng: random.Random, data: dict[str, Any], duration_s: float
) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """One random change that applies to ``data`` (None when the kind drawn cannot)."""
    kind = rng.choice(CHANGE_KINDS)
    names = _services(data)
    p: dict[str, Any]
    if kind == "device":
        p = {"scale": round(rng.uniform(0.6, 1.4), 2)}
    elif kind == "drop":
        if len(names) < 2:
            return None
        p = {"service": rng.choice(names)}
    elif kind == "bias":
        p = {
            "service": rng.choice(names),
            "request_bias": round(rng.uniform(0.5, 3.0), 2),
            "resident_bias": round(rng.uniform(0.8, 2.0), 2),
        }
    elif kind == "oom":
        p = {
            "at_s": round(rng.uniform(60.0, 0.95 * duration_s), 1),
            "share": round(rng.uniform(0.3, 0.95), 2),
            "duration_s": round(rng.uniform(2.0, 30.0), 1),
        }
    elif kind == "foreign":
        p = {
            "at_s": round(rng.uniform(0.0, 0.9 * duration_s), 1),
            "share": round(rng.uniform(0.1, 0.7), 2),
            "duration_s": float(rng.choice([60, 180, 300, 600, 1200, 1800])),
            "compute_share": round(rng.choice([0.0, rng.uniform(0.1, 0.9)]), 2),
        }
    elif kind == "burst":
        llms = _llms(data)
        if not llms:
            return None
        start = round(rng.uniform(60.0, 0.8 * duration_s), 1)
        p = {
            "service": rng.choice(llms),
            "rate_per_h": float(rng.choice([120, 240, 360, 600])),
            "cv": round(rng.uniform(2.0, 4.0), 2),
            "from_s": start,
            "until_s": round(min(duration_s, start + rng.uniform(120.0, 900.0)), 1),
        }
    else:  # window
        batch = _windowed(data)
        if not batch:
            return None
        # removed (the job runs any time), or opening within the run's first half for
        # 1-6 hours, as the generated homes' windows do: a window that never opens in a
        # 20-minute run would leave the job to spare memory the whole run, which only
        # says that accelmux keeps the window (no baseline knows windows)
        p = {
            "service": rng.choice(batch),
            "window": None
            if rng.random() < 0.4
            else {
                "opens_after": round(rng.uniform(0.0, 0.5), 2),
                "hours": rng.choice([1, 2, 4, 6]),
            },
        }
    return kind, tuple(sorted(p.items()))


def _remove_service(data: dict[str, Any], name: str) -> None:
    data["services"].pop(name, None)
    data["simulation"]["services"].pop(name, None)
    kept = []
    for w in data["workloads"]:
        used = {w.get("service"), w.get("asr"), w.get("llm"), w.get("tts")}
        if name not in used:
            kept.append(w)
    data["workloads"] = kept


def apply(candidate: Candidate, duration_s: float) -> dict[str, Any] | None:
    """The scenario data of ``candidate`` (None when its changes leave nothing to run)."""
    gen = generate_home(candidate.home, duration_s=duration_s, kind=candidate.kind)
    data = copy.deepcopy(gen.data)
    data["simulation"]["seeds"] = candidate.seed + 1
    cap = _capacity(data)
    for kind, params in candidate.changes:
        p = dict(params)
        if kind == "device":
            dev = next(iter(data["devices"].values()))
            new_cap = int(cap * p["scale"])
            if "budget" in dev:
                gap = cap - _bytes(dev["budget"])
                dev["budget"] = f"{max(new_cap - gap, new_cap // 2) // MIB}MiB"
            dev["capacity"] = f"{new_cap // MIB}MiB"
            cap = new_cap
        elif kind == "drop":
            _remove_service(data, p["service"])
        elif kind == "bias" and p["service"] in data["services"]:
            perf = data["simulation"]["services"].setdefault(p["service"], {})
            perf["request_bias"] = p["request_bias"]
            perf["resident_bias"] = p["resident_bias"]
        elif kind in ("oom", "foreign"):
            entry: dict[str, Any] = {
                "name": "oom-injection" if kind == "oom" else "foreign-program",
                "at_s": p["at_s"],
                "bytes": f"{max(1, int(cap * p['share']) // MIB)}MiB",
                "duration_s": p["duration_s"],
            }
            if kind == "foreign" and p["compute_share"]:
                entry["compute_share"] = p["compute_share"]
            data["simulation"]["foreign"].append(entry)
        elif kind == "burst" and p["service"] in data["services"]:
            svc = data["services"][p["service"]]
            ctx = (
                _bytes(svc["memory"].get("kv_ceiling", "0"))
                // max(1, _bytes(svc["memory"].get("kv_per_token", "1KiB")))
                // max(1, int(svc.get("concurrency", 1)))
            )
            prompt_max = float(max(300, min(8000, ctx - 300)))
            data["workloads"].append(
                {
                    "type": "gamma",
                    "name": f"{p['service']}-adversary-burst",
                    "service": p["service"],
                    "rate_per_h": p["rate_per_h"],
                    "cv": p["cv"],
                    "prompt_tokens": {
                        "mean": min(1500.0, prompt_max / 2),
                        "cv": 0.6,
                        "min": 32,
                        "max": prompt_max,
                    },
                    "output_tokens": {"mean": 150.0, "cv": 0.5, "min": 8, "max": 280.0},
                    "from_s": p["from_s"],
                    "until_s": p["until_s"],
                }
            )
        elif kind == "window" and p["service"] in data["services"]:
            svc = data["services"][p["service"]]
            opens = None
            if p["window"] is None:
                svc.pop("windows", None)
            else:
                opens = _clock(data["simulation"]["start"], p["window"]["opens_after"] * duration_s)
                closes = _clock(opens, 3600.0 * p["window"]["hours"])
                svc["windows"] = [f"{opens}-{closes}"]
            for w in data["workloads"]:
                if w.get("type") == "indexing" and w.get("service") == p["service"]:
                    w.pop("at", None)
                    w.pop("from_s", None)
                    if opens is None:
                        w["from_s"] = 0.0
                    else:
                        w["at"] = opens  # the job starts when its window opens
    if not data["workloads"] or not data["services"]:
        return None
    return data


def _clock(hh_mm: str, after_s: float) -> str:
    """The time of day ``after_s`` seconds after ``hh_mm``, to the minute."""
    h, m = (int(x) for x in hh_mm.split(":"))
    t = (h * 60 + m + round(after_s / 60)) % (24 * 60)
    return f"{t // 60:02d}:{t % 60:02d}"


def random_candidate(rng: random.Random, duration_s: float) -> Candidate:
    kind = rng.choices(list(KINDS_WEIGHTS), weights=list(KINDS_WEIGHTS.values()))[0]
    home = rng.randrange(100_000, 1_000_000)  # far from the suite's and holdout's homes
    base = Candidate(kind, home, rng.randrange(SIM_SEEDS))
    changes = []
    data = apply(base, duration_s) or {}
    for _ in range(rng.choice([1, 2, 3])):
        change = draw_change(rng, data, duration_s) if data else None
        if change is not None:
            changes.append(change)
    return Candidate(kind, home, base.seed, tuple(changes))


def mutate(rng: random.Random, parent: Candidate, duration_s: float) -> Candidate:
    changes = list(parent.changes)
    seed = parent.seed
    roll = rng.random()
    data = apply(Candidate(parent.kind, parent.home, seed), duration_s) or {}
    if roll < 0.15:
        seed = rng.randrange(SIM_SEEDS)
    elif roll < 0.35 and changes:
        changes.pop(rng.randrange(len(changes)))
    elif roll < 0.65 and changes:
        i = rng.randrange(len(changes))
        kind = changes[i][0]
        for _ in range(5):
            redraw = draw_change(rng, data, duration_s)
            if redraw is not None and redraw[0] == kind:
                changes[i] = redraw
                break
    else:
        change = draw_change(rng, data, duration_s)
        if change is not None and len(changes) < 6:
            changes.append(change)
    return Candidate(parent.kind, parent.home, seed, tuple(changes))


# ---- evaluation ----------------------------------------------------------------------------
def _failure(report: dict[str, Any], cls: str) -> str:
    """What accelmux's misses in ``cls`` mostly were."""
    missed: dict[str, float] = {}
    for svc in report["services"].values():
        if svc["class"] != cls:
            continue
        for reason, n in svc["outcomes"].items():
            label = reason if reason.startswith("failed:") else f"rejected:{reason}"
            missed[label] = missed.get(label, 0) + n
        missed["never served (open at the end)"] = missed.get(
            "never served (open at the end)", 0
        ) + svc.get("undone", 0)
    c = report["classes"][cls]
    late = c["requests"] - c["slo_met"] - c["rejected"] - c["failed"] - c.get("undone", 0)
    missed["served too late"] = missed.get("served too late", 0) + max(0, late)
    top = max(missed.items(), key=lambda kv: (kv[1], kv[0]))
    return f"{cls}: {top[0]}"


Losses = dict[str, tuple[float, str, str]]
RawLosses = dict[str, tuple[float, str]]


def class_losses(scn: Scenario, seed: int) -> tuple[dict[str, Any], Losses, RawLosses]:
    """Every policy's run of ``scn`` at ``seed`` (a :func:`worst_case.run_row`'s
    policies) and, per class with at least :data:`MIN_REQUESTS` requests in which
    accelmux is behind: (loss, the best baseline, what accelmux's misses mostly were)
    against the baselines that gave up no higher class for it and kept within the
    device's budget (:func:`worst_case.traded`), and (loss, best baseline) against every
    baseline."""
    # each report records what its services held against the budget (every generated
    # home has one device), from which run_row reads over_budget
    reports = {p: summarize(Simulation(scn, p, seed).run()) for p in POLICIES}
    row = worst_case.run_row("candidate", seed, reports)
    ours = row["policies"][OURS]
    losses: Losses = {}
    raw: RawLosses = {}
    for c in CLASSES:
        if ours["requests"].get(c, 0) < MIN_REQUESTS or c not in ours["classes"]:
            continue
        best = worst_case.best_baseline(row, c)
        if best is not None and best[0] > ours["classes"][c]:
            raw[c] = (best[0] - ours["classes"][c], best[1])
        fair = worst_case.best_untraded(row, c)
        if fair is not None and fair[0] > ours["classes"][c]:
            losses[c] = (fair[0] - ours["classes"][c], fair[1], _failure(reports[OURS], c))
    return row["policies"], losses, raw


def evaluate(candidate: Candidate, duration_s: float) -> Evaluated:
    data = apply(candidate, duration_s)
    if data is None:
        return Evaluated(candidate, 0.0, None, None)
    scn = load_scenario_data(data, "adversary.yaml", ROOT)
    per_policy, losses, raw = class_losses(scn, candidate.seed)
    ev = Evaluated(candidate, 0.0, None, None, per_policy, losses=losses, raw=raw)
    if not losses:
        return ev
    worst = max(losses, key=lambda c: (losses[c][0], -CLASSES.index(c)))
    return ev.of_class(worst)


#: Address space one evaluation may use: a candidate that runs away (a burst that queues
#: without end) fails with MemoryError, recorded, instead of the machine killing a worker.
MEMORY_LIMIT = 6 * 2**30


def _evaluate_job(job: tuple[Candidate, float]) -> Evaluated:
    """One evaluation in a pool worker; a candidate the simulator cannot run is recorded
    as such (no loss) rather than ending the search."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > MEMORY_LIMIT:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    try:
        return evaluate(*job)
    except (MemoryError, RecursionError, ValueError, ArithmeticError, ConfigError) as exc:
        # ConfigError: the changes left a home no configuration check passes (a device
        # shrunk below a model it hosts), which no user could run either
        ev = Evaluated(job[0], 0.0, None, None)
        ev.failure = f"not run: {type(exc).__name__}: {exc}"[:200]
        return ev


def evaluate_all(cands: list[Candidate], duration_s: float, workers: int) -> list[Evaluated]:
    jobs = [(c, duration_s) for c in cands]
    if workers <= 1:
        return [_evaluate_job(j) for j in jobs]
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_evaluate_job, jobs, chunksize=1))
    except BrokenProcessPool:  # a worker was killed from outside: this batch again, here
        print("a worker process died: the generation runs again in this process", flush=True)
        return [_evaluate_job(j) for j in jobs]


# ---- the search ----------------------------------------------------------------------------
def search(args: argparse.Namespace) -> tuple[list[Evaluated], int, int]:
    """Every candidate evaluated, in order; and the generations run."""
    rng = random.Random(f"accelmux-adversary:{args.seed}")
    seen: set[str] = set()
    done: list[Evaluated] = []
    started = time.monotonic()
    generation = 0
    while len(done) < args.evaluations:
        if args.minutes and time.monotonic() - started > 60 * args.minutes:
            break
        size = min(args.population, args.evaluations - len(done))
        niches = _niches(done, args.elite)
        batch: list[Candidate] = []
        tries = 0
        while len(batch) < size and tries < 50 * size:
            tries += 1
            if generation == 0 or not niches or rng.random() < args.explore:
                cand = random_candidate(rng, args.duration_s)
            else:
                elite = niches[rng.choice(sorted(niches))]
                parent = elite[min(int(rng.expovariate(1.0 / 2.0)), len(elite) - 1)]
                cand = mutate(rng, parent.candidate, args.duration_s)
            if cand.key() not in seen:
                seen.add(cand.key())
                batch.append(cand)
        for ev in evaluate_all(batch, args.duration_s, args.workers):
            ev.index = len(done)
            done.append(ev)
        generation += 1
        best = {c: 100 * n[0].losses[c][0] for c, n in sorted(_niches(done, 1).items())}
        print(
            f"generation {generation}: {len(done)} evaluated, worst loss per class "
            + ", ".join(f"{c} {v:.1f}" for c, v in best.items()),
            flush=True,
        )
    return done, generation, len(seen)


def _niches(done: list[Evaluated], size: int) -> dict[str, list[Evaluated]]:
    """Per class, the ``size`` candidates that lost most in it: the search changes the
    worst of every class, so a class that saturates (a batch job 100 points behind) does
    not crowd out the others."""
    niches = {}
    for c in CLASSES:
        lost = [e for e in done if e.losses.get(c, (0.0,))[0] > 0]
        if lost:
            niches[c] = sorted(lost, key=lambda e: (-e.losses[c][0], e.index))[:size]
    return niches


def shrink(ev: Evaluated, args: argparse.Namespace) -> Evaluated:
    """``ev`` with every change left out whose absence keeps the loss past the threshold."""
    current = ev
    for change in list(ev.candidate.changes):
        changes = tuple(c for c in current.candidate.changes if c != change)
        trial = Candidate(ev.candidate.kind, ev.candidate.home, ev.candidate.seed, changes)
        result = evaluate(trial, args.duration_s)
        if ev.cls in result.losses and result.losses[ev.cls][0] > args.threshold:
            current = dataclasses.replace(result.of_class(ev.cls), index=ev.index)
    return current


def _name(ev: Evaluated) -> str:
    cls = ev.cls or "none"
    return f"adv-{ev.index:04d}-{ev.candidate.kind}-{ev.candidate.home}-s{ev.candidate.seed}-{cls}"


def scenario_text(ev: Evaluated, duration_s: float, search_seed: int) -> str:
    data = apply(ev.candidate, duration_s)
    assert data is not None
    ours = ev.per_policy[OURS]["classes"].get(ev.cls or "", 0.0)
    best = ev.per_policy[ev.baseline or OURS]["classes"].get(ev.cls or "", 0.0)
    lines = [
        f"# Found by bench/adversary.py (search seed {search_seed}, evaluation {ev.index}).",
        f"# Generated home: kind {ev.candidate.kind}, seed {ev.candidate.home}; changes:",
        *[f"#   {json.dumps(c, sort_keys=True)}" for c in ev.candidate.describe()],
        f"# Loss at simulation seed {ev.candidate.seed} (the last of simulation.seeds): "
        f"{ev.cls} {100 * ours:.1f}% under accelmux, {100 * best:.1f}% under "
        f"{ev.baseline} ({100 * ev.loss:.1f} points); failure: {ev.failure}.",
        "# A record of a loss today's policy has, not a claim that it is fixed.",
        f"#   accelmux simulate THIS.yaml --policies accelmux,{ev.baseline}",
    ]
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return "\n".join(lines) + "\n\n" + body


def _finding(ev: Evaluated, path: Path | None) -> dict[str, Any]:
    return {
        "evaluation": ev.index,
        "scenario": None if path is None else path.name,
        "kind": ev.candidate.kind,
        "home": ev.candidate.home,
        "seed": ev.candidate.seed,
        "changes": ev.candidate.describe(),
        "class": ev.cls,
        "loss_points": round(100 * ev.loss, 2),
        "baseline": ev.baseline,
        "failure": ev.failure,
        "attainment": {p: v["classes"] for p, v in ev.per_policy.items()},
        "requests": ev.per_policy[OURS]["requests"],
        "zero_service_s": ev.per_policy[OURS]["zero_service_s"],
        "losses_points": {c: round(100 * v[0], 2) for c, v in ev.losses.items()},
        # against every baseline, also those that gave up a higher class for it
        "raw_losses_points": {c: [round(100 * v[0], 2), v[1]] for c, v in ev.raw.items()},
        "over_budget": sorted(p for p, v in ev.per_policy.items() if v.get("over_budget")),
        # behind by more than twice the standard error of the difference (the suite's
        # "beyond noise"): a loss of a few requests out of ten or twenty may be noise
        "beyond_noise": worst_case.beyond_noise(
            {"policies": ev.per_policy}, ev.cls or "", ev.baseline or ""
        ),
    }


REGRESSIONS = ROOT / "scenarios" / "regressions"


def keep(rows: list[dict[str, Any]], out_dir: Path, n: int, search_seed: int) -> list[str]:
    """Copy ``n`` findings (the worst of each failure class, then the worst of the rest)
    into ``scenarios/regressions/`` and record their losses in its ``losses.json``
    (today's losses: a record, not a claim they are fixed; ``scripts/gate`` holds
    accelmux to them)."""
    REGRESSIONS.mkdir(parents=True, exist_ok=True)
    record_path = REGRESSIONS / "losses.json"
    record: dict[str, Any] = (
        json.loads(record_path.read_text(encoding="utf-8"))
        if record_path.is_file()
        else {"scenarios": {}}
    )
    # the worst of each failure class first, then the worst of the rest
    rows = sorted(rows, key=lambda r: (-r["loss_points"], r["evaluation"]))
    firsts: dict[str, dict[str, Any]] = {}
    for row in rows:
        firsts.setdefault(row["failure"], row)
    chosen = list(firsts.values())[:n]
    chosen += [r for r in rows if r not in chosen][: n - len(chosen)]
    kept = []
    for row in chosen:
        name = str(row["scenario"])
        (REGRESSIONS / name).write_text(
            (out_dir / name).read_text(encoding="utf-8"), encoding="utf-8"
        )
        record["scenarios"][name] = {
            "search_seed": search_seed,
            "seed": row["seed"],
            "class": row["class"],
            "baseline": row["baseline"],
            "loss_points": row["loss_points"],
            "failure": row["failure"],
            "accelmux": row["attainment"]["accelmux"],
            "best_baseline": row["attainment"][row["baseline"]],
            "zero_service_s": row["zero_service_s"],
            "losses_points": row["losses_points"],
            "raw_losses_points": row["raw_losses_points"],
            "status": "open",  # it lost more than the threshold: a finding
        }
        kept.append(name)
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return kept


def recheck(threshold: float) -> dict[str, Any]:
    """Run every kept regression scenario again at its losing seed under every policy and
    record what today's policy does there: per class the loss to the best baseline, the
    worst class, and its status: ``fixed`` when no class (with at least
    :data:`MIN_REQUESTS` requests) is more than ``threshold`` below the best baseline of
    that run (the bound ``tests/sim/test_regressions.py`` holds a fixed case to),
    ``open`` otherwise. Run it after a change to the policy (the record is what
    ``scripts/gate`` and the tests compare with)."""
    record_path = REGRESSIONS / "losses.json"
    record: dict[str, Any] = json.loads(record_path.read_text(encoding="utf-8"))
    for name, entry in sorted(record["scenarios"].items()):
        seed = int(entry["seed"])
        per_policy, losses, raw = class_losses(load_scenario(REGRESSIONS / name), seed)
        worst = max(losses, key=lambda c: (losses[c][0], -CLASSES.index(c)), default=None)
        entry["accelmux"] = per_policy[OURS]["classes"]
        entry["losses_points"] = {c: round(100 * v[0], 2) for c, v in losses.items()}
        entry["raw_losses_points"] = {c: [round(100 * v[0], 2), v[1]] for c, v in raw.items()}
        if worst is not None:
            loss, baseline, failure = losses[worst]
            entry.update(
                {
                    "class": worst,
                    "baseline": baseline,
                    "loss_points": round(100 * loss, 2),
                    "failure": failure,
                }
            )
        else:
            # no loss: the class stays, against the best baseline that traded nothing
            entry["loss_points"] = 0.0
            fair = worst_case.best_untraded({"policies": per_policy}, entry["class"])
            # None: every baseline gave up a higher class or the budget
            entry["baseline"] = None if fair is None else fair[1]
        baseline = entry["baseline"]
        entry["best_baseline"] = {} if baseline is None else per_policy[baseline]["classes"]
        entry["over_budget"] = sorted(p for p, v in per_policy.items() if v.get("over_budget"))
        entry["status"] = (
            "open" if any(v[0] > threshold + 1e-12 for v in losses.values()) else "fixed"
        )
        print(f"{name}: {entry['status']}, worst {entry['class']} {entry['loss_points']:.1f}")
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="the search's seed")
    parser.add_argument(
        "--evaluations", type=int, default=100_000, help="candidates to evaluate at most"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="wall budget (0: none); stops between generations",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--population", type=int, default=24, help="candidates per generation")
    parser.add_argument("--elite", type=int, default=8, help="parents kept per generation")
    parser.add_argument("--explore", type=float, default=0.25, help="share of new random ones")
    parser.add_argument("--duration-s", type=float, default=DURATION_S)
    parser.add_argument("--threshold", type=float, default=0.10, help="a finding's least loss")
    parser.add_argument("--shrink", type=int, default=8, help="reduce the worst N findings")
    parser.add_argument("--out-dir", type=Path, default=Path("adversary-findings"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep", type=int, default=0, help="copy the N worst findings to scenarios/regressions"
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="only run the kept regression scenarios again and record today's losses",
    )
    args = parser.parse_args()
    if args.recheck:
        recheck(args.threshold)
        return 0
    if args.evaluations < 1 or args.population < 1:
        parser.error("--evaluations and --population must be >= 1")
    settings = {
        k: getattr(args, k)
        for k in ("seed", "evaluations", "minutes", "workers", "population", "elite", "explore")
    } | {"duration_s": args.duration_s, "threshold": args.threshold, "shrink": args.shrink}
    meta = run_meta(settings)
    started, cpu = time.monotonic(), time.process_time()
    done, generations, _ = search(args)
    findings = sorted(
        (e.of_class(c) for e in done for c in e.losses if e.losses[c][0] > args.threshold),
        key=lambda e: (-e.loss, e.index, CLASSES.index(e.cls or "realtime")),
    )
    # one finding per (home, failure class): the worst
    distinct: dict[tuple[str, int, str | None], Evaluated] = {}
    for ev in findings:
        distinct.setdefault((ev.candidate.kind, ev.candidate.home, ev.failure), ev)
    kept = list(distinct.values())
    reduced = [shrink(ev, args) for ev in kept[: args.shrink]] + kept[args.shrink :]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for ev in reduced:
        path = args.out_dir / f"{_name(ev)}.yaml"
        path.write_text(scenario_text(ev, args.duration_s, args.seed), encoding="utf-8")
        rows.append(_finding(ev, path))
    classes: dict[str, dict[str, Any]] = {}
    for ev in findings:
        entry = classes.setdefault(
            ev.failure or "?", {"findings": 0, "worst_points": 0.0, "homes": set()}
        )
        entry["findings"] += 1
        entry["worst_points"] = max(entry["worst_points"], round(100 * ev.loss, 2))
        entry["homes"].add(f"{ev.candidate.kind}-{ev.candidate.home}")
    report = {
        "meta": meta,
        "evaluations": len(done),
        "generations": generations,
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s_main": round(time.process_time() - cpu, 1),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "worst_loss_points": round(100 * max((e.loss for e in done), default=0.0), 2),
        "findings": len(findings),
        "distinct_beyond_noise": sum(1 for r in rows if r["beyond_noise"]),
        "failure_classes": {
            k: {**v, "homes": len(v["homes"])}
            for k, v in sorted(classes.items(), key=lambda kv: -kv[1]["worst_points"])
        },
        "distinct": rows,
        "losses_by_evaluation": [round(100 * e.loss, 2) for e in done],
        "not_run": [
            {"evaluation": e.index, "changes": e.candidate.describe(), "why": e.failure}
            for e in done
            if e.failure and e.failure.startswith("not run")
        ],
        "worst_loss_per_class": {
            c: round(100 * n[0].losses[c][0], 2) for c, n in _niches(done, 1).items()
        },
        # against every baseline, also one that gave up a higher class for it
        "worst_raw_loss_per_class": {
            c: round(100 * max((e.raw[c][0] for e in done if c in e.raw), default=0.0), 2)
            for c in CLASSES
        },
    }
    if args.keep:
        report["kept"] = keep(rows, args.out_dir, args.keep, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {args.out}: {len(done)} evaluations, {len(findings)} findings, "
        f"{len(rows)} files in {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
