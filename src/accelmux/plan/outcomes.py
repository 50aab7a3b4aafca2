"""One way to read what happened to each request, for the real daemon and the simulator.

An :class:`Outcome` is one request of a request trace (its ``index``), as the daemon
served it (the trace's measured columns) or as a replay served it (the simulator's
requests, recorded by the same :class:`~accelmux.history.recorder.HistoryRecorder` the
daemon uses). Every figure a plan or a sim-to-real comparison shows is computed here,
from outcomes, by the same code for both sides:

- **response latency**: the time to the first token of a streamed LLM answer, else the
  time to the whole answer, over the requests served;
- **SLO met**: served, within the service's ``latency_s``, and for an LLM within its
  ``ttft_s`` and ``tbt_s`` (a non-streamed answer's first token is its last);
- **attainment**: SLO met / requests counted (a rejected or failed request is a miss);
- **queue wait**: arrival to first dispatch;
- **first decision**: what the Manager first did with the request: ``dispatch``,
  ``wait:<reason>`` or ``reject:<reason>``.

A request the client cancelled, or that was still open when the daemon stopped (or the
replay ended: a batch request waiting for a window that had not opened yet), has no
outcome to compare: it is left out of both sides, and counted as ``waiting_at_end``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from accelmux.history.records import DecisionRecord, RequestRecord, SampleRecord
from accelmux.sim.metrics import percentile
from accelmux.sim.recorded import TraceRow

#: Unload reasons that make room (an eviction), as opposed to a TTL or a window.
EVICTION_REASONS = frozenset({"evicted_for_memory", "swap", "foreign_pressure", "host_budget"})
#: Load reasons that are a cold start: a request waits for them.
COLD_START_REASONS = frozenset({"demand", "reload_after_crash"})
#: Outcomes with nothing to compare (the client left, or the daemon stopped first).
UNCOUNTED = frozenset({"cancelled", "open"})
#: p95 needs at least this many samples.
MIN_P95 = 20


@dataclass(frozen=True, slots=True)
class Slo:
    latency_s: float | None = None
    ttft_s: float | None = None
    tbt_s: float | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    service: str
    cls: str
    is_llm: bool
    stream: bool
    arrived: float
    queue_s: float | None
    response_s: float | None
    total_s: float | None
    output_tokens: int | None
    outcome: str
    reason: str
    first_decision: str

    def met(self, slo: Slo) -> bool:
        if self.outcome != "ok" or self.total_s is None:
            return False
        eps = 1e-9
        if slo.latency_s is not None and self.total_s > slo.latency_s + eps:
            return False
        if not self.is_llm:
            return True
        first = self.response_s if self.stream and self.response_s is not None else self.total_s
        if slo.ttft_s is not None and first > slo.ttft_s + eps:
            return False
        if slo.tbt_s is not None and self.stream:
            tbt = (self.total_s - first) / max(1, (self.output_tokens or 1) - 1)
            if tbt > slo.tbt_s + eps:
                return False
        return True


def first_decision(outcome: str, reason: str | None, first_wait: str | None) -> str:
    if first_wait:
        return f"wait:{first_wait}"
    if outcome == "rejected":
        return f"reject:{reason or '?'}"
    return "dispatch"


def from_trace(row: TraceRow, cls: str, is_llm: bool) -> Outcome:
    """The daemon's outcome of a trace row (its measured columns)."""
    return Outcome(
        index=row.index,
        service=row.service,
        cls=cls,
        is_llm=is_llm,
        stream=row.stream,
        arrived=row.arrival_s,
        queue_s=row.queue_s,
        response_s=row.response_s,
        total_s=row.total_s,
        output_tokens=row.output_tokens,
        outcome=row.outcome or "open",
        reason=row.reason,
        first_decision=first_decision(row.outcome, row.reason, row.first_wait),
    )


def response_of(r: RequestRecord) -> float | None:
    if r.outcome != "ok" or r.t_finished is None:
        return None
    if r.stream and r.t_first_token is not None:
        return r.t_first_token - r.t_arrived
    return r.t_finished - r.t_arrived


def from_record(r: RequestRecord, index: int, is_llm: bool, t0: float = 0.0) -> Outcome:
    """A recorded request (the daemon's, or a replay's) as an outcome of trace row
    ``index``; ``t0`` is the trace's time 0 on the record's clock."""
    return Outcome(
        index=index,
        service=r.service,
        cls=r.cls,
        is_llm=is_llm,
        stream=bool(r.stream),
        arrived=r.t_arrived - t0,
        queue_s=None if r.t_dispatched is None else r.t_dispatched - r.t_arrived,
        response_s=response_of(r),
        total_s=None if r.t_finished is None else r.t_finished - r.t_arrived,
        output_tokens=r.output_tokens,
        outcome=r.outcome,
        reason=r.reason or "",
        first_decision=first_decision(r.outcome, r.reason, r.first_wait),
    )


