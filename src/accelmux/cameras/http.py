"""``GET /v1/cameras`` and ``GET /v1/cameras/{name}/events``.

A camera's ``source`` is shown with its credentials masked (``rtsp://***@host/...``,
``?password=***``: :func:`accelmux.redact.redact`); ``last_error`` is the last reason its
frames failed (a read error, or the load failure or crash of its model).

Events query parameters: ``after`` (an event id: only newer ones), ``since`` (Unix
seconds), ``label`` (``face`` or ``person``), ``limit`` (1..1000, default 100). The answer
is ``{"object": "list", "camera", "data": [event...], "last_id", "has_more"}``, each event
``{"id", "object": "camera.event", "camera", "created_at", "frame", "timestamp_s",
"label", "score", "box": [x1, y1, x2, y2]}``, oldest first.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from accelmux.cameras.runner import CameraRunner


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": "not_found" if status == 404 else "invalid_value",
            }
        },
        status=status,
    )


def camera_routes(runner: CameraRunner) -> list[web.RouteDef]:
    async def list_cameras(request: web.Request) -> web.Response:
        data = [state.as_dict() for state in runner.cameras.values()]
        return web.json_response({"object": "list", "data": data})

    async def events(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in runner.cameras:
            return _error(404, f"no camera named {name!r} (GET /v1/cameras lists them)", "name")
        q = request.query
        try:
            after = int(q.get("after", "0"))
            since = float(q["since"]) if "since" in q else None
            limit = int(q.get("limit", "100"))
        except ValueError as exc:
            return _error(400, f"bad query parameter: {exc}")
        if not 1 <= limit <= 1000:
            return _error(400, "limit must be between 1 and 1000", "limit")
        rows = await asyncio.to_thread(
            runner.store.events,
            name,
            after_id=after,
            since=since,
            label=q.get("label") or None,
            limit=limit + 1,
        )
        more = len(rows) > limit
        rows = rows[:limit]
        return web.json_response(
            {
                "object": "list",
                "camera": name,
                "data": rows,
                "last_id": rows[-1]["id"] if rows else after,
                "has_more": more,
            }
        )

    return [
        web.get("/v1/cameras", list_cameras),
        web.get("/v1/cameras/{name}/events", events),
    ]
