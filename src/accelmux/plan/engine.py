"""``accelmux plan``: the history replayed as recorded, then as the user asks.

A plan has columns: **recorded** (what the daemon measured, when the plan reads a
history), **replay** (the same requests through the simulator, same config and policy:
how far the simulator is from the recording here) and one per asked change
(:mod:`accelmux.plan.changes`). Each column gives, per class, attainment and the p50
and p95 response latency; per device the memory peak and what the budget had left at
it; cold starts, evictions and OOMs; and, against the replay, the first service to
suffer: the service of the earliest request that met its SLO in the replay and misses
it with the change (with how many requests of each service newly miss).

Every simulated figure carries the simulator's measured error (``error_bars.json``,
written from the sim-to-real benchmark: docs/benchmarks.md): a plan says ``p95 0.84 s
+-15 %``, not ``0.84 s``. A class with fewer than 20 served requests has no p95, and a
history shorter than :data:`MIN_SPAN_S` or with fewer than :data:`MIN_REQUESTS`
requests is too short to say anything: the plan says so and stops.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ByteSize, TypeAdapter

from accelmux.core.types import GIB
from accelmux.errors import AccelmuxError, BackendError, ConfigError
from accelmux.history.records import DecisionRecord, SampleRecord
from accelmux.history.store import History
from accelmux.plan.changes import Change, ChangeError, remove_service
from accelmux.plan.export import SCENARIO, export_history
from accelmux.plan.outcomes import (
    Outcome,
    Slo,
    decision_counts,
    figures,
    from_trace,
    memory_peaks,
    slo_table,
)
from accelmux.plan.replay import Replay, replay
from accelmux.sim.recorded import read_trace
from accelmux.sim.scenario import (
    RecordedWorkload,
    Scenario,
    load_scenario,
    load_scenario_data,
    recorded_problems,
)

#: Below these, a history is too short to say anything.
MIN_SPAN_S = 600.0
MIN_REQUESTS = 50
#: Seeds of a variant whose workload is partly drawn (an added service's requests).
DRAWN_SEEDS = 3
#: Points of each memory-over-time series kept for the page.
TIMELINE_POINTS = 400
ERROR_BARS = Path(__file__).resolve().parent / "error_bars.json"


class PlanError(AccelmuxError):
    """A plan that cannot be made; the message says why and what to do."""


@dataclass
class Column:
    label: str
    kind: str  # recorded | replay | change
    policy: str
    classes: dict[str, Any]
    services: dict[str, Any]
    memory: dict[str, Any]
    decisions: dict[str, float]
    ooms: int | None
    first_to_suffer: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    timeline: dict[str, list[list[float]]] = field(default_factory=dict)
    seeds: int = 1
    #: Each request's outcome (by trace index), for comparing columns; not in the JSON.
    outcomes: list[Outcome] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "kind": self.kind,
            "policy": self.policy,
            "seeds": self.seeds,
            "classes": self.classes,
            "services": self.services,
            "memory": self.memory,
            "decisions": self.decisions,
            "ooms": self.ooms,
            "oom_risk": oom_risk(self),
            "first_to_suffer": self.first_to_suffer,
            "notes": self.notes,
            "timeline": self.timeline,
        }


def oom_risk(col: Column) -> str:
    """``oom`` (the replay ran out of memory), ``tight`` (a peak left less of the device
    free than its headroom), ``none``; ``unknown`` for a recording."""
    if col.ooms is None:
        return "unknown" if col.kind == "recorded" else "none"
    if col.ooms > 0:
        return "oom"
    for mem in col.memory.values():
        if mem.get("free_at_peak") is not None and mem["free_at_peak"] < mem.get("headroom", 0):
            return "tight"
    return "none"


@dataclass
class Plan:
    source: str
    span_s: float
    requests: int
    columns: list[Column]
    error_bars: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "span_s": self.span_s,
            "requests": self.requests,
            "error_bars": self.error_bars,
            "warnings": self.warnings,
            "columns": [c.as_dict() for c in self.columns],
        }


def error_bars() -> dict[str, Any]:
    """The simulator's measured errors (empty when not shipped)."""
    try:
        data: dict[str, Any] = json.loads(ERROR_BARS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data


# ---- reading the figures of one side --------------------------------------------------------
def _downsample(points: list[list[float]]) -> list[list[float]]:
    if len(points) <= TIMELINE_POINTS:
        return points
    step = len(points) / TIMELINE_POINTS
    out, i = [], 0.0
    while int(i) < len(points):
        chunk = points[int(i) : int(i + step) or int(i) + 1]
        out.append(max(chunk, key=lambda p: p[1]))  # keep each stretch's peak
        i += step
    return out


def _memory(
    samples: Sequence[SampleRecord], devices: dict[str, Any], since: float
) -> tuple[dict[str, Any], dict[str, list[list[float]]]]:
    peaks = memory_peaks(s for s in samples if s.t >= since)
    out: dict[str, Any] = {}
    for name, dev in devices.items():
        peak = peaks.get(name, {})
        budget = int(dev["budget"])
        managed = peak.get("managed")
        used = peak.get("used")
        out[name] = {
            "peak": managed,
            "used_peak": used,
            "budget": budget,
            "capacity": int(dev["capacity"]),
            "headroom": int(dev["headroom"]),
            "free_at_peak": None if used is None else int(dev["capacity"]) - used,
            "budget_left_at_peak": None if managed is None else budget - managed,
        }
    series: dict[str, list[list[float]]] = {}
    for s in samples:
        if s.t >= since:
            series.setdefault(s.device, []).append([round(s.t, 1), s.managed, s.used])
    return out, {k: _downsample(v) for k, v in series.items()}


def _decisions(decisions: Sequence[DecisionRecord], since: float) -> dict[str, float]:
    total: dict[str, float] = {}
    for counts in decision_counts(decisions, since=since).values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    return total


def first_to_suffer(
    base: list[Outcome], other: list[Outcome], slo: dict[str, Slo]
) -> dict[str, Any]:
    """The earliest request that met its SLO in ``base`` and misses it in ``other``, and
    how many requests of each service newly miss (or newly meet) theirs."""
    mine = {o.index: o for o in other}
    newly_missed: dict[str, int] = {}
    newly_met: dict[str, int] = {}
    first: Outcome | None = None
    for b in sorted(base, key=lambda o: o.arrived):
        o = mine.get(b.index)
        if o is None or b.index < 0:
            continue
        s = slo.get(b.service, Slo())
        was, now = b.met(s), o.met(s)
        if was and not now:
            newly_missed[b.service] = newly_missed.get(b.service, 0) + 1
            first = first or b
        elif now and not was:
            newly_met[b.service] = newly_met.get(b.service, 0) + 1
    return {
        "service": None if first is None else first.service,
        "class": None if first is None else first.cls,
        "at_s": None if first is None else round(first.arrived, 1),
        "newly_missed": dict(sorted(newly_missed.items())),
        "newly_met": dict(sorted(newly_met.items())),
    }


# ---- the plan ----------------------------------------------------------------------------
def _slo(scn: Scenario) -> dict[str, Slo]:
    return slo_table(scn.config.services)


def _devices(scn: Scenario) -> dict[str, Any]:
    return {
        d.name: {
            "budget": d.budget_bytes,
            "capacity": d.capacity_bytes,
            "headroom": d.headroom_bytes,
        }
        for d in scn.manager_spec().devices
    }


def _recorded_rows(scn: Scenario) -> list[Any]:
    for w in scn.config.workloads:
        if isinstance(w, RecordedWorkload):
            return list(read_trace(scn.resolve(w.path)))
    raise PlanError(
        f"{scn.source}: no recorded workload: a plan replays a history "
        "(accelmux history export writes one)"
    )


def _bytes(value: Any) -> int:
    return int(TypeAdapter(ByteSize).validate_python(value or 0))


def _usable(data: dict[str, Any]) -> dict[str, int]:
    """What each device of scenario data gives its services: budget less headroom."""
    return {
        name: _bytes(d.get("budget") or d.get("capacity")) - _bytes(d.get("headroom", 0))
        for name, d in data["devices"].items()
    }


def _unfit(data: dict[str, Any]) -> list[tuple[str, int]]:
    """The services of scenario data that fit on none of its devices, with what each
    needs loaded (weights, runtime, the smallest KV pool and a request's workspace)."""
    usable = _usable(data)
    out = []
    for name, svc in data["services"].items():
        mem = svc.get("memory", {})
        need = sum(_bytes(mem.get(k)) for k in ("weights", "runtime", "kv_floor", "workspace"))
        allowed = svc.get("devices") or ([svc["device"]] if svc.get("device") else list(usable))
        if not any(need <= usable.get(d, 0) for d in allowed):
            out.append((name, need))
    return out


def _drop_unfit(data: dict[str, Any], label: str) -> tuple[list[str], list[str]]:
    """Leave out the services that fit on no device (their requests are refused, as the
    daemon would refuse them); refuse a change that no service fits."""
    unfit = _unfit(data)
    if not unfit:
        return [], []
    if len(unfit) == len(data["services"]):
        usable = ", ".join(f"{n} {u / GIB:.2f} GiB" for n, u in _usable(data).items())
        need, name = min((need, name) for name, need in unfit)
        raise PlanError(
            f"{label}: no service fits on the device(s) asked for (usable after headroom: "
            f"{usable}); the smallest, {name}, needs {need / GIB:.2f} GiB loaded"
        )
    notes = []
    for name, need in unfit:
        remove_service(data, name)
        notes.append(
            f"{name} fits on no device (it needs {need / GIB:.2f} GiB loaded): it cannot "
            "run, and its requests count as refused"
        )
    return [name for name, _ in unfit], notes


def _refused(
    rows: list[Any],
    services: list[str],
    since: float,
    classes: dict[str, str],
    kinds: dict[str, bool],
) -> list[Outcome]:
    """The recorded requests of services a change leaves with no device, refused."""
    out = []
    for r in rows:
        if r.service in services and r.arrival_s >= since:
            o = from_trace(r, classes.get(r.service, ""), kinds.get(r.service, False))
            out.append(
                dataclasses.replace(
                    o,
                    queue_s=None,
                    response_s=None,
                    total_s=None,
                    outcome="rejected",
                    reason="too_large",
                    first_decision="reject:too_large",
                )
            )
    return out


def _column(
    label: str,
    kind: str,
    scn: Scenario,
    runs: list[Replay],
    since: float,
    slo: dict[str, Slo],
    refused: Sequence[Outcome] = (),
) -> Column:
    """A simulated column: the figures of each seed's run, averaged (spread kept)."""
    devices = _devices(scn)
    per_seed = []
    for run in runs:
        outs = [o for o in run.outcomes() if o.arrived >= since] + list(refused)
        figs = figures(outs, lambda s: slo.get(s, Slo()))
        memory, timeline = _memory(run.samples, devices, since)
        per_seed.append((outs, figs, memory, timeline, _decisions(run.decisions, since), run))
    outs, figs, memory, timeline, counts, first = per_seed[0]
    decisions: dict[str, float] = {k: float(v) for k, v in counts.items()}
    if len(per_seed) > 1:
        figs = _mean_figures([p[1] for p in per_seed])
        memory = _max_memory([p[2] for p in per_seed])
        decisions = {
            k: round(sum(p[4].get(k, 0) for p in per_seed) / len(per_seed), 1) for k in counts
        }
    return Column(
        label=label,
        kind=kind,
        policy=first.policy,
        classes=figs["classes"],
        services=figs["services"],
        memory=memory,
        decisions=decisions,
        ooms=sum(r.ooms for r in runs),
        timeline=timeline,
        seeds=len(runs),
        outcomes=outs,
    )


def _mean_figures(items: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level in ("classes", "services"):
        names = sorted({n for f in items for n in f[level]})
        out[level] = {}
        for n in names:
            rows = [f[level][n] for f in items if n in f[level]]
            merged: dict[str, Any] = {}
            for key in rows[0]:
                vals = [r[key] for r in rows if r.get(key) is not None]
                merged[key] = sum(vals) / len(vals) if vals else None
                if key in ("attainment", "p95_s") and len(vals) > 1:
                    merged[f"{key}_spread"] = [min(vals), max(vals)]
            out[level][n] = merged
    return out


def _max_memory(items: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mem in items:
        for dev, d in mem.items():
            cur = out.setdefault(dev, dict(d))
            if (d.get("peak") or 0) > (cur.get("peak") or 0):
                out[dev] = dict(d)
    return out


def _variant(scn: Scenario, change: Change, workdir: Path) -> tuple[Scenario, list[str], list[str]]:
    data = yaml.safe_load(Path(scn.source).read_text(encoding="utf-8"))
    for w in data["workloads"]:
        if w.get("type") == "recorded":
            w["path"] = str(scn.resolve(w["path"]))
    sim = data.setdefault("simulation", {})
    if sim.get("timeline"):
        sim["timeline"] = str(scn.resolve(sim["timeline"]))
    try:
        changed, notes = change.apply(data, scn.base_dir)
    except BackendError as exc:
        raise PlanError(f"{change.describe()}: {exc}") from None
    unfit, dropped = _drop_unfit(changed, change.describe())
    notes += dropped
    path = workdir / f"variant-{abs(hash(change.describe())) % 10**8}.yaml"
    path.write_text(yaml.safe_dump(changed, sort_keys=False), encoding="utf-8")
    try:
        variant = load_scenario_data(changed, str(path), workdir)
    except ConfigError as exc:
        raise PlanError(
            f"{change.describe()}: the changed config is not valid: " + "; ".join(exc.problems)
        ) from None
    return variant, notes, unfit


def make_plan(
    scn: Scenario,
    changes: Sequence[Change],
    *,
    history: History | None = None,
    policy: str | None = None,
    source: str = "",
    t0: float = 0.0,
    min_span_s: float = MIN_SPAN_S,
) -> Plan:
    """Replay ``scn`` as recorded and with each change (see the module doc); a history
    shorter than ``min_span_s`` is refused (a benchmark's short run may lower it)."""
    problems = recorded_problems(scn)
    if problems:
        raise PlanError(f"{scn.source}: " + "; ".join(problems))
    rows = _recorded_rows(scn)
    since = scn.config.simulation.warmup_s
    measured = [r for r in rows if r.arrival_s >= since]
    span = (measured[-1].arrival_s - measured[0].arrival_s) if measured else 0.0
    if span < min_span_s or len(measured) < MIN_REQUESTS:
        raise PlanError(
            f"the history is too short to say anything: {len(measured)} requests over "
            f"{span / 60:.1f} min (a plan needs at least {MIN_REQUESTS} requests over "
            f"{min_span_s / 60:.0f} min); let the daemon record an ordinary day first"
        )
    slo = _slo(scn)
    kinds = {n: s.kind.is_llm for n, s in scn.config.services.items()}
    classes = {n: s.cls.label for n, s in scn.config.services.items()}
    base_policy = policy or scn.config.policy.name
    columns: list[Column] = []
    warnings: list[str] = []
    if history is not None:
        columns.append(_recorded_column(scn, rows, history, since, slo, kinds, classes, t0))
    rep = _column("replay", "replay", scn, [replay(scn, base_policy)], since, slo)
    columns.append(rep)
    with tempfile.TemporaryDirectory(prefix="accelmux-plan-") as td:
        for change in changes:
            variant, notes, unfit = _variant(scn, change, Path(td))
            drawn = len(variant.config.workloads) > 1
            seeds = DRAWN_SEEDS if drawn else 1
            runs = [replay(variant, change.policy or base_policy, seed=s) for s in range(seeds)]
            refused = _refused(rows, unfit, since, classes, kinds)
            col = _column(
                change.describe(), "change", variant, runs, since, slo | _slo(variant), refused
            )
            col.notes += notes
            col.first_to_suffer = first_to_suffer(rep.outcomes, col.outcomes, slo | _slo(variant))
            columns.append(col)
    if columns[0].kind == "recorded":
        columns[1].first_to_suffer = first_to_suffer(columns[0].outcomes, rep.outcomes, slo)
    return Plan(
        source=source or scn.source,
        span_s=span,
        requests=len(measured),
        columns=columns,
        error_bars=error_bars(),
        warnings=warnings,
    )


def _recorded_column(
    scn: Scenario,
    rows: list[Any],
    history: History,
    since: float,
    slo: dict[str, Slo],
    kinds: dict[str, bool],
    classes: dict[str, str],
    t0: float,
) -> Column:
    """The daemon's own figures (the history's clock moved to the trace's time 0)."""
    outs = [
        from_trace(r, classes.get(r.service, ""), kinds.get(r.service, False))
        for r in rows
        if r.arrival_s >= since
    ]
    figs = figures(outs, lambda s: slo.get(s, Slo()))
    samples = [dataclasses.replace(s, t=s.t - t0) for s in history.samples]
    decisions = [dataclasses.replace(d, t=d.t - t0) for d in history.decisions]
    memory, timeline = _memory(samples, _devices(scn), since)
    return Column(
        label="recorded",
        kind="recorded",
        policy=scn.config.policy.name,
        classes=figs["classes"],
        services=figs["services"],
        memory=memory,
        decisions=_decisions(decisions, since),
        ooms=None,
        timeline=timeline,
        outcomes=outs,
    )


def plan_from_history(
    history: History,
    changes: Sequence[Change],
    *,
    policy: str | None = None,
    last_s: float | None = None,
    min_span_s: float = MIN_SPAN_S,
) -> Plan:
    """Export ``history`` to a temporary scenario and plan from it."""
    with tempfile.TemporaryDirectory(prefix="accelmux-history-") as td:
        exported = export_history(history, last_s=last_s)
        path = exported.write(Path(td))
        try:
            scn = load_scenario(path)
        except ConfigError as exc:
            raise PlanError(
                f"the history's config cannot be replayed: {'; '.join(exc.problems)}"
            ) from None
        return make_plan(
            scn,
            changes,
            history=history,
            policy=policy,
            source=f"run {history.run.run}",
            t0=exported.t0,
            min_span_s=min_span_s,
        )


def plan_from_scenario(path: Path, changes: Sequence[Change], *, policy: str | None = None) -> Plan:
    if not path.is_file():
        raise PlanError(f"scenario not found: {path}")
    scn = load_scenario(path)
    return make_plan(scn, changes, policy=policy, source=str(path))


__all__ = ["SCENARIO", "ChangeError", "Plan", "PlanError", "make_plan"]