def group_figures(outcomes: list[Outcome], slo_of: Callable[[str], Slo]) -> dict[str, Any]:
    """Counts, attainment, latency and queue figures of some outcomes (p95 only from
    :data:`MIN_P95` served requests on)."""
    counted = [o for o in outcomes if o.outcome not in UNCOUNTED]
    waiting = sum(1 for o in outcomes if o.outcome == "open")
    served = [o.response_s for o in counted if o.response_s is not None]
    queued = [o.queue_s for o in counted if o.queue_s is not None]
    met = sum(1 for o in counted if o.met(slo_of(o.service)))
    return {
        "requests": len(counted),
        "served": len(served),
        "rejected": sum(1 for o in counted if o.outcome == "rejected"),
        "failed": sum(1 for o in counted if o.outcome in ("failed", "error")),
        "waiting_at_end": waiting,
        "attainment": met / len(counted) if counted else None,
        "p50_s": percentile(served, 50),
        "p95_s": percentile(served, 95) if len(served) >= MIN_P95 else None,
        "queue_mean_s": sum(queued) / len(queued) if queued else None,
        "queue_p95_s": percentile(queued, 95) if len(queued) >= MIN_P95 else None,
    }


def by_group(
    outcomes: Iterable[Outcome], key: Callable[[Outcome], str], slo_of: Callable[[str], Slo]
) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(key(o), []).append(o)
    return {name: group_figures(items, slo_of) for name, items in sorted(groups.items())}


def figures(outcomes: list[Outcome], slo_of: Callable[[str], Slo]) -> dict[str, Any]:
    """Per class and per service figures of one side."""
    return {
        "classes": by_group(outcomes, lambda o: o.cls, slo_of),
        "services": by_group(outcomes, lambda o: o.service, slo_of),
    }


def comparable(a: Iterable[Outcome], b: Iterable[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """The outcomes of the requests both sides can speak of (same index, neither
    cancelled nor left open), in index order."""
    first = {o.index: o for o in a if o.outcome not in UNCOUNTED}
    second = {o.index: o for o in b if o.outcome not in UNCOUNTED}
    keys = sorted(first.keys() & second.keys())
    return [first[k] for k in keys], [second[k] for k in keys]


def agreement(a: list[Outcome], b: list[Outcome]) -> float | None:
    """The share of requests whose first decision was the same on both sides."""
    if not a:
        return None
    return sum(1 for x, y in zip(a, b, strict=True) if x.first_decision == y.first_decision) / len(
        a
    )


# ---- devices and decisions --------------------------------------------------------------
def memory_peaks(samples: Iterable[SampleRecord]) -> dict[str, dict[str, int]]:
    """Per device: the most the services held at one sample (``managed``) and the most
    the device had in use (``used``)."""
    out: dict[str, dict[str, int]] = {}
    for s in samples:
        d = out.setdefault(s.device, {"managed": 0, "used": 0})
        d["managed"] = max(d["managed"], s.managed)
        d["used"] = max(d["used"], s.used)
    return out


def decision_counts(
    decisions: Iterable[DecisionRecord], *, since: float = 0.0
) -> dict[str, dict[str, int]]:
    """Per service: loads, cold starts (loads a request waited for, or a reload after a
    crash), evictions (unloads that made room), other unloads, pauses and preemptions
    (decisions at ``since`` or later)."""
    out: dict[str, dict[str, int]] = {}
    for d in decisions:
        if d.t < since:
            continue
        c = out.setdefault(
            d.service,
            {
                "loads": 0,
                "cold_starts": 0,
                "evictions": 0,
                "unloads": 0,
                "pauses": 0,
                "preemptions": 0,
            },
        )
        if d.action == "load":
            c["loads"] += 1
            c["cold_starts"] += int(d.reason in COLD_START_REASONS)
        elif d.action == "unload":
            c["evictions" if d.reason in EVICTION_REASONS else "unloads"] += 1
        elif d.action == "pause":
            c["pauses"] += 1
        elif d.action == "preempt":
            c["preemptions"] += 1
    return out


def slo_table(services: Mapping[str, Any]) -> dict[str, Slo]:
    """Each service's SLO from a config's ``services`` (data or models)."""
    out: dict[str, Slo] = {}
    for name, svc in services.items():
        slo = svc.get("slo", {}) if isinstance(svc, Mapping) else svc.slo.model_dump()
        out[name] = Slo(slo.get("latency_s"), slo.get("ttft_s"), slo.get("tbt_s"))
    return out
