"""Degrading on generated homes: ``bench/results/degrade.json``.

Usage::

    .venv/bin/python bench/bench_degrade.py                   # 8 homes per kind x 2 seeds
    .venv/bin/python bench/bench_degrade.py --homes 2 --seeds 1 --duration 600   # a quick look

On the ``evening-game`` and ``small-gpu`` homes (:func:`accelmux.sim.generate.generate_home`),
each seed runs, in the same run:

- ``accelmux+degrade``: accelmux on the home with a CPU fallback and a partial-offload
  range declared for each LLM that is not realtime
  (:func:`accelmux.sim.generate.with_degrade`; the layer-split cost model,
  accelmux.sim.degrade_cost, makes each lesser form slower);
- ``accelmux``: accelmux on the home as generated (today's behaviour, without degrading);
- every baseline (``independent``, ``static``, ``ollama+containers``, ``llama-swap``) on
  the home as generated: they place no forms (a policy without ``route`` runs each
  service on its first device: the full form), so they run as they always did.

The targets, judged per home and seed (the worst run counts, not the mean):

- interactive and batch: ``accelmux+degrade`` within 5 points of the best baseline (the
  issue's target: the best of the four for that class, which may be a different baseline
  for each class);
- the same, against the best baseline **at no higher class's cost**: only baselines
  whose attainment in every class ranked above (realtime above interactive above batch)
  is at most 5 points below accelmux+degrade's in that run count. accelmux ranks the
  classes by design (voice first); a baseline that reaches more batch by leaving chat or
  voice unserved made another trade, not a better one. Where no baseline qualifies, the
  run has nothing to compare with (it passes). Both are reported; neither replaces the
  other;
- realtime: ``accelmux+degrade`` not below ``accelmux`` (degrading takes nothing from it);
- 0 extra OOMs: ``accelmux+degrade`` causes no more out-of-memory events than
  ``accelmux`` (the OOMs the policy caused: a foreign program's growth since the last
  memory sample is counted apart, as bench/bench_suite.py does).

The JSON records every run's figures (``runs``), the per-run comparisons (``rows``), the
targets with their worst case, and the means per kind; bench/render_degrade.py renders
them into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from accelmux.core.types import ServiceClass
from accelmux.sim.executor import RunOutput, Simulation
from accelmux.sim.generate import generate_home, with_degrade
from accelmux.sim.metrics import meets_slo, summarize
from accelmux.sim.runner import DEFAULT_POLICIES
from accelmux.sim.scenario import Scenario, load_scenario_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worst_case
from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
KINDS = ("evening-game", "small-gpu")
OURS = "accelmux+degrade"
TODAY = "accelmux"
#: every baseline policy but the oracle (which knows the future)
BASELINES = tuple(p for p in DEFAULT_POLICIES if p not in (TODAY, "oracle"))
LABELS = (OURS, TODAY, *BASELINES)
CLASSES = tuple(c.label for c in ServiceClass)
#: interactive and batch: at most this far below the best baseline in any run
SLACK = 0.05
DURATION_S = 1800.0


@dataclass(frozen=True, slots=True)
class Job:
    kind: str
    home: int
    seed: int
    label: str
    duration_s: float


@lru_cache(maxsize=16)
def _scenario(kind: str, home: int, duration_s: float, degrade: bool) -> Scenario:
    gen = generate_home(home, duration_s=duration_s, kind=kind)
    data = with_degrade(gen) if degrade else gen.data
    return load_scenario_data(data, f"{gen.name}.yaml", ROOT)


def run_job(job: Job) -> dict[str, Any]:
    started = time.process_time()
    scn = _scenario(job.kind, job.home, job.duration_s, job.label == OURS)
    policy = "accelmux" if job.label in (OURS, TODAY) else job.label
    sim = Simulation(scn, policy, job.seed)
    out = sim.run()
    r = summarize(out)
    placed = {name: spec.device for name, spec in sim.services.items()}
    over = met_while_over_committed(
        out, placed, next(iter(sim.devices)), sim.sim_cfg.sample_period_s
    )
    return {
        "kind": job.kind,
        "home": job.home,
        "seed": job.seed,
        "label": job.label,
        "classes": {
            c: {
                "requests": v["requests"],
                "slo_attainment": v["slo_attainment"],
                "met_while_over_committed": over.get(c, 0),
            }
            for c, v in r["classes"].items()
            if v["requests"]
        },
        "ooms": int(r["oom_events"]) - int(r["oom_events_unforeseen_foreign"]),
        "ooms_unforeseen_foreign": int(r["oom_events_unforeseen_foreign"]),
        # the share of the memory the game and other programs asked for that they went
        # without (byte-seconds): what a policy's service cost them
        "foreign_starved_share": r["foreign"]["starved_share"] or 0.0,
        "cpu_s": time.process_time() - started,
    }


def met_while_over_committed(
    out: RunOutput, placed: dict[str, str], card: str, period_s: float
) -> dict[str, int]:
    """Per class, the measured requests run on ``card`` (the first device, whose memory
    the samples hold; ``placed``: each replica's device) that met their objective while
    it was over-committed (a foreign program short of memory the services held) at some
    memory sample from the one before they started to their end: service a policy gave
    at the game's expense (sample ``i`` is taken at ``(i + 1) x period_s``)."""
    cap = out.capacity_gib * 1024**3
    over = {i for i, smp in enumerate(out.samples) if smp.used > cap}
    found: dict[str, int] = {}
    if not over:
        return found
    for req in out.requests.values():
        device = placed.get(req.replica, placed.get(req.service))
        if req.arrived_at < out.warmup_s or req.finished_at is None or device != card:
            continue
        if not meets_slo(req, out.slo[req.service], out.services[req.service].kind.is_llm):
            continue
        start = req.started_at if req.started_at is not None else req.arrived_at
        first = max(0, math.floor(start / period_s) - 1)
        last = math.floor(req.finished_at / period_s)
        if any(i in over for i in range(first, last + 1)):
            found[req.cls.label] = found.get(req.cls.label, 0) + 1
    return found


def compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (kind, home, seed): accelmux+degrade against the best baseline per
    class, against accelmux for realtime, and its extra OOMs."""
    by_key: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for r in runs:
        by_key.setdefault((r["kind"], r["home"], r["seed"]), {})[r["label"]] = r
    rows = []
    for (kind, home, seed), got in sorted(by_key.items()):
        ours, today = got[OURS], got[TODAY]
        row: dict[str, Any] = {
            "kind": kind,
            "home": f"{kind}-{home:04d}",
            "seed": seed,
            "attainment": {label: _attainments(got[label]) for label in LABELS},
            "minus_best_baseline": {},
            "best_baseline": {},
            "best_met_while_over_committed": {},
            "minus_best_baseline_no_higher_cost": {},
            "best_baseline_no_higher_cost": {},
            "realtime_minus_accelmux": None,
            "extra_ooms": max(0, ours["ooms"] - today["ooms"]),
        }
        for c in CLASSES:
            if c not in ours["classes"]:
                continue
            base = {
                b: got[b]["classes"][c]["slo_attainment"]
                for b in BASELINES
                if c in got[b]["classes"]
            }
            best = max(base, key=lambda b: (base[b], b))
            row["best_baseline"][c] = best
            row["minus_best_baseline"][c] = ours["classes"][c]["slo_attainment"] - base[best]
            row["best_met_while_over_committed"][c] = got[best]["classes"][c].get(
                "met_while_over_committed", 0
            )
            fair = [b for b in base if _no_higher_cost(got[b], ours, c)]
            if fair:
                best = max(fair, key=lambda b: (base[b], b))
                row["best_baseline_no_higher_cost"][c] = best
                row["minus_best_baseline_no_higher_cost"][c] = (
                    ours["classes"][c]["slo_attainment"] - base[best]
                )
            else:
                row["best_baseline_no_higher_cost"][c] = None
        if "realtime" in ours["classes"] and "realtime" in today["classes"]:
            row["realtime_minus_accelmux"] = (
                ours["classes"]["realtime"]["slo_attainment"]
                - today["classes"]["realtime"]["slo_attainment"]
            )
        rows.append(row)
    return rows


def _no_higher_cost(base: dict[str, Any], ours: dict[str, Any], cls: str) -> bool:
    """Whether a baseline's run gives every class ranked above ``cls`` at most SLACK less
    than accelmux+degrade's run does."""
    return worst_case.gave_up_above(_attainments(base), _attainments(ours), cls, SLACK) is None


def _attainments(run: dict[str, Any]) -> dict[str, float]:
    return {c: v["slo_attainment"] for c, v in run["classes"].items()}


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in ("interactive", "batch"):
        out[f"{c}_within_5_points"] = _within(rows, c, "minus_best_baseline")
        out[f"{c}_within_5_points_no_higher_cost"] = _within(
            rows, c, "minus_best_baseline_no_higher_cost"
        )
    rt = [
        (r["realtime_minus_accelmux"], r["home"], r["seed"])
        for r in rows
        if r["realtime_minus_accelmux"] is not None
    ]
    worst_rt = min(rt) if rt else None
    out["realtime_unchanged"] = {
        "runs": len(rt),
        "below": sum(1 for d, _, _ in rt if d < 0),
        "worst": {"minus_accelmux": worst_rt[0], "home": worst_rt[1], "seed": worst_rt[2]}
        if worst_rt
        else None,
        "met": all(d >= 0 for d, _, _ in rt),
    }
    extra = sum(r["extra_ooms"] for r in rows)
    out["no_extra_ooms"] = {
        "extra_ooms": extra,
        "runs_with_extra": [f"{r['home']} seed {r['seed']}" for r in rows if r["extra_ooms"]],
        "met": extra == 0,
    }
    return out


def _within(rows: list[dict[str, Any]], c: str, key: str) -> dict[str, Any]:
    """Class ``c`` within SLACK of the baseline ``key`` compares with, in every run."""
    got = [(r[key][c], r["home"], r["seed"]) for r in rows if c in r[key]]
    without = sum(1 for r in rows if c in r["minus_best_baseline"] and c not in r[key])
    failed = [g for g in got if g[0] < -SLACK]
    worst = min(got) if got else None
    return {
        "runs": len(got),
        "passed": len(got) - len(failed),
        "worst": {"minus_best_baseline": worst[0], "home": worst[1], "seed": worst[2]}
        if worst
        else None,
        "failed": [{"home": h, "seed": s, "minus_best_baseline": d} for d, h, s in sorted(failed)],
        "met": not failed,
        "nothing_to_compare": without,
    }


def means(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per kind and label, each class's attainment averaged over the runs that have it,
    and the OOMs per run."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in sorted({r["kind"] for r in runs}):
        for label in LABELS:
            mine = [r for r in runs if r["kind"] == kind and r["label"] == label]
            entry: dict[str, float] = {}
            for c in CLASSES:
                vals = [r["classes"][c]["slo_attainment"] for r in mine if c in r["classes"]]
                if vals:
                    entry[c] = sum(vals) / len(vals)
            entry["ooms_per_run"] = sum(r["ooms"] for r in mine) / max(1, len(mine))
            entry["foreign_starved_share"] = sum(
                r.get("foreign_starved_share", 0.0) for r in mine
            ) / max(1, len(mine))
            out.setdefault(kind, {})[label] = entry
    return out


#: What the degrade digest covers (tests/sim/degrade_digest.json): accelmux on these
#: homes with their degrade sections, seed 0, the first GOLDEN_DURATION_S seconds. The
#: policy digest (bench/policy_digest.py) runs the shipped scenarios, which declare no
#: degrade section: these decisions are pinned here instead.
GOLDEN = ROOT / "tests" / "sim" / "degrade_digest.json"
GOLDEN_HOMES = (("evening-game", 0), ("evening-game", 6), ("small-gpu", 5), ("small-gpu", 7))
GOLDEN_DURATION_S = 900.0


def golden_digests() -> dict[str, str]:
    """Per golden home, the digest of accelmux's decision stream with degrading."""
    import decision_stream

    out = {}
    for kind, home in GOLDEN_HOMES:
        sim = Simulation(_scenario(kind, home, GOLDEN_DURATION_S, True), "accelmux", 0)
        lines: list[str] = []
        decision_stream._record(sim.manager, lines)
        sim.run()
        out[f"{kind}-{home:04d}"] = decision_stream.digest(lines)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--homes", type=int, default=8)
    parser.add_argument("--first-home", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=DURATION_S)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=RESULTS / "degrade.json")
    parser.add_argument("--golden", action="store_true", help=f"rewrite {GOLDEN.name} only")
    args = parser.parse_args()
    if args.golden:
        GOLDEN.write_text(json.dumps(golden_digests(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN}")
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    homes = range(args.first_home, args.first_home + args.homes)
    jobs = [
        Job(kind, home, seed, label, args.duration)
        for kind in kinds
        for home in homes
        for seed in range(args.seeds)
        for label in LABELS
    ]
    settings = {
        "kinds": kinds,
        "first_home": args.first_home,
        "homes": args.homes,
        "seeds": args.seeds,
        "duration_s": args.duration,
        "workers": args.workers,
        "slack": SLACK,
    }
    meta = run_meta(settings)
    meta["degrade_decisions"] = golden_digests()
    started = time.perf_counter()
    if args.workers <= 1:
        runs = [run_job(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            runs = list(pool.map(run_job, jobs, chunksize=1))
    rows = compare(runs)
    report = {
        "meta": meta,
        "wall_s": time.perf_counter() - started,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "labels": list(LABELS),
        "targets": targets(rows),
        "means": means(runs),
        "rows": rows,
        "runs": runs,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report["targets"], indent=1))
    print(json.dumps(report["means"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
