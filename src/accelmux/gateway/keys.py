"""Typed keys of the aiohttp application and of each request."""

from __future__ import annotations

from aiohttp import web

from accelmux.runtime.daemon import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
#: The id of a request, sent back as ``X-Request-Id`` (see :func:`request_id`).
REQUEST_ID = web.RequestKey("request_id", str)


def request_id(request: web.Request) -> str:
    """The request's id, made on first use; every answer carries it as ``X-Request-Id``."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request.app[RUNTIME].new_request_id()
        request[REQUEST_ID] = rid
    return rid


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the header on every answer that went through the app
    (errors, 404s and streams included) unless its handler set it already."""
    if "X-Request-Id" not in response.headers:
        response.headers["X-Request-Id"] = request_id(request)
