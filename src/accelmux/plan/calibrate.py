"""Each service's measured profile, from the history: what the simulator is calibrated with.

Only what the daemon measured of the services themselves is used: how long their loads
took, the bytes their loads reported, the compute one of their requests uses, and how
much work their requests were (sizes and service times). No figure a plan or a
sim-to-real comparison reports (latencies, attainment, queueing, memory peaks, load
counts) is fitted to.

- **Compute share** (``share``: the fraction of the device one running request uses
  alone): on a host device, the probe counts the managed processes' runnable threads
  five times a second (:mod:`accelmux.history.cpu`); the counts taken while exactly one
  request of a service ran, and nothing else, less those taken while nothing ran, are
  the threads one request of it keeps runnable, and its share is threads / cores (at
  least :data:`MIN_SOLO_TICKS` counts). Otherwise: each memory sample says how many
  threads of the managed processes were runnable on average since the one before;
  that is the sum over services of the threads one of their requests keeps runnable x
  the seconds their requests ran, plus loads; a non-negative least-squares fit gives
  each service's threads, and its share is threads / cores. (Without thread counts, the
  fraction of the cores used, over the spans where the machine was not saturated.) A
  service with under :data:`MIN_BUSY_S` seconds of running time, or a device without
  compute samples, keeps the simulator's default.
- **Foreign compute**: the machine's other runnable threads / cores, per sample (a
  saturated machine with many threads waiting slows a request more than one with few,
  as Linux shares the cores between runnable threads), plus the managed processes' own
  runnable threads while nothing of theirs runs (``Calibration.idle_compute``: a
  thread pool spinning after its work, a worker's housekeeping).
- **Executors**: the shared inference worker runs each loaded model's requests one at
  a time on the model's thread (shared by the services that share the model), so a
  request dispatched while another of its thread ran started when that one ended; the
  spans below are from when each really started, and a replay runs such services on one
  executor each (``executor``).
- **Speed**: the simulator runs a request's *work* (its solo service time) at a rate
  ``1 / max(1, S + F)`` where ``S`` is the sum of the shares running and ``F`` the
  foreign compute (:mod:`accelmux.sim.compute`). The same rate, with the shares above
  and the foreign compute the samples measured, turns each measured service time back
  into work; then ``base_s + per_unit_s x units`` (or, for an LLM's streamed answers,
  ``base_s + prompt / prefill_tps`` to the first token and ``tbt_s`` per token after
  it) is fitted to the work by least squares.
- **Loads**: the median time of the loads that read weights (``load_s``), of those that
  found their copy already loaded for another service (``shared_load_s``), of the
  reloads from host RAM (``warm_init_s``, less the copy); the median time an unload took
  to hand its memory back (``unload_s``). A load computes too (a model is read and set
  up by the CPU): where the fit above gives loads a share (``load_share``), the load
  times are solo work, turned back from the measured ones by the same rate, and the
  simulator runs each load as work on the device.
- **Resident memory** (``true_weights + true_runtime``): what the memory samples
  measured of the service while it was loaded and idle (no request running, none for a
  second before), median, less its KV pool; split between weights and runtime as its
  loads reported them. The samples, not the loads' reports, because what the samples
  measure is what the device holds: a shared inference worker's interpreter and
  libraries are spread over its services in proportion (:mod:`accelmux.backends.worker`),
  and no load reports them.
"""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accelmux.history.cpu import parse_ticks
from accelmux.history.records import DecisionRecord, LoadRecord, RequestRecord, SampleRecord
from accelmux.history.store import History

#: Running time below which a service's compute share is not fitted (seconds).
MIN_BUSY_S = 5.0
#: A sample span in which the machine's cores were this busy is saturated: skipped.
SATURATED = 0.95
#: The key of loads among the shares (a load's share of the device), and of the
#: managed processes' own runnable threads while no request or load runs.
LOAD = "(load)"
IDLE = "(idle)"
#: The largest share a calibration gives (a request keeping 8 cores' worth runnable).
MAX_SHARE = 4.0
#: The simulator's default share (a service with too little data keeps it).
DEFAULT_SHARE = 0.5
MIN_SHARE = 0.05


