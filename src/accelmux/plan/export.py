"""A history as a scenario: ``accelmux history export`` and the first step of a plan.

Three files go to the output directory:

- ``scenario.yaml``: the daemon's devices (their measured capacity and budget), its
  services (their memory profiles as the daemon ran them: a GGUF read at start is
  written out as bytes), its policy, a ``simulation`` section calibrated from the
  services' measured profiles (:mod:`accelmux.plan.calibrate`), and one ``recorded``
  workload;
- ``requests.csv``: the request trace (:mod:`accelmux.sim.recorded`);
- ``timeline.csv``: each device's memory and compute used by others over time.

``accelmux simulate scenario.yaml --policies accelmux`` replays it.

**Links.** A request follows an earlier one of the same client when it arrived within
:data:`LINK_GAP_S` of that one's end (the client sent it as soon as the answer came
back: the next step of a voice chain, the next batch of a job, a camera that fell
behind): the requests of the same origin (HTTP clients, one job's batches, one camera's
frames), the latest end before the arrival, one follower each. The daemon does not
know which client sent an HTTP request, so two clients that happen to follow each
other that closely are linked too; the link only moves the later request in a replay
by as much as the earlier one's end moved.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from accelmux.history.records import RequestRecord, SampleRecord
from accelmux.history.store import History
from accelmux.plan.calibrate import (
    Calibration,
    Profile,
    calibration,
    foreign_series,
    unload_seconds,
)
from accelmux.sim.recorded import TimelineRow, TraceRow, write_timeline, write_trace

#: A request that arrives this soon after an earlier one of the same origin ended is
#: linked to it (seconds).
LINK_GAP_S = 0.15
#: A device timeline row is written when memory moved this much, or compute this much.
TIMELINE_BYTES = 4 * 2**20
TIMELINE_COMPUTE = 0.02
SCENARIO = "scenario.yaml"
TRACE = "requests.csv"
TIMELINE = "timeline.csv"


@dataclass
class Export:
    scenario: dict[str, Any]
    trace: list[TraceRow]
    timeline: list[TimelineRow]
    profiles: dict[str, Profile]
    #: The daemon's request id of each trace row (same order).
    request_ids: list[str]
    #: The trace's time 0 on the run's clock.
    t0: float = 0.0

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_trace(out_dir / TRACE, self.trace)
        write_timeline(out_dir / TIMELINE, self.timeline)
        path = out_dir / SCENARIO
        header = (
            "# Exported by accelmux history export: the daemon's config, its services'\n"
            "# measured profiles (simulation.services) and its recorded requests.\n"
            "# Replay: accelmux simulate scenario.yaml --policies accelmux\n"
        )
        path.write_text(header + yaml.safe_dump(self.scenario, sort_keys=False), encoding="utf-8")
        return path


def _group_key(r: RequestRecord) -> str:
    if r.origin == "http":
        return "http"
    return f"{r.origin}:{r.service}"


def link(requests: list[RequestRecord]) -> dict[int, tuple[int, float]]:
    """For each request (by position) that followed another: (its position, the gap)."""
    ends: dict[str, list[tuple[float, int]]] = {}
    for i, r in enumerate(requests):
        if r.t_finished is not None:
            ends.setdefault(_group_key(r), []).append((r.t_finished, i))
    for items in ends.values():
        items.sort()
    taken: set[int] = set()
    out: dict[int, tuple[int, float]] = {}
    for i, r in enumerate(requests):
        best: tuple[float, int] | None = None
        for end, j in reversed(ends.get(_group_key(r), [])):
            if end > r.t_arrived:
                continue
            if r.t_arrived - end > LINK_GAP_S:
                break
            if j != i and j not in taken and j < i:
                best = (end, j)
                break
        if best is not None:
            taken.add(best[1])
            out[i] = (best[1], r.t_arrived - best[0])
    return out


def _trace_row(i: int, r: RequestRecord, t0: float, after: tuple[int, float] | None) -> TraceRow:
    response = None
    if r.outcome == "ok" and r.t_finished is not None:
        first = r.t_first_token if r.stream and r.t_first_token is not None else r.t_finished
        response = first - r.t_arrived
    return TraceRow(
        index=i,
        arrival_s=round(r.t_arrived - t0, 6),
        service=r.service,
        stream=bool(r.stream),
        pausable=bool(r.pausable),
        prompt_tokens=r.prompt_tokens,
        max_output_tokens=r.max_output_tokens,
        kv_tokens=r.kv_tokens,
        units=r.units,
        output_tokens=r.output_tokens,
        peak_bytes=r.peak_bytes,
        after=None if after is None else after[0],
        gap_s=None if after is None else round(after[1], 6),
        origin=r.origin,
        queue_s=None if r.t_dispatched is None else round(r.t_dispatched - r.t_arrived, 6),
        response_s=None if response is None else round(response, 6),
        total_s=None if r.t_finished is None else round(r.t_finished - r.t_arrived, 6),
        outcome=r.outcome,
        reason=r.reason or "",
        first_wait=r.first_wait or "",
    )


def timeline(
    samples: list[SampleRecord],
    t0: float,
    cores: dict[str, int] | None = None,
    idle: dict[str, float] | None = None,
) -> list[TimelineRow]:
    """Each device's other memory (at each sample) and foreign compute (per count of the
    probe, else per sample span; with ``idle``, the managed processes' own compute while
    nothing runs), a row when either moved."""
    events: list[tuple[float, str, int, int, float | None]] = []
    for s in samples:
        other = max(0, s.used - s.managed - s.overhead)
        events.append((s.t, s.device, other, s.baseline, None))
    for device in sorted({s.device for s in samples}):
        mine = [s for s in samples if s.device == device]
        series = foreign_series(mine, (cores or {}).get(device, 1), (idle or {}).get(device, 0.0))
        events += [(t, device, -1, -1, f) for t, f in series]
    events.sort(key=lambda e: e[0])
    out: list[TimelineRow] = []
    current: dict[str, TimelineRow] = {}
    written: dict[str, TimelineRow] = {}
    for t, device, other, baseline, compute in events:
        if t < t0:
            continue
        before = current.get(device)
        row = TimelineRow(
            t_s=round(t - t0, 3),
            device=device,
            other_bytes=other if other >= 0 else (before.other_bytes if before else 0),
            baseline_bytes=baseline
            if baseline >= 0
            else (before.baseline_bytes if before else None),
            foreign_compute=compute
            if compute is not None
            else (before.foreign_compute if before else None),
        )
        current[device] = row
        last = written.get(device)
        if last is not None and not _moved(last, row):
            continue
        written[device] = row
        out.append(row)
    return out


def _moved(a: TimelineRow, b: TimelineRow) -> bool:
    if abs(a.other_bytes - b.other_bytes) >= TIMELINE_BYTES:
        return True
    if abs((a.baseline_bytes or 0) - (b.baseline_bytes or 0)) >= TIMELINE_BYTES:
        return True
    c0, c1 = a.foreign_compute, b.foreign_compute
    if (c0 is None) != (c1 is None):
        return True
    return c0 is not None and c1 is not None and abs(c0 - c1) >= TIMELINE_COMPUTE


def _clock(seconds_of_day: float) -> str:
    s = seconds_of_day % 86_400
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{int(h):02d}:{int(m):02d}:{sec:06.3f}"


def _devices(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in spec["devices"]:
        base = dict(config.get("devices", {}).get(d["name"], {}))
        base.update(
            kind=d["kind"],
            capacity=int(d["capacity"]),
            budget=int(d["budget"]),
            headroom=int(d["headroom"]),
            load_bandwidth=int(d["load_bandwidth"]),
            host_bandwidth=int(d["host_bandwidth"]),
        )
        if d["kind"] != "nvidia":
            base.pop("index", None)
        out[d["name"]] = base
    return out


def _services(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    by_name = {s["name"]: s for s in spec["services"]}
    out: dict[str, Any] = {}
    for name, svc in config["services"].items():
        data = dict(svc)
        data.pop("backend", None)
        replica = by_name.get(name) or next(
            (s for s in spec["services"] if s["group"] == name), None
        )
        if replica is not None:
            p = replica["profile"]
            data["memory"] = {
                "weights": p["weights"],
                "runtime": p["runtime"],
                "kv_per_token": p["kv_per_token"],
                "kv_floor": p["kv_floor"],
                "kv_ceiling": p["kv_ceiling"],
                "workspace": p["workspace"],
                "per_unit": p["per_unit"],
            }
        out[name] = data
    return out


def export_history(
    history: History,
    *,
    last_s: float | None = None,
    warmup_s: float = 600.0,
    calibrated: Calibration | None = None,
) -> Export:
    """The scenario, trace and timeline of ``history``'s run.

    The replay starts where the daemon started (so it starts as cold as the daemon did);
    with ``last_s``, only the last ``last_s`` seconds of requests are measured, with up to
    ``warmup_s`` before them replayed unmeasured (the ``warmup_s`` of the scenario).
    ``calibrated``: the services' profiles to calibrate with (default: this history's
    own; another run's, to replay a workload that calibration never saw)."""
    run = history.run
    spec = json.loads(run.spec)
    config = json.loads(run.config)
    requests = [r for r in history.requests if r.service in config["services"]]
    end = max(
        [r.t_finished or r.t_arrived for r in requests] + [s.t for s in history.samples] + [0.0]
    )
    t0 = 0.0
    measured_from = 0.0
    if last_s is not None and end - last_s > 0:
        measured_from = end - last_s
        t0 = max(0.0, measured_from - warmup_s)
    kept = [r for r in requests if r.t_arrived >= t0]
    links = link(kept)
    trace = [_trace_row(i, r, t0, links.get(i)) for i, r in enumerate(kept)]
    if calibrated is None:
        calibrated = calibration(history)
    profiles = calibrated.profiles
    by_name = {s["name"]: s for s in spec["services"]}
    perf = {name: p.perf(by_name[name]) for name, p in profiles.items() if name in by_name}
    origin = float(spec.get("clock_origin_s_of_day", 0.0)) + t0
    sim: dict[str, Any] = {
        "duration_s": round(max(1.0, end - t0 + 1.0), 3),
        "start": _clock(origin),
        "seeds": 1,
        "sample_period_s": float(spec.get("sample_interval_s", 1.0)),
        "warmup_s": round(measured_from - t0, 3),
        "error": {"enabled": False},
        "services": perf,
        "timeline": TIMELINE,
    }
    unload = unload_seconds(history.decisions)
    if unload is not None:
        sim["unload_s"] = round(unload, 4)
    scenario: dict[str, Any] = {
        "devices": _devices(spec, config),
        "services": _services(spec, config),
        "policy": config.get("policy", {}),
        "host": config.get("host", {}),
        "workloads": [{"type": "recorded", "path": TRACE}],
        "simulation": sim,
    }
    return Export(
        scenario=scenario,
        trace=trace,
        timeline=timeline(
            history.samples,
            t0,
            {d["name"]: int(d.get("cores") or 1) for d in spec["devices"]},
            calibrated.idle_compute,
        ),
        profiles=profiles,
        request_ids=[r.request_id for r in kept],
        t0=t0,
    )


def export_note(history: History) -> str:
    """One line on what was exported."""
    s = history.run
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started_wall))
    return (
        f"run {s.run} (started {started}, accelmux {s.version}): "
        f"{len(history.requests)} requests over {history.span_s / 60:.1f} min"
    )
