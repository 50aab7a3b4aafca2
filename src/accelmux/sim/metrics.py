"""Metrics of one run: SLO attainment, latency, OOMs, rejections, residency, memory.

Requests that arrive during the warm-up (``simulation.warmup_s``) are served but not
measured: every policy starts cold.

SLO rules (per request): a chat/completion request meets its SLO when it was served,
its time to first token (from arrival) is within ``ttft_s`` and its mean time between
tokens within ``tbt_s``; any other request when it was served within ``latency_s`` of
arrival. A rejected or failed request is a miss. A request still open at the end of the
run is a miss when it is already past its bound, otherwise it is left out. A batch job's
document that is not done at the end of the run (never submitted, skipped after its
retries, or still open) is one more miss of the job's service, unless one of its requests
was already counted as a miss: a job that barely progresses cannot read as meeting its SLO.

Also reported: preemptions (total and the most any one request suffered), starvation
per class (see :mod:`accelmux.sim.starvation`) and the longest stretch each class went
without any service while it asked for work the device could hold
(:mod:`accelmux.sim.zero_service`).

"Response" latency (p50/p99) is the time to first token for LLMs and the completion
latency for everything else, over served requests.

What a policy does to the foreign programs (``simulation.foreign``, baseline memory left
out), over the whole run: ``foreign.starved_share`` is the share of the memory they asked
for that they did not get, weighted by time (byte-seconds short / byte-seconds asked, over
each program's life within the run: a program whose 8 GiB found only 5 GiB free for its
first 2 of 10 minutes was starved of 3/8 x 2/10 = 7.5%); ``foreign.wait_s`` is, per
program, the seconds from its start until it first held all it asked (its whole life
within the run if it never did), mean and max over the programs. 0 and 0 mean the
services made room at once, or never stood in its way.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from accelmux.core.types import ServiceClass
from accelmux.sim.executor import RunOutput, SimRequest
from accelmux.sim.workloads import IndexingSource, VoiceSource
from accelmux.sim.zero_service import zero_service


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def _bound(slo: dict[str, float | None]) -> float:
    return max([v for v in slo.values() if v is not None] or [math.inf])


def meets_slo(req: SimRequest, slo: dict[str, float | None], is_llm: bool) -> bool:
    if req.outcome != "ok" or req.finished_at is None:
        return False
    latency = req.finished_at - req.arrived_at
    if slo["latency_s"] is not None and latency > slo["latency_s"] + 1e-9:
        return False
    if is_llm:
        first = req.first_token_at if req.first_token_at is not None else req.finished_at
        ttft = first - req.arrived_at
        if slo["ttft_s"] is not None and ttft > slo["ttft_s"] + 1e-9:
            return False
        n = max(1, req.demand.output_tokens - 1)
        tbt = (req.finished_at - first) / n
        if slo["tbt_s"] is not None and tbt > slo["tbt_s"] + 1e-9:
            return False
    return True


def _response(req: SimRequest, is_llm: bool) -> float | None:
    if req.outcome != "ok" or req.finished_at is None:
        return None
    if is_llm and req.first_token_at is not None:
        return req.first_token_at - req.arrived_at
    return req.finished_at - req.arrived_at


class _Acc:
    __slots__ = ("failed", "met", "queue", "rejected", "requests", "response", "undone")

    def __init__(self) -> None:
        self.requests = 0
        self.undone = 0
        self.met = 0
        self.rejected = 0
        self.failed = 0
        self.response: list[float] = []
        self.queue: list[float] = []

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "slo_met": self.met,
            "slo_attainment": self.met / self.requests if self.requests else None,
            "rejected": self.rejected,
            "failed": self.failed,
            "undone": self.undone,
            "p50_s": percentile(self.response, 50),
            "p99_s": percentile(self.response, 99),
            "mean_queue_s": sum(self.queue) / len(self.queue) if self.queue else None,
            "p99_queue_s": percentile(self.queue, 99),
        }


def summarize(out: RunOutput) -> dict[str, Any]:
    """The JSON-ready report of one run."""
    end = out.duration_s
    classes: dict[str, _Acc] = {c.label: _Acc() for c in ServiceClass}
    services: dict[str, _Acc] = {name: _Acc() for name in out.services}
    rejections: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    per_service_rej: dict[str, Counter[str]] = defaultdict(Counter)
    oom_broken = 0
    missed_docs: set[int] = set()
    done_docs: set[int] = set()
    for req in out.requests.values():
        spec = out.services[req.service]
        slo = out.slo[req.service]
        is_llm = spec.kind.is_llm
        if isinstance(req.source, IndexingSource) and req.outcome == "ok":
            done_docs.add(id(req.tag))
        if req.arrived_at < out.warmup_s:
            continue  # the warm-up: services are still starting
        if req.outcome is None and end - req.arrived_at <= _bound(slo):
            continue  # still open and not yet late: left out
        met = meets_slo(req, slo, is_llm)
        resp = _response(req, is_llm)
        if isinstance(req.source, IndexingSource) and not met:
            missed_docs.add(id(req.tag))
        for acc in (classes[req.cls.label], services[req.service]):
            acc.requests += 1
            acc.met += int(met)
            if resp is not None:
                acc.response.append(resp)
            if req.first_dispatch_at is not None:
                acc.queue.append(req.first_dispatch_at - req.arrived_at)
            if req.outcome == "rejected":
                acc.rejected += 1
            elif req.outcome == "failed":
                acc.failed += 1
        if req.outcome == "rejected":
            rejections[req.reason or "?"] += 1
            per_service_rej[req.service][req.reason or "?"] += 1
        elif req.outcome == "failed":
            failures[req.reason or "?"] += 1
            per_service_rej[req.service][f"failed:{req.reason}"] += 1
        if req.oom and req.outcome == "failed":
            oom_broken += 1

    accounted_docs = done_docs | missed_docs
    for src in out.sources:
        if not isinstance(src, IndexingSource):
            continue
        undone = sum(1 for d in src.docs if id(d) not in accounted_docs)
        spec = out.services[src.cfg.service]
        for acc in (classes[spec.cls.label], services[src.cfg.service]):
            acc.requests += undone
            acc.undone += undone

    world = out.manager.world
    svc_out: dict[str, Any] = {}
    for name, acc in services.items():
        states = world.groups.get(name) or (world.services[name],)
        replicas = {st.name for st in states}
        d = acc.as_dict()
        d.update(
            {
                "class": out.services[name].cls.label,
                "loads": sum(st.loads for st in states),
                "cold_starts": sum(st.cold_starts for st in states),
                "evictions": sum(st.evictions for st in states),
                "thrash": sum(st.thrash for st in states),
                "crashes": sum(st.crashes for st in states),
                "ooms": sum(1 for o in out.ooms if o.service in replicas),
                "ooms_unforeseen_foreign": sum(
                    1 for o in out.ooms if o.service in replicas and o.foreign_surge
                ),
                "outcomes": dict(sorted(per_service_rej[name].items())),
            }
        )
        if len(states) > 1:
            d["replica_loads"] = {st.name: st.loads for st in states}
        svc_out[name] = d

    batch = _batch(out)
    chains = _chains(out)
    return {
        "policy": out.policy,
        "seed": out.seed,
        "capacity_gib": out.capacity_gib,
        "duration_s": out.duration_s,
        "oom_events": len(out.ooms),
        # OOMs that would not have happened but for foreign memory that appeared after
        # the last sample (no policy could see it coming): part of oom_events.
        "oom_events_unforeseen_foreign": sum(1 for o in out.ooms if o.foreign_surge),
        "oom_broken_requests": oom_broken,
        "ooms": [
            {
                "t": round(o.time, 3),
                "service": o.service,
                "what": o.what,
                "asked": o.asked,
                "unforeseen_foreign": o.foreign_surge,
            }
            for o in out.ooms[:20]
        ],
        "classes": {k: v.as_dict() for k, v in classes.items() if v.requests},
        "services": svc_out,
        "rejections": dict(sorted(rejections.items())),
        "failures": dict(sorted(failures.items())),
        "cold_starts": sum(s.cold_starts for s in world.services.values()),
        "loads": sum(s.loads for s in world.services.values()),
        "evictions": sum(s.evictions for s in world.services.values()),
        "thrash": sum(s.thrash for s in world.services.values()),
        "batch_done_in_window": batch["fraction"],
        "preemptions": sum(r.preemptions for r in out.requests.values()),
        "max_preemptions_per_request": max(
            (r.preemptions for r in out.requests.values()), default=0
        ),
        "pauses": sum(r.pauses for r in out.requests.values()),
        "max_pauses_per_request": max((r.pauses for r in out.requests.values()), default=0),
        "starvation": out.starvation.as_dict(),
        "zero_service": zero_service(out),
        "batch": batch,
        "chains": chains,
        "memory": _memory(out),
        "compute_busy_fraction": {
            k: v / out.duration_s for k, v in out.busy_s.items() if out.duration_s
        },
        "foreign": foreign_starvation(out),
    }


def foreign_starvation(out: RunOutput) -> dict[str, Any]:
    """How far the services stood in the foreign programs' way (see the module doc)."""
    procs = out.foreign
    asked = sum(p.asked_byte_s for p in procs)
    short = sum(p.short_byte_s for p in procs)
    waits = [p.wait_s(out.duration_s) for p in procs]
    return {
        "programs": len(procs),
        "asked_byte_s": asked,
        "short_byte_s": short,
        "starved_share": short / asked if asked else None,
        "wait_s_mean": sum(waits) / len(waits) if waits else None,
        "wait_s_max": max(waits, default=None),
        "never_whole": sum(1 for p in procs if p.whole_at is None),
    }