@dataclass
class Profile:
    """One service's measured profile (None: not measured; the estimate stays)."""

    service: str
    kind: str
    requests: int = 0
    busy_s: float = 0.0
    share: float | None = None
    #: Probe counts taken while it ran alone (the share is read from them when enough).
    solo_ticks: int = 0
    base_s: float | None = None
    per_unit_s: float | None = None
    prefill_tps: float | None = None
    tbt_s: float | None = None
    load_s: float | None = None
    load_share: float | None = None
    #: How much one running request of it slows the others (None: its share).
    weight: float | None = None
    shared_load_s: float | None = None
    warm_init_s: float | None = None
    true_weights: int | None = None
    true_runtime: int | None = None
    loads: int = 0
    notes: list[str] = field(default_factory=list)

    def perf(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The scenario's ``simulation.services`` entry (with the spec's capabilities
        and shared-copy key)."""
        out: dict[str, Any] = {}
        for name in (
            "share",
            "weight",
            "base_s",
            "per_unit_s",
            "prefill_tps",
            "tbt_s",
            "load_s",
            "load_share",
            "shared_load_s",
            "warm_init_s",
            "true_weights",
            "true_runtime",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, 6) if isinstance(value, float) else value
        out["capabilities"] = dict(spec.get("capabilities") or {})
        if spec.get("weights_key"):
            # hosted by the shared inference worker: a copy others may share, run by one
            # thread that takes one request at a time
            out["weights_key"] = spec["weights_key"]
            out["executor"] = spec["weights_key"]
        return out


# ---- small numerics ---------------------------------------------------------------------
def nnls(rows: Sequence[Sequence[float]], y: Sequence[float], iters: int = 500) -> list[float]:
    """Non-negative least squares, min ||X b - y|| with b >= 0, by cyclic coordinate
    descent on the normal equations (a handful of unknowns)."""
    n = len(rows[0]) if rows else 0
    gram = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    xty = [sum(r[i] * v for r, v in zip(rows, y, strict=True)) for i in range(n)]
    b = [0.0] * n
    for _ in range(iters):
        moved = 0.0
        for i in range(n):
            if gram[i][i] <= 0:
                continue
            rest = xty[i] - sum(gram[i][j] * b[j] for j in range(n) if j != i)
            new = max(0.0, rest / gram[i][i])
            moved = max(moved, abs(new - b[i]))
            b[i] = new
        if moved < 1e-12:
            break
    return b


#: Sizes must spread this much (largest / smallest) for a fixed cost and a cost per unit
#: to be told apart; below it a service's work is fitted as one of the two.
MIN_SPREAD = 1.5


def fit_line(
    xs: Sequence[float], ys: Sequence[float], *, proportional: bool
) -> tuple[float, float]:
    """(base, per unit) with both >= 0, by least squares. When the sizes barely vary
    the two cannot be told apart: the work is then all per unit (``proportional``: an
    LLM's prompt) or all fixed (a camera's frames, all one size)."""
    positive = [x for x in xs if x > 0]
    if not xs:
        return 0.0, 0.0
    if len(positive) < 2 or max(positive) < MIN_SPREAD * min(positive):
        if proportional and sum(xs) > 0:
            return 0.0, sum(ys) / sum(xs)
        return sum(ys) / len(ys), 0.0
    base, per_unit = nnls([[1.0, x] for x in xs], ys)
    return base, per_unit


def _median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.median(vals) if vals else None


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


# ---- the pieces -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Run:
    service: str
    start: float
    end: float


def executor_starts(
    requests: Iterable[RequestRecord], executor_of: dict[str, str]
) -> dict[str, float]:
    """When each request of a service hosted by the shared worker really started: the
    worker runs a model's requests one at a time on the model's thread (shared by the
    services that share the model), so a request dispatched while another of its thread
    ran started when that one ended."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in requests:
        key = executor_of.get(r.replica or r.service)
        if key and r.t_dispatched is not None and r.t_finished is not None:
            groups.setdefault(key, []).append(r)
    out: dict[str, float] = {}
    for group in groups.values():
        group.sort(key=lambda r: (r.t_dispatched or 0.0, r.request_id))
        free = float("-inf")
        for r in group:
            assert r.t_dispatched is not None and r.t_finished is not None
            start = min(max(r.t_dispatched, free), r.t_finished)
            out[r.request_id] = start
            free = max(free, r.t_finished)
    return out


