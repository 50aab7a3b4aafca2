"""Typed keys of the aiohttp application."""

from __future__ import annotations

from aiohttp import web

from accelmux.runtime.daemon import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
