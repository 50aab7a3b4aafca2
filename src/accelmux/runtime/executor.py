"""The action executor: carries out the Manager's actions against the backends.

Request actions (Dispatch, Enqueue, Reject, Fail, Preempt) go to the request's ticket.
Service actions (Load, Unload, Resize) and the Pause and Resume of a running request run
as tasks chained per service (never two at once for one service, so an Unload waits for
the Pause before it) and report back as LoadFinished / LoadFailed, Unloaded,
ResizeFinished, and PauseFinished / PauseRefused events: the Manager keeps a pausing
request's memory (and its service loaded) until the backend confirmed the pause. A
Resume the backend cannot carry out is logged; the request's own stream then ends it
(its RequestFinished). A load still running after the
service's ``load_timeout_s`` is cancelled, unloaded and reported as LoadFailed. A
backend that dies while loaded reports BackendCrashed at once (from any thread), so the
Manager fails its in-flight requests before it dispatches anything else to it.

Actions name the Manager's services, replicas included (``chat@gpu1``): each has its own
backend and its own chain of operations; its config (``load_timeout_s``) is the one of
the service it is a replica of, and load metrics are labelled with that service's name."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from accelmux.backends.base import Backend
from accelmux.config.schema import AccelmuxConfig
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
    Event,
    LoadFailed,
    LoadFinished,
    PauseFinished,
    PauseRefused,
    ResizeFinished,
    Unloaded,
)
from accelmux.core.specs import ServiceSpec
from accelmux.errors import BackendTimeoutError, is_out_of_memory
from accelmux.redact import redact
from accelmux.runtime.activity import ServiceActivity
from accelmux.runtime.metrics import Metrics

log = logging.getLogger("accelmux.runtime")

RequestAction = Dispatch | Enqueue | Reject | Fail | Preempt


class ActionExecutor:
    def __init__(
        self,
        cfg: AccelmuxConfig,
        backends: dict[str, Backend],
        *,
        services: Sequence[ServiceSpec] = (),
        submit: Callable[[Event], None],
        deliver: Callable[[RequestAction], None],
        metrics: Metrics,
        activity: dict[str, ServiceActivity],
    ) -> None:
        self.cfg = cfg
        #: The name clients use for each of the Manager's services (a replica's group;
        #: a service not listed in ``services`` is addressed by its own name).
        self.addressed_as = {s.name: s.addressed_as for s in services}
        self.backends = backends
        self._submit = submit
        self._deliver = deliver
        self._metrics = metrics
        self._activity = activity
        #: The last load failure, refused resize or crash of each service (/admin/status).
        self.last_errors: dict[str, str] = {}
        #: The latest Rebatch of each service that may shrink: the batch it runs with.
        self.batches: dict[str, Rebatch] = {}
        self._ops: dict[str, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def execute(self, action: Action) -> None:
        if isinstance(action, (Dispatch, Enqueue, Reject, Fail, Preempt)):
            self._deliver(action)
        elif isinstance(action, Load):
            self._service_op(action.service, lambda: self._load(action))
        elif isinstance(action, Unload):
            self._service_op(action.service, lambda: self._unload(action))
        elif isinstance(action, Resize):
            self._service_op(action.service, lambda: self._resize(action))
        elif isinstance(action, (Pause, Resume)):
            self._service_op(action.service, lambda: self._pause_or_resume(action))
        elif isinstance(action, Rebatch):
            # what the jobs runner reads to size its next batches (see accelmux.jobs)
            self.batches[action.service] = action

    def crash_callback(
        self, loop: asyncio.AbstractEventLoop, service: str
    ) -> Callable[[str], None]:
        """What a backend calls when it dies (from the event loop or another thread)."""

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
                self._submit(event)
            else:
                loop.call_soon_threadsafe(self._submit, event)

        return report

    async def cancel_all(self) -> None:
        """Cancel the service operations still running (shutdown) and wait for them."""
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

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
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _load(self, action: Load) -> None:
        backend = self.backends[action.service]
        started = time.monotonic()
        group = self.addressed_as.get(action.service, action.service)
        svc_cfg = self.cfg.services.get(group)
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
            self._metrics.load_seconds.labels(group, "failed").observe(time.monotonic() - started)
            self._submit(
                LoadFailed(service=action.service, error=shown, out_of_memory=is_out_of_memory(exc))
            )
            return
        took = time.monotonic() - started
        self._metrics.load_seconds.labels(group, "ok").observe(took)
        self._activity[action.service].loaded(time.monotonic(), took)
        self._submit(
            LoadFinished(
                service=action.service,
                weights_bytes=report.weights_bytes,
                runtime_bytes=report.runtime_bytes,
            )
        )

    async def _unload(self, action: Unload) -> None:
        try:
            await self.backends[action.service].unload(tier=action.tier)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("unload of %s failed: %s", action.service, exc)
        self._submit(Unloaded(service=action.service))

    async def _pause_or_resume(self, action: Pause | Resume) -> None:
        backend = self.backends[action.service]
        try:
            if isinstance(action, Pause):
                await backend.pause(action.request_id, park=action.park)
            else:
                await backend.resume(action.request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            shown = redact(str(exc))
            log.warning(
                "%s of %s (%s) failed: %s",
                type(action).__name__.lower(),
                action.request_id,
                action.service,
                shown,
            )
            self.last_errors[action.service] = f"{type(action).__name__.lower()} failed: {shown}"
            if isinstance(action, Pause):
                self._submit(
                    PauseRefused(request_id=action.request_id, attempt=action.attempt, error=shown)
                )
            return
        if isinstance(action, Pause):
            self._submit(PauseFinished(request_id=action.request_id, attempt=action.attempt))

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
            self._submit(
                ResizeFinished(
                    service=action.service,
                    kv_pool_bytes=action.kv_pool_bytes,
                    ok=False,
                    error=shown,
                )
            )
            return
        self._submit(ResizeFinished(service=action.service, kv_pool_bytes=action.kv_pool_bytes))
