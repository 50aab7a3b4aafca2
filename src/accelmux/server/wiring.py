"""Mount the parts that live beside the gateway: durable batch jobs and the dashboard.

* Jobs (:mod:`accelmux.jobs`): a SQLite store under ``server.data_dir``, served at
  ``/v1/jobs``; its runner sends each batch of inputs through the SAME path as an HTTP
  request (:meth:`Runtime.call`: batch class, maintenance windows, preemption),
  via :func:`submit_embeddings`, and pauses a model's jobs outside its windows.
* Cameras (:mod:`accelmux.cameras`): one analysis loop per camera service (background
  requests through the Manager), events in SQLite under ``server.data_dir``, served at
  ``/v1/cameras``.
* Dashboard (:mod:`accelmux.dashboard`): ``/`` (static page), ``/admin/history``, and
  the plan page's ``POST /admin/plan`` (:mod:`accelmux.server.plan_api`).
* The request history (:mod:`accelmux.history`): a recorder the runtime's driver tells
  every Manager round, writing SQLite files under ``data_dir/history``.

All are optional (``server.jobs``, ``server.dashboard``, ``server.history.enabled``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from accelmux import __version__
from accelmux.cameras import CameraRunner, EventStore
from accelmux.cameras.http import camera_routes
from accelmux.cameras.runner import camera_services
from accelmux.core.events import Demand
from accelmux.core.types import Reason, ServiceKind
from accelmux.dashboard import routes as dashboard_routes
from accelmux.errors import BackendError
from accelmux.gateway.parse import tokens_of
from accelmux.history.cpu import CpuProbe
from accelmux.history.daemon_run import new_run
from accelmux.history.recorder import HistoryRecorder, StreamFigures
from accelmux.history.store import HistoryWriter
from accelmux.jobs import JobInputError, JobInputRetry, JobRunner, JobStore
from accelmux.jobs.http import JobAccess, job_routes
from accelmux.jobs.runner import Ran, RunnerSettings
from accelmux.runtime.call import Call
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused
from accelmux.server.plan_api import plan_routes


def embedding_models(runtime: Runtime) -> list[str]:
    """Model names and aliases of the embeddings services (what a job may target)."""
    return [
        model
        for model, service in runtime.models.items()
        if runtime.service_state(service).spec.kind is ServiceKind.EMBEDDINGS
    ]


def window_open(runtime: Runtime, model: str) -> bool:
    """Whether a model's jobs may start batches now: inside one of its maintenance windows,
    or outside them while its device (one of them, for a service with replicas) has spare
    memory (``policy.spare_fraction`` of the budget free) and no request of a higher class
    waits there. This only spares the Manager batches it would hold back anyway; the
    Manager still decides each one."""
    service = runtime.models.get(model)
    if service is None:
        return True  # let the submit report the unknown model
    replicas = runtime.replicas(service)
    if replicas[0].spec.in_window(runtime.time_of_day()):
        return True
    return any(runtime.spare_for(r.spec) for r in replicas)


def batch_of(runtime: Runtime, model: str) -> tuple[float, int]:
    """A model's batch now, as the Manager last set it for its service (a Rebatch: see
    accelmux.core.shrink): (the fraction of a full batch to claim, the most batches at
    once); the full batch and no limit for a service that never shrank."""
    service = runtime.models.get(model)
    rebatch = runtime.executor.batches.get(service) if service is not None else None
    if rebatch is None:
        return 1.0, 1 << 30
    return rebatch.fraction, rebatch.parallel


def beside_realtime(runtime: Runtime, model: str) -> bool:
    """Whether a loaded realtime service shares the device of a model's service (any of
    its replicas): there a batch already running takes compute from a voice request that
    arrives (the job runner cuts its batches short)."""
    service = runtime.models.get(model)
    if service is None:
        return False
    by_device = runtime.manager.view.realtime_by_device
    return any(
        s.holds_memory for r in runtime.replicas(service) for s in by_device.get(r.spec.device, ())
    )


async def submit_embeddings(runtime: Runtime, model: str, texts: list[str]) -> Ran:
    """Embed ``texts`` through the Manager; the vectors in input order, and how long the
    backend took once the batch was dispatched.

    Refusals become :class:`~accelmux.jobs.JobInputRetry` (with the Retry-After) or, for
    ``too_large`` and client errors, :class:`~accelmux.jobs.JobInputError`.
    """
    service = runtime.models.get(model)
    if service is None:
        raise JobInputError(f"unknown model {model!r}")
    kind = runtime.service_state(service).spec.kind
    if kind is not ServiceKind.EMBEDDINGS:
        raise JobInputError(f"model {model!r} is a {kind.value} service, not embeddings")
    body: dict[str, Any] = {"model": model, "input": texts}
    raw = json.dumps(body).encode()
    demand = Demand(units=float(len(texts)), prompt_tokens=sum(tokens_of(len(t)) for t in texts))
    rid = runtime.new_request_id().replace("req-", "job-", 1)
    call = Call(kind=kind, endpoint="/v1/embeddings", body=body, raw=raw)
    try:
        answer = await runtime.call(service, demand, call, request_id=rid)
    except Refused as exc:
        if exc.reason is Reason.TOO_LARGE:
            raise JobInputError(str(exc)) from None
        raise JobInputRetry(str(exc), retry_after=exc.retry_after_s) from None
    except BackendError as exc:
        raise JobInputRetry(str(exc)) from None
    if answer.status >= 500:
        raise JobInputRetry(f"backend answered {answer.status}")
    if answer.status >= 400:
        raise JobInputError(f"backend answered {answer.status}: {answer.body[:200]!r}")
    data = json.loads(answer.body)["data"]
    vectors = [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]
    return Ran(vectors, answer.run_s)


@dataclass
class StoreAndRunner:
    """A SQLite store and the background runner that writes to it (jobs, cameras)."""

    store: Any
    runner: Any

    async def start(self) -> None:
        await self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()
        self.store.close()


def mount_jobs(app: web.Application, runtime: Runtime, data_dir: Path) -> StoreAndRunner:
    """Open the job store, add ``/v1/jobs`` to ``app``; start it with ``start()``."""
    store = JobStore.open(data_dir / "jobs")

    async def submit(model: str, texts: list[str]) -> Ran:
        return await submit_embeddings(runtime, model, texts)

    runner = JobRunner(
        store,
        submit,
        settings=RunnerSettings(slice_s=runtime.cfg.policy.batch_slice_s),
        window_open=lambda model: window_open(runtime, model),
        batch_of=lambda model: batch_of(runtime, model),
        beside_realtime=lambda model: beside_realtime(runtime, model),
    )
    server = runtime.cfg.server
    access = JobAccess(api_keys=tuple(server.api_keys), admin_key=server.admin_key)
    app.add_routes(
        job_routes(store, runner, models=lambda: embedding_models(runtime), access=access)
    )
    return StoreAndRunner(store, runner)


def mount_cameras(app: web.Application, runtime: Runtime, data_dir: Path) -> StoreAndRunner | None:
    """One analysis loop per camera service, and ``/v1/cameras``; None without cameras."""
    if not camera_services(runtime):
        return None
    store = EventStore.open(data_dir / "cameras" / "events.sqlite")
    runner = CameraRunner(runtime, store)
    app.add_routes(camera_routes(runner))
    return StoreAndRunner(store, runner)


def mount_dashboard(app: web.Application, runtime: Runtime, data_dir: Path) -> None:
    """The page at ``/`` and its history, and ``POST /admin/plan`` for its plan page
    (``/dashboard/plan.html``), which plans from this daemon's own history."""
    dashboard_routes(app, runtime.status)
    app.add_routes(plan_routes(data_dir))


