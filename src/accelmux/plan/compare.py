"""Real against replayed: the errors of a replay, per class and service, memory, decisions.

Both sides are read the same way (:mod:`accelmux.plan.outcomes`) over the same requests
(the trace rows both served or refused; warm-up left out) and the same span:

- latency: relative error of the p50 and p95 response latency, (sim - real) / real;
- attainment: sim - real, in points (the SLOs of the scenario);
- queue wait: the mean, absolute (seconds) and relative;
- memory peak per device: the most the services held at one sample, relative error;
- loads, cold starts and evictions: counts on each side, per service and in total;
- decision agreement: the share of requests whose first decision (dispatched at once,
  told to wait for a reason, rejected for a reason) was the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from accelmux.history.records import DecisionRecord, SampleRecord
from accelmux.plan.outcomes import (
    Outcome,
    Slo,
    agreement,
    comparable,
    decision_counts,
    figures,
    memory_peaks,
)


def rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def _errors(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    att_r, att_s = real.get("attainment"), sim.get("attainment")
    q_r, q_s = real.get("queue_mean_s"), sim.get("queue_mean_s")
    return {
        "p50_rel": rel(sim.get("p50_s"), real.get("p50_s")),
        "p95_rel": rel(sim.get("p95_s"), real.get("p95_s")),
        "attainment_pts": None if att_r is None or att_s is None else 100.0 * (att_s - att_r),
        "queue_mean_abs_s": None if q_r is None or q_s is None else q_s - q_r,
        "queue_mean_rel": rel(q_s, q_r),
    }


def _sides(
    real: dict[str, dict[str, Any]], sim: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    out = {}
    for name in sorted(real.keys() | sim.keys()):
        r, s = real.get(name, {}), sim.get(name, {})
        out[name] = {"real": r, "sim": s, "error": _errors(r, s)}
    return out


def _totals(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts.values():
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def compare(
    real: Iterable[Outcome],
    sim: Iterable[Outcome],
    slo: dict[str, Slo],
    *,
    since: float,
    real_samples: Sequence[SampleRecord] = (),
    sim_samples: Sequence[SampleRecord] = (),
    real_decisions: Sequence[DecisionRecord] = (),
    sim_decisions: Sequence[DecisionRecord] = (),
) -> dict[str, Any]:
    """The replay's errors against the real run, over requests arriving at ``since`` or
    later (and samples and decisions from then on)."""

    def slo_of(service: str) -> Slo:
        return slo.get(service, Slo())

    a, b = comparable(
        [o for o in real if o.arrived >= since], [o for o in sim if o.arrived >= since]
    )
    fr, fs = figures(a, slo_of), figures(b, slo_of)
    mem_r = memory_peaks(s for s in real_samples if s.t >= since)
    mem_s = memory_peaks(s for s in sim_samples if s.t >= since)
    memory = {
        dev: {
            "real_peak": mem_r[dev]["managed"],
            "sim_peak": mem_s.get(dev, {}).get("managed"),
            "peak_rel": rel(mem_s.get(dev, {}).get("managed"), mem_r[dev]["managed"]),
        }
        for dev in sorted(mem_r)
    }
    dr = decision_counts(real_decisions, since=since)
    ds = decision_counts(sim_decisions, since=since)
    return {
        "requests": len(a),
        "since_s": since,
        "classes": _sides(fr["classes"], fs["classes"]),
        "services": _sides(fr["services"], fs["services"]),
        "memory": memory,
        "decisions": {
            "real": {"services": dr, "total": _totals(dr)},
            "sim": {"services": ds, "total": _totals(ds)},
        },
        "agreement": agreement(a, b),
    }