def _runs(requests: Iterable[RequestRecord], starts: dict[str, float]) -> list[_Run]:
    """Each request's running span (from when it really started: ``starts``)."""
    out = []
    for r in requests:
        start = starts.get(r.request_id, r.t_dispatched)
        if start is not None and r.t_finished is not None and r.t_finished > start:
            out.append(_Run(r.replica or r.service, start, r.t_finished))
    return out


def _loading(loads: Iterable[LoadRecord]) -> list[tuple[float, float]]:
    return [(ld.t_start, ld.t_end) for ld in loads if ld.t_end is not None]


def managed_compute(s: SampleRecord, cores: int) -> float | None:
    """The device the managed processes wanted over a sample's span, in shares: their
    runnable threads / cores, else (no thread counts) the fraction of the cores they
    used unless the machine was saturated (then it says nothing); None: unknown."""
    if s.run_managed is not None:
        return s.run_managed / cores
    if s.cpu_managed is not None and s.cpu_total is not None and s.cpu_total < SATURATED:
        return s.cpu_managed
    return None


def foreign_compute(s: SampleRecord, cores: int) -> float | None:
    """What other processes wanted over a sample's span, in shares of the device."""
    if s.run_total is not None and s.run_managed is not None:
        return round(max(0.0, s.run_total - s.run_managed) / cores, 3)
    if s.cpu_total is not None and s.cpu_managed is not None:
        return round(max(0.0, s.cpu_total - s.cpu_managed), 3)
    return None


#: The fewest counts taken while a service ran alone that say how many threads it keeps
#: runnable (fewer: the least-squares fit over the samples decides).
MIN_SOLO_TICKS = 20


def solo_threads(
    samples: Sequence[SampleRecord],
    runs: Sequence[_Run],
    loads: Sequence[tuple[float, float]],
) -> tuple[dict[str, float], dict[str, int]]:
    """From the probe's counts (``SampleRecord.ticks``): the mean managed runnable
    threads while exactly one request (of each service), or one load (``LOAD``), ran and
    nothing else did, less the mean while nothing ran (``IDLE``); and how many counts
    each mean is of. A count taken alone is what one request keeps runnable, with no
    other request to tell it apart from."""
    events: list[tuple[float, int, str]] = []
    for r in runs:
        events += [(r.start, 1, r.service), (r.end, -1, r.service)]
    for a, b in loads:
        events += [(a, 1, LOAD), (b, -1, LOAD)]
    events.sort()
    ticks = sorted(t for s in samples for t in parse_ticks(s.ticks))
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    running: dict[str, int] = {}
    i = 0
    for t, managed, _ in ticks:
        while i < len(events) and events[i][0] <= t:
            _, delta, name = events[i]
            running[name] = running.get(name, 0) + delta
            if running[name] <= 0:
                del running[name]
            i += 1
        if not running:
            key = IDLE
        elif len(running) == 1 and sum(running.values()) == 1:
            key = next(iter(running))
        else:
            continue
        sums[key] = sums.get(key, 0.0) + managed
        counts[key] = counts.get(key, 0) + 1
    idle = sums.get(IDLE, 0.0) / counts[IDLE] if counts.get(IDLE) else 0.0
    out = {k: max(0.0, v / counts[k] - (0.0 if k == IDLE else idle)) for k, v in sums.items()}
    return out, counts


