"""The part graph of docs/architecture.md, rendered from the source itself: the accelmux
policy's parts and the parts each one's constructor takes
(:mod:`accelmux.core.policies.accelmux.graph`)."""

from __future__ import annotations

from collections.abc import Callable

from accelmux.core.policies.accelmux.graph import render

BLOCKS: dict[str, Callable[[], str]] = {"parts": render}
