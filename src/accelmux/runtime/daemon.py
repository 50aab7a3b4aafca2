"""The Runtime: one Manager, its driver, the backends, the monitors and the tickets.

Executor rules: request actions (Dispatch, Enqueue, Reject, Fail, Preempt) go to the
request's ticket; service actions (Load, Unload, Resize) run as tasks chained per
service, and report back as LoadFinished / LoadFailed / Unloaded events. A backend that
dies while loaded reports BackendCrashed; the Manager fails its in-flight requests and
restarts it with backoff. Every ``sample_interval_s`` the monitors' MemorySampled
events reconcile the ledger with what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from accelmux import __version__
from accelmux.backends.base import Backend
from accelmux.backends.factory import build_backends
from accelmux.config.baselines import build_policy
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.specs import to_manager_spec, with_capabilities
from accelmux.core.actions import (
    Action,
    Dispatch,
    Enqueue,
    Fail,
    Load,
    Preempt,
    Reject,
    Resize,
    Unload,
)
from accelmux.core.events import (
    AdminCommand,
    BackendCrashed,
    Demand,
    Event,
    LoadFailed,
    LoadFinished,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    ResizeFinished,
    ShutdownRequested,
    Unloaded,
)
from accelmux.core.manager import Decision, InvariantBroken, Manager
from accelmux.core.types import Reason
from accelmux.errors import BackendError, BackendTimeoutError, ConfigError, is_out_of_memory
from accelmux.monitors.base import DeviceSample, DeviceSampler, ServiceProcesses
from accelmux.monitors.host import DEFAULT_HOST_BUDGET_FRACTION, HostSampler, host_total
from accelmux.monitors.nvidia import NvidiaSampler, gpu_total
from accelmux.monitors.virtual import VirtualSampler
from accelmux.redact import redact
from accelmux.runtime.activity import ServiceActivity
from accelmux.runtime.bus import DecisionBus
from accelmux.runtime.clock import Clock, LoopClock, seconds_of_day_now
from accelmux.runtime.driver import Driver
from accelmux.runtime.explain import eviction_needed, ledger_picture, why_full
from accelmux.runtime.metrics import Metrics
from accelmux.runtime.requests import Refused, Ticket

log = logging.getLogger("accelmux.runtime")
T = TypeVar("T")
#: Ledger pictures kept for /admin/explain/{id} (oldest dropped first).
DECISION_LEDGERS_KEPT = 1000

#: An attempt returns its result and the measured peak bytes (None: unknown).
Attempt = Callable[[Dispatch], Awaitable[tuple[T, int | None]]]


def detect_devices(cfg: AccelmuxConfig) -> tuple[dict[str, int], dict[str, int]]:
    """Capacities and default budgets of devices the config leaves to detection."""
    capacities: dict[str, int] = {}
    budgets: dict[str, int] = {}
    for name, dev in cfg.devices.items():
        if dev.capacity is not None:
            continue
        if dev.kind == "host":
            total = host_total()
            capacities[name] = total
            if dev.budget is None:
                budgets[name] = int(total * DEFAULT_HOST_BUDGET_FRACTION)
        elif dev.kind == "nvidia":
            total_gpu = gpu_total(dev.index)
            if total_gpu is None:
                raise ConfigError(
                    f"devices.{name}",
                    [
                        f"no NVIDIA GPU {dev.index} found (NVML unavailable) and no capacity "
                        "configured: set devices.{name}.capacity or use a host/virtual device"
                    ],
                )
            capacities[name] = total_gpu
    return capacities, budgets


def build_samplers(manager: Manager, cfg: AccelmuxConfig) -> dict[str, DeviceSampler]:
    out: dict[str, DeviceSampler] = {}
    for spec in manager.spec.devices:
        dev = cfg.devices[spec.name]
        if spec.kind == "host":
            out[spec.name] = HostSampler(
                spec.name, capacity=spec.capacity_bytes, budget=spec.budget_bytes
            )
        elif spec.kind == "nvidia":
            out[spec.name] = NvidiaSampler(
                spec.name, index=dev.index, capacity=spec.capacity_bytes, budget=spec.budget_bytes
            )
        else:
            out[spec.name] = VirtualSampler(
                spec.name, capacity=spec.capacity_bytes, foreign_pid_dir=dev.foreign_pid_dir
            )
    return out


class Runtime:
    def __init__(
        self,
        cfg: AccelmuxConfig,
        *,
        backends: dict[str, Backend] | None = None,
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
            cfg, capacities=capacities, budgets=budgets, clock_origin_s_of_day=origin
        )
        if backends is None:
            backends = build_backends(
                cfg,
                self.data_dir,
                capacities={d.name: d.capacity_bytes for d in spec.devices},
                profiles={s.name: s.profile for s in spec.services},
            )
        self.backends = backends
        # The Manager trusts only what each backend declares it can do.
        spec = with_capabilities(spec, {n: b.capabilities for n, b in backends.items()})
        # Not strict: a broken invariant is logged (with the decision log), never raised
        # into the request handler that submitted the event.
        self.manager = Manager(spec, build_policy(cfg.policy.name, cfg.policy), strict=False)
        self.clock: Clock = clock or LoopClock()
        self.bus = DecisionBus()
        self.driver = Driver(
            self.manager, self.clock, self._execute, self._observe, self._invariant_broken
        )
        self.tickets: dict[str, Ticket] = {}
        self.models: dict[str, str] = {}
        for name, svc in cfg.services.items():
            self.models[svc.model or name] = name
            for alias in svc.aliases:
                self.models[alias] = name
        self.samplers: dict[str, DeviceSampler] = (
            build_samplers(self.manager, cfg) if sample else {}
        )
        self.last_samples: dict[str, tuple[float, DeviceSample]] = {}
        self.metrics = Metrics(self.status)
        self.started_at = time.time()
        self.stopping = False
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}{int(time.time()) & 0xFFFFF:x}"
        self._ops: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sampler_task: asyncio.Task[None] | None = None
        self._load_started: dict[str, float] = {}
        #: The last load failure or crash of each service, shown by /admin/status.
        self.last_errors: dict[str, str] = {}
        self._idle = asyncio.Event()
        self.activity = {
            name: ServiceActivity(started_at=time.monotonic()) for name in cfg.services
        }
        #: The ledger at the moment a request was delayed or refused, by request id.
        self.decision_ledgers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._demands: dict[str, Demand] = {}

    # ---- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for name, backend in self.backends.items():
            backend.set_crash_callback(self._crash_callback(loop, name))
        self.driver.start()
        if self.samplers:
            self._sampler_task = asyncio.create_task(self._sample_loop())

    def _crash_callback(
        self, loop: asyncio.AbstractEventLoop, service: str
    ) -> Callable[[str], None]:
        def report(error: str) -> None:
            shown = redact(error)
            log.warning("backend of %s crashed: %s", service, shown)
            self.last_errors[service] = f"crashed: {shown}"
            event = BackendCrashed(service=service, error=shown)
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                # At once: a request that frees a slot in the meantime must not let the
                # Manager dispatch a queued one to the dead backend.
                self.driver.submit(event)
            else:
                loop.call_soon_threadsafe(self.driver.submit, event)

        return report

    async def shutdown(self) -> None:
        """Stop admitting, let in-flight work drain (``server.drain_s``), fail the rest
        with a clear error, then stop every backend (child processes included)."""
        if self.stopping:
            return
        self.stopping = True
        self.driver.submit(ShutdownRequested())
        deadline = time.monotonic() + self.cfg.server.drain_s
        while self._running() and time.monotonic() < deadline:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - time.monotonic()))
        for ticket in list(self.tickets.values()):
            ticket.deliver(
                Fail(
                    request_id=ticket.request_id,
                    service=ticket.service,
                    reason=Reason.SHUTTING_DOWN,
                    detail="accelmux stopped before the request finished",
                )
            )
        await asyncio.sleep(0)
        if self._sampler_task is not None:
            self._sampler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler_task
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.driver.close()
        for name, backend in self.backends.items():
            try:
                await backend.unload()
                await backend.close()
            except Exception as exc:  # keep stopping the others
                log.warning("stopping backend %s failed: %s", name, exc)
        for sampler in self.samplers.values():
            sampler.close()
        self.bus.close()

    def _running(self) -> bool:
        return any(t.task is not None for t in self.tickets.values())

    # ---- requests ------------------------------------------------------------------
    def new_request_id(self) -> str:
        return f"req-{self._id_prefix}-{next(self._ids)}"

    async def run_request(
        self,
        service: str,
        demand: Demand,
        attempt: Attempt[T],
        *,
        request_id: str | None = None,
        on_dispatch: Callable[[Ticket], None] | None = None,
        keep_alive_s: float | None = None,
    ) -> T:
        """Admit, wait, run and account one request; raises :class:`Refused` when the
        Manager rejected or failed it, BackendError when its backend failed."""
        rid = request_id or self.new_request_id()
        if self.driver.closed:  # stopped: the Manager no longer takes events
            raise Refused(
                Reject(
                    request_id=rid,
                    service=service,
                    reason=Reason.SHUTTING_DOWN,
                    retry_after_s=30.0,
                    detail="accelmux is shutting down",
                )
            )
        ticket = Ticket(rid, service, time.monotonic())
        self.tickets[rid] = ticket
        self._demands[rid] = demand
        try:
            self.driver.submit(
                RequestArrived(
                    request_id=rid, service=service, demand=demand, keep_alive_s=keep_alive_s
                )
            )
            while True:
                action = await ticket.future
                if not isinstance(action, Dispatch):
                    assert isinstance(action, (Reject, Fail))
                    raise Refused(action)
                early = ticket.interrupt
                if early is not None:  # failed or preempted before the attempt started
                    ticket.interrupt = None
                    if isinstance(early, Preempt):
                        continue
                    raise Refused(early)
                ticket.dispatch = action
                if on_dispatch is not None:
                    on_dispatch(ticket)
                # The attempt runs in this task (no extra task per request); a Preempt or
                # Fail cancels this task, and the ticket's interrupt tells the two apart
                # from a client that went away.
                ticket.task = asyncio.current_task()
                try:
                    result, peak = await attempt(action)
                except asyncio.CancelledError:
                    interrupt = ticket.interrupt
                    ticket.task = None
                    if interrupt is None:
                        raise
                    ticket.interrupt = None
                    current = asyncio.current_task()
                    if current is not None and current.uncancel() > 0:
                        raise  # cancelled from outside as well: the client went away
                    if isinstance(interrupt, Preempt):
                        continue
                    raise Refused(interrupt) from None
                except BackendError as exc:
                    ticket.task = None
                    self.driver.submit(
                        RequestFinished(
                            request_id=rid, attempt=action.attempt, ok=False, error=str(exc)
                        )
                    )
                    raise
                except Exception as exc:
                    ticket.task = None
                    if isinstance(exc, ConnectionError):  # the client went away mid-stream
                        self.driver.submit(RequestCancelled(request_id=rid))
                    else:
                        self.driver.submit(
                            RequestFinished(
                                request_id=rid, attempt=action.attempt, ok=False, error=repr(exc)
                            )
                        )
                    raise
                ticket.task = None
                self.driver.submit(
                    RequestFinished(request_id=rid, attempt=action.attempt, peak_bytes=peak)
                )
                return result
        except asyncio.CancelledError:
            self.driver.submit(RequestCancelled(request_id=rid))
            raise
        finally:
            del self.tickets[rid]
            self._demands.pop(rid, None)
            if self.stopping and not self._running():
                self._idle.set()

    def submit(self, event: Event) -> None:
        self.driver.submit(event)

    def admin(self, service: str, op: str) -> None:
        self.driver.submit(AdminCommand(service=service, op=op))

    # ---- executor --------------------------------------------------------------------
    def _observe(self, now: float, action: Action) -> None:
        if self.bus.active:
            self.bus.publish(Decision(now, action).as_dict())
        if isinstance(action, (Reject, Enqueue)):
            self._record_ledger(action)

    def _invariant_broken(self, report: InvariantBroken) -> None:
        """A bug in the policy or the Manager: logged with the decisions that led to it."""
        lines = [json.dumps(d, sort_keys=True) for d in (*report.recent, *report.actions)]
        log.error(
            "invariant broken at t=%.3f: %s; the decision log up to it (%d before the round, "
            "then the round's %d):\n%s",
            report.time,
            report.detail,
            len(report.recent),
            len(report.actions),
            "\n".join(lines),
        )
        if self.bus.active:
            self.bus.publish(report.as_dict())

    def _record_ledger(self, action: Reject | Enqueue) -> None:
        """Keep the ledger as it stands when a request is delayed or refused."""
        snap = self.manager.snapshot().as_dict()
        picture = ledger_picture(snap)
        world = self.manager.world
        svc = world.services.get(action.service)
        demand = self._demands.get(action.request_id)
        record: dict[str, Any] = {
            "decision": type(action).__name__.lower(),
            "reason": action.reason.value,
            "devices": picture,
        }
        if svc is not None and demand is not None:
            estimate = world.estimate(action.service, demand)
            needed = estimate.total
            if not svc.is_up:
                p = svc.spec.profile
                needed += p.weights + p.runtime + p.kv_floor
            record["request_bytes"] = needed
            record["eviction"] = eviction_needed(
                picture[svc.spec.device], needed, exclude=action.service
            )
        self.decision_ledgers[action.request_id] = record
        self.decision_ledgers.move_to_end(action.request_id)
        while len(self.decision_ledgers) > DECISION_LEDGERS_KEPT:
            self.decision_ledgers.popitem(last=False)

    def _execute(self, action: Action) -> None:
        if isinstance(action, (Dispatch, Enqueue, Reject, Fail, Preempt)):
            ticket = self.tickets.get(action.request_id)
            if ticket is not None:
                ticket.deliver(action)
        elif isinstance(action, Load):
            self._service_op(action.service, lambda: self._load(action))
        elif isinstance(action, Unload):
            self._service_op(action.service, lambda: self._unload(action))
        elif isinstance(action, Resize):
            self._service_op(action.service, lambda: self._resize(action))

    def _service_op(self, service: str, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a load/unload/resize after the service's previous one (never two at once)."""
        previous = self._ops.get(service)

        async def chained() -> None:
            if previous is not None and not previous.done():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await previous
            await make()

        task = asyncio.create_task(chained())
        self._ops[service] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, action: Load) -> None:
        backend = self.backends[action.service]
        started = time.monotonic()
        svc_cfg = self.cfg.services.get(action.service)
        limit = svc_cfg.load_timeout_s if svc_cfg is not None else None
        try:
            async with asyncio.timeout(limit):
                report = await backend.load(
                    weights_bytes=action.weights_bytes,
                    runtime_bytes=action.runtime_bytes,
                    kv_pool_bytes=action.kv_pool_bytes,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                exc = BackendTimeoutError(
                    f"{action.service}: load timed out after {limit:g}s (load_timeout_s)"
                )
                with contextlib.suppress(Exception):  # free what the half-done load holds
                    async with asyncio.timeout(30):
                        await backend.unload()
            shown = redact(str(exc))
            log.warning("load of %s failed: %s", action.service, shown)
            self.last_errors[action.service] = f"load failed: {shown}"
            self.metrics.load_seconds.labels(action.service, "failed").observe(
                time.monotonic() - started
            )
            self.driver.submit(
                LoadFailed(service=action.service, error=shown, out_of_memory=is_out_of_memory(exc))
            )
            return
        took = time.monotonic() - started
        self.metrics.load_seconds.labels(action.service, "ok").observe(took)
        self.activity[action.service].loaded(time.monotonic(), took)
        self.driver.submit(
            LoadFinished(
                service=action.service,
                weights_bytes=report.weights_bytes,
                runtime_bytes=report.runtime_bytes,
            )
        )

    async def _unload(self, action: Unload) -> None:
        try:
            await self.backends[action.service].unload()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("unload of %s failed: %s", action.service, exc)
        self.driver.submit(Unloaded(service=action.service))

    async def _resize(self, action: Resize) -> None:
        """Ask the backend; its answer (done or refused) goes back to the Manager, which
        holds the larger of the old and new pools until then."""
        try:
            await self.backends[action.service].resize(action.kv_pool_bytes)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            shown = redact(str(exc))
            log.warning(
                "resize of %s to %d B refused: %s", action.service, action.kv_pool_bytes, shown
            )
            self.last_errors[action.service] = f"resize refused: {shown}"
            self.driver.submit(
                ResizeFinished(
                    service=action.service,
                    kv_pool_bytes=action.kv_pool_bytes,
                    ok=False,
                    error=shown,
                )
            )
            return
        self.driver.submit(
            ResizeFinished(service=action.service, kv_pool_bytes=action.kv_pool_bytes)
        )

    # ---- monitors ------------------------------------------------------------------------
    def _processes(self) -> dict[str, list[ServiceProcesses]]:
        groups: dict[str, list[ServiceProcesses]] = {d: [] for d in self.samplers}
        for svc in self.manager.spec.services:
            backend = self.backends.get(svc.name)
            if backend is None or svc.device not in groups:
                continue
            hosted = getattr(backend, "hosted_bytes", None)  # inference-worker backends
            groups[svc.device].append(
                ServiceProcesses(
                    service=svc.name,
                    pids=backend.pids(),
                    inprocess_bytes=backend.memory_bytes(),
                    hosted_bytes=hosted() if callable(hosted) else None,
                )
            )
        return groups

    def _sample_all(self, groups: dict[str, list[ServiceProcesses]]) -> list[DeviceSample]:
        out = []
        for device, sampler in self.samplers.items():
            try:
                sample = sampler.sample(groups.get(device, []))
            except Exception as exc:  # a monitor must never take the daemon down
                log.warning("sampling %s failed: %s", device, exc)
                continue
            if sample is not None:
                out.append(sample)
        return out

    async def _refresh_backends(self) -> None:
        """Let backends that read their server's own metrics do so (external servers)."""
        calls = []
        for backend in self.backends.values():
            refresh = getattr(backend, "refresh", None)
            if callable(refresh):
                calls.append(refresh())
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.debug("reading a server's metrics failed: %s", outcome)

    async def sample_once(self) -> None:
        await self._refresh_backends()
        samples = await asyncio.to_thread(self._sample_all, self._processes())
        now = time.time()
        for sample in samples:
            self.last_samples[sample.event.device] = (now, sample)
            self.driver.submit(sample.event)

    async def _sample_loop(self) -> None:
        interval = self.cfg.server.sample_interval_s
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("memory sampling failed: %s", exc)
            await asyncio.sleep(interval)

    # ---- reading -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        snap = self.manager.snapshot().as_dict()
        monitors = {}
        for device, (at, sample) in self.last_samples.items():
            monitors[device] = {
                "sampled_at": at,
                "total_bytes": sample.total_bytes,
                "per_service_bytes": dict(sample.event.per_service),
                **sample.details,
            }
        for name, sampler in self.samplers.items():
            error = getattr(sampler, "error", None)
            if error:
                monitors.setdefault(name, {})["error"] = error
        for dev in snap["devices"]:
            dev["measured"] = monitors.get(dev["name"])
        now = time.monotonic()
        for svc in snap["services"]:
            backend = self.backends.get(svc["name"])
            described = backend.describe() if backend is not None else None
            svc["backend"] = described
            svc["last_error"] = self.last_errors.get(svc["name"])
            activity = self.activity[svc["name"]].as_dict(now)
            svc["activity"] = activity
            svc["limit"] = (described or {}).get("limit", {}).get("summary")
            svc["usage"] = service_usage(svc, described or {}, activity)
        snap["server"] = {
            "version": __version__,
            "policy": self.manager.policy.name,
            "uptime_s": round(time.time() - self.started_at, 3),
            "stopping": self.stopping,
            "open_requests": len(self.tickets),
            "sample_interval_s": self.cfg.server.sample_interval_s,
        }
        return snap

    def explain(self, request_id: str) -> list[str] | None:
        return self.manager.explain(request_id)

    def decision_ledger(self, request_id: str) -> dict[str, Any] | None:
        """The ledger when ``request_id`` was last delayed or refused (None: never was)."""
        return self.decision_ledgers.get(request_id)

    def why_full(self) -> dict[str, Any]:
        return why_full(self.manager.snapshot().as_dict())


def service_usage(
    svc: dict[str, Any], described: dict[str, Any], activity: dict[str, Any]
) -> dict[str, Any]:
    """One service's memory and load figures in one place (status page and /metrics).

    KV in use and context in use come from the server itself where it reports them
    (llama-server's ``/slots`` and ``/metrics``, vLLM's ``/metrics``), else from the
    ledger."""
    server = described.get("server") or {}
    measured = described.get("measured") or {}
    kv_pool = int(svc["kv_pool_bytes"])
    kv_in_use = int(svc["kv_in_use_bytes"])
    if "kv_usage_ratio" in server and kv_pool:
        kv_in_use = int(float(server["kv_usage_ratio"]) * kv_pool)
    ledger = svc["ledger"]
    return {
        "weights_bytes": ledger.get("weights", 0),
        "reserved_bytes": ledger.get("reserved", 0),
        "active_bytes": ledger.get("active", 0),
        "kv_in_use_bytes": kv_in_use,
        "kv_pool_bytes": kv_pool,
        "concurrency": svc["concurrency"],
        "inflight": svc["inflight"],
        "context_in_use_tokens": server.get("context_in_use_tokens"),
        "context_per_slot_tokens": server.get("context_per_slot"),
        "batch_size": measured.get("batch_size"),
        "busy_slots_per_decode": server.get("busy_slots_per_decode"),
        "switches_per_hour": activity["switches_per_hour"],
        "cold_start_s": activity["cold_start_s_last"],
    }
