"""The web dashboard: static page, memory history and the routes that serve them."""

from accelmux.dashboard.history import MemoryHistory, MemorySample
from accelmux.dashboard.routes import STATIC_DIR, routes

__all__ = ["STATIC_DIR", "MemoryHistory", "MemorySample", "routes"]