def fit_shares(
    samples: Sequence[SampleRecord],
    runs: Sequence[_Run],
    loads: Sequence[tuple[float, float]],
    services: Sequence[str],
    cores: int,
) -> tuple[dict[str, float], dict[str, float]]:
    """(share by service, seconds each ran) from one device's compute samples."""
    busy = dict.fromkeys(services, 0.0)
    rows: list[list[float]] = []
    y: list[float] = []
    ordered = sorted(runs, key=lambda r: r.start)
    starts = [r.start for r in ordered]
    longest = max((r.end - r.start for r in ordered), default=0.0)
    index = {s: i for i, s in enumerate(services)}
    for prev, cur in itertools.pairwise(samples):
        wanted = managed_compute(cur, cores)
        a, b = prev.t, cur.t
        if wanted is None or b <= a:
            continue
        x = [0.0] * (len(services) + 1)
        lo = bisect.bisect_left(starts, a - longest)
        hi = bisect.bisect_right(starts, b)
        for run in ordered[lo:hi]:
            i = index.get(run.service)
            if i is not None:
                x[i] += _overlap(a, b, run.start, run.end)
        x[-1] = sum(_overlap(a, b, s, e) for s, e in loads)
        rows.append(x)
        y.append(wanted * (b - a))
        for s, i in index.items():
            busy[s] += x[i]
    if not rows:
        return {}, busy
    beta = nnls(rows, y)
    busy[LOAD] = sum(r[-1] for r in rows)
    shares = {s: beta[i] for s, i in index.items() if busy[s] >= MIN_BUSY_S}
    if busy[LOAD] >= MIN_BUSY_S:
        shares[LOAD] = beta[-1]
    return shares, busy


class _Steps:
    """A piecewise-constant function of time: the sum of values switched on and off."""

    def __init__(self, spans: Iterable[tuple[float, float, float]]) -> None:
        points: list[tuple[float, float]] = []
        for a, b, v in spans:
            points += [(a, v), (b, -v)]
        points.sort()
        self.times = [t for t, _ in points]
        self.values: list[float] = []
        total = 0.0
        for _, delta in points:
            total += delta
            self.values.append(max(0.0, total))

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[i] if i >= 0 else 0.0

    def edges(self, a: float, b: float) -> list[float]:
        lo, hi = bisect.bisect_right(self.times, a), bisect.bisect_left(self.times, b)
        return self.times[lo:hi]


class _Rate:
    """The simulator's rate over a device's recorded runs (:meth:`ComputeDevice.rate_of`):
    a job of share ``s`` and weight ``w`` runs at ``max(1, s) / max(1, s + W - w + F)``,
    ``W`` the weights of what runs then (its own included), ``F`` the foreign compute."""

    def __init__(
        self,
        runs: Sequence[_Run],
        shares: dict[str, float],
        foreign: Sequence[tuple[float, float]],
        weights: dict[str, float] | None = None,
    ) -> None:
        self.shares = shares
        self.weights = weights or {}
        self.load = _Steps((r.start, r.end, self.weight(r.service)) for r in runs)
        self.f_times = [t for t, _ in foreign]
        self.f_values = [v for _, v in foreign]

    def share(self, service: str) -> float:
        return self.shares.get(service, DEFAULT_SHARE)

    def weight(self, service: str) -> float:
        return self.weights.get(service, self.share(service))

    def foreign_at(self, t: float) -> float:
        i = bisect.bisect_right(self.f_times, t) - 1  # the last value set at or before t
        return self.f_values[i] if i >= 0 else 0.0

    def cuts(self, a: float, b: float) -> list[float]:
        edges = {a, b, *self.load.edges(a, b)}
        lo, hi = bisect.bisect_right(self.f_times, a), bisect.bisect_left(self.f_times, b)
        edges.update(self.f_times[lo:hi])
        return sorted(edges)

    def work(self, a: float, b: float, service: str) -> float:
        """Solo seconds of work a job of ``service`` running all along [a, b] did."""
        if b <= a:
            return 0.0
        s, w = self.share(service), self.weight(service)
        total = 0.0
        for x0, x1 in itertools.pairwise(self.cuts(a, b)):
            mid = (x0 + x1) / 2
            demand = s + max(0.0, self.load.at(mid) - w) + self.foreign_at(mid)
            total += (x1 - x0) * max(1.0, s) / max(1.0, demand)
        return total


#: Rounds of fitting speeds and contention weights, each read with the other.
WEIGHT_ROUNDS = 3
#: A request ran beside others when it had on average this many others running with it.
MIN_BESIDE = 0.2
#: A service's weight is read only from this many seconds of others running beside it.
MIN_BESIDE_S = 10.0
#: Gauss-Newton steps of the weights' fit.
WEIGHT_STEPS = 12
MAX_WEIGHT = 16.0
LLM_KINDS = ("chat", "completion")


