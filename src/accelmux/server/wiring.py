"""Mount the parts that live beside the gateway: durable batch jobs and the dashboard.

* Jobs (:mod:`accelmux.jobs`): a SQLite store under ``server.data_dir``, served at
  ``/v1/jobs``; its runner sends each batch of inputs through the SAME path as an HTTP
  request (:meth:`Runtime.call`: batch class, maintenance windows, preemption),
  via :func:`submit_embeddings`, and pauses a model's jobs outside its windows.
* Cameras (:mod:`accelmux.cameras`): one analysis loop per camera service (background
  requests through the Manager), events in SQLite under ``server.data_dir``, served at
  ``/v1/cameras``.
* Dashboard (:mod:`accelmux.dashboard`): ``/`` (static page), ``/admin/history``.

Both are optional (``server.jobs``, ``server.dashboard``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from accelmux.cameras import CameraRunner, EventStore
from accelmux.cameras.http import camera_routes
from accelmux.cameras.runner import camera_services
from accelmux.core.events import Demand
from accelmux.core.types import Reason, ServiceKind
from accelmux.dashboard import routes as dashboard_routes
from accelmux.errors import BackendError
from accelmux.gateway.parse import tokens_of
from accelmux.jobs import JobInputError, JobInputRetry, JobRunner, JobStore
from accelmux.jobs.http import JobAccess, job_routes
from accelmux.runtime.call import Call
from accelmux.runtime.daemon import Runtime
from accelmux.runtime.requests import Refused


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


async def submit_embeddings(runtime: Runtime, model: str, texts: list[str]) -> list[Any]:
    """Embed ``texts`` through the Manager; the vectors in input order.

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
    return [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]


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

    async def submit(model: str, texts: list[str]) -> list[Any]:
        return await submit_embeddings(runtime, model, texts)

    runner = JobRunner(store, submit, window_open=lambda model: window_open(runtime, model))
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


def mount_dashboard(app: web.Application, runtime: Runtime) -> None:
    dashboard_routes(app, runtime.status)