def _batch(out: RunOutput) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    for src in out.sources:
        if not isinstance(src, IndexingSource):
            continue
        spans = out.windows_open.get(src.cfg.service)
        if spans is None:
            inside = len(src.done_at)
        else:
            inside = sum(1 for t in src.done_at if any(a <= t < b for a, b in spans))
        total = len(src.docs)
        jobs.append(
            {
                "name": src.name,
                "documents": total,
                "done": len(src.done_at),
                "done_in_window": inside,
                "finished_at": max(src.done_at) if len(src.done_at) == total else None,
                "started_at": src.started_at,
            }
        )
    fraction = None
    if jobs:
        fraction = sum(j["done_in_window"] / j["documents"] for j in jobs) / len(jobs)
    return {"fraction": fraction, "jobs": jobs}


def _chains(out: RunOutput) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for src in out.sources:
        if not isinstance(src, VoiceSource):
            continue
        slo = src.cfg.slo_s
        counted = 0
        met = 0
        lat: list[float] = []
        for c in src.chains:
            if c.arrived_at < out.warmup_s:
                continue
            if c.finished_at is None and not c.failed and out.duration_s - c.arrived_at <= slo:
                continue
            counted += 1
            if c.finished_at is not None:
                e2e = c.finished_at - c.arrived_at
                lat.append(e2e)
                met += int(e2e <= slo + 1e-9)
        result[src.name] = {
            "chains": counted,
            "slo_s": slo,
            "slo_attainment": met / counted if counted else None,
            "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99),
        }
    return result


