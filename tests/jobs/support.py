"""Shared helpers of the jobs tests."""

from __future__ import annotations

import hashlib


class FakeClock:
    """A wall clock that moves only when told."""

    def __init__(self, start: float = 1_764_500_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def digest(text: str) -> str:
    """The deterministic "embedding" the fake backends return."""
    return hashlib.sha256(text.encode()).hexdigest()
