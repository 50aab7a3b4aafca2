"""The Runtime: one Manager, its driver, and the parts that serve it, each in its module.

* :mod:`.request_runner`: a request's path (admit, wait, run, account) and its ticket;
* :mod:`.executor`: the Manager's actions carried out against the backends;
* :mod:`.decisions`: the event stream, the ledger of each delayed or refused request,
  and the report of a broken invariant;
* :mod:`.sampler`: the memory samples the Manager reconciles with;
* :mod:`.status`: ``/admin/status``;
* :mod:`.devices`: device detection and each device's sampler.

The Runtime builds them around one Manager (not strict: a broken invariant is logged,
never raised into the request handler that submitted the event), starts and stops them
together, and is what the gateway, the jobs, the cameras and the tests hold.

Its ``backends`` are keyed by the Manager's service names: a service that may run on
several devices has one backend per replica (``chat@gpu0``, ``chat@gpu1``,
:mod:`accelmux.core.placement`). Clients address the service (``chat``):
:meth:`Runtime.service_state`, :meth:`Runtime.backend_of` and :meth:`Runtime.replicas`
resolve that name, and a request's attempt calls the backend of the replica its
Dispatch names (``backends[dispatch.service]``), which the Manager chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

from accelmux import __version__
from accelmux.backends.base import Backend, BackendRequest, BackendResponse, can_pause
from accelmux.backends.factory import build_backends
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.specs import to_manager_spec, with_capabilities
from accelmux.core.actions import Dispatch
from accelmux.core.events import AdminCommand, Demand, Event, ShutdownRequested
from accelmux.core.manager import Manager
from accelmux.core.placement import first_up
from accelmux.core.specs import PolicyKnobs, ServiceSpec
from accelmux.core.types import Reason
from accelmux.core.world import ServiceState
from accelmux.errors import BackendCrashedError, BackendError
from accelmux.monitors.base import DeviceSample, DeviceSampler
from accelmux.runtime.activity import ServiceActivity
from accelmux.runtime.bus import DecisionBus
from accelmux.runtime.call import Call, Sink, relay_stream, rerun_guard
from accelmux.runtime.clock import Clock, LoopClock, seconds_of_day_now
from accelmux.runtime.decisions import DecisionRecorder
from accelmux.runtime.devices import build_samplers, detect_devices
from accelmux.runtime.driver import Driver, soon_on_loop
from accelmux.runtime.executor import ActionExecutor
from accelmux.runtime.explain import why_full
from accelmux.runtime.explain_live import ProcessCpu, enrich
from accelmux.runtime.live_latency import LiveLatency
from accelmux.runtime.live_slo import LiveSlo, Objective
from accelmux.runtime.metrics import Metrics
from accelmux.runtime.policy_choice import daemon_policy
from accelmux.runtime.request_runner import Attempt, RequestRunner
from accelmux.runtime.requests import Refused, Ticket
from accelmux.runtime.sampler import SamplerLoop
from accelmux.runtime.status import build_status
from accelmux.sim.baselines import is_baseline

log = logging.getLogger("accelmux.runtime")
#: The watchdog holds its ping when the sampler ends no round for this many intervals,
#: and at least this many seconds (a slow NVML answer is not a hang).
SAMPLER_STALL_ROUNDS = 10
SAMPLER_STALL_MIN_S = 20.0
T = TypeVar("T")
#: Builds the backend of each of the Manager's services (replicas included), by name.
BackendMaker = Callable[[Sequence[ServiceSpec]], dict[str, Backend]]


class Runtime:
    def __init__(
        self,
        cfg: AccelmuxConfig,
        *,
        make_backends: BackendMaker | None = None,
        clock: Clock | None = None,
        clock_origin_s_of_day: float | None = None,
        sample: bool = True,
        data_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.data_dir = data_dir or Path(cfg.server.data_dir)
        capacities, budgets = detect_devices(cfg)
        origin = seconds_of_day_now() if clock_origin_s_of_day is None else clock_origin_s_of_day
        spec = to_manager_spec(
            cfg,
            capacities=capacities,
            budgets=budgets,
            clock_origin_s_of_day=origin,
            host_budget=psutil.virtual_memory().total // 4,
        )
        if make_backends is None:
            backends = build_backends(
                cfg,
                self.data_dir,
                spec.services,
                capacities={d.name: d.capacity_bytes for d in spec.devices},
            )
        else:
            backends = make_backends(spec.services)
        #: The backend of each of the Manager's services (each replica's own).
        self.backends = backends
        # The Manager trusts only what each backend declares it can do.
        spec = with_capabilities(spec, {n: b.capabilities for n, b in backends.items()})
        self.manager = Manager(spec, daemon_policy(cfg.policy), strict=False)
        self.clock: Clock = clock or LoopClock()
        self.bus = DecisionBus()
        self.models: dict[str, str] = {}
        for name, svc in cfg.services.items():
            self.models[svc.model or name] = name
            for alias in svc.aliases:
                self.models[alias] = name
        self.activity = {
            name: ServiceActivity(started_at=time.monotonic())
            for name in self.manager.view.services
        }
        #: TTFT, TBT and context in use per service, measured by the gateway
        self.live = LiveLatency()
        #: each service's objectives, judged per request (attainment per service, class)
        self.slo = LiveSlo(
            {
                name: Objective(svc.slo.latency_s, svc.slo.ttft_s, svc.slo.tbt_s, svc.kind.is_llm)
                for name, svc in cfg.services.items()
            },
            {name: svc.service_class for name, svc in cfg.services.items()},
        )
        self.metrics = Metrics(self.status)
        self.request_runner = RequestRunner(self.submit, closed=lambda: self.driver.closed)
        self.executor = ActionExecutor(
            cfg,
            backends,
            services=self.manager.spec.services,
            submit=self.submit,
            deliver=self.request_runner.deliver,
            metrics=self.metrics,
            activity=self.activity,
        )
        self.decisions = DecisionRecorder(self.manager, self.bus, self.request_runner.demands.get)
        self.driver = Driver(
            self.manager,
            self.clock,
            self.executor.execute,
            self.decisions.observe,
            self.decisions.invariant_broken,
            later=soon_on_loop,  # the request history, recorded off the request's path
        )
        self.sampling = SamplerLoop(
            self.manager.spec,
            backends,
            build_samplers(self.manager, cfg) if sample else {},
            self.submit,
        )
        self.started_at = time.time()
        self.sampler_started_at = time.monotonic()
        self._sampler_task: asyncio.Task[None] | None = None
        self._cpu: ProcessCpu | None = None  # CPU time of our processes, for explain

    # ---- what the parts keep, under the names the gateway and the tests use -----------
    @property
    def tickets(self) -> dict[str, Ticket]:
        return self.request_runner.tickets

    @property
    def stopping(self) -> bool:
        return self.request_runner.stopping

    @property
    def last_errors(self) -> dict[str, str]:
        """The last load failure, refused resize or crash of each service."""
        return self.executor.last_errors

    @property
    def samplers(self) -> dict[str, DeviceSampler]:
        return self.sampling.samplers

    @samplers.setter
    def samplers(self, samplers: dict[str, DeviceSampler]) -> None:
        """Measure with other samplers (a test's scripted one)."""
        self.sampling.samplers = samplers

    @property
    def last_samples(self) -> dict[str, tuple[float, DeviceSample]]:
        return self.sampling.last_samples

    @property
    def decision_ledgers(self) -> dict[str, dict[str, Any]]:
        return self.decisions.ledgers

    # ---- the names clients use ---------------------------------------------------------
    @property
    def knobs(self) -> PolicyKnobs:
        """The policy's knobs the Manager runs with."""
        return self.manager.spec.knobs

    def time_of_day(self) -> float:
        """Seconds since the Manager's midnight (maintenance windows)."""
        return self.manager.view.time_of_day()

    def spare_for(self, spec: ServiceSpec) -> bool:
        """Whether ``spec``'s device has spare memory (``policy.spare_fraction`` of its
        budget free) and no request of a class above ``spec``'s waits there."""
        view = self.manager.view
        dev = spec.device
        spare = view.knobs.spare_fraction * view.devices[dev].usable_bytes
        if view.ledger.available(dev) < spare:
            return False
        return not any(
            req.cls < spec.cls
            for req in view.waiting.values()
            if view.services[req.service].spec.device == dev
        )

    def replicas(self, name: str) -> tuple[ServiceState, ...]:
        """The Manager's services behind a service name clients use: the service itself,
        or each replica of a service that runs on several devices; () when unknown."""
        world = self.manager.view
        state = world.services.get(name)
        return (state,) if state is not None else world.groups.get(name, ())

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a service (or one replica of one)."""
        return bool(self.replicas(name))

    def service_state(self, name: str) -> ServiceState:
        """The state of service ``name``; for a service with replicas, the replica that
        is up, else the first (what to describe before a request is dispatched). Raises
        KeyError for an unknown name."""
        replicas = self.replicas(name)
        if not replicas:
            raise KeyError(name)
        return first_up(replicas)

    def last_error(self, name: str) -> str | None:
        """The last load failure, refused resize or crash of service ``name`` (the first
        replica's that has one, for a service with replicas)."""
        errors = (self.last_errors.get(r.name) for r in self.replicas(name))
        return next((e for e in errors if e), None)

    def can_pause(self, name: str, request: BackendRequest) -> bool:
        """Whether ``request`` for service ``name`` may be paused between tokens: its
        backend says so (every replica's, for a service with replicas)."""
        replicas = self.replicas(name)
        return bool(replicas) and all(
            can_pause(self.backends[r.name], request) for r in replicas if r.name in self.backends
        )

    def backend_of(self, name: str) -> Backend:
        """The backend of :meth:`service_state` (for describing, never for a request:
        an attempt calls the backend of the replica it was dispatched to)."""
        return self.backends[self.service_state(name).name]

    # ---- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for name, backend in self.backends.items():
            backend.set_crash_callback(self.executor.crash_callback(loop, name))
        self.driver.start()
        if self.sampling.samplers:
            interval = self.cfg.server.sample_interval_s
            self.sampler_started_at = time.monotonic()
            self._sampler_task = asyncio.create_task(self.sampling.run(interval))

    async def shutdown(self) -> None:
        """Stop admitting, let in-flight work drain (``server.drain_s``), fail the rest
        with a clear error, then stop every backend (child processes included)."""
        runner = self.request_runner
        if runner.stopping:
            return
        runner.stopping = True
        self.driver.submit(ShutdownRequested())
        deadline = time.monotonic() + self.cfg.server.drain_s
        while runner.running() and time.monotonic() < deadline:
            runner.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runner.idle.wait(), max(0.0, deadline - time.monotonic()))
        runner.fail_all("accelmux stopped before the request finished")
        await asyncio.sleep(0)
        if self._sampler_task is not None:
            self._sampler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler_task
        await self.executor.cancel_all()
        self.driver.close()
        for name, backend in self.backends.items():
            try:
                await backend.unload()
                await backend.close()
            except Exception as exc:  # keep stopping the others
                log.warning("stopping backend %s failed: %s", name, exc)
        self.sampling.close()
        self.bus.close()

    # ---- requests and events -----------------------------------------------------------
    def new_request_id(self) -> str:
        return self.request_runner.new_request_id()

    async def run_request(
        self,
        service: str,
        demand: Demand,
        attempt: Attempt[T],
        *,
        request_id: str | None = None,
        on_dispatch: Callable[[Ticket], None] | None = None,
        keep_alive_s: float | None = None,
        pausable: bool = False,
    ) -> T:
        """Admit, wait, run and account one request (:meth:`RequestRunner.run`); raises
        :class:`~accelmux.runtime.requests.Refused` when the Manager rejected or failed it,
        BackendError when its backend failed."""
        with self.slo.track(service) as judge:  # its objectives, judged as it ends
            try:
                result = await self.request_runner.run(
                    service,
                    demand,
                    attempt,
                    request_id=request_id,
                    on_dispatch=on_dispatch,
                    keep_alive_s=keep_alive_s,
                    pausable=pausable,
                )
            except (Refused, BackendError):
                judge(False)
                raise
            status = getattr(result, "status", 200)
            if not isinstance(status, int) or not 400 <= status < 500:  # 4xx: the client's
                judge(not isinstance(status, int) or status < 400)
            return result

    async def load(self, service: str, *, keep_alive_s: float | None = None) -> None:
        """Bring ``service`` up through the Manager with nothing to run (Ollama's empty
        request, Wyoming's warm-up); raises Refused as :meth:`call` does."""

        async def nothing(d: Dispatch) -> tuple[None, None]:
            return None, None  # nothing ran: no peak to calibrate with

        await self.run_request(service, Demand(), nothing, keep_alive_s=keep_alive_s)

    async def call(
        self,
        service: str,
        demand: Demand,
        call: Call,
        *,
        request_id: str | None = None,
        sink: Sink | None = None,
        label: str | None = None,
        keep_alive_s: float | None = None,
        pausable: bool = False,
    ) -> BackendResponse:
        """Call ``service`` through the Manager: admit ``demand``, send ``call`` to the
        backend of the replica it dispatches to with the lease it grants, relay a streamed
        answer into ``sink``, release what the answer holds, report its peak (it
        calibrates the service), and count the queue wait and the latency (labelled
        ``label``, default the call's endpoint).

        Raises :class:`~accelmux.runtime.requests.Refused` when the Manager refused or
        cut the request off (the one refusal every caller maps), BackendError when its
        backend failed. A request preempted after part of a streamed answer went out is
        not run again (BackendError)."""
        rid = request_id or self.new_request_id()
        metrics = self.metrics
        arrived = self.live.clock()

        def on_dispatch(ticket: Ticket) -> None:
            metrics.queue_wait.labels(service).observe(time.monotonic() - ticket.arrived)

        async def attempt(d: Dispatch) -> tuple[BackendResponse, int | None]:
            rerun_guard(sink)
            ran_from = time.perf_counter()
            answer = await self.backends[d.service].handle(call.dispatched(rid, d))
            if answer.stream is None:
                answer.run_s = time.perf_counter() - ran_from
                if call.kind.is_llm and answer.status < 400:
                    self.live.usage_json(service, answer.body, rid)
            elif sink is not None:
                await relay_stream(answer, sink, self.live, service, arrived, rid)
            return answer, answer.peak_bytes

        started = time.perf_counter()
        outcome = "ok"
        try:
            return await self.run_request(
                service,
                demand,
                attempt,
                request_id=rid,
                on_dispatch=on_dispatch,
                keep_alive_s=keep_alive_s,
                pausable=pausable,
            )
        except Refused as exc:
            outcome = exc.reason.value
            raise
        except BackendError as exc:
            crashed = isinstance(exc, BackendCrashedError)
            outcome = Reason.BACKEND_CRASHED.value if crashed else "backend_error"
            raise
        finally:
            metrics.latency.labels(service, label or call.endpoint, outcome).observe(
                time.perf_counter() - started
            )

    def submit(self, event: Event) -> None:
        self.driver.submit(event)

    def admin(self, service: str, op: str) -> None:
        self.driver.submit(AdminCommand(service=service, op=op))

    async def sample_once(self) -> None:
        await self.sampling.sample_once()

    # ---- reading -------------------------------------------------------------------------
    def health_problem(self) -> str | None:
        """Why the daemon should be restarted, or None: the memory sampler has not ended
        a round (measured or failed) for :data:`SAMPLER_STALL_ROUNDS` intervals (a
        monitor hangs: the ledger no longer sees memory). The watchdog asks this."""
        if self._sampler_task is None or self.stopping:
            return None
        interval = self.cfg.server.sample_interval_s
        since = self.sampling.last_round_at or self.sampler_started_at
        stalled = time.monotonic() - since
        if stalled > max(SAMPLER_STALL_ROUNDS * interval, SAMPLER_STALL_MIN_S):
            return f"the memory sampler has not finished a round for {stalled:.0f} s"
        return None

    def status(self) -> dict[str, Any]:
        return build_status(
            self.manager,
            backends=self.backends,
            sampling=self.sampling,
            last_errors=self.last_errors,
            activity=self.activity,
            live=self.live,
            slo=self.slo,
            server={
                "version": __version__,
                "config": self.config_status(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
                "policy": self.manager.policy.name,
                "baseline": is_baseline(self.cfg.policy.name),
                "uptime_s": round(time.time() - self.started_at, 3),
                "stopping": self.stopping,
                "open_requests": len(self.tickets),
                "sample_interval_s": self.cfg.server.sample_interval_s,
            },
        )

    def config_status(self) -> dict[str, Any]:
        """The config the daemon runs: its file (or ``default stack``), the SHA-256 of
        its text, and the old spellings it used."""
        where, digest = self.cfg.source or (None, None)
        return {"file": where, "sha256": digest, "deprecations": list(self.cfg.deprecations)}

    def explain(self, request_id: str) -> list[str] | None:
        return self.manager.explain(request_id)

    def decision_ledger(self, request_id: str) -> dict[str, Any] | None:
        """The ledger when ``request_id`` was last delayed or refused (None: never was)."""
        return self.decisions.ledgers.get(request_id)

    def why_full(self) -> dict[str, Any]:
        """``/admin/explain``: the ledger's picture, every category adding up to each
        device's capacity, with what the daemon measures (explain_live)."""
        if self._cpu is None:
            self._cpu = ProcessCpu()
        return enrich(
            why_full(self.manager.snapshot().as_dict()),
            kinds={d.name: d.kind for d in self.manager.spec.devices},
            last_samples=self.last_samples,
            backends=self.backends,
            last_unloads=self.decisions.last_unloads,
            batches={
                name: {
                    "fraction": r.fraction,
                    "parallel": r.parallel,
                    "reason": r.reason.value,
                    "detail": r.detail,
                }
                for name, r in self.executor.batches.items()
            },
            cpu=self._cpu,
        )