def solo_work(p: Profile, r: RequestRecord, is_llm: bool) -> float | None:
    """The solo seconds of work ``p``'s speed gives request ``r`` (None: no speed)."""
    if p.base_s is None:
        return None
    if is_llm:
        out = float(r.output_tokens or r.max_output_tokens)
        prefill = r.prompt_tokens / p.prefill_tps if p.prefill_tps else 0.0
        return p.base_s + prefill + out * (p.tbt_s or 0.0)
    return p.base_s + (p.per_unit_s or 0.0) * r.units


def fit_weights(
    requests: Sequence[RequestRecord],
    starts: dict[str, float],
    speeds: dict[str, Profile],
    rate: _Rate,
    runs: Sequence[_Run],
) -> dict[str, float]:
    """Each service's contention weight: how much one running request of it slows the
    others on the device, from the service times of the requests that ran beside it.

    A request's solo work ``W`` (its service's speed) must be what the simulator's rate
    does over the time it took: ``integral of max(1, s) / max(1, s + sum_j w_j n_j(t) +
    F(t)) dt = W`` (``n_j(t)`` the requests of service ``j`` running beside it, ``F`` the
    foreign compute). A projected Gauss-Newton fit of the weights over the requests that
    ran beside others makes the relative errors smallest, starting from the shares; a
    service seldom beside others keeps its share (no entry)."""
    names = sorted({r.service for r in runs if r.service != LOAD})
    index = {n: i for i, n in enumerate(names)}
    counts = {n: _Steps((r.start, r.end, 1.0) for r in runs if r.service == n) for n in names}
    cases = []
    beside_s = dict.fromkeys(names, 0.0)
    for r in requests:
        name = r.replica or r.service
        p = speeds.get(name)
        start = starts.get(r.request_id, r.t_dispatched)
        if p is None or start is None or r.t_finished is None or r.outcome != "ok":
            continue
        if r.attempts > 1 or r.pauses or name not in index or r.t_finished <= start:
            continue
        work = solo_work(p, r, p.kind in LLM_KINDS)
        if work is None or work <= 0:
            continue
        segments = []
        for x0, x1 in itertools.pairwise(rate.cuts(start, r.t_finished)):
            mid = (x0 + x1) / 2
            n = [counts[o].at(mid) - (1.0 if o == name else 0.0) for o in names]
            segments.append((x1 - x0, [max(0.0, v) for v in n], rate.foreign_at(mid)))
        beside = sum(d * sum(n) for d, n, _ in segments) / (r.t_finished - start)
        if beside < MIN_BESIDE:
            continue
        for d, n, _ in segments:
            for o in names:
                beside_s[o] += d * n[index[o]]
        cases.append((rate.share(name), work, segments))
    known = [n for n in names if beside_s[n] >= MIN_BESIDE_S]
    if not cases or not known:
        return {}
    w = [rate.share(n) for n in names]
    free = [index[n] for n in known]
    for _ in range(WEIGHT_STEPS):
        rows, errs = [], []
        for share, work, segments in cases:
            done, grad = 0.0, [0.0] * len(names)
            for d, n, f in segments:
                demand = share + sum(wj * nj for wj, nj in zip(w, n, strict=True)) + f
                done += d * max(1.0, share) / max(1.0, demand)
                if demand > 1.0:
                    for j in free:
                        grad[j] -= d * max(1.0, share) * n[j] / demand**2
            errs.append((done - work) / work)
            rows.append([grad[j] / work for j in free])
        step = _gauss_newton_step(rows, errs)
        moved = 0.0
        for k, j in enumerate(free):
            new = min(MAX_WEIGHT, max(0.0, w[j] + step[k]))
            moved = max(moved, abs(new - w[j]))
            w[j] = new
        if moved < 1e-4:
            break
    return {n: w[index[n]] for n in known}


