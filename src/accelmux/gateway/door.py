"""The front door's checks, built once per application and shared by every HTTP stack
that serves it (aiohttp's middlewares and the hot path of :mod:`.hot`): the browser
guard, the API keys and the rate limits' buckets."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from accelmux.config.server import ServerConfig
from accelmux.gateway.guard import BrowserGuard
from accelmux.gateway.middleware import InferenceKeys, TokenBuckets


@dataclass(frozen=True, slots=True)
class Door:
    browser: BrowserGuard
    keys: InferenceKeys
    buckets: TokenBuckets | None

    @classmethod
    def of(cls, server: ServerConfig, listen: str) -> Door:
        buckets = TokenBuckets(server.rate_limit) if server.rate_limit is not None else None
        return cls(BrowserGuard.of(server, listen), InferenceKeys(server), buckets)


DOOR: web.AppKey[Door] = web.AppKey("accelmux_door", Door)
