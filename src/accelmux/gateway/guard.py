"""Browser guard: DNS rebinding, cross-site requests and CORS.

A web page open on the machine can send requests to the daemon on loopback. The browser
keeps it from *reading* a cross-origin answer, but not from *sending* a "simple" request
(a form POST, or ``fetch`` with ``text/plain``), and a page whose name the attacker
re-points at 127.0.0.1 (DNS rebinding) is same-origin with the daemon. Three checks, in
front of the key checks:

- ``Host`` must name the daemon: one of ``server.allowed_hosts`` (loopback names, plus
  the listen address, by default; any port). A rebinding page sends its own name.
  ``/health`` is exempt (a load balancer may probe it by any name); ``["*"]`` turns the
  check off. Refused: 403 ``host_not_allowed``.
- A state-changing request (POST, PUT, PATCH, DELETE) that carries an ``Origin`` must come
  from the daemon's own origin (scheme ``http``, host and port those of ``Host``) or one
  of ``server.cors_origins``; without ``Origin``, ``Sec-Fetch-Site: cross-site`` is refused.
  Refused: 403 ``origin_not_allowed``. Clients that are not browsers send neither header.
- A body in a content type a browser sends cross-site without a preflight
  (``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``) is
  refused with 415 ``unsupported_media_type``, but for ``multipart/form-data`` on the
  routes that take uploads (those rely on the ``Origin`` check).

CORS is off unless ``server.cors_origins`` lists origins: then their preflights are
answered and their answers carry ``Access-Control-Allow-Origin``; no other origin's are.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from accelmux.config.server import ServerConfig
from accelmux.gateway.errors import ApiError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Content types a browser sends cross-site without asking first (a CORS "simple request").
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
#: Routes that take multipart uploads (OpenAI's shapes).
FORM_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/detections"})
#: Routes that take JSON lines as well as JSON.
JSONLINES_PATHS = frozenset({"/v1/jobs"})
EXEMPT_PATHS = frozenset({"/health"})
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE"
CORS_EXPOSED = "X-Request-Id, Retry-After"


def host_name(value: str) -> str | None:
    """The name in a ``Host`` value without its port (``[::1]:8600`` -> ``::1``); None
    when it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return value[1:end] or None
    if value.count(":") > 1:  # a bare IPv6 address (as written in a config)
        return value
    name, sep, port = value.partition(":")
    if sep and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRule:
    """Which ``Host`` names are answered; ``any_name`` turns the check off."""

    names: frozenset[str]
    suffixes: tuple[str, ...] = ()
    any_ip: bool = False
    any_name: bool = False

    @classmethod
    def of(cls, allowed: Iterable[str] | None, listen: str) -> HostRule:
        if allowed is None:
            names = set(LOOPBACK_NAMES)
            if listen not in WILDCARD_HOSTS:
                names.add(host_name(listen) or listen)
            return cls(names=frozenset(names), any_ip=listen in WILDCARD_HOSTS)
        entries = [entry.strip().lower() for entry in allowed]
        if "*" in entries:
            return cls(names=frozenset(), any_name=True)
        suffixes = tuple(entry[1:] for entry in entries if entry.startswith("*."))
        plain = {host_name(entry) or entry for entry in entries if not entry.startswith("*.")}
        return cls(names=frozenset(plain), suffixes=suffixes)

    def allows(self, host: str) -> bool:
        if self.any_name:
            return True
        name = host_name(host)
        if name is None:
            return False
        if name in self.names or (self.any_ip and _is_ip(name)):
            return True
        return any(name.endswith(suffix) for suffix in self.suffixes)


def _origin(value: str) -> str:
    """An origin as compared: lower case, no trailing slash."""
    return value.strip().lower().rstrip("/")