def _gauss_newton_step(rows: list[list[float]], errs: list[float]) -> list[float]:
    """The step ``d`` that makes ``rows d + errs`` smallest (damped normal equations)."""
    n = len(rows[0]) if rows else 0
    gram = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    rhs = [-sum(r[i] * e for r, e in zip(rows, errs, strict=True)) for i in range(n)]
    for i in range(n):
        gram[i][i] += 1e-6 + 1e-3 * gram[i][i]
    # Gaussian elimination (a handful of unknowns)
    a = [[*row, b] for row, b in zip(gram, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] if abs(a[i][i]) > 1e-12 else 0.0 for i in range(n)]


def _fit_speed(
    p: Profile,
    requests: Sequence[RequestRecord],
    rate: _Rate,
    is_llm: bool,
    starts: dict[str, float],
) -> None:
    done = [
        r
        for r in requests
        if r.outcome == "ok"
        and r.t_dispatched is not None
        and r.t_finished is not None
        and r.attempts <= 1
        and r.pauses == 0
    ]
    p.requests = len(done)
    if not done:
        p.notes.append("no request served: its speed is the scenario default")
        return
    streamed = [r for r in done if r.stream and r.t_first_token is not None and r.output_tokens]
    if is_llm and streamed:
        xs, y, per_token = [], [], []
        for r in streamed:
            assert r.t_dispatched is not None and r.t_first_token is not None
            start = min(starts.get(r.request_id, r.t_dispatched), r.t_first_token)
            xs.append(float(r.prompt_tokens))
            name = r.replica or r.service
            y.append(rate.work(start, r.t_first_token, name))
            decode = rate.work(r.t_first_token, r.t_finished or r.t_first_token, name)
            per_token.append(decode / max(1, (r.output_tokens or 1) - 1))
        base, per_prompt = fit_line(xs, y, proportional=True)
        p.base_s = base
        p.prefill_tps = 1.0 / per_prompt if per_prompt > 1e-9 else 1e6
        p.tbt_s = _median(per_token)
        return
    xs, y = [], []
    for r in done:
        assert r.t_dispatched is not None and r.t_finished is not None
        xs.append(float(r.output_tokens or r.max_output_tokens) if is_llm else r.units)
        y.append(
            rate.work(
                starts.get(r.request_id, r.t_dispatched), r.t_finished, r.replica or r.service
            )
        )
    base, per_unit = fit_line(xs, y, proportional=is_llm)
    if is_llm:  # answers that did not stream: the whole answer is base + tokens x tbt
        p.base_s, p.tbt_s = base, per_unit
        p.prefill_tps = 1e6
        p.notes.append("no streamed answer: prefill is folded into base_s")
    else:
        p.base_s, p.per_unit_s = base, per_unit


def _fit_loads(
    p: Profile,
    loads: Sequence[LoadRecord],
    shared_key: bool,
    host_bw: float,
    weights: int,
    took: Callable[[LoadRecord], float],
) -> None:
    """Load times (``took``: a load's solo time), and the bytes the loads reported."""
    ok = [ld for ld in loads if ld.ok and ld.t_end is not None]
    p.loads = len(ok)
    measured = [ld for ld in ok if ld.weights is not None or ld.runtime is not None]
    shared = [ld for ld in ok if shared_key and ld.weights is None and ld.runtime is None]
    cold = [ld for ld in measured if ld.from_tier == "cold"]
    warm = [ld for ld in measured if ld.from_tier in ("parked", "sleeping")]
    p.load_s = _median(took(ld) for ld in cold)
    p.shared_load_s = _median(took(ld) for ld in shared)
    warm_s = _median(took(ld) for ld in warm)
    if warm_s is not None:
        p.warm_init_s = max(0.0, warm_s - weights / host_bw)
    w = _median(float(ld.weights) for ld in measured if ld.weights is not None)
    r = _median(float(ld.runtime) for ld in measured if ld.runtime is not None)
    p.true_weights = None if w is None else int(w)
    p.true_runtime = None if r is None else int(r)


#: A sample counts as idle for a service this long after its last request ended (s).
IDLE_AFTER_S = 1.0
#: ... and this long after its load ended.
SETTLED_AFTER_S = 2.0