@dataclass
class HistoryMount:
    """The request history's recorder, attached to the runtime, and its writer."""

    recorder: HistoryRecorder
    writer: HistoryWriter
    runtime: Runtime

    probe: CpuProbe

    def close(self) -> None:
        """Write what is still open and stop the writer (after the runtime stopped)."""
        self.runtime.driver.tell_rounds()  # the rounds not yet recorded first
        if self.recorder in self.runtime.driver.observers:
            self.runtime.driver.observers.remove(self.recorder)
        self.probe.close()
        self.recorder.close(self.runtime.clock.now())
        self.writer.close()


def mount_history(runtime: Runtime, data_dir: Path) -> HistoryMount | None:
    """Record the runtime's requests, loads, decisions and samples under
    ``data_dir/history`` (None when ``server.history.enabled`` is off). Call before
    ``runtime.start()``, so that the Manager's first round is recorded too."""
    cfg = runtime.cfg.server.history
    if not cfg.enabled:
        return None
    clock = runtime.clock
    started_wall = time.time() - clock.now()
    # the gateway's stream timer reads time.monotonic(); the Manager's clock starts later
    offset = time.monotonic() - clock.now()
    writer = HistoryWriter(data_dir / "history", days=cfg.days, max_bytes=int(cfg.max_size))
    run = new_run(runtime.cfg, runtime.manager.spec, __version__, started_wall)
    writer.start_run(run)

    def stream_figures(request_id: str) -> StreamFigures | None:
        answer = runtime.live.answer(request_id)
        if answer is None:
            return None
        first, last = answer.first_chunk_at, answer.last_chunk_at
        return StreamFigures(
            first_chunk_at=None if first is None else first - offset,
            output_tokens=answer.output_tokens,
            last_chunk_at=None if last is None else last - offset,
            completed=answer.completed,
        )

    hosts = [d.name for d in runtime.manager.spec.devices if d.kind == "host"]
    # the managed compute: every process the daemon started (workers, external servers)
    probe = CpuProbe(lambda: [p.pid for p in psutil.Process().children()], hosts, clock=clock.now)
    recorder = HistoryRecorder(
        writer, runtime.manager.spec, run, stream_figures=stream_figures, cpu_probe=probe
    )
    runtime.driver.observers.append(recorder)
    return HistoryMount(recorder, writer, runtime, probe)
