"""The simulation: the Manager driven by a virtual clock, its actions executed on a model.

:class:`Simulation` feeds events to the same :class:`~accelmux.core.manager.Manager` the
daemon runs, and turns its actions into simulated effects:

- ``Dispatch``: allocate the request's true activation peak (an OOM crashes the
  service), then run its work under processor sharing; on completion the Manager gets
  ``RequestFinished`` with the true peak;
- ``Load``: allocate the true resident bytes (an OOM is a ``LoadFailed``), then
  ``LoadFinished`` after ``true weights / bandwidth + init_s`` with the measured sizes.
  The bandwidth is the device's host bandwidth when the host cache (the page cache,
  the same for every policy) still holds the weights, else its load bandwidth; a
  sleeping service wakes without ``init_s``;
- ``Unload``: ``Unloaded`` after ``unload_s``, memory freed then; a ``parked`` or
  ``sleeping`` tier holds the weights in the host cache until the next load;
- ``Preempt``: stop the job (its stale completion is dropped);
- ``Pause``: stop the job, keeping its progress, and free its activation memory;
  ``PauseFinished`` at the same virtual time (a request drawn as one its backend cannot
  pause, ``unpausable_share``, arrives with ``pausable`` false and is never asked);
  ``Resume``: after ``switch_s`` (plus the KV state at host bandwidth when it was
  parked) allocate its activation again and continue the job where it stopped;
- ``Resize``: change the KV pool: a growth allocates at once (it may OOM), a shrink
  frees at the end; ``ResizeFinished`` after ``resize_s`` (only backends that declare a
  live resize get one);
- ``Reject`` / ``Fail``: record the outcome.

Foreign programs (``simulation.foreign``) start and stop on their schedule whatever the
Manager does: each takes its memory at once (over-committing the device, see
:mod:`accelmux.sim.physical`; the Manager learns of it at the next sample) and its
``compute_share`` of the device (:mod:`accelmux.sim.compute`).

Every ``sample_period_s`` the Manager gets ``MemorySampled`` with the true per-service
usage and the device total (so foreign bytes and allocator caches become visible), and
a ``Tick`` is scheduled at ``manager.next_wakeup(now)``. Nothing here reads a real clock.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Pause,
    Preempt,
    Rebatch,
    Reject,
    Resize,
    Resume,
    Unload,
)
from accelmux.core.events import (
    BackendCrashed,
    Demand,
    Event,
    LoadFailed,
    LoadFinished,
    MemorySampled,
    PauseFinished,
    RequestArrived,
    RequestFinished,
    ResizeFinished,
    Tick,
    Unloaded,
)
from accelmux.core.manager import Decision, Manager
from accelmux.core.placement import without_replicas
from accelmux.core.profiles import estimate_request
from accelmux.core.shrink import scaled_demand
from accelmux.core.specs import ServiceSpec
from accelmux.core.types import ServiceClass, Tier
from accelmux.sim.baselines import apply_variant, build_policy
from accelmux.sim.compute import ComputeDevice, Job, solo_work
from accelmux.sim.engine import EventHeap, SimClock
from accelmux.sim.physical import ForeignProcess, HostCache, OomEvent, PhysicalDevice
from accelmux.sim.recorded import TimelineRow, read_timeline
from accelmux.sim.scenario import ForeignConfig, Scenario, ServicePerfConfig
from accelmux.sim.starvation import StarvationTracker
from accelmux.sim.workloads import Source, build_sources


class RoundObserver(Protocol):
    """Sees each Manager round: its event (None for the start) and its actions."""

    def round(self, now: float, event: Event | None, actions: Sequence[Action]) -> None: ...


@dataclass(slots=True)
class SimRequest:
    rid: str
    service: str
    cls: ServiceClass
    demand: Demand
    arrived_at: float
    truth: float
    est_kv: int
    est_active: int
    source: Source | None = None
    tag: object = None
    attempt: int = 0
    first_dispatch_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    outcome: str | None = None  # "ok" | "rejected" | "failed"
    reason: str | None = None
    preemptions: int = 0
    pauses: int = 0
    oom: bool = False
    true_active: int = 0
    #: The replica that runs it (``service`` unless the service has replicas).
    replica: str = ""


@dataclass(slots=True)
class MemorySample:
    """One sample of the accounts and the truth (bytes)."""

    ledger: dict[str, dict[str, int]]
    true: dict[str, int]
    foreign: int
    idle_resident: int
    used: int


@dataclass
class RunOutput:
    """Everything one run produced; :mod:`accelmux.sim.metrics` turns it into a report."""

    scenario: str
    policy: str
    seed: int
    capacity_gib: float
    duration_s: float
    warmup_s: float
    requests: dict[str, SimRequest]
    services: dict[str, ServiceSpec]
    slo: dict[str, dict[str, float | None]]
    ooms: list[OomEvent]
    samples: list[MemorySample]
    manager: Manager
    sources: list[Source]
    windows_open: dict[str, list[tuple[float, float]]]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[float, Event]] = field(default_factory=list)
    busy_s: dict[str, float] = field(default_factory=dict)
    starvation: StarvationTracker = field(default_factory=StarvationTracker)
    #: The foreign programs' lives (baseline memory left out), for the foreign metrics.
    foreign: list[ForeignProcess] = field(default_factory=list)


class Simulation:
    """One run of one policy on one scenario with one seed."""

    def __init__(
        self,
        scenario: Scenario,
        policy: str,
        seed: int,
        *,
        capacity_gib: float | None = None,
        duration_s: float | None = None,
        trace_path: str | None = None,
        record_decisions: bool = False,
        record_events: bool = False,
    ) -> None:
        self.scenario = scenario
        cfg = scenario.config
        self.sim_cfg = cfg.simulation
        #: The batch fraction each service that may shrink runs with (Rebatch).
        self.batch_fraction: dict[str, float] = {}
        self.seed = seed
        self.duration = float(duration_s if duration_s is not None else self.sim_cfg.duration_s)
        self.spec = scenario.manager_spec(capacity_gib)
        configured = apply_variant(policy, cfg.policy)
        if configured.disable != cfg.policy.disable:  # accelmux[disable=[...]]
            knobs = dataclasses.replace(self.spec.knobs, disabled=frozenset(configured.disable))
            self.spec = dataclasses.replace(self.spec, knobs=knobs)
        self.policy = build_policy(policy, cfg.policy)
        if getattr(self.policy, "route", None) is None:
            # A policy that does not place runs each service on its first device.
            self.spec = without_replicas(self.spec)
        self.manager = Manager(self.spec, self.policy)
        self.clock = SimClock()
        self.heap = EventHeap(self.clock)
        self.record_decisions = record_decisions
        self.record_events = record_events
        self.decisions: list[dict[str, Any]] = []
        self.events: list[tuple[float, Event]] = []
        #: Specs by name: the replicas (``chat@gpu1``) where a service has them.
        self.services = {s.name: s for s in self.spec.services}
        #: Specs by the name requests address (a service's first replica stands for it).
        self.addressed: dict[str, ServiceSpec] = {}
        for s in self.spec.services:
            self.addressed.setdefault(s.addressed_as, s)
        self.perf = {
            name: self.sim_cfg.services.get(spec.addressed_as, ServicePerfConfig())
            for name, spec in (self.services | self.addressed).items()
        }
        self.slo = {
            name: {
                "latency_s": svc.slo.latency_s,
                "ttft_s": svc.slo.ttft_s,
                "tbt_s": svc.slo.tbt_s,
            }
            for name, svc in cfg.services.items()
        }
        self.devices: dict[str, PhysicalDevice] = {}
        self.compute: dict[str, ComputeDevice] = {}
        for dev in self.spec.devices:
            cap = math.inf if self.policy.infinite_memory else float(dev.capacity_bytes)
            self.devices[dev.name] = PhysicalDevice(dev.name, cap, clock=self.clock.now)
            self.compute[dev.name] = ComputeDevice(dev.name, isolated=self.policy.infinite_memory)
        #: What the operator left outside each device's budget (``capacity - budget``):
        #: the monitors count it as baseline, not foreign (accelmux.monitors), and so does
        #: the simulator, beside the foreign processes a scenario marks as baseline.
        self.slack = {d.name: max(0, d.capacity_bytes - d.budget_bytes) for d in self.spec.devices}
        self.bandwidth = {d.name: d.load_bandwidth_bps for d in self.spec.devices}
        self.host_bandwidth = {d.name: d.host_bandwidth_bps for d in self.spec.devices}
        self.host_cache = HostCache(int(self.sim_cfg.page_cache))
        #: Jobs of paused requests (their progress), whether each was parked, and a
        #: counter per request that makes a resume still under way stale.
        self.paused_jobs: dict[str, Job] = {}
        self.parked: dict[str, bool] = {}
        self.pause_gen: dict[str, int] = {}
        err = self.sim_cfg.error
        self.true_resident: dict[str, tuple[int, int]] = {}
        for name, svc in self.services.items():
            rng = random.Random(f"{seed}:resident:{svc.addressed_as}")
            bias = self.perf[name].resident_bias
            bias = err.resident_bias if bias is None else bias
            f = bias * math.exp(rng.gauss(0.0, err.resident_sigma))
            if not err.enabled:
                f = 1.0
            perf = self.perf[name]
            self.true_resident[name] = (
                round(svc.profile.weights * f) if perf.true_weights is None else perf.true_weights,
                round(svc.profile.runtime * f) if perf.true_runtime is None else perf.true_runtime,
            )
        self.requests: dict[str, SimRequest] = {}
        self.ooms: list[OomEvent] = []
        self.samples: list[MemorySample] = []
        self.generation: dict[str, int] = dict.fromkeys(self.services, 0)
        self.alive: dict[str, bool] = dict.fromkeys(self.services, False)
        self.oom_crashed: set[str] = set()
        self.baseline_keys: set[str] = set()
        #: The device timeline's processes (other programs as recorded) and, per device,
        #: the baseline the daemon counted when it recorded them.
        self.timeline_keys: set[str] = set()
        self.recorded_baseline: dict[str, int] = {}
        #: Per (device, weights key): the service whose memory carries the shared copy.
        self.weights_copy: dict[tuple[str, str], str] = {}
        #: Executors (``executor``): the request each runs, per (device, executor), and
        #: the jobs waiting for it.
        self.executing: dict[tuple[str, str], str | None] = {}
        self.executor_queue: dict[tuple[str, str], list[Job]] = {}
        #: Loads that compute (``load_share``): what each job's end calls, and each
        #: loading service's job.
        self.load_jobs: dict[str, Callable[[], None]] = {}
        self.loading_job: dict[str, str] = {}
        self._scheduled_version: dict[str, int] = {}
        self._next_tick: float | None = None
        self._rid = 0
        #: The compute share of each foreign program running now, per device.
        self.foreign_compute: dict[str, dict[str, float]] = {d: {} for d in self.devices}
        self.sources = build_sources(scenario, seed, trace_path)
        self.starvation = StarvationTracker()
        #: Told every round of the Manager (the request history's recorder, in a replay).
        self.observers: list[RoundObserver] = []

    # ---- Context for the workload sources ------------------------------------------
    @property
    def duration_s(self) -> float:
        return self.duration

    @property
    def start_s_of_day(self) -> float:
        return self.scenario.start_s_of_day

    def is_llm(self, service: str) -> bool:
        spec = self.services.get(service) or self.addressed[service]
        return spec.kind.is_llm

    def truth(self, rng: random.Random, service: str) -> float:
        err = self.sim_cfg.error
        sigma = self.perf[service].request_sigma
        sigma = err.request_sigma if sigma is None else sigma
        bias = self.perf[service].request_bias
        bias = err.request_bias if bias is None else bias
        f = bias * math.exp(rng.gauss(0.0, sigma))
        if rng.random() < err.tail_probability:
            f *= err.tail_factor
        return f if err.enabled else 1.0

    def truth_of_peak(self, service: str, demand: Demand, peak_bytes: int) -> float:
        """The true-memory factor of a request whose peak was measured (a recorded one):
        its activation is what the peak holds beyond its KV tokens."""
        est = estimate_request(self.addressed[service].profile, demand)
        if est.active_bytes <= 0:
            return 1.0
        return max(0.0, peak_bytes - est.kv_bytes) / est.active_bytes

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        self.heap.at(max(t, self.clock.now()), fn)

    def submit(
        self,
        service: str,
        demand: Demand,
        *,
        source: Source,
        truth: float,
        tag: object = None,
        job_id: str | None = None,
        pausable: bool | None = None,
    ) -> str:
        self._rid += 1
        rid = f"r{self._rid}"
        now = self.clock.now()
        spec = self.addressed[service]
        est = estimate_request(spec.profile, demand)
        self.requests[rid] = SimRequest(
            rid=rid,
            service=service,
            cls=spec.cls,
            demand=demand,
            arrived_at=now,
            truth=truth,
            est_kv=est.kv_bytes,
            est_active=est.active_bytes,
            source=source,
            tag=tag,
        )
        # A simulated LLM request streams its answer: its backend may pause it, unless it
        # is one of the service's share of requests it cannot pause (tools, structured).
        event = RequestArrived(
            request_id=rid,
            service=service,
            demand=demand,
            job_id=job_id,
            pausable=spec.kind.is_llm
            and (self._pausable(service, rid) if pausable is None else pausable),
        )
        self.heap.at(now, lambda: self._handle(event))
        return rid

    def _pausable(self, service: str, rid: str) -> bool:
        """Whether request ``rid`` of an LLM ``service`` can pause: drawn from the
        service's ``unpausable_share`` (deterministic by seed and request)."""
        perf = self.perf.get(service)
        share = perf.unpausable_share if perf is not None else 0.0
        if share <= 0:
            return True
        return random.Random(f"{self.seed}:pausable:{rid}").random() >= share

    # ---- driving ----------------------------------------------------------------------
    def run(self) -> RunOutput:
        started = self.manager.start(0.0)
        for observer in self.observers:
            observer.round(0.0, None, started)
        self._execute(started, 0.0)
        self._schedule_tick(0.0)
        for src in self.sources:
            src.start(self)
        period = self.sim_cfg.sample_period_s
        self.heap.at(period, lambda: self._sample(period))
        for i, f in enumerate(self.sim_cfg.foreign):
            device = f.device or next(iter(self.devices))
            key = f"{f.name}-{i}"
            if f.baseline:
                self.baseline_keys.add(key)
            self.call_at(f.at_s, self._foreign_setter(device, key, f, running=True))
            if f.duration_s is not None:
                self.call_at(
                    f.at_s + f.duration_s, self._foreign_setter(device, key, f, running=False)
                )
        self._replay_timeline()
        self.heap.run(self.duration)
        for comp in self.compute.values():
            comp.advance(self.duration)
        for phys in self.devices.values():
            phys.advance(self.duration)
        return RunOutput(
            scenario=self.scenario.name,
            policy=self.policy.name,
            seed=self.seed,
            capacity_gib=next(iter(self.spec.devices)).capacity_bytes / 1024**3,
            duration_s=self.duration,
            warmup_s=min(self.sim_cfg.warmup_s, self.duration / 2),
            requests=self.requests,
            services=self.addressed,
            slo=self.slo,
            ooms=self.ooms,
            samples=self.samples,
            manager=self.manager,
            sources=self.sources,
            windows_open=self._windows(),
            decisions=self.decisions,
            events=self.events,
            busy_s={name: dev.busy_s for name, dev in self.compute.items()},
            starvation=self.starvation,
            foreign=[
                proc
                for phys in self.devices.values()
                for proc in phys.processes
                if proc.key not in self.baseline_keys and proc.key not in self.timeline_keys
            ],
        )

    def _windows(self) -> dict[str, list[tuple[float, float]]]:
        """Per service, the simulated intervals during which its windows are open."""
        out: dict[str, list[tuple[float, float]]] = {}
        step = 60.0
        for name, svc in self.addressed.items():
            if not svc.windows:
                continue
            spans: list[tuple[float, float]] = []
            t = 0.0
            while t < self.duration:
                tod = self.manager.world.time_of_day(t)
                if svc.in_window(tod):
                    if spans and abs(spans[-1][1] - t) < 1e-6:
                        spans[-1] = (spans[-1][0], t + step)
                    else:
                        spans.append((t, t + step))
                t += step
            out[name] = spans
        return out

    def _handle(self, event: Event) -> None:
        now = self.clock.now()
        if self.record_events:
            self.events.append((now, event))
        actions = self.manager.handle(event, now)
        for observer in self.observers:
            observer.round(now, event, actions)
        self._execute(actions, now)
        self._schedule_tick(now)

    def _schedule_tick(self, now: float) -> None:
        wake = self.manager.next_wakeup(now)
        if wake is None or wake > self.duration:
            return
        if self._next_tick is not None and now < self._next_tick <= wake:
            return
        self._next_tick = wake
        self.heap.at(wake, lambda: self._tick(wake))

    def _tick(self, t: float) -> None:
        if self._next_tick == t:
            self._next_tick = None
        self._handle(Tick())

    def _sample(self, t: float) -> None:
        ledger = self.manager.world.ledger
        for name, dev in self.devices.items():
            self._handle(
                MemorySampled(
                    device=name,
                    used_bytes=dev.used,
                    per_service=dev.per_service(),
                    baseline_bytes=max(
                        self.slack[name],
                        sum(n for k, n in dev.foreign.items() if k in self.baseline_keys),
                        self.recorded_baseline.get(name, 0),
                    ),
                )
            )
            dev.foreign_seen = dev.foreign_total
        self.starvation.sample(
            self.manager.world,
            {
                d.name: max(0, int(d.usable_bytes - self.devices[d.name].used))
                for d in self.spec.devices
            },
            self.sim_cfg.sample_period_s,
        )
        dev0 = next(iter(self.devices.values()))
        idle = sum(
            mem.total
            for svc, mem in dev0.services.items()
            if not mem.active and not self.manager.world.services[svc].inflight
        )
        self.samples.append(
            MemorySample(
                ledger={
                    s.name: {
                        c.value: n
                        for c, n in ledger.service_breakdown(s.spec.device, s.name).items()
                    }
                    for s in self.manager.world.services.values()
                    if s.holds_memory
                },
                true=dev0.per_service(),
                foreign=dev0.foreign_total,
                idle_resident=idle,
                used=dev0.used,
            )
        )
        nxt = t + self.sim_cfg.sample_period_s
        if nxt <= self.duration:
            self.heap.at(nxt, lambda: self._sample(nxt))

    def _replay_timeline(self) -> None:
        """The device timeline (``simulation.timeline``): the memory other programs used,
        as a baseline process, and the compute they took, set at each recorded time."""
        path = self.sim_cfg.timeline
        if path is None:
            return
        for row in read_timeline(self.scenario.resolve(path)):
            if row.device not in self.devices or row.t_s >= self.duration:
                continue
            key = f"recorded-{row.device}"
            self.timeline_keys.add(key)
            self.call_at(row.t_s, self._timeline_setter(row, key))

    def _timeline_setter(self, row: TimelineRow, key: str) -> Callable[[], None]:
        def setter() -> None:
            self.devices[row.device].set_foreign(key, max(0, row.other_bytes))
            if row.baseline_bytes is not None:
                self.recorded_baseline[row.device] = row.baseline_bytes
            if row.foreign_compute is not None:
                shares = self.foreign_compute[row.device]
                shares[key] = row.foreign_compute
                self.compute[row.device].set_foreign_share(sum(shares.values()), self.clock.now())
                self._reschedule(row.device)

        return setter

    def _foreign_setter(
        self, device: str, key: str, f: ForeignConfig, *, running: bool
    ) -> Callable[[], None]:
        """A foreign program starting (``running``) or ending: its memory, then its
        compute share."""

        def setter() -> None:
            nbytes = int(f.bytes) if running else 0
            self.devices[device].set_foreign(key, nbytes, free_only=f.allocates == "free-only")
            shares = self.foreign_compute[device]
            if running and f.compute_share > 0:
                shares[key] = f.compute_share
            else:
                shares.pop(key, None)
            self.compute[device].set_foreign_share(sum(shares.values()), self.clock.now())
            self._reschedule(device)

        return setter

    # ---- executing actions -------------------------------------------------------------
    def _execute(self, actions: list[Action], now: float) -> None:
        for a in actions:
            if self.record_decisions:
                self.decisions.append(Decision(now, a).as_dict())
            match a:
                case Dispatch():
                    self._dispatch(a, now)
                case Load():
                    self._load(a, now)
                case Unload():
                    self._unload(a, now)
                case Resize():
                    self._resize(a, now)
                case Preempt():
                    self._preempt(a, now)
                case Pause():
                    self._pause(a, now)
                case Resume():
                    self._resume(a, now)
                case Rebatch():
                    self.batch_fraction[a.service] = a.fraction
                case Reject():
                    self._end(a.request_id, "rejected", a.reason.value, now)
                case Fail():
                    self._stop_job(a.request_id, now)
                    self.paused_jobs.pop(a.request_id, None)
                    self._end(a.request_id, "failed", a.reason.value, now)
                case Enqueue():
                    pass

    def _file(self, service: str) -> str:
        """The model file a service loads: replicas of one service share it (and so
        its pages in the host cache)."""
        return self.services[service].addressed_as

    def _device_of(self, service: str) -> str:
        return self.services[service].device

    def _dispatch(self, a: Dispatch, now: float) -> None:
        req = self.requests[a.request_id]
        req.attempt = a.attempt
        req.replica = a.service
        if req.first_dispatch_at is None:
            req.first_dispatch_at = now
        req.started_at = now
        dev_name = self._device_of(a.service)
        phys = self.devices[dev_name]
        if not self.alive[a.service] or a.service not in phys.services:
            # the runtime is gone; the Manager fails the request when it hears of the crash
            req.oom = req.oom or a.service in self.oom_crashed
            return
        d = req.demand
        fraction = self.batch_fraction.get(a.service, 1.0)
        est_active = req.est_active
        if fraction < 1.0:
            profile = self.services[a.service].profile
            est_active = estimate_request(profile, scaled_demand(d, fraction)).active_bytes
        req.true_active = max(0, round(est_active * req.truth))
        if not phys.start_request(a.service, req.rid, req.true_active):
            req.oom = True
            self._oom(dev_name, a.service, "request", req.true_active, now, req.rid)
            return
        perf = self.perf[a.service]
        work, prefill = solo_work(
            is_llm=self.is_llm(a.service),
            base_s=perf.base_s,
            per_unit_s=perf.per_unit_s,
            prefill_tps=perf.prefill_tps,
            tbt_s=perf.tbt_s,
            units=d.units,
            prompt_tokens=d.prompt_tokens,
            output_tokens=d.output_tokens,
        )
        work, prefill = self.sim_cfg.degrade_cost.stretch(
            self.services[a.service].variant,
            is_llm=self.is_llm(a.service),
            work=work,
            prefill=prefill,
        )
        work, prefill = self.sim_cfg.shrink_cost.stretch(
            fraction, is_llm=self.is_llm(a.service), work=work, prefill=prefill, base_s=perf.base_s
        )
        job = Job(
            rid=req.rid,
            service=a.service,
            share=perf.share,
            work=work,
            prefill=prefill,
            started_at=now,
            weight=perf.weight,
        )
        self._run_job(dev_name, job, now)

    # ---- executors: one request at a time per executor (``executor``) ---------------------
    def _run_job(self, dev_name: str, job: Job, now: float) -> None:
        """Start ``job`` on the device, or queue it behind the request its service's
        executor runs (a model's one thread in accelmux's inference worker)."""
        key = self.perf[job.service].executor
        if key:
            slot = (dev_name, key)
            if self.executing.get(slot) is not None:
                self.executor_queue.setdefault(slot, []).append(job)
                return
            self.executing[slot] = job.rid
        self.compute[dev_name].add(job, now)
        self._reschedule(dev_name)

    def _job_left(self, dev_name: str, service: str, rid: str, now: float) -> None:
        """``rid`` no longer runs (done, stopped, paused): its executor takes the next."""
        key = self.perf[service].executor
        slot = (dev_name, key or "")
        if not key or self.executing.get(slot) != rid:
            return
        self.executing[slot] = None
        queue = self.executor_queue.get(slot)
        if queue:
            self._run_job(dev_name, queue.pop(0), now)

    def _unqueue(self, dev_name: str, service: str, rid: str) -> Job | None:
        """Take a job that waits for its executor out of the queue."""
        key = self.perf[service].executor
        queue = self.executor_queue.get((dev_name, key or "")) or []
        for i, job in enumerate(queue):
            if job.rid == rid:
                return queue.pop(i)
        return None

    def _reschedule(self, dev_name: str) -> None:
        comp = self.compute[dev_name]
        if self._scheduled_version.get(dev_name) == comp.version:
            return
        self._scheduled_version[dev_name] = comp.version
        t = comp.next_completion()
        if t is None:
            return
        version = comp.version
        self.heap.at(max(t, self.clock.now()), lambda: self._complete(dev_name, version))

    def _complete(self, dev_name: str, version: int) -> None:
        comp = self.compute[dev_name]
        if comp.version != version:
            return
        now = self.clock.now()
        jobs = comp.finished(now)
        phys = self.devices[dev_name]
        for job in jobs:
            loaded = self.load_jobs.pop(job.rid, None)
            if loaded is not None:  # a load that computes (``load_share``) is done
                loaded()
                continue
            req = self.requests[job.rid]
            phys.end_request(job.service, job.rid)
            self._job_left(dev_name, job.service, job.rid, now)
            req.first_token_at = job.first_token_at
            req.finished_at = now
            req.outcome = "ok"
            self._handle(
                RequestFinished(
                    request_id=req.rid,
                    attempt=req.attempt,
                    ok=True,
                    peak_bytes=req.true_active + req.est_kv,
                )
            )
            if req.source is not None:
                req.source.outcome(self, req.rid, req.tag, True, now)
        self._reschedule(dev_name)

    def _stop_job(self, rid: str, now: float) -> None:
        req = self.requests.get(rid)
        if req is None:
            return
        if not req.replica:
            return  # never dispatched: no job runs
        dev_name = self._device_of(req.replica)
        if self.compute[dev_name].remove(rid, now) is not None:
            self.devices[dev_name].end_request(req.replica, rid)
            self._job_left(dev_name, req.replica, rid, now)
            self._reschedule(dev_name)
        elif self._unqueue(dev_name, req.replica, rid) is not None:
            self.devices[dev_name].end_request(req.replica, rid)

    def _end(self, rid: str, outcome: str, reason: str, now: float) -> None:
        req = self.requests[rid]
        if req.outcome is not None:
            return
        req.outcome = outcome
        req.reason = reason
        req.finished_at = now
        if req.source is not None:
            req.source.outcome(self, rid, req.tag, False, now)

    def _preempt(self, a: Preempt, now: float) -> None:
        self.requests[a.request_id].preemptions += 1
        self._stop_job(a.request_id, now)

    def _pause(self, a: Pause, now: float) -> None:
        rid = a.request_id
        req = self.requests[rid]
        dev_name = self._device_of(a.service)
        self.pause_gen[rid] = self.pause_gen.get(rid, 0) + 1
        self.parked[rid] = a.park
        # Every simulated pause takes at once (a request that cannot pause is never asked):
        # the acknowledgement comes at the same virtual time.
        ack = PauseFinished(request_id=rid, attempt=a.attempt)
        self.heap.at(now, lambda: self._handle(ack))
        job = self.compute[dev_name].remove(rid, now)
        if job is not None:
            self._job_left(dev_name, a.service, rid, now)
        else:
            job = self._unqueue(dev_name, a.service, rid)
        if job is None:
            return  # not running (a resume under way is made stale; its job stays paused)
        req.pauses += 1
        self.devices[dev_name].end_request(a.service, rid)
        self.paused_jobs[rid] = job
        self._reschedule(dev_name)

    def _resume(self, a: Resume, now: float) -> None:
        rid = a.request_id
        req = self.requests[rid]
        if rid not in self.paused_jobs:
            return
        dev_name = self._device_of(a.service)
        gen = self.pause_gen.get(rid, 0)
        delay = self.sim_cfg.switch_s
        if self.parked.get(rid):
            delay += req.est_kv / self.host_bandwidth[dev_name]

        def go() -> None:
            if self.pause_gen.get(rid, 0) != gen or req.outcome is not None:
                return
            phys = self.devices[dev_name]
            if not self.alive[a.service] or a.service not in phys.services:
                return  # the runtime is gone: the Manager fails the request on the crash
            t = self.clock.now()
            job = self.paused_jobs.pop(rid, None)
            if job is None:
                return
            if not phys.start_request(a.service, rid, req.true_active):
                req.oom = True
                self._oom(dev_name, a.service, "request", req.true_active, t)
                return
            self._run_job(dev_name, job, t)

        self.heap.at(now + delay, go)

    def _load(self, a: Load, now: float) -> None:
        self.oom_crashed.discard(a.service)
        self.generation[a.service] += 1
        gen = self.generation[a.service]
        dev_name = self._device_of(a.service)
        weights, runtime = self.true_resident[a.service]
        perf = self.perf[a.service]
        caching = perf.caching_allocator
        key = (dev_name, self.services[a.service].weights_key)
        holder = self.weights_copy.get(key) if key[1] else None
        shared = holder is not None and holder != a.service
        if shared:
            weights = 0  # the copy another service loaded: one worker hosts both
        if not self.devices[dev_name].load(a.service, weights + runtime, a.kv_pool_bytes, caching):
            self.ooms.append(
                OomEvent(
                    time=now,
                    device=dev_name,
                    service=a.service,
                    what="load",
                    asked=weights + runtime + a.kv_pool_bytes,
                    used=self.devices[dev_name].used,
                    capacity=self.devices[dev_name].capacity,
                    unseen_foreign=self.devices[dev_name].unseen_foreign,
                )
            )
            event = LoadFailed(
                service=a.service,
                error="out of memory while loading",
                out_of_memory=True,
                asked_bytes=weights + runtime + a.kv_pool_bytes,
                device_used_bytes=self.devices[dev_name].used,
            )
            self.heap.at(now, lambda: self._handle(event))
            return
        if key[1] and not shared:
            self.weights_copy[key] = a.service
        init_s = self.services[a.service].init_s
        warm_init_s = perf.warm_init_s
        if shared:
            took = perf.shared_load_s or 0.0
        elif self.host_cache.holds(self._file(a.service)):
            held = self._file(a.service) in self.host_cache.held
            if held and a.from_tier is Tier.SLEEPING:
                init_s = warm_init_s or 0.0
            elif held and a.from_tier is Tier.PARKED and warm_init_s is not None:
                init_s = warm_init_s
            took = weights / self.host_bandwidth[dev_name] + init_s
        elif perf.load_s is not None:
            took = perf.load_s
        else:
            took = weights / self.bandwidth[dev_name] + init_s
        self.host_cache.release(self._file(a.service))

        def finished() -> None:
            self.loading_job.pop(a.service, None)
            if self.generation[a.service] != gen:
                return
            self.host_cache.read(self._file(a.service), weights)
            self.alive[a.service] = True
            if shared:  # the worker measured nothing new: the copy was counted already
                self._handle(LoadFinished(service=a.service))
                return
            self._handle(
                LoadFinished(service=a.service, weights_bytes=weights, runtime_bytes=runtime)
            )

        if perf.load_share is None or took <= 0:
            self.heap.at(now + took, finished)
            return
        # The load computes on the device (reading and setting up the model): it takes
        # its share there and is slowed by what runs beside it, as a request is.
        rid = f"load:{a.service}:{gen}"
        self.load_jobs[rid] = finished
        self.loading_job[a.service] = rid
        job = Job(
            rid=rid,
            service=a.service,
            share=perf.load_share,
            work=took,
            prefill=0.0,
            started_at=now,
        )
        self.compute[dev_name].add(job, now)
        self._reschedule(dev_name)

    def _stop_load(self, service: str, now: float) -> None:
        """A load that computes, stopped (an unload or a crash came first)."""
        rid = self.loading_job.pop(service, None)
        if rid is None:
            return
        self.load_jobs.pop(rid, None)
        dev_name = self._device_of(service)
        if self.compute[dev_name].remove(rid, now) is not None:
            self._reschedule(dev_name)

    def _unload(self, a: Unload, now: float) -> None:
        weights = self.true_resident[a.service][0]
        if a.tier is Tier.COLD:
            self.host_cache.release(self._file(a.service))
        else:
            self.host_cache.hold(self._file(a.service), weights)
        dev_name = self._device_of(a.service)
        if not self.alive[a.service] and a.service not in self.devices[dev_name].services:
            return  # not loaded: only its host copy is dropped
        self.generation[a.service] += 1
        gen = self.generation[a.service]
        self.alive[a.service] = False
        dev_name = self._device_of(a.service)
        self._stop_load(a.service, now)

        def finished() -> None:
            if self.generation[a.service] != gen:
                return
            self._free_memory(dev_name, a.service)
            self._handle(Unloaded(service=a.service))

        self.heap.at(now + self.sim_cfg.unload_s, finished)

    def _resize(self, a: Resize, now: float) -> None:
        dev_name = self._device_of(a.service)
        phys = self.devices[dev_name]
        grows = a.kv_pool_bytes > phys.kv_pool(a.service)
        if grows and not phys.resize(a.service, a.kv_pool_bytes):
            self._oom(dev_name, a.service, "resize", a.kv_pool_bytes, now)
            return
        gen = self.generation[a.service]

        def finished() -> None:
            if self.generation[a.service] != gen:
                return  # unloaded or crashed meanwhile: nothing to answer
            if not grows:
                phys.resize(a.service, a.kv_pool_bytes)
            self._handle(ResizeFinished(service=a.service, kv_pool_bytes=a.kv_pool_bytes))

        self.heap.at(now + self.sim_cfg.resize_s, finished)

    def _free_memory(self, dev_name: str, service: str) -> None:
        """Free what ``service`` holds; a shared copy of weights it carries stays loaded
        for a service that still uses it (which carries it from then on)."""
        phys = self.devices[dev_name]
        key = (dev_name, self.services[service].weights_key)
        if key[1] and self.weights_copy.get(key) == service:
            heirs = [
                s for s in phys.services if s != service and self.services[s].weights_key == key[1]
            ]
            if heirs:
                phys.hand_over(service, heirs[0], self.true_resident[service][0])
                self.weights_copy[key] = heirs[0]
            else:
                del self.weights_copy[key]
        phys.free(service)

    def _oom(
        self, dev_name: str, service: str, what: str, asked: int, now: float, rid: str = ""
    ) -> None:
        """An allocation crossed the capacity: the service's runtime dies (``rid``: the
        request whose allocation it was, if one)."""
        phys = self.devices[dev_name]
        used = phys.used
        self.ooms.append(
            OomEvent(
                time=now,
                device=dev_name,
                service=service,
                what=what,
                asked=asked,
                used=phys.used,
                capacity=phys.capacity,
                unseen_foreign=phys.unseen_foreign,
            )
        )
        comp = self.compute[dev_name]
        for job in [j for j in comp.jobs.values() if j.service == service]:
            comp.remove(job.rid, now)
            self.requests[job.rid].oom = True
            self._job_left(dev_name, service, job.rid, now)
        for queue in self.executor_queue.values():
            for job in [j for j in queue if j.service == service]:
                queue.remove(job)
                self.requests[job.rid].oom = True
        self._reschedule(dev_name)
        self._stop_load(service, now)
        self._free_memory(dev_name, service)
        self.alive[service] = False
        self.oom_crashed.add(service)
        self.generation[service] += 1
        event = BackendCrashed(
            service=service,
            error=f"out of memory ({what})",
            out_of_memory=True,
            request_id=rid or None,
            asked_bytes=asked,
            device_used_bytes=used,
        )
        self.heap.at(now, lambda: self._handle(event))