def _loaded_spans(
    service: str, loads: Sequence[LoadRecord], decisions: Sequence[DecisionRecord]
) -> list[tuple[float, float, int]]:
    """(from, to, KV pool) of each span the service was loaded (settled after its load)."""
    ends = sorted(
        d.t for d in decisions if d.service == service and d.action in ("unload", "crashed")
    )
    spans = []
    for ld in loads:
        if ld.service != service or not ld.ok or ld.t_end is None:
            continue
        later = [t for t in ends if t > ld.t_end]
        spans.append((ld.t_end + SETTLED_AFTER_S, later[0] if later else float("inf"), ld.kv_pool))
    return spans


def _fit_resident(
    p: Profile,
    samples: Sequence[SampleRecord],
    spans: Sequence[tuple[float, float, int]],
    busy: Sequence[tuple[float, float]],
    reported: tuple[float | None, float | None],
) -> None:
    """``true_weights`` and ``true_runtime`` from the samples taken while idle."""
    starts = [a for a, _ in busy]
    longest = max((b - a for a, b in busy), default=0.0)
    idle: list[float] = []
    for s in samples:
        span = next((sp for sp in spans if sp[0] <= s.t < sp[1]), None)
        if span is None:
            continue
        lo = bisect.bisect_left(starts, s.t - longest - IDLE_AFTER_S - 1.0)
        hi = bisect.bisect_right(starts, s.t)
        if any(a <= s.t <= b + IDLE_AFTER_S for a, b in busy[lo:hi]):
            continue
        value = json.loads(s.per_service).get(p.service)
        if value is not None:
            idle.append(max(0.0, float(value) - span[2]))
    resident = _median(idle)
    if resident is None:
        return
    weights, runtime = reported
    share = (
        weights / (weights + runtime)
        if weights and runtime is not None and weights + runtime > 0
        else 1.0
    )
    p.true_weights = int(resident * share)
    p.true_runtime = int(resident) - p.true_weights


def unload_seconds(decisions: Sequence[DecisionRecord]) -> float | None:
    """The median time from an unload decision to the memory coming back."""
    asked: dict[str, float] = {}
    took: list[float] = []
    for d in decisions:
        if d.action == "unload":
            asked[d.service] = d.t
        elif d.action == "unloaded" and d.service in asked:
            took.append(d.t - asked.pop(d.service))
    return _median(took)


def foreign_series(
    samples: Sequence[SampleRecord], cores: int, idle: float = 0.0
) -> list[tuple[float, float]]:
    """Other processes' compute over time, in shares of the device, as (from when, how
    much) pairs: per count of the probe where the samples keep them (a burst shorter than
    a sample is seen), else per sample span (from the sample before); ``idle`` added."""
    ticks = sorted(t for s in samples for t in parse_ticks(s.ticks))
    if ticks:
        return [(t, round(max(0, n - m) / cores + idle, 3)) for t, m, n in ticks]
    out = []
    for prev, cur in itertools.pairwise(samples):
        f = foreign_compute(cur, cores)
        if f is not None:
            out.append((prev.t, round(f + idle, 3)))
    return out


@dataclass
class Calibration:
    """Every service's profile, and per device the compute the managed processes use
    while no request or load runs (in shares of the device: a runtime's thread pool
    spinning after its work, a worker's housekeeping), which a replay counts with the
    other programs' compute."""

    profiles: dict[str, Profile]
    idle_compute: dict[str, float] = field(default_factory=dict)


def calibrate(history: History, *, until: float | None = None) -> dict[str, Profile]:
    """Every service's profile from ``history`` (its rows up to ``until``)."""
    return calibration(history, until=until).profiles


