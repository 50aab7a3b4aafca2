"""Middlewares: OpenAI-shaped errors, body size limit and bearer-key checks.

``/v1/*`` needs one of ``server.api_keys`` when any is set. ``/admin/*`` and ``/metrics``
need ``server.admin_key`` when set; without it they are open only while the daemon
listens on a loopback address (otherwise 403). Keys are compared in constant time
(``hmac.compare_digest``) and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from accelmux.config.server import ServerConfig
from accelmux.gateway.errors import ApiError

log = logging.getLogger("accelmux.gateway")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC = ("/health", "/openapi.json")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bearer(request: web.Request) -> bytes | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip().encode()


def _matches(token: bytes | None, keys: list[bytes]) -> bool:
    if token is None:
        return False
    ok = False
    for key in keys:  # no early exit: the time does not depend on which key matched
        ok |= hmac.compare_digest(token, key)
    return ok


def error_middleware(max_body: int) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            length = request.content_length
            if length is not None and length > max_body:
                raise ApiError(
                    413,
                    f"request body is {length} bytes, the limit is {max_body}",
                    code="body_too_large",
                )
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPRequestEntityTooLarge:
            return ApiError(
                413, f"request body exceeds the limit of {max_body} bytes", code="body_too_large"
            ).response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return ApiError(
                exc.status, exc.reason, type="invalid_request_error", code=str(exc.status)
            ).response()
        except ConnectionError:
            raise
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return ApiError(500, "internal error", type="server_error").response()

    return middleware


def auth_middleware(cfg: ServerConfig, host: str) -> Middleware:
    api_keys = [k.encode() for k in cfg.api_keys]
    admin_keys = [cfg.admin_key.encode()] if cfg.admin_key else []
    admin_open = not admin_keys and is_loopback(host)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path.startswith("/v1/"):
            if api_keys and not _matches(_bearer(request), api_keys):
                raise ApiError(
                    401,
                    "missing or invalid API key (Authorization: Bearer ...)",
                    code="invalid_api_key",
                )
        elif path.startswith("/admin") or path == "/metrics":
            if admin_keys:
                if not _matches(_bearer(request), admin_keys):
                    raise ApiError(401, "missing or invalid admin key", code="invalid_admin_key")
            elif not admin_open:
                raise ApiError(
                    403,
                    "the admin API needs server.admin_key when listening on a non-loopback address",
                    code="admin_key_required",
                )
        return await handler(request)

    return middleware
