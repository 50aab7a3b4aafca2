"""Middlewares: OpenAI-shaped errors, body size limit, bearer-key checks, rate limits.

``/v1/*`` needs one of ``server.api_keys`` when any is set (``/v1/jobs`` takes
``server.admin_key`` too: it sees every key's jobs). ``/admin/*`` and ``/metrics``
need ``server.admin_key`` when set; without it they are open only while the daemon
listens on a loopback address (otherwise 403). Off loopback the dashboard (``/``,
``/dashboard/*``) is refused the same way; a browser may give the admin key as the
password of HTTP Basic auth (it is asked for with ``WWW-Authenticate``), which ``/admin``
accepts too. Keys are compared in constant time
(``hmac.compare_digest``) and never logged.

``server.rate_limit`` puts a token bucket in front of ``/v1/*`` per API key (per client
address when no keys are set); an empty bucket answers 429 ``rate_limited`` with
Retry-After. Buckets are keyed by a digest of the key, never the key itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from accelmux.config.hosts import is_loopback
from accelmux.config.server import RateLimitConfig, ServerConfig
from accelmux.gateway.connections import CALLER_KEY, guarded
from accelmux.gateway.errors import ApiError
from accelmux.gateway.ollama_relay import error_response as ollama_error

log = logging.getLogger("accelmux.gateway")

#: ``error.code`` of the HTTP errors aiohttp raises itself (unknown path, wrong method...).
HTTP_ERROR_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    411: "length_required",
    413: "body_too_large",
    415: "unsupported_media_type",
    431: "headers_too_large",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC = ("/health", "/openapi.json")
#: Where the admin key is accepted as an API key (it sees every owner's jobs).
ADMIN_ALSO = ("/v1/jobs",)
#: Inference paths (OpenAI's and Ollama's): API keys and rate limits apply to them.
INFERENCE = ("/v1/", "/api/")


def _bearer(request: web.Request) -> bytes | None:
    return _bearer_of(request.headers.get("Authorization", ""))


def _bearer_of(header: str) -> bytes | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip().encode()


def _admin_token(request: web.Request) -> bytes | None:
    """The bearer token, or the password of HTTP Basic auth (what a browser can send)."""
    token = _bearer(request)
    if token is not None:
        return token
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    password = decoded.partition(b":")[2]
    return password or None


def _is_dashboard(path: str) -> bool:
    return path in ("/", "/dashboard") or path.startswith("/dashboard/")


def _admin_also(path: str, admin_keys: list[bytes]) -> list[bytes]:
    on_jobs = any(path == p or path.startswith(p + "/") for p in ADMIN_ALSO)
    return admin_keys if on_jobs else []


def _matches(token: bytes | None, keys: list[bytes]) -> bool:
    if token is None:
        return False
    ok = False
    for key in keys:  # no early exit: the time does not depend on which key matched
        ok |= hmac.compare_digest(token, key)
    return ok


def key_digest(token: bytes) -> str:
    """How a key is named in the door's books and the rate limits (never the key)."""
    return hashlib.sha256(token).hexdigest()[:32]


def _authenticated(request: web.Request, token: bytes | None, keys: list[bytes]) -> bool:
    """Whether ``token`` is one of ``keys``; when it is, the request is known by its
    digest (the door counts each key's connections)."""
    if not _matches(token, keys):
        return False
    assert token is not None
    request[CALLER_KEY] = key_digest(token)
    return True


def _shaped(request: web.Request, err: ApiError) -> web.Response:
    """``err`` in the shape of the API the path belongs to (Ollama's on ``/api/``)."""
    if request.path.startswith("/api/"):
        return ollama_error(err)
    return err.response()


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
            return _shaped(request, exc)
        except web.HTTPRequestEntityTooLarge:
            return _shaped(
                request,
                ApiError(
                    413,
                    f"request body exceeds the limit of {max_body} bytes",
                    code="body_too_large",
                ),
            )
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            resp = _shaped(
                request,
                ApiError(
                    405,
                    f"{request.method} is not allowed on {request.path}; allowed: {allowed}",
                    code="method_not_allowed",
                ),
            )
            resp.headers["Allow"] = allowed
            return resp
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = HTTP_ERROR_CODES.get(exc.status, "http_error")
            return _shaped(request, ApiError(exc.status, exc.reason, code=code))
        except HttpProcessingError as exc:  # a malformed body found while reading it
            status = exc.code if 400 <= exc.code < 500 else 400
            return _shaped(
                request,
                ApiError(status, f"malformed request: {exc.message}", code="malformed_request"),
            )
        except ConnectionError:
            raise
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return _shaped(
                request,
                ApiError(500, "internal error", type="server_error", code="internal_error"),
            )

    return middleware