def calibration(history: History, *, until: float | None = None) -> Calibration:
    """Every service's profile from ``history`` (its rows up to ``until``), and each
    device's idle managed compute."""
    spec = json.loads(history.run.spec)
    devices = {d["name"]: d for d in spec["devices"]}
    services = {s["name"]: s for s in spec["services"]}
    config = json.loads(history.run.config)
    end = float("inf") if until is None else until
    requests = [r for r in history.requests if r.t_arrived <= end]
    samples = [s for s in history.samples if s.t <= end]
    loads = [ld for ld in history.loads if ld.t_start <= end]
    decisions = [d for d in history.decisions if d.t <= end]
    profiles: dict[str, Profile] = {}
    idle_compute: dict[str, float] = {}
    starts = executor_starts(
        requests, {n: s["weights_key"] for n, s in services.items() if s.get("weights_key")}
    )
    for dev_name, dev in devices.items():
        on_dev = [n for n, s in services.items() if s["device"] == dev_name]
        dev_samples = [s for s in samples if s.device == dev_name]
        runs = [r for r in _runs(requests, starts) if r.service in on_dev]
        dev_loads = _loading(ld for ld in loads if ld.service in on_dev)
        cores = int(dev.get("cores") or 1)
        shares, busy = fit_shares(dev_samples, runs, dev_loads, on_dev, cores)
        solo, counted = solo_threads(dev_samples, runs, dev_loads)
        for key, threads in solo.items():
            if key != IDLE and counted[key] >= MIN_SOLO_TICKS:
                shares[key] = threads / cores  # counted alone: better than the fit
        idle_compute[dev_name] = solo.get(IDLE, 0.0) / cores
        load_share = shares.get(LOAD)
        if load_share is not None:  # loads compute: in the rate, and timed as solo work
            load_share = min(MAX_SHARE, max(MIN_SHARE, load_share))
            runs = runs + [_Run(LOAD, a, b) for a, b in dev_loads]
        used = {n: min(MAX_SHARE, max(MIN_SHARE, v)) for n, v in shares.items() if n != LOAD}
        used |= {LOAD: load_share} if load_share else {}
        foreign = foreign_series(dev_samples, cores, idle_compute[dev_name])
        kinds = {
            n: str(config["services"].get(services[n]["group"] or n, {}).get("kind", ""))
            for n in on_dev
        }
        weights: dict[str, float] = {}
        for _ in range(WEIGHT_ROUNDS):  # speeds and weights, each read with the other
            rate = _Rate(runs, used, foreign, weights)
            speeds = {}
            for name in on_dev:
                speeds[name] = Profile(service=name, kind=kinds[name])
                mine = [r for r in requests if (r.replica or r.service) == name]
                _fit_speed(speeds[name], mine, rate, kinds[name] in LLM_KINDS, starts)
            weights = fit_weights(requests, starts, speeds, rate, runs)
        rate = _Rate(runs, used, foreign, weights)

        def took(
            ld: LoadRecord, rate: _Rate = rate, computes: bool = load_share is not None
        ) -> float:
            assert ld.t_end is not None
            return rate.work(ld.t_start, ld.t_end, LOAD) if computes else ld.t_end - ld.t_start

        for name in on_dev:
            svc = services[name]
            kind = str(config["services"].get(svc["group"] or name, {}).get("kind", ""))
            p = Profile(service=name, kind=kind, busy_s=round(busy.get(name, 0.0), 3))
            if name in shares:
                p.share = min(MAX_SHARE, max(MIN_SHARE, shares[name]))
                p.solo_ticks = counted.get(name, 0)
            elif not any(managed_compute(s, cores) is not None for s in dev_samples):
                p.notes.append("no compute samples on its device: default share")
            else:
                p.notes.append(f"ran {p.busy_s:.1f} s: too little to fit its share")
            mine = [r for r in requests if (r.replica or r.service) == name]
            _fit_speed(p, mine, rate, kind in LLM_KINDS, starts)
            _fit_loads(
                p,
                [ld for ld in loads if ld.service == name],
                bool(svc.get("weights_key")),
                float(dev["host_bandwidth"]),
                int(svc["profile"]["weights"]),
                took,
            )
            p.load_share = load_share
            if name in weights:
                p.weight = weights[name]
            busy_spans = sorted(
                (r.t_dispatched, r.t_finished)
                for r in mine
                if r.t_dispatched is not None and r.t_finished is not None
            )
            reported = (
                float(p.true_weights) if p.true_weights is not None else None,
                float(p.true_runtime) if p.true_runtime is not None else None,
            )
            _fit_resident(
                p,
                dev_samples,
                _loaded_spans(name, loads, decisions),
                busy_spans,
                reported,
            )
            profiles[name] = p
    return Calibration(profiles, idle_compute)