def _memory(out: RunOutput) -> dict[str, Any]:
    n = len(out.samples)
    if n == 0:
        return {}
    per_service: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_category: dict[str, float] = defaultdict(float)
    true_per_service: dict[str, float] = defaultdict(float)
    foreign = idle = used = 0.0
    peak = held = 0
    for s in out.samples:
        for svc, cats in s.ledger.items():
            for cat, b in cats.items():
                per_service[svc][cat] += b / n
                per_category[cat] += b / n
        for svc, b in s.true.items():
            true_per_service[svc] += b / n
        foreign += s.foreign / n
        idle += s.idle_resident / n
        used += s.used / n
        peak = max(peak, s.used)
        held = max(held, sum(s.true.values()))
    return {
        "unit": "bytes, time-weighted mean",
        "per_service": {k: {c: round(v) for c, v in d.items()} for k, d in per_service.items()},
        "per_category": {k: round(v) for k, v in per_category.items()},
        "true_per_service": {k: round(v) for k, v in true_per_service.items()},
        "foreign": round(foreign),
        "idle_resident": round(idle),
        "used": round(used),
        "peak_used_sampled": peak,
        # the most the services themselves held at any sample (true bytes, foreign
        # programs left out) beside the budget the home gave them: a policy above it
        # took memory the home keeps for its other programs (bench/worst_case.py)
        "peak_services_sampled": held,
        "budget_bytes": out.manager.spec.devices[0].budget_bytes,
    }