class InferenceKeys:
    """The key check of ``/v1/*`` and ``/api/*``, whichever HTTP stack read the header."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.api_keys = [k.encode() for k in cfg.api_keys]
        self.admin_keys = [cfg.admin_key.encode()] if cfg.admin_key else []

    def check(self, path: str, authorization: str | None) -> tuple[str | None, ApiError | None]:
        """(the digest of the key the request authenticated with, or None; the refusal,
        or None). No keys configured: every request passes, known by no key."""
        if not self.api_keys:
            return None, None
        token = _bearer_of(authorization or "")
        if _matches(token, self.api_keys + _admin_also(path, self.admin_keys)):
            assert token is not None
            return key_digest(token), None
        return None, ApiError(
            401,
            "missing or invalid API key (Authorization: Bearer ...)",
            code="invalid_api_key",
            close=True,
        )


def auth_middleware(cfg: ServerConfig, host: str) -> Middleware:
    """The key checks, as soon as the headers are in: a refusal closes the connection
    without reading the body (a client without a valid key holds no connection while
    its body trickles in)."""
    inference = InferenceKeys(cfg)
    admin_keys = inference.admin_keys
    admin_open = not admin_keys and is_loopback(host)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path.startswith(INFERENCE):
            key, err = inference.check(path, request.headers.get("Authorization"))
            if err is not None:
                found = guarded(request)
                if found is not None:
                    found[0].key_refused(found[1])
                raise err
            if key is not None:
                request[CALLER_KEY] = key
        elif _is_dashboard(path) and not is_loopback(host):
            if not admin_keys:
                raise ApiError(
                    403,
                    "the dashboard needs server.admin_key when listening on a non-loopback address",
                    code="admin_key_required",
                    close=True,
                )
            if not _authenticated(request, _admin_token(request), admin_keys):
                resp = ApiError(
                    401, "missing or invalid admin key", code="invalid_admin_key", close=True
                )
                out = resp.response()
                out.headers["WWW-Authenticate"] = 'Basic realm="accelmux admin"'
                return out
        elif path.startswith("/admin") or path == "/metrics":
            if admin_keys:
                if not _authenticated(request, _admin_token(request), admin_keys):
                    raise ApiError(
                        401, "missing or invalid admin key", code="invalid_admin_key", close=True
                    )
            elif not admin_open:
                raise ApiError(
                    403,
                    "the admin API needs server.admin_key when listening on a non-loopback address",
                    code="admin_key_required",
                    close=True,
                )
        return await handler(request)

    return middleware


class ProtocolLogger(logging.Logger):
    """aiohttp's connection-level logger (``aiohttp.server``), given to the AppRunner.

    aiohttp answers a request it cannot parse (a bare CR in a header, a duplicate
    Content-Length, a bad request line) with 400 before any handler runs, and logs the
    parser's exception with a traceback at ERROR. Such requests are the client's fault and
    anyone can send them: here they are one INFO line naming the peer and the problem.
    Every other exception keeps its traceback at ERROR.
    """

    def __init__(self) -> None:
        super().__init__("aiohttp.server")
        self.parent = logging.getLogger("aiohttp")

    def exception(
        self,
        msg: object,
        *args: object,
        exc_info: Any = True,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        if isinstance(exc_info, HttpProcessingError):
            peer = args[0] if args else "?"
            self.info("malformed HTTP request from %s: %s", peer, exc_info.message)
            return
        super().exception(
            msg, *args, exc_info=exc_info, stack_info=stack_info, stacklevel=stacklevel, extra=extra
        )


class TokenBuckets:
    """Token buckets by caller; ``take`` returns 0 when allowed, else seconds to wait."""

    #: Buckets kept at most; the oldest untouched ones are dropped beyond it.
    MAX_BUCKETS = 10_000

    def __init__(self, cfg: RateLimitConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = cfg.requests_per_s
        self.burst = float(cfg.burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, updated)

    def take(self, caller: str) -> float:
        now = self._clock()
        tokens, updated = self._buckets.pop(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - updated) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[caller] = (tokens, now)  # re-inserted last: dicts keep LRU order
        if len(self._buckets) > self.MAX_BUCKETS:
            del self._buckets[next(iter(self._buckets))]
        return wait


def rate_limited(buckets: TokenBuckets, caller: str) -> ApiError | None:
    """The refusal when ``caller``'s bucket is empty (a token is taken otherwise)."""
    wait = buckets.take(caller)
    if wait <= 0:
        return None
    return ApiError(
        429,
        f"rate limit of {buckets.rate:g} requests/s (burst {buckets.burst:g}) "
        "exceeded for this key",
        type="rate_limit_error",
        code="rate_limited",
        retry_after_s=max(1.0, math.ceil(wait)),
    )


def caller_of(authorization: str | None, remote: str | None) -> str:
    """Whom a rate limit counts: the bearer key's digest, else the client address."""
    token = _bearer_of(authorization or "")
    if token is not None:
        return "key:" + key_digest(token)
    return "addr:" + (remote or "")


def rate_limit_middleware(buckets: TokenBuckets) -> Middleware:
    """``buckets`` are shared with every HTTP stack of the daemon."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(INFERENCE):
            err = rate_limited(
                buckets, caller_of(request.headers.get("Authorization"), request.remote)
            )
            if err is not None:
                raise err
        return await handler(request)

    return middleware