#: The scheme the daemon speaks on its own port (a TLS proxy in front speaks https: its
#: public origin is listed in ``server.cors_origins``).
OWN_SCHEME = "http"
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_parts(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin, the port made explicit (``http://a`` ->
    ``("http", "a", 80)``); None when it is not an origin (``null``, no host)."""
    try:
        url = URL(origin.strip())
    except ValueError:
        return None
    scheme = url.scheme.lower()
    if not scheme or not url.raw_host:
        return None
    try:
        port = url.explicit_port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port out of range
        return None
    if port is None:
        return None
    return scheme, url.raw_host.lower().rstrip("."), port


def own_origin(host: str) -> tuple[str, str, int] | None:
    """The origin of a page served by the daemon under ``Host`` (plain HTTP)."""
    return origin_parts(f"{OWN_SCHEME}://{host.strip()}")


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` is the daemon's own origin for ``Host: host``: scheme, host
    and port all equal (an ``https://`` page is not served by the daemon's plain HTTP
    port, and neither is another port's)."""
    if host is None:
        return False
    ours = own_origin(host)
    return ours is not None and origin_parts(origin) == ours


@dataclass(frozen=True, slots=True)
class BrowserGuard:
    """The three checks on a request's method, path and headers, whichever HTTP stack
    read them (``headers``: a case-insensitive mapping, or one with lower-case names)."""

    hosts: HostRule
    cors: frozenset[str]

    @classmethod
    def of(cls, cfg: ServerConfig, listen: str) -> BrowserGuard:
        return cls(
            HostRule.of(cfg.allowed_hosts, listen), frozenset(_origin(o) for o in cfg.cors_origins)
        )

    def check(
        self, method: str, path: str, headers: Mapping[str, str], *, has_body: bool
    ) -> ApiError | None:
        """The refusal, or None when the request passes (a CORS preflight is answered
        by :func:`guard_middleware`, before this)."""
        host = _header(headers, "host")
        if host is not None and path not in EXEMPT_PATHS and not self.hosts.allows(host):
            return ApiError(
                403,
                f"Host {host!r} is not a name of this server (a request from a web page "
                "under another name, as in DNS rebinding); add it to server.allowed_hosts",
                code="host_not_allowed",
            )
        if method in STATE_CHANGING:
            origin = _header(headers, "origin")
            err = _check_origin(method, headers, origin, host, self.cors)
            if err is None and has_body:
                content_type = (_header(headers, "content-type") or "").partition(";")[0]
                err = _check_content_type(content_type.strip().lower(), path)
            return err
        return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and name != name.title():
        value = headers.get(name.title())
    return value


def guard_middleware(
    cfg: ServerConfig, listen: str, browser: BrowserGuard | None = None
) -> Middleware:
    guard = browser or BrowserGuard.of(cfg, listen)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            host = request.headers.get("Host")
            if (
                host is not None
                and request.path not in EXEMPT_PATHS
                and not guard.hosts.allows(host)
            ):
                err = guard.check("GET", request.path, request.headers, has_body=False)
                if err is not None:
                    raise err
            return _preflight(request, origin, guard.cors)
        err = guard.check(
            request.method, request.path, request.headers, has_body=request.body_exists
        )
        if err is not None:
            raise err
        return await handler(request)

    return middleware


def _preflight(request: web.Request, origin: str | None, cors: frozenset[str]) -> web.Response:
    if origin is None or _origin(origin) not in cors:
        raise ApiError(
            403,
            f"cross-origin requests from {origin!r} are not allowed; "
            "list the origin in server.cors_origins",
            code="origin_not_allowed",
        )
    headers = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }
    asked = request.headers.get("Access-Control-Request-Headers")
    if asked:
        headers["Access-Control-Allow-Headers"] = asked
    return web.Response(status=204, headers=headers)


def _check_origin(
    method: str,
    headers: Mapping[str, str],
    origin: str | None,
    host: str | None,
    cors: frozenset[str],
) -> ApiError | None:
    if origin is None:
        if (_header(headers, "sec-fetch-site") or "").lower() == "cross-site":
            return ApiError(
                403,
                "a cross-site browser request may not change anything here; "
                "list the page's origin in server.cors_origins to allow it",
                code="origin_not_allowed",
            )
        return None
    if _origin(origin) in cors or same_origin(origin, host):
        return None
    return ApiError(
        403,
        f"Origin {origin!r} may not send {method} requests here (a page of another "
        "site); list it in server.cors_origins to allow it",
        code="origin_not_allowed",
    )


def _check_content_type(content_type: str, path: str) -> ApiError | None:
    if content_type not in SIMPLE_TYPES:
        return None
    expected = "application/json"
    if path in FORM_PATHS:
        if content_type == "multipart/form-data":
            return None
        expected = "multipart/form-data or application/json"
    elif path in JSONLINES_PATHS:
        expected = "application/json or application/jsonlines"
    return ApiError(
        415,
        f"Content-Type {content_type} is not accepted here (a browser sends it from "
        f"any site without asking); send {expected}",
        code="unsupported_media_type",
    )


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: Access-Control-Allow-Origin for a configured origin."""
    origin = request.headers.get("Origin")
    cors: frozenset[str] = request.app[CORS_ORIGINS]
    if origin is not None and _origin(origin) in cors:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED
        response.headers.add("Vary", "Origin")


CORS_ORIGINS: web.AppKey[frozenset[str]] = web.AppKey("accelmux_cors_origins", frozenset)


def add_cors(app: web.Application, cfg: ServerConfig) -> None:
    """Send CORS headers to the origins of ``server.cors_origins`` (none: nothing added)."""
    if not cfg.cors_origins:
        return
    app[CORS_ORIGINS] = frozenset(_origin(o) for o in cfg.cors_origins)
    app.on_response_prepare.append(add_cors_headers)
