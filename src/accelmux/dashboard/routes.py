"""Mount the dashboard on the gateway's aiohttp application.

``routes(app, get_status)`` adds::

    GET /                 the page (static HTML; no build step, nothing from the internet)
    GET /dashboard/{file} its CSS and JavaScript
    GET /admin/history    the memory timeline: ?since=T answers only samples after T

``/`` and ``/dashboard/*`` hold no data and stay open; ``/admin/history`` sits under
``/admin`` so the gateway's admin-key check covers it like ``/admin/status``. The page
itself reads ``/admin/status``, ``/admin/events``, ``/admin/explain/{id}``,
``/admin/services/{name}/{op}`` and ``/v1/jobs``.

By default a background task, started and stopped with the application
(``app.cleanup_ctx``), feeds the history from ``get_status()`` every ``period_s``; pass
``feed=False`` when the runtime calls ``history.record(status)`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from accelmux.dashboard.history import DEFAULT_PERIOD_S, MemoryHistory

log = logging.getLogger("accelmux.dashboard")

STATIC_DIR = Path(__file__).parent / "static"
INDEX = STATIC_DIR / "index.html"
HISTORY_KEY: web.AppKey[MemoryHistory] = web.AppKey("accelmux_dashboard_history", MemoryHistory)

GetStatus = Callable[[], Mapping[str, Any]]


def routes(
    app: web.Application,
    get_status: GetStatus,
    history: MemoryHistory | None = None,
    *,
    period_s: float = DEFAULT_PERIOD_S,
    feed: bool = True,
) -> MemoryHistory:
    """Add the dashboard's routes to ``app`` (before it starts); answers the history."""
    if history is None:
        history = MemoryHistory(period_s=period_s)
    app[HISTORY_KEY] = history
    app.router.add_get("/", index)
    app.router.add_get("/dashboard", _to_index)
    app.router.add_static("/dashboard/", STATIC_DIR, append_version=False)
    app.router.add_get("/admin/history", history_handler)
    if feed:
        app.cleanup_ctx.append(_feeder(get_status, history, period_s))
    return history


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(INDEX, headers={"Cache-Control": "no-cache"})


async def _to_index(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/")


async def history_handler(request: web.Request) -> web.Response:
    history = request.app[HISTORY_KEY]
    raw = request.query.get("since")
    since: float | None = None
    if raw is not None:
        try:
            since = float(raw)
            if not math.isfinite(since):
                raise ValueError(raw)
        except ValueError:
            return web.json_response(
                {
                    "error": {
                        "message": "since must be a number (Unix seconds)",
                        "type": "invalid_request_error",
                        "param": "since",
                        "code": "invalid_value",
                    }
                },
                status=400,
            )
    return web.json_response(history.as_dict(since))


def _feeder(
    get_status: GetStatus, history: MemoryHistory, period_s: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def sample_forever() -> None:
        while True:
            try:
                history.record(get_status())
            except Exception as exc:  # the timeline must never take the daemon down
                log.warning("dashboard history sample failed: %s", exc)
            await asyncio.sleep(period_s)

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sample_forever(), name="dashboard-history")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx
